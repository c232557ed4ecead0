"""kafka-python end to end: admin, produce (acks, codecs), consume by position and time, group offsets."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import kafka.codec
import kafka.errors
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource
from kafka.structs import OffsetAndMetadata

from tests.broker.rawkafka import batch_codecs
from tests.support import BrokerProcess, wait_for

# kafka-python compresses with optional libraries; pyproject's [test] extra lists them.
CODEC_LIBRARIES = {
    "gzip": (kafka.codec.has_gzip, "the standard library"),
    "snappy": (kafka.codec.has_snappy, "python-snappy"),
    "lz4": (kafka.codec.has_lz4, "lz4"),
    "zstd": (kafka.codec.has_zstd, "zstandard"),
}


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="test-admin")
    yield client
    client.close()


def _producer(broker: BrokerProcess, **conf: Any) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=broker.bootstrap, **conf)


def _consumer(broker: BrokerProcess, **conf: Any) -> KafkaConsumer:
    conf.setdefault("enable_auto_commit", False)
    return KafkaConsumer(bootstrap_servers=broker.bootstrap, **conf)


def _drain(consumer: KafkaConsumer, count: int, timeout: float = 30.0) -> list[Any]:
    """Poll until ``count`` records arrived (fails on timeout); then check nothing more is pending."""
    got: list[Any] = []

    def poll() -> bool:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(records)
        return len(got) >= count

    wait_for(poll, timeout, interval=0, what=f"{count} records")
    for records in consumer.poll(timeout_ms=300).values():
        got.extend(records)
    return got


def _send_all(producer: KafkaProducer, topic: str, values: list[bytes], **kwargs: Any) -> list[Any]:
    futures = [producer.send(topic, value=v, **kwargs) for v in values]
    producer.flush(30)
    return [f.get(timeout=30) for f in futures]


def test_admin_create_describe_and_delete_topics(
    broker: BrokerProcess, admin: KafkaAdminClient
) -> None:
    created = admin.create_topics(
        {
            "kp-orders": {
                "num_partitions": 3,
                "replication_factor": 1,
                "configs": {"retention.ms": "3600000", "cleanup.policy": "compact"},
            },
            "kp-events": {"num_partitions": 1, "replication_factor": 1},
        }
    )
    by_name = {t["name"]: t for t in created["topics"]}
    assert {n: (t["error_code"], t["num_partitions"]) for n, t in by_name.items()} == {
        "kp-orders": (0, 3),
        "kp-events": (0, 1),
    }
    assert {"kp-orders", "kp-events"} <= set(admin.list_topics())

    described = {t["name"]: t for t in admin.describe_topics(["kp-orders", "kp-events"])}
    assert sorted(p["partition_index"] for p in described["kp-orders"]["partitions"]) == [0, 1, 2]
    assert len(described["kp-events"]["partitions"]) == 1

    # the default filter returns only what was set on the topic
    modified = admin.describe_configs([ConfigResource("topic", "kp-orders")])["topic"]["kp-orders"]
    assert {k: v["value"] for k, v in modified.items()} == {
        "retention.ms": "3600000",
        "cleanup.policy": "compact",
    }
    assert all(v["config_source"] == "DYNAMIC_TOPIC_CONFIG" for v in modified.values())
    everything = admin.describe_configs([ConfigResource("topic", "kp-events")], config_filter="all")
    events = everything["topic"]["kp-events"]
    assert events["retention.ms"]["config_source"] == "DEFAULT_CONFIG"
    assert events["retention.ms"]["value"] != "3600000"
    assert events["cleanup.policy"]["value"] == "delete"
    only = admin.describe_configs(
        [ConfigResource("topic", "kp-orders", ["retention.ms"])], config_filter="all"
    )
    assert list(only["topic"]["kp-orders"]) == ["retention.ms"]

    with pytest.raises(kafka.errors.TopicAlreadyExistsError):
        admin.create_topics({"kp-orders": {"num_partitions": 1, "replication_factor": 1}})
    with pytest.raises(kafka.errors.InvalidConfigurationError):
        admin.create_topics(
            {
                "kp-bad": {
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "configs": {"retention.ms": "forever"},
                }
            }
        )
    assert "kp-bad" not in admin.list_topics()

    deleted = admin.delete_topics(["kp-orders"])
    assert [(t["name"], t["error_code"]) for t in deleted["topics"]] == [("kp-orders", 0)]
    topics = admin.list_topics()
    assert "kp-orders" not in topics and "kp-events" in topics
    with pytest.raises(kafka.errors.UnknownTopicOrPartitionError):
        admin.delete_topics(["kp-orders"])


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_produce_with_acks(broker: BrokerProcess, admin: KafkaAdminClient, acks: int | str) -> None:
    topic = f"kp-acks-{acks}"
    admin.create_topics({topic: {"num_partitions": 2, "replication_factor": 1}})
    producer = _producer(broker, acks=acks, linger_ms=2)
    try:
        values = [f"{acks}-{i}".encode() for i in range(200)]
        metadata = _send_all(producer, topic, values)
    finally:
        producer.close()
    assert len(metadata) == len(values)  # every send completed without an error
    if acks != 0:  # (an acks=0 produce gets no answer, so no offsets)
        by_partition: dict[int, list[int]] = {}
        for m in metadata:
            by_partition.setdefault(m.partition, []).append(m.offset)
        for offsets in by_partition.values():
            assert offsets == list(range(len(offsets)))
    consumer = _consumer(broker, auto_offset_reset="earliest", group_id=f"g-{uuid.uuid4()}")
    consumer.subscribe([topic])
    try:
        got = _drain(consumer, len(values))
    finally:
        consumer.close()
    assert sorted(r.value for r in got) == sorted(values)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_produce_and_consume_compressed(
    broker: BrokerProcess, admin: KafkaAdminClient, codec: str
) -> None:
    available, library = CODEC_LIBRARIES[codec]
    if not available():
        pytest.skip(
            f"kafka-python cannot {codec}-compress: install {library} (pip install -e '.[test]')"
        )
    topic = f"kp-codec-{codec}"
    admin.create_topics({topic: {"num_partitions": 2, "replication_factor": 1}})
    producer = _producer(broker, compression_type=codec, linger_ms=20, batch_size=64 * 1024)
    sent = {f"key-{i}".encode(): (f"value-{i}-{codec}-" + "x" * 200).encode() for i in range(1000)}
    try:
        for key, value in sent.items():
            producer.send(topic, key=key, value=value, headers=[("h", key)])
        producer.flush(30)
    finally:
        producer.close()

    consumer = _consumer(broker, auto_offset_reset="earliest", group_id=f"g-{uuid.uuid4()}")
    consumer.subscribe([topic])
    try:
        got = _drain(consumer, len(sent))
    finally:
        consumer.close()
    assert {r.key: r.value for r in got} == sent
    assert len(got) == len(sent)
    assert all(dict(r.headers)["h"] == r.key for r in got)
    for partition in (0, 1):
        offsets = [r.offset for r in got if r.partition == partition]
        assert offsets == list(range(len(offsets)))
        # the batches were stored as the producer compressed them
        codecs = batch_codecs(broker.bootstrap, topic, partition)
        assert codecs and set(codecs) == {codec}, codecs


def test_consume_from_earliest_latest_and_offset(
    broker: BrokerProcess, admin: KafkaAdminClient
) -> None:
    topic = "kp-positions"
    admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1}})
    tp = TopicPartition(topic, 0)
    producer = _producer(broker, linger_ms=0)
    try:
        old = [f"old-{i}".encode() for i in range(10)]
        _send_all(producer, topic, old)

        latest = _consumer(broker, auto_offset_reset="latest", group_id="kp-latest")
        earliest = _consumer(broker, auto_offset_reset="earliest", group_id="kp-earliest")
        try:
            latest.subscribe([topic])
            wait_for(
                lambda: latest.poll(timeout_ms=100) == {} and latest.assignment() == {tp},
                20,
                interval=0,
                what="the latest consumer's assignment",
            )
            assert latest.position(tp) == len(old)
            new = [f"new-{i}".encode() for i in range(5)]
            _send_all(producer, topic, new)
            assert [r.value for r in _drain(latest, len(new))] == new

            earliest.subscribe([topic])
            assert [r.value for r in _drain(earliest, len(old) + len(new))] == old + new
        finally:
            latest.close()
            earliest.close()

        manual = _consumer(broker)
        try:
            manual.assign([tp])
            assert manual.beginning_offsets([tp]) == {tp: 0}
            assert manual.end_offsets([tp]) == {tp: len(old) + len(new)}
            manual.seek(tp, 7)
            got = _drain(manual, len(old) + len(new) - 7)
            assert [r.offset for r in got] == list(range(7, len(old) + len(new)))
            assert [r.value for r in got] == (old + new)[7:]
            manual.seek_to_beginning(tp)
            assert manual.position(tp) == 0
            manual.seek_to_end(tp)
            assert manual.position(tp) == len(old) + len(new)
        finally:
            manual.close()
    finally:
        producer.close()


def test_offsets_for_times(broker: BrokerProcess, admin: KafkaAdminClient) -> None:
    topic = "kp-times"
    admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1}})
    tp = TopicPartition(topic, 0)
    base = 1_700_000_000_000
    stamps = [base + i * 1000 for i in range(40)]
    producer = _producer(broker, linger_ms=0)
    try:
        for i, ts in enumerate(stamps):
            # one batch per record, so the broker must find a time inside the log, not just a batch edge
            producer.send(topic, value=str(i).encode(), timestamp_ms=ts).get(timeout=10)
    finally:
        producer.close()

    consumer = _consumer(broker)
    try:
        for query in (base - 5000, base, base + 20_500, base + 39_000):
            index = next(
                i for i, ts in enumerate(stamps) if ts >= query
            )  # the first record at or after
            found = consumer.offsets_for_times({tp: query})[tp]
            assert found is not None, query
            assert (found.offset, found.timestamp) == (index, stamps[index]), query
        # later than every record: no offset
        assert consumer.offsets_for_times({tp: stamps[-1] + 1})[tp] is None

        consumer.assign([tp])
        start = consumer.offsets_for_times({tp: base + 30_000})[tp]
        consumer.seek(tp, start.offset)
        got = _drain(consumer, len(stamps) - 30)
        assert [int(r.value) for r in got] == list(range(30, 40))
        assert [r.timestamp for r in got] == stamps[30:]
    finally:
        consumer.close()


def test_group_commit_and_fetch_committed(broker: BrokerProcess, admin: KafkaAdminClient) -> None:
    topic = "kp-commits"
    admin.create_topics({topic: {"num_partitions": 2, "replication_factor": 1}})
    producer = _producer(broker, linger_ms=0)
    try:
        for p in (0, 1):
            _send_all(producer, topic, [f"{p}-{i}".encode() for i in range(20)], partition=p)
    finally:
        producer.close()
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

    group = "kp-group"
    consumer = _consumer(broker, group_id=group, auto_offset_reset="earliest")
    consumer.subscribe([topic])
    try:
        got = _drain(consumer, 40)
        assert len(got) == 40
        assert consumer.committed(tps[0]) is None  # nothing committed yet
        consumer.commit()  # the consumed positions
        assert [consumer.committed(tp) for tp in tps] == [20, 20]
        # explicit offsets with metadata
        consumer.commit(
            {tps[0]: OffsetAndMetadata(5, "five", -1), tps[1]: OffsetAndMetadata(12, "twelve", -1)}
        )
        assert [consumer.committed(tp) for tp in tps] == [5, 12]
        assert consumer.committed(tps[0], metadata=True).metadata == "five"
    finally:
        consumer.close()

    offsets = admin.list_group_offsets(group)[group]
    assert {tp: (o.offset, o.metadata) for tp, o in offsets.items()} == {
        tps[0]: (5, "five"),
        tps[1]: (12, "twelve"),
    }
    assert group in {g["group_id"] for g in admin.list_groups()}

    # a new member of the group resumes at the committed offsets
    resumed = _consumer(broker, group_id=group, auto_offset_reset="earliest")
    resumed.subscribe([topic])
    try:
        got = _drain(resumed, (20 - 5) + (20 - 12))
    finally:
        resumed.close()
    assert sorted((r.partition, r.offset) for r in got) == [(0, o) for o in range(5, 20)] + [
        (1, o) for o in range(12, 20)
    ]
