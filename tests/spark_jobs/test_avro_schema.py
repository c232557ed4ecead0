"""Avro -> Iceberg types (Iceberg's SchemaToType), the table layout, and the Arrow schema."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)

from spark_jobs.decode import avro_schema
from spark_jobs.decode.avro_schema import (
    UnsupportedAvroSchema,
    avro_to_iceberg_schema,
    table_schema,
)

# (Avro type of a field, Iceberg type, whether the field is required)
TYPE_TABLE: list[tuple[Any, IcebergType, bool]] = [
    ("boolean", BooleanType(), True),
    ("int", IntegerType(), True),
    ("long", LongType(), True),
    ("float", FloatType(), True),
    ("double", DoubleType(), True),
    ("string", StringType(), True),
    ("bytes", BinaryType(), True),
    ({"type": "fixed", "name": "F4", "size": 4}, FixedType(4), True),
    ({"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}, StringType(), True),
    (
        {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        DecimalType(10, 2),
        True,
    ),
    (
        {
            "type": "fixed",
            "name": "D",
            "size": 16,
            "logicalType": "decimal",
            "precision": 38,
            "scale": 9,
        },
        DecimalType(38, 9),
        True,
    ),
    ({"type": "int", "logicalType": "date"}, DateType(), True),
    ({"type": "int", "logicalType": "time-millis"}, TimeType(), True),
    ({"type": "long", "logicalType": "time-micros"}, TimeType(), True),
    ({"type": "long", "logicalType": "timestamp-millis"}, TimestamptzType(), True),
    ({"type": "long", "logicalType": "timestamp-micros"}, TimestamptzType(), True),
    (
        {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": False},
        TimestampType(),
        True,
    ),
    (
        {"type": "long", "logicalType": "timestamp-millis", "adjust-to-utc": "false"},
        TimestampType(),
        True,
    ),
    (
        {"type": "long", "logicalType": "timestamp-millis", "adjust-to-utc": True},
        TimestamptzType(),
        True,
    ),
    ({"type": "long", "logicalType": "local-timestamp-millis"}, TimestampType(), True),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, TimestampType(), True),
    ({"type": "string", "logicalType": "uuid"}, UUIDType(), True),
    ({"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"}, UUIDType(), True),
    # logical types Iceberg does not know, or on the wrong type, fall back to the Avro type
    ({"type": "long", "logicalType": "timestamp-nanos"}, LongType(), True),
    ({"type": "string", "logicalType": "date"}, StringType(), True),
    ({"type": "fixed", "name": "U8", "size": 8, "logicalType": "uuid"}, FixedType(8), True),
    ({"type": "string", "logicalType": "something-custom"}, StringType(), True),
    # unions
    (["null", "string"], StringType(), False),
    (["long", "null"], LongType(), False),
    (
        ["string"],
        StructType(
            NestedField(1, "tag", IntegerType(), required=True),
            NestedField(2, "field0", StringType(), required=False),
        ),
        True,
    ),
    (
        ["int", "string"],
        StructType(
            NestedField(1, "tag", IntegerType(), required=True),
            NestedField(2, "field0", IntegerType(), required=False),
            NestedField(3, "field1", StringType(), required=False),
        ),
        True,
    ),
    # a null branch is skipped in the numbering and makes the union optional
    (
        ["int", "null", "string", "long"],
        StructType(
            NestedField(1, "tag", IntegerType(), required=True),
            NestedField(2, "field0", IntegerType(), required=False),
            NestedField(3, "field1", StringType(), required=False),
            NestedField(4, "field2", LongType(), required=False),
        ),
        False,
    ),
    # collections
    ({"type": "array", "items": "int"}, ListType(1, IntegerType(), element_required=True), True),
    (
        {"type": "array", "items": ["null", "int"]},
        ListType(1, IntegerType(), element_required=False),
        True,
    ),
    (
        {"type": "map", "values": "double"},
        MapType(1, StringType(), 2, DoubleType(), value_required=True),
        True,
    ),
    (
        {"type": "map", "values": ["null", "double"]},
        MapType(1, StringType(), 2, DoubleType(), value_required=False),
        True,
    ),
    (
        {
            "type": "array",
            "logicalType": "map",
            "items": {
                "type": "record",
                "name": "KV",
                "fields": [
                    {"name": "key", "type": "int"},
                    {"name": "value", "type": ["null", "string"]},
                ],
            },
        },
        MapType(1, IntegerType(), 2, StringType(), value_required=False),
        True,
    ),
    (
        {
            "type": "record",
            "name": "Inner",
            "fields": [
                {"name": "a", "type": "int", "doc": "the a"},
                {"name": "b", "type": ["null", "bytes"]},
            ],
        },
        StructType(
            NestedField(1, "a", IntegerType(), required=True, doc="the a"),
            NestedField(2, "b", BinaryType(), required=False),
        ),
        True,
    ),
]


def one_field(avro_type: Any) -> dict[str, Any]:
    return {"type": "record", "name": "Top", "fields": [{"name": "f", "type": avro_type}]}


@pytest.mark.parametrize(
    "avro_type, iceberg_type, required",
    TYPE_TABLE,
    ids=[json.dumps(t)[:60] for t, _, _ in TYPE_TABLE],
)
def test_type_table(avro_type: Any, iceberg_type: IcebergType, required: bool) -> None:
    (field,) = avro_to_iceberg_schema(one_field(avro_type)).fields
    assert field.required is required
    assert _shape(field.field_type) == _shape(iceberg_type)  # ids aside: they are checked below


def _shape(t: IcebergType) -> Any:
    """The type without field ids: names, types, requiredness, docs."""
    if isinstance(t, StructType):
        return ("struct", [(f.name, _shape(f.field_type), f.required, f.doc) for f in t.fields])
    if isinstance(t, ListType):
        return ("list", _shape(t.element_type), t.element_required)
    if isinstance(t, MapType):
        return ("map", _shape(t.key_type), _shape(t.value_type), t.value_required)
    return str(t)


def test_json_text_and_parsed_schemas_give_the_same_result() -> None:
    from fastavro import parse_schema

    schema = one_field(
        {"type": "array", "items": ["null", {"type": "enum", "name": "E", "symbols": ["A"]}]}
    )
    assert avro_to_iceberg_schema(json.dumps(schema)) == avro_to_iceberg_schema(schema)
    assert avro_to_iceberg_schema(parse_schema(schema)) == avro_to_iceberg_schema(schema)
    assert avro_schema.avro_to_iceberg_type('"string"') == StringType()
    assert avro_schema.avro_to_iceberg_type("long") == LongType()


def test_fresh_ids_are_assigned_as_iceberg_assigns_them() -> None:
    schema = avro_to_iceberg_schema(
        {
            "type": "record",
            "name": "R",
            "fields": [
                {
                    "name": "a",
                    "type": {
                        "type": "record",
                        "name": "A",
                        "fields": [{"name": "x", "type": "int"}],
                    },
                },
                {"name": "b", "type": {"type": "array", "items": "A"}},  # a named type used twice
                {"name": "c", "type": {"type": "map", "values": "long"}},
                {"name": "d", "type": "string"},
            ],
        }
    )
    # top-level fields first (1..4), then nested ones in order
    assert [(f.field_id, f.name) for f in schema.fields] == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert schema.find_field("a.x").field_id == 5
    assert schema.find_field("b.element").field_id == 6
    assert schema.find_field("b.element.x").field_id == 7
    c = schema.find_field("c").field_type
    assert isinstance(c, MapType) and (c.key_id, c.value_id) == (8, 9)
    assert schema.highest_field_id == 9
    assert schema == assign_fresh_schema_ids(
        schema
    )  # pyiceberg's numbering, which follows Iceberg's


def test_table_layout_system_columns_first_then_the_flattened_value() -> None:
    value = {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long", "doc": "order id"},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
    schema = table_schema(value)
    assert [f.name for f in schema.fields] == [
        "_kafka_key",
        "_kafka_headers",
        "_kafka_metadata",
        "id",
        "note",
    ]
    assert [f.field_id for f in schema.fields] == [1, 2, 3, 4, 5]
    key, headers, metadata = schema.fields[:3]
    assert key.field_type == StringType() and not key.required
    assert isinstance(headers.field_type, MapType) and not headers.required
    assert (
        headers.field_type.key_type == StringType()
        and headers.field_type.value_type == BinaryType()
    )
    assert not headers.field_type.value_required  # a header value may be null
    assert metadata.required
    assert _shape(metadata.field_type) == (
        "struct",
        [
            ("partition", "int", True, None),
            ("offset", "long", True, None),
            ("timestamp", "timestamptz", True, None),
        ],
    )
    assert schema.find_field("id").doc == "order id" and schema.find_field("id").required
    assert not schema.find_field("note").required
    assert avro_schema.value_is_flattened(schema)


@pytest.mark.parametrize("key_type, expected", [("string", "string"), ("raw", "binary")])
def test_key_column_per_key_conversion(key_type: str, expected: str) -> None:
    schema = table_schema(one_field("int"), key_type=key_type)
    assert str(schema.find_field("_kafka_key").field_type) == expected


def test_key_by_schema_id_uses_the_key_schema() -> None:
    key = {
        "type": "record",
        "name": "Key",
        "fields": [{"name": "tenant", "type": "string"}, {"name": "id", "type": "long"}],
    }
    schema = table_schema(one_field("int"), key_type="by_schema_id", key_schema=key)
    assert _shape(schema.find_field("_kafka_key").field_type) == (
        "struct",
        [("tenant", "string", True, None), ("id", "long", True, None)],
    )
    ids = [f.field_id for f in schema.find_field("_kafka_key").field_type.fields]  # type: ignore[attr-defined]
    assert len(set(ids) | {f.field_id for f in schema.fields}) == len(ids) + len(schema.fields)
    with pytest.raises(ValueError, match="needs the key's Avro schema"):
        table_schema(one_field("int"), key_type="by_schema_id")


@pytest.mark.parametrize(
    "value_type, transform, value, expected",
    [
        ("raw", "flatten", None, "binary"),
        ("string", "flatten", None, "string"),
        ("by_schema_id", "none", one_field("int"), "struct<10: f: required int>"),
        (
            "by_schema_id",
            "flatten",
            {"type": "array", "items": "int"},
            "list<int>",
        ),  # nothing to flatten
    ],
)
def test_value_column_when_not_flattened(
    value_type: str, transform: str, value: Any, expected: str
) -> None:
    schema = table_schema(value, value_type=value_type, transform=transform)
    assert [f.name for f in schema.fields][-1] == "_kafka_value"
    assert str(schema.find_field("_kafka_value").field_type) == expected
    assert not avro_schema.value_is_flattened(schema)


def test_refusals() -> None:
    with pytest.raises(UnsupportedAvroSchema, match="recursive"):
        avro_to_iceberg_schema(
            {
                "type": "record",
                "name": "Node",
                "fields": [{"name": "next", "type": ["null", "Node"]}],
            }
        )
    with pytest.raises(UnsupportedAvroSchema, match="38 digits"):
        avro_to_iceberg_schema(
            one_field({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2})
        )
    with pytest.raises(UnsupportedAvroSchema, match="clash"):
        table_schema(
            {"type": "record", "name": "R", "fields": [{"name": "_kafka_key", "type": "string"}]}
        )
    with pytest.raises(UnsupportedAvroSchema, match="only a record"):
        avro_to_iceberg_schema("string")
    with pytest.raises(ValueError, match="flatten_debezium"):
        table_schema(one_field("int"), transform="flatten_debezium")
    with pytest.raises(ValueError, match="unknown convert.value.type"):
        table_schema(one_field("int"), value_type="protobuf")
    with pytest.raises(UnsupportedAvroSchema, match="null type"):
        avro_to_iceberg_schema(one_field({"type": "array", "items": "null"}))


def test_null_fields_are_dropped_in_v2_and_unknown_in_v3() -> None:
    schema = one_field("null")
    schema["fields"].append({"name": "g", "type": "int"})
    assert [f.name for f in avro_to_iceberg_schema(schema).fields] == ["g"]
    v3 = avro_to_iceberg_schema(schema, format_version=3)
    assert v3.fields[0].field_type == UnknownType() and not v3.fields[0].required


def test_defaults_only_for_format_v3() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "n", "type": "int", "default": 7},
            {"name": "s", "type": "string", "default": "x"},
            {
                "name": "e",
                "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]},
                "default": "B",
            },
            {"name": "b", "type": "bytes", "default": "\u00ff\u0001"},
            {"name": "d", "type": "double", "default": 1},
            {"name": "o", "type": ["null", "int"], "default": None},
            {"name": "p", "type": ["int", "null"], "default": 3},
            {"name": "r", "type": {"type": "array", "items": "int"}, "default": []},
        ],
    }
    assert all(f.initial_default is None for f in avro_to_iceberg_schema(schema).fields)
    v3 = {
        f.name: (f.initial_default, f.write_default)
        for f in avro_to_iceberg_schema(schema, 3).fields
    }
    assert v3 == {
        "n": (7, 7),
        "s": ("x", "x"),
        "e": ("B", "B"),
        "b": (b"\xff\x01", b"\xff\x01"),
        "d": (1.0, 1.0),
        "o": (None, None),
        "p": (3, 3),
        "r": (None, None),
    }


def test_arrow_schema_iceberg_flavor_matches_the_types_and_carries_field_ids() -> None:
    schema = table_schema(
        {
            "type": "record",
            "name": "R",
            "fields": [{"name": f"c{i}", "type": t} for i, (t, _, _) in enumerate(TYPE_TABLE)],
        }
    )
    arrow = avro_schema.arrow_schema(schema)
    assert arrow.names == [f.name for f in schema.fields]
    assert arrow.field("_kafka_metadata").type == pa.struct(
        [
            pa.field("partition", pa.int32(), nullable=False),
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        ]
    )
    assert not arrow.field("_kafka_metadata").nullable and arrow.field("_kafka_key").nullable
    expected = {
        "c0": pa.bool_(),
        "c1": pa.int32(),
        "c2": pa.int64(),
        "c3": pa.float32(),
        "c4": pa.float64(),
        "c5": pa.string(),
        "c6": pa.binary(),
        "c7": pa.binary(4),
        "c8": pa.string(),
        "c9": pa.decimal128(10, 2),
        "c11": pa.date32(),
        "c12": pa.time64("us"),
        "c14": pa.timestamp("us", tz="UTC"),
        "c16": pa.timestamp("us"),
        "c19": pa.timestamp("us"),
        "c21": pa.uuid(),
        "c22": pa.uuid(),
    }
    for name, arrow_type in expected.items():
        assert arrow.field(name).type == arrow_type, name
    for field in schema.fields:
        assert arrow.field(field.name).metadata == {
            b"PARQUET:field_id": str(field.field_id).encode()
        }


def test_arrow_schema_spark_flavor() -> None:
    schema = table_schema(
        one_field(
            {
                "type": "record",
                "name": "R2",
                "fields": [
                    {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
                    {"name": "f", "type": {"type": "fixed", "name": "F", "size": 3}},
                ],
            }
        )
    )
    arrow = avro_schema.arrow_schema(schema, "spark")
    assert [(f.name, f.type) for f in arrow.field("f").type] == [
        ("u", pa.string()),
        ("f", pa.binary()),
    ]
    with pytest.raises(UnsupportedAvroSchema, match="Spark 3.5 has no time type"):
        avro_schema.arrow_schema(
            table_schema(one_field({"type": "int", "logicalType": "time-millis"})), "spark"
        )


def test_storage_type_replaces_nested_extension_types() -> None:
    t = pa.struct(
        [
            pa.field("u", pa.uuid()),
            pa.field("m", pa.map_(pa.string(), pa.uuid())),
            pa.field("l", pa.list_(pa.uuid())),
        ]
    )
    assert avro_schema.storage_type(t) == pa.struct(
        [
            pa.field("u", pa.binary(16)),
            pa.field("m", pa.map_(pa.string(), pa.binary(16))),
            pa.field("l", pa.list_(pa.binary(16))),
        ]
    )


def test_avro_to_iceberg_schema_is_a_schema() -> None:
    assert isinstance(avro_to_iceberg_schema(one_field("int")), Schema)
