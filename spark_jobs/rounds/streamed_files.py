"""A round's rows into Parquet data files while they are still being decoded.

pyiceberg's writer (``_dataframe_to_data_files``) takes a ``RecordBatchReader`` but
gathers a whole file's batches (up to ``write.target-file-size-bytes``, 512 MiB of
Arrow) before it encodes any of them. A round is usually one file, so its decode
(Icefall's C decoder, which holds the GIL) and its Parquet encode (pyarrow, which
releases it) ran one after the other: ~0.4 s each for 190 k records of the 16-field
benchmark data. Both are on the commit's critical path, so the round's latency (and
the table's freshness) paid their sum.

``write_data_files`` hands the batches to one writer thread a row group at a time:
it encodes row group *k* while the caller's thread decodes the rows of *k + 1*, so
the round pays about the larger of the two. A row group closes at
``ROW_GROUP_ARROW_BYTES`` of Arrow, or before a batch that would take it past the
table's ``write.parquet.row-group-limit`` rows; a file closes after the batch that
brings it to ``write.target-file-size-bytes`` of Arrow, where pyiceberg's
``bin_pack_record_batches`` closes one, so the files hold the same rows as
pyiceberg's would. Memory is bounded by two row groups, not a file.

What pyiceberg's ``write_file`` does per file is done here the same way, with its
own parts: the writer (``ParquetFormatWriter``: codec, page sizes, field ids), the
column statistics and metrics modes, the file names and the ``DataFile`` entries.
What differs is when batches are encoded and so the row groups: several per file
instead of one (smaller files on repetitive data: a column's dictionary covers a
row group), and which columns get a dictionary: not the fixed-width ones whose first
rows show it would not pay (parquet-mr's first-page test, once per file:
``dictionary_columns``).
Unpartitioned Parquet tables only: anything else goes to pyiceberg's writer
(``tasks._write``). The pyiceberg internals used or mirrored here are pinned
(``tests/test_pins.py``).

Why not a library: neither pyiceberg nor pyarrow encodes a file from a stream of
batches while the producer of the stream runs (pyarrow's ``ParquetWriter`` writes
in the calling thread; its buffered row-group mode is not exposed to Python).
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from spark_jobs.rounds.dictionary_columns import dictionary_columns

# A row group closes at this many bytes of Arrow: small enough that a round of a few tens
# of MiB is several row groups (the overlap is all but the last one), large enough that a
# row group is still a few MiB of Parquet. 8, 16, 24 and 64 MiB gave round times within
# each other's spread on the 90 MiB benchmark round (bench/streamed_write.py's round).
ROW_GROUP_ARROW_BYTES = 24 << 20


def streams(metadata: Any) -> bool:
    """Whether ``write_data_files`` writes this table's files (else pyiceberg's writer)."""
    from pyiceberg.table import TableProperties

    file_format = metadata.properties.get(
        TableProperties.WRITE_FILE_FORMAT, TableProperties.WRITE_FILE_FORMAT_DEFAULT
    )
    return bool(metadata.spec().is_unpartitioned()) and str(file_format).upper() == "PARQUET"


@dataclass
class _OpenFile:
    """The data file the writer thread is filling."""

    path: str
    output: Any  # pyiceberg OutputFile
    writer: Any  # pyiceberg ParquetFormatWriter


@dataclass
class _FileWriter:
    """Everything the writer thread touches; only it touches it while a write runs."""

    metadata: Any
    io: Any
    write_uuid: uuid.UUID
    counter: itertools.count[int]
    task_schema: Any
    file_schema: Any
    target_bytes: int
    row_group_rows: int
    page_rows: int  # write.parquet.page-row-limit: the rows dictionary_columns judges
    downcast_ns: bool
    format_model: Any
    location_provider: Any
    current: _OpenFile | None = None
    done: list[Any] = field(default_factory=list)  # DataFile

    def write(self, batches: list[pa.RecordBatch], last: bool) -> None:
        """One row group (more if one batch has over ``row_group_rows``) into the current
        file, then close it if ``last``."""
        from pyiceberg.io.pyarrow import _to_requested_schema

        table = pa.Table.from_batches(
            [
                _to_requested_schema(
                    requested_schema=self.file_schema,
                    file_schema=self.task_schema,
                    batch=batch,
                    downcast_ns_timestamp_to_us=self.downcast_ns,
                    include_field_ids=True,
                    format_model=self.format_model,
                )
                for batch in batches
            ]
        )
        if self.current is None:
            self.current = self._open(table)
        self.current.writer.write(table)
        if last:
            self.close()

    def _open(self, first: pa.Table) -> _OpenFile:
        """A new file, its columns' dictionaries chosen from its first row group (``first``)."""
        from pyiceberg.table import WriteTask

        task = WriteTask(
            write_uuid=self.write_uuid,
            task_id=next(self.counter),
            record_batches=[],
            schema=self.task_schema,
        )
        path = self.location_provider.new_data_location(
            data_file_name=task.generate_data_file_filename(self.format_model.file_extension()),
            partition_key=None,
        )
        output = self.io.new_output(path)
        writer = self.format_model.create_writer(output, self.file_schema, self.metadata.properties)
        # pyiceberg's ParquetFormatWriter hands these to pyarrow's ParquetWriter at its first write
        writer._parquet_writer_kwargs["use_dictionary"] = dictionary_columns(first, self.page_rows)
        return _OpenFile(path, output, writer)

    def abandon(self) -> None:
        """Close the current file's stream after an error and delete it and the files closed
        before it: no ``DataFile`` of them was handed out, so nothing can reference them."""
        if (current := self.current) is not None:
            self.current = None
            with contextlib.suppress(Exception):
                current.writer.close()
            with contextlib.suppress(Exception):
                self.io.delete(current.path)
        for data_file in self.done:
            with contextlib.suppress(Exception):
                self.io.delete(data_file.file_path)
        self.done = []

    def close(self) -> None:
        """Close the current file (if any) and keep its ``DataFile``."""
        from pyiceberg.manifest import DataFile, DataFileContent
        from pyiceberg.typedef import Record

        if (current := self.current) is None:
            return
        self.current = None
        statistics = current.writer.close()
        self.done.append(
            DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=current.path,
                file_format=self.format_model.format,
                partition=Record(),
                file_size_in_bytes=len(current.output),
                sort_order_id=None,
                spec_id=self.metadata.default_spec_id,
                equality_ids=None,
                key_metadata=None,
                **statistics.to_serialized_dict(),
            )
        )


class StreamedDataFiles:
    """Data files of one table that batches are written into, possibly over several calls
    (``write``), until ``finish`` closes them (or ``abandon`` drops them).

    The warm driver's pre-stage (``spark_jobs.prestage``) feeds a round's rows in as their
    segments are flushed, before the round's interval ends, and the round adds the rest and
    finishes; a task writes all its rows in one call (``write_data_files``). Between calls the
    batches of a row group not yet full wait here (at most ``row_group_arrow_bytes`` of Arrow).
    Not thread safe: one caller at a time."""

    def __init__(
        self,
        metadata: Any,
        schema: pa.Schema,
        io: Any,
        *,
        write_uuid: uuid.UUID,
        counter: itertools.count[int],
        row_group_arrow_bytes: int | None = None,
    ) -> None:
        from pyiceberg.io.fileformat import FileFormatFactory
        from pyiceberg.io.pyarrow import pyarrow_to_schema
        from pyiceberg.manifest import FileFormat
        from pyiceberg.schema import sanitize_column_names
        from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE, TableProperties
        from pyiceberg.table.locations import load_location_provider
        from pyiceberg.utils.config import Config
        from pyiceberg.utils.properties import property_as_int

        self.row_group_arrow_bytes = row_group_arrow_bytes or ROW_GROUP_ARROW_BYTES
        properties = metadata.properties
        downcast_ns = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
        table_schema = metadata.schema()
        self._writer = _FileWriter(
            metadata=metadata,
            io=io,
            write_uuid=write_uuid,
            counter=counter,
            task_schema=pyarrow_to_schema(
                schema,
                name_mapping=table_schema.name_mapping,
                downcast_ns_timestamp_to_us=downcast_ns,
                format_version=metadata.format_version,
            ),
            file_schema=sanitize_column_names(table_schema),
            target_bytes=property_as_int(
                properties,
                TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
                TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
            )
            or TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
            row_group_rows=property_as_int(
                properties,
                TableProperties.PARQUET_ROW_GROUP_LIMIT,
                TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT,
            )
            or TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT,
            page_rows=property_as_int(
                properties,
                TableProperties.PARQUET_PAGE_ROW_LIMIT,
                TableProperties.PARQUET_PAGE_ROW_LIMIT_DEFAULT,
            )
            or TableProperties.PARQUET_PAGE_ROW_LIMIT_DEFAULT,
            downcast_ns=downcast_ns,
            format_model=FileFormatFactory.get(FileFormat.PARQUET),
            location_provider=load_location_provider(
                table_location=metadata.location, table_properties=properties
            ),
        )
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="icefall-parquet")
        self._pending: Future[None] | None = None
        self._group: list[pa.RecordBatch] = []
        self._group_bytes = self._group_rows = self._file_bytes = 0
        self._ended = False

    def _hand_over(self, last: bool) -> None:
        if self._pending is not None:
            self._pending.result()  # at most one row group encodes while the next one decodes
        self._pending = self._pool.submit(self._writer.write, self._group, last)
        self._group, self._group_bytes, self._group_rows = [], 0, 0
        if last:
            self._file_bytes = 0

    def write(self, batches: Iterable[pa.RecordBatch]) -> None:
        """Add ``batches`` (of the Arrow schema given): each row group is handed to the writer
        thread as it fills; on an error everything is abandoned and the error goes on (with the
        writer's own, if it failed too, as a note)."""
        if self._ended:
            raise RuntimeError("these data files were already finished or abandoned")
        writer = self._writer
        try:
            for batch in batches:
                if self._group and self._group_rows + batch.num_rows > writer.row_group_rows:
                    self._hand_over(last=False)
                self._group.append(batch)
                self._group_bytes += batch.nbytes
                self._group_rows += batch.num_rows
                self._file_bytes += batch.nbytes
                if self._file_bytes >= writer.target_bytes:
                    self._hand_over(last=True)
                elif (
                    self._group_bytes >= self.row_group_arrow_bytes
                    or self._group_rows >= writer.row_group_rows
                ):
                    self._hand_over(last=False)
        except BaseException as exc:
            self._abandon(exc)
            raise

    def finish(self) -> list[Any]:
        """Write what is left, close the file and return the ``DataFile`` entries of all the
        files written (none for no rows)."""
        if self._ended:
            raise RuntimeError("these data files were already finished or abandoned")
        try:
            if self._group:
                self._hand_over(last=True)
            if self._pending is not None:
                self._pending.result()
            # nothing left open unless no batch came
            self._pool.submit(self._writer.close).result()
        except BaseException as exc:
            self._abandon(exc)
            raise
        self._ended = True
        self._pool.shutdown()
        return self._writer.done

    def abandon(self) -> None:
        """Drop what was written (unless ``finish`` handed it out already): the open file
        closed unfinished, it and the files closed before it deleted."""
        if not self._ended:
            self._abandon(None)

    def _abandon(self, exc: BaseException | None) -> None:
        self._ended = True
        # queued behind the write in flight (one thread, in order); waited for even if this
        # thread is interrupted again
        abandoned = self._pool.submit(self._writer.abandon)
        failed = self._pending.exception() if self._pending is not None else None
        if exc is not None and failed is not None and failed is not exc:
            exc.add_note(f"the Parquet writer thread failed too: {failed!r}")
        try:
            abandoned.result()
        finally:
            self._pool.shutdown()


def write_data_files(
    metadata: Any,
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    io: Any,
    *,
    write_uuid: uuid.UUID,
    counter: itertools.count[int],
    row_group_arrow_bytes: int | None = None,
) -> list[Any]:
    """The ``DataFile`` entries of the files ``batches`` (of Arrow ``schema``) were written to,
    in ``metadata``'s table (``streams(metadata)`` must hold). A file stays open from its first
    row group to its last; on an error the file being written is closed unfinished and deleted
    (pyiceberg's writer would leave it, an orphan), no entry is returned, and the error goes
    on (with the writer's own, if it failed too, as a note)."""
    files = StreamedDataFiles(
        metadata,
        schema,
        io,
        write_uuid=write_uuid,
        counter=counter,
        row_group_arrow_bytes=row_group_arrow_bytes,
    )
    files.write(batches)
    return files.finish()
