"""Commit rounds beside the Apache Iceberg Kafka Connect sink and Spark Structured Streaming, in
one run on this machine (issue 17, part 2).

One Icefall broker (a temporary home) serves the topics and its built-in REST catalog takes
the tables (the ``airflow`` side brings its own). The sides run one after another (not at
once: two cores), each for the same ``--seconds`` while a producer thread sends the same
16-field records (bench/commit_round.py's generator) at ``--rate`` records/s, each carrying its
produce time in ``event_time``:

a) ``warm``, Icefall's round driver alone: the warm round driver (``spark_jobs.warm_driver``,
   one long-lived Spark driver, ``local[2]``) started once, and a round posted to it once per
   ``--interval-s`` (or right after the last one, when a round takes longer) by this script,
   bypassing Airflow, on a table topic of Confluent-framed Avro values; its CPU is the driver's
   whole process tree (Python, its JVM, Spark's Python workers) for the whole measured time,
   idle time between rounds included;
a') ``airflow``, Icefall as deployed, the coordinator counted: ``icefall up`` (bench/sustained.py's
   ``icefall_up``: a temporary home, free ports, its own broker, Airflow 3 with the
   LocalExecutor and SQLite, the warm round driver at ``local[2]``, the demo producer at 1
   record/s on its own topic) and a table topic with ``automq.table.topic.commit.interval.ms``
   = the interval, whose commit DAG (one task a round: it plans, commits and publishes) asks the
   warm driver for a round per interval. Ready once the DAG is in Airflow's database, unpaused,
   with its pool, and the ``icefall_airflow.sync`` that the topic's creation started has ended
   (the table topic's set-up, as the sink's connector start is the sink's).
   Its CPU is every process under ``icefall up`` but the broker and ``icefall up``'s own
   process (its supervision loop and the demo producer, one process): Airflow's api-server,
   scheduler (its LocalExecutor workers and their task processes), dag-processor, triggerer,
   ``icefall_airflow.sync``, the topic's maintenance DAG where it runs, and the warm driver's
   tree, sampled every 0.1 s per process keyed by pid and start time (a process that ended
   counts whole, through its reaper's children time: ``ProcessLedger``); the figure is split
   by kind of process. Its start-up CPU is the counted processes' at ready as
   seen from when Airflow's API answers (``airflow db migrate``, run and gone before, is not
   in it). The sink's coordinator runs inside its Connect worker,
   so this is the side to set against it; the broker's CPU is apart, as on every side;
b) ``rounds``, Icefall without the warm driver: ``python -m spark_jobs.commit_round`` once per
   interval, a new process each time (Spark only for a round above 1 GiB; as a commit task
   without a warm driver runs a round), on a table topic of its own;
c) ``sink``, the Apache Iceberg Kafka Connect sink (``iceberg-kafka-connect`` 1.10.1, the
   Iceberg of the pinned Spark runtime) in a standalone Kafka Connect 4.1.1 worker,
   ``iceberg.control.commit.interval-ms`` = the interval, ``tasks.max`` = ``--sink-tasks`` (1 by
   default: one consumer and writer thread, as the rounds' in-driver task). Maven Central has no Confluent Avro
   converter (io.confluent lives on packages.confluent.io), so this side reads the same records
   as schemaless JSON (Kafka Connect's JsonConverter) from a topic of its own: its decode cost
   is JSON's, and its values are ~1.4x the Avro bytes;
d) ``streaming``, a Spark Structured Streaming query (``spark-sql-kafka-0-10`` source,
   ``from_avro`` of spark-avro after the 5-byte Confluent header, Iceberg sink, processing-time
   trigger = the interval) on a plain topic of the same Avro values.

After the producer stops, each side gets up to ``--drain-s`` to make every record visible
(bounded lag: the side kept up if it did). Recorded per side: records/s and MiB/s ingested (value
bytes of that side's topic), the CPU seconds of that side's processes (the JVMs and Python
processes it started, sampled from /proc; the broker's are listed apart), records and GiB per
CPU-second, files per commit, and freshness: for each row, the commit time of the Iceberg
snapshot that added it minus its produce time (p50/p99/max). A long-lived process (the warm
driver, the Connect worker, the streaming query) is measured from when it is ready (its
start-up CPU is printed apart, not counted: it is paid once per deployment); a round of
``rounds`` counts whole, its JVM start included, since every round pays it.

The last line prints the ratios: each Icefall side that ran (warm driver, under Airflow, a JVM
per round) / sink records per CPU-second, and each side's p99 freshness.
``--quick``: 1,000 records/s for 8 s per side, 4 s interval, the sides warm, sink and streaming
(the JVM-per-round and Airflow sides only with ``--sides``): the three JVM starts dominate,
about a minute on two idle cores, a few on busy ones (3.7 minutes at load average 14). The
``airflow`` side alone takes about 4 minutes at load 15 (Airflow's start and migration).

    .venv/bin/python bench/vs_connect.py            # 10,000 records/s for 90 s per side, 20 s interval
    .venv/bin/python bench/vs_connect.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import secrets
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    MIB,
    REPO,
    BrokerProcess,
    CpuByProcess,
    cmdline,
    leave_no_processes,
    machine,
    pid_cpu_seconds,
    stop_processes,
)
from bench.commit_round import (
    POOL,
    SCHEMA,
    _tails,
    _zigzag_varint,
    create_table_topic,
    register_schema,
    round_command,
    round_env,
    warm_bytecode,
)
from broker import names
from spark_jobs.jars import iceberg_jars
from spark_jobs.warm_driver import (
    HEALTH_PATH,
    PRESTAGE_PATH,
    ROUNDS_PATH,
    TOKEN_ENV,
    WarmRoundReply,
)
from tests.support import free_port

GIB = 1024 * MIB
SHARE = Path(sys.prefix) / "share" / "icefall"
# where `make bench-vs-connect` copies the jars of bench/jvm (ICEFALL_BENCH_JARS: elsewhere)
BENCH_JARS = Path(os.environ.get("ICEFALL_BENCH_JARS", SHARE / "bench-jars"))
CONNECT_JARS = BENCH_JARS / "connect"
SPARK_AVRO_JARS = BENCH_JARS / "spark-avro"
SPARK_KAFKA_JARS = SHARE / "test-jars" / "spark-kafka"
NAMESPACE = "vs"


@dataclass
class Side:
    """One side's figures."""

    name: str
    records: int
    visible: int
    caught_up_s: float | None  # after the producer stopped; None: not within --drain-s
    records_s: float
    mib_s: float
    cpu_s: float
    startup_cpu_s: float  # of a long-lived process, before it was ready: not in cpu_s
    broker_cpu_s: float
    records_per_cpu_s: float
    cpu_s_per_gib: float
    commits: int
    files_per_commit: float
    p50_s: float
    p99_s: float
    max_s: float
    # per kind of process, from ready to the end of the drain (the side under Airflow)
    cpu_by_kind: dict[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------ the records


class Producer(threading.Thread):
    """``rate`` records/s for ``seconds``, in 20 ms steps; ``event_time`` = the produce time."""

    def __init__(
        self, bootstrap: str, topic: str, encode: Callable[[int, int], tuple[bytes, bytes]]
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.encode = bootstrap, topic, encode
        self.sent = self.value_bytes = 0
        self.produced_ms: list[int] = []
        self.failures: list[object] = []
        self.rate = 0.0
        self.seconds = 0.0

    def run(self) -> None:
        from confluent_kafka import Producer as KafkaProducer

        def delivered(err: object, msg: object) -> None:
            if err is not None:
                self.failures.append(err)

        producer = KafkaProducer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "lz4",
                "on_delivery": delivered,
            }
        )
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < self.seconds:
            due = int(elapsed * self.rate) + 1
            now_ms = int(time.time() * 1000)
            while self.sent < due:
                value, key = self.encode(self.sent, now_ms)
                producer.produce(self.topic, value, key)
                self.produced_ms.append(now_ms)
                self.value_bytes += len(value)
                self.sent += 1
            producer.poll(0)
            time.sleep(0.02)
        assert producer.flush(60) == 0, "producer did not drain"
        assert not self.failures, self.failures[:3]


def avro_encoder(schema_id: int) -> Callable[[int, int], tuple[bytes, bytes]]:
    tails, keys = _tails(POOL)
    header = b"\x00" + struct.pack(">I", schema_id)

    def encode(i: int, now_ms: int) -> tuple[bytes, bytes]:
        return header + _zigzag_varint(i) + _zigzag_varint(now_ms) + tails[i % POOL], keys[i % POOL]

    return encode


def json_encoder() -> Callable[[int, int], tuple[bytes, bytes]]:
    """The same records as schemaless JSON (what Kafka Connect's JsonConverter reads)."""
    from fastavro import parse_schema, schemaless_reader

    tails, keys = _tails(POOL)
    tail_schema = parse_schema({**SCHEMA, "name": "Tail", "fields": SCHEMA["fields"][2:]})
    rows: list[dict[str, Any]] = [
        cast(
            dict[str, Any],
            schemaless_reader(io.BytesIO(t), tail_schema, tail_schema, return_record_name=False),
        )
        for t in tails
    ]
    for row in rows:  # timestamp-millis as epoch millis, as the Avro holds them
        row["received_at"] = int(row["received_at"].timestamp() * 1000)
    suffixes = [json.dumps(r)[1:].encode() for r in rows]

    def encode(i: int, now_ms: int) -> tuple[bytes, bytes]:
        return b'{"id": %d, "event_time": %d, ' % (i, now_ms) + suffixes[i % POOL], keys[i % POOL]

    return encode


def iceberg_schema() -> Any:
    """The 16 fields as an Iceberg schema (all optional: Spark's from_avro columns are nullable)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BooleanType,
        DoubleType,
        IntegerType,
        LongType,
        NestedField,
        StringType,
        TimestamptzType,
    )

    def iceberg_type(avro: Any) -> Any:
        if isinstance(avro, list):
            return iceberg_type(next(t for t in avro if t != "null"))
        if isinstance(avro, dict):
            return TimestamptzType()
        return {
            "long": LongType(),
            "int": IntegerType(),
            "string": StringType(),
            "double": DoubleType(),
            "boolean": BooleanType(),
        }[avro]

    return Schema(
        *(
            NestedField(i + 1, f["name"], iceberg_type(f["type"]), required=False)
            for i, f in enumerate(SCHEMA["fields"])
        )
    )


# ------------------------------------------------------------------ reading the tables back


def committed(catalog: Any, identifier: tuple[str, str]) -> int:
    """Rows in the table's current snapshot (0 before the first commit)."""
    try:
        snapshot = catalog.load_table(identifier).current_snapshot()
    except Exception:  # noqa: BLE001 - not created before the first commit
        return 0
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.additional_properties.get("total-records", 0))


def freshness(catalog: Any, identifier: tuple[str, str]) -> tuple[dict[int, float], int, int]:
    """Each row's id -> commit time (ms) of the snapshot that added it; commits; data files."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = catalog.load_table(identifier)
    if table.current_snapshot() is None:
        return {}, 0, 0
    commit_ms = {s.snapshot_id: s.timestamp_ms for s in table.snapshots()}
    entries = table.inspect.entries().to_pylist()
    seen: dict[int, float] = {}
    adding: set[int] = set()
    for entry in entries:
        path = entry["data_file"]["file_path"]
        adding.add(entry["snapshot_id"])
        with table.io.new_input(path).open() as f:
            ids = pc.cast(pq.read_table(f, columns=["id"]).column("id"), "int64").to_pylist()
        at = commit_ms[entry["snapshot_id"]]
        for i in ids:
            seen[i] = min(at, seen.get(i, at))
    return seen, len(adding), len(entries)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# ------------------------------------------------------------------ the sides


@contextlib.contextmanager
def process(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[Any]:
    """A side's long-lived process, its CPU sampled; stopped (tree and all) on the way out."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    cpu = CpuByProcess(lambda cmdline: "side")
    cpu.start(proc.pid)
    try:
        yield proc, cpu
    finally:
        stop_processes({proc.pid}, timeout=20)
        cpu.stop()


def connect_side(
    broker: BrokerProcess, topic: str, interval_s: float, folder: Path, tasks: int = 1
) -> contextlib.AbstractContextManager[Any]:
    worker = folder / "worker.properties"
    worker.write_text(
        "\n".join(
            [
                f"bootstrap.servers={broker.bootstrap}",
                "key.converter=org.apache.kafka.connect.storage.StringConverter",
                "value.converter=org.apache.kafka.connect.json.JsonConverter",
                "value.converter.schemas.enable=false",
                f"offset.storage.file.filename={folder / 'offsets'}",
                f"listeners=http://127.0.0.1:{(rest := free_port())}",
                "plugin.discovery=only_scan",
                # the worker polls at most this long for records before it calls the sink's put(),
                # which is where the sink reads its control topic: with the default (60 s) an idle
                # source topic would hold a commit's START_COMMIT for up to a minute
                "offset.flush.interval.ms=1000",
            ]
        )
        + "\n"
    )
    sink = folder / "sink.properties"
    sink.write_text(
        "\n".join(
            [
                "name=iceberg-sink",
                "connector.class=org.apache.iceberg.connect.IcebergSinkConnector",
                f"tasks.max={tasks}",
                f"topics={topic}",
                f"iceberg.tables={NAMESPACE}.sink",
                "iceberg.catalog.type=rest",
                f"iceberg.catalog.uri={broker.catalog_url}",
                f"iceberg.control.commit.interval-ms={int(interval_s * 1000)}",
                "iceberg.control.topic=control-iceberg",
                "consumer.override.auto.offset.reset=earliest",
            ]
        )
        + "\n"
    )
    cmd = [
        "java",
        "-Xmx1g",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
        "-Dorg.slf4j.simpleLogger.showDateTime=true",
        "-cp",
        f"{CONNECT_JARS}/*",
        "org.apache.kafka.connect.cli.ConnectStandalone",
        str(worker),
        str(sink),
    ]
    folder.joinpath("rest-port").write_text(str(rest))
    return process(cmd, folder / "connect.log")


def connect_status(folder: Path) -> dict[str, Any]:
    port = folder.joinpath("rest-port").read_text()
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/connectors/iceberg-sink/status", timeout=5
        ) as r:
            return dict(json.load(r))
    except (OSError, ValueError):
        return {}


def connect_running(folder: Path) -> bool:
    """The sink's task runs and its consumer has its partitions."""
    tasks = connect_status(folder).get("tasks", [])
    log = (folder / "connect.log").read_bytes()
    return (
        bool(tasks)
        and tasks[0].get("state") == "RUNNING"
        and b"Adding newly assigned partitions" in log
    )


def connect_failure(folder: Path) -> str | None:
    """The connector's or its task's trace when Kafka Connect reports it FAILED."""
    status = connect_status(folder)
    for part in [status.get("connector", {}), *status.get("tasks", [])]:
        if part.get("state") == "FAILED":
            return str(part.get("trace", part))
    return None


STREAMING = textwrap.dedent(
    """
    import os, sys, time
    from pyspark.sql import SparkSession
    from pyspark.sql.avro.functions import from_avro

    bootstrap, topic, table, catalog, checkpoint, jars, interval, schema, stop = sys.argv[1:10]
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", jars)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.catalog.bench", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.bench.type", "rest")
        .config("spark.sql.catalog.bench.uri", catalog)
        .getOrCreate()
    )
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    rows = source.select(from_avro(source.value.substr(6, 1 << 30), schema).alias("v")).select("v.*")
    query = (
        rows.writeStream.format("iceberg")
        .outputMode("append")
        .trigger(processingTime=f"{interval} seconds")
        .option("checkpointLocation", checkpoint)
        .toTable(f"bench.{table}")
    )
    print("vs-connect: query started", flush=True)
    while not os.path.exists(stop):
        if query.exception() is not None:
            raise query.exception()
        time.sleep(0.2)
    query.stop()
    spark.stop()
    """
)


def streaming_side(
    broker: BrokerProcess, topic: str, interval_s: float, folder: Path
) -> contextlib.AbstractContextManager[Any]:
    jars = ",".join(
        [
            *iceberg_jars(),
            *map(str, sorted(SPARK_KAFKA_JARS.glob("*.jar"))),
            *map(str, sorted(SPARK_AVRO_JARS.glob("*.jar"))),
        ]
    )
    cmd = [
        sys.executable,
        "-c",
        STREAMING,
        broker.bootstrap,
        topic,
        f"{NAMESPACE}.streaming",
        broker.catalog_url,
        str(folder / "checkpoint"),
        jars,
        f"{interval_s:g}",
        json.dumps(SCHEMA),
        str(folder / "stop"),
    ]
    return process(cmd, folder / "streaming.log", env=round_env())


class Rounds(threading.Thread):
    """A commit round every ``interval_s`` (or right after the last one, when a round takes
    longer), until stopped. Each round is ``one_round()`` (None: it committed or found nothing
    new; else the error): a new JVM (``spawned_round``) or a request to the warm driver
    (``warm_round``)."""

    def __init__(self, interval_s: float, one_round: Callable[[int], str | None]) -> None:
        super().__init__(daemon=True)
        self.interval_s, self.one_round = interval_s, one_round
        self.stop = threading.Event()
        self.rounds = 0
        self.error: str | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.error = self.one_round(self.rounds)
            self.rounds += 1
            if self.error is not None:
                return
            self.stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def finish(self) -> None:
        self.stop.set()
        self.join()


class SpawnedRounds:
    """Rounds as a scheduled round without a warm driver runs them: ``spark_jobs.commit_round``
    in a new Python process each time (Spark, and its JVM, only for a round above 1 GiB); the
    CPU of every round's processes summed."""

    def __init__(self, broker: BrokerProcess, topic: str, folder: Path) -> None:
        self.broker, self.topic, self.folder = broker, topic, folder
        self.cpu_s = 0.0

    def __call__(self, n: int) -> str | None:
        result = self.folder / f"round-{n}.json"
        log = self.folder / f"round-{n}.log"
        cmd = round_command(self.broker, self.topic, result, 2)
        cpu = CpuByProcess(lambda cmdline: "round")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=REPO, env=round_env(), stdout=out, stderr=subprocess.STDOUT
            )
            cpu.start(proc.pid)
            code = proc.wait(3600)
        stop_processes({proc.pid}, timeout=5)
        self.cpu_s += sum(cpu.stop().values())
        return None if code == 0 else log.read_text(errors="replace")[-3000:]


def warm_driver_side(folder: Path) -> contextlib.AbstractContextManager[Any]:
    """``spark_jobs.warm_driver`` as ``icefall up`` runs it (``broker.supervisor.warm_driver``:
    its own process group, a bearer token in its environment), ``local[2]`` as the spawned
    rounds; yields (process, CPU sampler of its tree: the Python driver, its JVM and Spark's
    Python workers)."""
    port = free_port()
    token = secrets.token_urlsafe(32)
    folder.joinpath("driver").write_text(json.dumps({"port": port, "token": token}))
    cmd = [
        sys.executable,
        "-m",
        "spark_jobs.warm_driver",
        "--port",
        str(port),
        "--master",
        "local[2]",
    ]
    return process(cmd, folder / "warm-driver.log", env={**round_env(), TOKEN_ENV: token})


def _warm_call(folder: Path, path: str, body: dict[str, Any] | None, timeout: float) -> Any:
    driver = json.loads(folder.joinpath("driver").read_text())
    request = urllib.request.Request(
        f"http://127.0.0.1:{driver['port']}{path}",
        method="GET" if body is None else "POST",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {driver['token']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def warm_healthy(folder: Path) -> bool:
    try:
        return bool(_warm_call(folder, HEALTH_PATH, None, 2)["status"] == "ok")
    except (OSError, ValueError, KeyError):
        return False


# ``icefall_airflow.timetable.DEFAULT_LEAD``: commit runs are created 4 s before their
# interval's end (capped at half the interval)
RUN_LEAD_S = 4.0


class WarmRounds:
    """Rounds as ``icefall up``'s commit task runs them: the round's arguments (those the task
    gives spark-submit, without ``--result``) posted to the warm driver; and, as the task does
    when its run starts ``RUN_LEAD_S`` before the interval's end, a pre-stage of the next
    round posted then (``spark_jobs.prestage``: the driver writes the rows flushed so far)."""

    def __init__(self, broker: BrokerProcess, topic: str, folder: Path, interval_s: float) -> None:
        self.base = ["--admin-url", broker.admin_url, "--topic", topic]
        self.folder = folder
        self.interval_s = interval_s
        self.seconds: list[float] = []
        self._prestage: threading.Timer | None = None

    def __call__(self, n: int) -> str | None:
        t0, wall0 = time.monotonic(), time.time()
        try:
            reply = WarmRoundReply.model_validate(
                _warm_call(
                    self.folder, ROUNDS_PATH, {"args": [*self.base, "--until-now"], "env": {}}, 3600
                )
            )
        except (OSError, ValueError) as exc:
            return f"round {n}: {type(exc).__name__}: {exc}"
        self.seconds.append(time.monotonic() - t0)
        self.folder.joinpath(f"round-{n}.json").write_text(json.dumps(reply.result))
        next_end = wall0 + self.interval_s  # ``Rounds`` starts the next round then
        lead_s = min(RUN_LEAD_S, self.interval_s / 2)
        self._prestage = threading.Timer(
            max(0.0, next_end - lead_s - time.time()), self._post_prestage, (int(next_end * 1000),)
        )
        self._prestage.daemon = True
        self._prestage.start()
        return None if reply.exit_code == 0 else json.dumps(reply.result)[-3000:]

    def _post_prestage(self, until_ms: int) -> None:
        args = [*self.base, "--until-append-time", str(until_ms)]
        with contextlib.suppress(OSError, ValueError):  # the round reads it all itself
            _warm_call(self.folder, PRESTAGE_PATH, {"args": args, "env": {}}, 10)

    def cancel(self) -> None:
        if self._prestage is not None:
            self._prestage.cancel()


# ------------------------------------------------------------------ one side's run


# A side's start at load 15 on two cores: the JVM's start (35-40 s), and for the warm driver its
# warm-up (Python workers on every core) before it answers.
READY_S = 240.0


def measure_side(
    name: str,
    catalog: Any,
    broker_cpu_s: Callable[[], float],
    producer: Producer,
    identifier: tuple[str, str],
    args: argparse.Namespace,
    cpu_s: Callable[[], float],
    failed: Callable[[], str | None],
    finish: Callable[[], None] = lambda: None,
    ready: Callable[[], bool] = lambda: True,
    start: Callable[[], None] = lambda: None,
) -> Side:
    """Once the side is ``ready`` (a long-lived JVM started and subscribed: its start-up is not
    counted), produce for ``--seconds``, wait until every record is visible (or ``--drain-s``),
    then read the figures back from the table. ``broker_cpu_s``: the broker's CPU so far
    (listed apart, in no side's figure)."""
    deadline = time.monotonic() + READY_S
    while not ready():
        if (error := failed()) is not None:
            raise RuntimeError(f"{name} failed:\n{error}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} not ready within {READY_S:g} s")
        time.sleep(0.5)
    cpu0 = cpu_s()
    broker0 = broker_cpu_s()
    producer.rate, producer.seconds = args.rate, args.seconds
    producer.start()
    start()
    producer.join()
    stopped = time.monotonic()
    caught_up: float | None = None
    deadline = stopped + args.drain_s
    while time.monotonic() < deadline:
        if (error := failed()) is not None:
            raise RuntimeError(f"{name} failed:\n{error}")
        if committed(catalog, identifier) >= producer.sent:
            caught_up = time.monotonic() - stopped
            break
        time.sleep(0.5)
    finish()
    spent = cpu_s() - cpu0
    broker_cpu = broker_cpu_s() - broker0
    seen, commits, files = freshness(catalog, identifier)
    lag = [(seen[i] - ms) / 1000 for i, ms in enumerate(producer.produced_ms) if i in seen]
    wall = args.seconds + (caught_up if caught_up is not None else args.drain_s)
    gib = producer.value_bytes / GIB * len(lag) / max(1, producer.sent)
    print(
        f"[{name}] {len(seen)}/{producer.sent} visible, {commits} commits, CPU {spent:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return Side(
        name=name,
        records=producer.sent,
        visible=len(lag),
        caught_up_s=None if caught_up is None else round(caught_up, 1),
        records_s=round(len(lag) / wall),
        mib_s=round(producer.value_bytes / MIB / wall, 2),
        cpu_s=round(spent, 1),
        startup_cpu_s=round(cpu0, 1),
        broker_cpu_s=round(broker_cpu, 1),
        records_per_cpu_s=round(len(lag) / spent) if spent else 0,
        cpu_s_per_gib=round(spent / gib, 1) if gib else 0.0,
        commits=commits,
        files_per_commit=round(files / commits, 1) if commits else 0.0,
        p50_s=round(percentile(lag, 0.5), 2) if lag else -1,
        p99_s=round(percentile(lag, 0.99), 2) if lag else -1,
        max_s=round(max(lag), 2) if lag else -1,
    )


def load_catalog(broker: BrokerProcess | str) -> Any:
    """The REST catalog of ``broker`` (or at that URL)."""
    from pyiceberg.catalog import load_catalog as _load

    uri = broker if isinstance(broker, str) else broker.catalog_url
    return _load("bench", type="rest", uri=uri)


# ------------------------------------------------------------------ the side under Airflow

AIRFLOW_SIDE = "Icefall under Airflow (icefall up)"
AIRFLOW_TOPIC = "airflow"
# The kinds of process (bench/sustained.py's ``_classify``) not in the side's figure: the broker,
# as on every side, and ``icefall up``'s own process (its supervision loop beside the demo
# producer, one process: not separable). Everything else under ``icefall up`` counts: Airflow's
# api-server, scheduler (its LocalExecutor workers and their task processes), dag-processor,
# triggerer and their helpers, and the warm driver's tree (Python, JVM, Spark's Python workers).
NOT_COUNTED = ("broker", "icefall up (demo producer)")


AIRFLOW_PARTS = (  # (in the command line or process title, kind), the first that matches
    ("icefall_airflow.sync", "Airflow: icefall sync"),
    ("airflow worker", "Airflow: LocalExecutor workers and tasks"),  # the task process too
    ("airflow supervisor", "Airflow: LocalExecutor workers and tasks"),
    ("api_server", "Airflow: api-server"),
    ("api-server", "Airflow: api-server"),
    ("dag-processor", "Airflow: dag-processor"),
    ("dag_processor", "Airflow: dag-processor"),
    ("scheduler", "Airflow: scheduler"),
    ("triggerer", "Airflow: triggerer"),
)


def classify(cmdline: str) -> str:
    """bench/sustained.py's kinds, ``icefall up`` first (its ``--home`` may name a folder
    ``airflow``), the warm driver's Python workers (they fork from ``spark_jobs.worker_daemon``,
    not pyspark's daemon), and Airflow split by component."""
    from bench.sustained import _classify

    if "broker.cli up" in cmdline:
        return "icefall up (demo producer)"
    if "spark_jobs.worker_daemon" in cmdline:
        return "Spark Python workers"
    kind = _classify(cmdline)
    if kind == "Airflow":
        return next((k for part, k in AIRFLOW_PARTS if part in cmdline), "Airflow: other")
    return kind


def create_airflow_topic(bootstrap: str, args: argparse.Namespace) -> None:
    """The side's table topic: ``args.partitions``, a commit interval of ``args.interval_s``."""
    from confluent_kafka.admin import AdminClient, NewTopic

    config = {
        "automq.table.topic.enable": "true",
        "automq.table.topic.commit.interval.ms": str(int(args.interval_s * 1000)),
        "max.message.bytes": str(2 * MIB),
    }
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(AIRFLOW_TOPIC, args.partitions, 1, config=config)
    for future in admin.create_topics([topic]).values():
        future.result(15)


class KindCpu:
    """The CPU seconds of ``icefall up``'s tree per kind of process; calling it samples them and
    returns the counted sum (the side's figure), keeping each call's per-kind sums, so the first
    and last call of ``measure_side`` (ready, end of the drain) give the breakdown."""

    def __init__(self, cpu: CpuByProcess) -> None:
        self.cpu = cpu
        self.calls: list[dict[str, float]] = []

    def by_kind(self) -> dict[str, float]:
        return self.cpu.by_kind()

    def __call__(self) -> float:
        kinds = self.by_kind()
        self.calls.append(kinds)
        return sum(v for k, v in kinds.items() if k not in NOT_COUNTED)

    def broker(self) -> float:
        return self.by_kind().get("broker", 0.0)

    def breakdown(self) -> dict[str, float]:
        """Per kind, from the first call to the last (counted and not)."""
        first, last = self.calls[0], self.calls[-1]
        spent = {k: round(v - first.get(k, 0.0), 1) for k, v in last.items()}
        return dict(sorted(((k, v) for k, v in spent.items() if v), key=lambda kv: -kv[1]))


def _airflow_row(home: Path, query: str, arg: str) -> tuple[Any, ...] | None:
    """The first row of ``query`` in the Airflow metadata database (SQLite under ``icefall
    up``), read-only; None when there is none or the database cannot be read yet."""
    import sqlite3

    db = home / "airflow" / "airflow.db"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as c:
            row: tuple[Any, ...] | None = c.execute(query, (arg,)).fetchone()
    except sqlite3.Error:
        return None
    return row


def dag_unpaused(home: Path, dag_id: str) -> bool:
    """Airflow's metadata database has the DAG, not paused: the DAG processor parsed it, so the
    scheduler runs its rounds from now on."""
    row = _airflow_row(home, "SELECT is_paused FROM dag WHERE dag_id = ?", dag_id)
    return row is not None and not row[0]


def pool_exists(home: Path, pool: str) -> bool:
    """The table's pool is in Airflow's database (``icefall_airflow.sync`` creates it; Airflow
    schedules no task of a pool that does not exist)."""
    return _airflow_row(home, "SELECT 1 FROM slot_pool WHERE pool = ?", pool) is not None


def syncing(home: Path) -> bool:
    """``icefall up`` still runs ``icefall_airflow.sync`` (the pool, pauses and parse requests
    that a table topic's creation sets off, once per change of the table topics): the side's
    set-up, like the sink's connector start, not part of its running cost."""
    return any("icefall_airflow.sync" in (cmdline(pid) or "") for pid in processes_of(home))


def processes_of(home: Path) -> set[int]:
    """The live processes of the ``icefall up`` run at ``home``: every one it starts (broker,
    Airflow, warm driver, and what they start) carries ``ICEFALL_HOME`` in its environment."""
    mark = f"\0ICEFALL_HOME={home.resolve()}\0".encode()
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if mark in b"\0" + (entry / "environ").read_bytes() + b"\0":
                    out.add(int(entry.name))
            except OSError:
                continue
    return out


@contextlib.contextmanager
def warm_master(master: str) -> Iterator[None]:
    """``ICEFALL_WARM_DRIVER_MASTER`` for the ``icefall up`` started in the block (its
    environment is this process's): the same ``local[2]`` as the other sides' Spark."""
    before = os.environ.get("ICEFALL_WARM_DRIVER_MASTER")
    os.environ["ICEFALL_WARM_DRIVER_MASTER"] = master
    try:
        yield
    finally:
        if before is None:
            del os.environ["ICEFALL_WARM_DRIVER_MASTER"]
        else:
            os.environ["ICEFALL_WARM_DRIVER_MASTER"] = before


def airflow_side(args: argparse.Namespace, folder: Path) -> Side:
    """``icefall up`` as deployed (bench/sustained.py's ``icefall_up``: a temporary home, free
    ports, the demo producer at 1 record/s on its own topic, Airflow 3 with the LocalExecutor,
    the warm round driver), a table topic whose commit DAG (one task: plan, round, publish) runs a
    round per interval; measured like the other sides once the DAG is in Airflow, unpaused,
    with its pool, and the topic's ``icefall_airflow.sync`` has ended."""
    from bench.sustained import icefall_up  # here: sustained imports this module

    print(f"[{AIRFLOW_SIDE}]", file=sys.stderr, flush=True)
    folder.mkdir()
    home = folder / "home"
    try:
        with (
            warm_master("local[2]"),
            icefall_up(home, warm=True) as (proc, bootstrap, registry, catalog_url),
        ):
            cpu = CpuByProcess(classify, interval=0.1)  # task processes live a few seconds
            cpu.start(proc.pid)
            kinds = KindCpu(cpu)
            try:
                create_airflow_topic(bootstrap, args)
                schema_id = register_schema(registry, f"{AIRFLOW_TOPIC}-value")
                dag_id = names.commit_dag_id(AIRFLOW_TOPIC)
                side = measure_side(
                    AIRFLOW_SIDE,
                    load_catalog(catalog_url),
                    kinds.broker,
                    Producer(bootstrap, AIRFLOW_TOPIC, avro_encoder(schema_id)),
                    ("default", AIRFLOW_TOPIC),
                    args,
                    kinds,
                    lambda: (
                        None
                        if proc.poll() is None
                        else f"icefall up exited {proc.returncode}; see {home}.out"
                    ),
                    ready=lambda: (
                        dag_unpaused(home, dag_id)
                        and pool_exists(home, names.pool_name(AIRFLOW_TOPIC))
                        and not syncing(home)
                    ),
                )
                side.cpu_by_kind = kinds.breakdown()
                print(f"[{AIRFLOW_SIDE}] CPU s by kind: {side.cpu_by_kind}", file=sys.stderr)
                return side
            finally:
                cpu.stop()
    finally:
        # icefall up stopped what it started on SIGINT (or was killed after 90 s); whatever of
        # its run still lives (an orphaned JVM) goes now
        stop_processes(processes_of(home), timeout=10)


def run(args: argparse.Namespace, folder: Path) -> list[Side]:
    """The sides of ``args.sides``: those on the shared broker, then ``airflow`` (its own
    ``icefall up``, after the shared broker stopped: one stack at a time on the cores)."""
    sides = run_shared(args, folder) if set(args.sides) - {"airflow"} else []
    if "airflow" in args.sides:
        sides.append(airflow_side(args, folder / "icefall-up"))
    return sides


def run_shared(args: argparse.Namespace, folder: Path) -> list[Side]:
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = BrokerProcess(folder / "home").start()
    assert broker.proc is not None
    broker_pid = broker.proc.pid

    def broker_cpu() -> float:
        return pid_cpu_seconds(broker_pid)

    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        plain = [NewTopic(t, args.partitions, 1) for t in ("sink-json", "streaming-avro")]
        plain.append(NewTopic("control-iceberg", 1, 1))
        for future in admin.create_topics(plain).values():
            future.result(15)
        create_table_topic(broker.bootstrap, "rounds", args.partitions)
        create_table_topic(broker.bootstrap, "warm", args.partitions)
        schema_id = register_schema(broker.registry_url, "rounds-value")
        warm_schema_id = register_schema(broker.registry_url, "warm-value")
        catalog = load_catalog(broker)
        catalog.create_namespace_if_not_exists(NAMESPACE)
        for table in ("sink", "streaming"):
            catalog.create_table((NAMESPACE, table), iceberg_schema())
        sides: list[Side] = []
        if {"warm", "rounds"} & set(args.sides):
            warm_bytecode()
        if "warm" in args.sides:
            print("[Icefall rounds, warm driver]", file=sys.stderr, flush=True)
            here = folder / "warm"
            here.mkdir()
            with warm_driver_side(here) as (proc, cpu):
                warm_rounds = WarmRounds(broker, "warm", here, args.interval_s)
                warm = Rounds(args.interval_s, warm_rounds)
                try:
                    sides.append(
                        measure_side(
                            "Icefall rounds, warm driver",
                            catalog,
                            broker_cpu,
                            Producer(broker.bootstrap, "warm", avro_encoder(warm_schema_id)),
                            ("default", "warm"),
                            args,
                            lambda: _cpu_now(cpu),
                            lambda: warm.error or _exited(proc, here / "warm-driver.log"),
                            finish=warm.finish,  # a round under way counts whole
                            ready=lambda: warm_healthy(here),
                            start=warm.start,  # rounds from the first record on, as the spawned
                        )
                    )
                finally:
                    warm_rounds.cancel()
                    if warm.is_alive():
                        warm.finish()
        if "rounds" in args.sides:
            print("[Icefall rounds, a JVM per round]", file=sys.stderr, flush=True)
            (folder / "rounds").mkdir()
            spawned = SpawnedRounds(broker, "rounds", folder / "rounds")
            rounds = Rounds(args.interval_s, spawned)
            rounds.start()
            try:
                sides.append(
                    measure_side(
                        "Icefall rounds, a JVM per round",
                        catalog,
                        broker_cpu,
                        Producer(broker.bootstrap, "rounds", avro_encoder(schema_id)),
                        ("default", "rounds"),
                        args,
                        lambda: spawned.cpu_s,
                        lambda: rounds.error,
                        finish=rounds.finish,  # a round under way counts whole
                    )
                )
            finally:
                rounds.finish()
        if "sink" in args.sides:
            print("[Iceberg Kafka Connect sink]", file=sys.stderr, flush=True)
            where = folder / "connect"
            where.mkdir()
            with connect_side(broker, "sink-json", args.interval_s, where, args.sink_tasks) as (
                _,
                cpu,
            ):
                sides.append(
                    measure_side(
                        "Iceberg Kafka Connect sink (JSON)",
                        catalog,
                        broker_cpu,
                        Producer(broker.bootstrap, "sink-json", json_encoder()),
                        (NAMESPACE, "sink"),
                        args,
                        lambda: _cpu_now(cpu),
                        lambda: connect_failure(where),
                        ready=lambda: connect_running(where),
                    )
                )
        if "streaming" in args.sides:
            print("[Spark Structured Streaming]", file=sys.stderr, flush=True)
            there = folder / "streaming"
            there.mkdir()
            with streaming_side(broker, "streaming-avro", args.interval_s, there) as (proc, cpu):
                sides.append(
                    measure_side(
                        "Spark Structured Streaming",
                        catalog,
                        broker_cpu,
                        Producer(broker.bootstrap, "streaming-avro", avro_encoder(schema_id)),
                        (NAMESPACE, "streaming"),
                        args,
                        lambda: _cpu_now(cpu),
                        lambda: _exited(proc, there / "streaming.log"),
                        ready=lambda: (
                            b"vs-connect: query started" in (there / "streaming.log").read_bytes()
                        ),
                    )
                )
                (there / "stop").touch()
        return sides
    finally:
        broker.stop()


def _cpu_now(cpu: CpuByProcess) -> float:
    return sum(cpu.by_kind().values())


def _exited(proc: subprocess.Popen[bytes], log: Path) -> str | None:
    if proc.poll() is None:
        return None
    return f"exit code {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}"


def markdown(sides: list[Side]) -> str:
    head = (
        "| side | records/s | MiB/s | caught up after stop (s) | CPU s | start-up CPU s (not in "
        "CPU s) | records per CPU-s | CPU s/GiB | commits | files/commit | "
        "freshness p50 / p99 / max (s) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [
        f"| {s.name} | {s.records_s} | {s.mib_s} | {s.caught_up_s} | {s.cpu_s} | "
        f"{s.startup_cpu_s} | {s.records_per_cpu_s} | {s.cpu_s_per_gib} | {s.commits} | "
        f"{s.files_per_commit} | {s.p50_s} / {s.p99_s} / {s.max_s} |"
        for s in sides
    ]
    return "\n".join([head, *rows])


def ratio_line(sides: list[Side]) -> str | None:
    """Icefall's sides (warm driver, under Airflow, a JVM per round: those that ran) against the
    sink in records per CPU-second, and every side's p99 freshness; None without the sink and
    an Icefall side."""
    by = {s.name: s for s in sides}
    sink = by.get("Iceberg Kafka Connect sink (JSON)")
    icefall = [
        (short, by[name])
        for short, name in (
            ("warm driver", "Icefall rounds, warm driver"),
            ("under Airflow", AIRFLOW_SIDE),
            ("a JVM per round", "Icefall rounds, a JVM per round"),
        )
        if name in by
    ]
    if sink is None or not icefall:
        return None
    per_cpu = ", ".join(
        f"{short} {side.records_per_cpu_s / max(1, sink.records_per_cpu_s):.2f}"
        for short, side in icefall
    )
    p99 = ", ".join(f"Icefall {short} {side.p99_s}" for short, side in icefall)
    p99 += f", sink {sink.p99_s}"
    if (streaming := by.get("Spark Structured Streaming")) is not None:
        p99 += f", streaming {streaming.p99_s}"
    return f"ratio Icefall / Connect sink records per CPU-s: {per_cpu}; p99 freshness s: {p99}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=10_000, help="records per second")
    parser.add_argument("--seconds", type=float, default=90, help="produce time per side")
    parser.add_argument("--interval-s", type=float, default=20, help="the commit interval")
    parser.add_argument("--drain-s", type=float, default=None, help="default: 3 intervals + 30 s")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="small and short: about a minute")
    parser.add_argument(
        "--sides",
        default=None,
        help="which sides run, comma-separated, of warm,airflow,rounds,sink,streaming (default: "
        "all five; --quick: warm,sink,streaming); the ratios need the sink",
    )
    parser.add_argument(
        "--sink-tasks",
        type=int,
        default=1,
        help="the sink's tasks.max (each task consumes some of the partitions and writes its own "
        "files; more than one lets it use both cores at a rate one task cannot keep up with)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    if not 1 <= args.sink_tasks <= args.partitions:
        parser.error("--sink-tasks: from 1 to --partitions")
    if args.quick:
        args.rate, args.seconds, args.interval_s = 1000, 8, 4
        args.drain_s = 30.0 if args.drain_s is None else args.drain_s
    if args.drain_s is None:
        args.drain_s = 3 * args.interval_s + 30
    if args.sides is None:
        args.sides = "warm,sink,streaming" if args.quick else "warm,airflow,rounds,sink,streaming"
    args.sides = args.sides.split(",")
    if unknown := set(args.sides) - {"warm", "airflow", "rounds", "sink", "streaming"}:
        parser.error(f"unknown sides {sorted(unknown)}")
    for jars, needed_by in ((CONNECT_JARS, "sink"), (SPARK_AVRO_JARS, "streaming")):
        if needed_by in args.sides and not (jars / ".pinned").exists():
            sys.exit(f"no jars in {jars}: run `make bench-vs-connect`")
    folder = Path(tempfile.mkdtemp(prefix="vs-connect-"))
    try:
        # every process a side started is stopped on the way out, Ctrl-C and SIGTERM included
        with leave_no_processes():
            sides = run(args, folder)
    except KeyboardInterrupt as exc:
        sys.exit(f"interrupted ({exc or 'Ctrl-C'}): every process the benchmark started is stopped")
    finally:
        if args.keep:
            print(f"kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    print(
        json.dumps(
            {
                "date": str(date.today()),
                "machine": machine(),
                "loadavg": os.getloadavg(),
                "command": " ".join(["bench/vs_connect.py", *sys.argv[1:]]),
                "args": vars(args),
            }
        )
    )
    for side in sides:
        print(json.dumps(asdict(side)))
    print(markdown(sides))
    for side in sides:
        if side.cpu_by_kind:
            print(
                f"{side.name}, CPU s by kind of process from ready to the end of the drain "
                f"(counted: all but {' and '.join(NOT_COUNTED)}): "
                + ", ".join(f"{k} {v:g}" for k, v in side.cpu_by_kind.items())
            )
    if (line := ratio_line(sides)) is not None:
        print(line)


if __name__ == "__main__":
    main()
