"""The record loop in C (``spark_jobs._kafka_records``) against the Python one in
``segments._decode_batch``: the same chunks for any records, and for damaged
batches either the same chunks or both refusing with CorruptBatchError."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.kafka import records
from spark_jobs.decode import segments
from spark_jobs.decode.segments import RecordChunk
from tests.spark_jobs import batches

pytestmark = pytest.mark.skipif(
    segments._kafka_records is None, reason="the C extension is not built"
)

payload = st.one_of(st.none(), st.binary(max_size=300))
header = st.tuples(st.text(max_size=8), payload)
entry = st.tuples(payload, payload, st.lists(header, max_size=3))


def decode(
    raw: bytes, lo: int, hi: int, *, use_c: bool
) -> RecordChunk | type[records.CorruptBatchError]:
    saved = segments._kafka_records
    if not use_c:
        segments._kafka_records = None
    try:
        chunk = RecordChunk(0)
        header_ = records.read_header(raw, 0)
        segments._decode_batch(raw, 0, len(raw), header_, lo, hi, chunk)
    except (
        records.CorruptBatchError,
        IndexError,
    ):  # read_partition maps IndexError to CorruptBatchError too
        return records.CorruptBatchError
    else:
        return chunk
    finally:
        segments._kafka_records = saved


def both(raw: bytes, lo: int = 0, hi: int = 1 << 40) -> Iterator[object]:
    c, py = decode(raw, lo, hi, use_c=True), decode(raw, lo, hi, use_c=False)
    assert c == py
    yield c


@settings(max_examples=150, deadline=None)
@given(
    st.lists(entry, min_size=1, max_size=20),
    st.integers(0, 1000),
    st.integers(0, 25),
    st.integers(0, 25),
    st.sampled_from(["none", "lz4", "zstd"]),
)
def test_same_records_as_python(
    entries: list[batches.Entry], base: int, lo: int, width: int, codec: str
) -> None:
    raw = batches.batch(entries, base, codec=codec)
    (chunk,) = both(raw, base + lo, base + lo + width)
    assert isinstance(chunk, RecordChunk)
    assert chunk.offsets == [
        o for o in range(base, base + len(entries)) if base + lo <= o < base + lo + width
    ]


@settings(max_examples=300, deadline=None)
@given(st.lists(entry, min_size=1, max_size=5), st.data())
def test_damaged_batches_are_refused_alike(
    entries: list[batches.Entry], data: st.DataObject
) -> None:
    raw = bytearray(batches.batch(entries, 0))
    body = len(raw) - records.HEADER_SIZE
    for _ in range(data.draw(st.integers(1, 4))):
        at = records.HEADER_SIZE + data.draw(st.integers(0, body - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(records.HEADER_SIZE, len(raw)))
    list(both(bytes(raw[:cut])))


def test_log_append_time_and_headers() -> None:
    raw = batches.batch(
        [(b"k", b"v", [("h", b"1"), ("n", None)])],
        5,
        attributes=batches.ATTR_LOG_APPEND_TIME,
        timestamp_ms=1_000,
    )
    (chunk,) = both(raw)
    assert isinstance(chunk, RecordChunk)
    assert chunk.headers == [(("h", b"1"), ("n", None))] and chunk.offsets == [5]
