"""The Fetch read path without a server: segment objects read in blocks (each block once, the
next one read ahead), records handed to the response as uncopied slices, and a fetch that
found nothing not missing data that arrived while it read."""

from __future__ import annotations

import asyncio
import mmap
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.kafka import codec, records
from broker.storage import logstore, objectstore
from broker.storage.logstore import LogStore
from broker.storage.metadata import MetadataStore
from broker.storage.objectstore import LocalObjectStore

BLOCK = 64 * 1024  # small blocks, so a few hundred KiB of segments cross many boundaries


@asynccontextmanager
async def _log_store(home: Path) -> AsyncIterator[LogStore]:
    """A log store (no timer flushes) holding topic t of two partitions, closed after."""
    config = BrokerConfig(home=home, segment_flush_ms=600_000)
    logs = LogStore(config, MetadataStore(config.metadata_db), LocalObjectStore(home / "objects"))
    await logs.open({"t": 2})
    try:
        yield logs
    finally:
        await logs.close()


async def _fill(logs: LogStore, segments: int, batches: int) -> dict[int, list[bytes]]:
    """``segments`` flushes of ``batches`` batches (10 records of 4000 B) into each partition
    of topic t; the values written, per partition."""
    written: dict[int, list[bytes]] = {0: [], 1: []}
    for _ in range(segments):
        for p in written:
            for _ in range(batches):
                values = [os.urandom(4000) for _ in range(10)]
                _, seq = await logs.append(
                    logs.partitions[("t", p)],
                    records.encode_batch([(None, v) for v in values], 1),
                    1 << 20,
                )
                await asyncio.wait_for(logs.wal.wait_durable(seq), 10)
                written[p].extend(values)
        await logs.flush()
    return written


def _forget_blocks(logs: LogStore) -> None:
    for key in {k for k, _ in logs._object_cache}:
        logs.forget_cached(key)


@pytest.mark.parametrize("mapped", [False, True], ids=["read", "mapped"])
def test_a_log_read_through_comes_from_blocks_each_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mapped: bool
) -> None:
    monkeypatch.setattr(logstore, "BLOCK_BYTES", BLOCK)
    # the local store maps blocks of MMAP_MIN_BYTES and more (8 MiB ones in the broker)
    monkeypatch.setattr(objectstore, "MMAP_MIN_BYTES", 4096 if mapped else 1 << 30)

    async def run() -> None:
        async with _log_store(tmp_path) as logs:
            written = await _fill(logs, segments=3, batches=5)
            _forget_blocks(logs)  # every byte read below comes from the object store
            for p, values in written.items():
                part = logs.partitions[("t", p)]
                assert part.flushed_offset == part.high_watermark == len(values)
                offset, got = 0, list[bytes | None]()
                while offset < part.high_watermark:
                    pieces = await logs.read_pieces(part, offset, 100_000)
                    assert all(isinstance(x, memoryview) for x in pieces)  # slices, no copies
                    data = b"".join(pieces)
                    assert 0 < len(data) <= 100_000
                    for header, batch in records.iter_batches(data):
                        assert header.base_offset == offset
                        got.extend(r.value for r in records.decode_batch(batch)[1])
                        offset = header.base_offset + header.last_offset_delta + 1
                    # the partition's next read finds its block cached or on its way
                    if offset < part.high_watermark:
                        chunk = next(c for c in part.chunks if c.end_offset > offset)
                        at = chunk.byte_start + next(
                            r.position for r in chunk.refs if r.base_offset == offset
                        )
                        ahead = (chunk.object_key, at // BLOCK)
                        assert ahead in logs._object_cache or ahead in logs._block_reads
                assert got == values
            await asyncio.gather(*logs._block_reads.values())
            blocks = list(logs._object_cache.values())
            assert blocks and all(
                (isinstance(b, memoryview) and isinstance(b.obj, mmap.mmap)) == mapped
                for b in blocks
                if len(b) >= 4096
            )
            sizes = [p.stat().st_size for p in (tmp_path / "objects").rglob("*.seg")]
            assert len(sizes) == 3
            # both partitions' chunks share blocks, read ahead or not: each block read once
            assert logs.block_reads == sum(-(-size // BLOCK) for size in sizes)
            # the joined read (internal topics use it) gives the same bytes
            part = logs.partitions[("t", 0)]
            assert await logs.read(part, 0, 100_000) == b"".join(
                await logs.read_pieces(part, 0, 100_000)
            )

    asyncio.run(run())


@pytest.mark.parametrize("mapped", [False, True], ids=["read", "mapped"])
def test_a_segment_object_shorter_than_its_index_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mapped: bool
) -> None:
    monkeypatch.setattr(logstore, "BLOCK_BYTES", BLOCK)
    monkeypatch.setattr(objectstore, "MMAP_MIN_BYTES", 4096 if mapped else 1 << 30)

    async def run() -> None:
        async with _log_store(tmp_path) as logs:
            await _fill(logs, segments=1, batches=3)
            _forget_blocks(logs)
            (segment,) = (tmp_path / "objects").rglob("*.seg")
            os.truncate(segment, segment.stat().st_size - 100)
            with pytest.raises(OSError, match="before the indexed range"):
                await logs.read_pieces(logs.partitions[("t", 1)], 0, 1 << 20)

    asyncio.run(run())


def test_data_that_arrived_during_the_reads_ends_the_wait_at_once(tmp_path: Path) -> None:
    async def run() -> None:
        async with _log_store(tmp_path) as logs:
            seen = logs.data_generation  # a fetch notes it, then reads ...
            await _fill(logs, segments=1, batches=1)  # ... while data arrives
            await asyncio.wait_for(logs.wait_for_data(60, since=seen), 10)

    asyncio.run(run())


@pytest.mark.parametrize("version", [4, 11, 12])
def test_spliced_records_encode_as_the_joined_bytes(version: int) -> None:
    batch = records.encode_batch([(b"k", b"v" * 300)], 1)
    pieces: list[codec.Buffer] = [memoryview(batch)[:100], bytearray(batch[100:]), batch]

    def fetch_response(data: object) -> object:
        R = codec.Responder(1, version)
        partition = {
            "partition_index": 0,
            "error_code": 0,
            "high_watermark": 2,
            "last_stable_offset": 2,
            "log_start_offset": 0,
            "aborted_transactions": None,
            "preferred_read_replica": -1,
            "records": data,
        }
        return R(error_code=0, session_id=0, responses=[{"topic": "t", "partitions": [partition]}])

    joined = codec.encode_response(7, fetch_response(b"".join(pieces)))
    parts = codec.encode_response_parts(7, fetch_response(codec.Spliced(pieces)))
    assert all(a is b for a, b in zip(parts[1:4], pieces, strict=True))  # by reference
    assert b"".join(parts) == joined
