"""``icefall up``: the whole system on the embedded defaults.

Starts the broker and Airflow 3 (api-server, scheduler, dag-processor,
triggerer; SQLite, LocalExecutor; ``AIRFLOW_HOME`` = ``HOME/airflow``), each in
its own process group, creates the demo table topic ``clicks`` and runs a demo
producer until Ctrl-C, then stops every process group it started (so the
LocalExecutor's workers and the spark-submit JVMs they run go too).

A broker that exits on its own (a crash, ``kill -9``, the OOM killer) is started again
(``SupervisedBroker``): it replays its WAL, so nothing it acknowledged is lost, and the demo
producer and Airflow carry on. So is an Airflow component (its state is in Airflow's
database). Only a process that keeps exiting (``MAX_EXITS`` times within ``EXIT_WINDOW_S``:
``ExitBudget``) stops everything, with a message that says so; a full disk is not such a
case: the broker refuses produces and serves on (``broker/storage/wal.py``).

With Airflow it also starts the warm round driver (``warm_driver``: one long-lived Spark
driver that runs the commit rounds Airflow asks for, instead of a JVM start per round),
restarts it when it exits, and stops it last.

``ICEFALL_AIRFLOW_PORT`` (default 8080) moves the Airflow UI;
``ICEFALL_NO_AIRFLOW=1`` runs without Airflow; ``ICEFALL_DEMO_COMMIT_INTERVAL_MS``
sets the demo topic's commit interval (default 60000): these and the warm driver's are
``UpSettings`` (``up_settings``), read and checked by ``broker.cli`` before anything starts.
On a secured broker the demo's clients log in with ``ICEFALL_REGISTRY_USER_INFO`` (the registry) and
``ICEFALL_DEMO_KAFKA_USER_INFO`` (a SASL listener, when there is no PLAINTEXT one); secret
settings reach the broker in its environment, never its command line (``ps`` shows that).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker import names, topic_configs
from broker.config import BrokerConfig, secret_env, to_overrides
from broker.http_security.client import registry_user_info
from broker.supervisor import parse_request, warm_driver
from broker.supervisor.up_settings import UpSettings, load_up_settings

DEMO_TOPIC = "clicks"
DEMO_KAFKA_USER_INFO_ENV = "ICEFALL_DEMO_KAFKA_USER_INFO"
REPO = Path(__file__).resolve().parents[2]
AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
SYNC_PENDING = 3  # icefall_airflow.sync: a DAG to pause is not parsed yet
SYNC_RETRY_S = 5.0
MAX_EXITS = 3  # exits of one supervised process within EXIT_WINDOW_S that end the whole run
EXIT_WINDOW_S = 300.0


def _wait_ready(ready: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            raise SystemExit(f"icefall: the broker exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit("icefall: the broker did not start within 60 s")
        time.sleep(0.1)


def demo_kafka_config(config: BrokerConfig) -> dict[str, str | int | float | bool]:
    """confluent-kafka settings of the demo's clients for the listener ``bootstrap`` names: the
    loopback PLAINTEXT one when there is one; else TLS trusting ``SSL_CERT_FILE`` (else the
    system's CAs) and, on a SASL listener, the login ``ICEFALL_DEMO_KAFKA_USER_INFO=user:password``
    (PLAIN for a user of the listener's PLAIN JAAS text, else the strongest SCRAM enabled)."""
    from broker.security import settings

    listener = config.client_listener
    out: dict[str, str | int | float | bool] = {
        "bootstrap.servers": config.bootstrap,
        "security.protocol": listener.protocol,
    }
    if listener.tls and os.environ.get("SSL_CERT_FILE"):
        out["ssl.ca.location"] = os.environ["SSL_CERT_FILE"]
    if listener.sasl:
        user, sep, password = os.environ.get(DEMO_KAFKA_USER_INFO_ENV, "").partition(":")
        if not sep or not user:
            raise SystemExit(
                f"icefall: the demo's Kafka listener {listener.name} is {listener.protocol}: "
                f"set {DEMO_KAFKA_USER_INFO_ENV}=user:password (a SCRAM user, or a PLAIN user of "
                f"{listener.prefix}plain.sasl.jaas.config), or add a PLAINTEXT listener on loopback"
            )
        enabled = settings.mechanisms(config, listener)
        if "PLAIN" in enabled and user in settings.plain_users(config, listener):
            mechanism = "PLAIN"
        else:
            scram = [m for m in ("SCRAM-SHA-512", "SCRAM-SHA-256") if m in enabled]
            mechanism = (scram or enabled)[0]
        out.update({"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password})
    return out


def demo_registry_config(config: BrokerConfig) -> dict[str, str]:
    """Confluent ``SchemaRegistryClient`` settings for the broker's registry: basic auth from
    ``ICEFALL_REGISTRY_USER_INFO`` (the variable Icefall's jobs read), TLS trusting
    ``SSL_CERT_FILE``."""
    out = {"url": config.registry_url}
    if user_info := registry_user_info():
        out["basic.auth.user.info"] = user_info
    if config.registry_url.startswith("https:") and os.environ.get("SSL_CERT_FILE"):
        out["ssl.ca.location"] = os.environ["SSL_CERT_FILE"]
    return out


def _ensure_demo_topic(kafka: dict[str, str | int | float | bool], interval_ms: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(kafka)
    if DEMO_TOPIC in admin.list_topics(timeout=10).topics:
        return
    config = {topic_configs.ENABLE: "true", topic_configs.COMMIT_INTERVAL_MS: str(interval_ms)}
    for future in admin.create_topics([NewTopic(DEMO_TOPIC, 3, 1, config=config)]).values():
        future.result(10)


DEMO_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Click",
        "namespace": "icefall.demo",
        "fields": [
            {"name": "user_id", "type": "long"},
            {"name": "page", "type": "string"},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
)


def _demo_serializer(registry: dict[str, str]) -> Callable[[dict[str, object]], bytes]:
    """Confluent's Avro serializer against the built-in registry (it registers
    ``clicks-value`` on first use), so the demo passes the data quality gate."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(SchemaRegistryClient(registry), DEMO_SCHEMA)
    context = SerializationContext(DEMO_TOPIC, MessageField.VALUE)

    def serialize(event: dict[str, object]) -> bytes:
        data = serializer(event, context)
        assert data is not None
        return data

    return serialize


class AirflowStack:
    """Airflow 3 as ``airflow standalone`` runs it, but with Icefall's settings and
    every component in a process group of its own (logs in ``AIRFLOW_HOME/logs``)."""

    def __init__(
        self, config: BrokerConfig, home: Path, port: int, settings: UpSettings | None = None
    ) -> None:
        """``settings``: the run's (default: from the environment, ``load_up_settings``)."""
        settings = settings or load_up_settings()
        self.home = home / "airflow"
        self.port = port
        self.url = f"http://{config.advertised}:{port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.budgets = {name: ExitBudget() for name in AIRFLOW_COMPONENTS}
        self.db_sync: subprocess.Popen[bytes] | None = None
        self.manifest = config.manifest_path
        self.dags = REPO / "dags"
        self.manifest_mtime = -1.0  # as of the last sync started
        self.parse_mtime = -1.0  # as of the last parsing requests filed
        self.parse_filed = False  # by this process (else the sync files them)
        self.sync_again_at = 0.0
        bin_dir = str(Path(sys.executable).parent)  # `airflow` and `spark-submit` of this venv
        self.env = {
            **os.environ,
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "8",  # LocalExecutor worker processes (the default 32 costs ~4 GB)
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            # A pooled SQLite connection that hit "database is locked" is replaced at its next
            # checkout: one Airflow's backfill left with an old read snapshot failed every later task
            # ("Task Instance not found") until a restart (icefall_airflow.db_sessions).
            "AIRFLOW__DATABASE__SQL_ALCHEMY_SESSION_MAKER": "icefall_airflow.db_sessions.session_maker",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            # The manifest's DAG files change only with the manifest, and `sync` (run when it changes)
            # asks the DAG processor to re-parse them at once (parse_request): the periodic parse is
            # a fallback. Every 10 s it was 80 % of Airflow's idle CPU (bench/airflow_cpu.py); an
            # edited file is still parsed early (the processor's modified_time order).
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "300",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            # After each idle sleep the scheduler runs its loop (the queries for runs to create and
            # start and tasks to queue, ~20 ms of CPU): at Airflow's 1 s, more than half of an idle
            # Airflow's CPU; at 2 s half as much (bench/BENCHMARKS.md, airflow_cpu). Commit runs are
            # created 4 s before their interval ends (icefall_airflow.timetable), so rounds are not
            # later; another DAG's next task or asset-triggered run may wait up to 2 s, not 1 s, on
            # an idle scheduler (a loop that queued or finished a task does not sleep).
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": os.environ.get(
                "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME", "2"
            ),
            # A scheduler that died (-9, with its workers and their running rounds) leaves its task
            # instances "running"; the restarted one resets them once the dead one's heartbeat is 30 s
            # old, at its next orphan check. Airflow's 300 s checks would stall the table's rounds
            # (max_active_runs=1) for five minutes or more; a worker that died alone is failed and
            # retried after 60 s without a heartbeat.
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "AIRFLOW_CONN_SPARK_DEFAULT": os.environ.get(
                "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[*]"})
            ),
            "ICEFALL_HOME": str(home),
            "ICEFALL_ADMIN_URL": config.admin_url,
        }
        # the warm round driver: its JVM starts with Airflow, its connection is in Airflow's env
        self.warm: warm_driver.WarmDriverProcess | None = None
        if not settings.no_warm_driver:
            self.warm = warm_driver.WarmDriverProcess(
                dict(self.env),
                self.home / "logs",
                settings.warm_driver_port or None,
                settings.warm_driver_master,
            )
            self.env.update(self.warm.airflow_connection())

    def _log(self, name: str) -> Any:
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        return open(self.home / "logs" / f"{name}.log", "ab")

    def migrate(self) -> None:
        """Create or upgrade the metadata database (and airflow.cfg, whose generated
        secrets every component then shares)."""
        self.home.mkdir(parents=True, exist_ok=True)
        with self._log("db-migrate") as log:
            done = subprocess.run(
                ["airflow", "db", "migrate"],
                check=False,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if done.returncode != 0:
            raise SystemExit(
                f"icefall: `airflow db migrate` failed; see {self.home / 'logs' / 'db-migrate.log'}"
            )

    def start(self) -> None:
        if self.warm is not None:
            self.warm.start()
        for name in AIRFLOW_COMPONENTS:
            self._start(name)

    def _start(self, name: str) -> None:
        args = ["airflow", name] + (["--port", str(self.port)] if name == "api-server" else [])
        with self._log(name) as log:
            self.procs[name] = subprocess.Popen(
                args, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def kill_and_restart(self, name: str) -> None:
        """SIGKILL one component's process group (a scheduler takes its LocalExecutor workers and
        their running spark-submits with it), then start it again: the crash a machine sees."""
        proc = self.procs[name]
        _signal_group(proc, signal.SIGKILL)
        proc.wait(30)
        self._start(name)

    def wait_ready(self, should_stop: Callable[[], bool], timeout: float = 180) -> str | None:
        """Wait for the API server; return the admin password it generated (None if set elsewhere)."""
        deadline = time.monotonic() + timeout
        while not should_stop():
            self.check()
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/api/v2/monitor/health", timeout=2
                ) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"icefall: the Airflow API server did not answer within {timeout:g} s "
                    f"(logs: {self.home / 'logs'})"
                )
            time.sleep(0.5)
        passwords = self.home / "simple_auth_manager_passwords.json.generated"
        if passwords.exists():
            return str(json.loads(passwords.read_text()).get("admin"))
        return None

    def check(self) -> None:
        """Start a component that exited again (what is left of its process group, a
        scheduler's LocalExecutor workers, is killed first): a crash of one (an Airflow bug, a
        full disk under its database) must not end the whole run; ``SystemExit`` when it keeps
        exiting (``ExitBudget``). A warm driver that exited is restarted too."""
        if self.warm is not None:
            self.warm.check()
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            log_path = self.home / "logs" / f"{name}.log"
            _signal_group(proc, signal.SIGKILL)
            self.budgets[name].spend(f"airflow {name} (log: {log_path})", code)
            print(
                f"icefall: airflow {name} exited with code {code}; restarting it (log: {log_path})",
                file=sys.stderr,
                flush=True,
            )
            self._start(name)

    def sync(self) -> None:
        """Pools and paused DAGs (``icefall_airflow.sync``) when the manifest changed, one run at a
        time in the background; again every few seconds while it reports DAGs not parsed yet.
        A manifest change first asks the DAG processor to re-parse its DAG files (``parse_request``),
        even while a sync still runs."""
        try:
            mtime = self.manifest.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime != self.parse_mtime:
            self.parse_mtime = mtime
            self.parse_filed = self._request_parse()
        if self.db_sync is not None:
            if self.db_sync.poll() is None:
                return
            if self.db_sync.returncode == SYNC_PENDING:
                if time.monotonic() < self.sync_again_at:
                    return
                self.manifest_mtime = -1.0  # the DAG processor may have parsed them by now
            self.db_sync = None
        if mtime == self.manifest_mtime:
            return
        self.manifest_mtime = mtime
        self.sync_again_at = time.monotonic() + SYNC_RETRY_S
        with self._log("sync") as log:
            self.db_sync = subprocess.Popen(
                [sys.executable, "-m", "icefall_airflow.sync"]
                + (["--no-parse-request"] if self.parse_filed else []),  # filed: not twice
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _request_parse(self) -> bool:
        """The DAG processor re-parses the manifest's DAG files within a second, not once a sync
        process has started; should that fail (False), the sync files the same requests."""
        try:
            parse_request.file_requests(self.home / "airflow.db", self.dags)
        except sqlite3.Error as exc:
            with self._log("sync") as log:
                log.write(
                    f"could not file parsing requests ({exc}); the sync files them\n".encode()
                )
            return False
        return True

    def stop(self) -> None:
        """The API server goes last: running tasks talk to it (execution API) until they are stopped."""
        first = [p for name, p in self.procs.items() if name != "api-server"]
        first += [self.db_sync] if self.db_sync is not None else []
        for (
            proc
        ) in first:  # in parallel: the scheduler's group holds its workers and their spark-submits
            _signal_group(proc, signal.SIGTERM)
        for proc in first:
            _stop(proc, 15)
        if "api-server" in self.procs:
            _stop(self.procs["api-server"], 15)
        if self.warm is not None:
            self.warm.stop()


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)


def _stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM the process group, SIGKILL what is left after ``timeout`` (children too: they share the group)."""
    _signal_group(proc, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)
    _signal_group(
        proc, signal.SIGKILL
    )  # the leader may be gone while children of its group live on
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _where_to_look(
    config: BrokerConfig,
    home: Path,
    demo_rate: float,
    airflow: AirflowStack | None,
    password: str | None,
) -> str:
    bootstrap = config.bootstrap
    table = f"default.{DEMO_TOPIC}"
    if airflow is None:
        ui = "  Airflow:          not started (ICEFALL_NO_AIRFLOW)\n"
    else:
        login = (
            f"admin / {password}"
            if password
            else f"see {airflow.home / 'simple_auth_manager_passwords.json.generated'}"
        )
        ui = (
            f"  Airflow UI:       {airflow.url}  (login {login})\n"
            f"  Commit DAG:       {airflow.url}/dags/{names.commit_dag_id(DEMO_TOPIC)}\n"
            f"  Table topics:     {airflow.url}/plugin/icefall-table-topics\n"
            f"  Airflow logs:     {airflow.home / 'logs'}\n"
        )
        ui += (
            f"  Round driver:     warm, {airflow.warm.url} (log {airflow.warm.log_path})\n"
            if airflow.warm is not None
            else "  Round driver:     none: a process per round (ICEFALL_NO_WARM_DRIVER)\n"
        )
    return (
        f"\nIcefall is up.\n"
        f"  Kafka bootstrap:  {bootstrap}\n"
        f"  Admin API:        {config.admin_url}/v1/table-topics  (Prometheus: {config.admin_url}/metrics)\n"
        f"  Schema registry:  {config.registry_url}/subjects\n"
        f"  Iceberg catalog:  {config.catalog_url} (REST; warehouse {config.catalog_warehouse})\n"
        f"{ui}"
        f"  Home:             {home}\n"
        f"  Demo producer:    {demo_rate:g} records/s to topic '{DEMO_TOPIC}' -> table {table}\n"
        f"  Try:              kcat -b {bootstrap} -C -t {DEMO_TOPIC} -o -5 -e\n"
        f"Query the table (rows appear after the first commit round):\n"
        f"  pyiceberg:  load_catalog('icefall', type='rest', uri='{config.catalog_url}')"
        f".load_table('{table}').scan().to_arrow()\n"
        f"  DuckDB:     from broker.catalog import duckdb_local; con = duckdb_local.connect(); "
        f"duckdb_local.attach_catalog(con, '{config.catalog_url}', 'lake'); "
        f"con.sql('SELECT page, count(*) FROM lake.default.{DEMO_TOPIC} GROUP BY page')\n"
        "  Spark SQL:  spark-sql "
        '--jars "$(python -c \'from spark_jobs.jars import iceberg_jars; print(",".join(iceberg_jars()))\')" '
        f"--conf spark.sql.catalog.icefall=org.apache.iceberg.spark.SparkCatalog "
        f"--conf spark.sql.catalog.icefall.type=rest --conf spark.sql.catalog.icefall.uri={config.catalog_url} "
        f"-e 'SELECT count(*) FROM icefall.default.{DEMO_TOPIC}'\n"
        f"Press Ctrl-C to stop everything.\n"
    )


class DemoProducer(threading.Thread):
    """Produces demo clicks from the start (Airflow takes a while to come up) until ``stopping``;
    the producer is flushed and closed before the broker stops."""

    def __init__(self, config: BrokerConfig, rate: float, stopping: threading.Event) -> None:
        super().__init__(name="demo-producer", daemon=True)
        self.config, self.rate, self.stopping = config, rate, stopping
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._produce()
        except Exception as exc:  # noqa: BLE001 -- reported by the main thread, which then exits 1
            self.error = exc
            self.stopping.set()

    def _produce(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                **demo_kafka_config(self.config),
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 50,
            }
        )
        serialize = _demo_serializer(demo_registry_config(self.config))
        pages = ["/", "/pricing", "/docs", "/blog", "/signup"]
        next_at = time.monotonic()
        while not self.stopping.is_set():
            user = random.randrange(1000)
            event = {"user_id": user, "page": random.choice(pages), "ts": int(time.time() * 1000)}
            producer.produce(DEMO_TOPIC, key=str(user).encode(), value=serialize(event))
            producer.poll(0)
            self.sent += 1
            next_at += 1 / self.rate
            self.stopping.wait(max(0.0, next_at - time.monotonic()))
        producer.flush(10)


def broker_command(config: BrokerConfig, home: Path, ready: Path) -> list[str]:
    """``icefall broker`` with every setting of ``config`` as ``--override`` (they beat the
    environment and any config file), so the broker runs on exactly the model ``icefall up`` has."""
    overrides = {**to_overrides(config), "home": str(home)}
    return [
        sys.executable,
        "-m",
        "broker.cli",
        "broker",
        "--ready-file",
        str(ready),
        *(arg for key, value in overrides.items() for arg in ("--override", f"{key}={value}")),
    ]


def _start_broker(config: BrokerConfig, home: Path, ready: Path) -> subprocess.Popen[bytes]:
    # ICEFALL_HOME marks every process of this run (the broker and all Airflow processes carry it).
    return subprocess.Popen(
        broker_command(config, home, ready),
        start_new_session=True,
        env={**os.environ, **secret_env(config), "ICEFALL_HOME": str(home)},
    )


class ExitBudget:
    """The exits of one supervised process: each is restarted, until it exits ``MAX_EXITS``
    times within ``EXIT_WINDOW_S`` (a crash loop a restart will not cure)."""

    def __init__(self) -> None:
        self.exits: list[float] = []  # time.monotonic() of each exit in the window

    def spend(self, what: str, code: int) -> None:
        """Count an exit of ``what``; ``SystemExit`` (what ends the run) when it was one too many."""
        now = time.monotonic()
        self.exits = [t for t in self.exits if now - t < EXIT_WINDOW_S] + [now]
        if len(self.exits) >= MAX_EXITS:
            raise SystemExit(
                f"icefall: {what} exited with code {code}, {len(self.exits)} times within "
                f"{EXIT_WINDOW_S:.0f} s; stopping everything"
            )


class SupervisedBroker:
    """The broker process of an ``icefall up`` run, started again when it exits by itself."""

    def __init__(self, config: BrokerConfig, home: Path, ready: Path) -> None:
        self.config, self.home, self.ready = config, home, ready
        self.proc = _start_broker(config, home, ready)
        self.budget = ExitBudget()

    def wait_ready(self) -> None:
        _wait_ready(self.ready, self.proc)

    def check(self) -> None:
        """Restart the broker if it exited, and wait until it serves again; ``SystemExit``
        (what ends the run) when it exited too often to be worth another start."""
        code = self.proc.poll()
        if code is None:
            return
        _stop(self.proc)  # what is left of its process group
        self.budget.spend("the broker (its log is above)", code)
        print(
            f"icefall: the broker exited with code {code}; restarting it (it replays its WAL: "
            "nothing it acknowledged is lost)",
            file=sys.stderr,
            flush=True,
        )
        self.ready.unlink(missing_ok=True)
        self.proc = _start_broker(self.config, self.home, self.ready)
        self.wait_ready()

    def stop(self) -> None:
        _stop(self.proc)


def run_up(config: BrokerConfig, demo_rate: float, settings: UpSettings) -> int:
    """Until Ctrl-C or SIGTERM; whatever happens after the broker starts (an error included),
    every process started is stopped on the way out."""
    home = config.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    ready = home / "broker.ready"
    ready.unlink(missing_ok=True)
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    airflow: AirflowStack | None = None
    if not settings.no_airflow:
        airflow = AirflowStack(config, home, settings.airflow_port, settings)
    broker = SupervisedBroker(config, home, ready)
    try:
        broker.wait_ready()
        _ensure_demo_topic(demo_kafka_config(config), settings.demo_commit_interval_ms)
        demo = DemoProducer(config, demo_rate, stopping)
        demo.start()
        password = None
        if airflow is not None and not stopping.is_set():
            print(
                f"starting Airflow (AIRFLOW_HOME {airflow.home}; first start migrates its database)...",
                flush=True,
            )
            airflow.migrate()
            airflow.sync()
            if not stopping.is_set():
                airflow.start()
                password = airflow.wait_ready(should_stop=stopping.is_set)
        if not stopping.is_set():
            print(_where_to_look(config, home, demo_rate, airflow, password), flush=True)
        while not stopping.wait(1.0):
            broker.check()
            if airflow is not None:
                airflow.check()
                airflow.sync()
        demo.join(30)
        if demo.error is not None:
            print(f"icefall: the demo producer failed: {demo.error!r}", file=sys.stderr)
            return 1
        print(f"\nstopping (demo producer sent {demo.sent} records)...", flush=True)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 1
    else:
        return 0
    finally:
        if airflow is not None:
            airflow.stop()
        broker.stop()
        ready.unlink(missing_ok=True)
