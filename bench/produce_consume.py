"""Produce and consume throughput of the broker against a limit measured in the same run.

Limit: the same bytes sent over a loopback socket in 1 MiB messages, written
sequentially to a file and fdatasync'd per message before a 1-byte ack (what an
acks=all produce must at least do). Produce: confluent-kafka, acks=all,
1 MiB batches of 1 KiB records. Consume: confluent-kafka from the beginning. Both are
bench/_common.py's ``confluent_produce`` and ``confluent_consume`` (bench/vs_kafka.py's too).

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

from bench._common import MIB, confluent_consume, confluent_produce
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


# 1 MiB batches (the topic takes 2 MiB messages); the rest is _common's benchmark client
PRODUCER_SETTINGS = {
    "acks": "all",
    "linger.ms": 20,
    "batch.size": MIB,
    "message.max.bytes": 2 * MIB,
}


def produce(bootstrap: str, topic: str, total: int, record_size: int) -> tuple[float, int]:
    """MiB/s of ``total`` bytes in ``record_size`` records, and the record count."""
    run = confluent_produce(bootstrap, topic, total // record_size, record_size, PRODUCER_SETTINGS)
    return run.mib_s, run.records


def consume(bootstrap: str, topic: str, count: int) -> float:
    """MiB/s of reading the ``count`` records back from the start."""
    return confluent_consume(bootstrap, topic, count).mib_s


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
