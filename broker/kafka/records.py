"""Kafka record batches (magic v2): the header fields the broker needs, and a decoder.

The broker never decompresses on the hot path: it reads the fixed 61-byte
header, checks the CRC (which does not cover the base offset) and rewrites the
base offset in place. The full decoder is for the data quality gate and for the
commit round's segment reader.
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from crc32c import crc32c

if TYPE_CHECKING:
    import cramjam

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base offset + batch length
_HEADER = struct.Struct(">qiibIhiqqqhii")

COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = range(5)
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

Buffer = bytes | bytearray | memoryview
"""Whatever holds batch bytes: received (bytes), rewritten (bytearray) or sliced (memoryview)."""


def _load_framing_check() -> Callable[[memoryview, int], str | None] | None:
    try:
        module = importlib.import_module("broker._gate")
    except ImportError:
        return None
    check: Callable[[memoryview, int], str | None] = module.record_framing_problem
    return check


_framing_in_c = _load_framing_check()


class CorruptBatchError(ValueError):
    """The bytes are not a well-formed v2 record batch."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch on the wire, including the 12-byte log overhead."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def compression(self) -> int:
        return self.attributes & 0x07

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) % (2**31)


def read_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptBatchError(
            f"record batch truncated: {len(buf) - pos} bytes, header needs {HEADER_SIZE}"
        )
    header = BatchHeader(*_HEADER.unpack_from(buf, pos))
    if header.magic != 2:
        raise CorruptBatchError(
            f"unsupported record batch magic {header.magic} (only v2 is accepted)"
        )
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptBatchError(
            f"record batch length {header.batch_length} is shorter than its header"
        )
    return header


def split_batches(records: Buffer, verify_crc: bool = True) -> list[BatchHeader]:
    """Headers of every batch in a produce request's records field, validated."""
    headers: list[BatchHeader] = []
    pos = 0
    view = memoryview(records)
    while pos < len(records):
        header = read_header(view, pos)
        end = pos + header.size
        if end > len(records):
            raise CorruptBatchError(
                f"record batch at byte {pos} claims {header.size} bytes, only {len(records) - pos} present"
            )
        if header.record_count <= 0 or header.record_count != header.last_offset_delta + 1:
            raise CorruptBatchError(
                f"record batch at byte {pos} has {header.record_count} records but a last offset delta "
                f"of {header.last_offset_delta}"
            )
        if verify_crc and crc32c(view[pos + 21 : end]) != header.crc:
            raise CorruptBatchError(f"record batch at byte {pos} fails its CRC check")
        if header.compression == COMPRESSION_NONE:
            check_record_framing(view[pos + HEADER_SIZE : end], header.record_count)
        else:
            # Kafka decompresses to validate too: a batch whose CRC is right but whose
            # payload does not decompress, or decompresses to bad records, would be
            # stored and then stop every consumer of the partition at that offset.
            try:
                inner = decompress(header.compression, bytes(view[pos + HEADER_SIZE : end]))
            except CorruptBatchError:
                raise
            except Exception as exc:  # noqa: BLE001 - cramjam raises DecompressionError, ValueError...
                raise CorruptBatchError(
                    f"record batch at byte {pos} does not decompress: {exc}"
                ) from None
            check_record_framing(memoryview(inner), header.record_count)
        headers.append(header)
        pos = end
    return headers


def check_record_framing(body: memoryview, count: int) -> None:
    """Walk the record length prefixes of an uncompressed batch: a batch whose
    CRC is right but whose records do not add up is refused, as Kafka does.
    (Compressed batches are checked when decoded.) In C when the extension is
    built: this runs for every produced record."""
    if _framing_in_c is not None:
        problem = _framing_in_c(body, count)
        if problem is not None:
            raise CorruptBatchError(problem)
        return
    _check_record_framing_py(body, count)


def _field_varint(body: memoryview, pos: int, end: int) -> tuple[int, int] | None:
    """A zigzag varint (at most 10 bytes, as a signed 64-bit value) inside [pos, end), or None."""
    shift = 0
    raw = 0
    while True:
        if pos >= end or shift > 63:
            return None
        byte = body[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    raw &= (1 << 64) - 1
    return (raw >> 1) ^ -(raw & 1), pos


def _sized_field(
    body: memoryview, pos: int, end: int, index: int, name: str, minimum: int
) -> tuple[int, int] | str:
    """A length or count varint at ``pos`` and the position after it, or what is wrong with it:
    it runs past the record, or is below ``minimum`` or more than the bytes left."""
    got = _field_varint(body, pos, end)
    if got is None:
        return f"record {index}: {name} runs past the record"
    value, after = got
    if value < minimum or value > end - after:
        return f"record {index}: {name} {value} does not fit the record"
    return got


def _record_problem(body: memoryview, pos: int, end: int, index: int) -> str | None:
    """What is wrong with the fields of record ``index`` in body[pos:end], or None.
    The same walk as the C one (broker/_gate.c, record_framing_problem)."""
    if body[pos]:
        # unused by Kafka (always 0); some readers (kafka-python, aiokafka) take it for a
        # varint, so a set high bit would make them misread the whole record
        return f"record {index}: attributes {body[pos]} (must be 0)"
    pos += 1
    fields = []
    for name in ("timestamp delta", "offset delta", "key length"):
        got = _field_varint(body, pos, end)
        if got is None:
            return f"record {index}: {name} runs past the record"
        fields.append(got[0])
        pos = got[1]
    _, offset_delta, key_length = fields
    if offset_delta != index:
        return f"record {index}: offset delta {offset_delta}, expected {index}"
    if key_length < -1 or key_length > end - pos:
        return f"record {index}: key length {key_length} does not fit the record"
    pos += max(key_length, 0)
    value = _sized_field(body, pos, end, index, "value length", -1)
    if isinstance(value, str):
        return value
    pos = value[1] + max(value[0], 0)
    headers = _sized_field(body, pos, end, index, "header count", 0)
    if isinstance(headers, str):
        return headers
    header_count, pos = headers
    for _ in range(header_count):
        got = _field_varint(body, pos, end)
        if got is None or got[0] < 0 or got[0] > end - got[1]:
            return f"record {index}: a header key does not fit the record"
        try:  # a Kafka String; kafka-python fails on anything else
            bytes(body[got[1] : got[1] + got[0]]).decode("utf-8")
        except UnicodeDecodeError:
            return f"record {index}: a header key is not UTF-8"
        pos = got[1] + got[0]
        got = _field_varint(body, pos, end)
        if got is None or got[0] < -1 or got[0] > end - got[1]:
            return f"record {index}: a header value does not fit the record"
        pos = got[1] + max(got[0], 0)
    if pos != end:
        return f"record {index}: {end - pos} bytes left over after its fields"
    return None


def _check_record_framing_py(body: memoryview, count: int) -> None:
    pos = 0
    size = len(body)
    for index in range(count):
        shift = 0
        raw = 0
        while True:
            if pos >= size:
                raise CorruptBatchError("record length runs past the end of the batch")
            byte = body[pos]
            pos += 1
            raw |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 28:
                raise CorruptBatchError("record length varint is too long")
        length = (raw >> 1) ^ -(raw & 1)
        if length < 6:  # attributes, timestamp, offset, key, value, header count
            raise CorruptBatchError(f"record of {length} bytes is too short")
        if pos + length <= size:
            problem = _record_problem(body, pos, pos + length, index)
            if problem is not None:
                raise CorruptBatchError(problem)
        pos += length
    if pos != size:
        raise CorruptBatchError(f"records take {pos} bytes but the batch holds {size}")


def with_base_offset(batch: Buffer, base_offset: int) -> bytearray:
    """A copy of the batch with its base offset set; the CRC stays valid (it starts at attributes)."""
    copy = bytearray(batch)
    struct.pack_into(">q", copy, 0, base_offset)
    return copy


def iter_batches(data: Buffer) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Walk concatenated batches (a segment byte range) without copying."""
    view = memoryview(data)
    pos = 0
    while pos + LOG_OVERHEAD <= len(view):
        header = read_header(view, pos)
        end = pos + header.size
        if end > len(view):
            raise CorruptBatchError(f"record batch at byte {pos} runs past the end of the data")
        yield header, view[pos:end]
        pos = end


# ---------------------------------------------------------------- decoding


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise CorruptBatchError("varint runs past the end of the record")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptBatchError("varint too long")
    return (result >> 1) ^ -(result & 1), pos


def _bytes_field(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = _varint(buf, pos)
    if length < 0:
        return None, pos
    end = pos + length
    if end > len(buf):
        raise CorruptBatchError("record field runs past the end of the batch")
    return buf[pos:end], end


def decompress(codec: int, data: bytes) -> bytes:
    out = decompress_buffer(codec, data)
    return out if isinstance(out, bytes) else bytes(out)


def decompress_buffer(codec: int, data: Buffer) -> Buffer | cramjam.Buffer:
    """``data`` decompressed, as cramjam's own read-only buffer where it can (any object with
    the buffer protocol in, a bytes-like object out): for a reader that only reads it, the
    round's record decoder, which copied each batch's compressed bytes out of its segment range
    and the decompressed ones out of cramjam's buffer (a quarter of its decompress time)."""
    import cramjam

    if codec == COMPRESSION_NONE:
        return data
    if codec == COMPRESSION_GZIP:
        return cramjam.gzip.decompress(data)
    if codec == COMPRESSION_SNAPPY:
        # Kafka's Java client frames snappy in the xerial format; librdkafka may too.
        if data[:8] == b"\x82SNAPPY\x00":
            out = bytearray()
            pos = 16
            while pos < len(data):
                if pos + 4 > len(data):
                    raise CorruptBatchError(
                        "snappy-java framing: trailing bytes after the last chunk"
                    )
                (length,) = struct.unpack_from(">i", data, pos)
                pos += 4
                if not 0 < length <= len(data) - pos:  # librdkafka refuses these too
                    raise CorruptBatchError(
                        f"snappy-java framing: chunk length {length} does not fit"
                    )
                out += bytes(cramjam.snappy.decompress_raw(data[pos : pos + length]))
                pos += length
            return bytes(out)
        return cramjam.snappy.decompress_raw(data)
    if codec == COMPRESSION_LZ4:
        return cramjam.lz4.decompress(data)
    if codec == COMPRESSION_ZSTD:
        return cramjam.zstd.decompress(data)
    raise CorruptBatchError(f"unknown compression codec {codec}")


Headers = tuple[tuple[str, bytes | None], ...]


class RawRecord(NamedTuple):
    """One record of a batch body, its offset and timestamp still relative to the batch's."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: Headers


def iter_records(
    body: Buffer,
    count: int,
    pos: int = 0,
    stop: int | None = None,
    strict: bool = False,
    keep: Callable[[int], bool] | None = None,
) -> Iterator[RawRecord]:
    """The ``count`` records of a (decompressed) batch body in ``body[pos:stop]``.

    The one Python walk of Kafka's record format (v2), for the broker (``decode_batch``) and
    the commit round's fallback when its C loop (``spark_jobs/_kafka_records.c``) is not
    built. Each mirrors a C walk exactly, so ``strict`` picks the rules: off, those of the
    produce gate's framing check (``_gate.c``: a header without a key reads as ``""``);
    on, those of the round's decoder and of Kafka's (a record shorter than its fixed fields,
    a negative header count, a header without a key, bytes after the last record are all
    ``CorruptBatchError``). ``keep(offset_delta)`` False: the record is skipped unread past
    its offset, as the round's C loop skips records outside the offsets it was asked for."""
    buf = bytes(body) if not isinstance(body, bytes) else body
    stop = len(buf) if stop is None else stop
    for _ in range(count):
        length, pos = _varint(buf, pos)
        end = pos + length
        if length < 0 or end > stop or (strict and length < 6):
            raise CorruptBatchError("record length runs past the end of the batch")
        pos += 1  # attributes (unused in v2)
        ts_delta, pos = _varint(buf, pos)
        offset_delta, pos = _varint(buf, pos)
        if keep is not None and not keep(offset_delta):
            pos = end
            continue
        key, pos = _bytes_field(buf, pos)
        value, pos = _bytes_field(buf, pos)
        n_headers, pos = _varint(buf, pos)
        if strict and n_headers < 0:
            raise CorruptBatchError("negative record header count")
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(n_headers):
            name, pos = _bytes_field(buf, pos)
            if name is None and strict:
                raise CorruptBatchError("record header with a null key")
            header_value, pos = _bytes_field(buf, pos)
            headers.append(((name or b"").decode("utf-8", "replace"), header_value))
        if pos != end:
            raise CorruptBatchError("record fields do not add up to the record length")
        yield RawRecord(offset_delta, ts_delta, key, value, tuple(headers))
    if strict and pos != stop:
        raise CorruptBatchError(f"{stop - pos} bytes after the last record of the batch")


def decode_batch(batch: Buffer) -> tuple[BatchHeader, list[Record]]:
    """Every record of one batch, with absolute offsets and timestamps."""
    header = read_header(batch)
    body = decompress(header.compression, bytes(batch[HEADER_SIZE : header.size]))
    return header, [
        Record(
            offset=header.base_offset + r.offset_delta,
            timestamp=header.base_timestamp + r.timestamp_delta,
            key=r.key,
            value=r.value,
            headers=r.headers,
        )
        for r in iter_records(body, header.record_count)
    ]


# ---------------------------------------------------------------- encoding


def _zigzag_varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_or_null(value: bytes | None) -> bytes:
    if value is None:
        return _zigzag_varint(-1)
    return _zigzag_varint(len(value)) + value


def encode_batch(
    entries: list[tuple[bytes | None, bytes | None]],
    timestamp_ms: int,
    headers: list[list[tuple[str, bytes | None]]] | None = None,
    producer: tuple[int, int, int] = (-1, -1, -1),
) -> bytes:
    """An uncompressed v2 batch (base offset 0) of (key, value) records: what the
    broker writes into its own topics (``_schemas``) and what tests produce raw.
    ``producer``: (producer id, epoch, base sequence) of an idempotent producer's batch."""
    if not entries:
        raise ValueError("a record batch needs at least one record")
    body = bytearray()
    for i, (key, value) in enumerate(entries):
        record = bytearray(b"\x00")  # attributes
        record += _zigzag_varint(0)  # timestamp delta
        record += _zigzag_varint(i)  # offset delta
        record += _bytes_or_null(key) + _bytes_or_null(value)
        record_headers = headers[i] if headers else []
        record += _zigzag_varint(len(record_headers))
        for hkey, hvalue in record_headers:
            record += _bytes_or_null(hkey.encode()) + _bytes_or_null(hvalue)
        body += _zigzag_varint(len(record)) + record
    after_crc = struct.pack(
        ">hiqqqhii", 0, len(entries) - 1, timestamp_ms, timestamp_ms, *producer, len(entries)
    ) + bytes(body)
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, rest
    return (
        struct.pack(">qiib", 0, batch_length, -1, 2)
        + struct.pack(">I", crc32c(after_crc))
        + after_crc
    )


# ---------------------------------------------------------------- transaction markers

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_ATTRIBUTES = ATTR_TRANSACTIONAL | ATTR_CONTROL


def encode_control_batch(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    timestamp_ms: int,
    coordinator_epoch: int = 0,
) -> bytes:
    """A transaction marker (KIP-98): a control batch of one record whose key is
    (int16 version 0, int16 type: 0 abort, 1 commit) and whose value is
    (int16 version 0, int32 coordinator epoch), as Kafka's coordinator writes it."""
    key = struct.pack(">hh", 0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = struct.pack(">hi", 0, coordinator_epoch)
    record = bytearray(b"\x00")
    record += _zigzag_varint(0) + _zigzag_varint(0)
    record += _bytes_or_null(key) + _bytes_or_null(value) + _zigzag_varint(0)
    body = _zigzag_varint(len(record)) + bytes(record)
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            _CONTROL_ATTRIBUTES,
            0,
            timestamp_ms,
            timestamp_ms,
            producer_id,
            producer_epoch,
            -1,
            1,
        )
        + body
    )
    batch_length = 4 + 1 + 4 + len(after_crc)
    return (
        struct.pack(">qiib", 0, batch_length, -1, 2)
        + struct.pack(">I", crc32c(after_crc))
        + after_crc
    )


def control_type(batch: Buffer) -> int:
    """The marker type (``CONTROL_ABORT`` / ``CONTROL_COMMIT``) of a control batch."""
    _, decoded = decode_batch(batch)
    key = decoded[0].key if decoded else None
    if key is None or len(key) < 4:
        raise CorruptBatchError("control batch has no marker key")
    return int.from_bytes(key[2:4], "big", signed=True)
