"""Flat Avro records straight into Arrow columns, in C (``spark_jobs._avro_columns``).

The general path (``avro_decode`` + ``pa.array``) makes a Python dict per record
and Python objects per field: ~15 µs for a 500-byte record of 16 fields. For a
writer schema that is a flat record of primitives, ``compile_columns`` compiles
a column program once per schema id; ``ColumnPlan.decode`` then has the C
extension append every field to the buffers of its Arrow column, and only
wraps the buffers (``pa.Array.from_buffers``) at the end.

Supported (anything else: ``compile_columns`` returns None and the caller uses
the general path):

- a record writer schema whose fields are null, boolean, int, long, float,
  double, string, bytes, enum (-> string), or ["null", T] / [T, "null"] of
  those; logical types date, timestamp-millis/-micros and
  local-timestamp-millis/-micros (-> Arrow timestamp[us], with or without
  zone as the table column says); other logical types fastavro converts
  (decimal, uuid, time-*) are not supported; ones it ignores are their
  underlying type, as for fastavro;
- a table target whose columns matched by name have the writer field's type,
  or int -> long / float -> double (Iceberg promotions the table may have had);
  target columns the writer lacks are all null; writer fields the table lacks
  are decoded (checked) and dropped.

The result is the general path's, error rows included: the C decoder reads as
fastavro does (see ``spark_jobs/_avro_columns.c``).
"""

from __future__ import annotations

import importlib
import struct
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pyarrow as pa
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from spark_jobs.decode import avro_schema
from spark_jobs.decode.avro_schema import ArrowFlavor

_ext: ModuleType | None
try:
    _ext = importlib.import_module("spark_jobs._avro_columns")
except ImportError:  # not built: the general path only
    _ext = None

# bad row kinds (the C side's)
DECODE = 1
TRAILING = 2
CONVERSION = 3

NO_COLUMN = 0xFFFFFFFF

# column kinds
COL_BOOL, COL_I32, COL_I64, COL_F32, COL_F64, COL_BIN = 1, 2, 3, 4, 5, 6

# field ops
OP_NULL, OP_BOOLEAN, OP_INT, OP_LONG, OP_FLOAT, OP_DOUBLE = 0, 1, 2, 3, 4, 5
OP_STRING, OP_BYTES, OP_ENUM, OP_DATE, OP_TS_MILLIS, OP_TS_MICROS = 6, 7, 8, 9, 10, 11

# field unions
U_NONE, U_NULL_FIRST, U_NULL_SECOND, U_NULL_ONLY = 0, 1, 2, 3

_PRIMITIVE_OPS = {
    "null": OP_NULL,
    "boolean": OP_BOOLEAN,
    "int": OP_INT,
    "long": OP_LONG,
    "float": OP_FLOAT,
    "double": OP_DOUBLE,
    "string": OP_STRING,
    "bytes": OP_BYTES,
}
_LOGICAL_OPS = {
    "int-date": OP_DATE,
    "long-timestamp-millis": OP_TS_MILLIS,
    "long-local-timestamp-millis": OP_TS_MILLIS,
    "long-timestamp-micros": OP_TS_MICROS,
    "long-local-timestamp-micros": OP_TS_MICROS,
}
# (writer op, Iceberg column type) -> column kind
_SINKS: dict[tuple[int, type], int] = {
    (OP_BOOLEAN, BooleanType): COL_BOOL,
    (OP_INT, IntegerType): COL_I32,
    (OP_INT, LongType): COL_I64,
    (OP_LONG, LongType): COL_I64,
    (OP_FLOAT, FloatType): COL_F32,
    (OP_FLOAT, DoubleType): COL_F64,
    (OP_DOUBLE, DoubleType): COL_F64,
    (OP_STRING, StringType): COL_BIN,
    (OP_ENUM, StringType): COL_BIN,
    (OP_BYTES, BinaryType): COL_BIN,
    (OP_DATE, DateType): COL_I32,
    (OP_TS_MILLIS, TimestampType): COL_I64,
    (OP_TS_MILLIS, TimestamptzType): COL_I64,
    (OP_TS_MICROS, TimestampType): COL_I64,
    (OP_TS_MICROS, TimestamptzType): COL_I64,
}


def available() -> bool:
    """Whether the C extension is built."""
    return _ext is not None


def _fastavro_logical() -> frozenset[str]:
    try:
        from fastavro.read import LOGICAL_READERS

        return frozenset(LOGICAL_READERS)
    except ImportError:  # pragma: no cover
        return frozenset()


_FASTAVRO_LOGICAL = _fastavro_logical()


class _Unsupported(Exception):
    pass


@dataclass(frozen=True)
class Decoded:
    array: pa.StructArray  # one row per value; null where the value is None, bad or in ``others``
    bad: list[tuple[int, int, str]]  # (index, DECODE/TRAILING/CONVERSION, message)
    others: list[int]  # indexes of values that do not start with the header: not decoded here


@dataclass(frozen=True)
class ColumnPlan:
    """The column program of one writer schema for one table target."""

    program: bytes
    arrow_type: pa.StructType  # the target's Arrow type (field ids, nullability)
    slots: tuple[int | None, ...]  # per target column: its program column, None: all null

    def decode(self, values: list[bytes | None], header: bytes) -> Decoded:
        """The values that start with ``header`` (magic byte + schema id) decoded into
        one struct array. Raises OverflowError past 2 GiB of string data in a column."""
        assert _ext is not None
        row_valid, row_nulls, columns, bad, others = _ext.decode(self.program, values, header)
        n = len(values)
        children = []
        for f, slot in zip(self.arrow_type, self.slots, strict=True):
            if slot is None:
                storage = avro_schema.storage_type(f.type)
                nulls = pa.nulls(n, storage)
                children.append(nulls if storage == f.type else nulls.view(f.type))
                continue
            valid, nulls_count, data_values, data = columns[slot]
            buffers = [pa.py_buffer(valid), pa.py_buffer(data_values)]
            if data is not None:
                buffers.append(pa.py_buffer(data))
            children.append(pa.Array.from_buffers(f.type, n, buffers, null_count=nulls_count))
        array = pa.Array.from_buffers(
            self.arrow_type, n, [pa.py_buffer(row_valid)], null_count=row_nulls, children=children
        )
        assert isinstance(array, pa.StructArray)
        return Decoded(array, bad, others)


def compile_columns(
    writer: Any, target: IcebergType, flavor: ArrowFlavor = "iceberg"
) -> ColumnPlan | None:
    """The column plan for a fastavro-parsed writer schema whose values go to a column
    of type ``target`` (the StructType of the table's value columns when the value is
    flattened); None when the C decoder cannot do it (or is not built)."""
    if _ext is None or not isinstance(target, StructType):
        return None
    try:
        return _compile(writer, target, flavor)
    except _Unsupported:
        return None


def _compile(writer: Any, target: StructType, flavor: ArrowFlavor) -> ColumnPlan:
    named: dict[str, Any] = writer.get("__named_schemas", {}) if isinstance(writer, dict) else {}
    if not (isinstance(writer, dict) and writer.get("type") == "record"):
        raise _Unsupported("not a record")
    try:
        arrow_type = avro_schema.arrow_type(target, flavor)
    except avro_schema.UnsupportedAvroSchema as exc:
        raise _Unsupported(str(exc)) from exc
    assert isinstance(arrow_type, pa.StructType)
    columns = {f.name: (i, f.field_type) for i, f in enumerate(target.fields)}
    slots: list[int | None] = [None] * len(target.fields)
    kinds: list[int] = []
    fields = b""
    seen: set[str] = set()
    for avro_field in writer["fields"]:
        name = avro_field["name"]
        if name in seen:
            raise _Unsupported("duplicate field")
        seen.add(name)
        op, union, symbols = _field_op(avro_field["type"], named)
        column = NO_COLUMN
        if name in columns and op != OP_NULL:  # a null field leaves its column null
            index, column_type = columns[name]
            kind = _SINKS.get((op, type(column_type)))
            if kind is None:
                raise _Unsupported(f"{name}: no sink")
            column = len(kinds)
            kinds.append(kind)
            slots[index] = column
        encoded_name = name.encode()
        fields += struct.pack("<BBII", op, union, column, len(encoded_name)) + encoded_name
        if op == OP_ENUM:
            fields += struct.pack("<I", len(symbols))
            for symbol in symbols:
                encoded = symbol.encode()
                fields += struct.pack("<I", len(encoded)) + encoded
    program = (
        b"AVC1"
        + struct.pack("<I", len(kinds))
        + bytes(kinds)
        + struct.pack("<I", len(writer["fields"]))
        + fields
    )
    return ColumnPlan(program, arrow_type, tuple(slots))


def _field_op(node: Any, named: dict[str, Any]) -> tuple[int, int, list[str]]:
    """(op, union, enum symbols) of a field's type."""
    node = _resolve(node, named)
    if isinstance(node, list):
        branches = [_resolve(b, named) for b in node]
        if branches == ["null"]:
            return OP_NULL, U_NULL_ONLY, []
        if len(branches) != 2 or branches.count("null") != 1:
            raise _Unsupported("complex union")
        union = U_NULL_FIRST if branches[0] == "null" else U_NULL_SECOND
        other = branches[1] if union == U_NULL_FIRST else branches[0]
        op, inner, symbols = _plain_op(other)
        if inner != U_NONE or op == OP_NULL:
            raise _Unsupported("nested union")
        return op, union, symbols
    return _plain_op(node)


def _plain_op(node: Any) -> tuple[int, int, list[str]]:
    if isinstance(node, str):
        if node in _PRIMITIVE_OPS:
            return _PRIMITIVE_OPS[node], U_NONE, []
        raise _Unsupported(node)
    if isinstance(node, list):
        raise _Unsupported("nested union")
    kind = node.get("type")
    if kind == "enum":
        symbols = node.get("symbols")
        if not (isinstance(symbols, list) and all(isinstance(s, str) for s in symbols)):
            raise _Unsupported("enum symbols")
        return OP_ENUM, U_NONE, symbols
    if not isinstance(kind, str) or kind not in _PRIMITIVE_OPS:
        raise _Unsupported(str(kind))  # record, array, map, fixed, wrapped types
    logical = node.get("logicalType")
    if logical is not None:
        key = f"{kind}-{logical}"
        if key in _LOGICAL_OPS:
            return _LOGICAL_OPS[key], U_NONE, []
        if key in _FASTAVRO_LOGICAL:  # a conversion fastavro makes (decimal, uuid, time...)
            raise _Unsupported(key)
    return _PRIMITIVE_OPS[kind], U_NONE, []


def _resolve(node: Any, named: dict[str, Any]) -> Any:
    if isinstance(node, str) and node in named:
        return named[node]
    return node
