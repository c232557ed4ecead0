"""Decode Avro data with its writer schema into Python values shaped for the Iceberg table.

fastavro decodes with the writer schema (the registry id in the record), so no
Avro schema resolution happens; the table's columns are matched by name when
Arrow arrays are built (``spark_jobs.decode.rows``): fields the table lacks are
ignored, columns the record lacks stay null.

Most values need no change between fastavro and Arrow (dicts for records and
maps, lists, Decimal, date/time/datetime). What does, a ``DecodePlan`` does,
compiled once per schema id and table schema, touching only the paths that need it:

- complex unions: Iceberg stores them as struct<tag, field0..fieldN>, so the
  branch that was written must be known exactly, and fastavro returns only the
  value (an int written as the ``long`` branch of [int, long] is
  indistinguishable). The decode schema therefore wraps every branch of a
  complex union in a one-field record: a record's encoding is its fields'
  encodings, so the bytes read the same, and fastavro's
  ``return_record_name`` names the wrapper, hence the branch;
- uuid: 16 bytes for the arrow.uuid extension (built on its storage type),
  a canonical string for Spark;
- Iceberg's array-of-key/value maps: a list of (key, value) pairs.
"""

from __future__ import annotations

import io
import itertools
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fastavro import parse_schema, schemaless_reader
from pyiceberg.types import IcebergType, ListType, MapType, StructType, UUIDType

from spark_jobs.decode.avro_schema import ArrowFlavor, is_option_union

WRAPPER_NAMESPACE = "icefall_union_branch"
MAGIC = 0
WIRE_HEADER = 5  # magic byte + 4-byte big-endian schema id

Convert = Callable[[Any], Any]


class TrailingBytesError(ValueError):
    """The Avro body decoded but bytes were left over: written with another schema."""


def wire_schema_id(data: bytes | None) -> int | None:
    """The schema id of a Confluent wire-format payload, None if it has none."""
    if data is None or len(data) < WIRE_HEADER or data[0] != MAGIC:
        return None
    schema_id: int = struct.unpack_from(">I", data, 1)[0]
    return schema_id


@dataclass(frozen=True)
class DecodePlan:
    """How to turn one schema id's payloads into table-shaped values."""

    decode_schema: Any  # fastavro-parsed, complex-union branches wrapped
    convert: Convert | None  # None: fastavro's value is already right

    def decode(self, data: bytes, offset: int = WIRE_HEADER) -> Any:
        """The value of the Avro body that starts at ``offset``; raises on bad or trailing bytes."""
        stream = io.BytesIO(data)
        stream.seek(offset)
        value = schemaless_reader(
            stream, self.decode_schema, None, True, True
        )  # return_record_name(_override)
        if stream.tell() != len(data):
            raise TrailingBytesError(f"{len(data) - stream.tell()} bytes left after the Avro value")
        return value if self.convert is None else self.convert(value)


def build_plan(
    writer_parsed: Any, target: IcebergType, flavor: ArrowFlavor = "iceberg"
) -> DecodePlan:
    """The plan for a fastavro-parsed writer schema whose values go to a column of type ``target``
    (a StructType of the table's value columns when the value is flattened)."""
    decode_schema = parse_schema(_wrap_unions(writer_parsed, itertools.count()))
    named = decode_schema.get("__named_schemas", {}) if isinstance(decode_schema, dict) else {}
    return DecodePlan(decode_schema, _Compiler(named, flavor).compile(decode_schema, target))


# ---------------------------------------------------------------- the decode schema


def _wrap_unions(node: Any, counter: Iterator[int]) -> Any:
    """A copy of the schema with every complex-union branch wrapped in a record
    ``icefall_union_branch.bN`` of one field ``v``: same binary encoding."""
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        if is_option_union(node) or all(b == "null" for b in node):
            return [_wrap_unions(b, counter) for b in node]
        return [
            b
            if b == "null"
            else {
                "type": "record",
                "name": f"{WRAPPER_NAMESPACE}.b{next(counter)}",
                "fields": [{"name": "v", "type": _wrap_unions(b, counter)}],
            }
            for b in node
        ]
    out = {k: v for k, v in node.items() if not k.startswith("__")}
    kind = node["type"]
    if kind == "record":
        out["fields"] = [{**f, "type": _wrap_unions(f["type"], counter)} for f in node["fields"]]
    elif kind == "array":
        out["items"] = _wrap_unions(node["items"], counter)
    elif kind == "map":
        out["values"] = _wrap_unions(node["values"], counter)
    elif isinstance(kind, (dict, list)):
        out["type"] = _wrap_unions(kind, counter)
    return out


def _is_wrapper(node: Any) -> bool:
    return isinstance(node, dict) and str(node.get("name", "")).startswith(WRAPPER_NAMESPACE + ".")


# ---------------------------------------------------------------- conversions


class _Compiler:
    def __init__(self, named: dict[str, Any], flavor: ArrowFlavor) -> None:
        self.named = named
        self.flavor = flavor

    def resolve(self, node: Any) -> Any:
        return self.named.get(node, node) if isinstance(node, str) else node

    def compile(self, node: Any, target: IcebergType) -> Convert | None:
        node = self.resolve(node)
        if isinstance(node, list):
            return self._union(node, target)
        if isinstance(node, str):
            return None
        kind = node["type"]
        if isinstance(kind, (dict, list)):
            return self.compile(kind, target)
        if kind == "record" and isinstance(target, StructType):
            return self._record(node, target)
        if kind == "array":
            return self._array(node, target)
        if kind == "map" and isinstance(target, MapType):
            return _each_value(self.compile(node["values"], target.value_type))
        if isinstance(target, UUIDType) and node.get("logicalType") == "uuid":
            return self._uuid(kind)
        return None

    def _record(self, node: dict[str, Any], target: StructType) -> Convert | None:
        columns = {f.name: f.field_type for f in target.fields}
        steps = [
            (f["name"], c)
            for f in node["fields"]
            if f["name"] in columns
            for c in [self.compile(f["type"], columns[f["name"]])]
            if c is not None
        ]
        if not steps:
            return None

        def record(value: dict[str, Any]) -> dict[str, Any]:
            for name, convert in steps:
                value[name] = convert(value.get(name))
            return value

        return record

    def _array(self, node: dict[str, Any], target: IcebergType) -> Convert | None:
        items = self.resolve(node["items"])
        if isinstance(target, MapType):  # Iceberg's array of {key, value} records
            key = self.compile(_field_type(items, "key"), target.key_type) or _same
            val = self.compile(_field_type(items, "value"), target.value_type) or _same
            return lambda entries: [(key(e["key"]), val(e["value"])) for e in entries]
        if isinstance(target, ListType):
            element = self.compile(items, target.element_type)
            if element is not None:
                return lambda values: [element(v) for v in values]
        return None

    def _union(self, branches: list[Any], target: IcebergType) -> Convert | None:
        if not any(
            _is_wrapper(self.resolve(b)) for b in branches
        ):  # an option union (or only null)
            other = [b for b in branches if b != "null"]
            compiled = self.compile(other[0], target) if other else None
            if compiled is None:
                return None
            inner: Convert = compiled
            return lambda v: None if v is None else inner(v)
        if not isinstance(target, StructType):
            return None  # the table does not hold a union here; Arrow will refuse the value
        columns = {f.name: f.field_type for f in target.fields}
        by_name: dict[str, tuple[int, str, Convert]] = {}
        for tag, wrapper in enumerate(self.resolve(b) for b in branches if b != "null"):
            column = f"field{tag}"
            branch = (
                self.compile(wrapper["fields"][0]["type"], columns[column])
                if column in columns
                else None
            )
            by_name[wrapper["name"]] = (tag, column, branch or _same)
        if len(by_name) == 1:  # fastavro names a record only in unions of several records
            ((only_tag, only_column, only),) = by_name.values()
            return lambda v: None if v is None else {"tag": only_tag, only_column: only(v["v"])}

        def union(v: Any) -> Any:
            if v is None:
                return None
            tag, column, inner = by_name[v[0]]
            return {"tag": tag, column: inner(v[1]["v"])}

        return union

    def _uuid(self, kind: str) -> Convert | None:
        if self.flavor == "iceberg":  # arrow.uuid, built on its storage: 16 bytes
            return None if kind == "fixed" else (lambda v: None if v is None else v.bytes)
        if kind == "fixed":
            return lambda v: None if v is None else str(uuid.UUID(bytes=bytes(v)))
        return lambda v: None if v is None else str(v)


def _same(value: Any) -> Any:
    return value


def _each_value(convert: Convert | None) -> Convert | None:
    if convert is None:
        return None
    return lambda mapping: {k: convert(v) for k, v in mapping.items()}


def _field_type(record: Any, name: str) -> Any:
    return next(f["type"] for f in record["fields"] if f["name"] == name)
