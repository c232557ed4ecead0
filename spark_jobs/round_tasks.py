"""The executor side of a commit round: segment ranges in, Arrow record batches of table rows out.

Each Spark task gets one group of ranges of one partition (``round_plan.task_groups``),
reads them straight from the object store, decodes the batches and values and
yields Arrow batches in the table's Spark schema (``mapInArrow``). Records that
cannot become rows go back to the driver through an accumulator (they are few,
and Spark applies a successful task's accumulator updates exactly once for an
action), with read counters beside them.

Everything a task needs travels in ``TaskSpec`` (a small picklable value):
the object store settings, the table schema as JSON, the convert types and the
Avro schemas the driver already fetched, so a task asks the registry only for
an id the driver did not know.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam

from broker.config import ObjectStoreConfig
from spark_jobs.rows import DecodeError, RowConverter
from spark_jobs.segments import ReadStats, SegmentRange, cached_store, read_partition

RANGES_COLUMN = "ranges"
MAX_ERRORS_KEPT = 100_000


@dataclass(frozen=True)
class TaskSpec:
    store: ObjectStoreConfig
    table_schema_json: str
    key_type: str
    value_type: str
    registry_url: str
    schemas: tuple[tuple[int, str], ...] = ()  # (id, Avro schema text): hashable, so a worker caches by spec
    verify_crc: bool = True


@dataclass
class TaskReport:
    """What the tasks of a round saw: summed on the driver through an accumulator."""

    ranges: int = 0
    bytes_read: int = 0
    batches: int = 0
    control_batches: int = 0
    aborted_batches: int = 0
    records: int = 0
    rows: int = 0
    errors: list[DecodeError] = field(default_factory=list)
    errors_dropped: int = 0  # past MAX_ERRORS_KEPT: counted, not kept

    def merge(self, other: TaskReport) -> TaskReport:
        for name in ("ranges", "bytes_read", "batches", "control_batches", "aborted_batches", "records", "rows",
                     "errors_dropped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        room = MAX_ERRORS_KEPT - len(self.errors)
        self.errors.extend(other.errors[:room])
        self.errors_dropped += max(len(other.errors) - room, 0)
        return self


class TaskReportParam(AccumulatorParam[TaskReport]):
    def zero(self, value: TaskReport) -> TaskReport:
        return TaskReport()

    def addInPlace(self, value1: TaskReport, value2: TaskReport) -> TaskReport:
        return value1.merge(value2)


def encode_group(group: list[SegmentRange]) -> str:
    return json.dumps([[r.object_key, r.byte_start, r.byte_end, r.partition, r.start, r.end] for r in group])


def decode_group(text: str) -> list[SegmentRange]:
    return [SegmentRange(str(k), int(a), int(b), int(p), int(s), int(e)) for k, a, b, p, s, e in json.loads(text)]


@functools.lru_cache(maxsize=4)
def _converter(spec: TaskSpec) -> RowConverter:
    """One converter per spec per Python worker (workers are reused across tasks): decode plans stay compiled."""
    from pyiceberg.schema import Schema

    from spark_jobs.broker_client import RegistryClient

    registry = RegistryClient(spec.registry_url)
    schemas = dict(spec.schemas)

    def lookup(schema_id: int) -> str:
        known = schemas.get(schema_id)
        return known if known is not None else registry.avro_schema(schema_id)

    table = Schema.model_validate_json(spec.table_schema_json)
    return RowConverter(table, lookup, key_type=spec.key_type, value_type=spec.value_type, flavor="spark")


def convert_groups(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[pa.RecordBatch | None, TaskReport]]:
    """Rows of every group of ranges in the input batches (column ``ranges``), with what was read
    (the read counters come with a last ``None`` per group)."""
    converter = _converter(spec)
    store = cached_store(spec.store)
    for batch in batches:
        for text in batch.column(RANGES_COLUMN).to_pylist():
            stats = ReadStats()
            report = TaskReport()
            for chunk in read_partition(store, decode_group(text), verify_crc=spec.verify_crc, stats=stats):
                rows = converter.convert(chunk)
                report.rows += rows.batch.num_rows
                report.errors.extend(rows.errors)
                if rows.batch.num_rows:
                    yield rows.batch, report
                    report = TaskReport()
            report.ranges, report.bytes_read, report.batches = stats.ranges, stats.bytes_read, stats.batches
            report.control_batches, report.aborted_batches = stats.control_batches, stats.aborted_batches
            report.records = stats.records
            yield None, report


def map_function(spec: TaskSpec, accumulator: Any) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: rows out, reports into the accumulator."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        total = TaskReport()
        for rows, report in convert_groups(spec, batches):
            total.merge(report)
            if rows is not None:
                yield rows
        accumulator.add(total)

    return run
