"""Record batch parsing, offset rewriting and decoding, on batches made by a real client (kio's writer)."""

from __future__ import annotations

import datetime
import io

import pytest
from kio.records.schema import NewRecordBatch, Record, RecordHeader
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from broker.kafka import records


def _batch(values: list[bytes], key: bytes | None = b"k") -> bytes:
    now = TZAwareMicros.parse(datetime.datetime.now(datetime.UTC))
    batch = NewRecordBatch(
        producer_id=i64(-1),
        producer_epoch=i16(-1),
        base_sequence=i32(-1),
        attributes=i16(0),
        records=tuple(
            Record(
                attributes=i8(0),
                timestamp=now,
                offset=i64(i),
                key=key,
                value=v,
                headers=(RecordHeader(key=b"h", value=b"x"),),
            )
            for i, v in enumerate(values)
        ),
    )
    buf = io.BytesIO()
    write_new_batch(buf, batch)
    return buf.getvalue()


def test_split_rewrite_and_decode() -> None:
    raw = _batch([b"a", b"bb", b"ccc"]) + _batch([b"d"])
    headers = records.split_batches(raw)
    assert [h.record_count for h in headers] == [3, 1]
    first = raw[: headers[0].size]
    moved = records.with_base_offset(first, 1000)
    records.split_batches(bytes(moved))  # CRC still valid
    header, decoded = records.decode_batch(moved)
    assert header.base_offset == 1000
    assert [r.offset for r in decoded] == [1000, 1001, 1002]
    assert [r.value for r in decoded] == [b"a", b"bb", b"ccc"]
    assert decoded[0].headers == (("h", b"x"),)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b[:-1], "claims"),
        (lambda b: b[:30], "truncated"),
        (lambda b: b[:16] + b"\x01" + b[17:], "magic"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]), "CRC"),
    ],
)
def test_corrupt_batches_are_refused(mutate: object, message: str) -> None:
    raw = _batch([b"value"] * 5)
    assert callable(mutate)
    with pytest.raises(records.CorruptBatchError, match=message):
        records.split_batches(mutate(raw))


def test_iter_batches_walks_concatenated_batches() -> None:
    raw = b"".join(
        bytes(records.with_base_offset(_batch([b"x"] * n), base))
        for base, n in [(0, 2), (2, 3), (5, 1)]
    )
    assert [(h.base_offset, h.record_count) for h, _ in records.iter_batches(raw)] == [
        (0, 2),
        (2, 3),
        (5, 1),
    ]


def test_encode_batch_round_trips_through_the_validator() -> None:
    raw = records.encode_batch(
        [(b"k1", b"v1"), (None, None), (b"k3", b"")],
        1_700_000_000_000,
        headers=[[("a", b"1")], [], [("b", None)]],
    )
    (header,) = records.split_batches(raw)
    assert header.record_count == 3
    _, decoded = records.decode_batch(raw)
    assert [(r.key, r.value) for r in decoded] == [(b"k1", b"v1"), (None, None), (b"k3", b"")]
    assert decoded[0].headers == (("a", b"1"),) and decoded[2].headers == (("b", None),)
    assert all(r.timestamp == 1_700_000_000_000 for r in decoded)
