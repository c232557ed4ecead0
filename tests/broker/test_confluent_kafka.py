"""confluent-kafka (librdkafka) end to end: admin, produce with every codec, consume, groups."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.support import BrokerProcess, wait_for


def _create(
    admin: AdminClient, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    for future in admin.create_topics(
        [NewTopic(name, partitions, 1, config=config or {})]
    ).values():
        future.result(10)


def _consume(bootstrap: str, topic: str, count: int, **conf: object) -> list[Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            **conf,
        }
    )
    consumer.subscribe([topic])
    got: list[Any] = []  # confluent_kafka.Message
    try:

        def poll() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg)
            return len(got) >= count

        wait_for(poll, 30, interval=0, what=f"{count} records from {topic}")
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_and_consume_every_codec(broker: BrokerProcess, codec: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = f"codec-{codec}"
    _create(admin, topic, 3)
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": codec,
            "linger.ms": 5,
        }
    )
    sent = {f"key-{i}": f"value-{i}-{codec}" for i in range(2000)}
    for key, value in sent.items():
        producer.produce(topic, key=key, value=value, headers={"h": key.encode()})
    assert producer.flush(30) == 0
    got = _consume(broker.bootstrap, topic, len(sent))
    assert {m.key().decode(): m.value().decode() for m in got} == sent
    assert all(dict(m.headers())["h"] == m.key() for m in got)
    by_partition: dict[int, list[int]] = {}
    for m in got:
        by_partition.setdefault(m.partition(), []).append(m.offset())
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks_levels(broker: BrokerProcess, acks: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = f"acks-{acks}"
    _create(admin, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": acks})
    delivered: list[int] = []
    for i in range(100):
        producer.produce(
            topic,
            value=str(i).encode(),
            on_delivery=lambda err, msg: delivered.append(0 if err else 1),
        )
    assert producer.flush(30) == 0
    assert sum(delivered) == 100
    assert sorted(int(m.value()) for m in _consume(broker.bootstrap, topic, 100)) == list(
        range(100)
    )


def test_consume_from_offset_and_timestamp(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    _create(admin, "seek")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(50):
        producer.produce("seek", value=str(i).encode(), timestamp=1_700_000_000_000 + i * 1000)
        producer.flush(10)
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "seek", "enable.auto.commit": False}
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition("seek", 0), timeout=10)
        assert (low, high) == (0, 50)
        found = consumer.offsets_for_times(
            [TopicPartition("seek", 0, 1_700_000_000_000 + 20_500)], timeout=10
        )
        assert found[0].offset == 21
        consumer.assign([TopicPartition("seek", 0, 30)])
        msgs: list[Any] = []

        def twenty_polled() -> bool:
            msgs.append(consumer.poll(0.5))
            return sum(1 for m in msgs if m is not None) >= 20

        wait_for(twenty_polled, 20)
        values = [int(m.value()) for m in msgs if m is not None]
        assert values == list(range(30, 50))
    finally:
        consumer.close()


def test_configs_describe_alter_and_reject_unknown(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    _create(admin, "cfg", config={"retention.ms": "3600000"})
    resource = ConfigResource("topic", "cfg")
    described = admin.describe_configs([resource])[resource].result(10)
    assert described["retention.ms"].value == "3600000"
    assert described["automq.table.topic.enable"].value == "false"

    enable = ConfigResource(
        "topic",
        "cfg",
        set_config={
            "automq.table.topic.enable": "true",
            "automq.table.topic.commit.interval.ms": "30000",
        },
    )
    admin.alter_configs([enable])[enable].result(10)
    described = admin.describe_configs([resource])[resource].result(10)
    assert described["automq.table.topic.enable"].value == "true"
    assert described["automq.table.topic.commit.interval.ms"].value == "30000"
    manifest = broker.admin("/v1/table-topics")
    assert [t["topic"] for t in manifest["table_topics"]] == ["cfg"]

    for bad in (
        {"no.such.key": "1"},
        {"automq.table.topic.commit.interval.ms": "soon"},
        {"automq.table.topic.convert.value.type": "xml"},
    ):
        res = ConfigResource("topic", "cfg", set_config=bad)
        with pytest.raises(KafkaException) as info:
            admin.alter_configs([res])[res].result(10)
        assert info.value.args[0].code() == 40  # INVALID_CONFIG
        assert next(iter(bad)) in info.value.args[0].str()

    with pytest.raises(KafkaException) as info:
        _create(admin, "cfg-bad", config={"automq.table.topic.enable": "maybe"})
    assert info.value.args[0].code() == 40

    # Turned off with an incremental alter: out of table_topics, listed as disabled (its DAG gets paused).
    off = ConfigResource(
        "topic",
        "cfg",
        incremental_configs=[
            ConfigEntry(
                "automq.table.topic.enable", "false", incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    admin.incremental_alter_configs([off])[off].result(10)
    manifest = broker.admin("/v1/table-topics")
    assert manifest["table_topics"] == []
    assert [t["topic"] for t in manifest["disabled_table_topics"]] == ["cfg"]


def test_delete_topic_and_produce_to_missing_topic(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    _create(admin, "doomed")
    for future in admin.delete_topics(["doomed"]).values():
        future.result(10)
    assert "doomed" not in admin.list_topics(timeout=10).topics
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 3000})
    errors: list[object] = []
    producer.produce("doomed", value=b"x", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(10)
    assert errors and errors[0] is not None


def test_a_replica_assignment_may_name_this_broker_only(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    [node] = admin.list_topics(timeout=10).brokers
    placed = NewTopic("placed", 2, replica_assignment=[[node], [node]])
    admin.create_topics([placed])["placed"].result(10)
    assert len(admin.list_topics("placed", timeout=10).topics["placed"].partitions) == 2
    for bad, reason in (
        ([[node], [node + 7]], f"broker {node + 7} is not live"),
        ([[node, node]], "one replica"),
    ):
        with pytest.raises(KafkaException, match=reason):
            topic = NewTopic("misplaced", len(bad), replica_assignment=bad)
            admin.create_topics([topic])["misplaced"].result(10)


def test_a_compacted_topic_refuses_records_without_a_key(broker: BrokerProcess) -> None:
    """As Kafka: INVALID_RECORD for a keyless record on a cleanup.policy=compact topic; keyed
    records, and keyless ones on a delete topic, are taken."""
    from confluent_kafka import KafkaError

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    _create(admin, "compacted", config={"cleanup.policy": "compact"})
    _create(admin, "not-compacted")
    errors: dict[str, KafkaError | None] = {}
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "message.send.max.retries": 0}
    )

    def report(name: str) -> Any:
        return lambda err, _msg: errors.__setitem__(name, err)

    producer.produce("compacted", value=b"no key", on_delivery=report("keyless"))
    producer.flush(10)
    producer.produce("compacted", key=b"k", value=b"keyed", on_delivery=report("keyed"))
    producer.produce("not-compacted", value=b"no key", on_delivery=report("delete"))
    assert producer.flush(10) == 0
    keyless = errors["keyless"]
    assert keyless is not None and keyless.code() == KafkaError.INVALID_RECORD, keyless
    assert errors["keyed"] is None and errors["delete"] is None
    [kept] = _consume(broker.bootstrap, "compacted", 1)
    assert (kept.key(), kept.value()) == (b"k", b"keyed")


def test_subtract_can_empty_a_list_and_message_format_version_is_accepted(
    broker: BrokerProcess,
) -> None:
    """IncrementalAlterConfigs SUBTRACT down to an empty list (``cleanup.policy`` empty: neither
    deleted nor compacted); ``message.format.version`` accepted and ignored, as Kafka 3.x did."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    _create(admin, "listed", config={"cleanup.policy": "delete,compact"})

    def alter(*entries: ConfigEntry) -> None:
        res = ConfigResource("topic", "listed", incremental_configs=list(entries))
        admin.incremental_alter_configs([res])[res].result(10)

    def value(name: str) -> str:
        res = ConfigResource("topic", "listed")
        return str(admin.describe_configs([res])[res].result(10)[name].value)

    subtract = AlterConfigOpType.SUBTRACT
    alter(ConfigEntry("cleanup.policy", "delete", incremental_operation=subtract))
    assert value("cleanup.policy") == "compact"
    alter(ConfigEntry("cleanup.policy", "compact", incremental_operation=subtract))
    assert value("cleanup.policy") == ""
    alter(
        ConfigEntry(
            "message.format.version", "2.8-IV1", incremental_operation=AlterConfigOpType.SET
        )
    )
    assert value("message.format.version") == "2.8-IV1"
    with pytest.raises(KafkaException, match="message.format.version"):
        alter(
            ConfigEntry(
                "message.format.version", "new", incremental_operation=AlterConfigOpType.SET
            )
        )


def test_auto_created_topics_take_num_partitions(broker_factory: Any, tmp_path: Any) -> None:
    """``num.partitions`` (server.properties, here) is the partition count of a topic created on
    first use, as Kafka's; a producer to a new topic then sees that many partitions."""
    props = tmp_path / "server.properties"
    props.write_text("auto.create.topics.enable=true\nnum.partitions=3\n")
    broker = broker_factory(["--config", str(props)])
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("made-on-first-use", value=b"x")
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topics = admin.list_topics("made-on-first-use", timeout=10).topics
    assert len(topics["made-on-first-use"].partitions) == 3


def test_fetch_max_bytes_bounds_the_whole_response(broker: BrokerProcess) -> None:
    """KIP-74: a fetch's request-level ``max_bytes`` bounds the sum over its partitions (the
    first batch always comes whole, so a consumer is never stuck on a large one)."""
    from tests.broker.rawkafka import fetch_partitions

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    _create(admin, "bounded", partitions=3)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(60):
        producer.produce("bounded", value=bytes(1000), partition=i % 3)
        producer.flush(10)  # one record per batch
    every = fetch_partitions(broker.bootstrap, "bounded", [0, 1, 2], 2**30, 2**20)
    batch = len(every[0]) // 20
    assert all(len(b) == 20 * batch for b in every.values())

    bounded = fetch_partitions(broker.bootstrap, "bounded", [0, 1, 2], 5 * batch, 2**20)
    assert sum(map(len, bounded.values())) <= 5 * batch
    assert len(bounded[0]) > 0 and len(bounded[2]) == 0
    tiny = fetch_partitions(broker.bootstrap, "bounded", [0, 1, 2], 10, 2**20)
    assert len(tiny[0]) == batch and len(tiny[1]) == len(tiny[2]) == 0  # one whole batch
