"""Produce throughput and ack latency of the storage core: one broker on SQLite + the local
fsync'd WAL vs cluster mode (Postgres index + object store, acks after the fenced index
commit; issue 16), both with a local-directory object store, in the same run.

In-process, at the log store (no Kafka protocol, no client): ``--producers`` coroutines each
append one batch of ``--batch-records`` records of ``--record-bytes`` to a partition (round
robin over ``--partitions``) and wait for its ack, as ``max.in.flight=1`` producers would. The
Postgres server is a fresh one from ``tests/postgres.py`` (fsync off there: it measures the
broker's path, not Postgres's disk).

    .venv/bin/python bench/cluster_acks.py [--seconds 10] [--producers 16] [--partitions 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import MIB, machine
from broker.config import BrokerConfig
from broker.kafka import records
from broker.storage.leases import Leases
from broker.storage.logstore import LogStore
from broker.storage.metadata import MetadataStore
from broker.storage.objectstore import LocalObjectStore
from tests.postgres import PostgresServer


async def _run(logs: LogStore, args: argparse.Namespace, batch: bytes) -> dict[str, float]:
    parts = [logs.partitions[("t", p)] for p in range(args.partitions)]
    latencies: list[float] = []
    deadline = time.monotonic() + args.seconds

    async def producer(i: int) -> None:
        n = i
        while time.monotonic() < deadline:
            start = time.perf_counter()
            await logs.append_and_wait(parts[n % len(parts)], batch)
            latencies.append(time.perf_counter() - start)
            n += 1

    started = time.perf_counter()
    await asyncio.gather(*(producer(i) for i in range(args.producers)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "produce_mib_s": round(len(latencies) * len(batch) / MIB / elapsed, 1),
        "acks_s": round(len(latencies) / elapsed),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1),
        "segments": logs.segments_written,
    }


async def _sqlite(home: Path, args: argparse.Namespace, batch: bytes) -> dict[str, float]:
    config = BrokerConfig(home=home)
    metadata = MetadataStore(config.metadata_db)
    metadata.create_topic("t", args.partitions, {})
    logs = LogStore(config, metadata, LocalObjectStore(home / "objects"))
    await logs.open({"t": args.partitions})
    try:
        return await _run(logs, args, batch)
    finally:
        await logs.close()
        metadata.close()


async def _cluster(
    home: Path, uri: str, args: argparse.Namespace, batch: bytes
) -> dict[str, float]:
    config = BrokerConfig(home=home, metadata_uri=uri)
    metadata = MetadataStore(uri)
    metadata.create_topic("t", args.partitions, {})
    leases = Leases(metadata, 1, 600_000)  # no heartbeats needed within the run
    leases.register("bench", {}, None)
    logs = LogStore(config, metadata, LocalObjectStore(home / "objects"), node_id=1)
    await logs.open({})
    for p in range(args.partitions):
        epoch = leases.acquire("t", p)
        assert epoch is not None
        await logs.load_partition("t", p, epoch)
    logs.set_lease_deadline(time.monotonic() + 600)
    try:
        return await _run(logs, args, batch)
    finally:
        await logs.close()
        metadata.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-records", type=int, default=16)
    parser.add_argument("--record-bytes", type=int, default=1024)
    args = parser.parse_args()
    batch = records.encode_batch(
        [(None, b"x" * args.record_bytes)] * args.batch_records, int(time.time() * 1000)
    )
    postgres = PostgresServer().start()
    try:
        with tempfile.TemporaryDirectory(prefix="icefall-bench-") as tmp:
            sqlite = asyncio.run(_sqlite(Path(tmp) / "sqlite", args, batch))
            cluster = asyncio.run(
                _cluster(Path(tmp) / "cluster", postgres.create_database("bench"), args, batch)
            )
    finally:
        postgres.stop()
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "machine": machine(),
                "seconds": args.seconds,
                "producers": args.producers,
                "partitions": args.partitions,
                "batch_bytes": len(batch),
                "sqlite_wal": sqlite,
                "cluster_postgres_objectstore": cluster,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
