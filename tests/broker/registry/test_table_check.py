"""Registration checked against the Iceberg table (broker/registry/table_check.py), with
Confluent's Avro serializer registering as producers do (``auto.register.schemas``).

The tables are created by the commit round's own code (``table_setup.load_or_create``)
in the broker's catalog, from the subject's first version, as a first round does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from broker.contracts import TableTopic
from spark_jobs.broker_client import RegistryClient
from spark_jobs.rounds import table_setup
from tests.broker.registry.helpers import http
from tests.support import BrokerProcess, free_port


def record(fields: list[dict[str, Any]]) -> str:
    return json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": fields})


ADDRESS: dict[str, Any] = {
    "type": "record",
    "name": "Address",
    "fields": [{"name": "city", "type": "string"}],
}
V1: list[dict[str, Any]] = [
    {"name": "id", "type": "int"},
    {"name": "amount", "type": "float"},
    {"name": "item", "type": "string"},
    {"name": "address", "type": ADDRESS},
]
OPTIONAL_NOTE: dict[str, Any] = {"name": "note", "type": ["null", "string"], "default": None}
ZIP: dict[str, Any] = {"name": "zip", "type": ["null", "string"], "default": None}
# What the round evolves a table to: a new optional column, int -> long, float -> double, a nested field.
V2: list[dict[str, Any]] = [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": "double"},
    {"name": "item", "type": "string"},
    {"name": "address", "type": {**ADDRESS, "fields": [*ADDRESS["fields"], ZIP]}},
    OPTIONAL_NOTE,
]
ITEM_AS_INT = [{**f, "type": "int"} if f["name"] == "item" else f for f in V2]


def register(registry: SchemaRegistryClient, topic: str, schema: str) -> None:
    """What a producer's first record does: the serializer registers the schema under ``<topic>-value``."""
    item = 7 if '"name": "item", "type": "int"' in schema else "x"
    AvroSerializer(registry, schema)(
        {"id": 1, "amount": 1.0, "item": item, "address": {"city": "c"}},
        SerializationContext(topic, MessageField.VALUE),
    )


def versions(broker: BrokerProcess, subject: str) -> list[int]:
    status, body = http(broker.registry_url, "GET", f"/subjects/{subject}/versions")
    assert status == 200, body
    return list(body)


def create_table(broker: BrokerProcess, topic: str) -> Any:
    entry = next(
        t
        for t in map(TableTopic.from_json, broker.admin("/v1/table-topics")["table_topics"])
        if t.topic == topic
    )
    catalog = table_setup.catalog_for(broker.catalog_url)
    return table_setup.load_or_create(
        catalog,
        entry,
        RegistryClient(broker.registry_url),
        table_setup.TableOptions.of(entry),
        lambda: None,
    )


def test_a_schema_the_table_cannot_take_is_refused_with_the_column(
    registry_broker: BrokerProcess,
) -> None:
    admin = AdminClient({"bootstrap.servers": registry_broker.bootstrap})
    table = {"automq.table.topic.enable": "true", "automq.table.topic.namespace": "shop"}
    topics = [
        NewTopic("orders", 1, 1, config=table),
        NewTopic(
            "loose", 1, 1, config={**table, "automq.table.topic.schema.evolution.check": "false"}
        ),
    ]
    for future in admin.create_topics(topics).values():
        future.result(10)
    registry = SchemaRegistryClient({"url": registry_broker.registry_url})
    for topic in ("orders", "loose"):
        register(registry, topic, record(V1))  # no table yet: nothing to check against
        create_table(registry_broker, topic)
        # the registry's own level would refuse string -> int first; the table's check is the subject here
        assert (
            http(
                registry_broker.registry_url,
                "PUT",
                f"/config/{topic}-value",
                {"compatibility": "NONE"},
            )[0]
            == 200
        )

    # Accepted: the evolutions a round makes (add optional, widen, nested add).
    register(registry, "orders", record(V2))
    assert versions(registry_broker, "orders-value") == [1, 2]

    # Refused: 409 in Confluent's shape, naming the table, the column and both types.
    with pytest.raises(SchemaRegistryError) as refused:
        register(
            SchemaRegistryClient({"url": registry_broker.registry_url}),
            "orders",
            record(ITEM_AS_INT),
        )
    assert refused.value.http_status_code == 409 and refused.value.error_code == 409
    message = refused.value.error_message
    assert "shop.orders" in message and "column item" in message, message
    assert "string" in message and "int" in message, message
    assert "automq.table.topic.schema.evolution.check=false" in message
    assert versions(registry_broker, "orders-value") == [1, 2]  # nothing registered

    # The versions registered but not yet applied count: the round would first add `extra int`
    # (version 3), so a version 4 with `extra string` would stall it although the table lacks `extra`.
    extra: dict[str, Any] = {"name": "extra", "type": ["null", "int"], "default": None}
    register(registry, "orders", record([*V2, extra]))
    with pytest.raises(SchemaRegistryError) as refused:
        register(
            SchemaRegistryClient({"url": registry_broker.registry_url}),
            "orders",
            record([*V2, {**extra, "type": ["null", "string"]}]),
        )
    assert refused.value.http_status_code == 409 and "column extra" in refused.value.error_message
    # Re-registering a version the subject has answers its id as before.
    register(SchemaRegistryClient({"url": registry_broker.registry_url}), "orders", record(V2))
    assert versions(registry_broker, "orders-value") == [1, 2, 3]

    # The topic's switch: with the check off, the same change registers.
    register(registry, "loose", record(ITEM_AS_INT))
    assert versions(registry_broker, "loose-value") == [1, 2]
    assert "registered without the table check" not in registry_broker.log_text()


@pytest.fixture(scope="module")
def unreachable_catalog_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """Tables in an external REST catalog that is down (nothing listens on its port)."""
    home: Path = tmp_path_factory.mktemp("unreachable") / "home"
    broker = BrokerProcess(
        home,
        [
            "--override",
            "automq.table.topic.catalog.type=rest",
            "--override",
            f"automq.table.topic.catalog.uri=http://127.0.0.1:{free_port()}",
        ],
    ).start()
    try:
        yield broker
    finally:
        broker.stop()


def test_an_unreachable_catalog_does_not_block_registration(
    unreachable_catalog_broker: BrokerProcess,
) -> None:
    broker = unreachable_catalog_broker
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {"automq.table.topic.enable": "true"}
    for future in admin.create_topics([NewTopic("offline", 1, 1, config=config)]).values():
        future.result(10)
    register(SchemaRegistryClient({"url": broker.registry_url}), "offline", record(V1))
    assert versions(broker, "offline-value") == [1]
    log = broker.log_text()
    assert "offline-value registered without the table check: catalog rest http://127.0.0.1:" in log
