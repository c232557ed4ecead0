"""The registry's state lives in the broker's own ``_schemas`` topic: a restart (or a
kill -9 after the answer) brings back every subject, version, id, deletion, config
and mode exactly, ids are never reused, and the topic is plain Kafka data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient

from tests.broker.registry.helpers import consume, end_offset, http
from tests.support import BrokerProcess, present, wait_for


def avro(name: str, fields: list[dict[str, Any]]) -> Schema:
    return Schema(
        json.dumps({"type": "record", "name": name, "namespace": "restart", "fields": fields}),
        "AVRO",
    )


F1: list[dict[str, Any]] = [{"name": "id", "type": "long"}]
F2: list[dict[str, Any]] = [*F1, {"name": "note", "type": ["null", "string"], "default": None}]
PROTO = 'syntax = "proto3";\npackage restart;\nmessage Event {\n  int64 id = 1;\n  repeated string tags = 2;\n}\n'


def populate(client: SchemaRegistryClient, base: str) -> dict[str, int]:
    ids = {
        "orders-1": client.register_schema("orders-value", avro("Order", F1)),
        "orders-2": client.register_schema("orders-value", avro("Order", F2)),
        "json": client.register_schema(
            "json-value",
            Schema('{"type": "object", "properties": {"a": {"type": "string"}}}', "JSON"),
        ),
        "proto": client.register_schema("proto-value", Schema(PROTO, "PROTOBUF")),
        "address": client.register_schema(
            "address", avro("Address", [{"name": "street", "type": "string"}])
        ),
    }
    assert client.register_schema("orders-copy-value", avro("Order", F1)) == ids["orders-1"]
    ids["customer"] = client.register_schema(
        "customer-value",
        Schema(
            json.dumps(
                {
                    "type": "record",
                    "name": "Customer",
                    "namespace": "restart",
                    "fields": [{"name": "home", "type": "restart.Address"}],
                }
            ),
            "AVRO",
            [SchemaReference("restart.Address", "address", 1)],
        ),
    )
    ids["frozen"] = client.register_schema("frozen-value", avro("Frozen", F1))
    assert client.delete_version("orders-value", 1) == 1
    assert client.delete_subject("json-value") == [1]
    # the highest id so far is then deleted for good: it must never come back
    ids["temp"] = client.register_schema("temp-value", avro("Temp", F1))
    client.delete_subject("temp-value")
    assert client.delete_subject("temp-value", permanent=True) == [1]
    client.set_compatibility(level="FORWARD")
    client.set_compatibility("orders-value", "NONE")
    client.update_mode("frozen-value", "READONLY")
    return ids


def snapshot(base: str, ids: dict[str, int]) -> dict[str, Any]:
    """Everything the REST API says about the registry."""
    out: dict[str, Any] = {}
    for path in (
        "/subjects",
        "/subjects?deleted=true",
        "/config",
        "/mode",
        "/schemas?deleted=true",
    ):
        out[path] = http(base, "GET", path)
    _, subjects = http(base, "GET", "/subjects?deleted=true")
    for subject in [*subjects, "temp-value"]:
        for path in (
            f"/subjects/{subject}/versions",
            f"/subjects/{subject}/versions?deleted=true",
            f"/subjects/{subject}/versions/latest",
            f"/config/{subject}",
            f"/mode/{subject}",
        ):
            out[path] = http(base, "GET", path)
        for version in (1, 2):
            for path in (
                f"/subjects/{subject}/versions/{version}?deleted=true",
                f"/subjects/{subject}/versions/{version}/referencedby",
            ):
                out[path] = http(base, "GET", path)
    for schema_id in ids.values():
        for path in (
            f"/schemas/ids/{schema_id}",
            f"/schemas/ids/{schema_id}?format=serialized",
            f"/schemas/ids/{schema_id}/versions?deleted=true",
            f"/schemas/ids/{schema_id}/subjects",
        ):
            out[path] = http(base, "GET", path)
    return out


def test_restart_keeps_everything(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "home", ["--segment-flush-ms", "200"]).start()
    try:
        client = SchemaRegistryClient({"url": broker.registry_url})
        ids = populate(client, broker.registry_url)
        before = snapshot(broker.registry_url, ids)
        # the snapshot is not vacuous
        assert before["/subjects"] == (
            200,
            [
                "address",
                "customer-value",
                "frozen-value",
                "orders-copy-value",
                "orders-value",
                "proto-value",
            ],
        )
        assert before["/subjects/orders-value/versions?deleted=true"] == (200, [1, 2])
        assert before["/config"] == (200, {"compatibilityLevel": "FORWARD"})
        assert before["/mode/frozen-value"] == (200, {"mode": "READONLY"})
        assert before[f"/schemas/ids/{ids['temp']}"][0] == 404
        assert before["/subjects/address/versions/1/referencedby"] == (200, [ids["customer"]])

        assert broker.stop() == 0
        broker.start()
        assert snapshot(broker.registry_url, ids) == before

        fresh = SchemaRegistryClient({"url": broker.registry_url})
        # ids keep counting from the largest ever given, the permanently deleted one included
        assert (
            fresh.register_schema("new-value", avro("New", F1))
            == max(ids.values()) + 1
            == ids["temp"] + 1
        )
        # the same schema under a new subject still finds its old id; rules still apply
        assert fresh.register_schema("orders-again-value", avro("Order", F2)) == ids["orders-2"]
        assert fresh.get_compatibility("orders-value") == "NONE"
        assert fresh.get_mode("frozen-value") == "READONLY"
        status, answer = http(
            broker.registry_url,
            "POST",
            "/subjects/frozen-value/versions",
            {"schema": avro("Frozen", F2).schema_str},
        )
        assert (status, answer["error_code"]) == (422, 42205)
    finally:
        broker.stop()


def test_kill9_after_the_answer_loses_nothing(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "home", ["--segment-flush-ms", "600000"]).start()
    try:
        client = SchemaRegistryClient({"url": broker.registry_url})
        registered = {
            f"s{i}-value": client.register_schema(f"s{i}-value", avro(f"S{i}", F1))
            for i in range(5)
        }
        client.set_compatibility("s0-value", "FULL")
        broker.kill9()
        broker.start()
        fresh = SchemaRegistryClient({"url": broker.registry_url})
        assert {s: fresh.get_latest_version(s).schema_id for s in registered} == registered
        assert fresh.get_compatibility("s0-value") == "FULL"
    finally:
        broker.stop()


def test_schemas_topic_is_plain_kafka(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "home", ["--segment-flush-ms", "200"]).start()
    try:
        client = SchemaRegistryClient({"url": broker.registry_url})
        ids = populate(client, broker.registry_url)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        topic = admin.list_topics(timeout=10).topics["_schemas"]
        assert len(topic.partitions) == 1
        (configs,) = admin.describe_configs([ConfigResource("topic", "_schemas")]).values()
        assert configs.result(10)["cleanup.policy"].value == "compact"

        records = consume(broker.bootstrap, "_schemas", end_offset(broker.bootstrap, "_schemas"))
        decoded = [
            (json.loads(present(m.key())), None if (v := m.value()) is None else json.loads(v))
            for m in records
        ]
    finally:
        broker.stop()

    schema_records = [(k, v) for k, v in decoded if k["keytype"] == "SCHEMA"]
    for key, value in schema_records:
        assert list(key) == ["keytype", "subject", "version", "magic"] and key["magic"] == 1
        if value is not None:
            assert value["subject"] == key["subject"] and value["version"] == key["version"]
            assert set(value) >= {"subject", "version", "id", "schema", "references", "deleted"}
    first = next(v for k, v in schema_records if k["subject"] == "orders-value" and v is not None)
    assert first == {
        "subject": "orders-value",
        "version": 1,
        "id": ids["orders-1"],
        "schema": json.dumps(
            json.loads(present(avro("Order", F1).schema_str)), separators=(",", ":")
        ),
        "references": [],
        "deleted": False,
    }
    proto = present(next(v for k, v in schema_records if k["subject"] == "proto-value"))
    assert proto["schemaType"] == "PROTOBUF" and "message Event" in proto["schema"]
    customer = present(next(v for k, v in schema_records if k["subject"] == "customer-value"))
    assert customer["references"] == [
        {"name": "restart.Address", "subject": "address", "version": 1}
    ]
    # soft delete: the same key again with deleted=true; permanent delete: a tombstone
    assert (
        {"keytype": "SCHEMA", "subject": "orders-value", "version": 1, "magic": 1},
        {**first, "deleted": True},
    ) in schema_records
    temp_key = {"keytype": "SCHEMA", "subject": "temp-value", "version": 1, "magic": 1}
    assert [v is None for k, v in schema_records if k == temp_key] == [False, False, True]
    assert (
        {"keytype": "CONFIG", "subject": None, "magic": 0},
        {"compatibilityLevel": "FORWARD"},
    ) in decoded
    assert (
        {"keytype": "CONFIG", "subject": "orders-value", "magic": 0},
        {"compatibilityLevel": "NONE"},
    ) in decoded
    assert (
        {"keytype": "MODE", "subject": "frozen-value", "magic": 0},
        {"mode": "READONLY"},
    ) in decoded


def _produce_raw(bootstrap: str, items: list[tuple[dict[str, Any], dict[str, Any] | None]]) -> None:
    """Append records to ``_schemas`` as another registry instance would: plain Kafka."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for key, value in items:
        producer.produce(
            "_schemas",
            key=json.dumps(key).encode(),
            value=None if value is None else json.dumps(value).encode(),
        )
    assert producer.flush(30) == 0


def test_records_another_writer_appends_are_read_live(tmp_path: Path) -> None:
    """No restart: the registry tails ``_schemas``, so what another instance writes there
    (here a raw producer in Confluent's record format) is served within moments, and the
    registry's own next id follows the ids it read. Over the Kafka listener only a super
    user may write _schemas (tests/broker/test_acls.py checks the refusal)."""
    broker = BrokerProcess(
        tmp_path / "home",
        [
            "--segment-flush-ms", "200",
            "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "--override", "super.users=User:ANONYMOUS",
        ],
    ).start()  # fmt: skip
    try:
        base = broker.registry_url
        client = SchemaRegistryClient({"url": base})
        own_id = client.register_schema("local-value", avro("Local", F1))  # creates _schemas
        foreign_id = own_id + 40
        schema = json.dumps(json.loads(present(avro("Remote", F1).schema_str)))
        key = {"keytype": "SCHEMA", "subject": "remote-value", "version": 1, "magic": 1}
        value = {
            "subject": "remote-value",
            "version": 1,
            "id": foreign_id,
            "schema": schema,
            "references": [],
            "deleted": False,
        }
        _produce_raw(
            broker.bootstrap,
            [
                (key, value),
                (
                    {"keytype": "CONFIG", "subject": "remote-value", "magic": 0},
                    {"compatibilityLevel": "NONE"},
                ),
                ({"keytype": "MODE", "subject": "local-value", "magic": 0}, {"mode": "READONLY"}),
            ],
        )
        got = wait_for(
            lambda: (
                (answer := http(base, "GET", "/subjects/remote-value/versions/1"))[0] == 200
                and answer[1]
            ),
            10,
            what="the raw record served",
        )
        assert got["id"] == foreign_id and json.loads(got["schema"]) == json.loads(schema)
        assert http(base, "GET", f"/schemas/ids/{foreign_id}")[0] == 200
        assert http(base, "GET", "/config/remote-value")[1]["compatibilityLevel"] == "NONE"
        assert http(base, "GET", "/mode/local-value") == (200, {"mode": "READONLY"})
        # the next id is past the foreign one; NONE lets an unrelated schema follow
        assert client.register_schema("remote-value", avro("Other", F2)) == foreign_id + 1
        # a soft delete and then a tombstone from the other writer
        _produce_raw(broker.bootstrap, [(key, {**value, "deleted": True})])
        wait_for(
            lambda: http(base, "GET", "/subjects/remote-value/versions")[1] == [2],
            10,
            what="the soft delete applied",
        )
        _produce_raw(broker.bootstrap, [(key, None)])
        wait_for(
            lambda: http(base, "GET", "/subjects/remote-value/versions?deleted=true")[1] == [2],
            10,
            what="the tombstone applied",
        )
    finally:
        broker.stop()
