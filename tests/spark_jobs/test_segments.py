"""The segment reader: offset windows, codecs, control batches, aborted transactions, corruption."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.config import ObjectStoreConfig
from broker.kafka import records
from broker.storage.objectstore import LocalObjectStore
from spark_jobs.decode import segments
from spark_jobs.decode.segments import ReadStats, SegmentRange, read_partition, read_records
from tests.spark_jobs import batches
from tests.spark_jobs.batches import CODECS


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


def put(store: LocalObjectStore, key: str, *parts: bytes) -> list[tuple[int, int]]:
    """Store the batches back to back; their (start, end) byte positions."""
    spans, pos = [], 0
    for part in parts:
        spans.append((pos, pos + len(part)))
        pos += len(part)
    store.put(key, b"".join(parts))
    return spans


def whole(store: LocalObjectStore, key: str, partition: int, start: int, end: int) -> SegmentRange:
    size = (store.root / key).stat().st_size
    return SegmentRange(key, 0, size, partition, start, end)


def values(
    store: LocalObjectStore, ranges: list[SegmentRange], **kwargs: object
) -> list[tuple[int, bytes | None]]:
    return [(r.offset, r.value) for r in read_records(store, ranges, **kwargs)]


def test_window_keeps_exactly_start_to_end_across_batches_and_ranges(
    store: LocalObjectStore,
) -> None:
    # batches [0,5) [5,10) [10,15) in one object, [15,20) [20,25) in another
    first = [batches.plain([f"v{o}".encode() for o in range(b, b + 5)], b) for b in (0, 5, 10)]
    second = [batches.plain([f"v{o}".encode() for o in range(b, b + 5)], b) for b in (15, 20)]
    put(store, "a.seg", *first)
    put(store, "b.seg", *second)
    ranges = [whole(store, "a.seg", 0, 3, 22), whole(store, "b.seg", 0, 3, 22)]
    stats = ReadStats()
    got = values(store, ranges, stats=stats)
    assert got == [(o, f"v{o}".encode()) for o in range(3, 22)]
    assert stats.ranges == 2 and stats.batches == 5 and stats.records == 19
    assert stats.bytes_read == sum(len(b) for b in first + second)


def test_batches_wholly_outside_the_window_are_not_decoded(store: LocalObjectStore) -> None:
    parts = [batches.plain([b"x"] * 5, b) for b in (0, 5, 10)]
    put(store, "a.seg", *parts)
    stats = ReadStats()
    assert [o for o, _ in values(store, [whole(store, "a.seg", 0, 5, 10)], stats=stats)] == list(
        range(5, 10)
    )
    assert stats.batches_outside_window == 2


@pytest.mark.parametrize("codec", list(CODECS))
def test_every_codec_decodes_keys_values_headers_and_timestamps(
    store: LocalObjectStore, codec: str
) -> None:
    entries: list[batches.Entry] = [
        (b"key-0", b"value-0" * 50, [("trace", b"abc"), ("empty", b""), ("none", None)]),
        (None, b"no key", []),
        (b"tombstone", None, [("h", b"\x00\xff")]),
        ("ключ".encode(), "значение".encode() * 30, [("ü", b"1")]),
    ]
    raw = batches.batch(entries, 40, codec=codec)
    assert records.read_header(raw).compression == CODECS[codec]
    put(store, "c.seg", raw)
    got = list(read_records(store, [whole(store, "c.seg", 3, 0, 100)]))
    _, reference = records.decode_batch(raw)  # the broker's own decoder, independent of ours
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in got] == [
        (r.offset, r.key, r.value, r.headers, r.timestamp) for r in reference
    ]
    assert [r.partition for r in got] == [3] * 4
    assert [r.offset for r in got] == [40, 41, 42, 43]
    assert got[0].headers == (("trace", b"abc"), ("empty", b""), ("none", None))
    assert got[1].key is None and got[2].value is None


def test_snappy_in_the_java_clients_xerial_framing(store: LocalObjectStore) -> None:
    raw = batches.plain(
        [f"value {i} ".encode() * 20 for i in range(10)], 0, codec="snappy", xerial=True
    )
    put(store, "x.seg", raw)
    assert [v for _, v in values(store, [whole(store, "x.seg", 0, 0, 10)])] == [
        f"value {i} ".encode() * 20 for i in range(10)
    ]


def test_control_batches_are_skipped_and_committed_transactions_kept(
    store: LocalObjectStore,
) -> None:
    txn = batches.plain([b"t0", b"t1"], 2, producer_id=7, attributes=batches.ATTR_TRANSACTIONAL)
    put(
        store,
        "t.seg",
        batches.plain([b"a", b"b"], 0),
        txn,
        batches.control(4, 7, commit=True),
        batches.plain([b"c"], 5),
    )
    stats = ReadStats()
    got = values(store, [whole(store, "t.seg", 0, 0, 6)], aborted=[], stats=stats)
    assert got == [(0, b"a"), (1, b"b"), (2, b"t0"), (3, b"t1"), (5, b"c")]
    assert stats.control_batches == 1 and stats.aborted_batches == 0


def test_aborted_transactions_are_dropped_read_committed(store: LocalObjectStore) -> None:
    # producer 7 aborts [2, 4) then commits [6, 7); producer 8 commits [4, 5) interleaved
    put(
        store,
        "t.seg",
        batches.plain([b"a", b"b"], 0),
        batches.plain(
            [b"abort-0", b"abort-1"], 2, producer_id=7, attributes=batches.ATTR_TRANSACTIONAL
        ),
        batches.plain([b"p8"], 4, producer_id=8, attributes=batches.ATTR_TRANSACTIONAL),
        batches.control(5, 7, commit=False),
        batches.plain([b"again"], 6, producer_id=7, attributes=batches.ATTR_TRANSACTIONAL),
        batches.control(7, 8, commit=True),
        batches.control(8, 7, commit=True),
        batches.plain([b"z"], 9),
    )
    rng = [whole(store, "t.seg", 0, 0, 10)]
    stats = ReadStats()
    committed = values(store, rng, aborted=[(7, 2)], stats=stats)
    assert committed == [(0, b"a"), (1, b"b"), (4, b"p8"), (6, b"again"), (9, b"z")]
    assert stats.aborted_batches == 1 and stats.control_batches == 3
    # without the broker's aborted list (it has no transactions yet): read_uncommitted, markers still skipped
    uncommitted = values(store, rng)
    assert [v for _, v in uncommitted] == [
        b"a",
        b"b",
        b"abort-0",
        b"abort-1",
        b"p8",
        b"again",
        b"z",
    ]


def test_aborted_list_is_per_partition(store: LocalObjectStore) -> None:
    txn = batches.plain([b"t"], 0, producer_id=7, attributes=batches.ATTR_TRANSACTIONAL)
    put(store, "p.seg", txn, batches.control(1, 7, commit=False))
    ranges = [whole(store, "p.seg", 0, 0, 2), whole(store, "p.seg", 1, 0, 2)]
    got = [(r.partition, r.value) for r in read_records(store, ranges, aborted={0: [(7, 0)]})]
    assert got == [(1, b"t")]


def test_log_append_time_batches_use_the_batch_max_timestamp(store: LocalObjectStore) -> None:
    raw = batches.plain([b"a", b"b", b"c"], 0, attributes=batches.ATTR_LOG_APPEND_TIME)
    put(store, "l.seg", raw)
    header = records.read_header(raw)
    got = list(read_records(store, [whole(store, "l.seg", 0, 0, 3)]))
    assert [r.timestamp for r in got] == [header.max_timestamp] * 3


def test_overlapping_ranges_never_yield_an_offset_twice(store: LocalObjectStore) -> None:
    spans = put(store, "o.seg", *[batches.plain([b"x"] * 5, b) for b in (0, 5, 10)])
    ranges = [
        SegmentRange("o.seg", spans[0][0], spans[1][1], 0, 0, 15),
        SegmentRange("o.seg", spans[1][0], spans[2][1], 0, 0, 15),
    ]
    assert [o for o, _ in values(store, ranges)] == list(range(15))


def test_chunks_hold_about_max_records_and_stay_in_order(store: LocalObjectStore) -> None:
    put(store, "m.seg", *[batches.plain([b"x"] * 10, b) for b in range(0, 100, 10)])
    chunks = list(read_partition(store, [whole(store, "m.seg", 2, 0, 100)], max_records=25))
    # a range is decoded whole, then cut: one chunk per range here
    assert [len(c) for c in chunks] == [100]
    spans = put(store, "n.seg", *[batches.plain([b"x"] * 10, b) for b in range(0, 100, 10)])
    ranges = [SegmentRange("n.seg", s, e, 2, 0, 100) for s, e in spans]
    chunks = list(read_partition(store, ranges, max_records=25))
    assert [len(c) for c in chunks] == [30, 30, 30, 10]
    assert [o for c in chunks for o in c.offsets] == list(range(100))


def test_corruption_is_reported_with_the_object_and_range(store: LocalObjectStore) -> None:
    raw = bytearray(batches.plain([b"value"] * 3, 0))
    raw[raw.rfind(b"value") + 4] ^= 0xFF  # the last byte of the last value
    put(store, "bad.seg", bytes(raw))
    with pytest.raises(records.CorruptBatchError, match=r"bad.seg\[0:\d+\].*CRC"):
        list(read_records(store, [whole(store, "bad.seg", 0, 0, 3)]))
    # without the CRC check the flipped byte comes through
    got = list(read_records(store, [whole(store, "bad.seg", 0, 0, 3)], verify_crc=False))
    assert got[-1].value == b"valu" + bytes([ord("e") ^ 0xFF])


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_compressed_body_that_does_not_decompress_is_refused(
    store: LocalObjectStore, codec: str
) -> None:
    head = bytearray(batches.plain([b"value"] * 50, 0, codec=codec)[: records.HEADER_SIZE])
    body = b"\x00garbage" * 20
    struct.pack_into(
        ">i", head, 8, records.HEADER_SIZE - records.LOG_OVERHEAD + len(body)
    )  # batch length
    put(store, "z.seg", bytes(head) + body)
    with pytest.raises(records.CorruptBatchError, match=r"z.seg.*(decompress|record)"):
        list(read_records(store, [whole(store, "z.seg", 0, 0, 50)], verify_crc=False))


def test_a_range_cut_inside_a_batch_is_refused(store: LocalObjectStore) -> None:
    raw = batches.plain([b"value"] * 3, 0)
    put(store, "cut.seg", raw + raw[:20])
    with pytest.raises(records.CorruptBatchError, match="truncated|stray|past the end"):
        list(read_records(store, [whole(store, "cut.seg", 0, 0, 3)]))
    with pytest.raises(records.CorruptBatchError, match="returned"):
        list(read_records(store, [SegmentRange("cut.seg", 0, len(raw) + 1000, 0, 0, 3)]))


def test_a_record_that_overruns_its_length_is_refused(store: LocalObjectStore) -> None:
    raw = bytearray(batches.plain([b"abc"], 0))
    raw[records.HEADER_SIZE] = 0x06  # record length 3 instead of the real one
    put(store, "r.seg", bytes(raw))
    with pytest.raises(records.CorruptBatchError, match=r"r.seg"):
        list(read_records(store, [whole(store, "r.seg", 0, 0, 1)], verify_crc=False))


def test_ranges_from_admin_and_from_dict() -> None:
    answer = {
        "topic": "t",
        "partition": 4,
        "start": 10,
        "end": 20,
        "ranges": [
            {
                "object_key": "segments/1.seg",
                "byte_start": 100,
                "byte_end": 200,
                "first_offset": 8,
                "end_offset": 20,
            },
        ],
    }
    (rng,) = segments.ranges_from_admin(answer)
    assert rng == SegmentRange("segments/1.seg", 100, 200, 4, 10, 20)
    assert (
        SegmentRange.from_dict(
            {
                "object_key": "segments/1.seg",
                "byte_start": "100",
                "byte_end": 200,
                "partition": 4,
                "start": 10,
                "end": 20,
            }
        )
        == rng
    )


def test_cached_store_is_one_per_config(tmp_path: Path) -> None:
    config = ObjectStoreConfig(url=str(tmp_path / "o"))
    assert segments.cached_store(config) is segments.cached_store(
        ObjectStoreConfig(url=str(tmp_path / "o"))
    )


def test_reading_through_s3_uses_ranged_gets(moto_s3: object, s3_bucket: str) -> None:
    from broker.storage.objectstore import open_object_store
    from tests.conftest import MotoS3

    assert isinstance(moto_s3, MotoS3)
    store = open_object_store(
        ObjectStoreConfig(
            url=f"s3://{s3_bucket}/prefix",
            endpoint_url=moto_s3.endpoint,
            region="us-east-1",
            access_key_id="testing",
            secret_access_key="testing",
        )
    )
    padding = b"\x00" * 1000  # other partitions' batches around ours
    parts = [
        batches.plain([f"s3-{o}".encode() for o in range(b, b + 4)], b, codec="zstd")
        for b in (0, 4)
    ]
    store.put("segments/x.seg", padding + b"".join(parts) + padding)
    rng = SegmentRange("segments/x.seg", len(padding), len(padding) + sum(map(len, parts)), 0, 1, 7)
    assert [v for _, v in values(store, [rng])] == [f"s3-{o}".encode() for o in range(1, 7)]  # type: ignore[arg-type]


header_names = st.text(min_size=0, max_size=5)
optional_bytes = st.none() | st.binary(max_size=300)


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            optional_bytes,
            optional_bytes,
            st.lists(st.tuples(header_names, optional_bytes), max_size=3),
        ),
        min_size=1,
        max_size=20,
    ),
    codec=st.sampled_from(list(CODECS)),
    base=st.integers(0, 2**40),
    window=st.tuples(st.integers(0, 25), st.integers(0, 25)),
)
def test_matches_the_brokers_decoder_on_arbitrary_records(
    tmp_path_factory: pytest.TempPathFactory,
    entries: list[batches.Entry],
    codec: str,
    base: int,
    window: tuple[int, int],
) -> None:
    store = LocalObjectStore(tmp_path_factory.mktemp("h"))
    raw = batches.batch(entries, base, codec=codec)
    store.put("h.seg", raw)
    lo, hi = base + min(window), base + max(window)
    got = list(read_records(store, [SegmentRange("h.seg", 0, len(raw), 0, lo, hi)]))
    _, reference = records.decode_batch(raw)
    want = [r for r in reference if lo <= r.offset < hi]
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == [
        (r.offset, r.timestamp, r.key, r.value, r.headers) for r in want
    ]


def test_control_batch_marker_type_is_read_from_its_key() -> None:
    raw = batches.control(0, 5, commit=False)
    header = records.read_header(raw)
    assert header.is_control and header.is_transactional
    assert segments._control_type(raw, 0, len(raw), header) == segments.CONTROL_ABORT
    raw = batches.control(0, 5, commit=True)
    assert (
        segments._control_type(raw, 0, len(raw), records.read_header(raw))
        == segments.CONTROL_COMMIT
    )
    assert struct.unpack(">hh", records.decode_batch(raw)[1][0].key or b"") == (0, 1)
