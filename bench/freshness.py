"""Freshness: produce -> visible in the Iceberg table, with Airflow's scheduler running the rounds.

Starts a broker and Airflow (the same ``AirflowStack`` as ``icefall up``: api-server,
scheduler, dag-processor, triggerer, LocalExecutor, SQLite) in a temporary home,
creates a table topic with a ``--interval-s`` commit interval and produces
``--rate`` Avro records/s for ``--minutes``, each carrying its produce time.
A reader polls the table (pyiceberg, every 0.5 s); a record's freshness is the
time the reader first sees it minus its produce time. Reports p50/p99/max
against the interval (target: p99 <= interval + 10 s) and the fixed cost of a
round as Airflow runs it: the DAG run (plan start -> publish end) and its tasks,
from Airflow's database, next to the Spark job's own timings (asset extras).

    .venv/bin/python bench/freshness.py [--minutes 10] [--interval-s 30] [--rate 20] [--trigger-bytes N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import REPO, BrokerProcess, machine

from broker.supervisor.up import AirflowStack

TOPIC = "freshness"
SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Tick",
        "namespace": "icefall.bench",
        "fields": [{"name": "seq", "type": "long"}, {"name": "produced_ms", "type": "long"}],
    }
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Producer(threading.Thread):
    def __init__(self, broker: BrokerProcess, rate: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.broker, self.rate, self.stop = broker, rate, stop
        self.sent = 0
        self.bytes_sent = 0  # value bytes (the broker's batches add ~70 B of framing each)
        self.produced_ms: list[int] = []  # by sequence number

    def run(self) -> None:
        from confluent_kafka import Producer as KafkaProducer
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        serialize = AvroSerializer(SchemaRegistryClient({"url": self.broker.registry_url}), SCHEMA)
        context = SerializationContext(TOPIC, MessageField.VALUE)
        producer = KafkaProducer(
            {"bootstrap.servers": self.broker.bootstrap, "linger.ms": 5, "acks": "all"}
        )
        next_at = time.monotonic()
        while not self.stop.is_set():
            now_ms = int(time.time() * 1000)
            value = serialize({"seq": self.sent, "produced_ms": now_ms}, context)
            self.produced_ms.append(now_ms)
            producer.produce(TOPIC, value=value)
            self.bytes_sent += len(value)
            producer.poll(0)
            self.sent += 1
            next_at += 1 / self.rate
            self.stop.wait(max(0.0, next_at - time.monotonic()))
        producer.flush(10)


def watch_table(catalog_url: str, until: float, seen: dict[int, float]) -> int:
    """Poll the table; return how many distinct snapshots became visible."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("bench", type="rest", uri=catalog_url)
    last_snapshot = None
    snapshots = 0
    while time.time() < until:
        try:
            table = catalog.load_table(("default", TOPIC))
        except Exception:  # noqa: BLE001 -- not created before the first commit
            time.sleep(0.5)
            continue
        current = table.current_snapshot()
        if current is not None and current.snapshot_id != last_snapshot:
            now_ms = time.time() * 1000
            last_snapshot = current.snapshot_id
            snapshots += 1
            for seq in table.scan(selected_fields=("seq",)).to_arrow().column("seq").to_pylist():
                seen.setdefault(seq, now_ms)
        time.sleep(0.5)
    return snapshots


def round_costs(airflow_db: Path) -> dict[str, Any]:
    """Durations of finished rounds from Airflow's database (seconds, p50 and max)."""
    con = sqlite3.connect(airflow_db)
    runs = con.execute(
        "SELECT run_id, (julianday(end_date) - julianday(start_date)) * 86400 FROM dag_run "
        "WHERE dag_id = ? AND state = 'success' AND end_date IS NOT NULL",
        (f"icefall_commit__{TOPIC}",),
    ).fetchall()
    tasks: dict[str, list[float]] = {}
    for task_id, duration in con.execute(
        "SELECT task_id, duration FROM task_instance WHERE dag_id = ? AND state IN ('success', 'skipped') "
        "AND duration IS NOT NULL",
        (f"icefall_commit__{TOPIC}",),
    ):
        tasks.setdefault(task_id, []).append(float(duration))
    extras = [
        json.loads(e)
        for (e,) in con.execute(
            "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = ?",
            (f"icefall/default/{TOPIC}",),
        )
    ]
    con.close()

    def stats(values: list[float]) -> dict[str, float]:
        return (
            {
                "n": len(values),
                "p50": round(statistics.median(values), 2),
                "max": round(max(values), 2),
            }
            if values
            else {"n": 0}
        )

    spark = [float(e["seconds"]["total"]) for e in extras if e.get("seconds")]
    return {
        "dag_run_s": stats([float(d) for _, d in runs]),
        **{f"task_{k}_s": stats(v) for k, v in sorted(tasks.items())},
        "spark_job_total_s": stats(spark),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=20.0, help="records per second")
    parser.add_argument(
        "--trigger-bytes",
        type=int,
        default=0,
        help="automq.table.topic.commit.trigger.bytes: also commit when this many bytes wait",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=None,
        help="records produced in the last this many seconds are not measured (default: two "
        "intervals; 30 s with --trigger-bytes)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary home")
    args = parser.parse_args()

    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.support import free_port

    workdir = Path(tempfile.mkdtemp(prefix="icefall-freshness-"))
    broker = BrokerProcess(workdir / "home").start()
    airflow = AirflowStack(
        broker.config(),
        broker.home.resolve(),
        free_port(),
    )
    stop = threading.Event()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        config = {
            "automq.table.topic.enable": "true",
            "automq.table.topic.commit.interval.ms": str(int(args.interval_s * 1000)),
            "automq.table.topic.commit.trigger.bytes": str(args.trigger_bytes),
        }
        for future in admin.create_topics([NewTopic(TOPIC, 3, 1, config=config)]).values():
            future.result(10)
        started = time.monotonic()
        airflow.migrate()
        airflow.sync()
        airflow.start()
        airflow.wait_ready(should_stop=stop.is_set)
        print(
            f"Airflow up in {time.monotonic() - started:.0f} s at {airflow.url}; "
            f"producing {args.rate:g} records/s for {args.minutes:g} min",
            flush=True,
        )
        producer = Producer(broker, args.rate, stop)
        producer.start()
        seen: dict[int, float] = {}
        end = time.time() + args.minutes * 60
        snapshots = watch_table(broker.catalog_url, end, seen)
        stop.set()
        producer.join(30)
        # Records produced near the end had no chance to be committed: measure those produced before
        # the end minus two intervals (or --settle-s); one of those never seen counts as "not visible by the end".
        settle_s = (
            args.settle_s
            if args.settle_s is not None
            else 30.0
            if args.trigger_bytes
            else 2 * args.interval_s
        )
        cutoff_ms = (end - settle_s) * 1000
        eligible = [seq for seq, ms in enumerate(producer.produced_ms) if ms <= cutoff_ms]
        freshness = [(seen[s] - producer.produced_ms[s]) / 1000 for s in eligible if s in seen]
        result = {
            "machine": machine(),
            "minutes": args.minutes,
            "interval_s": args.interval_s,
            "rate": args.rate,
            "trigger_bytes": args.trigger_bytes,
            "settle_s": settle_s,
            "value_bytes_per_s": round(producer.bytes_sent / (args.minutes * 60)),
            "produced": producer.sent,
            "visible": len(seen),
            "snapshots": snapshots,
            "freshness_s": {
                "n": len(freshness),
                "p50": round(percentile(freshness, 0.5), 2),
                "p99": round(percentile(freshness, 0.99), 2),
                "max": round(max(freshness), 2),
            }
            if freshness
            else {"n": 0},
            "measured": len(eligible),
            "not_visible_by_end": len(eligible) - len(freshness),
            "target_p99_s": args.interval_s + 10,
            "round_costs": round_costs(airflow.home / "airflow.db"),
        }
        print(json.dumps(result, indent=2))
        return 0
    finally:
        stop.set()
        airflow.stop()
        broker.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"kept {workdir}", file=sys.stderr)


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
