"""The schema registry end to end with confluent-kafka's SchemaRegistryClient and
its Avro, JSON Schema and Protobuf serializers against a running broker."""

from __future__ import annotations

import base64
import json
import struct
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.broker.registry.helpers import consume, create_topic, http
from tests.support import BrokerProcess, present


def _subject(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def avro(fields: Sequence[Mapping[str, Any]], name: str = "User") -> Schema:
    return Schema(
        json.dumps({"type": "record", "name": name, "namespace": "icefall.test", "fields": fields}),
        "AVRO",
    )


V1: list[dict[str, Any]] = [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]
V2_COMPATIBLE: list[dict[str, Any]] = [
    *V1,
    {"name": "email", "type": ["null", "string"], "default": None},
]
V2_INCOMPATIBLE: list[dict[str, Any]] = [
    *V1,
    {"name": "email", "type": "string"},
]  # new field without a default: not BACKWARD


def _expect(code: int, status: int, call: object) -> SchemaRegistryError:
    assert callable(call)
    with pytest.raises(SchemaRegistryError) as info:
        call()
    assert (info.value.http_status_code, info.value.error_code) == (status, code), info.value
    return info.value


def test_register_and_read_back(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    subject, other = _subject("users-value"), _subject("people-value")
    schema = avro(V1)
    schema_id = client.register_schema(subject, schema)
    assert schema_id >= 1

    fetched = client.get_schema(schema_id)
    assert fetched.schema_type == "AVRO"
    assert json.loads(present(fetched.schema_str)) == json.loads(present(schema.schema_str))

    version = client.get_version(subject, 1)
    assert (version.subject, version.version, version.schema_id) == (subject, 1, schema_id)
    latest = client.get_latest_version(subject)
    assert (latest.version, latest.schema_id) == (1, schema_id)
    assert subject in client.get_subjects()
    assert client.get_versions(subject) == [1]

    # registering the same schema again under the subject: same id, no new version
    fresh = SchemaRegistryClient({"url": registry_broker.registry_url})
    spaced = Schema(json.dumps(json.loads(present(schema.schema_str)), indent=2), "AVRO")
    assert fresh.register_schema(subject, spaced) == schema_id
    assert fresh.get_versions(subject) == [1]
    # the same schema under another subject reuses the id, as version 1 there
    assert fresh.register_schema(other, schema) == schema_id
    assert fresh.get_version(other, 1).schema_id == schema_id
    assert sorted((v.subject, v.version) for v in fresh.get_schema_versions(schema_id)) == sorted(
        [(subject, 1), (other, 1)]
    )
    assert sorted(fresh.get_subjects_by_schema_id(schema_id)) == sorted([subject, other])

    found = fresh.lookup_schema(subject, schema)
    assert (found.schema_id, found.version, found.subject) == (schema_id, 1, subject)
    assert set(fresh.get_schema_types()) == {"AVRO", "JSON", "PROTOBUF"}
    # a different schema gets a new id
    assert fresh.register_schema(_subject("x"), avro(V1, name="Other")) > schema_id


def test_evolution_and_compatibility(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    subject = _subject("evolve-value")
    first = client.register_schema(subject, avro(V1))
    assert client.test_compatibility(subject, avro(V2_COMPATIBLE)) is True
    assert client.test_compatibility(subject, avro(V2_INCOMPATIBLE)) is False
    assert client.test_compatibility(subject, avro(V2_INCOMPATIBLE), version=1) is False
    assert client.test_compatibility_all_versions(subject, avro(V2_COMPATIBLE)) is True

    status, verbose = http(
        registry_broker.registry_url,
        "POST",
        f"/compatibility/subjects/{subject}/versions/latest?verbose=true",
        {"schema": avro(V2_INCOMPATIBLE).schema_str},
    )
    assert status == 200 and verbose["is_compatible"] is False
    assert verbose["messages"] and any("email" in m for m in verbose["messages"]), verbose

    err = _expect(409, 409, lambda: client.register_schema(subject, avro(V2_INCOMPATIBLE)))
    assert "incompatible" in err.error_message and "email" in err.error_message
    second = client.register_schema(subject, avro(V2_COMPATIBLE))
    assert second != first
    assert client.get_versions(subject) == [1, 2]
    assert client.get_latest_version(subject).schema_id == second


def test_soft_and_permanent_delete(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    subject = _subject("deleting-value")
    id1 = client.register_schema(subject, avro(V1, name="Del"))
    id2 = client.register_schema(subject, avro(V2_COMPATIBLE, name="Del"))
    assert client.delete_version(subject, 1) == 1
    assert client.get_versions(subject) == [2]
    assert client.get_versions(subject, deleted=True) == [1, 2]
    _expect(40402, 404, lambda: client.get_version(subject, 1))
    assert client.get_version(subject, 1, deleted=True).schema_id == id1
    assert client.get_schema(id1).schema_str  # ids stay readable after a soft delete
    _expect(40406, 404, lambda: client.delete_version(subject, 1))
    _expect(40407, 404, lambda: client.delete_version(subject, 2, permanent=True))
    _expect(40405, 404, lambda: client.delete_subject(subject, permanent=True))

    assert client.delete_subject(subject) == [2]
    assert subject not in client.get_subjects()
    assert subject in client.get_subjects(deleted=True)
    _expect(40401, 404, lambda: client.get_latest_version(subject))
    _expect(40404, 404, lambda: client.delete_subject(subject))
    assert SchemaRegistryClient({"url": registry_broker.registry_url}).get_schema(id2).schema_str

    assert sorted(client.delete_subject(subject, permanent=True)) == [1, 2]
    fresh = SchemaRegistryClient({"url": registry_broker.registry_url})
    _expect(40403, 404, lambda: fresh.get_schema(id2))
    _expect(40401, 404, lambda: fresh.get_versions(subject, deleted=True))
    # ids are never reused, not even those of permanently deleted schemas
    assert fresh.register_schema(_subject("after"), avro(V1, name="New")) > id2
    # and registering the deleted schema again gives it a fresh id and version 1
    again = fresh.register_schema(subject, avro(V1, name="Del"))
    assert again > id2 and fresh.get_versions(subject) == [1]


def test_config_global_and_per_subject(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    base = registry_broker.registry_url
    subject = _subject("config-value")
    assert client.get_compatibility() == "BACKWARD"
    assert present(client.get_config().compatibility_level).value == "BACKWARD"
    try:
        assert client.set_compatibility(level="full_transitive") == {
            "compatibility": "FULL_TRANSITIVE"
        }
        assert client.get_compatibility() == "FULL_TRANSITIVE"
        _expect(40408, 404, lambda: client.get_compatibility(subject))
        assert http(base, "GET", f"/config/{subject}?defaultToGlobal=true") == (
            200,
            {"compatibilityLevel": "FULL_TRANSITIVE"},
        )

        # v3 is FULL-compatible with v2 (the latest) but cannot read v1 data: only a
        # transitive level sees that
        nick = {"name": "nick", "type": "string", "default": ""}
        v3 = avro([*V1, {"name": "nick", "type": "string"}], name="Cfg")
        client.register_schema(subject, avro(V1, name="Cfg"))
        client.register_schema(subject, avro([*V1, nick], name="Cfg"))
        assert client.test_compatibility(subject, v3) is True
        assert client.test_compatibility_all_versions(subject, v3) is False
        _expect(409, 409, lambda: client.register_schema(subject, v3))

        client.set_compatibility(subject, "NONE")
        assert client.get_compatibility(subject) == "NONE"
        assert client.get_compatibility() == "FULL_TRANSITIVE"
        client.register_schema(subject, v3)  # allowed under NONE
        client.register_schema(subject, avro(V2_INCOMPATIBLE, name="Cfg"))
        assert client.get_versions(subject) == [1, 2, 3, 4]
        assert present(client.delete_config(subject).compatibility_level).value == "NONE"
        _expect(40408, 404, lambda: client.get_compatibility(subject))
        _expect(
            409,
            409,
            lambda: client.register_schema(
                subject, avro([*V1, {"name": "zzz", "type": "int"}], name="Cfg")
            ),
        )
    finally:
        client.delete_config()
    assert client.get_compatibility() == "BACKWARD"


def test_mode(registry_broker: BrokerProcess, client: SchemaRegistryClient) -> None:
    base = registry_broker.registry_url
    subject = _subject("mode-value")
    client.register_schema(subject, avro(V1, name="Mode"))
    assert client.get_global_mode() == "READWRITE"
    _expect(40409, 404, lambda: client.get_mode(subject))
    assert client.update_mode(subject, "READONLY") == "READONLY"
    assert client.get_mode(subject) == "READONLY"
    _expect(42205, 422, lambda: client.register_schema(subject, avro(V2_COMPATIBLE, name="Mode")))
    _expect(42205, 422, lambda: client.delete_subject(subject))
    assert client.delete_mode(subject) == "READONLY"
    assert client.register_schema(subject, avro(V2_COMPATIBLE, name="Mode")) >= 1

    # IMPORT keeps ids and versions given by the caller
    imported = _subject("import-value")
    _expect(42205, 422, lambda: client.update_mode(subject, "IMPORT"))  # has schemas, no force
    assert client.update_mode(imported, "IMPORT") == "IMPORT"
    status, answer = http(
        base,
        "POST",
        f"/subjects/{imported}/versions",
        {"schema": avro(V1, name="Imported").schema_str, "id": 5000, "version": 7},
    )
    assert status == 200 and answer["id"] == 5000 and answer["version"] == 7, answer
    assert client.get_version(imported, 7).schema_id == 5000
    client.delete_mode(imported)
    assert client.register_schema(_subject("after-import"), avro(V1, name="AfterImport")) == 5001


def test_references(registry_broker: BrokerProcess, client: SchemaRegistryClient) -> None:
    topic = _subject("customers")
    address_subject, user_subject = _subject("address"), f"{topic}-value"
    address = Schema(
        json.dumps(
            {
                "type": "record",
                "name": "Address",
                "namespace": "icefall.test",
                "fields": [{"name": "street", "type": "string"}, {"name": "zip", "type": "string"}],
            }
        ),
        "AVRO",
    )
    address_id = client.register_schema(address_subject, address)
    ref = SchemaReference("icefall.test.Address", address_subject, 1)
    user = Schema(
        json.dumps(
            {
                "type": "record",
                "name": "Customer",
                "namespace": "icefall.test",
                "fields": [
                    {"name": "name", "type": "string"},
                    {"name": "home", "type": "icefall.test.Address"},
                ],
            }
        ),
        "AVRO",
        [ref],
    )
    user_id = client.register_schema(user_subject, user)
    got = client.get_version(user_subject, 1)
    assert [(r.name, r.subject, r.version) for r in present(got.schema.references)] == [
        (ref.name, ref.subject, 1)
    ]
    assert client.get_referenced_by(address_subject, 1) == [user_id]
    _expect(42206, 422, lambda: client.delete_version(address_subject, 1))
    _expect(
        42201,
        422,
        lambda: client.register_schema(
            _subject("dangling"),
            Schema(
                user.schema_str,
                "AVRO",
                [SchemaReference("icefall.test.Address", "no-such-subject", 1)],
            ),
        ),
    )
    # without the reference the named type is unknown
    _expect(
        42201,
        422,
        lambda: client.register_schema(_subject("unresolved"), Schema(user.schema_str, "AVRO")),
    )
    assert address_id != user_id

    # produce and consume with the reference resolved by the deserializer
    broker_url = registry_broker.registry_url
    serializer = AvroSerializer(
        client, user, conf={"auto.register.schemas": False, "use.latest.version": True}
    )
    ctx = SerializationContext("user-with-address", MessageField.VALUE)
    value = {"name": "ada", "home": {"street": "1 Main St", "zip": "12345"}}
    data = serializer(value, SerializationContext(topic, MessageField.VALUE))
    assert data is not None and data[0] == 0 and struct.unpack(">I", data[1:5])[0] == user_id
    reader = AvroDeserializer(SchemaRegistryClient({"url": broker_url}))
    assert reader(data, ctx) == value


def _produce(
    broker: BrokerProcess, topic: str, serializer: object, values: Sequence[object]
) -> list[bytes]:
    assert callable(serializer)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    encoded = []
    for i, value in enumerate(values):
        data = serializer(value, SerializationContext(topic, MessageField.VALUE))
        encoded.append(data)
        producer.produce(topic, key=str(i).encode(), value=data)
    assert producer.flush(30) == 0
    return encoded


def test_avro_serializer_round_trip(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    topic = f"avro-{uuid.uuid4().hex[:8]}"
    create_topic(registry_broker.bootstrap, topic)
    schema = avro(V2_COMPATIBLE, name="Click")
    values = [
        {"name": f"user-{i}", "age": i, "email": None if i % 2 else f"u{i}@example.com"}
        for i in range(50)
    ]
    encoded = _produce(registry_broker, topic, AvroSerializer(client, schema.schema_str), values)
    schema_id = client.get_latest_version(f"{topic}-value").schema_id
    assert all(e[0] == 0 and struct.unpack(">I", e[1:5])[0] == schema_id for e in encoded)
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry_broker.registry_url}))
    got = consume(registry_broker.bootstrap, topic, len(values))
    decoded = [
        deserializer(m.value(), SerializationContext(topic, MessageField.VALUE)) for m in got
    ]
    assert decoded == values


def test_json_schema_serializer_round_trip(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    topic = f"json-{uuid.uuid4().hex[:8]}"
    create_topic(registry_broker.bootstrap, topic)
    schema_str = json.dumps(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "title": "Order",
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "item": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["id", "item"],
        }
    )
    values = [{"id": i, "item": f"thing-{i}", "tags": ["a"] * (i % 3)} for i in range(20)]
    _produce(registry_broker, topic, JSONSerializer(schema_str, client), values)
    registered = client.get_latest_version(f"{topic}-value")
    assert registered.schema.schema_type == "JSON"
    assert json.loads(present(registered.schema.schema_str)) == json.loads(schema_str)
    deserializer = JSONDeserializer(
        None, schema_registry_client=SchemaRegistryClient({"url": registry_broker.registry_url})
    )
    got = consume(registry_broker.bootstrap, topic, len(values))
    assert [
        deserializer(m.value(), SerializationContext(topic, MessageField.VALUE)) for m in got
    ] == values
    # a value the schema rejects is refused by the serializer
    with pytest.raises(SerializationError, match="not a number"):
        JSONSerializer(schema_str, client)(
            {"id": "not a number"}, SerializationContext(topic, MessageField.VALUE)
        )


def _order_message_class() -> type:
    """A generated-style message class built at test time (no protoc)."""
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"icefall/test_{uuid.uuid4().hex[:6]}.proto", package="icefall.test", syntax="proto3"
    )
    status = fdp.enum_type.add(name="Status")
    status.value.add(name="UNKNOWN", number=0)
    status.value.add(name="SHIPPED", number=1)
    line = fdp.message_type.add(name="Line")
    line.field.add(name="sku", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    line.field.add(name="qty", number=2, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    order = fdp.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    order.field.add(name="customer", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    order.field.add(
        name="lines",
        number=3,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_REPEATED,
        type_name=".icefall.test.Line",
    )
    order.field.add(
        name="status",
        number=4,
        type=f.TYPE_ENUM,
        label=f.LABEL_OPTIONAL,
        type_name=".icefall.test.Status",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    cls: type = message_factory.GetMessageClass(pool.FindMessageTypeByName("icefall.test.Order"))
    return cls


def test_protobuf_serializer_round_trip(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    order_cls = _order_message_class()
    topic = f"proto-{uuid.uuid4().hex[:8]}"
    create_topic(registry_broker.bootstrap, topic)
    values = []
    for i in range(20):
        msg = order_cls(id=i, customer=f"c{i}", status=i % 2)
        line = msg.lines.add()
        line.sku, line.qty = f"sku-{i}", i
        values.append(msg)
    serializer = ProtobufSerializer(order_cls, client, {"use.deprecated.format": False})
    _produce(registry_broker, topic, serializer, values)

    registered = client.get_latest_version(f"{topic}-value")
    assert registered.schema.schema_type == "PROTOBUF"
    text = present(
        registered.schema.schema_str
    )  # served as .proto text by default, as Confluent does
    assert "message Order" in text and "message Line" in text and "enum Status" in text, text
    status, serialized = http(
        registry_broker.registry_url,
        "GET",
        f"/schemas/ids/{registered.schema_id}?format=serialized",
    )
    assert status == 200 and "message" not in serialized["schema"]

    deserializer = ProtobufDeserializer(
        order_cls,
        {"use.deprecated.format": False},
        SchemaRegistryClient({"url": registry_broker.registry_url}),
    )
    got = consume(registry_broker.bootstrap, topic, len(values))
    decoded = [
        deserializer(m.value(), SerializationContext(topic, MessageField.VALUE)) for m in got
    ]
    assert [d.SerializeToString(deterministic=True) for d in decoded] == [
        v.SerializeToString(deterministic=True) for v in values
    ]
    # the same schema registered as .proto text is the same schema (same id)
    assert (
        client.register_schema(_subject("proto-text"), Schema(text, "PROTOBUF"))
        == registered.schema_id
    )


def test_protobuf_with_an_imported_file(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    """The serializer registers the imported file as its own subject and refers to it;
    the deserializer fetches both in serialized form."""
    f = descriptor_pb2.FieldDescriptorProto
    tag = uuid.uuid4().hex[:6]
    common = descriptor_pb2.FileDescriptorProto(
        name=f"icefall/common_{tag}.proto", package="icefall.common", syntax="proto3"
    )
    money = common.message_type.add(name="Money")
    money.field.add(name="currency", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    money.field.add(name="cents", number=2, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    main = descriptor_pb2.FileDescriptorProto(
        name=f"icefall/payment_{tag}.proto",
        package="icefall.pay",
        syntax="proto3",
        dependency=[common.name],
    )
    payment = main.message_type.add(name="Payment")
    payment.field.add(name="id", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    payment.field.add(
        name="amount",
        number=2,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_OPTIONAL,
        type_name=".icefall.common.Money",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(common)
    pool.Add(main)
    payment_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("icefall.pay.Payment"))

    topic = f"payments-{tag}"
    create_topic(registry_broker.bootstrap, topic)
    values = [
        payment_cls(id=f"p{i}", amount={"currency": "EUR", "cents": 100 * i}) for i in range(5)
    ]
    _produce(
        registry_broker,
        topic,
        ProtobufSerializer(payment_cls, client, {"use.deprecated.format": False}),
        values,
    )
    registered = client.get_latest_version(f"{topic}-value")
    assert [(r.name, r.subject, r.version) for r in present(registered.schema.references)] == [
        (common.name, common.name, 1)
    ]
    assert f'import "{common.name}";' in present(registered.schema.schema_str)
    assert client.get_referenced_by(common.name, 1) == [registered.schema_id]

    deserializer = ProtobufDeserializer(
        payment_cls,
        {"use.deprecated.format": False},
        SchemaRegistryClient({"url": registry_broker.registry_url}),
    )
    got = consume(registry_broker.bootstrap, topic, len(values))
    decoded = [
        deserializer(m.value(), SerializationContext(topic, MessageField.VALUE)) for m in got
    ]
    assert [(d.id, d.amount.currency, d.amount.cents) for d in decoded] == [
        (v.id, v.amount.currency, v.amount.cents) for v in values
    ]


def test_root_and_listing(registry_broker: BrokerProcess) -> None:
    base = registry_broker.registry_url
    assert http(base, "GET", "/") == (200, {})
    status, subjects = http(base, "GET", "/subjects?subjectPrefix=zzz-none")
    assert (status, subjects) == (200, [])
    status, types = http(base, "GET", "/schemas/types")
    assert status == 200 and sorted(types) == ["AVRO", "JSON", "PROTOBUF"]


def test_avro_reference_found_by_the_full_name_its_schema_defines(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    """Confluent parses every referenced schema into one name table, so the reference's
    ``name`` (here a file name) need not be the type's name."""
    country_subject, topic = _subject("country"), _subject("addresses")
    country = {
        "type": "record",
        "name": "Country",
        "namespace": "geo",
        "fields": [{"name": "code", "type": "string"}],
    }
    client.register_schema(country_subject, Schema(json.dumps(country), "AVRO"))
    ref = SchemaReference("country.avsc", country_subject, 1)
    address: dict[str, Any] = {
        "type": "record",
        "name": "Address",
        "namespace": "geo",
        "fields": [{"name": "city", "type": "string"}, {"name": "country", "type": "Country"}],
    }
    schema = Schema(json.dumps(address), "AVRO", [ref])
    schema_id = client.register_schema(f"{topic}-value", schema)
    assert client.lookup_schema(f"{topic}-value", schema).schema_id == schema_id
    # a second version checked for compatibility against the first resolves it the same way
    address["fields"].append({"name": "zip", "type": ["null", "string"], "default": None})
    assert client.test_compatibility(f"{topic}-value", Schema(json.dumps(address), "AVRO", [ref]))
    # a name no referenced schema defines is still unknown
    other = dict(address, fields=[{"name": "c", "type": "geo.Province"}])
    _expect(
        42201,
        422,
        lambda: client.register_schema(_subject("p"), Schema(json.dumps(other), "AVRO", [ref])),
    )
    serializer = AvroSerializer(client, schema, conf={"auto.register.schemas": False})
    value = {"city": "Lyon", "country": {"code": "FR"}}
    data = serializer(value, SerializationContext(topic, MessageField.VALUE))
    assert data is not None and struct.unpack(">I", data[1:5])[0] == schema_id
    reader = AvroDeserializer(SchemaRegistryClient({"url": registry_broker.registry_url}))
    assert reader(data, SerializationContext(topic, MessageField.VALUE)) == value


@pytest.mark.parametrize(
    ("union", "accepted"),
    [
        (["null", "string"], True),  # "null" is a valid string: Java's Avro accepts any branch
        (["null", "int"], False),  # the JSON string "null" is not null, nor an int
        (["string", "null"], True),
    ],
)
def test_avro_null_string_default_on_a_union(
    registry_broker: BrokerProcess, union: list[str], accepted: bool
) -> None:
    schema = {
        "type": "record",
        "name": "Opt",
        "fields": [{"name": "v", "type": union, "default": "null"}],
    }
    status, answer = http(
        registry_broker.registry_url,
        "POST",
        f"/subjects/{_subject('nulldefault')}/versions",
        {"schema": json.dumps(schema)},
    )
    if accepted:
        assert status == 200 and isinstance(answer["id"], int), answer
    else:
        assert (status, answer["error_code"]) == (422, 42201), answer
        assert "default" in answer["message"].lower(), answer


def test_protobuf_import_not_given_as_a_reference_is_refused(
    registry_broker: BrokerProcess,
) -> None:
    text = (
        'syntax = "proto3";\npackage acme;\nimport "other.proto";\nmessage M { other.O o = 1; }\n'
    )
    subject = _subject("orphan-import")
    status, answer = http(
        registry_broker.registry_url,
        "POST",
        f"/subjects/{subject}/versions",
        {"schemaType": "PROTOBUF", "schema": text},
    )
    assert (status, answer["error_code"]) == (422, 42201), answer
    message = answer["message"]
    assert (
        message.startswith(f"Invalid schema {{subject={subject},") and "of type PROTOBUF" in message
    )
    assert '"other.proto"' in message.split("details: ", 1)[1], message


UNORDERED_PROTO = """syntax = "proto3";
package acme.norm;
option java_package = "com.acme.norm";
option go_package = "acme/norm";
option java_multiple_files = true;
message Reading {
  repeated int32 samples = 2 [packed = true, deprecated = true];
  string sensor = 1;
  Unit unit = 3;
}
enum Unit {
  option allow_alias = true;
  UNIT_UNKNOWN = 0;
  CELSIUS = 2;
  KELVIN = 1;
  KELVIN_ALIAS = 1;
}
"""


def test_protobuf_normalize_orders_options_fields_and_constants(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    """``?normalize=true`` stores the text in Confluent's normalized order."""
    base = registry_broker.registry_url
    plain, normal = _subject("proto-plain"), _subject("proto-norm")
    body = {"schemaType": "PROTOBUF", "schema": UNORDERED_PROTO}
    assert http(base, "POST", f"/subjects/{plain}/versions", body)[0] == 200
    status, answer = http(base, "POST", f"/subjects/{normal}/versions?normalize=true", body)
    assert status == 200, answer
    plain_text = http(base, "GET", f"/subjects/{plain}/versions/1/schema")[1]
    text = http(base, "GET", f"/subjects/{normal}/versions/1/schema")[1]
    assert plain_text != text
    lines = [line.strip() for line in text.splitlines()]
    assert [line for line in lines if line.startswith("option ") and "=" in line][:3] == [
        'option go_package = "acme/norm";',
        "option java_multiple_files = true;",
        'option java_package = "com.acme.norm";',
    ], text
    start = lines.index("message Reading {")
    fields = lines[start + 1 : lines.index("}", start)]
    assert fields == [
        "string sensor = 1;",
        "repeated int32 samples = 2 [deprecated = true, packed = true];",
        ".acme.norm.Unit unit = 3;",
    ], text
    assert (
        lines.index("KELVIN = 1;") < lines.index("KELVIN_ALIAS = 1;") < lines.index("CELSIUS = 2;")
    )
    # looked up with normalize: found whichever form it was registered in
    for subject in (normal, plain):
        status, found = http(base, "POST", f"/subjects/{subject}?normalize=true", body)
        assert (status, found["version"]) == (200, 1), (subject, found)
    # a subject whose config says normalize=true normalizes without the parameter
    configured = _subject("proto-config")
    assert (
        http(
            base, "PUT", f"/config/{configured}", {"compatibility": "BACKWARD", "normalize": True}
        )[0]
        == 200
    )
    assert client.register_schema(configured, Schema(UNORDERED_PROTO, "PROTOBUF")) == answer["id"]


def test_protobuf_registered_as_a_descriptor_renders_canonical_text(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    """A client's FileDescriptorProto may name types relatively ("Line"); the text served
    for it is the one the same schema registered as .proto text gets, with the same id."""
    fd = descriptor_pb2.FileDescriptorProto(name="order.proto", package="acme.bin", syntax="proto3")
    fd.options.go_package = "acme/bin"
    order = fd.message_type.add(name="Order")
    order.field.add(
        name="id", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=1
    )
    order.field.add(
        name="lines",
        number=2,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        type_name="Line",
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    line = fd.message_type.add(name="Line")
    line.field.add(
        name="sku", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=1
    )
    encoded = base64.standard_b64encode(fd.SerializeToString()).decode()
    binary_id = client.register_schema(_subject("bin"), Schema(encoded, "PROTOBUF"))
    served = present(client.get_schema(binary_id).schema_str)
    assert "repeated .acme.bin.Line lines = 2;" in served, served
    text_id = client.register_schema(_subject("txt"), Schema(served, "PROTOBUF"))
    assert text_id == binary_id
    status, again = http(
        registry_broker.registry_url, "GET", f"/schemas/ids/{binary_id}?format=serialized"
    )
    assert (
        status == 200
        and client.register_schema(_subject("bin2"), Schema(again["schema"], "PROTOBUF"))
        == binary_id
    )


POINT = {"type": "array", "items": [{"type": "number"}, {"type": "number"}]}  # a draft-07 tuple


@pytest.mark.parametrize(
    "document",
    [
        POINT,  # no $schema: read as draft-07, as Confluent does
        {"$schema": "http://json-schema.org/draft-07/schema#", **POINT},
        {"$schema": "http://json-schema.org/draft-06/schema#", **POINT, "contains": {"const": 0}},
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "object",
            "properties": {"ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True}},
        },
        True,
        False,
    ],
    ids=["no-schema", "draft-07", "draft-06", "draft-04", "true", "false"],
)
def test_json_schema_drafts_and_boolean_schemas(
    registry_broker: BrokerProcess, client: SchemaRegistryClient, document: Any
) -> None:
    subject = _subject("json-draft")
    schema = Schema(json.dumps(document), "JSON")
    schema_id = client.register_schema(subject, schema)
    assert json.loads(present(client.get_schema(schema_id).schema_str)) == document
    assert client.lookup_schema(subject, schema).schema_id == schema_id


def test_json_schema_tuple_round_trip_and_open_content_models(
    registry_broker: BrokerProcess, client: SchemaRegistryClient
) -> None:
    """Confluent's JSON Schema rules: what an open content model (no
    ``additionalItems``/``additionalProperties: false``) let old data hold may not be
    constrained later; a closed model may grow."""
    topic = _subject("json-tuple")
    create_topic(registry_broker.bootstrap, topic)
    values = [[1.5, 2.0], [0, -3]]
    # the client validates with the newest draft unless told: name draft-07 for it
    point = {"$schema": "http://json-schema.org/draft-07/schema#", **POINT}
    _produce(registry_broker, topic, JSONSerializer(json.dumps(point), client), values)
    deserializer = JSONDeserializer(
        None, schema_registry_client=SchemaRegistryClient({"url": registry_broker.registry_url})
    )
    got = consume(registry_broker.bootstrap, topic, len(values))
    ctx = SerializationContext(topic, MessageField.VALUE)
    assert [deserializer(m.value(), ctx) for m in got] == values

    subject = f"{topic}-value"
    third = {**point, "items": [*POINT["items"], {"type": "string"}]}
    err = _expect(
        409, 409, lambda: client.register_schema(subject, Schema(json.dumps(third), "JSON"))
    )
    assert "ITEM_ADDED_TO_OPEN_CONTENT_MODEL" in err.error_message
    closed = {**POINT, "additionalItems": False}
    closed_subject = _subject("json-closed")
    client.register_schema(closed_subject, Schema(json.dumps(closed), "JSON"))
    client.register_schema(
        closed_subject, Schema(json.dumps({**third, "additionalItems": False}), "JSON")
    )

    def obj(props: dict[str, Any], **extra: Any) -> Schema:
        return Schema(json.dumps({"type": "object", "properties": props, **extra}), "JSON")

    open_subject, closed_subject = _subject("json-open-obj"), _subject("json-closed-obj")
    client.register_schema(open_subject, obj({"a": {"type": "string"}}))
    err = _expect(
        409,
        409,
        lambda: client.register_schema(
            open_subject, obj({"a": {"type": "string"}, "b": {"type": "integer"}})
        ),
    )
    assert "PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL" in err.error_message
    client.register_schema(
        closed_subject, obj({"a": {"type": "string"}}, additionalProperties=False)
    )
    client.register_schema(
        closed_subject,
        obj({"a": {"type": "string"}, "b": {"type": "integer"}}, additionalProperties=False),
    )
    # boolean schemas: true (anything) may not become false (nothing) under BACKWARD
    bool_subject = _subject("json-bool")
    client.register_schema(bool_subject, Schema("true", "JSON"))
    assert not client.test_compatibility(bool_subject, Schema("false", "JSON"))
