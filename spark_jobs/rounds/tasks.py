"""The executor side of a commit round: segment ranges in, Parquet data files of table rows out.

Each Spark task gets one group of consecutive ranges (``round_plan.task_groups``),
reads them straight from the object store, decodes the batches and values into
Arrow record batches of the table's rows, and streams them into Parquet data
files with pyarrow, in the table's location, with Iceberg's column statistics
(``streamed_files``: each row group encoded while the next decodes, for an
unpartitioned table; else pyiceberg's writer). The task returns the files' ``DataFile`` entries and what
it read; the driver commits all the files in one snapshot. Why not Spark's own
Iceberg writer: it would copy every Arrow batch into JVM rows and encode
Parquet again there, which cost as much CPU as the whole decode (bench/).

Records that cannot become rows come back with the task's result (they are
few); Spark returns exactly one successful attempt per task to ``collect``,
so retried or speculative attempts never count twice (their files, if any,
are orphans no snapshot references).

Everything a task needs travels in ``TaskSpec`` (a small picklable value):
the object store settings, the table metadata as JSON, the FileIO settings,
the convert types and the Avro schemas the driver already fetched, so a task
asks the registry only for an id the driver did not know.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from broker.config import ObjectStoreConfig, aws_io_credentials
from spark_jobs.decode.rows import DecodeError, RowConverter
from spark_jobs.decode.segments import (
    ReadStats,
    RecordChunk,
    SegmentRange,
    cached_store,
    read_ranges,
)
from spark_jobs.rounds import streamed_files
from spark_jobs.rounds.event_time import EventTimeSpec, Observed, observe

MAX_ERRORS_KEPT = 100_000
# A partitioned table's rows are written a slice of at most about this many bytes of Arrow at a
# time (pyiceberg splits the partitions of a whole ``pa.Table`` only, it cannot stream them): a
# round's memory stays bounded however large it is, at the price of one more file per partition
# value per slice on rounds larger than a slice (an unpartitioned table streams, one file per
# ``write.target-file-size-bytes``). 256 MiB keeps a round of the default in-driver size
# (``commit_round.DEFAULT_DRIVER_MAX_BYTES``) at a few slices.
PARTITIONED_SLICE_BYTES = 256 << 20


def task_io_properties(table: Any) -> tuple[tuple[str, str], ...]:
    """The table's FileIO settings (the catalog's endpoint and region included) plus the
    driver's AWS credentials, for tasks whose executors may not have them."""
    return tuple(sorted({**table.io.properties, **aws_io_credentials()}.items()))


@dataclass(frozen=True)
class TaskSpec:
    store: ObjectStoreConfig
    table_metadata_json: str
    io_properties: tuple[tuple[str, str], ...]
    key_type: str
    value_type: str
    registry_url: str
    schemas: tuple[
        tuple[int, str], ...
    ] = ()  # (id, Avro schema text): hashable, so a worker caches by spec
    verify_crc: bool = True
    # the rows' event-time column and the table's time-partition window (``event_time``)
    event_time: EventTimeSpec = EventTimeSpec()
    # the registry's user:password (the driver's ICEFALL_REGISTRY_USER_INFO): executors of a
    # cluster need not have it in their environment
    registry_user_info: str | None = field(default=None, repr=False)


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
    event_times: Observed = field(default_factory=Observed)

    def merge(self, other: TaskReport) -> TaskReport:
        for name in (
            "ranges",
            "bytes_read",
            "batches",
            "control_batches",
            "aborted_batches",
            "records",
            "rows",
            "errors_dropped",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        room = MAX_ERRORS_KEPT - len(self.errors)
        self.errors.extend(other.errors[:room])
        self.errors_dropped += max(len(other.errors) - room, 0)
        self.event_times.merge(other.event_times)
        return self


def encode_group(group: list[SegmentRange]) -> str:
    return json.dumps(
        [
            [r.object_key, r.byte_start, r.byte_end, r.partition, r.start, r.end, r.aborted]
            for r in group
        ]
    )


def decode_group(text: str) -> list[SegmentRange]:
    return [
        SegmentRange(
            str(k),
            int(a),
            int(b),
            int(p),
            int(s),
            int(e),
            tuple((int(pid), int(first)) for pid, first in (rest[0] if rest else ())),
        )
        for k, a, b, p, s, e, *rest in json.loads(text)
    ]


@functools.lru_cache(maxsize=4)
def _metadata(spec: TaskSpec) -> Any:
    from pyiceberg.table.metadata import TableMetadataUtil

    return TableMetadataUtil.parse_raw(spec.table_metadata_json)


@functools.lru_cache(maxsize=4)
def _converter(spec: TaskSpec) -> RowConverter:
    """One converter per spec per Python worker (workers are reused across tasks): decode plans stay compiled."""
    from spark_jobs.broker_client import RegistryClient

    registry = RegistryClient(spec.registry_url, user_info=spec.registry_user_info)
    schemas = dict(spec.schemas)

    def lookup(schema_id: int) -> str:
        known = schemas.get(schema_id)
        return known if known is not None else registry.avro_schema(schema_id)

    return RowConverter(
        _metadata(spec).schema(), lookup, key_type=spec.key_type, value_type=spec.value_type
    )


@dataclass
class TaskOutput:
    data_files: list[Any]  # pyiceberg DataFile
    report: TaskReport


# tests only: each Spark task of a round waits this many seconds before it reads, so a test can
# kill an executor while a task certainly runs there (tests/e2e/test_spark_cluster.py)
TASK_DELAY_ENV = "ICEFALL_TEST_TASK_DELAY_S"


def write_group(spec: TaskSpec, text: str) -> TaskOutput:
    """Read one group of ranges and write its rows as data files of the table."""
    if delay := float(os.environ.get(TASK_DELAY_ENV) or 0):
        time.sleep(delay)
    return _write(spec, decode_group(text))


def _rows(
    spec: TaskSpec,
    ranges: Sequence[SegmentRange],
    extra: Sequence[RecordChunk],
    stats: ReadStats,
    report: TaskReport,
) -> Iterator[pa.RecordBatch]:
    """The table rows of the records of ``extra`` and then of ``ranges``; the errors and event
    times go to ``report``, what was read to ``stats``."""
    converter = _converter(spec)
    store = cached_store(spec.store)
    for chunk in itertools.chain(
        extra, read_ranges(store, ranges, verify_crc=spec.verify_crc, stats=stats)
    ):
        rows = converter.convert(chunk)
        report.rows += rows.batch.num_rows
        report.errors.extend(rows.errors)
        if rows.batch.num_rows:
            # the event times in the same pass as the rows (a chunk is one Kafka partition)
            observe(spec.event_time, rows.batch, chunk.partition, report.event_times)
            yield rows.batch


def _read_report(stats: ReadStats, report: TaskReport) -> TaskReport:
    report.ranges, report.bytes_read, report.batches = stats.ranges, stats.bytes_read, stats.batches
    report.control_batches, report.aborted_batches = stats.control_batches, stats.aborted_batches
    report.records = stats.records
    return report


class OpenTask:
    """One task's data files, kept open while ranges are added to them (``add``) over several
    calls, until ``finish``: what one ``_write`` of all the ranges would return (the same rows,
    files and report). The warm driver's pre-stage (``spark_jobs.prestage``) adds a round's
    ranges as the broker flushes them, before the round's interval ends; the round adds the
    rest. Unpartitioned Parquet tables only (``streamed_files.streams``)."""

    def __init__(self, spec: TaskSpec) -> None:
        from pyiceberg.io import load_file_io

        metadata = _metadata(spec)
        self.spec = spec
        self.report = TaskReport()
        self._stats = ReadStats()
        self._files = streamed_files.StreamedDataFiles(
            metadata,
            _converter(spec).arrow_schema,
            load_file_io(dict(spec.io_properties), metadata.location),
            write_uuid=uuid.uuid4(),
            counter=itertools.count(0),
        )

    def add(self, ranges: Sequence[SegmentRange], extra: Sequence[RecordChunk] = ()) -> None:
        """Decode and write ``extra``'s records, then the ranges'; on an error everything
        written is dropped (``abandon``) and the error goes on."""
        self._files.write(_rows(self.spec, ranges, extra, self._stats, self.report))

    @property
    def bytes_read(self) -> int:
        """The segment bytes read so far (the report has them once finished)."""
        return self._stats.bytes_read

    def finish(self) -> TaskOutput:
        return TaskOutput(self._files.finish(), _read_report(self._stats, self.report))

    def abandon(self) -> None:
        """Drop the files written so far (deleted: no snapshot can name them)."""
        self._files.abandon()


def _write(
    spec: TaskSpec, ranges: list[SegmentRange], extra: Sequence[RecordChunk] = ()
) -> TaskOutput:
    """Decode the records of ``extra`` and then of ``ranges`` into data files of the table."""
    from pyiceberg.io import load_file_io
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    metadata = _metadata(spec)
    if streamed_files.streams(metadata):
        task = OpenTask(spec)
        task.add(ranges, extra)
        return task.finish()
    stats = ReadStats()
    report = TaskReport()
    reader = pa.RecordBatchReader.from_batches(
        _converter(spec).arrow_schema, _rows(spec, ranges, extra, stats, report)
    )
    parts: Iterator[pa.RecordBatchReader | pa.Table] = (
        iter([reader])
        if metadata.spec().is_unpartitioned()
        else _slices(reader, PARTITIONED_SLICE_BYTES)
    )
    io = load_file_io(dict(spec.io_properties), metadata.location)
    # one write uuid and one file counter for all the slices: their file names never collide
    write_uuid, counter = uuid.uuid4(), itertools.count(0)
    files = [
        data_file
        for data in parts
        for data_file in _dataframe_to_data_files(
            metadata, data, io, write_uuid=write_uuid, counter=counter
        )
    ]
    return TaskOutput(files, _read_report(stats, report))


def _slices(reader: pa.RecordBatchReader, max_bytes: int) -> Iterator[pa.Table]:
    """The reader's batches as tables of whole batches, each at most ``max_bytes`` of Arrow unless
    one batch alone is more (a batch is never split: the decoder's chunks are small)."""
    pending: list[pa.RecordBatch] = []
    size = 0
    for batch in reader:
        if pending and size + batch.nbytes > max_bytes:
            yield pa.Table.from_batches(pending, reader.schema)
            pending, size = [], 0
        pending.append(batch)
        size += batch.nbytes
    if pending:
        yield pa.Table.from_batches(pending, reader.schema)


def run_tasks(spark: Any, spec: TaskSpec, groups: list[list[SegmentRange]]) -> TaskOutput:
    """Every group as one Spark task; the files and reports of all of them."""
    texts = [encode_group(g) for g in groups]
    outputs = (
        spark.sparkContext.parallelize(texts, max(len(texts), 1))
        .map(functools.partial(write_group, spec))
        .collect()
    )
    return _combine(outputs)


def run_in_driver(
    spec: TaskSpec, ranges: list[SegmentRange], extra: Sequence[RecordChunk] = ()
) -> TaskOutput:
    """All ranges (and the records of ``extra``, which the DLQ reprocess has from elsewhere) as
    one task in this (the driver's) process, with no SparkContext.

    For a small round, starting Spark (its context, executors and their Python
    workers) costs seconds while the work itself takes a fraction of one: on a
    30 s commit interval that start-up is most of the freshness budget. The task
    is the very function Spark would run, so the rows and files are the same.
    """
    return _combine([_write(spec, ranges, extra)])


def _combine(outputs: list[TaskOutput]) -> TaskOutput:
    total = TaskOutput([], TaskReport())
    for output in outputs:
        total.data_files.extend(output.data_files)
        total.report.merge(output.report)
    return total


def read_staged(spark: Any, table: Any, staged: Sequence[str]) -> Any:
    """The staged Parquet files as a Spark DataFrame, read through the table's FileIO.

    Not ``spark.read.parquet``: that goes through a Hadoop FileSystem, and there is none for
    ``s3://`` in the Iceberg runtime (Iceberg's own S3FileIO is not one). Each Spark task reads
    some of the files with pyiceberg's FileIO (any scheme it knows, with the catalog's endpoint
    and the driver's credentials) and hands Spark their Arrow batches, as round tasks do. Every
    column is nullable, as ``spark.read.parquet`` would make it (staged rows are relaxed)."""
    import pyarrow.parquet as pq
    from pyiceberg.io import load_file_io
    from pyspark.sql.pandas.types import from_arrow_schema

    properties, location = dict(task_io_properties(table)), table.location()
    with load_file_io(properties, location).new_input(staged[0]).open() as first:
        arrow_schema = pq.read_schema(first)
    schema = _nullable(from_arrow_schema(arrow_schema, prefer_timestamp_ntz=True))

    def read(paths: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        io = load_file_io(properties, location)
        for batch in paths:
            for path in batch.column(0).to_pylist():
                with io.new_input(path).open() as f:
                    yield from pq.ParquetFile(f).iter_batches()

    paths = spark.createDataFrame([(p,) for p in staged], "path string")
    return paths.repartition(
        max(1, min(len(staged), spark.sparkContext.defaultParallelism))
    ).mapInArrow(read, schema)


def _nullable(data_type: Any) -> Any:
    """``data_type`` with every field, element and value nullable (Spark types)."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(data_type, StructType):
        return StructType(
            [StructField(f.name, _nullable(f.dataType), True) for f in data_type.fields]
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(_nullable(data_type.keyType), _nullable(data_type.valueType), True)
    return data_type
