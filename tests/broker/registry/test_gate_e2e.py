"""The data quality gate with the real registry and Confluent's Avro serializer."""

from __future__ import annotations

import struct

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support import BrokerProcess

SCHEMA = '{"type":"record","name":"Click","fields":[{"name":"user","type":"long"},{"name":"page","type":"string"}]}'


def _produce(bootstrap: str, topic: str, items: list[tuple[int, bytes]]) -> list[KafkaError | None]:
    results: list[KafkaError | None] = [None] * len(items)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "retries": 0})
    for i, (partition, value) in enumerate(items):

        def delivered(err: KafkaError | None, msg: object, i: int = i) -> None:
            results[i] = err

        producer.produce(topic, value=value, partition=partition, on_delivery=delivered)
    assert producer.flush(30) == 0
    return results


def test_gate_refuses_bad_records_and_keeps_good_partitions(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    table = {"automq.table.topic.enable": "true"}
    topics = [
        NewTopic("gated", 2, 1, config=table),
        NewTopic(
            "ungated", 1, 1, config={**table, "automq.table.topic.schema.validation": "false"}
        ),
    ]
    for f in admin.create_topics(topics).values():
        f.result(10)
    registry = SchemaRegistryClient({"url": broker.registry_url})
    serialize = AvroSerializer(registry, SCHEMA)
    good = serialize({"user": 1, "page": "/"}, SerializationContext("gated", MessageField.VALUE))
    schema_id = struct.unpack(">I", good[1:5])[0]

    results = _produce(
        broker.bootstrap,
        "gated",
        [
            (0, good),
            (1, good),
            (1, b"not avro at all"),
        ],
    )
    assert results[0] is None
    assert results[2] is not None and results[2].code() == KafkaError.INVALID_RECORD

    unknown = b"\x00" + struct.pack(">I", schema_id + 1000) + good[5:]
    truncated = good[:-2]
    for bad in (unknown, truncated):
        (err,) = _produce(broker.bootstrap, "gated", [(0, bad)])
        assert err is not None and err.code() == KafkaError.INVALID_RECORD
    assert _produce(broker.bootstrap, "ungated", [(0, b"not avro at all")]) == [None]

    offsets = broker.admin("/v1/topics/gated/offsets")["partitions"]
    assert offsets[0]["high_watermark"] == 1
    assert offsets[1]["high_watermark"] == (0 if results[1] else 1)
    assert "refused by the data quality gate" in broker.log_text()
