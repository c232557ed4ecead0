"""Commit round throughput against a plain-consumer baseline measured in the same run (issue 4).

Workload: N MiB of ~500-byte Avro values with 16 fields (Confluent wire format,
schema registered with the broker's registry under ``<topic>-value``) in a
table topic (``automq.table.topic.enable=true``) with 4 partitions, produced
with confluent-kafka (lz4, 1 MiB batches, acks=all). Produce time is printed
but is no part of the figures.

Baseline: one Python process, the way one would write it without Icefall: a
confluent-kafka ``Consumer`` assigned to every partition from offset 0 up to
the end offsets, fastavro ``schemaless_reader`` per value (5-byte header
skipped), ``pyarrow.RecordBatch.from_pylist`` per 20,000 records, and ONE
pyiceberg ``Table.append`` of all the batches at the end (one commit, like the
round), into a table with exactly the round's schema (value fields flattened
plus ``_kafka_key``, ``_kafka_headers``, ``_kafka_metadata``) in the broker's
REST catalog (namespace ``baseline``).

Round: ``python -m spark_jobs.commit_round --admin-url URL --topic T
--until-now --result PATH`` in a subprocess (its own Spark, ``local[CORES]``),
wall time including Spark start-up, and the phases from its result JSON; then
the same command again with nothing new: the fixed cost of an empty round.

Figures: rows/s and MiB/s of record value bytes; "per core" = MiB/s divided by
the cores the round was given (``--cores``); "MiB per CPU-s" = MiB divided by
all CPU seconds spent (bench process, children, and the broker for the
baseline's fetches; for the round, the JVM, the Python driver and workers,
sampled from /proc because Spark never waits for its Python workers). CPU
figures hold up when other jobs share the machine; wall-clock ones do not.
Target (issue 4): round ≥ 25 MiB/s per core and ≥ 3× the baseline's MiB/s.

The round runs with Python bytecode caching on (``round_env``) and a Spark
event log; the report adds the write job's tasks (durations, rows, JVM CPU,
GC, Parquet bytes) and CPU per process kind, to show where the time goes.

    .venv/bin/python bench/commit_round.py [--mib 1024] [--cores 2]
        [--partitions 4] [--compression lz4] [--no-baseline] [--no-round]
        [--keep DIR] [--json PATH] [--profile]

``--keep DIR`` keeps the broker home, logs, round results and event logs;
``--profile`` runs the full round under ``py-spy record --subprocesses``
(collapsed stacks next to the round log; slows the round, not for figures).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import string
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    MIB,
    REPO,
    BrokerProcess,
    CpuByProcess,
    Measure,
    become_subreaper,
    measure,
    own_children,
    reap_orphans,
    run_info,
    stop_processes,
)

RECORD_BYTES = 500
POOL = 32_768  # distinct pre-encoded value tails; id and event_time are encoded per record
BASELINE_BATCH = 20_000

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "PageEvent",
    "namespace": "icefall.bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "user_id", "type": "long"},
        {"name": "session_id", "type": "string"},
        {"name": "event_type", "type": "string"},
        {"name": "page_url", "type": "string"},
        {"name": "referrer", "type": ["null", "string"], "default": None},
        {"name": "user_agent", "type": "string"},
        {"name": "country", "type": "string"},
        {"name": "device_id", "type": "int"},
        {"name": "quantity", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "discount", "type": ["null", "double"], "default": None},
        {"name": "is_mobile", "type": "boolean"},
        {"name": "received_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "payload", "type": "string"},
    ],
}
assert len(SCHEMA["fields"]) == 16

EVENT_TYPES = ["view", "click", "add_to_cart", "purchase", "search", "scroll", "login", "logout"]
COUNTRIES = ["US", "DE", "FR", "GB", "JP", "BR", "IN", "CA", "NL", "SE", "ES", "IT"]
USER_AGENTS = [
    f"Mozilla/5.0 ({os_}) AppleWebKit/537.36 (KHTML, like Gecko) {browser}/{v}.0.{v * 7}.{v % 13} Safari/537.36"
    for os_ in (
        "Windows NT 10.0; Win64; x64",
        "Macintosh; Intel Mac OS X 10_15_7",
        "X11; Linux x86_64",
        "Linux; Android 14; Pixel 8",
        "iPhone; CPU iPhone OS 17_4 like Mac OS X",
    )
    for browser in ("Chrome", "Firefox", "Edg")
    for v in (118, 119, 120, 121)
]


# ------------------------------------------------------------------ workload


def _zigzag_varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _tails(count: int, seed: int = 4) -> tuple[list[bytes], list[bytes]]:
    """``count`` Avro encodings of fields 3..16 (the record minus id and event_time), sized so a
    whole wire-format value is ~RECORD_BYTES, and a matching Kafka key (the user id) for each."""
    from fastavro import parse_schema, schemaless_writer

    rnd = random.Random(seed)
    tail_schema = parse_schema({**SCHEMA, "name": "Tail", "fields": SCHEMA["fields"][2:]})
    alphabet = string.ascii_letters + string.digits
    now_ms = int(time.time() * 1000)
    tails, keys = [], []
    for _ in range(count):
        user = rnd.randrange(1, 5_000_000)
        value = {
            "user_id": user,
            "session_id": "-".join(f"{rnd.getrandbits(4 * n):0{n}x}" for n in (8, 4, 4, 4, 12)),
            "event_type": rnd.choice(EVENT_TYPES),
            "page_url": "https://shop.example.com/"
            + "/".join(
                "".join(rnd.choices(string.ascii_lowercase, k=rnd.randrange(4, 12)))
                for _ in range(4)
            )
            + f"?item={rnd.randrange(100000)}&ref={rnd.randrange(1000)}",
            "referrer": None
            if rnd.random() < 0.3
            else "https://www.example.org/search?q="
            + "".join(rnd.choices(string.ascii_lowercase, k=rnd.randrange(8, 40))),
            "user_agent": rnd.choice(USER_AGENTS),
            "country": rnd.choice(COUNTRIES),
            "device_id": rnd.randrange(1, 2_000_000),
            "quantity": rnd.randrange(1, 10),
            "price": round(rnd.uniform(0.5, 500.0), 2),
            "discount": None if rnd.random() < 0.5 else round(rnd.random() * 0.3, 3),
            "is_mobile": rnd.random() < 0.6,
            "received_at": now_ms + rnd.randrange(0, 5000),
            "payload": "",
        }
        buf = io.BytesIO()
        schemaless_writer(buf, tail_schema, value)
        # header 5 + id ~4 + event_time 6 + tail + payload's length prefix (2) + payload
        pad = max(0, RECORD_BYTES - 5 - 4 - 6 - len(buf.getvalue()) - 1 + rnd.randrange(-20, 21))
        value["payload"] = "".join(rnd.choices(alphabet, k=pad))
        buf = io.BytesIO()
        schemaless_writer(buf, tail_schema, value)
        tails.append(buf.getvalue())
        keys.append(str(user).encode())
    return tails, keys


def register_schema(registry_url: str, subject: str) -> int:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    return int(client.register_schema(subject, Schema(json.dumps(SCHEMA), "AVRO")))


def create_table_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"automq.table.topic.enable": "true", "max.message.bytes": str(2 * MIB)}
    for future in admin.create_topics([NewTopic(topic, partitions, 1, config=config)]).values():
        future.result(15)


def produce(
    bootstrap: str, topic: str, schema_id: int, total: int, compression: str
) -> dict[str, Any]:
    """Produce values until ``total`` value bytes; return counts and timing."""
    from confluent_kafka import Producer

    tails, keys = _tails(POOL)
    failures: list[object] = []

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            failures.append(err)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": MIB,
            "batch.num.messages": 1_000_000,
            "message.max.bytes": 2 * MIB,
            "compression.type": compression,
            "queue.buffering.max.kbytes": 512 * 1024,
            "queue.buffering.max.messages": 10_000_000,
            "on_delivery": delivered,
        }
    )
    header = b"\x00" + struct.pack(">I", schema_id)
    base_ms = int(time.time() * 1000) - 3_600_000
    count = size = 0
    start = time.perf_counter()
    produce_ = producer.produce
    while size < total:
        i = count % POOL
        value = header + _zigzag_varint(count) + _zigzag_varint(base_ms + count) + tails[i]
        while True:
            try:
                produce_(topic, value, keys[i])
                break
            except BufferError:
                producer.poll(0.01)
        count += 1
        size += len(value)
        if count % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(600) == 0, "producer did not drain"
    elapsed = time.perf_counter() - start
    assert not failures, failures[:3]
    return {"rows": count, "value_bytes": size, "seconds": elapsed}


def flush_broker(broker: BrokerProcess, topic: str, rows: int) -> None:
    """Make every produced record part of a segment object (the round reads only those)."""
    broker.admin("/v1/flush", method="POST")
    offsets = broker.admin(f"/v1/topics/{topic}/offsets")
    parts = offsets["partitions"]
    assert isinstance(parts, list)
    assert sum(p["high_watermark"] - p["log_start_offset"] for p in parts) == rows, offsets
    assert all(p["flushed_offset"] == p["high_watermark"] for p in parts), offsets


# ------------------------------------------------------------------ baseline


def _table_identifier(topic: str) -> str:
    return topic.replace(".", "_").replace("-", "_")


def load_catalog(catalog_url: str) -> Any:
    from pyiceberg.catalog import load_catalog as _load

    return _load("bench", type="rest", uri=catalog_url)


def baseline(broker: BrokerProcess, topic: str, partitions: int) -> dict[str, Any]:
    """confluent-kafka Consumer + fastavro + pyarrow + one pyiceberg append; returns the figures."""
    import pyarrow as pa
    from confluent_kafka import Consumer, TopicPartition
    from fastavro import parse_schema, schemaless_reader
    from pyiceberg.exceptions import NamespaceAlreadyExistsError

    from spark_jobs.decode import avro_schema

    catalog = load_catalog(broker.catalog_url)
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace("baseline")
    iceberg_schema = avro_schema.table_schema(SCHEMA)  # exactly the round's table schema
    identifier = ("baseline", _table_identifier(topic))
    table = catalog.create_table(identifier, schema=iceberg_schema)
    arrow = avro_schema.arrow_schema(table.schema())
    parsed = parse_schema(SCHEMA)

    timings = {"consume_decode": 0.0, "arrow": 0.0, "append": 0.0}
    with measure({"broker": broker.proc.pid}) as m:  # type: ignore[union-attr]
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "bench-baseline",
                "enable.auto.commit": False,
                "fetch.max.bytes": 64 * MIB,
                "max.partition.fetch.bytes": 16 * MIB,
                "queued.max.messages.kbytes": 256 * 1024,
            }
        )
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions) if ends[p] > 0])
        remaining = {p for p, end in ends.items() if end > 0}
        batches: list[pa.RecordBatch] = []
        rows: list[dict[str, Any]] = []
        value_bytes = count = 0
        t = time.perf_counter()
        while remaining:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error():
                    raise RuntimeError(msg.error())
                p, offset = msg.partition(), msg.offset()
                assert p is not None and offset is not None
                if offset >= ends[p]:
                    continue
                value = msg.value()
                assert value is not None
                value_bytes += len(value)
                row: dict[str, Any] = schemaless_reader(io.BytesIO(value[5:]), parsed, None)  # type: ignore[assignment]
                key = msg.key()
                row["_kafka_key"] = None if key is None else key.decode()
                row["_kafka_headers"] = msg.headers()
                row["_kafka_metadata"] = {
                    "partition": p,
                    "offset": offset,
                    "timestamp": msg.timestamp()[1] * 1000,
                }
                rows.append(row)
                if offset + 1 >= ends[p]:
                    remaining.discard(p)
                if len(rows) >= BASELINE_BATCH:
                    t1 = time.perf_counter()
                    timings["consume_decode"] += t1 - t
                    batches.append(pa.RecordBatch.from_pylist(rows, schema=arrow))
                    count += len(rows)
                    rows = []
                    t = time.perf_counter()
                    timings["arrow"] += t - t1
        t1 = time.perf_counter()
        timings["consume_decode"] += t1 - t
        if rows:
            batches.append(pa.RecordBatch.from_pylist(rows, schema=arrow))
            count += len(rows)
        consumer.close()
        t = time.perf_counter()
        timings["arrow"] += t - t1
        table.append(pa.Table.from_batches(batches, schema=arrow))
        timings["append"] = time.perf_counter() - t
    snapshot = table.current_snapshot()
    assert snapshot is not None and int(snapshot.summary["total-records"]) == count == sum(
        ends.values()
    )
    return _figures(m, count, value_bytes) | {
        "phases": {k: round(v, 2) for k, v in timings.items()},
        "data_files": int(snapshot.summary["added-data-files"]),
        "table": ".".join(identifier),
    }


def _figures(m: Measure, rows: int, value_bytes: int, cores: int | None = None) -> dict[str, Any]:
    mib = value_bytes / MIB
    out = {
        "rows": rows,
        "mib": round(mib, 1),
        "wall_s": round(m.wall, 2),
        "rows_per_s": round(rows / m.wall),
        "mib_per_s": round(mib / m.wall, 2),
        "cpu_s": round(m.cpu_total, 1),
        "cpu_split_s": {
            "self": round(m.cpu_self, 1),
            "children": round(m.cpu_children, 1),
            **{k: round(v, 1) for k, v in m.cpu_watched.items()},
        },
        "mib_per_cpu_s": round(mib / m.cpu_total, 2) if m.cpu_total else None,
    }
    if cores:
        out["mib_per_s_per_core"] = round(mib / m.wall / cores, 2)
        out["rows_per_s_per_core"] = round(rows / m.wall / cores)
    return out


# ------------------------------------------------------------------ the round


JOB = REPO / "spark_jobs" / "commit_round.py"


def round_command(broker: BrokerProcess, topic: str, result: Path, cores: int) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "spark_jobs.commit_round",
        "--admin-url",
        broker.admin_url,
        "--topic",
        topic,
        "--until-now",
        "--result",
        str(result),
    ]
    help_text = subprocess.run(
        [sys.executable, "-m", "spark_jobs.commit_round", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout
    if "--master" in help_text:
        cmd += ["--master", f"local[{cores}]"]
    return cmd


PYCACHE = Path.home() / ".cache" / "icefall-bench" / "pycache"
WARM_IMPORTS = (
    "spark_jobs.commit_round",
    "spark_jobs.rounds.tasks",
    "spark_jobs.decode.rows",
    "spark_jobs.decode.segments",
    "pyspark.sql",
    "pyspark.sql.pandas.types",
    "pyspark.worker",
    "pyarrow.compute",
    "pyiceberg.catalog.rest",
    "pyiceberg.table",
    "fastavro",
)


def round_env() -> dict[str, str]:
    """The round's environment. Python may keep compiled bytecode, in a cache of its own
    (``PYCACHE``, nothing written to the repo or the venv): with PYTHONDONTWRITEBYTECODE set
    and a venv installed without .pyc files (uv's default), every Spark Python worker would
    compile pandas, pyarrow, pydantic and pyiceberg from source, seconds per worker, which
    no installed deployment pays. Modules Spark ships in pyspark.zip are compiled per worker
    regardless (zipimport keeps no bytecode): that cost is Spark's and stays in the figure."""
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPYCACHEPREFIX": str(PYCACHE),
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def warm_bytecode() -> float:
    """Fill ``PYCACHE`` for the modules the round and its workers import (not measured)."""
    PYCACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "; ".join(f"import {m}" for m in WARM_IMPORTS)],
        cwd=REPO,
        env=round_env(),
        check=True,
        timeout=600,
    )
    return time.perf_counter() - t0


def run_round(
    broker: BrokerProcess,
    topic: str,
    workdir: Path,
    cores: int,
    name: str,
    profile: bool = False,
    env: dict[str, str] | None = None,
) -> tuple[Measure, dict[str, Any]]:
    """One round in a subprocess, pinned to ``cores`` CPUs when the machine has more; with
    ``profile``, under ``py-spy record --subprocesses`` (collapsed stacks in ``<name>.pyspy.txt``);
    ``env``: variables added to ``round_env()`` (e.g. S3 credentials). Interrupted (Ctrl-C), the
    round's processes are stopped before the exception goes on."""
    result = workdir / f"{name}.json"
    log = workdir / f"{name}.log"
    result.unlink(missing_ok=True)
    cmd = round_command(broker, topic, result, cores)
    if profile:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        cmd = [
            spy,
            "record",
            "--subprocesses",
            "--nonblocking",
            "--rate",
            "50",
            "--format",
            "raw",
            "-o",
            str(workdir / f"{name}.pyspy.txt"),
            "--",
            *cmd,
        ]
    if cores < len(os.sched_getaffinity(0)):
        cmd = ["taskset", "-c", ",".join(map(str, sorted(os.sched_getaffinity(0))[:cores])), *cmd]
    env = round_env() | (env or {})
    events = workdir / f"{name}-events"
    events.mkdir(exist_ok=True)
    env["PYSPARK_SUBMIT_ARGS"] = (
        f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={events.as_uri()} "
        "pyspark-shell"
    )
    print(f"[round] {' '.join(cmd)}  (log: {log})", file=sys.stderr)
    by_process = CpuByProcess(_process_kind)
    before = own_children()  # brokers, an S3 server: not the round's
    with open(log, "wb") as out, measure() as m:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            by_process.start(proc.pid)
            code = proc.wait(7200)
            wall = time.perf_counter() - t0
            reap_orphans(exclude=before)  # the JVM exits after the driver
        except BaseException:
            by_process.stop()
            stop_processes({proc.pid} | (own_children() - before))
            raise
    m.wall = wall
    cpu_split = by_process.stop()
    # RUSAGE_CHILDREN misses descendants that nobody waited for (Spark's Python workers and
    # daemon are often killed, not reaped, when the JVM exits); the /proc samples see them
    m.cpu_watched = {"uncounted_descendants": max(0.0, sum(cpu_split.values()) - m.cpu_total)}
    if code != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"round {name} failed with exit code {code}:\n{tail}")
    return m, json.loads(result.read_text()) | {
        "_cpu_by_process_s": cpu_split,
        "_spark": spark_tasks(events),
    }


def spark_tasks(events: Path) -> dict[str, Any] | None:
    """What Spark's event log says about the round's write job: tasks, their times, output."""
    logs = sorted(events.iterdir())
    if not logs:
        return None
    tasks, stages = [], []
    for line in logs[-1].read_text().splitlines():
        event = json.loads(line)
        if event["Event"] == "SparkListenerTaskEnd":
            info, metrics = event["Task Info"], event.get("Task Metrics") or {}
            tasks.append(
                {
                    "s": (info["Finish Time"] - info["Launch Time"]) / 1000,
                    "jvm_cpu_s": metrics.get("Executor CPU Time", 0) / 1e9,
                    "gc_s": metrics.get("JVM GC Time", 0) / 1000,
                    "rows": (metrics.get("Output Metrics") or {}).get("Records Written", 0),
                    "parquet_bytes": (metrics.get("Output Metrics") or {}).get("Bytes Written", 0),
                }
            )
        elif event["Event"] == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            stages.append((info["Completion Time"] - info["Submission Time"]) / 1000)
    if not tasks:
        return {"tasks": 0}
    return {
        "tasks": len(tasks),
        "stage_s": round(sum(stages), 2),
        "task_s": [round(t["s"], 2) for t in tasks],
        "task_rows": [t["rows"] for t in tasks],
        "task_jvm_cpu_s": round(sum(t["jvm_cpu_s"] for t in tasks), 2),
        "gc_s": round(sum(t["gc_s"] for t in tasks), 2),
        "parquet_mib": round(sum(t["parquet_bytes"] for t in tasks) / MIB, 1),
    }


def _process_kind(cmdline: str) -> str:
    if "java" in cmdline.split(" ", 1)[0]:
        return "jvm"
    if "pyspark.daemon" in cmdline or "pyspark/worker" in cmdline:
        return "python_workers"
    if "spark_jobs.commit_round" in cmdline:
        return "driver_python"
    return "other"


def the_round(
    broker: BrokerProcess,
    topic: str,
    workdir: Path,
    cores: int,
    rows: int,
    value_bytes: int,
    profile: bool = False,
    env: dict[str, str] | None = None,
    name: str = "round",
) -> dict[str, Any]:
    """The full round over everything produced, then an empty round (nothing new); ``env`` as
    in ``run_round``, ``name`` prefixes the logs and results in ``workdir``."""
    print(
        f"[round] bytecode cache warmed in {warm_bytecode():.1f} s (not measured)", file=sys.stderr
    )
    m, result = run_round(broker, topic, workdir, cores, name, profile, env)
    assert result.get("status") == "committed", f"round did not commit: {result}"
    got = int(result.get("rows", -1))
    assert got == rows, f"round wrote {got} rows, expected {rows}: {result}"
    full = _figures(m, rows, value_bytes, cores) | {
        "phases_s": result.get("seconds"),
        "bytes_read": result.get("bytes_read"),
        "data_files": result.get("data_files"),
        "snapshot_id": result.get("snapshot_id"),
        "cpu_by_process_s": result.get("_cpu_by_process_s"),
        "spark": result.get("_spark"),
    }
    seconds = result.get("seconds") or {}
    if isinstance(seconds, dict) and "total" in seconds:
        full["outside_job_s"] = round(
            m.wall - float(seconds["total"]), 2
        )  # JVM + Spark start-up, imports, exit
        rw = seconds.get("read_write")
        if rw:
            full["read_write_mib_per_s_per_core"] = round(value_bytes / MIB / float(rw) / cores, 2)
    me, empty = run_round(broker, topic, workdir, cores, f"empty-{name}", env=env)
    assert empty.get("status") == "nothing_new" and int(empty.get("rows", 0)) == 0, (
        f"empty round: {empty}"
    )
    return {
        "full": full,
        "empty": {
            "wall_s": round(me.wall, 2),
            "cpu_s": round(me.cpu_total, 1),
            "cpu_by_process_s": empty.get("_cpu_by_process_s"),
            "phases_s": empty.get("seconds"),
            "snapshot_id": empty.get("snapshot_id"),
        },
        "results": {"round": result, "empty": empty},
    }


# ------------------------------------------------------------------ report


def markdown(
    args: argparse.Namespace,
    info: dict[str, Any],
    prod: dict[str, Any],
    base: dict[str, Any] | None,
    rnd: dict[str, Any] | None,
) -> str:
    mach = info["machine"]
    lines = [
        (
            f"Date {info['date']}; machine: {mach['nproc']} cores ({mach['cpu']}), {mach['mem_gib']} GiB, "
            f"{mach['os']}, Python {mach['python']}; broker, bench and Spark share the cores."
        ),
        "",
        (
            f"Command: `{info['command']}` ({prod['rows']:,} records, {prod['value_bytes'] / MIB:.0f} MiB of values, "
            f"mean {prod['value_bytes'] / prod['rows']:.0f} B, 16 fields; {args.partitions} partitions, "
            f"{args.compression}; produced in {prod['seconds']:.1f} s = "
            f"{prod['value_bytes'] / MIB / prod['seconds']:.0f} MiB/s, not counted)."
        ),
        "",
        (
            "| date | MiB | baseline MiB/s | baseline MiB/CPU-s | round MiB/s | round MiB/s per core "
            "| round rows/s per core | round / baseline | round MiB/CPU-s | empty round s | note |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    b = base or {}
    f = (rnd or {}).get("full", {})
    e = (rnd or {}).get("empty", {})
    ratio = f"{f['mib_per_s'] / b['mib_per_s']:.2f}" if f and b else "—"
    lines.append(
        f"| {info['date']} | {prod['value_bytes'] / MIB:.0f} "
        f"| {b.get('mib_per_s', '—')} | {b.get('mib_per_cpu_s', '—')} "
        f"| {f.get('mib_per_s', '—')} | {f.get('mib_per_s_per_core', '—')} | {f.get('rows_per_s_per_core', '—')} "
        f"| {ratio} | {f.get('mib_per_cpu_s', '—')} | {e.get('wall_s', '—')} | local[{args.cores}] |"
    )
    lines.append("")
    if b:
        lines.append(
            f"Baseline: {b['wall_s']} s wall ({b['rows_per_s']:,} rows/s), phases {b['phases']}, "
            f"CPU {b['cpu_s']} s {b['cpu_split_s']}, {b['data_files']} data file(s), one append."
        )
    if f:
        lines.append(
            f"Round: {f['wall_s']} s wall incl. Spark start-up ({f['rows_per_s']:,} rows/s), "
            f"job phases {f.get('phases_s')}, outside the job {f.get('outside_job_s', '—')} s, "
            f"CPU {f['cpu_s']} s {f.get('cpu_by_process_s')}, {f.get('data_files')} data file(s)."
        )
        if f.get("spark"):
            lines.append(f"Spark write job: {f['spark']}.")
        if "read_write_mib_per_s_per_core" in f:
            lines.append(
                f"Read+write phase alone: {f['read_write_mib_per_s_per_core']} MiB/s per core."
            )
    if e:
        lines.append(f"Empty round: {e['wall_s']} s wall, phases {e.get('phases_s')}.")
    lines.append("Targets: round ≥ 25 MiB/s per core, round / baseline ≥ 3.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mib", type=int, default=1024, help="MiB of record values to produce (default 1024)"
    )
    parser.add_argument(
        "--cores", type=int, default=2, help="cores for the round: local[N] (default 2)"
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--compression", default="lz4", choices=["none", "lz4", "snappy", "zstd", "gzip"]
    )
    parser.add_argument(
        "--no-baseline", dest="baseline", action="store_false", help="skip the baseline"
    )
    parser.add_argument(
        "--no-round", dest="round", action="store_false", help="skip the Spark round"
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the broker home and logs in this directory"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="also write all figures to this JSON file"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the full round under py-spy (needs --keep; slows the round: not for figures)",
    )
    args = parser.parse_args()
    if args.profile and not args.keep:
        parser.error("--profile needs --keep DIR (the profile is written there)")
    run_round_too = args.round and JOB.exists()
    if args.round and not run_round_too:
        print(f"[bench] {JOB.relative_to(REPO)} does not exist yet: baseline only", file=sys.stderr)

    info = run_info()
    topic = "bench-events"
    become_subreaper()  # so the Spark JVM's CPU time is counted (PySpark never waits for it)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if (
            args.keep
        ):  # kept after the run, failed or not: broker home and log, round logs and results
            workdir = Path(
                tempfile.mkdtemp(prefix=f"run-{time.strftime('%Y%m%d-%H%M%S')}-", dir=args.keep)
            )
            print(f"[bench] working in {workdir}", file=sys.stderr)
        else:
            workdir = Path(
                stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="icefall-bench-round-", dir=Path.home())
                )
            )
        broker = BrokerProcess(workdir / "home").start()
        try:
            schema_id = register_schema(broker.registry_url, f"{topic}-value")
            create_table_topic(broker.bootstrap, topic, args.partitions)
            prod = produce(broker.bootstrap, topic, schema_id, args.mib * MIB, args.compression)
            flush_broker(broker, topic, prod["rows"])
            print(
                f"[produce] {prod['rows']:,} rows, {prod['value_bytes'] / MIB:.1f} MiB in {prod['seconds']:.1f} s",
                file=sys.stderr,
            )
            base = baseline(broker, topic, args.partitions) if args.baseline else None
            if base:
                print(f"[baseline] {json.dumps(base)}", file=sys.stderr)
            rnd = (
                the_round(
                    broker,
                    topic,
                    workdir,
                    args.cores,
                    prod["rows"],
                    prod["value_bytes"],
                    args.profile,
                )
                if run_round_too
                else None
            )
            if rnd:
                print(
                    f"[round] {json.dumps({k: rnd[k] for k in ('full', 'empty')})}", file=sys.stderr
                )
        except BaseException:
            print(broker.log_text()[-3000:], file=sys.stderr)
            raise
        finally:
            broker.stop(60)
    figures = {"info": info, "produce": prod, "baseline": base, "round": rnd}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    print(
        json.dumps(
            {k: v for k, v in figures.items() if k != "round"}
            | {"round": rnd and {k: rnd[k] for k in ("full", "empty")}},
            indent=2,
            default=str,
        )
    )
    print()
    print(markdown(args, info, prod, base, rnd))


if __name__ == "__main__":
    main()
