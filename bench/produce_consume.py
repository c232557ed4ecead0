"""Produce and consume throughput of the broker against a limit measured in the same run.

Limit: the same bytes sent over a loopback socket in 1 MiB messages, written
sequentially to a file and fdatasync'd per message before a 1-byte ack (what an
acks=all produce must at least do). Produce: confluent-kafka, acks=all,
1 MiB batches of 1 KiB records. Consume: confluent-kafka from the beginning.

    .venv/bin/python bench/produce_consume.py [--mib 512] [--partitions 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import MIB, produce_when_room
from tests.support import BrokerProcess


def loopback_fsync_limit(total: int, chunk: int, directory: Path) -> float:
    """MiB/s of socket copy + sequential fdatasync'd write of ``total`` bytes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    path = directory / "limit.bin"

    def receive() -> None:
        conn, _ = server.accept()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        buf = bytearray(chunk)
        view = memoryview(buf)
        try:
            received_total = 0
            while received_total < total:
                got = 0
                while got < chunk:
                    n = conn.recv_into(view[got:], chunk - got)
                    if n == 0:
                        return
                    got += n
                os.write(fd, view[:got])
                os.fdatasync(fd)
                conn.sendall(b"k")
                received_total += got
        finally:
            os.close(fd)
            conn.close()

    thread = threading.Thread(target=receive)
    thread.start()
    client = socket.create_connection(("127.0.0.1", port))
    payload = os.urandom(chunk)
    start = time.perf_counter()
    in_flight = 0
    sent = 0
    while sent < total:
        client.sendall(payload)
        sent += chunk
        in_flight += 1
        if in_flight >= 5:  # like max.in.flight.requests.per.connection=5
            client.recv(1)
            in_flight -= 1
    while in_flight:
        in_flight -= len(client.recv(in_flight))
    elapsed = time.perf_counter() - start
    thread.join()
    client.close()
    server.close()
    path.unlink()
    return total / MIB / elapsed


def produce(bootstrap: str, topic: str, total: int, record_size: int) -> tuple[float, int]:
    from confluent_kafka import Producer

    failures: list[object] = []
    producer = Producer(
        {
            "on_delivery": lambda err, msg: err and failures.append(err),
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": MIB,
            "batch.num.messages": 1_000_000,
            "message.max.bytes": 2 * MIB,
            "queue.buffering.max.kbytes": 1024 * 1024,
            "queue.buffering.max.messages": 10_000_000,
            "compression.type": "none",
        }
    )
    value = os.urandom(record_size)
    count = total // record_size
    start = time.perf_counter()
    for i in range(count):
        produce_when_room(producer, topic, value)
        if i % 10000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0
    elapsed = time.perf_counter() - start
    assert not failures, failures[:3]
    return count * record_size / MIB / elapsed, count


def consume(bootstrap: str, topic: str, count: int) -> float:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 64 * MIB,
            "max.partition.fetch.bytes": 16 * MIB,
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got = 0
    size = 0
    start = None
    deadline = time.monotonic() + 600
    while got < count and time.monotonic() < deadline:
        for msg in consumer.consume(10000, 1.0):
            if msg.error():
                continue
            if start is None:
                start = time.perf_counter()
            got += 1
            size += len(msg.value())
    elapsed = time.perf_counter() - (start or time.perf_counter())
    consumer.close()
    assert got == count, f"consumed {got} of {count}"
    return size / MIB / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--record-bytes", type=int, default=1024)
    args = parser.parse_args()
    total = args.mib * MIB
    with tempfile.TemporaryDirectory(dir=Path.home()) as tmp:
        limit = loopback_fsync_limit(total, MIB, Path(tmp))
        broker = BrokerProcess(Path(tmp) / "home").start()
        try:
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            for f in admin.create_topics(
                [NewTopic("bench", args.partitions, 1, config={"max.message.bytes": str(2 * MIB)})]
            ).values():
                f.result(10)
            produce_mibs, count = produce(broker.bootstrap, "bench", total, args.record_bytes)
            consume_mibs = consume(broker.bootstrap, "bench", count)
        finally:
            broker.stop()
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} {os.cpu_count()} cores {platform.machine()}",
        "mib": args.mib,
        "partitions": args.partitions,
        "record_bytes": args.record_bytes,
        "limit_mib_s": round(limit, 1),
        "produce_mib_s": round(produce_mibs, 1),
        "produce_vs_limit": round(produce_mibs / limit, 2),
        "consume_mib_s": round(consume_mibs, 1),
        "consume_vs_limit": round(consume_mibs / limit, 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
