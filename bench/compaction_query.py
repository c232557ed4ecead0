"""Query time of a fixed aggregation before and after compaction, in the same run (issue 7).

Workload: a table topic (2 partitions) whose table is made by N real commit
rounds (``spark_jobs.commit_round``, in-process on one Spark session, each
round capped with ``--max-records``), so the table has what N small rounds
leave: N snapshots, a manifest per round, a few small data files per round.
Records: Avro (id, user, page, country, score, amount_cents, ts) produced with the
Confluent serializer before the rounds start.

Query (fixed): per country and page, the count, sum(score) and sum(amount_cents) of
the rows with ``ts`` in the second half of the time range, ordered. Run in two
engines against the broker's REST catalog: Spark SQL (the same session; the
catalog does not cache tables) and DuckDB (the iceberg extension; a fresh
connection per phase). Each engine: one untimed warm-up, then the median of
``--repeat`` runs; the answers before and after must be identical. DuckDB's
warm-up is also reported as a cold query (a new connection loads the table's
metadata); Spark's is not comparable (the first query of the session also
warms the JVM), so it is printed but gets no ratio.

Between the phases: ``spark_jobs.maintenance`` with ``compact,manifests``
(rewrite_data_files binpack to the default 512 MiB target, rewrite_manifests),
what the maintenance DAG runs. Figures: files and manifests of the current
snapshot, query seconds before and after, and the ratio before / after.

    .venv/bin/python bench/compaction_query.py [--rounds 500] [--rows-per-round 200]
        [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import REPO, BrokerProcess, run_info

TOPIC = "bench_clicks"
PARTITIONS = 2
START_MS = 1_780_000_000_000
STEP_MS = 1_000
PAGES = [f"/p/{i}" for i in range(40)]
COUNTRIES = ["de", "fr", "us", "br", "jp", "in", "ng", "au"]
SCHEMA = {
    "type": "record",
    "name": "Click",
    "namespace": "icefall.bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "country", "type": "string"},
        {"name": "score", "type": "int"},
        {"name": "amount_cents", "type": "long"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def produce(broker: BrokerProcess, rows: int) -> None:
    """``rows`` Avro records, round-robin over the partitions (so every round touches both)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {"automq.table.topic.enable": "true", "automq.table.topic.maintenance.enable": "true"}
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config=config)]).values():
        future.result(15)
    serialize = AvroSerializer(
        SchemaRegistryClient({"url": broker.registry_url}), json.dumps(SCHEMA)
    )
    context = SerializationContext(TOPIC, MessageField.VALUE)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "enable.idempotence": True}
    )
    rng = random.Random(7)
    for i in range(rows):
        value = {
            "id": i,
            "user": f"u{rng.randrange(5000)}",
            "page": rng.choice(PAGES),
            "country": rng.choice(COUNTRIES),
            "score": rng.randrange(100),
            "amount_cents": rng.randrange(100_000),
            "ts": datetime.fromtimestamp((START_MS + i * STEP_MS) / 1000, UTC),
        }
        producer.produce(TOPIC, value=serialize(value, context), partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "records left unsent"


def make_rounds(spark: Any, broker: BrokerProcess, rounds: int, rows_per_round: int) -> list[float]:
    from spark_jobs import commit_round

    per_partition = rows_per_round // PARTITIONS
    seconds = []
    for n in range(rounds):
        started = time.monotonic()
        code, result = commit_round.run(
            [
                "--admin-url",
                broker.admin_url,
                "--topic",
                TOPIC,
                "--max-records",
                str(per_partition),
            ],
            spark,
        )
        if code != 0 or result.status != "committed":
            raise SystemExit(f"round {n + 1} did not commit: {result.status} {result.message}")
        seconds.append(time.monotonic() - started)
        if (n + 1) % 50 == 0:
            log(f"{n + 1} rounds, median {statistics.median(seconds):.2f} s per round")
    return seconds


def query_sql(table: str, cut_ms: int) -> str:
    at = datetime.fromtimestamp(cut_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    # Integer aggregates only: a float sum depends on the order tasks add up, and the answers must match.
    return (
        f"SELECT country, page, count(*) AS n, sum(score) AS score, sum(amount_cents) AS amount_cents "
        f"FROM {table} WHERE ts >= TIMESTAMP '{at}' GROUP BY country, page ORDER BY country, page"
    )


def timed(
    run: Callable[[], list[tuple[Any, ...]]], repeat: int
) -> tuple[float, float, list[tuple[Any, ...]]]:
    """(first run's seconds, median of ``repeat`` more, the answer)."""
    started = time.monotonic()
    answer = run()
    first = time.monotonic() - started
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        again = run()
        times.append(time.monotonic() - started)
        if again != answer:
            raise SystemExit("the same query gave two answers")
    return first, statistics.median(times), answer


def table_shape(broker: BrokerProcess) -> dict[str, int]:
    from pyiceberg.catalog import load_catalog

    table = load_catalog("bench", type="rest", uri=broker.catalog_url).load_table(
        ("default", TOPIC)
    )
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {
        "data_files": len(table.inspect.files()),
        "manifests": len(snapshot.manifests(table.io)),
        "snapshots": len(table.metadata.snapshots),
        "rows": int(snapshot.summary["total-records"]),
        "bytes": int(snapshot.summary["total-files-size"]),
    }


def measure_queries(spark: Any, broker: BrokerProcess, cut_ms: int, repeat: int) -> dict[str, Any]:
    from broker.catalog import duckdb_local
    from spark_jobs import commit_round

    name = commit_round.use_catalog(spark, broker.catalog_url)
    spark_sql = query_sql(f"{name}.default.{TOPIC}", cut_ms)

    def in_spark() -> list[tuple[Any, ...]]:
        return [tuple(r) for r in spark.sql(spark_sql).collect()]

    con = duckdb_local.connect()
    try:
        con.execute(
            "SET TimeZone = 'UTC'"
        )  # the cut is a UTC wall-clock literal, as in Spark's session
        duckdb_local.attach_catalog(con, broker.catalog_url, "lake")
        duck_sql = query_sql(f"lake.default.{TOPIC}", cut_ms)

        def in_duckdb() -> list[tuple[Any, ...]]:
            return [tuple(r) for r in con.sql(duck_sql).fetchall()]

        s_first, s_median, s_answer = timed(in_spark, repeat)
        d_first, d_median, d_answer = timed(in_duckdb, repeat)
    finally:
        con.close()
    return {
        "spark_first_s": s_first,
        "spark_s": s_median,
        "duckdb_first_s": d_first,
        "duckdb_s": d_median,
        "spark_answer": [list(map(str, r)) for r in s_answer],
        "duckdb_answer": [list(map(str, r)) for r in d_answer],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--rows-per-round", type=int, default=200)
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed runs per engine and phase (median)"
    )
    parser.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.rows_per_round % PARTITIONS:
        parser.error(f"--rows-per-round must be a multiple of {PARTITIONS}")

    from spark_jobs import commit_round, maintenance

    info = run_info()
    rows = args.rounds * args.rows_per_round
    cut_ms = START_MS + (rows // 2) * STEP_MS
    with contextlib.ExitStack() as stack:
        workdir = Path(
            stack.enter_context(
                tempfile.TemporaryDirectory(prefix="icefall-bench-compact-", dir=Path.home())
            )
        )
        broker = BrokerProcess(workdir / "home", ["--segment-flush-ms", "200"]).start()
        stack.callback(broker.stop)
        log(f"producing {rows:,} records")
        produce(broker, rows)
        spark = commit_round.spark_session("icefall-bench-compaction", f"local[{args.cores}]")
        stack.callback(spark.stop)
        spark.conf.set("spark.sql.shuffle.partitions", str(args.cores))
        spark.sparkContext.setLogLevel("ERROR")
        log(f"{args.rounds} commit rounds of {args.rows_per_round} records")
        round_seconds = make_rounds(spark, broker, args.rounds, args.rows_per_round)
        info["rounds"] = {
            "count": args.rounds,
            "rows_per_round": args.rows_per_round,
            "median_s": statistics.median(round_seconds),
            "total_s": sum(round_seconds),
        }

        info["before"] = {
            **table_shape(broker),
            **measure_queries(spark, broker, cut_ms, args.repeat),
        }
        log(
            f"before: {json.dumps({k: v for k, v in info['before'].items() if not k.endswith('answer')})}"
        )

        started = time.monotonic()
        code, result = maintenance.run(
            ["--admin-url", broker.admin_url, "--topic", TOPIC, "--actions", "compact,manifests"],
            spark,
        )
        if code != 0:
            raise SystemExit(f"maintenance failed: {result.message}")
        info["maintenance"] = {"seconds": time.monotonic() - started, "message": result.message}

        info["after"] = {
            **table_shape(broker),
            **measure_queries(spark, broker, cut_ms, args.repeat),
        }
        log(
            f"after: {json.dumps({k: v for k, v in info['after'].items() if not k.endswith('answer')})}"
        )

    before, after = info["before"], info["after"]
    if (
        before["rows"] != after["rows"]
        or before["spark_answer"] != after["spark_answer"]
        or before["duckdb_answer"] != after["duckdb_answer"]
    ):
        raise SystemExit("compaction changed the table's rows or the query's answer")
    if before["spark_answer"] != before["duckdb_answer"]:
        raise SystemExit("Spark and DuckDB disagree on the groups, counts or sums")
    info["ratio"] = {
        "spark": before["spark_s"] / after["spark_s"],
        "duckdb": before["duckdb_s"] / after["duckdb_s"],
        "duckdb_first": before["duckdb_first_s"] / after["duckdb_first_s"],
    }
    for phase in ("before", "after"):
        for key in ("spark_answer", "duckdb_answer"):
            info[phase][key + "_groups"] = len(info[phase].pop(key))
    print(json.dumps(info, indent=2))
    if args.json:
        args.json.write_text(json.dumps(info, indent=2) + "\n")
    print(
        f"\n{info['date']}, {info['machine']['nproc']} cores: {args.rounds} rounds, {before['rows']:,} rows; "
        f"{before['data_files']} files / {before['manifests']} manifests -> "
        f"{after['data_files']} / {after['manifests']}\n"
        f"  Spark SQL  {before['spark_s']:.3f} s -> {after['spark_s']:.3f} s  "
        f"(before/after {info['ratio']['spark']:.2f})\n"
        f"  DuckDB     {before['duckdb_s']:.3f} s -> {after['duckdb_s']:.3f} s  "
        f"(before/after {info['ratio']['duckdb']:.2f})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
