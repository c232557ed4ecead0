from __future__ import annotations

import atexit
import contextlib
import inspect
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import BrokerProcess, free_port, wait_for

# Every JVM the tests start (Spark's drivers and jobs, Kafka's tools, broker and Connect worker,
# Nessie, Iceberg's REST fixture) lives seconds to a minute on little data, so its JIT compiling
# is a large part of its CPU: C1 alone and the serial collector cut that (the suite shares two
# cores).
# On tests/broker/test_kafka_tools.py (nine tests, a JVM per command) 114.6 → 77.7 CPU-s,
# wall 89 → 75 s; tests/spark_jobs/test_maintenance.py 105 → 93 s wall. Tests only: what
# `make run` starts keeps the JVM's defaults; a JDK_JAVA_OPTIONS already set is kept.
# Their temporary files go to one directory per test process, removed when it exits: a JVM the
# fault tests kill (-9) never runs its shutdown hooks, and left in /tmp its Spark directories
# (spark-*, blockmgr-*: the jars copied for every SparkContext, ~100 MB each) and lz4-java's
# native library stayed there for good (236 spark-* directories, 13 GB, after the suite's runs
# on one machine: a benchmark then failed with "No space left on device").
JVM_TMP = tempfile.mkdtemp(prefix="icefall-jvm-tmp-")
atexit.register(shutil.rmtree, JVM_TMP, ignore_errors=True)
os.environ.setdefault(
    "JDK_JAVA_OPTIONS", f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.io.tmpdir={JVM_TMP}"
)


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    """Start brokers with extra flags; every one started is stopped at teardown."""
    started: list[BrokerProcess] = []

    def make(
        extra_args: list[str] | None = None, env: dict[str, str] | None = None, name: str = "home"
    ) -> BrokerProcess:
        broker = BrokerProcess(tmp_path / name, extra_args, env)
        started.append(broker)
        return broker.start()

    yield make
    for broker in started:
        with contextlib.suppress(Exception):  # a broker that failed to start or already died
            broker.stop()


@pytest.fixture
def broker(broker_factory: object) -> BrokerProcess:
    assert callable(broker_factory)
    result: BrokerProcess = broker_factory(["--segment-flush-ms", "200"])
    return result


# ---------------------------------------------------------------- S3 (moto)

LIBFAKETIME = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"  # Debian's libfaketime (make system-deps)
)
MOTO_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
}


class ServerProcess:
    """A test server started in its own process group: waited for over HTTP, stopped with its group."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    def wait_http(self, url: str, name: str, timeout: float, interval: float) -> None:
        def answers() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)

        wait_for(
            answers, timeout, interval=interval, what=f"{name} on {url} (log: {self.log_path})"
        )

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class MotoS3(ServerProcess):
    """moto's S3 server in its own process group on a free port, so broker
    subprocesses can reach it. State is in memory: it dies with the process."""

    def __init__(self, log_path: Path, clock_file: Path | None = None) -> None:
        """``clock_file``: run the server under libfaketime with its clock offset read from
        this file at every call (``set_clock``), so objects can be written "days ago"."""
        self.port = free_port()
        self.log_path = log_path
        self.clock_file = clock_file
        env = {**os.environ, **MOTO_CREDENTIALS}
        if clock_file is not None:
            clock_file.write_text("+0\n")
            env.update(
                LD_PRELOAD=LIBFAKETIME,
                FAKETIME_TIMESTAMP_FILE=str(clock_file),
                FAKETIME_NO_CACHE="1",
                FAKETIME_DONT_FAKE_MONOTONIC="1",
            )
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )

    def set_clock(self, offset: str) -> None:
        """The server's clock from now on: libfaketime's relative offset, e.g. ``-4d`` or ``+0``."""
        assert self.clock_file is not None, "started without a clock file"
        self.clock_file.write_text(offset + "\n")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The AWS_* variables a broker needs to use this server (or ``endpoint``, a proxy in front of it)."""
        return {"AWS_ENDPOINT_URL": endpoint or self.endpoint, **MOTO_CREDENTIALS}

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        self.wait_http(self.endpoint + "/moto-api/", "moto server", timeout, interval=0.1)

    def requests_seen(self, bucket: str) -> list[str]:
        """Every request on ``bucket`` so far (path-style, as the tests' clients send them), as
        ``"METHOD /bucket/key?query"`` in the order the server's log has them. A marker request
        is sent and waited for first: werkzeug writes a request's line before it sends the
        response, so every request answered before this call is in the log by then."""
        marker = f"marker-{uuid.uuid4().hex}"
        with contextlib.suppress(Exception):  # 404: it is only there to be logged
            self.client().head_object(Bucket=bucket, Key=marker)

        def on_bucket(request: str) -> bool:
            path = request.partition(" ")[2]
            return path == f"/{bucket}" or path.startswith((f"/{bucket}/", f"/{bucket}?"))

        def logged() -> list[str] | None:
            quoted = (
                line.split('"') for line in self.log_path.read_text(errors="replace").splitlines()
            )
            requests = (" ".join(parts[1].split()[:2]) for parts in quoted if len(parts) > 2)
            lines = [request for request in requests if on_bucket(request)]
            ends = [i for i, line in enumerate(lines) if marker in line]
            return lines[: ends[0]] if ends else None

        return wait_for(logged, 30, interval=0.05, what=f"moto's log line of {marker}")


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    """One moto S3 server for the session, killed at its end; tests keep apart by using their own bucket."""
    server = MotoS3(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(moto_s3: MotoS3) -> str:
    """A fresh, empty bucket on the session's moto server."""
    name = f"icefall-{uuid.uuid4().hex[:12]}"
    moto_s3.client().create_bucket(Bucket=name)
    return name


def set_moto_credentials_only(mp: pytest.MonkeyPatch) -> None:
    """moto's credentials in this process's environment and no S3 endpoint: a client here must
    take the endpoint from where the code under test hands it (the catalog, a job's settings)."""
    for name, value in MOTO_CREDENTIALS.items():
        mp.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        mp.delenv(name, raising=False)


def start_s3_broker(
    moto_s3: MotoS3, home: Path, extra_args: list[str]
) -> tuple[BrokerProcess, str]:
    """A broker whose object store and warehouse are in a fresh bucket of ``moto_s3`` (the
    endpoint in its environment), started with ``extra_args``; the caller stops it. Returns
    the broker and the bucket."""
    bucket = f"lake-{uuid.uuid4().hex[:8]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    args = [*extra_args, "--object-store", f"s3://{bucket}/segments"]
    args += ["--warehouse", f"s3://{bucket}/warehouse"]
    return BrokerProcess(home, args, env=moto_s3.env()).start(), bucket


# ---------------------------------------------------------------- markers
#
# Every test gets at least one of the markers registered in pyproject.toml:
#   e2e, reliability      by directory (tests/e2e, tests/reliability)
#   airflow               by directory (tests/dags, tests/plugins)
#   integration           starts a process: a broker, moto's S3 server, PostgreSQL
#   spark                 uses a Spark session or runs a Spark job as a process
#   unit                  none of the above: `make test-unit`, the quick loop
# "Starts a process" and "uses Spark" are read from the code of the test, of the fixtures
# it uses (with the fixtures those use), and of the tests.* helpers these call, so a new
# test is classified without a list to keep up to date. A marker set by hand is kept.

CATEGORIES = ("unit", "integration", "spark", "airflow", "e2e", "reliability")
_BY_DIRECTORY = {
    "e2e": "e2e",
    "reliability": "reliability",
    "dags": "airflow",
    "plugins": "airflow",
}
# A name in the code that starts a process...
_PROCESS_NAMES = frozenset({"BrokerProcess", "MotoS3", "PostgresServer", "Popen"})
# ...or a Spark session, or a Spark job in a process.
_SPARK_NAMES = frozenset({"spark_session", "SparkSession"})
_SPARK_STRINGS = frozenset(
    {
        "spark_jobs.commit_round",
        "spark_jobs.maintenance",
        "spark_jobs.dlq_reprocess",
        "spark-submit",
    }
)
_SPARK_FIXTURES = frozenset({"spark"})
_TESTS_DIR = Path(__file__).resolve().parent


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _uses(func: Any, seen: set[Any]) -> tuple[set[str], set[str]]:
    """Global names and string constants in ``func``'s code and in the code of the
    functions and classes of tests.* it refers to (transitively)."""
    names: set[str] = set()
    strings: set[str] = set()
    todo = [func]
    while todo:
        current = inspect.unwrap(todo.pop())
        if current in seen:
            continue
        seen.add(current)
        if inspect.isclass(current):
            todo.extend(v for v in vars(current).values() if inspect.isfunction(v))
            continue
        code = getattr(current, "__code__", None)
        if code is None:
            continue
        module_globals = getattr(current, "__globals__", {})
        for each in _code_objects(code):
            names.update(each.co_names)
            strings.update(c for c in each.co_consts if isinstance(c, str))
            for name in each.co_names:
                target = module_globals.get(name)
                if (inspect.isfunction(target) or inspect.isclass(target)) and getattr(
                    target, "__module__", ""
                ).startswith("tests."):
                    todo.append(target)
    return names, strings


def _categories(item: pytest.Item) -> set[str]:
    found: set[str] = set()
    parts = Path(str(item.path)).resolve().relative_to(_TESTS_DIR).parts
    if len(parts) > 1 and parts[0] in _BY_DIRECTORY:
        found.add(_BY_DIRECTORY[parts[0]])
    fixture_names = set(getattr(item, "fixturenames", ()))
    if fixture_names & _SPARK_FIXTURES:
        found.add("spark")
    funcs: list[Any] = [getattr(item, "function", None)]
    fixture_info = getattr(item, "_fixtureinfo", None)
    for name in fixture_names:
        funcs.extend(
            d.func for d in (fixture_info.name2fixturedefs.get(name, ()) if fixture_info else ())
        )
    seen: set[Any] = set()
    for func in funcs:
        if func is None:
            continue
        names, strings = _uses(func, seen)
        if names & _PROCESS_NAMES:
            found.add("integration")
        if names & _SPARK_NAMES or strings & _SPARK_STRINGS:
            found.add("spark")
    return found


# The longest test files, longest first (seconds in a full run's durations report, 2026-11-26:
# 400, 420, 230, 200, 150, 145, 135, 135, 130, 120). ``make test`` hands whole files to its two
# workers (``--dist loadfile``), and in collection order (``--no-loadscope-reorder``: xdist's
# own order, most tests first, put the one-test files last): the long one-test file that came
# last ran alone at the end while the other worker idled, 7 minutes of a 35-minute run. First,
# they overlap everything else.
LONGEST_FILES = (
    "reliability/test_airflow_faults.py",
    "spark_jobs/test_s3_warehouse.py",
    "spark_jobs/test_glue_catalog.py",
    "e2e/test_up.py",
    "broker/test_kafka_tools.py",
    "spark_jobs/test_round_upsert.py",
    "spark_jobs/test_maintenance.py",
    "spark_jobs/test_nessie_catalog.py",
    "e2e/test_spark_cluster.py",
    "reliability/test_round_kills.py",
)


def _run_order(item: pytest.Item) -> int:
    path = Path(str(item.path)).resolve().relative_to(_TESTS_DIR).as_posix()
    return LONGEST_FILES.index(path) if path in LONGEST_FILES else len(LONGEST_FILES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_run_order)  # stable: the other files, and each file's tests, keep their order
    for item in items:
        marked = {m.name for m in item.iter_markers() if m.name in CATEGORIES}
        found = (marked | _categories(item)) - {"unit"}
        if "unit" in marked and found:
            raise pytest.UsageError(
                f"{item.nodeid} is marked unit but is {', '.join(sorted(found))}"
            )
        for name in sorted(found - marked) or (["unit"] if not marked else []):
            item.add_marker(name)


# ---------------------------------------------------------------- an independent Iceberg REST catalog

REST_FIXTURE_JARS = Path(sys.prefix) / "share" / "icefall" / "test-jars" / "iceberg-rest-fixture"


class IcebergRestCatalog(ServerProcess):
    """Apache Iceberg's own REST catalog server (``RESTCatalogServer``, from its Maven Central
    jars: tests/jvm/iceberg-rest-fixture) on a free port, over a JdbcCatalog on a SQLite file
    and a warehouse directory: a catalog that is not Icefall's, as a user's would be."""

    def __init__(self, folder: Path) -> None:
        if not (REST_FIXTURE_JARS / ".pinned").exists():
            raise RuntimeError(
                f"the Iceberg REST fixture's jars are not in {REST_FIXTURE_JARS}: run `make test`"
            )
        self.port = free_port()
        self.warehouse = (folder / "warehouse").resolve().as_uri()
        self.log_path = folder / "iceberg-rest.log"
        # A SQLite file and one pooled connection: the server's default, SQLite in memory, is a
        # database per pooled connection, and a connection the pool replaces takes its tables along.
        env = {
            **os.environ,
            "CATALOG_WAREHOUSE": self.warehouse,
            "CATALOG_REST_PORT": str(self.port),
            "CATALOG_URI": f"jdbc:sqlite:{(folder / 'catalog.sqlite').resolve()}",
            "CATALOG_CLIENTS": "1",
        }
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    "java",
                    "-cp",
                    f"{REST_FIXTURE_JARS}/*",
                    "org.apache.iceberg.rest.RESTCatalogServer",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_http(self.uri + "/v1/config", "the Iceberg REST catalog", timeout, interval=0.2)


@pytest.fixture(scope="module")
def iceberg_rest_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IcebergRestCatalog]:
    server = IcebergRestCatalog(tmp_path_factory.mktemp("iceberg-rest"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
