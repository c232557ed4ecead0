"""``convert.value.type=json``: columns inferred from the records' JSON values, evolved round by round.

The rules (README "JSON values"):

- a record's value is one JSON object, whose fields become top-level columns;
  a value that is not an object (a scalar, an array) or not valid JSON is
  undecodable (``InvalidJson``: the DLQ with ``errors.tolerance`` invalid_data
  or all); a null value is a tombstone (a row of nulls; a delete in upsert mode);
- types come from Spark's JSON schema inference over the round's objects:
  integers -> long, other numbers -> double, true/false -> boolean, strings ->
  string (no date guessing), objects -> struct, arrays -> list; within a round
  conflicting values widen as Spark does (long + double -> double, anything +
  string -> string); a field that is null in every record of the round gets no
  column until a round sees a value;
- across rounds new fields, nested ones too, become new optional columns; a
  column never changes type: a record whose value does not fit it (``"x"`` or
  ``1.5`` for a long column) does not fit the table (``JsonDoesNotFit``: fails
  the round, or goes to the DLQ with ``errors.tolerance=all``).

With ``transform.value.type=flatten_debezium`` the values are Debezium
JsonConverter envelopes (``schemas.enable=false``): the row's columns are
inferred from ``after``/``before``, and the rows get ``_cdc`` (``upsert``).

How it runs: the executors stage the values as UTF-8 text (``convert string``)
in the round's staging directory, as an upsert round does (``upsert``); the
driver has Spark infer the schema of the staged objects, evolves the table,
parses the values with the table's own column types (``from_json``, permissive,
so a record that does not fit is caught, not turned into nulls) and writes the
rows to the round branch with Spark's Iceberg writer (append) or MERGE (upsert),
in one snapshot carrying the offsets, like every round.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    IcebergType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

from spark_jobs.decode.avro_schema import CDC, KAFKA_HEADERS, KAFKA_KEY, KAFKA_METADATA, KAFKA_VALUE
from spark_jobs.decode.rows import DecodeError
from spark_jobs.rounds import evolution

log = logging.getLogger(__name__)

INVALID_JSON = "InvalidJson"
JSON_DOES_NOT_FIT = "JsonDoesNotFit"
CORRUPT = "__icefall_corrupt"
SYSTEM = (KAFKA_KEY, KAFKA_HEADERS, KAFKA_METADATA)


def iceberg_type(spark_type: Any, ids: list[int]) -> IcebergType | None:
    """The Iceberg type of a Spark-inferred JSON type (placeholder ids from ``ids``); None for
    a type with no values yet (NullType, or a struct/list of only such)."""
    from pyspark.sql import types as T

    def next_id() -> int:
        ids[0] -= 1
        return ids[0]

    if isinstance(spark_type, T.LongType):
        return LongType()
    if isinstance(spark_type, T.DoubleType):
        return DoubleType()
    if isinstance(spark_type, T.BooleanType):
        return BooleanType()
    if isinstance(spark_type, T.StringType):
        return StringType()
    if isinstance(spark_type, T.StructType):
        fields = []
        for f in spark_type.fields:
            child = iceberg_type(f.dataType, ids)
            if child is not None:
                fields.append(NestedField(next_id(), f.name, child, required=False))
        return StructType(*fields) if fields else None
    if isinstance(spark_type, T.ArrayType):
        element = iceberg_type(spark_type.elementType, ids)
        return ListType(next_id(), element, element_required=False) if element is not None else None
    if isinstance(spark_type, T.NullType):
        return None
    return StringType()  # any other inferred type (decimal with prefersDecimal): its text


def _merged(current: IcebergType, inferred: IcebergType) -> IcebergType:
    """The column keeps its type; structs gain the inferred struct's new fields."""
    if isinstance(current, StructType) and isinstance(inferred, StructType):
        have = {f.name: f for f in current.fields}
        new = {f.name: f for f in inferred.fields}
        fields = [
            NestedField(
                f.field_id,
                f.name,
                _merged(f.field_type, new[f.name].field_type) if f.name in new else f.field_type,
                required=f.required,
                doc=f.doc,
            )
            for f in current.fields
        ]
        fields += [f for f in inferred.fields if f.name not in have]
        return StructType(*fields)
    if isinstance(current, ListType) and isinstance(inferred, ListType):
        return ListType(
            current.element_id,
            _merged(current.element_type, inferred.element_type),
            element_required=current.element_required,
        )
    return current


def target_schema(current: Schema, inferred: Any) -> Schema:
    """The table schema with the inferred value fields added (existing columns keep their types)."""
    ids = [0]
    value = iceberg_type(inferred, ids)
    merged = _merged(
        current.as_struct(),
        StructType(
            *[
                f
                for f in (value.fields if isinstance(value, StructType) else [])
                if f.name not in SYSTEM
            ]
        ),
    )
    assert isinstance(merged, StructType)
    return Schema(*merged.fields)


def evolve(table: Table, inferred: Any) -> list[str]:
    """Add the inferred new columns to the table (a schema-only commit, like ``table_setup.evolve``)."""
    changes = evolution.plan_schema_update(table.schema(), target_schema(table.schema(), inferred))
    if not changes:
        return []
    with table.update_schema() as update:
        evolution.apply_schema_changes(update, changes)
    described = evolution.describe(changes)
    log.info("evolved %s from JSON values: %s", table.name(), "; ".join(described))
    return described


@dataclass
class Parsed:
    rows: Any  # DataFrame in the table's columns
    errors: list[DecodeError] = field(default_factory=list)
    schema_changes: list[str] = field(default_factory=list)


def _objects_filter() -> str:
    return f"LTRIM(`{KAFKA_VALUE}`) LIKE '{{%' AND FROM_JSON(`{KAFKA_VALUE}`, 'MAP<STRING,STRING>') IS NOT NULL"


def _debezium_row(inferred: Any) -> Any:
    """The row type of inferred Debezium JSON envelopes: ``after``'s fields, then ``before``'s."""
    from pyspark.sql import types as T

    names = {f.name: f.dataType for f in inferred.fields}
    if "op" not in names or not ({"after", "before"} & set(names)):
        raise ValueError(
            "transform.value.type=flatten_debezium: the JSON values are not Debezium envelopes "
            "(before, after, op, ts_ms, source; JsonConverter with schemas.enable=false)"
        )
    fields: dict[str, Any] = {}
    for side in ("after", "before"):
        if isinstance(names.get(side), T.StructType):
            for f in names[side].fields:
                fields.setdefault(f.name, f)
    return T.StructType(list(fields.values()))


def parse(spark: Any, staged: Any, table: Table, table_name: str, debezium: bool = False) -> Parsed:
    """Infer, evolve ``table``, and parse the staged values into rows of its columns (``table_name``:
    Spark's name for it); records that are not JSON objects or do not fit come back as errors.
    ``debezium``: the values are Debezium envelopes; the rows are their ``after`` (``before``
    for op d) with ``_cdc``, as ``upsert.debezium_rows_sql`` makes them."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    try:
        objects = staged.where(_objects_filter())
        invalid = staged.where(f"`{KAFKA_VALUE}` IS NOT NULL AND NOT ({_objects_filter()})")
        # Spark's JSON inference over a Dataset[String], all in the JVM (``as`` is a Python keyword)
        encoder = spark.sparkContext._jvm.org.apache.spark.sql.Encoders.STRING()
        texts = getattr(objects.select(KAFKA_VALUE)._jdf, "as")(encoder)
        reader = (
            spark._jsparkSession.read()
            .option("prefersDecimal", "false")
            .option("dropFieldIfAllNull", "true")
        )
        inferred_json = reader.json(texts).schema().json()
        inferred = T.StructType.fromJson(json.loads(inferred_json))
        changes = evolve(table, _debezium_row(inferred) if debezium else inferred)
        value_type = T.StructType(
            [f for f in spark.table(table_name).schema.fields if f.name not in SYSTEM]
        )
        parse_type = value_type
        if debezium:
            row = T.StructType([f for f in value_type.fields if f.name != CDC])
            parse_type = T.StructType(
                [
                    T.StructField("before", row),
                    T.StructField("after", row),
                    T.StructField("op", T.StringType()),
                    T.StructField("ts_ms", T.LongType()),
                    T.StructField("source", T.StringType()),
                ]
            )  # an object's JSON text
        with_corrupt = T.StructType([*parse_type.fields, T.StructField(CORRUPT, T.StringType())])
        parsed = objects.unionByName(staged.where(f"`{KAFKA_VALUE}` IS NULL")).withColumn(
            "__v",
            F.from_json(
                F.col(KAFKA_VALUE),
                with_corrupt,
                {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
            ),
        )
        unfit = parsed.where(f"__v.`{CORRUPT}` IS NOT NULL")
        good = parsed.where(f"__v IS NULL OR __v.`{CORRUPT}` IS NULL")
        if debezium:
            from spark_jobs.rounds.upsert import debezium_rows_sql

            envelopes = good.select(
                *[F.col(f"`{c}`") for c in SYSTEM],
                F.col("__v").dropFields(CORRUPT).alias(KAFKA_VALUE),
            )
            envelopes.createOrReplaceTempView("__icefall_json_envelopes")
            rows = spark.sql(
                debezium_rows_sql(
                    "__icefall_json_envelopes", envelopes.schema, table.refresh().schema()
                )
            )
        else:
            rows = good.select(
                *[F.col(f"`{c}`") for c in SYSTEM],
                *[F.col(f"__v.`{f.name}`").alias(f.name) for f in value_type.fields],
            )
        errors = _errors(invalid, INVALID_JSON, "value is not a JSON object") + _errors(
            unfit,
            JSON_DOES_NOT_FIT,
            "value does not fit the table's columns "
            f"({', '.join(f'{f.name} {f.dataType.simpleString()}' for f in value_type.fields)})",
        )
        return Parsed(rows, errors, changes)
    finally:
        spark.catalog.dropTempView("__icefall_json_envelopes")


def _errors(frame: Any, error_class: str, message: str) -> list[DecodeError]:
    """The bad records as DLQ entries (they are few: collected to the driver)."""
    out = []
    for r in frame.select(*[f"`{c}`" for c in (*SYSTEM, KAFKA_VALUE)]).collect():
        meta = r[KAFKA_METADATA]
        key = r[KAFKA_KEY]
        key_bytes = (
            key.encode()
            if isinstance(key, str)
            else bytes(key)
            if isinstance(key, (bytes, bytearray))
            else None
        )
        headers = tuple(
            (k, bytes(v) if v is not None else None) for k, v in (r[KAFKA_HEADERS] or {}).items()
        )
        out.append(
            DecodeError(
                meta["partition"],
                meta["offset"],
                int(meta["timestamp"].timestamp() * 1000),
                error_class,
                message,
                key_bytes,
                r[KAFKA_VALUE].encode(),
                headers,
            )
        )
    return sorted(out, key=lambda e: (e.partition, e.offset))
