"""Test helpers: free ports, polling with a deadline, a broker in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.contracts import CatalogSpec

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_range()


def _port_range() -> tuple[int, int]:
    """The ports below the ephemeral range this process hands out: all of them, or under
    pytest-xdist (``make test`` runs two workers) worker N's share, so two workers never pick
    the same port for servers they are about to start."""
    low, high = 10_000, max(11_000, _EPHEMERAL[0])
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count < 2:
        return low, high
    share = (high - low) // count
    start = low + int(worker[2:]) % count * share
    return start, start + share


_PORTS = _port_range()
_handed_out: set[int] = set()
_next_port = random.Random(os.getpid()).randrange(*_PORTS)


def free_port() -> int:
    """A loopback port nothing listens on, outside the kernel's ephemeral range.

    Why not bind port 0: that hands out an *ephemeral* port, which the kernel may give to the next
    outgoing connection (a Kafka client's, a JVM's) before the server under test binds it; a CI
    run lost a broker to exactly that ("address already in use"). Ports below the ephemeral range
    are never auto-assigned, and each is handed out once per process.
    """
    global _next_port
    low, high = _PORTS
    for _ in range(high - low):
        port = _next_port
        _next_port = low + (_next_port + 1 - low) % (high - low)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def present(value: T | None) -> T:
    """``value``, asserted not None: for Optional attributes a test knows are set."""
    assert value is not None
    return value


def wait_for(
    condition: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll until ``condition()`` is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # keep polling; report the last error on timeout  # noqa: BLE001
            last_error = exc
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout}s waiting for {what}"
        + (f" (last error: {last_error!r})" if last_error else "")
    )


def why_it_failed(stderr: str, limit: int = 6000) -> str:
    """What a failed Python-and-Spark subprocess said that matters: its last Python traceback
    and the JVM's ERROR lines before it, not the tail that a JVM's shutdown hooks fill with
    stack traces after the Python side has already failed."""
    lines = stderr.splitlines()
    starts = [
        i
        for i, line in enumerate(lines)
        if line.startswith("Traceback (") and (i == 0 or "Logging error" not in lines[i - 1])
    ]  # logging's own errors at interpreter exit (py4j's __del__) are no cause
    start = starts[-1] if starts else -1
    if start < 0:
        return stderr[-limit:]
    errors = [line for line in lines[:start] if " ERROR " in line][-20:]
    traceback = [line for line in lines[start:] if not line.startswith(("\tat ", "\t..."))]
    return "\n".join([*errors, "...", *traceback])[-limit:]


def run_python(
    args: list[str],
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python args...`` (this interpreter) in a process of its own, its output captured as
    text; the caller checks the exit code."""
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def python_json(
    args: list[str],
    env: dict[str, str],
    cwd: Path | None = None,
    timeout: float = 120,
) -> Any:
    """``python args...`` in a process of its own (Airflow and Spark read their settings at
    import): the JSON its last line of output prints; a non-zero exit fails with what it said."""
    done = run_python(args, env, cwd, timeout)
    assert done.returncode == 0, why_it_failed(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def icefall_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``icefall ARGS...`` (``python -m broker.cli``) from the repository."""
    return run_python(["-m", "broker.cli", *args], env, REPO, timeout)


@contextlib.contextmanager
def serving(server: ThreadingHTTPServer) -> Iterator[str]:
    """``server`` (bound to a loopback port) serving from a thread: its URL; shut down and
    closed after."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# ``python -m broker.cli`` without hypothesis, as in the image (``Dockerfile``: no test extra):
# kio registers hypothesis strategies for its types at import when it finds hypothesis, 0.2-0.5
# of a broker start's ~2 CPU-s here, paid by every one of the suite's few hundred broker starts.
# (The benchmarks start their brokers with this class too.)
BROKER_MAIN = (
    "import sys; sys.modules['hypothesis'] = None; from broker.cli import main; sys.exit(main())"
)


class BrokerProcess:
    """``icefall broker`` in its own process group, on free ports."""

    def __init__(
        self, home: Path, extra_args: list[str] | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.home = home
        self.kafka_port = free_port()
        self.admin_port = free_port()
        self.registry_port = free_port()
        self.catalog_port = free_port()
        self.extra_args = extra_args or []
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = home.parent / f"{home.name}-broker.log"
        # The tables' catalog when it is not the broker's own (Glue, S3 Tables, Nessie, ...):
        # how the tests open the tables (tests/spark_jobs/round_support.py catalog).
        self.tables_spec: CatalogSpec | None = None
        # ``user:password`` for an admin API that requires a login (``admin()`` sends it)
        self.admin_user_info: str | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.registry_port}"

    @property
    def catalog_url(self) -> str:
        return f"http://127.0.0.1:{self.catalog_port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        ready = self.home.parent / f"{self.home.name}.ready"
        ready.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-c",
            BROKER_MAIN,
            "broker",
            "--home",
            str(self.home),
            "--kafka-port",
            str(self.kafka_port),
            "--admin-port",
            str(self.admin_port),
            "--registry-port",
            str(self.registry_port),
            "--catalog-port",
            str(self.catalog_port),
            "--ready-file",
            str(ready),
            *self.extra_args,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"broker exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"broker did not start within {timeout}s (log: {self.log_path})")
            time.sleep(0.05)
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 60.0) -> int:
        # 60 s: a broker on moto's S3 flushes its last segments on the way out, and on a loaded
        # 2-core machine that alone took over 20 s (test_glue_catalog's broker, twice)
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise

    def admin(self, path: str, method: str = "GET") -> dict[str, Any]:
        """The admin API's JSON answer."""
        from broker.http_security.client import basic_auth_header

        req = urllib.request.Request(
            self.admin_url + path, method=method, headers=basic_auth_header(self.admin_user_info)
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data

    def config(self) -> BrokerConfig:
        """The broker's settings as another process of the system (an Airflow stack) needs them."""
        from broker.config import BrokerConfig

        return BrokerConfig(
            home=self.home,
            kafka_port=self.kafka_port,
            admin_port=self.admin_port,
            registry_port=self.registry_port,
            catalog_port=self.catalog_port,
        )

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


# a test cluster's broker.lease.ms and heartbeat: a failover in a few seconds
CLUSTER_LEASE_MS = 3000
CLUSTER_HEARTBEAT_MS = 300


class ClusterBrokerProcess(BrokerProcess):
    """``icefall broker`` as one member of a cluster: its own node id and ports, the Postgres
    metadata database and the object store every member shares. Short leases and heartbeats
    by default, so a test sees a failover in a few seconds."""

    def __init__(
        self,
        home: Path,
        node_id: int,
        metadata_uri: str,
        object_store: str,
        lease_ms: int = CLUSTER_LEASE_MS,
        heartbeat_ms: int = CLUSTER_HEARTBEAT_MS,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            home,
            [
                "--node-id",
                str(node_id),
                "--metadata-uri",
                metadata_uri,
                "--object-store",
                object_store,
                "--broker-lease-ms",
                str(lease_ms),
                "--broker-heartbeat-interval-ms",
                str(heartbeat_ms),
                *(extra_args or []),
            ],
            env,
        )
        self.node_id = node_id

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
