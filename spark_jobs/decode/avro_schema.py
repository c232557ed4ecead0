"""Avro schemas (from the schema registry) -> the Iceberg table schema and the Arrow schema of its rows.

The mapping is Iceberg's own (``org.apache.iceberg.avro.SchemaToType``, used by
``AvroSchemaUtil.toIceberg``) so a table made by Icefall looks like one made by
Iceberg's Kafka Connect sink or Spark from the same Avro schema:

=============================================  ==========================================
Avro                                           Iceberg
=============================================  ==========================================
record                                         struct (field docs kept)
array                                          list (element optional iff it is [null, X])
map (string keys)                              map<string, V> (value optional iff [null, X])
array of {key, value} records, logicalType map map<K, V> (Iceberg's own non-string-key maps)
[null, X] / [X, null]                          X, the field optional
any other union                                struct<tag int required, field0..fieldN optional>
                                               (one field per non-null branch, numbered over the
                                               non-null branches; a null branch makes it optional)
enum                                           string
fixed(N) / bytes                               fixed[N] / binary
decimal(P, S) on bytes or fixed                decimal(P, S) (P <= 38)
date                                           date
time-millis, time-micros                       time
timestamp-millis, timestamp-micros             timestamptz, or timestamp when ``adjust-to-utc``
                                               is false (Iceberg's ``isTimestamptz``)
local-timestamp-millis, -micros                timestamp (Iceberg ignores these; we do not)
uuid on string or fixed(16)                    uuid
null                                           dropped (v2), unknown (v3)
other logical types (e.g. timestamp-nanos)     the underlying Avro type, as Iceberg does
=============================================  ==========================================

Field ids are assigned fresh the way Iceberg assigns them to a new table
(top-level fields 1..n first, then nested ones), so ids from a table's
metadata and from this conversion agree for a table created from it.
Defaults of primitive fields become Iceberg ``initial-default``/``write-default``
only for format v3: v1/v2 table metadata cannot carry them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import pyarrow as pa
from fastavro import parse_schema
from pyiceberg.schema import Schema
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
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)

KAFKA_KEY = "_kafka_key"
KAFKA_HEADERS = "_kafka_headers"
KAFKA_METADATA = "_kafka_metadata"
KAFKA_VALUE = "_kafka_value"
RESERVED_COLUMNS = frozenset({KAFKA_KEY, KAFKA_HEADERS, KAFKA_METADATA, KAFKA_VALUE})

CONVERT_TYPES = ("raw", "string", "by_schema_id", "by_latest_schema")
TRANSFORM_TYPES = ("none", "flatten", "flatten_debezium")
MAX_DECIMAL_PRECISION = 38

AvroSchemaLike = str | Mapping[str, Any] | list[Any]
"""Avro schema as JSON text, a JSON-like object, or what ``fastavro.parse_schema`` returns."""

ArrowFlavor = Literal["iceberg", "spark"]


class UnsupportedAvroSchema(ValueError):
    """The Avro schema has no Iceberg equivalent (recursive record, decimal over 38 digits...)."""


def parse_avro(schema: AvroSchemaLike) -> Any:
    """The fastavro-parsed form (named types resolved to full names); idempotent."""
    if isinstance(schema, Mapping) and schema.get("__fastavro_parsed"):
        return schema
    if isinstance(schema, str):
        with contextlib.suppress(ValueError):  # else a bare primitive name such as `string`
            schema = json.loads(schema)
    return parse_schema(dict(schema) if isinstance(schema, Mapping) else schema)


# ---------------------------------------------------------------- Avro -> Iceberg


def is_option_union(branches: list[Any]) -> bool:
    """Iceberg's ``isOptionSchema``: exactly two branches, one of them null."""
    return len(branches) == 2 and "null" in branches


class _Converter:
    """One walk over a parsed Avro schema. Ids are placeholders (a counter);
    callers assign fresh ids to the finished type."""

    def __init__(self, parsed: Any, format_version: int, ids: Iterator[int] | None = None) -> None:
        self.named: dict[str, Any] = (
            dict(parsed.get("__named_schemas", {})) if isinstance(parsed, dict) else {}
        )
        self.format_version = format_version
        self.stack: list[str] = []
        self.ids = ids if ids is not None else itertools.count(1)

    def _id(self) -> int:
        return next(self.ids)

    def resolve(self, node: Any) -> Any:
        """Named references become their definitions; primitive names stay strings."""
        if isinstance(node, str) and node in self.named:
            return self.named[node]
        return node

    def type_of(self, node: Any, where: str) -> IcebergType | None:
        """Iceberg type of an Avro type node; None for Avro null."""
        node = self.resolve(node)
        if isinstance(node, list):
            return self._union(node, where)
        if isinstance(node, str):
            return _PRIMITIVES.get(node) if node != "null" else None
        kind = node["type"]
        if kind == "record":
            return self._record(node, where)
        if kind == "array":
            return self._array(node, where)
        if kind == "map":
            value_type, value_required = self._required(node["values"], where + ".value")
            return MapType(
                self._id(), StringType(), self._id(), value_type, value_required=value_required
            )
        if kind == "enum":
            return StringType()
        if kind == "fixed":
            return _logical(node) or FixedType(int(node["size"]))
        if isinstance(kind, (dict, list)):  # {"type": {"type": "record", ...}} wrappers
            return self.type_of(kind, where)
        if kind == "null":
            return None
        return _logical(node) or _PRIMITIVES[kind]

    def _required(self, node: Any, where: str) -> tuple[IcebergType, bool]:
        """Type of a non-null position (list element, map value, field) and whether it is required."""
        node = self.resolve(node)
        result = self.type_of(node, where)
        if result is None:
            if self.format_version >= 3:
                return UnknownType(), False
            raise UnsupportedAvroSchema(
                f"{where}: an Avro null type has no Iceberg v{self.format_version} type"
            )
        return result, not _nullable(node)

    def _record(self, node: dict[str, Any], where: str) -> StructType:
        name = node["name"]
        if name in self.stack:
            raise UnsupportedAvroSchema(
                f"{where}: record {name} is recursive; Iceberg schemas cannot nest themselves"
            )
        self.stack.append(name)
        try:
            fields = [f for f in (self.field(f, where) for f in node["fields"]) if f is not None]
        finally:
            self.stack.pop()
        return StructType(*fields)

    def field(self, avro_field: Mapping[str, Any], where: str) -> NestedField | None:
        """A record field; None for a field of type null in a v1/v2 table (it can only hold nulls)."""
        path = f"{where}.{avro_field['name']}" if where else avro_field["name"]
        node = self.resolve(avro_field["type"])
        field_type = self.type_of(node, path)
        if field_type is None:
            if self.format_version < 3:
                return None
            field_type = UnknownType()
        required = not _nullable(node) and not isinstance(field_type, UnknownType)
        default = _default(node, field_type, avro_field) if self.format_version >= 3 else None
        return NestedField(
            self._id(),
            avro_field["name"],
            field_type,
            required=required,
            doc=avro_field.get("doc"),
            initial_default=default,
            write_default=default,
        )

    def _array(self, node: dict[str, Any], where: str) -> IcebergType:
        items = self.resolve(node["items"])
        if node.get("logicalType") == "map" and _is_key_value_record(items):
            fields = {f["name"]: f for f in items["fields"]}
            key_type, _ = self._required(fields["key"]["type"], where + ".key")
            value_type, value_required = self._required(fields["value"]["type"], where + ".value")
            return MapType(
                self._id(), key_type, self._id(), value_type, value_required=value_required
            )
        element_type, element_required = self._required(items, where + ".element")
        return ListType(self._id(), element_type, element_required=element_required)

    def _union(self, branches: list[Any], where: str) -> IcebergType | None:
        resolved = [self.resolve(b) for b in branches]
        if is_option_union(branches):
            (other,) = [b for b in resolved if b != "null"]
            return self.type_of(other, where)
        if all(b == "null" for b in resolved):
            return None
        fields = [NestedField(self._id(), "tag", IntegerType(), required=True)]
        index = 0
        for branch in resolved:
            if branch == "null":
                continue
            branch_type = self.type_of(branch, f"{where}.field{index}")
            assert branch_type is not None
            fields.append(NestedField(self._id(), f"field{index}", branch_type, required=False))
            index += 1
        return StructType(*fields)


_PRIMITIVES: dict[str, IcebergType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "string": StringType(),
    "bytes": BinaryType(),
}


def _nullable(node: Any) -> bool:
    """A union with a null branch (option or complex) or a bare null."""
    return node == "null" or (isinstance(node, list) and "null" in node)


def _is_key_value_record(node: Any) -> bool:
    return (
        isinstance(node, dict)
        and node.get("type") == "record"
        and sorted(f["name"] for f in node.get("fields", [])) == ["key", "value"]
    )


def _logical(node: Mapping[str, Any]) -> IcebergType | None:
    """Iceberg type of a valid logical type, else None (Avro ignores invalid ones, and so do we)."""
    logical = node.get("logicalType")
    kind = node.get("type")
    if logical is None:
        return None
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision = int(node.get("precision", 0))
        scale = int(node.get("scale", 0))
        if precision > MAX_DECIMAL_PRECISION:
            raise UnsupportedAvroSchema(
                f"decimal({precision}, {scale}): Iceberg decimals hold at most 38 digits"
            )
        if precision <= 0 or not 0 <= scale <= precision:
            return None
        return DecimalType(precision, scale)
    if logical == "date" and kind == "int":
        return DateType()
    if (logical, kind) in (("time-millis", "int"), ("time-micros", "long")):
        return TimeType()
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return TimestamptzType() if _adjust_to_utc(node) else TimestampType()
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return TimestampType()
    if logical == "uuid" and (
        kind == "string" or (kind == "fixed" and int(node.get("size", 0)) == 16)
    ):
        return UUIDType()
    return None


def _adjust_to_utc(node: Mapping[str, Any]) -> bool:
    """Iceberg's ``isTimestamptz``: the ``adjust-to-utc`` property, true when absent."""
    value = node.get("adjust-to-utc")
    if value is None:
        return True
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


def _default(node: Any, field_type: IcebergType, avro_field: Mapping[str, Any]) -> Any:
    """The field's Avro default as an Iceberg default, for primitive types only."""
    if "default" not in avro_field or avro_field["default"] is None:
        return None
    value = avro_field["default"]
    if isinstance(node, list) and node and node[0] == "null":
        return None  # a union's default belongs to its first branch
    if isinstance(field_type, BooleanType) and isinstance(value, bool):
        return value
    if (
        isinstance(field_type, (IntegerType, LongType))
        and isinstance(value, int)
        and not isinstance(value, bool)
    ):
        return value
    if isinstance(field_type, (FloatType, DoubleType)) and isinstance(value, (int, float)):
        return float(value)
    if isinstance(field_type, StringType) and isinstance(value, str):
        return value
    if isinstance(field_type, (BinaryType, FixedType)) and isinstance(value, str):
        return value.encode("latin-1")  # Avro JSON encodes bytes as code points 0-255
    return None


def fresh_ids(schema: Schema) -> Schema:
    """The schema with ids 1..n assigned as Iceberg's ``AssignFreshIds`` does
    (a struct's fields first, then into each field's type in order; a map's
    key and value ids before their types). pyiceberg's ``assign_fresh_schema_ids``
    numbers the same way but drops ``initial-default``/``write-default``."""
    ids = itertools.count(1)
    return Schema(*_fresh_fields(schema.fields, ids))


def _fresh_fields(fields: tuple[NestedField, ...], ids: Iterator[int]) -> list[NestedField]:
    new_ids = [next(ids) for _ in fields]
    return [
        NestedField(
            new_id,
            f.name,
            _fresh_type(f.field_type, ids),
            required=f.required,
            doc=f.doc,
            initial_default=f.initial_default,
            write_default=f.write_default,
        )
        for new_id, f in zip(new_ids, fields, strict=True)
    ]


def _fresh_type(t: IcebergType, ids: Iterator[int]) -> IcebergType:
    if isinstance(t, StructType):
        return StructType(*_fresh_fields(t.fields, ids))
    if isinstance(t, ListType):
        element_id = next(ids)
        return ListType(
            element_id, _fresh_type(t.element_type, ids), element_required=t.element_required
        )
    if isinstance(t, MapType):
        key_id, value_id = next(ids), next(ids)
        return MapType(
            key_id,
            _fresh_type(t.key_type, ids),
            value_id,
            _fresh_type(t.value_type, ids),
            value_required=t.value_required,
        )
    return t


def avro_to_iceberg_type(schema: AvroSchemaLike, format_version: int = 2) -> IcebergType:
    """The Iceberg type of any Avro schema (ids fresh from 1, in Iceberg's order)."""
    result = _type_with_placeholder_ids(parse_avro(schema), format_version, itertools.count(1))
    return fresh_ids(Schema(NestedField(0, "v", result, required=True))).fields[0].field_type


def _type_with_placeholder_ids(parsed: Any, format_version: int, ids: Iterator[int]) -> IcebergType:
    result, _ = _Converter(parsed, format_version, ids)._required(parsed, "")
    return result


def avro_to_iceberg_schema(schema: AvroSchemaLike, format_version: int = 2) -> Schema:
    """``AvroSchemaUtil.toIceberg``: the fields of a record schema as an Iceberg schema."""
    parsed = parse_avro(schema)
    if not _is_record(parsed):
        raise UnsupportedAvroSchema("only a record schema converts to a table schema")
    return fresh_ids(Schema(*_value_fields(parsed, format_version, itertools.count(1))))


def _is_record(parsed: Any) -> bool:
    return isinstance(parsed, dict) and parsed.get("type") == "record"


def _value_fields(parsed: Any, format_version: int, ids: Iterator[int]) -> list[NestedField]:
    struct = _Converter(parsed, format_version, ids).type_of(parsed, "")
    assert isinstance(struct, StructType)
    return list(struct.fields)


# ---------------------------------------------------------------- the table


def system_fields(key_type: IcebergType) -> list[NestedField]:
    """``_kafka_key``, ``_kafka_headers`` map<string,binary> and ``_kafka_metadata``
    struct(partition int, offset long, timestamp timestamptz), ids placeholders."""
    return [
        NestedField(-1, KAFKA_KEY, key_type, required=False, doc="Kafka record key"),
        NestedField(
            -2,
            KAFKA_HEADERS,
            MapType(-3, StringType(), -4, BinaryType(), value_required=False),
            required=False,
            doc="Kafka record headers",
        ),
        NestedField(
            -5,
            KAFKA_METADATA,
            StructType(
                NestedField(-6, "partition", IntegerType(), required=True),
                NestedField(-7, "offset", LongType(), required=True),
                NestedField(-8, "timestamp", TimestamptzType(), required=True),
            ),
            required=True,
            doc="Kafka partition, offset and record timestamp",
        ),
    ]


def key_column_type(
    key_type: str = "string",
    key_schema: AvroSchemaLike | None = None,
    ids: Iterator[int] | None = None,
) -> IcebergType:
    """Type of ``_kafka_key`` for ``automq.table.topic.convert.key.type`` (placeholder ids from ``ids``)."""
    if key_type == "string":
        return StringType()
    if key_type == "raw":
        return BinaryType()
    if key_type in ("by_schema_id", "by_latest_schema"):
        if key_schema is None:
            raise ValueError(f"convert.key.type={key_type} needs the key's Avro schema")
        return _type_with_placeholder_ids(parse_avro(key_schema), 2, ids or itertools.count(1))
    raise ValueError(f"unknown convert.key.type {key_type!r}; expected one of {CONVERT_TYPES}")


def table_schema(
    value_schema: AvroSchemaLike | None = None,
    *,
    key_type: str = "string",
    value_type: str = "by_schema_id",
    transform: str = "flatten",
    key_schema: AvroSchemaLike | None = None,
    format_version: int = 2,
) -> Schema:
    """The Iceberg schema of a table topic's table, fresh ids.

    System columns come first, so their ids (1-3) are the same in every table.
    With ``transform=flatten`` and a record value schema the record's fields
    are the next top-level columns (DESIGN: "the value's fields flattened");
    otherwise the whole value is one ``_kafka_value`` column: a struct for
    ``transform=none``, string or binary for ``convert.value.type`` ``string``/``raw``.
    """
    if transform not in TRANSFORM_TYPES:
        raise ValueError(
            f"unknown transform.value.type {transform!r}; expected one of {TRANSFORM_TYPES}"
        )
    ids = itertools.count(1)  # placeholders, unique across key and value; fresh ids at the end
    fields = system_fields(key_column_type(key_type, key_schema, ids))
    if value_type == "raw":
        fields.append(NestedField(-9, KAFKA_VALUE, BinaryType(), required=False))
    elif value_type == "string":
        fields.append(NestedField(-9, KAFKA_VALUE, StringType(), required=False))
    elif (
        value_type == "json"
    ):  # the value's columns are inferred from the records, round by round (json_values)
        if transform == "flatten_debezium":
            fields.append(cdc_field())
    elif value_type in ("by_schema_id", "by_latest_schema"):
        if value_schema is None:
            raise ValueError(f"convert.value.type={value_type} needs the value's Avro schema")
        parsed = parse_avro(value_schema)
        if transform == "flatten_debezium":
            parsed = debezium_row(parsed)
        if transform in ("flatten", "flatten_debezium") and _is_record(parsed):
            value_fields = _value_fields(parsed, format_version, ids)
            clash = sorted(f.name for f in value_fields if f.name in RESERVED_COLUMNS)
            if clash:
                raise UnsupportedAvroSchema(
                    f"value fields {clash} clash with Icefall's system columns"
                )
            fields.extend(value_fields)
            if transform == "flatten_debezium":
                if any(f.name == CDC for f in value_fields):
                    raise UnsupportedAvroSchema(
                        f"the row has a field {CDC}, the column Debezium's metadata goes in"
                    )
                fields.append(cdc_field())
        else:
            value = _type_with_placeholder_ids(parsed, format_version, ids)
            fields.append(NestedField(-9, KAFKA_VALUE, value, required=False))
    else:
        raise ValueError(
            f"unknown convert.value.type {value_type!r}; expected one of {CONVERT_TYPES}"
        )
    return fresh_ids(Schema(*fields))


CDC = "_cdc"


def cdc_field() -> NestedField:
    """``_cdc`` struct(op, ts, offset, source) of a ``flatten_debezium`` table (placeholder ids)."""
    return NestedField(
        -20,
        CDC,
        StructType(
            NestedField(-21, "op", StringType(), required=False),
            NestedField(-22, "ts", TimestamptzType(), required=False),
            NestedField(-23, "offset", LongType(), required=False),
            NestedField(-24, "source", StringType(), required=False),
        ),
        required=False,
        doc="Debezium operation (c, r, u, d), event time, Kafka offset, source (JSON)",
    )


def debezium_row(envelope: Any) -> Any:
    """The row record of a Debezium envelope: the record type of its ``after`` field (``before`` has
    the same); raises ``UnsupportedAvroSchema`` for a value that is not an envelope."""
    fields = {f.get("name"): f for f in envelope.get("fields", [])} if _is_record(envelope) else {}
    after = fields.get("after")
    if after is None or "op" not in fields:
        raise UnsupportedAvroSchema(
            "transform.value.type=flatten_debezium needs a Debezium envelope "
            "(a record with before, after, op, ts_ms, source)"
        )
    rows = []
    for name in ("before", "after"):  # the record is defined in the first, named in the second
        kind = fields[name]["type"] if name in fields else []
        rows += [b for b in (kind if isinstance(kind, list) else [kind]) if _is_record(b)]
    if not rows:
        raise UnsupportedAvroSchema(
            "the envelope's after field must be a record (or null and a record)"
        )
    return rows[0]


def value_is_flattened(schema: Schema) -> bool:
    """Whether the table holds the value's fields as top-level columns (no ``_kafka_value``)."""
    return KAFKA_VALUE not in {f.name for f in schema.fields}


# ---------------------------------------------------------------- Arrow


def arrow_schema(schema: Schema, flavor: ArrowFlavor = "iceberg") -> pa.Schema:
    """The Arrow schema of the table's rows, field ids in ``PARQUET:field_id`` metadata.

    ``iceberg``: what pyiceberg writes (uuid as the arrow.uuid extension,
    fixed as fixed_size_binary, time as time64[us]), but with 32-bit offsets.
    ``spark``: what Spark 3.5 expects from Arrow (``mapInArrow``) for Iceberg's Spark
    types (uuid as string, fixed as binary); Spark has no time type, so a time
    column is refused.
    """
    return pa.schema([_arrow_field(f, flavor) for f in schema.fields])


def _arrow_field(field: NestedField, flavor: ArrowFlavor) -> pa.Field:
    return pa.field(
        field.name,
        arrow_type(field.field_type, flavor),
        nullable=not field.required,
        metadata={b"PARQUET:field_id": str(field.field_id).encode()},
    )


def arrow_type(field_type: IcebergType, flavor: ArrowFlavor = "iceberg") -> pa.DataType:
    if isinstance(field_type, StructType):
        return pa.struct([_arrow_field(f, flavor) for f in field_type.fields])
    if isinstance(field_type, ListType):
        return pa.list_(_arrow_field(field_type.element_field, flavor))
    if isinstance(field_type, MapType):
        return pa.map_(
            _arrow_field(field_type.key_field, flavor), _arrow_field(field_type.value_field, flavor)
        )
    assert isinstance(field_type, PrimitiveType)
    return _arrow_primitive(field_type, flavor)


def _arrow_primitive(t: PrimitiveType, flavor: ArrowFlavor) -> pa.DataType:
    simple: dict[type, pa.DataType] = {
        BooleanType: pa.bool_(),
        IntegerType: pa.int32(),
        LongType: pa.int64(),
        FloatType: pa.float32(),
        DoubleType: pa.float64(),
        DateType: pa.date32(),
        StringType: pa.string(),
        BinaryType: pa.binary(),
        TimestampType: pa.timestamp("us"),
        TimestamptzType: pa.timestamp("us", tz="UTC"),
        UnknownType: pa.null(),
    }
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, FixedType):
        return pa.binary(len(t)) if flavor == "iceberg" else pa.binary()
    if isinstance(t, UUIDType):
        return pa.uuid() if flavor == "iceberg" else pa.string()
    if isinstance(t, TimeType):
        if flavor == "spark":
            raise UnsupportedAvroSchema(
                "Spark 3.5 has no time type: Iceberg time columns cannot be written from Spark"
            )
        return pa.time64("us")
    raise UnsupportedAvroSchema(f"no Arrow type for Iceberg {t}")


def storage_type(t: pa.DataType) -> pa.DataType:
    """``t`` with extension types (arrow.uuid) replaced by their storage: Arrow
    cannot build nested extension values from Python, so arrays are built on
    the storage type and then viewed (zero copy) as ``t``."""
    if isinstance(t, pa.BaseExtensionType):
        return t.storage_type
    if isinstance(t, pa.StructType):
        return pa.struct([f.with_type(storage_type(f.type)) for f in t])
    if isinstance(t, pa.MapType):
        return pa.map_(
            t.key_field.with_type(storage_type(t.key_type)),
            t.item_field.with_type(storage_type(t.item_type)),
        )
    if isinstance(t, pa.ListType):
        return pa.list_(t.value_field.with_type(storage_type(t.value_type)))
    return t
