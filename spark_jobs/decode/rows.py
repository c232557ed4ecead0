"""Kafka records (``segments.RecordChunk``) -> Arrow record batches of the table's rows.

Keys and values are converted as the topic's ``automq.table.topic.convert.*``
configs say:

- ``string``: the bytes as UTF-8 text (validated by Arrow, vectorised);
- ``raw``: the bytes as they are;
- ``by_schema_id``: Confluent wire format (magic 0, 4-byte schema id, Avro
  body), decoded with the writer schema the id names (``SchemaLookup``) and
  projected by name into the table's columns (``avro_decode``). A record
  schema of flat primitive fields is decoded by the C extension straight
  into Arrow columns instead (``avro_columns``: same rows, same error rows,
  ~20x faster); without the extension, or for any other schema, the general path.

With a flattened table the value's record fields are the top-level columns;
otherwise the value fills ``_kafka_value``. Every row also gets ``_kafka_key``,
``_kafka_headers`` and ``_kafka_metadata`` (partition, offset, timestamp as
UTC microseconds).

A record that cannot become a row is not an exception: it becomes a
``DecodeError`` (offset, error class, message and the raw record) next to the
batch, so the round can send it to the DLQ or fail, as
``automq.table.topic.errors.tolerance`` says. So is a record whose schema the
table has not been evolved for (``TableSchemaBehind``): the round must apply
``evolution.plan_evolution`` for every schema id it will write
(``schema_ids``) before converting, or data would be dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, StructType

from spark_jobs.decode import avro_columns, avro_schema
from spark_jobs.decode.avro_decode import (
    MAGIC,
    WIRE_HEADER,
    DecodePlan,
    TrailingBytesError,
    build_plan,
    wire_schema_id,
)
from spark_jobs.decode.avro_schema import (
    KAFKA_HEADERS,
    KAFKA_KEY,
    KAFKA_METADATA,
    KAFKA_VALUE,
    ArrowFlavor,
    AvroSchemaLike,
)
from spark_jobs.decode.segments import Headers, RecordChunk
from spark_jobs.rounds import evolution

SchemaLookup = Callable[[int], AvroSchemaLike]
"""Schema id -> the registered Avro schema (JSON text, JSON-like or fastavro-parsed);
raises (any exception) for an id it does not know or a schema that is not Avro."""

# error classes of DecodeError
MISSING_WIRE_HEADER = "MissingWireHeader"
UNKNOWN_SCHEMA = "UnknownSchema"
INCOMPATIBLE_SCHEMA = "IncompatibleSchema"
TABLE_SCHEMA_BEHIND = "TableSchemaBehind"
AVRO_DECODE = "AvroDecodeError"
TRAILING_BYTES = "TrailingBytes"
INVALID_UTF8 = "InvalidUtf8"
NULL_IN_REQUIRED = "NullInRequiredColumn"
ARROW_CONVERSION = "ArrowConversionError"


@dataclass(frozen=True, slots=True)
class DecodeError:
    """A record that did not become a row, with everything a DLQ row needs."""

    partition: int
    offset: int
    timestamp: int  # ms
    error_class: str
    message: str
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


@dataclass
class Rows:
    batch: pa.RecordBatch
    errors: list[DecodeError] = field(default_factory=list)


DLQ_ARROW_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("error_class", pa.string()),
        ("message", pa.string()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.map_(pa.string(), pa.binary())),
    ]
)


def errors_to_arrow(errors: Iterable[DecodeError]) -> pa.RecordBatch:
    """Decode errors as a record batch (``DLQ_ARROW_SCHEMA``) for a DLQ table."""
    errors = list(errors)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([e.partition for e in errors], pa.int32()),
            pa.array([e.offset for e in errors], pa.int64()),
            pa.array([e.timestamp * 1000 for e in errors], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            pa.array([e.error_class for e in errors], pa.string()),
            pa.array([e.message for e in errors], pa.string()),
            pa.array([e.key for e in errors], pa.binary()),
            pa.array([e.value for e in errors], pa.binary()),
            pa.array([list(e.headers) for e in errors], DLQ_ARROW_SCHEMA.field("headers").type),
        ],
        schema=DLQ_ARROW_SCHEMA,
    )


def schema_ids(chunk: RecordChunk, *, keys: bool = False) -> set[int]:
    """The schema ids the chunk's values (or keys) name: what the table must be evolved for."""
    column = chunk.keys if keys else chunk.values
    return {i for i in map(wire_schema_id, column) if i is not None}


class _Failure(Exception):
    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


class RowConverter:
    """Converts chunks for one table. Keep one per task: decode plans are
    compiled once per schema id and cached here."""

    def __init__(
        self,
        table: Schema,
        lookup: SchemaLookup | None = None,
        *,
        key_type: str = "string",
        value_type: str = "by_schema_id",
        flavor: ArrowFlavor = "iceberg",
        use_extension: bool = True,
    ) -> None:
        for name, kind in (("key", key_type), ("value", value_type)):
            if kind == "by_latest_schema":
                raise ValueError(f"convert.{name}.type=by_latest_schema is not supported yet")
            if kind not in ("string", "raw", "by_schema_id"):
                raise ValueError(f"unknown convert.{name}.type {kind!r}")
            if kind == "by_schema_id" and lookup is None:
                raise ValueError(f"convert.{name}.type=by_schema_id needs a schema lookup")
        self.table = table
        self.lookup = lookup
        self.key_type = key_type
        self.value_type = value_type
        self.flavor = flavor
        self.arrow_schema = avro_schema.arrow_schema(table, flavor)
        self.flattened = avro_schema.value_is_flattened(table)
        names = {f.name for f in table.fields}
        missing = {KAFKA_KEY, KAFKA_HEADERS, KAFKA_METADATA} - names
        if missing:
            raise ValueError(f"table schema lacks the system columns {sorted(missing)}")
        if self.flattened and value_type != "by_schema_id":
            raise ValueError(f"convert.value.type={value_type} needs a {KAFKA_VALUE} column")
        expected = {"raw": "binary", "string": "string"}.get(value_type)
        if expected and str(table.find_field(KAFKA_VALUE).field_type) != expected:
            raise ValueError(
                f"convert.value.type={value_type} needs {KAFKA_VALUE} of type {expected}"
            )
        system = {KAFKA_KEY, KAFKA_HEADERS, KAFKA_METADATA}
        self.value_fields = [f for f in table.fields if f.name not in system]
        self.value_target: IcebergType = (
            StructType(*self.value_fields)
            if self.flattened
            else table.find_field(KAFKA_VALUE).field_type
        )
        self.key_target = table.find_field(KAFKA_KEY).field_type
        self._plans: dict[tuple[str, int], DecodePlan | _Failure] = {}
        # flat records decode straight into Arrow columns with the C extension (avro_columns)
        self._use_columns = use_extension and avro_columns.available()
        self._writers: dict[tuple[str, int], Any] = {}
        self._column_plans: dict[tuple[str, int], avro_columns.ColumnPlan | None] = {}

    # ------------------------------------------------------------ plans

    def _plan(self, role: str, schema_id: int) -> DecodePlan:
        """The decode plan for a key or value schema id; raises ``_Failure`` (cached too)."""
        cached = self._plans.get((role, schema_id))
        if cached is None:
            try:
                cached = self._build(role, schema_id)
            except _Failure as failure:
                cached = failure
            self._plans[(role, schema_id)] = cached
        if isinstance(cached, _Failure):
            raise cached
        return cached

    def _build(self, role: str, schema_id: int) -> DecodePlan:
        assert self.lookup is not None
        try:
            writer = avro_schema.parse_avro(self.lookup(schema_id))
        except Exception as exc:
            raise _Failure(
                UNKNOWN_SCHEMA, f"schema id {schema_id}: {type(exc).__name__}: {exc}"
            ) from exc
        self._writers[(role, schema_id)] = writer
        target = self.value_target if role == "value" else self.key_target
        try:
            changes = self._changes(role, writer)
        except (evolution.IncompatibleSchemaChange, avro_schema.UnsupportedAvroSchema) as exc:
            raise _Failure(INCOMPATIBLE_SCHEMA, f"schema id {schema_id}: {exc}") from exc
        if changes:
            raise _Failure(
                TABLE_SCHEMA_BEHIND,
                f"schema id {schema_id} needs the table to "
                + "; ".join(evolution.describe(changes)),
            )
        return build_plan(writer, target, self.flavor)

    def _changes(self, role: str, writer: Any) -> list[evolution.SchemaChange]:
        if role == "key":
            wanted = avro_schema.key_column_type("by_schema_id", writer)
            return evolution.plan_schema_update(
                Schema(NestedField(1, KAFKA_KEY, self.key_target, required=False)),
                Schema(NestedField(1, KAFKA_KEY, wanted, required=False)),
            )
        if self.flattened:
            current = Schema(*self.value_fields)
            if not (isinstance(writer, dict) and writer.get("type") == "record"):
                raise avro_schema.UnsupportedAvroSchema(
                    "a flattened table needs a record value schema"
                )
            return evolution.plan_schema_update(current, avro_schema.avro_to_iceberg_schema(writer))
        wanted = avro_schema.avro_to_iceberg_type(writer)
        return evolution.plan_schema_update(
            Schema(NestedField(1, KAFKA_VALUE, self.value_target, required=False)),
            Schema(NestedField(1, KAFKA_VALUE, wanted, required=False)),
        )

    def _decode_all(
        self, role: str, data: list[bytes | None], bad: dict[int, _Failure]
    ) -> list[Any]:
        """Decoded payloads (None for null and for failures, which go to ``bad``)."""
        out: list[Any] = []
        append = out.append
        plans: dict[int, DecodePlan] = {}
        for i, item in enumerate(data):
            if item is None:
                append(None)
                continue
            try:
                if len(item) < WIRE_HEADER or item[0] != MAGIC:
                    raise _Failure(
                        MISSING_WIRE_HEADER,
                        f"{role} lacks the Confluent wire format (magic byte 0 + schema id)",
                    )
                schema_id = int.from_bytes(item[1:WIRE_HEADER], "big")
                plan = plans.get(schema_id)
                if plan is None:
                    plan = plans[schema_id] = self._plan(role, schema_id)
                try:
                    append(plan.decode(item))
                except TrailingBytesError as exc:
                    raise _Failure(
                        TRAILING_BYTES, f"{role} with schema id {schema_id}: {exc}"
                    ) from exc
                except Exception as exc:  # fastavro raises many kinds on garbage
                    raise _Failure(
                        AVRO_DECODE,
                        f"{role} with schema id {schema_id}: {type(exc).__name__}: {exc}",
                    ) from exc
            except _Failure as failure:
                bad.setdefault(i, failure)
                append(None)
        return out

    # ------------------------------------------------------------ rows

    def convert(self, chunk: RecordChunk) -> Rows:
        n = len(chunk)
        bad: dict[int, _Failure] = {}
        keys = self._column(chunk, "key", self.key_type, chunk.keys, self.key_target, bad)
        values = self._column(chunk, "value", self.value_type, chunk.values, self.value_target, bad)
        columns: dict[str, pa.Array] = {
            KAFKA_KEY: keys,
            KAFKA_HEADERS: self._headers(chunk),
            KAFKA_METADATA: self._metadata(chunk),
        }
        if self.flattened:
            assert isinstance(values, pa.StructArray)
            for f, child in zip(self.value_fields, values.flatten(), strict=True):
                columns[f.name] = child
        else:
            columns[KAFKA_VALUE] = values
        for f in self.table.fields:
            _check_required(columns[f.name], f, f.name, bad)
        arrays = [columns[f.name] for f in self.table.fields]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)
        if not bad:
            return Rows(batch)
        keep = pa.array([i not in bad for i in range(n)], pa.bool_())
        errors = [
            DecodeError(
                chunk.partition,
                chunk.offsets[i],
                chunk.timestamps[i],
                f.error_class,
                f.message
                + (
                    " (the value is null: a tombstone)"
                    if f.error_class == NULL_IN_REQUIRED and chunk.values[i] is None
                    else ""
                ),
                chunk.keys[i],
                chunk.values[i],
                chunk.headers[i],
            )
            for i, f in sorted(bad.items())
        ]
        return Rows(batch.filter(keep), errors)

    def _column(
        self,
        chunk: RecordChunk,
        role: str,
        kind: str,
        data: list[bytes | None],
        target: IcebergType,
        bad: dict[int, _Failure],
    ) -> pa.Array:
        if kind == "raw":
            return pa.array(data, pa.binary())
        if kind == "string":
            return _utf8(data, role, bad)
        if self._use_columns and isinstance(target, StructType):
            array = self._columns(role, data, bad)
            if array is not None:
                return array
        # the type is built here only: building it costs as much as converting a chunk's keys
        arrow_type = avro_schema.arrow_type(target, self.flavor)
        return _to_arrow(self._decode_all(role, data, bad), arrow_type, role, bad)

    def _column_plan(self, role: str, schema_id: int) -> avro_columns.ColumnPlan | None:
        """The C decoder's plan for a schema id, None when the id fails (``_plan``
        decides how) or its schema is beyond the C decoder."""
        key = (role, schema_id)
        if key not in self._column_plans:
            try:
                self._plan(role, schema_id)
            except _Failure:
                plan = None
            else:
                target = self.value_target if role == "value" else self.key_target
                plan = avro_columns.compile_columns(self._writers[key], target, self.flavor)
            self._column_plans[key] = plan
        return self._column_plans[key]

    def _columns(
        self, role: str, data: list[bytes | None], bad: dict[int, _Failure]
    ) -> pa.Array | None:
        """The column decoded by the C decoder (``avro_columns``), or None when the
        first schema id in ``data`` needs the general path. Values of other schema ids
        (or without the wire format) are converted by a recursive call or the general
        path and merged in, row for row."""
        first = next(
            (
                item
                for item in data
                if item is not None and len(item) >= WIRE_HEADER and item[0] == MAGIC
            ),
            None,
        )
        if first is None:
            return None
        schema_id = int.from_bytes(first[1:WIRE_HEADER], "big")
        plan = self._column_plan(role, schema_id)
        if plan is None:
            return None
        try:
            decoded = plan.decode(data, first[:WIRE_HEADER])
        except OverflowError:  # more string data than one Arrow array holds: the general path
            return None
        for i, kind, message in decoded.bad:
            if kind == avro_columns.TRAILING:
                failure = _Failure(TRAILING_BYTES, f"{role} with schema id {schema_id}: {message}")
            elif kind == avro_columns.CONVERSION:
                failure = _Failure(ARROW_CONVERSION, f"{role} does not fit the table: {message}")
            else:
                failure = _Failure(AVRO_DECODE, f"{role} with schema id {schema_id}: {message}")
            bad.setdefault(i, failure)
        if not decoded.others:
            return decoded.array
        n = len(data)
        rest: list[bytes | None] = [None] * n
        for i in decoded.others:
            rest[i] = data[i]
        other = self._columns(role, rest, bad)
        if other is None:
            arrow_type = avro_schema.arrow_type(
                self.value_target if role == "value" else self.key_target, self.flavor
            )
            other = _to_arrow(self._decode_all(role, rest, bad), arrow_type, role, bad)
        take = list(range(n))
        for i in decoded.others:
            take[i] = n + i
        return pa.concat_arrays([decoded.array, other]).take(pa.array(take, pa.int64()))

    def _headers(self, chunk: RecordChunk) -> pa.Array:
        """The headers column. Most records have none: a chunk without any is n empty maps
        made from one offsets buffer, not n empty tuples converted one by one (~4 ms per
        100,000 records, half of this module's own conversions at that size)."""
        headers_type = self.arrow_schema.field(KAFKA_HEADERS).type
        n = len(chunk)
        if chunk.headers.count(()) != n:
            return pa.array(chunk.headers, headers_type)
        return pa.MapArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), n + 1),
            pa.array([], headers_type.key_type),
            pa.array([], headers_type.item_type),
            type=headers_type,
        )

    def _metadata(self, chunk: RecordChunk) -> pa.StructArray:
        n = len(chunk)
        micros = pc.multiply(pa.array(chunk.timestamps, pa.int64()), 1000)
        metadata_type = self.arrow_schema.field(KAFKA_METADATA).type
        return pa.StructArray.from_arrays(
            [
                pa.repeat(pa.scalar(chunk.partition, pa.int32()), n),
                pa.array(chunk.offsets, pa.int64()),
                micros.cast(pa.timestamp("us", tz="UTC")),
            ],
            fields=list(metadata_type),
        )


def _utf8(data: list[bytes | None], role: str, bad: dict[int, _Failure]) -> pa.Array:
    binary = pa.array(data, pa.binary())
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    clean: list[bytes | None] = []
    for i, item in enumerate(data):
        if item is not None:
            try:
                item.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad.setdefault(i, _Failure(INVALID_UTF8, f"{role} is not UTF-8: {exc}"))
                item = None
        clean.append(item)
    return pa.array(clean, pa.binary()).cast(pa.string())


def _to_arrow(
    values: list[Any], arrow_type: pa.DataType, role: str, bad: dict[int, _Failure]
) -> pa.Array:
    """One Arrow array; a value Arrow refuses (out of range, wrong type) fails its row only."""
    build = avro_schema.storage_type(arrow_type)
    try:
        array = pa.array(values, build)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        for i, value in enumerate(values):
            try:
                pa.array([value], build)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                message = f"{role} does not fit the table: {type(exc).__name__}: {exc}"
                bad.setdefault(i, _Failure(ARROW_CONVERSION, message))
                values[i] = None
        array = pa.array(values, build)
    return array if build == arrow_type else array.view(arrow_type)


def _check_required(
    array: pa.Array,
    f: NestedField,
    path: str,
    bad: dict[int, _Failure],
    rows: pa.Array | None = None,
) -> None:
    """Mark rows with a null where the table requires a value (Arrow does not
    enforce non-nullable fields when building from Python). ``rows`` maps the
    array's slots to batch rows (None: one slot per row). A null under a null
    parent is no violation: struct children are taken with the parent's
    validity merged in (``StructArray.flatten``)."""
    if f.required and array.null_count:
        nulls = pc.indices_nonzero(array.is_null())
        for i in (rows.take(nulls) if rows is not None else nulls).to_pylist():
            bad.setdefault(
                i,
                _Failure(
                    NULL_IN_REQUIRED,
                    f"column {path} is required but the record has no value for it",
                ),
            )
    t = f.field_type
    if isinstance(t, StructType):
        assert isinstance(array, pa.StructArray)
        for child, child_array in zip(t.fields, array.flatten(), strict=True):
            if child.required and child_array.null_count > array.null_count:
                missing = pc.and_(array.is_valid(), child_array.is_null())
                positions = pc.indices_nonzero(missing)
                for i in (rows.take(positions) if rows is not None else positions).to_pylist():
                    bad.setdefault(
                        i,
                        _Failure(
                            NULL_IN_REQUIRED,
                            f"column {path}.{child.name} is required but the record has no value for it",
                        ),
                    )
            _check_required(child_array, _optional(child), f"{path}.{child.name}", bad, rows)
    elif isinstance(t, (ListType, MapType)):
        assert isinstance(array, pa.ListArray)  # MapArray is a ListArray
        if isinstance(array, pa.MapArray):  # list kernels abort on maps: view as list<entries>
            entries = pa.struct([array.type.key_field, array.type.item_field])
            array = array.view(pa.list_(pa.field("entries", entries, nullable=False)))
        parents = pc.list_parent_indices(array)
        slot_rows = rows.take(parents) if rows is not None else parents
        items = array.flatten()
        if isinstance(t, ListType):
            _check_required(items, t.element_field, f"{path}.element", bad, slot_rows)
        else:
            assert isinstance(items, pa.StructArray)
            _check_required(items.field(1), t.value_field, f"{path}.value", bad, slot_rows)


def _optional(f: NestedField) -> NestedField:
    """The field with its own requiredness already checked: recurse into its children only."""
    return NestedField(f.field_id, f.name, f.field_type, required=False)
