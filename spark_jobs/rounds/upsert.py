"""Upsert and CDC rounds: each round is one ``MERGE INTO`` on the id columns, merge-on-read.

A topic with ``automq.table.topic.upsert.enable=true`` (or a ``cdc.field``)
and ``id.columns`` makes the table hold the latest row per id instead of
every record:

- within a round the last record per id wins (highest offset, then highest
  partition: Kafka keeps one key in one partition, so across partitions the
  order is a tie-break, not a promise);
- a record whose ``cdc.field`` starts with ``D`` (case-insensitive) deletes
  its id, ``I``/``U`` upsert it; any other value (or a record without an
  id) fails the round, naming the records, before anything is written;
- a tombstone (null value) deletes: its id comes from the Kafka key (the
  key struct's fields of the same names, or, for one id column, the key
  text cast to the column's type).

How it keeps the round's exactly-once design: the executors still decode
and write Parquet with pyarrow (``round_tasks``), but for an upsert round
into a *staging* directory of the table (``<location>/icefall-staging/<round>``)
with every column optional, so tombstones survive as rows. The driver then
runs Spark's ``MERGE INTO <table>.branch_icefall-round-<id>`` with the
staged files as the source. Iceberg's Spark writer does the merge-on-read
part (``write.merge.mode=merge-on-read``): it finds the positions of the
rows the round replaces and writes position-delete files (format v2; on a
v3 table Iceberg writes deletion vectors instead) plus the new rows, as ONE
snapshot on the round branch. The offsets and round id go into that
snapshot's summary through ``org.apache.iceberg.spark.CommitMetadata.
withCommitProperties``, called over py4j with a Python ``Callable``: py4j's
pinned-thread mode runs the callback's own ``spark.sql`` on the same JVM
thread, so Iceberg's thread-local commit properties apply to the MERGE's
commit (verified: the snapshot's summary carries ``icefall.offsets``).
From there the round is the same as an append round: ``round_snapshot``
checks the branch holds exactly one snapshot on the planned parent, and
``round_commit.publish`` fast-forwards ``main`` only if it is still there.
A retried round merges from scratch on a fresh branch; a killed one leaves
a branch nobody publishes and staging files that ``remove_orphan_files``
(maintenance) collects.

Why not write the delete files ourselves: position deletes need every
replaced row's file and position (a join against the table), and v3
deletion vectors need Puffin/roaring encoding; Iceberg's Spark writer does
both, correctly and distributed. Why not equality deletes: pyiceberg 0.12
does not read them, and every reader pays a join at read time.

``transform.value.type=flatten_debezium`` rounds are upsert rounds too: the
staged rows keep the whole envelope, and the merge source takes ``after`` (or
``before`` for op ``d``) and builds ``_cdc`` (``debezium_rows_sql``); ops
``c``/``r``/``u`` upsert, ``d`` deletes. JSON rounds (``json_values``) hand
``merge_round`` their parsed rows instead of the staged files.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    IcebergType,
    ListType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from broker import iceberg_json
from broker.topic_configs import ID_COLUMNS
from spark_jobs.broker_client import TableTopic
from spark_jobs.decode.avro_schema import CDC, KAFKA_HEADERS, KAFKA_KEY, KAFKA_METADATA, KAFKA_VALUE

log = logging.getLogger(__name__)

MERGE_ON_READ = {
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}
STAGING_DIR = "icefall-staging"
OP = "__icefall_op"
ID_PREFIX = "__icefall_id_"
ERRORS_SHOWN = 5
MISSING_ID = "MissingIdColumn"
BAD_CDC_OP = "UnknownCdcOperation"


class UpsertConfigError(ValueError):
    """The topic's upsert settings do not fit the table (a missing id column...)."""


class BadUpsertRecords(RuntimeError):
    """Records the round cannot merge (no id, an unknown CDC op); nothing was committed."""


@dataclass(frozen=True)
class UpsertOptions:
    id_columns: tuple[str, ...]
    cdc_field: str | None
    debezium: bool = (
        False  # transform.value.type=flatten_debezium: rows from before/after, ops c/r/u/d
    )

    @classmethod
    def of(cls, topic: TableTopic) -> UpsertOptions | None:
        """The topic's upsert settings, None for an append topic."""
        settings = topic.settings
        ids = parse_id_columns(settings.id_columns)
        upsert = settings.upsert_enabled
        cdc = settings.cdc_field
        debezium = settings.flatten_debezium
        if not upsert and cdc is None and not debezium:
            return None
        if not ids:
            raise UpsertConfigError(
                f"{topic.topic}: upsert, CDC and flatten_debezium need {ID_COLUMNS}"
            )
        if debezium:
            return cls(ids, f"{CDC}.op", debezium=True)
        return cls(ids, cdc)

    @property
    def upsert_letters(self) -> tuple[str, ...]:
        """First letters of the ops that upsert (the rest of the known ones, D, delete)."""
        return ("C", "R", "U") if self.debezium else ("I", "U")


def parse_id_columns(text: str) -> tuple[str, ...]:
    """``[id, a.b]`` -> ("id", "a.b")."""
    inner = text.strip().removeprefix("[").removesuffix("]")
    return tuple(item.strip() for item in inner.split(",") if item.strip())


def check_columns(schema: Schema, options: UpsertOptions) -> None:
    """Every id column (and the CDC field) must be a primitive column of the table."""
    for name in (*options.id_columns, *([options.cdc_field] if options.cdc_field else [])):
        found = schema.find_field(name, case_sensitive=True) if _has(schema, name) else None
        if found is None:
            raise UpsertConfigError(
                f"column {name!r} named by the topic's upsert settings is not in the table "
                f"(columns: {', '.join(f.name for f in schema.fields)})"
            )
        if isinstance(found.field_type, (StructType, ListType, MapType)):
            raise UpsertConfigError(
                f"column {name!r} must be a primitive column, not {found.field_type}"
            )


def _has(schema: Schema, name: str) -> bool:
    try:
        schema.find_field(name, case_sensitive=True)
    except ValueError:
        return False
    return True


def ensure_merge_on_read(table: Table) -> Table:
    """Row-level writes as merge-on-read (delete files, not rewritten data files); a metadata-only
    commit that leaves ``main`` where it is, so the round's planned parent still holds."""
    missing = {k: v for k, v in MERGE_ON_READ.items() if table.properties.get(k) != v}
    if not missing:
        return table
    with table.transaction() as tx:
        tx.set_properties(missing)
    return table.refresh()


# ---------------------------------------------------------------- staging


def _optional(t: IcebergType) -> IcebergType:
    if isinstance(t, StructType):
        return StructType(
            *(
                NestedField(f.field_id, f.name, _optional(f.field_type), required=False, doc=f.doc)
                for f in t.fields
            )
        )
    if isinstance(t, ListType):
        return ListType(t.element_id, _optional(t.element_type), element_required=False)
    if isinstance(t, MapType):
        return MapType(
            t.key_id,
            _optional(t.key_type),
            t.value_id,
            _optional(t.value_type),
            value_required=False,
        )
    return t


def staging_location(table: Table, round_id: str) -> str:
    return f"{table.metadata.location.rstrip('/')}/{STAGING_DIR}/{round_id}"


def staging_metadata_json(
    table: Table, round_id: str, envelope: Any = None, text_value: bool = False, relax: bool = True
) -> str:
    """The table's metadata as the round's tasks should see it for an upsert round: every
    column optional (a tombstone is a row of nulls until the MERGE turns it into a delete;
    ``relax=False`` keeps the table's required columns, for rows Spark appends as they are)
    and data files written under the round's staging directory, unpartitioned. With a
    Debezium ``envelope`` (Avro schema), the staged rows hold the whole envelope in
    ``_kafka_value`` instead of the table's columns: the MERGE's source picks ``after`` or
    ``before`` (``debezium_rows_sql``)."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.schema import assign_fresh_schema_ids

    from spark_jobs.decode.avro_schema import table_schema

    metadata = table.metadata
    current = metadata.schema()
    fields = list(_optional(current.as_struct()).fields if relax else current.fields)  # type: ignore[attr-defined]
    if text_value:  # convert.value.type=json: the value's text, parsed on the driver (json_values)
        fields = [f for f in fields if f.name in (KAFKA_KEY, KAFKA_HEADERS, KAFKA_METADATA)]
        fields.append(NestedField(0, KAFKA_VALUE, StringType(), required=False))
        fields = list(assign_fresh_schema_ids(Schema(*fields)).fields)
    elif envelope is not None:
        value = table_schema(envelope, transform="none").find_field(KAFKA_VALUE)
        fields = [f for f in fields if f.name in (KAFKA_KEY, KAFKA_HEADERS, KAFKA_METADATA)]
        fields.append(NestedField(0, KAFKA_VALUE, _optional(value.field_type), required=False))
        fields = list(assign_fresh_schema_ids(Schema(*fields)).fields)
    relaxed = Schema(*fields, schema_id=current.schema_id, identifier_field_ids=[])
    schemas = [relaxed if s.schema_id == current.schema_id else s for s in metadata.schemas]
    spec = UNPARTITIONED_PARTITION_SPEC
    specs = [s for s in metadata.partition_specs if s.spec_id != spec.spec_id] + [spec]
    properties = {**metadata.properties, "write.data.path": staging_location(table, round_id)}
    staged = metadata.model_copy(
        update={
            "schemas": schemas,
            "properties": properties,
            "partition_specs": specs,
            "default_spec_id": spec.spec_id,
            "last_column_id": max(metadata.last_column_id, relaxed.highest_field_id),
        }
    )
    return iceberg_json.to_json(staged)  # pyiceberg's own dump refuses v3 metadata


def remove_staging(table: Table, paths: Iterable[str]) -> None:
    """Best effort: the staged files are referenced by no snapshot (orphans if this fails)."""
    for path in paths:
        try:
            table.io.delete(path)
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the round's outcome
            log.warning("could not remove staging file %s: %s", path, exc)


# ---------------------------------------------------------------- the merge


def _quote(path: str) -> str:
    return ".".join(f"`{part}`" for part in path.split("."))


def _key_expr(schema: Schema, column: str, single: bool) -> str | None:
    """Where a tombstone's id comes from: the key struct's field of that name, or, with one id
    column, the key (text or bytes) cast to the column's type."""
    key_type = schema.find_field(KAFKA_KEY).field_type
    leaf = column.split(".")[-1]
    if isinstance(key_type, StructType):
        return f"`{KAFKA_KEY}`.`{leaf}`" if any(f.name == leaf for f in key_type.fields) else None
    if not single:
        return None
    target = schema.find_field(column).field_type
    text = (
        f"CAST(`{KAFKA_KEY}` AS STRING)" if isinstance(key_type, BinaryType) else f"`{KAFKA_KEY}`"
    )
    if isinstance(target, StringType):
        return text
    from pyiceberg.types import BooleanType, DoubleType, FloatType, IntegerType, LongType

    spark_types: dict[type, str] = {
        IntegerType: "INT",
        LongType: "BIGINT",
        FloatType: "FLOAT",
        DoubleType: "DOUBLE",
        BooleanType: "BOOLEAN",
    }
    spark_type = spark_types.get(type(target))
    return f"TRY_CAST(TRIM({text}) AS {spark_type})" if spark_type else None


def _tombstone(schema: Schema) -> str:
    """A staged row is a tombstone when its value is null: every value column null."""
    value_columns = [
        f.name for f in schema.fields if f.name not in (KAFKA_KEY, KAFKA_HEADERS, KAFKA_METADATA)
    ]
    if value_columns == [KAFKA_VALUE]:
        return f"`{KAFKA_VALUE}` IS NULL"
    return " AND ".join(f"`{c}` IS NULL" for c in value_columns) or "FALSE"


def _id_expr(schema: Schema, options: UpsertOptions, column: str) -> str:
    from_key = _key_expr(schema, column, len(options.id_columns) == 1)
    return f"CASE WHEN {_tombstone(schema)} THEN {from_key or 'NULL'} ELSE {_quote(column)} END"


def source_sql(view: str, schema: Schema, options: UpsertOptions) -> str:
    """The staged rows with their op (``U`` or ``D``) and ids, the last record per id only."""
    tombstone = _tombstone(schema)
    ids = [
        f"{_id_expr(schema, options, c)} AS `{ID_PREFIX}{i}`"
        for i, c in enumerate(options.id_columns)
    ]
    if options.cdc_field:
        first = f"UPPER(SUBSTRING(TRIM({_quote(options.cdc_field)}), 1, 1))"
        letters = ", ".join(f"'{c}'" for c in options.upsert_letters)
        op = (
            f"CASE WHEN {tombstone} THEN 'D' WHEN {first} IN ({letters}) THEN 'U' "
            f"WHEN {first} = 'D' THEN 'D' ELSE 'X' END"
        )
    else:
        op = f"CASE WHEN {tombstone} THEN 'D' ELSE 'U' END"
    id_list = ", ".join(f"`{ID_PREFIX}{i}`" for i in range(len(options.id_columns)))
    return (
        f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY {id_list} ORDER BY "
        f"`{KAFKA_METADATA}`.`offset` DESC, `{KAFKA_METADATA}`.`partition` DESC) AS __icefall_rank "
        f"FROM (SELECT *, {op} AS `{OP}`, {', '.join(ids)} FROM {view})) WHERE __icefall_rank = 1"
    )


def bad_rows_sql(view: str, schema: Schema, options: UpsertOptions) -> str:
    """Staged records the merge cannot take: no id, or a CDC op that is not I/U/D."""
    tombstone = _tombstone(schema)
    missing = " OR ".join(f"({_id_expr(schema, options, c)}) IS NULL" for c in options.id_columns)
    reasons = [f"WHEN {missing} THEN '{MISSING_ID}'"]
    if options.cdc_field:
        first = f"UPPER(SUBSTRING(TRIM({_quote(options.cdc_field)}), 1, 1))"
        known = ", ".join(f"'{c}'" for c in (*options.upsert_letters, "D"))
        reasons.append(
            f"WHEN NOT ({tombstone}) AND ({first} IS NULL OR {first} NOT IN ({known})) "
            f"THEN '{BAD_CDC_OP}'"
        )
    return (
        f"SELECT `{KAFKA_METADATA}`.`partition` AS p, `{KAFKA_METADATA}`.`offset` AS o, "
        f"CASE {' '.join(reasons)} END AS reason FROM {view} "
        f"WHERE CASE {' '.join(reasons)} END IS NOT NULL ORDER BY p, o"
    )


def debezium_rows_sql(view: str, staged: Any, schema: Schema) -> str:
    """The staged envelopes as table rows: ``after`` (``before`` for op d) for the row's columns,
    ``_cdc`` = (op, ts_ms as a timestamp, Kafka offset, source as JSON); a tombstone stays all null.
    ``staged``: the staged DataFrame's Spark schema (fields an envelope lacks become nulls)."""
    envelope = {f.name: f.dataType for f in staged[KAFKA_VALUE].dataType.fields}
    row_fields = set(envelope["after"].fieldNames()) if "after" in envelope else set()
    deleting = f"LOWER(SUBSTRING(TRIM(`{KAFKA_VALUE}`.`op`), 1, 1)) = 'd'"
    columns = [f"`{KAFKA_KEY}`", f"`{KAFKA_HEADERS}`", f"`{KAFKA_METADATA}`"]
    for f in schema.fields:
        if f.name in (KAFKA_KEY, KAFKA_HEADERS, KAFKA_METADATA, CDC):
            continue
        if f.name in row_fields:
            columns.append(
                f"CASE WHEN {deleting} THEN `{KAFKA_VALUE}`.`before`.`{f.name}` "
                f"ELSE `{KAFKA_VALUE}`.`after`.`{f.name}` END AS `{f.name}`"
            )
        else:
            columns.append(f"NULL AS `{f.name}`")
    ts = (
        f"TIMESTAMP_MILLIS(`{KAFKA_VALUE}`.`ts_ms`)"
        if "ts_ms" in envelope
        else "CAST(NULL AS TIMESTAMP)"
    )
    source = "CAST(NULL AS STRING)"
    if "source" in envelope:  # a struct (Avro) or already its JSON text (JSON envelopes)
        source = (
            f"`{KAFKA_VALUE}`.`source`"
            if envelope["source"].typeName() == "string"
            else f"TO_JSON(`{KAFKA_VALUE}`.`source`)"
        )
    columns.append(
        f"CASE WHEN `{KAFKA_VALUE}` IS NULL THEN NULL ELSE NAMED_STRUCT('op', `{KAFKA_VALUE}`.`op`, "
        f"'ts', {ts}, 'offset', `{KAFKA_METADATA}`.`offset`, 'source', {source}) END AS `{CDC}`"
    )
    return f"SELECT {', '.join(columns)} FROM {view}"


def merge_sql(target: str, source: str, schema: Schema, options: UpsertOptions) -> str:
    on = " AND ".join(
        f"t.{_quote(c)} = s.`{ID_PREFIX}{i}`" for i, c in enumerate(options.id_columns)
    )
    columns = [f"`{f.name}`" for f in schema.fields]
    sets = ", ".join(f"t.{c} = s.{c}" for c in columns)
    return (
        f"MERGE INTO {target} t USING {source} s ON {on} "
        f"WHEN MATCHED AND s.`{OP}` = 'D' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {sets} "
        f"WHEN NOT MATCHED AND s.`{OP}` = 'U' THEN INSERT ({', '.join(columns)}) "
        f"VALUES ({', '.join('s.' + c for c in columns)})"
    )


@dataclass(frozen=True)
class MergeOutcome:
    merged: bool  # False: nothing to merge (no staged rows), the caller adds an empty snapshot
    # with ``only``: the (partition, offset) of those records that won their id and were merged,
    # and of those the merge cannot take (no id, no I/U/D op), which were left out
    applied: tuple[tuple[int, int], ...] = ()
    bad: tuple[tuple[int, int], ...] = ()


def keep_offsets(
    spark: Any, frame: Any, pairs: Iterable[tuple[int, int]], how: str = "left_semi"
) -> Any:
    """The rows of ``frame`` whose Kafka (partition, offset) is one of ``pairs`` (``how="left_anti"``:
    is none of them)."""
    wanted = spark.createDataFrame(sorted(set(pairs)), "p INT, o BIGINT")
    meta = frame[KAFKA_METADATA]
    return frame.join(
        wanted, (meta["partition"] == wanted["p"]) & (meta["offset"] == wanted["o"]), how
    )


def _offsets(frame: Any) -> tuple[tuple[int, int], ...]:
    """The (partition, offset) of every row (collected: only for the DLQ's few records)."""
    rows = frame.select(f"`{KAFKA_METADATA}`.`partition`", f"`{KAFKA_METADATA}`.`offset`").collect()
    return tuple(sorted((int(r[0]), int(r[1])) for r in rows))


def with_commit_properties(
    spark: Any, properties: dict[str, str], action: Callable[[], None]
) -> None:
    """Run ``action`` (Spark SQL) with Iceberg's ``CommitMetadata`` set: its commit carries ``properties``."""
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    jvm = spark.sparkContext._jvm
    failure: list[BaseException] = []

    class _Call:
        def call(self) -> None:
            try:
                action()
            except BaseException as exc:  # raised again on our side, with its Python type
                failure.append(exc)
                raise

        class Java:
            implements: ClassVar[list[str]] = ["java.util.concurrent.Callable"]

    java_props = jvm.java.util.HashMap()
    for key, value in properties.items():
        java_props.put(key, value)
    try:
        jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
            java_props, _Call(), jvm.java.lang.Class.forName("java.lang.RuntimeException")
        )
    except Exception:
        if failure:
            raise failure[0] from None
        raise


def merge_round(
    spark: Any,
    target: str,
    schema: Schema,
    options: UpsertOptions,
    staged: Any,
    properties: dict[str, str],
    round_id: str,
    rows: Any = None,
    only: Iterable[tuple[int, int]] | None = None,
) -> MergeOutcome:
    """MERGE the staged rows (``staged``, a DataFrame of the staged files from
    ``round_tasks.read_staged``, None when nothing was staged; or ``rows``, a DataFrame of the
    table's columns) into ``target`` (the
    round branch) as one snapshot with ``properties``; raises ``BadUpsertRecords`` (before writing
    anything) for records without an id or CDC op.

    ``only`` (the DLQ reprocess): the staged rows are a replay of records already merged, and only
    these (partition, offset) records are new; of them, merge those that are still the last record
    of their id in the replay (a later record of the same id has already had its effect). Those
    of them without an id or op are left out of the replay (``bad``: they stay in the DLQ) instead
    of failing it. Nothing is merged (``merged`` False) when none of them is."""
    if staged is None and rows is None:
        return MergeOutcome(False)
    view = "icefall_upsert_" + re.sub(r"\W", "_", round_id)
    frame = staged if rows is None else rows
    if (
        options.debezium and rows is None
    ):  # JSON rounds hand over rows already made from the envelopes
        frame.createOrReplaceTempView(view + "_envelopes")
        frame = spark.sql(debezium_rows_sql(view + "_envelopes", frame.schema, schema))
    frame.createOrReplaceTempView(view)
    try:
        bad = spark.sql(bad_rows_sql(view, schema, options)).collect()
        new = set(only) if only is not None else set()
        left_out = tuple(
            sorted((int(r["p"]), int(r["o"])) for r in bad if (int(r["p"]), int(r["o"])) in new)
        )
        if len(left_out) < len(bad):
            bad = [r for r in bad if (int(r["p"]), int(r["o"])) not in new]
            shown = "; ".join(
                f"partition {r['p']} offset {r['o']}: {r['reason']}" for r in bad[:ERRORS_SHOWN]
            )
            raise BadUpsertRecords(
                f"{len(bad)} records have no value for the id columns "
                f"{list(options.id_columns)} or no I/U/D operation; nothing committed: {shown}"
            )
        if left_out:
            keep_offsets(spark, frame, left_out, "left_anti").createOrReplaceTempView(view)
        source = view + "_last"
        last = spark.sql(source_sql(view, schema, options))
        applied: tuple[tuple[int, int], ...] = ()
        if only is not None:
            last = keep_offsets(spark, last, new - set(left_out))
            applied = _offsets(last)
            if not applied:
                return MergeOutcome(False, (), left_out)
        last.createOrReplaceTempView(source)
        with_commit_properties(
            spark, properties, lambda: spark.sql(merge_sql(target, source, schema, options))
        )
        return MergeOutcome(True, applied, left_out)
    finally:
        for name in (view, view + "_last", view + "_envelopes"):
            spark.catalog.dropTempView(name)
