"""Produce throughput of a cluster (issue 16, items 2 and 4): the same client load against one
broker process, two and three broker processes of one cluster, and the single SQLite broker
(local fsync'd WAL) as the reference, all started and stopped here, in the same run.

Sides (each on a fresh database and object-store directory, one after the other):

- ``sqlite``    one broker, SQLite metadata, acks after the local WAL's fsync (the default);
- ``cluster-1`` one cluster member (Postgres metadata, acks after the segment object is in the
                object store and its chunks are in the Postgres index);
- ``cluster-2`` two members of one cluster, the partitions shared between them;
- ``cluster-3`` three members.

Item 4 ("more cores") is cluster-2 vs cluster-1 (and vs sqlite); item 2 ("what acks through
the object store cost") is cluster-1 and cluster-3 vs sqlite. The log-store-level view of the
second (no Kafka protocol, no client, in-process) is ``bench/cluster_acks.py``.

Client load: ``--producers`` confluent-kafka producers in separate processes (acks=all,
librdkafka's default idempotence off, 1 KiB records, ``linger.ms`` 5), together ``--records``
records over ``--partitions`` partitions, started together once every partition has a leader.
Reported: MiB/s and records/s from the first send to the last ack, p50/p99 ack latency
(librdkafka's per-message latency, produce() to delivery report), broker CPU seconds per GiB
acknowledged (all broker processes of the side), Postgres CPU seconds per GiB (cluster sides).
At full speed the ack latency is mostly time in the client's queue; so each side also runs a
paced load (``--rate`` records/s in all, for ``--paced-seconds``) below every side's
throughput, whose p50/p99 is the latency of the acks themselves.

Postgres is a fresh server from ``tests/postgres.py`` (fsync off: it measures the broker's
path, not Postgres's disk); the object store is a local directory, or moto's S3 server with
``--s3``. Everything shares this machine's cores with the clients.

    .venv/bin/python bench/cluster.py --quick      # about a minute; the last line is a ratio
    .venv/bin/python bench/cluster.py [--records 1000000] [--producers 4] [--partitions 12] [--rate 10000] [--s3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    MIB,
    interrupt_on_sigterm,
    machine,
    pid_cpu_seconds,
    produce_when_room,
)
from tests.postgres import PostgresServer
from tests.support import BrokerProcess, ClusterBrokerProcess, wait_for

GIB = 1024 * MIB
SIDES = ("sqlite", "cluster-1", "cluster-2", "cluster-3")


def producer_process(
    bootstrap: str,
    topic: str,
    count: int,
    record_bytes: int,
    rate: float,
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    """One client process: connect, wait for ``go``, produce ``count`` records (at ``rate``
    records/s, or as fast as the client queue takes them when 0), report."""
    from confluent_kafka import Producer

    latencies: list[float] = []
    failed: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            latencies.append(msg.latency())
        else:
            failed.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": MIB,
            "message.timeout.ms": 120000,
            "queue.buffering.max.kbytes": 256 * 1024,
            "compression.type": "none",
            "on_delivery": on_delivery,
        }
    )
    producer.list_topics(topic, timeout=30)  # connected, metadata known
    ready.put(os.getpid())
    go.wait()
    value = os.urandom(record_bytes)
    start = time.monotonic()
    interval = 1 / rate if rate else 0.0
    for i in range(count):
        if interval:
            due = start + i * interval
            while (ahead := due - time.monotonic()) > 0:
                producer.poll(ahead)  # serves delivery reports while it waits
        produce_when_room(producer, topic, value)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    end = time.monotonic()
    results.put(
        {
            "start": start,
            "end": end,
            "acked": len(latencies),
            "failed": len(failed) + left,
            "errors": failed[:3],
            "latencies": latencies,
        }
    )


@dataclass
class Side:
    name: str
    brokers: list[BrokerProcess]
    postgres_pid: int | None = None

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)


def _leaders(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    found = md.topics[topic]
    if found.error is not None:
        return {}
    return {p: found.partitions[p].leader for p in found.partitions}


def wait_spread(side: Side, topic: str, partitions: int) -> dict[int, int]:
    """Every partition led, by every broker of the side, the same answer from each broker."""
    nodes = {getattr(b, "node_id", 0) for b in side.brokers}

    def spread() -> dict[int, int] | None:
        seen = [_leaders(b.bootstrap, topic) for b in side.brokers]
        first = seen[0]
        if len(first) != partitions or any(s != first for s in seen):
            return None
        if len(side.brokers) > 1 and set(first.values()) != nodes:
            return None
        return first if all(n >= 0 for n in first.values()) else None

    return wait_for(spread, 90, 0.3, f"{topic}'s {partitions} partitions led by {sorted(nodes)}")


def _tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants (Postgres: postmaster + backends)."""
    from bench._common import _parents, _tree  # the /proc walk stop_processes uses

    return sum(pid_cpu_seconds(pid) for pid in _tree({root}, _parents()))


def run_load(
    side: Side, args: argparse.Namespace, records: int, rate: float = 0.0
) -> dict[str, Any]:
    """``records`` over ``args.producers`` processes, each at ``rate / producers`` records/s
    (0: as fast as it can) to a fresh topic of ``args.partitions`` partitions."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"load-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": side.brokers[0].bootstrap})
    for f in admin.create_topics([NewTopic(topic, args.partitions, 1)]).values():
        f.result(30)
    led = wait_spread(side, topic, args.partitions)
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    per = records // args.producers
    procs = [
        ctx.Process(
            target=producer_process,
            args=(
                side.bootstrap,
                topic,
                per,
                args.record_bytes,
                rate / args.producers,
                ready,
                go,
                results,
            ),
        )
        for _ in range(args.producers)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=60)
        broker_cpu0 = sum(pid_cpu_seconds(b.proc.pid) for b in side.brokers if b.proc)
        pg_cpu0 = _tree_cpu(side.postgres_pid) if side.postgres_pid else 0.0
        load0 = os.getloadavg()[0]
        go.set()
        outs = [results.get(timeout=600) for _ in procs]
        broker_cpu = sum(pid_cpu_seconds(b.proc.pid) for b in side.brokers if b.proc) - broker_cpu0
        pg_cpu = (_tree_cpu(side.postgres_pid) - pg_cpu0) if side.postgres_pid else None
        load1 = os.getloadavg()[0]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    acked = sum(o["acked"] for o in outs)
    failed = sum(o["failed"] for o in outs)
    elapsed = max(o["end"] for o in outs) - min(o["start"] for o in outs)
    lat = sorted(x for o in outs for x in o["latencies"])
    gib = acked * args.record_bytes / GIB
    return {
        "side": side.name,
        "brokers": len(side.brokers),
        "leaders": sorted(set(led.values())),
        "records": acked,
        "failed": failed,
        "errors": [e for o in outs for e in o["errors"]][:3],
        "seconds": round(elapsed, 2),
        "mib_s": round(acked * args.record_bytes / MIB / elapsed, 1),
        "records_s": round(acked / elapsed),
        "p50_ms": round(lat[len(lat) // 2] * 1000, 1) if lat else None,
        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 1) if lat else None,
        "broker_cpu_s_per_gib": round(broker_cpu / gib, 1) if gib else None,
        "postgres_cpu_s_per_gib": round(pg_cpu / gib, 1) if gib and pg_cpu is not None else None,
        "loadavg_1m": [round(load0, 1), round(load1, 1)],
    }


def _postmaster_pid(postgres: PostgresServer) -> int:
    return int((postgres.data / "postmaster.pid").read_text().splitlines()[0])


@contextmanager
def start_side(
    name: str,
    work: Path,
    postgres: PostgresServer,
    store: str,
    env: dict[str, str] | None,
    args: argparse.Namespace,
) -> Iterator[Side]:
    home = work / name
    home.mkdir()
    brokers: list[BrokerProcess] = []
    side = Side(name, brokers)
    try:
        if name == "sqlite":
            brokers.append(BrokerProcess(home / "broker", ["--object-store", store], env).start())
        else:
            uri = postgres.create_database(name.replace("-", "_"))
            side.postgres_pid = _postmaster_pid(postgres)
            for node_id in range(1, int(name.rsplit("-", 1)[1]) + 1):
                broker = ClusterBrokerProcess(
                    home / f"node{node_id}",
                    node_id,
                    uri,
                    store,
                    lease_ms=args.lease_ms,
                    heartbeat_ms=args.heartbeat_ms,
                    env=env,
                )
                brokers.append(broker)
                broker.start()
        yield side
    finally:
        for b in brokers:
            try:
                b.stop()
            except Exception as exc:  # noqa: BLE001 - the others are stopped still
                print(f"stopping a broker of {name}: {exc!r}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small load, about a minute")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument(
        "--rate", type=float, default=10_000, help="records/s of all producers in the paced run"
    )
    parser.add_argument("--paced-seconds", type=float, default=15)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--s3", action="store_true", help="object store on moto's S3 server")
    parser.add_argument("--lease-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-ms", type=int, default=1000)
    args = parser.parse_args()
    if args.quick:
        args.records = min(args.records, 100_000)
        args.paced_seconds = min(args.paced_seconds, 3)
        args.sides = "cluster-1,cluster-2" if args.sides == ",".join(SIDES) else args.sides
    sides = args.sides.split(",")
    assert set(sides) <= set(SIDES), sides
    interrupt_on_sigterm()
    summary: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": " ".join(sys.argv),
        "records": args.records,
        "record_bytes": args.record_bytes,
        "producers": args.producers,
        "partitions": args.partitions,
        "object_store": "s3 (moto)" if args.s3 else "local directory",
        "paced_rate": args.rate,
        "results": [],
        "paced": [],
    }
    with tempfile.TemporaryDirectory(prefix="icefall-cluster-bench-", dir=Path.home()) as tmp:
        work = Path(tmp)
        postgres = PostgresServer().start()
        moto = None
        try:
            if args.s3:
                from tests.conftest import MotoS3

                moto = MotoS3(work / "moto.log")
                moto.wait_ready()
            for name in sides:
                env = None
                store = str(work / f"{name}-objects")
                if moto is not None:
                    bucket = f"bench-{uuid.uuid4().hex[:10]}"
                    moto.client().create_bucket(Bucket=bucket)
                    store, env = f"s3://{bucket}/{name}", moto.env()
                with start_side(name, work, postgres, store, env, args) as side:
                    result = run_load(side, args, args.records)
                    print(json.dumps(result), flush=True)
                    paced = run_load(side, args, int(args.rate * args.paced_seconds), args.rate)
                    print(json.dumps({"paced": paced}), flush=True)
                summary["results"].append(result)
                summary["paced"].append(paced)
        finally:
            if moto is not None:
                moto.stop()
            postgres.stop()
    by = {r["side"]: r for r in summary["results"]}
    print(json.dumps(summary, indent=2))
    print()
    print(
        "| side | brokers | MiB/s | records/s | p50 ms | p99 ms | broker CPU-s/GiB | "
        "Postgres CPU-s/GiB | load 1m |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in summary["results"]:
        print(
            f"| {r['side']} | {r['brokers']} | {r['mib_s']} | {r['records_s']:,} | {r['p50_ms']} "
            f"| {r['p99_ms']} | {r['broker_cpu_s_per_gib']} | "
            f"{r['postgres_cpu_s_per_gib'] if r['postgres_cpu_s_per_gib'] is not None else '—'} "
            f"| {r['loadavg_1m'][0]}-{r['loadavg_1m'][1]} |"
        )
    print()
    print(f"Paced at {args.rate:,.0f} records/s ({args.paced_seconds:g} s):")
    print("| side | brokers | records/s reached | p50 ms | p99 ms | broker CPU-s/GiB |")
    print("|---|---|---|---|---|---|")
    for r in summary["paced"]:
        print(
            f"| {r['side']} | {r['brokers']} | {r['records_s']:,} | {r['p50_ms']} | "
            f"{r['p99_ms']} | {r['broker_cpu_s_per_gib']} |"
        )
    if "cluster-1" in by and "cluster-2" in by:
        ratio = by["cluster-2"]["mib_s"] / by["cluster-1"]["mib_s"]
        print(f"2 brokers / 1 broker produce throughput: {ratio:.2f}")


if __name__ == "__main__":
    main()
