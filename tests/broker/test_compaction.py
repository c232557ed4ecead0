"""Compaction of small segment objects in cluster mode (broker/storage/compaction.py), on a real
Postgres and a real object-store directory, with in-process log stores as
``test_leases.py`` uses them: many small flushes are merged into one object and read back as
the very same batches (fetch by offset, the index view, the admin API's byte ranges); old
objects go only after ``file.delete.delay.ms`` (a reader holding the old chunks still reads);
and a compaction racing a lease move, DeleteRecords or retention changes nothing of theirs."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from broker.admin_http import ranges_for
from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.kafka import records
from broker.metrics import render_metrics
from broker.storage import index_view
from broker.storage.compaction import COMPACTED_SUFFIX, Compactor, Plan
from broker.storage.leases import Leases
from broker.storage.logstore import LogStore, PartitionLog
from broker.storage.metadata import Chunk
from broker.storage.objectstore import LocalObjectStore
from broker.storage.retention import Retention
from tests.broker.cluster_logs import lead, log_stores, no_tables
from tests.postgres import PostgresServer
from tests.postgres import postgres as postgres  # one server for the module

LEASE_MS = 60_000
DELAY_MS = 2500  # the topics' file.delete.delay.ms


@pytest.fixture
def uri(postgres: PostgresServer) -> str:
    return postgres.create_database(f"compact_{uuid.uuid4().hex[:8]}")


def _config(home: Path) -> BrokerConfig:
    # no timer flushes (each produce below is its own flush) and no compaction timer: the
    # test runs the passes
    return BrokerConfig(
        home=home,
        segment_flush_ms=600_000,
        segment_compaction_interval_ms=600_000,
        segment_compaction_min_age_ms=0,
        segment_compaction_target_bytes=1 << 20,
    )


async def _flushes(logs: LogStore, parts: list[PartitionLog], count: int) -> None:
    """``count`` flushes, each one batch of every partition (one small object each)."""
    now = int(time.time() * 1000)  # within retention.ms
    for i in range(count):
        await asyncio.gather(
            *(
                logs.append_and_wait(
                    part,
                    records.encode_batch(
                        [(b"k", b"%s-%d-%d" % (part.topic.encode(), part.partition, i))] * (i + 1),
                        now + i,
                    ),
                )
                for part in parts
            )
        )


async def _batches(logs: LogStore, part: PartitionLog) -> list[bytes]:
    """Every batch as a fetch from each offset gets it (one batch per read)."""
    out = []
    offset = part.log_start_offset
    while offset < part.high_watermark:
        data = await logs.read(part, offset, 1)
        [(header, batch)] = list(records.iter_batches(data))
        out.append(bytes(batch))
        offset = header.base_offset + header.last_offset_delta + 1
    return out


def _ranged(objects: LocalObjectStore, view: PartitionLog) -> bytes:
    """The partition's bytes as a commit round reads them: the admin API's byte ranges."""
    end = view.chunks[-1].end_offset
    return b"".join(
        objects.get_range(r.object_key, r.byte_start, r.byte_end)
        for r in ranges_for(view, view.log_start_offset, end)
    )


def _entries(chunks: list[Chunk]) -> list[tuple[int, int, int, int]]:
    """The batch index without positions: what a compaction must keep."""
    return [(r.base_offset, r.size, r.append_ms, r.max_timestamp) for c in chunks for r in c.refs]


def _segments(objects: LocalObjectStore) -> set[str]:
    return set(objects.list("segments/"))


def test_small_flushes_become_one_object_holding_the_same_batches(uri: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        objects = LocalObjectStore(tmp_path / "objects")
        config = _config(tmp_path / "a")
        async with log_stores(uri, objects, config) as [(meta, logs)]:
            meta.create_topic("t", 2, {"file.delete.delay.ms": str(DELAY_MS)})
            meta.create_topic("u", 1, {"file.delete.delay.ms": str(DELAY_MS)})
            leases = Leases(meta, 1, LEASE_MS)
            leases.register("a", {}, None)
            keys = [("t", 0), ("t", 1), ("u", 0)]
            parts = await lead(logs, leases, keys)
            await _flushes(logs, parts, 8)
            old_objects = _segments(objects)
            assert len(old_objects) == 8 and all(len(meta.chunks(t, p)) == 8 for t, p in keys)
            before = {(p.topic, p.partition): await _batches(logs, p) for p in parts}
            old_views = {k: index_view.partition_view(meta, *k) for k in keys}  # a reader's
            old_ranged = {k: _ranged(objects, v) for k, v in old_views.items()}

            cluster = Cluster(config, meta, logs)
            retention = Retention(cluster, logs, no_tables, 600_000)
            compactor = Compactor(config, cluster, logs, retention)
            compacted = await compactor.run_once()
            assert compacted == sum(len(b) for bs in before.values() for b in bs)
            [new_key] = _segments(objects) - old_objects
            assert new_key.endswith(COMPACTED_SUFFIX)
            for part in parts:  # one chunk each, in memory and in the index
                k = (part.topic, part.partition)
                assert [c.object_key for c in part.chunks] == [new_key]
                assert part.chunk_bases == [0]
                assert meta.chunks(*k) == part.chunks
                for key in old_objects:
                    logs.forget_cached(key)  # reads below go to the object store
                assert await _batches(logs, part) == before[k]
                view = index_view.partition_view(meta, *k)
                assert _entries(view.chunks) == _entries(old_views[k].chunks)
                assert _ranged(objects, view) == old_ranged[k] == b"".join(before[k])
                # a reader that looked the old chunks up before still reads them
                assert await _batches(logs, old_views[k]) == before[k]
            status = logs.compaction
            assert (status.passes, status.objects_written, status.chunks_compacted) == (1, 1, 24)
            assert (status.objects_released, status.bytes_compacted) == (8, compacted)
            text = render_metrics(cluster, logs, {}, int(time.time() * 1000))
            assert "icefall_compaction_chunks_total 24" in text
            assert "icefall_compaction_objects_released_total 8" in text
            assert await compactor.run_once() == 0  # a compacted object is not rewritten

            # a pass whose index commit went through but whose answer was lost (the
            # connection broke): the next pass finds the index's rows over the small chunks
            # its log still holds, and the log takes them
            await _flushes(logs, parts, 3)
            later = _segments(objects) - old_objects - {new_key}
            before = {(p.topic, p.partition): await _batches(logs, p) for p in parts}
            lost = compactor.plan()
            await compactor.write(lost)
            done, released, _ = meta.replace_chunks(
                [(r.chunks, r.merged) for r in lost.runs if r.merged], (1, dict(logs.epochs))
            )
            assert (done, set(released)) == ({0, 1, 2}, later)
            assert await compactor.run_once() == 0
            assert logs.compaction.runs_skipped == 3
            for part in parts:
                assert [c.object_key for c in part.chunks] == [new_key, lost.key]
                assert meta.chunks(part.topic, part.partition) == part.chunks
                assert await _batches(logs, part) == before[(part.topic, part.partition)]
            old_objects |= later
            kept = {new_key, lost.key}

            # the old objects go after file.delete.delay.ms, not before (nor by the sweep)
            assert set(retention.pending) == old_objects
            started = time.monotonic()
            assert all(due > started for due in retention.pending.values())
            await retention.run_once()
            assert _segments(objects) == old_objects | kept
            deadline = time.monotonic() + 30
            while _segments(objects) != kept:
                assert time.monotonic() < deadline, "old objects never deleted"
                await asyncio.sleep(0.2)
                await retention.run_once()
            assert time.monotonic() - started >= DELAY_MS / 1000 - 0.5
            for part in parts:
                assert await _batches(logs, part) == before[(part.topic, part.partition)]

    asyncio.run(scenario())


def test_a_compaction_racing_a_lease_move_delete_records_or_retention_leaves_them_be(
    uri: str, tmp_path: Path
) -> None:
    """A plans and writes a compaction of t-0..t-3; meanwhile t-0's lease moves to B, a
    DeleteRecords drops t-1's first chunks and retention t-2's. The commit replaces t-3's chunks
    only: the others keep what the race made of them, B reads t-0 as it was, and a pass whose
    every run was raced deletes its object at once (no index row ever named it)."""

    async def scenario() -> None:
        objects = LocalObjectStore(tmp_path / "objects")
        config = _config(tmp_path / "a")
        async with log_stores(uri, objects, config, _config(tmp_path / "b")) as [
            (meta_a, a),
            (meta_b, b),
        ]:
            meta_a.create_topic("t", 4, {})
            leases_a, leases_b = Leases(meta_a, 1, LEASE_MS), Leases(meta_b, 2, LEASE_MS)
            leases_a.register("a", {}, None)
            leases_b.register("b", {}, None)
            parts = await lead(a, leases_a, [("t", p) for p in range(4)])
            await _flushes(a, parts, 5)
            before = [await _batches(a, part) for part in parts]
            rows = [meta_a.chunks("t", p) for p in range(4)]
            cluster = Cluster(config, meta_a, a)
            retention = Retention(cluster, a, no_tables, 600_000)
            compactor = Compactor(config, cluster, a, retention)

            # every run raced: t-0 alone, its lease moved between the write and the commit
            plan = compactor.plan()
            only = Plan([r for r in plan.runs if r.part.partition == 0], delete_delay_ms=0)
            await compactor.write(only)
            assert only.key in _segments(objects)
            leases_a.release([("t", 0)])
            epoch = leases_b.acquire("t", 0)
            assert epoch == 2
            assert await compactor.commit(only) == 0
            assert only.key not in _segments(objects)
            assert meta_a.chunks("t", 0) == rows[0] and parts[0].chunks == rows[0]

            # t-0 (no longer A's), t-1 (DeleteRecords), t-2 (retention) raced; t-3 compacted
            plan = compactor.plan()
            assert [r.part.partition for r in plan.runs] == [0, 1, 2, 3]
            await compactor.write(plan)
            assert await a.delete_records(parts[1], 3) == 3  # batch i holds i + 1 records
            assert await a.drop_chunks(parts[2], 6) == []  # the objects hold other chunks
            compacted = await compactor.commit(plan)
            assert compacted == sum(len(x) for x in before[3])
            assert a.compaction.runs_skipped == 4 and a.compaction.chunks_compacted == 5
            assert meta_a.chunks("t", 0) == rows[0]
            assert meta_a.chunks("t", 1) == rows[1][2:] == parts[1].chunks
            assert meta_a.chunks("t", 2) == rows[2][3:] == parts[2].chunks
            assert meta_a.log_start_offsets() == {("t", 1): 3, ("t", 2): 6}
            assert [c.object_key for c in meta_a.chunks("t", 3)] == [plan.key]
            assert retention.pending == {}  # every old object still holds t-0's chunks
            # the index's own check: rows DeleteRecords or retention removed are not replaced
            for run in plan.runs[1:3]:
                assert run.merged is not None
                fence = (1, {("t", run.part.partition): run.epoch})
                assert meta_a.replace_chunks([(run.chunks, run.merged)], fence)[:2] == (set(), [])
            assert meta_a.chunks("t", 1) == parts[1].chunks
            assert await _batches(a, parts[1]) == before[1][2:]
            assert await _batches(a, parts[2]) == before[2][3:]
            assert await _batches(a, parts[3]) == before[3]
            b.set_lease_deadline(time.monotonic() + 600)
            moved = await b.load_partition("t", 0, epoch)
            assert await _batches(b, moved) == before[0]

            # the background loop compacts what the races left (t-0 is B's now), and stops
            compactor.interval = 0.05
            compactor.start()
            deadline = time.monotonic() + 30
            while any(len(meta_a.chunks("t", p)) > 1 for p in (1, 2)):
                assert time.monotonic() < deadline, "the loop never compacted t-1 and t-2"
                await asyncio.sleep(0.05)
            await compactor.close()
            assert compactor._task is not None and compactor._task.done()
            assert meta_a.chunks("t", 0) == rows[0]
            assert await _batches(a, parts[1]) == before[1][2:]
            assert await _batches(a, parts[2]) == before[2][3:]

    asyncio.run(scenario())
