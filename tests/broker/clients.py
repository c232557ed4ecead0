"""Kafka client helpers for the durability, object store and cluster tests: a producer
that keeps producing from a background thread and remembers exactly what was
acknowledged (and, timed, when a partition first acknowledged after a kill), a consumer
group member in a thread, a reader that takes whole partitions from offset 0, and the
checks that tie them together."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support import wait_for


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(10)


@dataclass
class ContinuousProducer:
    """Produces ``{name}-{n}`` values (key ``n``) until stopped. Only records
    whose delivery report carries no error count, with their partition and
    offset: that is what the broker acknowledged."""

    bootstrap: str
    topic: str
    name: str
    conf: dict[str, Any] = field(default_factory=dict)
    max_in_flight: int = 1000
    rate: float = (
        4000.0  # records per second at most, to keep the logs small enough to read back quickly
    )
    acked: dict[str, tuple[int, int]] = field(default_factory=dict)  # value -> (partition, offset)
    failed: list[str] = field(default_factory=list)
    produced: int = 0
    unfinished: int = -1  # messages flush() could not settle at the end
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"producer-{self.name}", daemon=True)

    def start(self) -> ContinuousProducer:
        self._thread.start()
        return self

    @property
    def acked_count(self) -> int:
        return len(self.acked)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            value = msg.value().decode()
            assert value not in self.acked, f"{value} acknowledged twice"
            self.acked[value] = (msg.partition(), msg.offset())
        else:
            self.failed.append(str(err))

    def _run(self) -> None:
        try:
            producer = Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "acks": "all",
                    "linger.ms": 2,
                    "message.timeout.ms": 30000,
                    "reconnect.backoff.ms": 50,
                    "reconnect.backoff.max.ms": 500,
                    **self.conf,
                }
            )
            n = 0
            next_at = time.monotonic()
            while not self._stop.is_set():
                now = time.monotonic()
                next_at = max(
                    next_at, now - 0.05
                )  # no catching up after a stall: at most a small burst
                ahead = next_at - now
                if (
                    ahead > 0
                    or self.produced - len(self.acked) - len(self.failed) >= self.max_in_flight
                ):
                    producer.poll(min(max(ahead, 0.001), 0.05))  # serves delivery reports meanwhile
                    continue
                next_at += 1 / self.rate
                try:
                    producer.produce(
                        self.topic,
                        key=str(n).encode(),
                        value=f"{self.name}-{n}".encode(),
                        on_delivery=self._on_delivery,
                    )
                except BufferError:
                    producer.poll(0.05)
                    continue
                n += 1
                self.produced = n
                producer.poll(0)
            self.unfinished = producer.flush(40)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        """Stop producing and wait for every outstanding delivery report."""
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), f"producer {self.name} did not finish"
        if self.error is not None:
            raise self.error
        assert self.unfinished == 0, (
            f"producer {self.name}: {self.unfinished} deliveries never settled"
        )
        assert len(self.acked) + len(self.failed) == self.produced


class TimedProducer(ContinuousProducer):
    """A ContinuousProducer that notes, per partition, when a record produced after ``mark``
    was first acknowledged (seconds after the mark): a failover's time, as a client sees it
    (tests/broker/test_cluster.py, tests/reliability/cluster_kills.py)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.marked_at: float | None = None
        self.first_after: dict[int, float] = {}

    def mark(self, at: float) -> None:
        self.first_after = {}
        self.marked_at = at

    def _on_delivery(self, err: Any, msg: Any) -> None:
        super()._on_delivery(err, msg)
        if err is None and self.marked_at is not None:
            now = time.monotonic()
            produced_at = now - msg.latency()
            if produced_at >= self.marked_at and msg.partition() not in self.first_after:
                self.first_after[msg.partition()] = now - self.marked_at


class GroupReader:
    """One consumer group member (subscribed to ``topic``) in a thread: every value it got,
    and per partition when it first got a value that ``is_new`` (``watch``: produced after a
    kill, say)."""

    def __init__(
        self, bootstrap: str, topic: str, group: str, conf: dict[str, Any] | None = None
    ) -> None:
        self.values: set[str] = set()
        self.errors: list[str] = []
        self.is_new: Callable[[str], bool] | None = None
        self.since: float = 0.0
        self.first_new: dict[int, float] = {}
        self._stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 200,
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 500,
                **(conf or {}),
            }
        )
        self.consumer.subscribe([topic])
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def watch(self, is_new: Callable[[str], bool], since: float) -> None:
        self.first_new = {}
        self.since = since
        self.is_new = is_new

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self.consumer.consume(500, 0.2):
                error, value = msg.error(), msg.value()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        self.errors.append(str(error))
                    continue
                if value is None:
                    continue
                text = value.decode()
                self.values.add(text)
                p = msg.partition()
                new = self.is_new is not None and self.is_new(text)
                if new and p is not None and p not in self.first_new:
                    self.first_new[p] = time.monotonic() - self.since

    def halt(self) -> None:
        """Stop consuming (the consumer stays open: its committed offsets can be asked)."""
        self._stop.set()
        self.thread.join(30)

    def stop(self) -> None:
        self.halt()
        self.consumer.close()


def stop_all(producers: Sequence[ContinuousProducer]) -> None:
    """Stop every producer, even when one of them fails; re-raise the first failure."""
    first: BaseException | None = None
    for producer in producers:
        try:
            producer.stop()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            first = first or exc
    if first is not None:
        raise first


Log = dict[int, list[tuple[int, bytes | None]]]  # partition -> [(offset, value)] in fetch order


def high_watermark(consumer: Consumer, topic: str, partition: int, timeout: float) -> int:
    """The partition's high watermark. librdkafka's ``get_watermark_offsets`` raises at once
    when the broker it asks no longer leads the partition (a lease lapsed while the cluster's
    database was away, a broker restarted) and refreshes its metadata meanwhile: asked again,
    as a Kafka client retries, until ``timeout`` (then the last error is reported).
    A partition missing from its cached metadata of the topic is "Unknown partition" to it, at
    once, until that cache is refreshed: hence the short refresh interval of ``read_partitions``
    (seen once in CI after a Postgres outage of the cluster, for 60 s)."""

    def ask() -> tuple[int]:  # a tuple: a high watermark of 0 is an answer too
        return (consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1],)

    return wait_for(ask, timeout, 0.2, what=f"the high watermark of {topic}-{partition}")[0]


def read_partitions(bootstrap: str, topic: str, partitions: int, timeout: float = 30) -> Log:
    """Every record of every partition, from offset 0 up to the high watermark."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            # cached metadata without a partition is refreshed within a second, not after
            # librdkafka's default five minutes
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    try:
        ends = {p: high_watermark(consumer, topic, p, timeout) for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: Log = {p: [] for p in range(partitions)}

        def done() -> bool:
            for msg in consumer.consume(1000, 0.2):
                if msg.error():
                    raise AssertionError(f"consumer error: {msg.error()}")
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None
                got[partition].append((offset, msg.value()))
            return all(ends[p] == 0 or (got[p] and got[p][-1][0] >= ends[p] - 1) for p in got)

        wait_for(done, timeout, interval=0, what=f"{topic} up to its high watermarks {ends}")
    finally:
        consumer.close()
    return got


def verify_log(log: Log, producers: list[ContinuousProducer]) -> None:
    """Offsets contiguous from 0, no value twice, every acknowledged record at
    its acknowledged partition and offset, nothing that was never produced."""
    for p, entries in log.items():
        offsets = [o for o, _ in entries]
        assert offsets == list(range(len(offsets))), (
            f"partition {p}: offsets are not contiguous from 0"
        )
    values = Counter(
        v.decode() if v is not None else None for entries in log.values() for _, v in entries
    )
    twice = [v for v, n in values.items() if n > 1]
    assert not twice, f"{len(twice)} records present more than once, e.g. {twice[:5]}"
    known = {pr.name: pr.produced for pr in producers}
    for value in values:
        assert value is not None
        name, _, n = value.rpartition("-")
        assert name in known and int(n) < known[name], f"unexpected record {value!r}"
    for producer in producers:
        assert producer.acked, f"producer {producer.name} got no acknowledgement at all"
        missing = []
        for value, (p, offset) in producer.acked.items():
            entries = log.get(p, [])
            if offset >= len(entries) or entries[offset][1] != value.encode():
                missing.append(
                    (value, p, offset, entries[offset][1] if offset < len(entries) else None)
                )
        assert not missing, (
            f"producer {producer.name}: {len(missing)} of {len(producer.acked)} acknowledged records are not "
            f"at their acknowledged offset, e.g. (value, partition, offset, found) {missing[:5]}"
        )
