"""Kafka record batches for the spark_jobs tests, built the way producers build them.

kio (a Kafka protocol library) writes the uncompressed v2 batch; for a
compressed one the records section is compressed with cramjam (the codecs
librdkafka and the Java client use), the codec bits set and the CRC recomputed,
exactly as a producer does it. Control batches (transaction markers) carry a
key of (version int16, type int16), as Kafka's coordinator writes them.
"""

from __future__ import annotations

import datetime
import io
import struct

import cramjam
from crc32c import crc32c
from kio.records.schema import NewRecordBatch, Record, RecordHeader
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from broker.kafka import records

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_LOG_APPEND_TIME = 0x08

Entry = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def _compress(codec: str, body: bytes, xerial: bool = False) -> bytes:
    if codec == "gzip":
        return bytes(cramjam.gzip.compress(body))
    if codec == "snappy":
        if not xerial:
            return bytes(cramjam.snappy.compress_raw(body))
        # the Java client's framing: magic, version, compatible version, then (length, block)*
        out = bytearray(b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
        for start in range(0, len(body), 100):  # small blocks, so the reader has to join several
            block = bytes(cramjam.snappy.compress_raw(body[start : start + 100]))
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec == "lz4":
        return bytes(cramjam.lz4.compress(body))
    if codec == "zstd":
        return bytes(cramjam.zstd.compress(body))
    raise ValueError(codec)


def batch(
    entries: list[Entry],
    base_offset: int = 0,
    *,
    codec: str = "none",
    timestamp_ms: int = 1_700_000_000_000,
    producer_id: int = -1,
    attributes: int = 0,
    xerial: bool = False,
) -> bytes:
    """One v2 batch of (key, value, headers) records with offsets base_offset..;
    record i has timestamp ``timestamp_ms + i``."""
    base = datetime.datetime.fromtimestamp(timestamp_ms / 1000, datetime.UTC)
    made = NewRecordBatch(
        producer_id=i64(producer_id),
        producer_epoch=i16(0 if producer_id >= 0 else -1),
        base_sequence=i32(0 if producer_id >= 0 else -1),
        attributes=i16(attributes),
        records=tuple(
            Record(
                attributes=i8(0),
                timestamp=TZAwareMicros.parse(base + datetime.timedelta(milliseconds=i)),
                offset=i64(base_offset + i),
                key=key,
                value=value,
                headers=tuple(RecordHeader(key=k.encode(), value=v) for k, v in headers),
            )
            for i, (key, value, headers) in enumerate(entries)
        ),
    )
    buf = io.BytesIO()
    write_new_batch(buf, made)
    raw = buf.getvalue()
    if codec == "none":
        return raw
    body = _compress(codec, raw[records.HEADER_SIZE :], xerial)
    head = bytearray(raw[: records.HEADER_SIZE])
    struct.pack_into(
        ">i", head, 8, records.HEADER_SIZE - records.LOG_OVERHEAD + len(body)
    )  # batch length
    struct.pack_into(">h", head, 21, attributes | CODECS[codec])
    after_crc = bytes(head[21:]) + body
    struct.pack_into(">I", head, 17, crc32c(after_crc))
    return bytes(head) + body


def control(base_offset: int, producer_id: int, commit: bool) -> bytes:
    """A transaction marker: COMMIT or ABORT for ``producer_id``."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 7)  # version, coordinator epoch
    return batch(
        [(key, value, [])],
        base_offset,
        producer_id=producer_id,
        attributes=ATTR_TRANSACTIONAL | ATTR_CONTROL,
    )


def plain(values: list[bytes], base_offset: int = 0, **kwargs: object) -> bytes:
    """Records with key ``k<offset>`` and no headers."""
    entries: list[Entry] = [(f"k{base_offset + i}".encode(), v, []) for i, v in enumerate(values)]
    return batch(entries, base_offset, **kwargs)  # type: ignore[arg-type]
