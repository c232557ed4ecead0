"""Upsert round throughput vs an append round on the same records, measured in the same run (issue 5).

Workload: N records (default 1,000,000) of the ~500-byte, 16-field Avro values of
``bench/commit_round.py``, where 10% of the records (``--repeat``) repeat the ``id`` of an
earlier record of the same round (chosen at random), produced with identical bytes and keys
to two table topics with 4 partitions:

- ``bench-append``: a plain table topic (every record a row);
- ``bench-upsert``: ``upsert.enable=true``, ``id.columns=[id]`` (the last record per id wins;
  merge-on-read, format v2).

Each round runs as ``python -m spark_jobs.commit_round --until-now`` in a subprocess with its
own Spark (``local[CORES]``), wall time including Spark start-up, as ``bench/commit_round.py``
measures it. The upsert round runs first on an empty table (its MERGE then only inserts), and
then a second upsert round re-sends the same N records (every id now exists: the MERGE
replaces rows and writes position deletes), against a second append round on the other topic.
Figure: rows/s of each round and upsert / append, per pair.

    .venv/bin/python bench/upsert_round.py [--records 1000000] [--repeat 0.1] [--cores 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import MIB, BrokerProcess, become_subreaper, produce_when_room, run_info
from bench.commit_round import (
    POOL,
    _tails,
    _zigzag_varint,
    register_schema,
    run_round,
    warm_bytecode,
)

APPEND, UPSERT = "bench-append", "bench-upsert"
PARTITIONS = 4


def create_topics(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    base = {"automq.table.topic.enable": "true", "max.message.bytes": str(2 * MIB)}
    upsert = {
        **base,
        "automq.table.topic.upsert.enable": "true",
        "automq.table.topic.id.columns": "[id]",
    }
    topics = [
        NewTopic(APPEND, PARTITIONS, 1, config=base),
        NewTopic(UPSERT, PARTITIONS, 1, config=upsert),
    ]
    for future in admin.create_topics(topics).values():
        future.result(15)


def produce(
    bootstrap: str, schema_ids: dict[str, int], records: int, repeat: float, seed: int
) -> dict[str, Any]:
    """The same records to both topics; the key is the id (so a repeated id lands in the same partition)."""
    from confluent_kafka import Producer

    tails, _ = _tails(POOL)
    rnd = random.Random(seed)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": MIB,
            "compression.type": "lz4",
            "queue.buffering.max.kbytes": 512 * 1024,
            "queue.buffering.max.messages": 10_000_000,
        }
    )
    base_ms = int(time.time() * 1000) - 3_600_000
    ids: list[int] = []
    value_bytes = 0
    t0 = time.perf_counter()
    for n in range(records):
        record_id = ids[rnd.randrange(len(ids))] if ids and rnd.random() < repeat else n
        ids.append(record_id)
        body = _zigzag_varint(record_id) + _zigzag_varint(base_ms + n) + tails[n % POOL]
        key = str(record_id).encode()
        for topic, schema_id in schema_ids.items():
            value = b"\x00" + struct.pack(">I", schema_id) + body
            produce_when_room(producer, topic, value, key)
        value_bytes += 5 + len(body)
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(600) == 0, "producer did not drain"
    return {
        "records": records,
        "distinct_ids": len(set(ids)),
        "value_bytes": value_bytes,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def one_round(
    broker: BrokerProcess, topic: str, workdir: Path, cores: int, name: str, records: int
) -> dict[str, Any]:
    m, result = run_round(broker, topic, workdir, cores, name)
    assert result.get("status") == "committed" and int(result.get("rows", -1)) == records, result
    return {
        "wall_s": round(m.wall, 2),
        "rows_per_s": round(records / m.wall),
        "cpu_s": round(m.cpu_total, 1),
        "phases_s": result.get("seconds"),
        "message": result.get("message"),
    }


def check_tables(broker: BrokerProcess, produced: dict[str, Any], rounds: int) -> dict[str, int]:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("bench", type="rest", uri=broker.catalog_url)
    rows = {
        t: len(
            catalog.load_table(("default", t.replace("-", "_")))
            .scan(selected_fields=("id",))
            .to_arrow()
        )
        for t in (APPEND, UPSERT)
    }
    assert rows[APPEND] == rounds * produced["records"], rows
    assert rows[UPSERT] == produced["distinct_ids"], rows
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument(
        "--repeat", type=float, default=0.1, help="share of records repeating an earlier id"
    )
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    info = run_info()
    become_subreaper()
    figures: dict[str, Any] = {"info": info}
    with tempfile.TemporaryDirectory(prefix="icefall-bench-upsert-", dir=Path.home()) as tmp:
        workdir = Path(tmp)
        broker = BrokerProcess(workdir / "home").start()
        try:
            ids = {t: register_schema(broker.registry_url, f"{t}-value") for t in (APPEND, UPSERT)}
            create_topics(broker.bootstrap)
            print(
                f"[bench] bytecode cache warmed in {warm_bytecode():.1f} s (not measured)",
                file=sys.stderr,
            )
            for pass_ in (
                1,
                2,
            ):  # pass 2: the same records again, every id already in the upsert table
                produced = produce(broker.bootstrap, ids, args.records, args.repeat, seed=5)
                broker.admin("/v1/flush", method="POST")
                print(f"[produce {pass_}] {produced}", file=sys.stderr)
                pair = {
                    "append": one_round(
                        broker, APPEND, workdir, args.cores, f"append{pass_}", args.records
                    ),
                    "upsert": one_round(
                        broker, UPSERT, workdir, args.cores, f"upsert{pass_}", args.records
                    ),
                }
                pair["upsert_over_append"] = round(
                    pair["upsert"]["rows_per_s"] / pair["append"]["rows_per_s"], 3
                )
                figures[f"pass{pass_}"] = {"produced": produced, **pair}
                figures[f"pass{pass_}"]["table_rows"] = check_tables(broker, produced, pass_)
                print(f"[pass {pass_}] {json.dumps(figures[f'pass{pass_}'])}", file=sys.stderr)
        finally:
            with contextlib.suppress(Exception):
                broker.stop(60)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    print(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
