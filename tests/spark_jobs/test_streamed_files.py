"""spark_jobs/rounds/streamed_files.py: a round's rows encoded into Parquet while they decode.

The files must be the ones pyiceberg's writer would make (rows, field ids, column
statistics), split into row groups and files at the documented sizes, encoded while the
caller still produces batches, and an error in the stream must leave no writer behind."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from spark_jobs.rounds import streamed_files

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType(), required=False),
)
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


def _metadata(location: Path, **properties: str) -> Any:
    return new_table_metadata(
        SCHEMA,
        PartitionSpec(),
        UNSORTED_SORT_ORDER,
        str(location),
        {"write.parquet.compression-codec": "zstd", **properties},
    )


def _batches(count: int, rows: int) -> list[pa.RecordBatch]:
    out = []
    for b in range(count):
        ids = list(range(b * rows, (b + 1) * rows))
        names = [None if i % 7 == 0 else f"name-{i % 13}" for i in ids]
        out.append(pa.record_batch([pa.array(ids, pa.int64()), pa.array(names)], schema=ARROW))
    return out


def _write(metadata: Any, batches: Any, **kwargs: Any) -> list[Any]:
    io = load_file_io({}, metadata.location)
    return streamed_files.write_data_files(
        metadata,
        batches,
        ARROW,
        io,
        write_uuid=uuid.uuid4(),
        counter=itertools.count(0),
        **kwargs,
    )


def _local(path: str) -> str:
    return path.removeprefix("file://")


def test_one_file_of_the_rows_with_pyiceberg_statistics(tmp_path: Path) -> None:
    batches = _batches(6, 1000)
    ours = _write(_metadata(tmp_path / "ours"), iter(batches), row_group_arrow_bytes=1)
    theirs_meta = _metadata(tmp_path / "theirs")
    theirs = list(
        _dataframe_to_data_files(
            theirs_meta,
            pa.RecordBatchReader.from_batches(ARROW, iter(batches)),
            load_file_io({}, theirs_meta.location),
        )
    )
    assert len(ours) == len(theirs) == 1
    mine, pyiceberg_file = ours[0], theirs[0]
    # a row group per batch here (1 byte closes one), one per file in pyiceberg's
    assert pq.ParquetFile(_local(mine.file_path)).metadata.num_row_groups == 6
    assert mine.record_count == pyiceberg_file.record_count == 6000
    for name in (
        "content",
        "file_format",
        "partition",
        "sort_order_id",
        "equality_ids",
        "key_metadata",
        "column_sizes",
        "value_counts",
        "null_value_counts",
        "nan_value_counts",
        "lower_bounds",
        "upper_bounds",
    ):
        if name != "column_sizes":
            assert getattr(mine, name) == getattr(pyiceberg_file, name), name
        else:
            assert set(mine.column_sizes) == set(pyiceberg_file.column_sizes) == {1, 2}
    # one split offset per row group: where its first column chunk starts in the file
    meta = pq.ParquetFile(_local(mine.file_path)).metadata
    starts = []
    for i in range(meta.num_row_groups):
        first = meta.row_group(i).column(0)
        starts.append(
            first.dictionary_page_offset if first.has_dictionary_page else first.data_page_offset
        )
    assert mine.split_offsets == starts and len(starts) == 6
    assert mine.file_size_in_bytes == Path(_local(mine.file_path)).stat().st_size
    assert mine.file_path.endswith(".parquet") and "/data/" in mine.file_path
    read = pq.read_table(_local(mine.file_path))
    assert read.to_pylist() == pa.Table.from_batches(batches).to_pylist()
    # Iceberg's field ids are in the file's schema, as pyiceberg writes them
    assert read.schema.field("id").metadata == {b"PARQUET:field_id": b"1"}


def test_a_unique_column_is_written_without_a_dictionary(tmp_path: Path) -> None:
    """The file's writer takes ``dictionary_columns``' answer: the unique ids are plain in every
    row group, the 13 names keep their dictionary (pyarrow alone would give both one)."""
    (data_file,) = _write(_metadata(tmp_path), iter(_batches(3, 1000)), row_group_arrow_bytes=1)
    meta = pq.ParquetFile(_local(data_file.file_path)).metadata
    assert meta.num_row_groups == 3
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        chunks = {group.column(c).path_in_schema: group.column(c) for c in range(group.num_columns)}
        assert not chunks["id"].has_dictionary_page and chunks["name"].has_dictionary_page


def test_dictionaries_in_a_round_shaped_file_follow_the_parquet_paths(tmp_path: Path) -> None:
    """The columns of a round's file (a map of headers, a struct of Kafka metadata), converted
    by pyiceberg and written with field ids: every chosen path is one of the file's column
    chunks, the map's and the partition's keep a dictionary, the unique ones do not."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(
            2,
            "headers",
            MapType(3, StringType(), 4, BinaryType(), value_required=False),
            required=False,
        ),
        NestedField(
            5,
            "meta",
            StructType(
                NestedField(6, "partition", IntegerType(), required=True),
                NestedField(7, "offset", LongType(), required=True),
            ),
            required=False,
        ),
    )
    arrow = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("headers", pa.map_(pa.string(), pa.binary())),
            pa.field(
                "meta",
                pa.struct(
                    [
                        pa.field("partition", pa.int32(), nullable=False),
                        pa.field("offset", pa.int64(), nullable=False),
                    ]
                ),
            ),
        ]
    )
    rows = 30_000
    batch = pa.record_batch(
        [
            pa.array(range(rows), pa.int64()),
            pa.array([[("h", b"v")]] * rows, arrow.field("headers").type),
            pa.array(
                [{"partition": i % 4, "offset": i} for i in range(rows)], arrow.field("meta").type
            ),
        ],
        schema=arrow,
    )
    metadata = new_table_metadata(schema, PartitionSpec(), UNSORTED_SORT_ORDER, str(tmp_path), {})
    (data_file,) = streamed_files.write_data_files(
        metadata,
        iter([batch]),
        arrow,
        load_file_io({}, metadata.location),
        write_uuid=uuid.uuid4(),
        counter=itertools.count(0),
    )
    group = pq.ParquetFile(_local(data_file.file_path)).metadata.row_group(0)
    chunks = {group.column(c).path_in_schema: group.column(c) for c in range(group.num_columns)}
    assert set(chunks) == {
        "id",
        "headers.key_value.key",
        "headers.key_value.value",
        "meta.partition",
        "meta.offset",
    }
    with_dictionary = {path for path, chunk in chunks.items() if chunk.has_dictionary_page}
    assert with_dictionary == {"headers.key_value.key", "headers.key_value.value", "meta.partition"}


def _row_groups(data_file: Any) -> list[int]:
    meta = pq.ParquetFile(_local(data_file.file_path)).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def _rows(files: list[Any]) -> list[dict[str, Any]]:
    return [r for f in files for r in pq.read_table(_local(f.file_path)).to_pylist()]


def test_a_file_closes_after_the_batch_that_reaches_the_target_as_pyiceberg_closes_it(
    tmp_path: Path,
) -> None:
    """Files close where pyiceberg's bin_pack_record_batches closes them (the batch that brings a
    file to the target's bytes), also in the middle of a row group."""
    batches = _batches(12, 500)
    largest = max(b.nbytes for b in batches)
    # 3 batches make a row group, 4 a file (the batches' sizes differ by a few bytes)
    metadata = _metadata(tmp_path, **{"write.target-file-size-bytes": str(3 * largest + 1)})
    files = _write(metadata, iter(batches), row_group_arrow_bytes=2 * largest + 1)
    assert [f.record_count for f in files] == [2000, 2000, 2000]
    assert [_row_groups(f) for f in files] == [[1500, 500]] * 3
    assert len({f.file_path for f in files}) == 3
    assert _rows(files) == pa.Table.from_batches(batches).to_pylist()
    theirs = list(
        _dataframe_to_data_files(
            metadata,
            pa.RecordBatchReader.from_batches(ARROW, iter(batches)),
            load_file_io({}, metadata.location),
        )
    )
    assert [f.record_count for f in theirs] == [2000, 2000, 2000]


def test_a_row_group_never_takes_a_batch_past_the_row_group_limit(tmp_path: Path) -> None:
    batches = _batches(6, 500)
    metadata = _metadata(tmp_path, **{"write.parquet.row-group-limit": "1200"})
    (one,) = _write(metadata, iter(batches), row_group_arrow_bytes=1 << 30)
    # two batches are 1,000 rows, a third would make 1,500: the group closes before it
    assert _row_groups(one) == [1000, 1000, 1000]
    assert _rows([one]) == pa.Table.from_batches(batches).to_pylist()


def test_a_row_group_is_encoded_while_the_next_decodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream waits, before its third batch, until pyiceberg's Parquet writer has encoded
    the first row group in another thread: a writer that encoded only after the stream ended
    would never let it go on, one that encoded in the caller's thread fails the thread check."""
    from pyiceberg.io.pyarrow import ParquetFormatWriter

    encoded = threading.Event()
    threads: list[str] = []
    original = ParquetFormatWriter.write

    def write(self: ParquetFormatWriter, table: pa.Table) -> None:
        threads.append(threading.current_thread().name)
        original(self, table)
        encoded.set()

    monkeypatch.setattr(ParquetFormatWriter, "write", write)
    batches = _batches(4, 2000)
    caller = threading.current_thread().name

    def stream() -> Iterator[pa.RecordBatch]:
        yield batches[0]
        yield batches[1]  # closes the first row group (two batches' bytes)
        assert encoded.wait(30), "no row group was encoded while the stream ran"
        yield from batches[2:]

    group_bytes = max(b.nbytes for b in batches) + 1  # two batches, never one
    files = _write(_metadata(tmp_path), stream(), row_group_arrow_bytes=group_bytes)
    assert [f.record_count for f in files] == [8000]
    assert _row_groups(files[0]) == [4000, 4000]
    assert len(threads) == 2 and caller not in threads
    assert all(t.startswith("icefall-parquet") for t in threads)


def test_a_failed_write_returns_no_file_and_the_error_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose row group could not be written must never come back as a data file: its
    rows would be committed as missing."""
    from pyiceberg.io.pyarrow import ParquetFormatWriter

    calls = itertools.count()
    original = ParquetFormatWriter.write

    def write(self: ParquetFormatWriter, table: pa.Table) -> None:
        if next(calls) == 1:
            raise OSError("No space left on device")
        original(self, table)

    monkeypatch.setattr(ParquetFormatWriter, "write", write)
    with pytest.raises(OSError, match="No space left"):
        _write(_metadata(tmp_path), iter(_batches(5, 100)), row_group_arrow_bytes=1)
    assert not [t for t in threading.enumerate() if t.name.startswith("icefall-parquet")]


def test_an_error_in_the_stream_goes_on_and_leaves_no_writer(tmp_path: Path) -> None:
    batches = _batches(3, 100)

    def stream() -> Iterator[pa.RecordBatch]:
        yield from batches
        raise RuntimeError("undecodable")

    with pytest.raises(RuntimeError, match="undecodable"):
        _write(_metadata(tmp_path), stream(), row_group_arrow_bytes=1)
    assert not [t for t in threading.enumerate() if t.name.startswith("icefall-parquet")]
    # the unfinished file was deleted: nothing could name it
    assert not list(tmp_path.rglob("*.parquet"))


def _files(metadata: Any, **kwargs: Any) -> streamed_files.StreamedDataFiles:
    return streamed_files.StreamedDataFiles(
        metadata,
        ARROW,
        load_file_io({}, metadata.location),
        write_uuid=uuid.uuid4(),
        counter=itertools.count(0),
        **kwargs,
    )


def test_batches_written_over_several_calls_make_the_files_one_call_makes(tmp_path: Path) -> None:
    """The pre-stage writes a round's rows as their segments are flushed, a few batches at a
    time, and the round adds the rest: the files must be those of one call."""
    batches = _batches(7, 100)
    metadata = _metadata(tmp_path / "once", **{"write.target-file-size-bytes": "6000"})
    once = _write(metadata, iter(batches), row_group_arrow_bytes=2500)
    files = _files(
        _metadata(tmp_path / "calls", **{"write.target-file-size-bytes": "6000"}),
        row_group_arrow_bytes=2500,
    )
    for part in (batches[:1], [], batches[1:4], batches[4:]):
        files.write(iter(part))
    in_calls = files.finish()
    assert len(in_calls) == len(once) > 1
    for a, b in zip(in_calls, once, strict=True):
        assert a.record_count == b.record_count
        assert a.split_offsets == b.split_offsets  # the same row groups
        assert pq.read_table(a.file_path).equals(pq.read_table(b.file_path))
    with pytest.raises(RuntimeError, match="already finished"):
        files.write(iter(batches[:1]))


def test_abandoned_files_are_deleted_and_leave_no_writer(tmp_path: Path) -> None:
    files = _files(
        _metadata(tmp_path, **{"write.target-file-size-bytes": "3000"}), row_group_arrow_bytes=1
    )
    files.write(iter(_batches(5, 100)))
    assert len(list(tmp_path.rglob("*.parquet"))) >= 2  # closed files and the open one
    files.abandon()
    assert not list(tmp_path.rglob("*.parquet"))
    assert not [t for t in threading.enumerate() if t.name.startswith("icefall-parquet")]
    with pytest.raises(RuntimeError, match="abandoned"):
        files.finish()


def test_an_empty_stream_writes_no_file(tmp_path: Path) -> None:
    assert _write(_metadata(tmp_path), iter([])) == []
    assert not list(tmp_path.rglob("*.parquet"))


def test_only_unpartitioned_parquet_tables_stream(tmp_path: Path) -> None:
    assert streamed_files.streams(_metadata(tmp_path))
    assert not streamed_files.streams(_metadata(tmp_path, **{"write.format.default": "orc"}))
    partitioned = new_table_metadata(
        SCHEMA,
        PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name")),
        UNSORTED_SORT_ORDER,
        str(tmp_path),
        {},
    )
    assert not streamed_files.streams(partitioned)
