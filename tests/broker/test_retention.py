"""Segment retention (issue 7): retention.ms and retention.bytes delete old
segment data, Kafka clients see the log start move, a table topic keeps
everything its table has not committed, and nothing a restart needs is deleted.

Real broker processes and real clients (confluent-kafka, pyiceberg over the REST
catalog), plus in-process tests of the policy and of what a pass records."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from broker import checkpoint
from broker.checkpoint import Checkpoint
from broker.cluster import Cluster, Topic
from broker.config import BrokerConfig
from broker.kafka import records
from broker.storage.logstore import LogStore
from broker.storage.metadata import MetadataStore
from broker.storage.objectstore import LocalObjectStore
from broker.storage.retention import (
    Policy,
    Retention,
    committed_chunks,
    committed_offsets,
    expired_chunks,
)
from tests.support import BrokerProcess, wait_for

FAST = ["--segment-flush-ms", "600000", "--retention-check-interval-ms", "200"]
HOUR_MS = 3_600_000


# ---------------------------------------------------------------- helpers


def _create(bootstrap: str, name: str, configs: dict[str, str], partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=configs)]).values():
        future.result(10)


def _alter(bootstrap: str, name: str, key: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        "topic",
        name,
        incremental_configs=[ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)


def _produce(
    bootstrap: str, topic: str, count: int, *, timestamp_ms: int = 0, size: int = 10
) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 0, "compression.type": "none"}
    )
    for i in range(count):
        producer.produce(
            topic, value=str(i).encode().ljust(size, b"."), partition=0, timestamp=timestamp_ms
        )
        producer.flush(10)  # one batch per record: byte sizes stay predictable
    assert producer.flush(10) == 0


def _produce_segment(broker: BrokerProcess, topic: str, count: int, **kwargs: Any) -> str:
    """Produce ``count`` records and flush them into a new segment object; returns its key."""
    before = _objects(broker)
    _produce(broker.bootstrap, topic, count, **kwargs)
    broker.admin("/v1/flush", "POST")
    (key,) = _objects(broker) - before
    return key


def _objects(broker: BrokerProcess) -> set[str]:
    root = broker.home / "objects"
    return {str(p.relative_to(root)) for p in (root / "segments").glob("*.seg")}


def _partition(broker: BrokerProcess, topic: str) -> dict[str, Any]:
    data = broker.admin(f"/v1/topics/{topic}/offsets")
    part: dict[str, Any] = data["partitions"][0]
    return part


def _watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    """ListOffsets earliest and latest, as a Kafka client asks for them."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, 0), timeout=10, cached=False
        )
        return int(low), int(high)
    finally:
        consumer.close()


def _consume(
    bootstrap: str, topic: str, offset: int, reset: str, until: int
) -> list[int] | KafkaError:
    """Offsets read from ``offset`` up to ``until``, or the error the consumer got."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{time.monotonic_ns()}",
            "auto.offset.reset": reset,
            "enable.auto.commit": False,
        }
    )
    got: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + 20
        while (not got or got[-1] < until - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                return error
            offset_read = msg.offset()
            assert offset_read is not None
            got.append(offset_read)
        return got
    finally:
        consumer.close()


def _log_start(broker: BrokerProcess, topic: str, offset: int) -> Callable[[], bool]:
    return lambda: _partition(broker, topic)["log_start_offset"] == offset


# ---------------------------------------------------------------- retention.ms / retention.bytes


def test_retention_ms_deletes_old_segments_and_clients_see_the_new_log_start(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(FAST)
    topic = "clicks"
    _create(broker.bootstrap, topic, {"retention.ms": str(HOUR_MS), "file.delete.delay.ms": "0"})
    old = _produce_segment(broker, topic, 5, timestamp_ms=int(time.time() * 1000) - 2 * HOUR_MS)
    new = _produce_segment(broker, topic, 5)

    wait_for(
        _log_start(broker, topic, 5), 20, what="the log start to move past the expired segment"
    )
    wait_for(
        lambda: old not in _objects(broker), 20, what="the expired segment object to be deleted"
    )
    assert new in _objects(broker)
    assert _watermarks(broker.bootstrap, topic) == (5, 10)
    error = _consume(broker.bootstrap, topic, 0, "error", 10)
    # OFFSET_OUT_OF_RANGE from the broker; with auto.offset.reset=error librdkafka reports it so
    assert isinstance(error, KafkaError) and error.code() == KafkaError._AUTO_OFFSET_RESET, error
    assert _consume(broker.bootstrap, topic, 0, "earliest", 10) == [5, 6, 7, 8, 9]

    broker.stop()  # the new log start is durable, and nothing the index needs is gone
    broker.start()
    assert _watermarks(broker.bootstrap, topic) == (5, 10)
    assert _consume(broker.bootstrap, topic, 5, "error", 10) == [5, 6, 7, 8, 9]
    _produce(broker.bootstrap, topic, 1)
    assert _watermarks(broker.bootstrap, topic) == (5, 11)


def test_retention_bytes_keeps_the_newest_bytes_of_each_partition(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(FAST)
    topic = "sized"
    _create(broker.bootstrap, topic, {"file.delete.delay.ms": "0"})
    keys = [_produce_segment(broker, topic, 4, size=500) for _ in range(3)]
    ranges: list[dict[str, int]] = broker.admin(
        f"/v1/topics/{topic}/partitions/0/ranges?start=0&end=12"
    )["ranges"]
    sizes = [r["byte_end"] - r["byte_start"] for r in ranges]
    assert len(sizes) == 3

    # room for the newest segment and half the one before: only the oldest may go
    _alter(broker.bootstrap, topic, "retention.bytes", str(sizes[2] + sizes[1] // 2))
    wait_for(_log_start(broker, topic, 4), 20, what="retention.bytes to drop the oldest segment")
    wait_for(lambda: keys[0] not in _objects(broker), 20, what="the oldest object to be deleted")
    assert keys[1] in _objects(broker) and keys[2] in _objects(broker)
    assert _consume(broker.bootstrap, topic, 4, "error", 12) == list(range(4, 12))

    _alter(broker.bootstrap, topic, "retention.bytes", "-1")  # unlimited again: nothing more goes
    _produce_segment(broker, topic, 1)
    assert _partition(broker, topic)["log_start_offset"] == 4


# ---------------------------------------------------------------- table topics


def test_a_table_topic_keeps_every_segment_its_table_has_not_committed(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(FAST)
    topic = "orders.raw"  # table default.orders_raw
    _create(
        broker.bootstrap,
        topic,
        {
            "automq.table.topic.enable": "true",
            "automq.table.topic.convert.value.type": "raw",
            "retention.ms": "0",
            "file.delete.delay.ms": "0",
        },
    )
    keys = [_produce_segment(broker, topic, 4) for _ in range(3)]

    # everything is past retention.ms, but there is no table yet: nothing goes, and the broker says so
    wait_for(
        lambda: f"retention of table topic {topic}-0 is held back" in broker.log_text(),
        20,
        what="the held-back warning",
    )
    assert _partition(broker, topic)["log_start_offset"] == 0
    assert set(keys) <= _objects(broker)
    assert _consume(broker.bootstrap, topic, 0, "error", 12) == list(range(12))
    # ... and counts it: the admin API and a Prometheus gauge say how much waits for the table
    wait_for(
        lambda: [b["blocked_offsets"] for b in broker.admin("/v1/retention")["blocked"]] == [12],
        20,
        what="a pass over all three segments",
    )
    [held] = broker.admin("/v1/retention")["blocked"]
    assert (
        held["topic"],
        held["partition"],
        held["blocked_offsets"],
        held["committed_offset"],
    ) == (topic, 0, 12, 0)
    assert held["blocked_bytes"] > 0
    assert f'icefall_retention_held_back_offsets{{topic="{topic}",partition="0"}} 12\n' in _metrics(
        broker
    )

    # a commit round took offsets [0, 8): the first two segments may go, the third stays
    catalog = load_catalog("retention", type="rest", uri=broker.catalog_url)
    catalog.create_namespace("default")
    table = catalog.create_table(
        "default.orders_raw", Schema(NestedField(1, "id", LongType(), required=False))
    )
    topic_id = _topic_id(broker, topic)
    table.append(
        pa.table({"id": pa.array(range(8), pa.int64())}),
        snapshot_properties={
            checkpoint.OFFSETS: checkpoint.encode_offsets({0: 8}),
            checkpoint.TOPIC_ID: topic_id,
            checkpoint.TOPIC: topic,
            checkpoint.ROUND_ID: "round-1",
        },
    )
    wait_for(_log_start(broker, topic, 8), 20, what="retention to drop the committed segments")
    wait_for(
        lambda: not {keys[0], keys[1]} & _objects(broker),
        20,
        what="the committed objects to be deleted",
    )
    assert keys[2] in _objects(broker)
    assert _watermarks(broker.bootstrap, topic) == (8, 12)
    assert _consume(broker.bootstrap, topic, 8, "error", 12) == [8, 9, 10, 11]
    # the third segment still waits for the table
    wait_for(
        lambda: [b["blocked_offsets"] for b in broker.admin("/v1/retention")["blocked"]] == [4],
        20,
        what="the held-back figures to follow the commit",
    )
    metrics = _metrics(broker)
    assert f'icefall_retention_held_back_offsets{{topic="{topic}",partition="0"}} 4\n' in metrics
    assert _counter(metrics, "icefall_retention_deleted_chunks_total") == 2
    assert _counter(metrics, "icefall_retention_held_back_passes_total") >= 2


def _metrics(broker: BrokerProcess) -> str:
    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=10) as response:
        return str(response.read().decode())


def _counter(metrics: str, name: str) -> float:
    [line] = [line for line in metrics.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


def _topic_id(broker: BrokerProcess, topic: str) -> str:
    return str(broker.admin(f"/v1/topics/{topic}/offsets")["topic_id"])


# ---------------------------------------------------------------- crash safety


def test_objects_orphaned_by_a_crash_are_swept_and_the_index_never_points_at_a_deleted_one(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(
        ["--segment-flush-ms", "600000"]
    )  # retention every 5 minutes: not during setup
    topic = "crashy"
    _create(broker.bootstrap, topic, {})
    first = _produce_segment(broker, topic, 3)
    second = _produce_segment(broker, topic, 3)
    broker.stop()

    # a broker killed after retention's index commit and before its deletes: the
    # first segment's rows are gone, its object is not; plus a leftover object of a failed flush
    metadata = MetadataStore(broker.home / "metadata.sqlite")
    assert metadata.drop_chunks_before(topic, 0, 3) == [first]
    metadata.close()
    stray = "segments/0000000000001-000000000000.seg"
    LocalObjectStore(broker.home / "objects").put(stray, b"junk")

    broker.extra_args += ["--retention-check-interval-ms", "200"]
    broker.start()
    wait_for(
        lambda: not {first, stray} & _objects(broker), 20, what="the orphaned objects to be swept"
    )
    assert second in _objects(broker)
    assert _watermarks(broker.bootstrap, topic) == (3, 6)
    assert _consume(broker.bootstrap, topic, 3, "error", 6) == [3, 4, 5]


# ---------------------------------------------------------------- in process: policy and status


def _topic(configs: dict[str, str], name: str = "t") -> Topic:
    import uuid

    return Topic(name, uuid.uuid4(), 1, configs)


def test_policy_follows_the_topic_configs() -> None:
    assert Policy.of(_topic({"cleanup.policy": "compact", "retention.ms": "0"})) is None
    assert Policy.of(_topic({"retention.ms": "-1"})) is None  # retention.bytes defaults to -1 too
    policy = Policy.of(
        _topic(
            {
                "cleanup.policy": "compact,delete",
                "retention.bytes": "100",
                "retention.ms": "-1",
                "automq.table.topic.enable": "true",
                "automq.table.topic.namespace": "sales",
            },
            "web.clicks-v2",
        )
    )
    assert policy is not None
    assert (policy.retention_ms, policy.retention_bytes, policy.table) == (
        -1,
        100,
        ("sales", "web_clicks_v2"),
    )


def test_a_checkpoint_of_an_earlier_topic_with_the_same_name_commits_nothing() -> None:
    assert committed_offsets(Checkpoint({0: 10}, 1, topic_id="old"), "new") == {}
    assert committed_offsets(Checkpoint({0: 10}, 1, topic_id="new"), "new") == {0: 10}
    assert committed_offsets(Checkpoint({0: 10}, 1), "new") == {0: 10}  # written without a topic id


async def _logs_with_chunks(
    home: Path, topic: str, timestamps: list[int]
) -> tuple[LogStore, Cluster]:
    """A log store with one chunk of one 100-byte-value batch per timestamp."""
    config = BrokerConfig(home=home, segment_flush_ms=600_000)
    metadata = MetadataStore(config.metadata_db)
    logs = LogStore(config, metadata, LocalObjectStore(home / "objects"))
    await logs.open({})
    cluster = Cluster(config, metadata, logs)
    await cluster.create_topic(
        topic,
        1,
        {
            "retention.ms": str(HOUR_MS),
            "file.delete.delay.ms": "0",
            "automq.table.topic.enable": "true",
        },
    )
    part = logs.partitions[(topic, 0)]
    for ts in timestamps:
        _, seq = await logs.append(part, records.encode_batch([(None, b"x" * 100)], ts), 1 << 20)
        await logs.wal.wait_durable(seq)
        await logs.flush()
    return logs, cluster


def test_expired_and_committed_prefixes(tmp_path: Path) -> None:
    async def scenario() -> None:
        now = int(time.time() * 1000)
        logs, cluster = await _logs_with_chunks(
            tmp_path, "t", [now - 3 * HOUR_MS, now - 2 * HOUR_MS, now]
        )
        chunks = logs.partitions[("t", 0)].chunks
        policy = Policy.of(cluster.topics["t"])
        assert policy is not None
        assert expired_chunks(chunks, 0, policy, now) == 2
        size = chunks[0].byte_end - chunks[0].byte_start
        by_size = Policy(-1, 2 * size, False, None, 0)
        assert expired_chunks(chunks, 0, by_size, now) == 1
        assert (
            expired_chunks(chunks, size, by_size, now) == 2
        )  # unflushed bytes count towards the size
        assert [committed_chunks(chunks, 2, c) for c in (0, 1, 2, 3)] == [0, 1, 2, 2]
        await logs.close()

    asyncio.run(scenario())


def test_a_pass_records_what_it_deleted_and_what_the_table_held_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        now = int(time.time() * 1000)
        logs, cluster = await _logs_with_chunks(
            tmp_path, "t", [now - 3 * HOUR_MS, now - 2 * HOUR_MS, now]
        )
        committed = {"offsets": {0: 1}}
        seen: list[tuple[str, str]] = []

        def read(namespace: str, table: str) -> Checkpoint:
            seen.append((namespace, table))
            return Checkpoint(dict(committed["offsets"]), 1)

        retention = Retention(cluster, logs, read, 60_000)
        await retention.run_once()
        part = logs.partitions[("t", 0)]
        status = logs.retention.to_json()
        assert seen == [("default", "t")]
        assert (
            part.log_start_offset == 1
            and status["chunks_deleted"] == 1
            and status["objects_deleted"] == 1
        )
        assert status["blocked"] == [
            {
                "topic": "t",
                "partition": 0,
                "log_start_offset": 1,
                "wanted_log_start_offset": 2,
                "committed_offset": 1,
                "blocked_offsets": 1,
                "blocked_bytes": part.chunks[0].byte_end - part.chunks[0].byte_start,
                "since_ms": status["blocked"][0]["since_ms"],
                "passes": 1,
            }
        ]
        assert (
            await logs.read(part, 0, 1 << 20) == b""
        )  # below the log start: nothing, never a later batch

        committed["offsets"] = {0: 2}
        await retention.run_once()
        status = logs.retention.to_json()
        assert (
            part.log_start_offset == 2 and status["blocked"] == [] and status["chunks_deleted"] == 2
        )
        assert len(part.chunks) == 1 and status["blocked_passes"] == 1 and status["passes"] == 2
        await logs.close()

    asyncio.run(scenario())


def test_a_table_topic_whose_catalog_cannot_answer_keeps_everything(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not knowing what the table committed is treated as "nothing committed", never as "all"."""

    async def scenario() -> None:
        now = int(time.time() * 1000)
        logs, cluster = await _logs_with_chunks(
            tmp_path, "t", [now - 3 * HOUR_MS, now - 2 * HOUR_MS, now]
        )
        answers: list[Checkpoint | Exception] = [
            ConnectionRefusedError("catalog down"),
            Checkpoint({0: 3}, 1),
        ]

        def read(namespace: str, table: str) -> Checkpoint:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        retention = Retention(cluster, logs, read, 60_000)
        part = logs.partitions[("t", 0)]
        await retention.run_once()
        assert part.log_start_offset == 0 and len(part.chunks) == 3
        assert logs.retention.chunks_deleted == 0
        assert "cannot read the checkpoint of default.t: catalog down" in caplog.text

        await retention.run_once()  # the catalog is back: the two expired chunks go
        assert part.log_start_offset == 2 and logs.retention.chunks_deleted == 2
        await logs.close()

    asyncio.run(scenario())
