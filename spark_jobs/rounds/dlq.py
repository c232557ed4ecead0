"""Bad records: which ones a round may skip (``automq.table.topic.errors.tolerance``), and the DLQ table.

- ``none``: any record that cannot become a row fails the round, naming it;
- ``invalid_data`` (default): records that cannot be decoded (no wire header,
  unknown schema id, corrupt Avro, invalid UTF-8, trailing bytes) and
  tombstones (null values in a table with required columns) are skipped;
  records that decode but do not fit the table still fail the round;
- ``all``: records that do not fit the table are skipped too.

Every skipped record becomes a row of ``<table>__dlq`` in the same catalog
transaction as the round's rows (on a catalog without multi-table commits: right
after them, repaired by the next round after a crash, ``dlq_catchup``), so rows in the table + rows in the DLQ =
records in the round's range, and a round that does not publish leaves no
DLQ rows either. The rows are few and already on the driver (they come back
through the tasks' accumulator), so pyiceberg writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    NestedField,
    StringType,
    TimestamptzType,
)

from broker import names
from spark_jobs.decode.json_values import INVALID_JSON, JSON_DOES_NOT_FIT
from spark_jobs.decode.rows import (
    ARROW_CONVERSION,
    AVRO_DECODE,
    INCOMPATIBLE_SCHEMA,
    INVALID_UTF8,
    MISSING_WIRE_HEADER,
    NULL_IN_REQUIRED,
    TRAILING_BYTES,
    UNKNOWN_SCHEMA,
    DecodeError,
)

DLQ_SUFFIX = names.DLQ_SUFFIX
UNDECODABLE = frozenset(
    {MISSING_WIRE_HEADER, UNKNOWN_SCHEMA, AVRO_DECODE, TRAILING_BYTES, INVALID_UTF8, INVALID_JSON}
)
DOES_NOT_FIT = frozenset(
    {ARROW_CONVERSION, NULL_IN_REQUIRED, INCOMPATIBLE_SCHEMA, JSON_DOES_NOT_FIT}
)

DLQ_SCHEMA = Schema(
    NestedField(1, "topic", StringType(), required=True),
    NestedField(2, "partition", IntegerType(), required=True),
    NestedField(3, "offset", LongType(), required=True),
    NestedField(4, "timestamp", TimestamptzType(), required=True),
    NestedField(5, "key", BinaryType(), required=False),
    NestedField(6, "value", BinaryType(), required=False),
    NestedField(
        7,
        "headers",
        MapType(11, StringType(), 12, BinaryType(), value_required=False),
        required=False,
    ),
    NestedField(8, "error_class", StringType(), required=True),
    NestedField(9, "error_message", StringType(), required=True),
    NestedField(10, "round_id", StringType(), required=True),
)  # ids as the catalog assigns them on create (top level first), so they read the same everywhere


def dlq_name(table: str) -> str:
    return names.dlq_table(table)


def is_tombstone(error: DecodeError) -> bool:
    return error.value is None and error.error_class == NULL_IN_REQUIRED


def skippable(error: DecodeError, tolerance: str) -> bool:
    if tolerance == "all":
        return True
    if tolerance == "invalid_data":
        return error.error_class in UNDECODABLE or is_tombstone(error)
    return False


@dataclass(frozen=True)
class Triage:
    skipped: list[DecodeError]
    fatal: list[DecodeError]


def triage(errors: Sequence[DecodeError], tolerance: str) -> Triage:
    ordered = sorted(errors, key=lambda e: (e.partition, e.offset))
    return Triage(
        [e for e in ordered if skippable(e, tolerance)],
        [e for e in ordered if not skippable(e, tolerance)],
    )


def to_arrow(
    errors: Sequence[DecodeError], topic: str, round_id: str, schema: Schema = DLQ_SCHEMA
) -> pa.Table:
    """The DLQ rows in ``schema`` (the table's own: its field ids are what a writer must use)."""
    arrow = schema.as_arrow()
    n = len(errors)
    columns = dict(
        zip(
            (f.name for f in DLQ_SCHEMA.fields),
            [
                pa.array([topic] * n, pa.large_string()),
                pa.array([e.partition for e in errors], pa.int32()),
                pa.array([e.offset for e in errors], pa.int64()),
                pa.array([e.timestamp * 1000 for e in errors], pa.int64()).cast(
                    pa.timestamp("us", tz="UTC")
                ),
                pa.array([e.key for e in errors], pa.large_binary()),
                pa.array([e.value for e in errors], pa.large_binary()),
                pa.array([list(e.headers) for e in errors], arrow.field("headers").type),
                pa.array([e.error_class for e in errors], pa.large_string()),
                pa.array([e.message for e in errors], pa.large_string()),
                pa.array([round_id] * n, pa.large_string()),
            ],
            strict=True,
        )
    )
    return pa.Table.from_arrays([columns[f.name] for f in arrow], schema=arrow)


def load_or_create(catalog: Catalog, identifier: tuple[str, str]) -> Table:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    try:
        return catalog.create_table(
            identifier,
            DLQ_SCHEMA,
            properties={"format-version": "2", "icefall.dlq-of": names.dlq_of(identifier[1])},
        )
    except TableAlreadyExistsError:
        return catalog.load_table(identifier)
