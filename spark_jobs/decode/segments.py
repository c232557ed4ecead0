"""Read Kafka records for a commit round straight from the broker's segment objects.

The coordinator asks the broker's admin API for the byte ranges that cover a
partition's offsets [start, end) (``GET .../ranges``) and hands them to Spark
tasks. A task reads each range with one ranged GET, walks the record batches
in it and keeps the records whose offset is in the window. Why here and not
through a Kafka consumer: the commit round must be exact and repeatable for a
window of offsets, must not depend on the broker being up for the bulk of the
data, and reads from S3 in parallel.

Kafka semantics kept:

- the first range may begin with a batch that starts before ``start`` and the
  last batch may run past ``end``: records outside [start, end) are dropped;
- control batches (transaction markers) are never data and are skipped;
- records of aborted transactions are dropped, using the consumer's
  ``read_committed`` algorithm: each range carries the aborted transactions
  the broker's ranges answer lists for it (``SegmentRange.aborted``: (producer
  id, first offset) pairs, as a Kafka FetchResponse carries them), or the
  caller passes them (``aborted``). The round plans only up to the last stable
  offset, so every transaction in its window is decided;
- ``LogAppendTime`` batches give every record the batch's max timestamp.

Speed: the range is fetched once into one ``bytes`` object; uncompressed
batches are decoded in place from it (no copy per batch), compressed ones are
decompressed once; records become column lists (``RecordChunk``), not objects,
because the next step (``spark_jobs.decode.rows``) builds Arrow columns from them.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from crc32c import crc32c

from broker.config import ObjectStoreConfig
from broker.kafka.records import (
    COMPRESSION_NONE,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    Buffer,
    CorruptBatchError,
    Headers,
    decompress_buffer,
    iter_records,
    read_header,
)
from broker.storage.objectstore import ObjectStore, open_object_store

try:  # the record loop in C (spark_jobs/_kafka_records.c); _decode_batch below is the fallback
    _kafka_records: Any = importlib.import_module("spark_jobs._kafka_records")
except ImportError:  # pragma: no cover - a build without the extension
    _kafka_records = None

if TYPE_CHECKING:  # executors import this module: only the type of an answer, not the models
    import cramjam

    from broker.contracts import TopicRanges

ATTR_LOG_APPEND_TIME = 0x08
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
DEFAULT_CHUNK_RECORDS = 10_000

_NO_HEADERS: Headers = ()


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """One byte range of a segment object and the offsets wanted from it.

    ``start``/``end`` are the round's window for the partition, not the
    range's own first/last offsets: a range holds whole batches, so it may
    begin before ``start`` or end after ``end``.
    """

    object_key: str
    byte_start: int
    byte_end: int
    partition: int
    start: int
    end: int
    # aborted transactions with records in this range: (producer id, first offset)
    aborted: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> SegmentRange:
        """From a plain mapping, e.g. a Spark ``Row.asDict()`` or an Arrow ``to_pylist()`` row."""
        return cls(
            str(row["object_key"]),
            int(row["byte_start"]),
            int(row["byte_end"]),
            int(row["partition"]),
            int(row["start"]),
            int(row["end"]),
        )


def ranges_from_admin(answer: Mapping[str, Any] | TopicRanges) -> list[SegmentRange]:
    """The ranges of one ``GET /v1/topics/{t}/partitions/{p}/ranges?start=A&end=B`` answer."""
    partition, start, end = int(answer["partition"]), int(answer["start"]), int(answer["end"])
    aborted = [
        (int(a["producer_id"]), int(a["first_offset"]), int(a["last_offset"]))
        for a in (answer.get("aborted_transactions") or [])
    ]
    return [
        SegmentRange(
            str(r["object_key"]),
            int(r["byte_start"]),
            int(r["byte_end"]),
            partition,
            start,
            end,
            tuple(
                (pid, first)
                for pid, first, last in aborted
                if first < int(r["end_offset"]) and last >= int(r["first_offset"])
            ),
        )
        for r in answer["ranges"]
    ]


class AbortedTransaction(NamedTuple):
    """An aborted transaction as Kafka's FetchResponse lists it."""

    producer_id: int
    first_offset: int


class SegmentRecord(NamedTuple):
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(slots=True)
class RecordChunk:
    """Records of one partition as parallel column lists, in offset order."""

    partition: int
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: list[Headers] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def records(self) -> Iterator[SegmentRecord]:
        p = self.partition
        for o, t, k, v, h in zip(
            self.offsets, self.timestamps, self.keys, self.values, self.headers, strict=True
        ):
            yield SegmentRecord(p, o, t, k, v, h)


@dataclass
class ReadStats:
    """Counters for the round's result JSON and for tests."""

    ranges: int = 0
    bytes_read: int = 0
    batches: int = 0
    batches_outside_window: int = 0
    control_batches: int = 0
    aborted_batches: int = 0
    records: int = 0


@functools.lru_cache(maxsize=8)
def cached_store(config: ObjectStoreConfig) -> ObjectStore:
    """One store (and boto3 client) per config per process: Spark reuses Python workers across tasks."""
    return open_object_store(config)


# ---------------------------------------------------------------- reading


def read_ranges(
    store: ObjectStore,
    ranges: Iterable[SegmentRange],
    *,
    aborted: Mapping[int, Sequence[tuple[int, int]]] | Sequence[tuple[int, int]] | None = None,
    max_records: int = DEFAULT_CHUNK_RECORDS,
    verify_crc: bool = True,
    stats: ReadStats | None = None,
) -> Iterator[RecordChunk]:
    """Chunks of records for ranges of any partitions.

    Ranges are grouped by partition (first appearance order); within a
    partition they must be in offset order, as the admin API returns them.
    ``aborted``: the aborted transactions (see module doc), a mapping
    partition -> list, or a plain list when every range is of one partition;
    None: those the ranges carry.
    """
    by_partition: dict[int, list[SegmentRange]] = {}
    for rng in ranges:
        by_partition.setdefault(rng.partition, []).append(rng)
    if aborted is not None and not isinstance(aborted, Mapping):
        if len(by_partition) > 1:
            raise ValueError(
                "aborted transactions are per partition: pass a mapping for ranges of several"
            )
        aborted = {p: aborted for p in by_partition}
    for partition, group in by_partition.items():
        carried = sorted({a for rng in group for a in rng.aborted})
        yield from read_partition(
            store,
            group,
            aborted=(carried or None) if aborted is None else aborted.get(partition, ()),
            max_records=max_records,
            verify_crc=verify_crc,
            stats=stats,
        )


def read_records(
    store: ObjectStore, ranges: Iterable[SegmentRange], **kwargs: Any
) -> Iterator[SegmentRecord]:
    """Record by record (convenient, slower than consuming ``read_ranges`` chunks)."""
    for chunk in read_ranges(store, ranges, **kwargs):
        yield from chunk.records()


def read_partition(
    store: ObjectStore,
    ranges: Sequence[SegmentRange],
    *,
    aborted: Sequence[tuple[int, int]] | None = None,
    max_records: int = DEFAULT_CHUNK_RECORDS,
    verify_crc: bool = True,
    stats: ReadStats | None = None,
) -> Iterator[RecordChunk]:
    """Chunks of about ``max_records`` records of one partition's ranges.

    ``aborted=None`` reads uncommitted (no transaction filtering); a sequence,
    even empty, reads committed. Overlapping ranges never yield an offset twice.
    """
    if not ranges:
        return
    partition = ranges[0].partition
    txn = _TransactionFilter(aborted) if aborted is not None else None
    stats = stats if stats is not None else ReadStats()
    chunk = RecordChunk(partition)
    next_offset = -1  # offsets below this were already yielded (or skipped as non-data)
    for rng in ranges:
        if rng.partition != partition:
            raise ValueError(
                f"read_partition got ranges of partitions {partition} and {rng.partition}"
            )
        if rng.byte_end <= rng.byte_start or rng.end <= rng.start:
            continue
        data = store.get_range(rng.object_key, rng.byte_start, rng.byte_end)
        stats.ranges += 1
        stats.bytes_read += len(data)
        if len(data) != rng.byte_end - rng.byte_start:
            raise CorruptBatchError(
                f"{rng.object_key}[{rng.byte_start}:{rng.byte_end}] returned {len(data)} bytes"
            )
        try:
            next_offset = _read_range(data, rng, chunk, txn, next_offset, verify_crc, stats)
        except (IndexError, ValueError) as exc:
            if isinstance(exc, CorruptBatchError):
                raise CorruptBatchError(
                    f"{rng.object_key}[{rng.byte_start}:{rng.byte_end}]: {exc}"
                ) from exc
            raise CorruptBatchError(
                f"{rng.object_key}[{rng.byte_start}:{rng.byte_end}]: malformed record: {exc}"
            ) from exc
        if len(chunk) >= max_records:
            stats.records += len(chunk)
            yield chunk
            chunk = RecordChunk(partition)
    if len(chunk):
        stats.records += len(chunk)
        yield chunk


def _read_range(
    data: bytes,
    rng: SegmentRange,
    chunk: RecordChunk,
    txn: _TransactionFilter | None,
    next_offset: int,
    verify_crc: bool,
    stats: ReadStats,
) -> int:
    """Decode the batches of one range into ``chunk``; return the new ``next_offset``."""
    view = memoryview(data)
    size = len(data)
    hi = rng.end
    pos = 0
    while pos < size:
        if size - pos < LOG_OVERHEAD:
            raise CorruptBatchError(f"{size - pos} stray bytes after the last batch")
        header = read_header(data, pos)
        end = pos + header.size
        if end > size:
            raise CorruptBatchError(f"batch at byte {pos} runs past the end of the range")
        stats.batches += 1
        if verify_crc and crc32c(view[pos + 21 : end]) != header.crc:
            raise CorruptBatchError(f"batch at offset {header.base_offset} fails its CRC check")
        last = header.base_offset + header.last_offset_delta
        lo = max(rng.start, next_offset)
        skip = False
        if txn is not None and header.producer_id >= 0:
            skip = txn.skip(header, data, pos, end)
        if header.is_control:
            stats.control_batches += 1
            skip = True
        elif skip:
            stats.aborted_batches += 1
        if last < lo or header.base_offset >= hi:
            if not skip:
                stats.batches_outside_window += 1
        elif not skip:
            _decode_batch(data, pos, end, header, lo, hi, chunk)
        if last >= lo:
            next_offset = max(next_offset, min(last + 1, hi))
        pos = end
    return next_offset


class _TransactionFilter:
    """Kafka's ``read_committed`` consumer logic (CompletedFetch): an aborted
    transaction becomes active once a batch reaches its first offset, the
    producer's transactional batches are dropped while it is active, and its
    ABORT marker ends it."""

    def __init__(self, aborted: Sequence[tuple[int, int]]) -> None:
        self.pending = sorted(
            (AbortedTransaction(int(p), int(o)) for p, o in aborted), key=lambda a: a.first_offset
        )
        self.next = 0
        self.active: set[int] = set()

    def skip(self, header: BatchHeader, data: bytes, pos: int, end: int) -> bool:
        last = header.base_offset + header.last_offset_delta
        while self.next < len(self.pending) and self.pending[self.next].first_offset <= last:
            self.active.add(self.pending[self.next].producer_id)
            self.next += 1
        if header.is_control:
            if _control_type(data, pos, end, header) == CONTROL_ABORT:
                self.active.discard(header.producer_id)
            return True
        return header.is_transactional and header.producer_id in self.active


def _control_type(data: bytes, pos: int, end: int, header: BatchHeader) -> int:
    """The type of a control batch's marker (key: int16 version, int16 type)."""
    probe = RecordChunk(-1)
    _decode_batch(data, pos, end, header, header.base_offset, header.base_offset + 1, probe)
    key = probe.keys[0] if probe.keys else None
    if key is None or len(key) < 4:
        raise CorruptBatchError(f"control batch at offset {header.base_offset} has no marker key")
    return int.from_bytes(key[2:4], "big", signed=True)


# ---------------------------------------------------------------- record decoding


def _decode_batch(
    data: bytes, pos: int, end: int, header: BatchHeader, lo: int, hi: int, chunk: RecordChunk
) -> None:
    """Append the batch's records with lo <= offset < hi to ``chunk``."""
    buf: Buffer | cramjam.Buffer
    if header.compression == COMPRESSION_NONE:
        buf, p, stop = data, pos + HEADER_SIZE, end
    else:
        try:
            buf = decompress_buffer(header.compression, memoryview(data)[pos + HEADER_SIZE : end])
        except CorruptBatchError:
            raise
        except Exception as exc:  # cramjam's DecompressionError and friends
            raise CorruptBatchError(
                f"batch at offset {header.base_offset} does not decompress: {exc}"
            ) from exc
        p, stop = 0, len(buf)
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    append_time = header.max_timestamp if header.attributes & ATTR_LOG_APPEND_TIME else None
    if _kafka_records is not None:
        try:
            _kafka_records.decode_records(
                buf,
                p,
                stop,
                header.record_count,
                base_offset,
                base_ts,
                -1 if append_time is None else append_time,
                lo,
                hi,
                chunk.offsets,
                chunk.timestamps,
                chunk.keys,
                chunk.values,
                chunk.headers,
                _NO_HEADERS,
            )
        except ValueError as exc:
            raise CorruptBatchError(str(exc)) from exc
        return
    offsets, timestamps, keys, values, headers = (
        chunk.offsets.append,
        chunk.timestamps.append,
        chunk.keys.append,
        chunk.values.append,
        chunk.headers.append,
    )
    try:  # the fallback of _kafka_records.decode_records: plain, not fast
        for record in iter_records(
            buf if isinstance(buf, bytes) else bytes(buf),
            header.record_count,
            p,
            stop,
            strict=True,
            keep=lambda delta: lo <= base_offset + delta < hi,
        ):
            offsets(base_offset + record.offset_delta)
            timestamps(base_ts + record.timestamp_delta if append_time is None else append_time)
            keys(record.key)
            values(record.value)
            headers(record.headers or _NO_HEADERS)
    except CorruptBatchError as exc:
        raise CorruptBatchError(f"batch at offset {base_offset}: {exc}") from exc
