"""A real Spark standalone cluster for tests: one master and two workers on loopback, started
from the pinned PySpark's own ``spark-class`` (no other Spark install), stopped at the end.

Each daemon runs in its own process group with its own log file; the workers' executors are
their children (``CoarseGrainedExecutorBackend`` JVMs) and go with them. The cluster is up when
the master's JSON (``/json/`` of its web UI) lists every worker ALIVE. The workers' environment
has no ``PYTHONPATH`` and runs from a directory outside the repository, so executors import the
project's code only from what the application ships (``--py-files``), as on machines of their
own; their Python is the driver's (``PYSPARK_PYTHON``), as on a cluster built from one image.

Also here: what tests look at while a round runs: the executor JVMs of a worker (to kill one)
and the applications the master ran, with the workers their executors ran on.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import free_port, wait_for

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_class() -> str:
    """PySpark's ``spark-class`` script beside this venv's Python."""
    path = Path(sys.executable).parent / "spark-class"
    if not path.is_file():
        raise RuntimeError(f"{path} not found: PySpark is not installed in this venv")
    return str(path)


def daemon_env(root: Path) -> dict[str, str]:
    """The daemons' environment: this one without ``PYTHONPATH`` (executors get the code the
    application ships) and without ``AWS_*`` (they get the object store's settings from the
    job), on loopback, with the daemons' logs and pid files under ``root``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "SPARK_HOME") and not k.startswith("AWS_")
    }
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(root / "logs"),
        SPARK_PID_DIR=str(root),
        SPARK_NO_DAEMONIZE="1",
        # small JVMs: two workers and a master share two cores with the test
        SPARK_DAEMON_MEMORY="256m",
    )
    return env


@dataclass
class SparkDaemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """SIGTERM to the group (the worker kills its executors), SIGKILL if it lingers."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # executors outlive a worker killed hard: end whatever is left of the group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


class SparkCluster:
    """A master and ``workers`` workers (1 core, 1 GiB each) on 127.0.0.1."""

    def __init__(self, workers: int = 2, root: Path | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="icefall-spark-"))
        self.port = free_port()
        self.webui_port = free_port()
        self.worker_count = workers
        self.daemons: list[SparkDaemon] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def webui(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    def airflow_connection(self) -> str:
        """``AIRFLOW_CONN_SPARK_DEFAULT`` for this master, as the apache-spark provider reads it
        (``conn_type`` spark, the scheme in the host, the port apart; client deploy mode)."""
        return json.dumps(
            {
                "conn_type": "spark",
                "host": "spark://127.0.0.1",
                "port": self.port,
                "extra": {"deploy-mode": "client"},
            }
        )

    def _start(self, name: str, args: list[str]) -> SparkDaemon:
        log = self.root / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [spark_class(), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.root,
                env=daemon_env(self.root),
            )
        daemon = SparkDaemon(name, proc, log)
        self.daemons.append(daemon)
        return daemon

    def start(self, timeout: float = 120.0) -> SparkCluster:
        """Launch the daemons and wait until every worker is ALIVE."""
        return self.launch().wait_ready(timeout)

    def launch(self) -> SparkCluster:
        """Start the master and the workers, without waiting for them (``wait_ready``): a test
        can start its other servers meanwhile."""
        try:
            self._start(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.webui_port),
                ],
            )
            for n in range(self.worker_count):
                work = self.root / f"work-{n}"
                work.mkdir(parents=True, exist_ok=True)
                self._start(
                    f"worker-{n}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        self.master_url,
                        "--host",
                        "127.0.0.1",
                        "--webui-port",
                        str(free_port()),
                        "--cores",
                        "1",
                        "--memory",
                        "1g",
                        "--work-dir",
                        str(work),
                    ],
                )
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 120.0) -> SparkCluster:
        try:
            wait_for(
                self._all_alive, timeout, interval=0.25, what=f"{self.worker_count} ALIVE workers"
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _all_alive(self) -> bool:
        for daemon in self.daemons:
            if daemon.proc.poll() is not None:
                raise RuntimeError(
                    f"spark {daemon.name} exited with {daemon.proc.returncode}: "
                    f"{daemon.log.read_text()[-2000:]}"
                )
        alive = [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
        return len(alive) == self.worker_count

    def state(self) -> dict[str, Any]:
        """The master's JSON: workers, active and completed applications."""
        with urllib.request.urlopen(self.webui + "/json/", timeout=5) as resp:
            result: dict[str, Any] = json.load(resp)
        return result

    def worker_state(self, worker: dict[str, Any]) -> dict[str, Any]:
        """A worker's own JSON (its ``webuiaddress`` from the master's): running and finished
        executors, with their application ids."""
        with urllib.request.urlopen(worker["webuiaddress"] + "/json/", timeout=5) as resp:
            result: dict[str, Any] = json.load(resp)
        return result

    def applications(self) -> list[dict[str, Any]]:
        state = self.state()
        return [*state.get("activeapps", []), *state.get("completedapps", [])]

    def executors_of(self, app_id: str) -> list[tuple[str, dict[str, Any]]]:
        """(worker id, executor) of every executor the workers ran or run for ``app_id``."""
        out = []
        for worker in self.state().get("workers", []):
            mine = self.worker_state(worker)
            for executor in [*mine.get("executors", []), *mine.get("finishedexecutors", [])]:
                if executor.get("appid") == app_id:
                    out.append((worker["id"], executor))
        return out

    def worker_pids(self) -> set[int]:
        return {d.proc.pid for d in self.daemons if d.name.startswith("worker")}

    def executor_pids(self) -> list[int]:
        """The executor JVMs the workers run now (children of a worker process)."""
        workers = self.worker_pids()
        return [pid for pid in _pids() if _ppid(pid) in workers and EXECUTOR_CLASS in _cmdline(pid)]

    def python_workers_of(self, executor_pid: int) -> list[int]:
        """PySpark's Python daemon and workers under an executor JVM: Python tasks run (or ran)
        there."""
        return [
            pid
            for pid in _pids()
            if _ppid(pid) == executor_pid and "pyspark.daemon" in _cmdline(pid)
        ]

    @staticmethod
    def cmdline(pid: int) -> str:
        return _cmdline(pid)

    def stop(self) -> None:
        for daemon in reversed(self.daemons):  # workers (and their executors) first
            daemon.stop()
        self.daemons.clear()
        left = [pid for pid in _pids() if str(self.root) in _cmdline(pid)]
        if left:
            raise RuntimeError(f"processes of the test's Spark cluster left running: {left}")


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""
