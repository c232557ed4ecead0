"""Resource limits, shared by tests/reliability and bench/reliability.py: one
broker with a 1,000-partition topic read by 200 concurrent real consumers
(aiokafka, one event loop, every consumer on its own connection), and the
broker's memory measured against a baseline taken in the same run (the same
broker with one partition and one client)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Producer

from tests.broker.clients import create_topic, read_partitions
from tests.support import BrokerProcess

MIB = 1024 * 1024


@dataclass
class ResourceRun:
    partitions: int
    connections: int
    records: int
    baseline_rss_mib: float = 0.0  # one partition, one client, after producing and reading it
    peak_rss_mib: float = 0.0  # VmHWM of the broker at the end of the run
    rss_with_all_connected_mib: float = 0.0
    broker_connections_seen: int = (
        0  # established sockets on the Kafka port, counted from the broker's side
    )
    produce_s: float = 0.0
    consume_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(rest.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def _kafka_connections(broker: BrokerProcess) -> int:
    assert broker.proc is not None
    return sum(
        1
        for c in psutil.Process(broker.proc.pid).net_connections("tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == broker.kafka_port
    )


def produce_values(broker: BrokerProcess, topic: str, partitions: int, per_partition: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
            "log_level": 0,
        }
    )
    failures: list[str] = []

    def done(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    for i in range(per_partition):
        for p in range(partitions):
            while True:
                try:
                    producer.produce(
                        topic, value=f"{p}:{i}".encode(), partition=p, on_delivery=done
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0, "deliveries never settled"
    assert not failures, failures[:5]


async def _consume_all(
    broker: BrokerProcess,
    topic: str,
    partitions: int,
    connections: int,
    per_partition: int,
    run: ResourceRun,
) -> None:
    """``connections`` consumers, consumer c assigned partitions c, c + connections, ...;
    each reads its partitions to the end and checks every value at its offset."""
    consumers = [
        AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id=f"wide-{c}",
            connections_max_idle_ms=600_000,
        )
        for c in range(connections)
    ]
    started: list[AIOKafkaConsumer] = []
    try:
        for consumer in consumers:
            await consumer.start()
            started.append(consumer)

        async def read(c: int, consumer: AIOKafkaConsumer) -> None:
            mine = [TopicPartition(topic, p) for p in range(c, partitions, connections)]
            consumer.assign(mine)
            await consumer.seek_to_beginning(*mine)
            want = {tp.partition: 0 for tp in mine}
            deadline = time.monotonic() + 180
            while any(n < per_partition for n in want.values()):
                assert time.monotonic() < deadline, f"consumer {c} stuck at {want}"
                batches = await consumer.getmany(timeout_ms=500, max_records=5000)
                for tp, msgs in batches.items():
                    for msg in msgs:
                        expected = f"{tp.partition}:{want[tp.partition]}".encode()
                        assert msg.offset == want[tp.partition] and msg.value == expected, (
                            tp,
                            msg.offset,
                            msg.value,
                        )
                        want[tp.partition] += 1

        readers = [asyncio.create_task(read(c, consumer)) for c, consumer in enumerate(consumers)]
        # every consumer is connected and fetching: count the sockets and the memory now
        await asyncio.sleep(0)
        peak_conns = 0
        while not all(r.done() for r in readers):
            peak_conns = max(peak_conns, _kafka_connections(broker))
            assert broker.proc is not None
            run.rss_with_all_connected_mib = max(
                run.rss_with_all_connected_mib, memory_mib(broker.proc.pid)[0]
            )
            await asyncio.wait(readers, timeout=0.5)
        for r in readers:
            r.result()
        run.broker_connections_seen = max(peak_conns, _kafka_connections(broker))
    finally:
        await asyncio.gather(*(c.stop() for c in started), return_exceptions=True)


def run_wide(
    broker: BrokerProcess,
    *,
    partitions: int = 1000,
    connections: int = 200,
    per_partition: int = 20,
) -> ResourceRun:
    assert broker.proc is not None
    run = ResourceRun(partitions, connections, partitions * per_partition)
    create_topic(broker.bootstrap, "narrow", 1)
    produce_values(broker, "narrow", 1, per_partition * 50)
    assert len(read_partitions(broker.bootstrap, "narrow", 1)[0]) == per_partition * 50
    run.baseline_rss_mib = round(memory_mib(broker.proc.pid)[0], 1)
    create_topic(broker.bootstrap, "wide", partitions)
    started = time.monotonic()
    produce_values(broker, "wide", partitions, per_partition)
    run.produce_s = round(time.monotonic() - started, 1)
    started = time.monotonic()
    asyncio.run(_consume_all(broker, "wide", partitions, connections, per_partition, run))
    run.consume_s = round(time.monotonic() - started, 1)
    run.rss_with_all_connected_mib = round(run.rss_with_all_connected_mib, 1)
    run.peak_rss_mib = round(memory_mib(broker.proc.pid)[1], 1)
    return run
