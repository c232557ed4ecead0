"""Compaction of small segment objects (cluster mode).

In cluster mode every group-committed flush writes one small segment object (acks wait for
it), so a busy broker writes many objects a second, and every later reader (a new leader's
fetches, the index views of the admin API and the registry, the Spark rounds' byte ranges)
reads many tiny objects while Postgres holds a chunk row per partition per flush. Like
WarpStream's and AutoMQ's compaction, the leader of a partition merges runs of its small
consecutive chunks into one new segment object, in the background.

One pass: of every partition this broker leads, runs of consecutive chunks (each one's
offsets ending where the next begins) that are older than ``segment.compaction.min.age.ms``
and live in flush objects (a compacted object is never rewritten: each byte is compacted at
most once), up to ``segment.compaction.target.bytes`` in all, are copied byte for byte into one
new object (several partitions' runs, as a flush writes them). Offsets, batch bytes, append
times and timestamps stay exactly as they were: only the chunk rows change, one merged row per
run, whose batch index lists the same batches at their new positions. Then ONE Postgres
transaction (``replace_chunks``) checks the lease fence as a flush's index commit does and
replaces exactly the run's rows, only if they are all still there unchanged: a run that
retention, DeleteRecords or a new leader changed meanwhile is skipped (its copy is garbage
in the new object). The in-memory log swaps the chunks under the index lock, which retention,
DeleteRecords and the flush also take, so they never see half of it. A commit that went through
though its answer was lost is found by the next pass (rows other than the log's, the lease
still held at that epoch): the log then takes the index's rows (``_resync``).

An old object is deleted only once no chunk row refers to it (a flush object usually holds
other partitions' chunks too), and then only after ``file.delete.delay.ms`` (the largest of
the topics'), through segment retention's deferred deletion: a reader that looked the old
chunk up just before (a fetch, a commit round's executor with its byte ranges) still finds it.
Another broker's orphan sweep deletes unreferenced objects older than
``CLUSTER_ORPHAN_GRACE_MS`` at once, so only objects young enough to outlive the delay within
that grace are compacted (``eligible_since_ms``); older small chunks stay as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker import topic_configs
from broker.kafka import records
from broker.storage.metadata import BatchRef, Chunk, pack_batch_index
from broker.storage.retention import CLUSTER_ORPHAN_GRACE_MS, SEGMENT_PREFIX

if TYPE_CHECKING:
    from broker.cluster import Cluster
    from broker.config import BrokerConfig
    from broker.storage.logstore import LogStore, PartitionLog
    from broker.storage.retention import Retention

log = logging.getLogger(__name__)


def segment_written_ms(key: str) -> int:
    """When a segment object was written, by its writer's clock, from its key
    (``segments/<ms>-<id>.seg``, see ``LogStore.flush``); 0 for a key not in that form. Only an
    estimate of its age: the orphan sweep ages objects by the store's own clock, and this only
    keeps compaction to objects young enough for readers holding old chunk lists."""
    stamp = key.removeprefix(SEGMENT_PREFIX).split("-", 1)[0]
    return int(stamp) if stamp.isdigit() else 0


COMPACTED_SUFFIX = ".compacted.seg"
# Room left between the deferred delete of an object compaction unreferenced and the orphan
# sweep's grace (the sweep goes by the object's write time, by the writer's clock).
GRACE_MARGIN_MS = 60_000


@dataclass
class CompactionStatus:
    """Counters since the broker started (``/metrics``, ``icefall_compaction_*``)."""

    passes: int = 0
    objects_written: int = 0  # compacted segment objects
    objects_released: int = 0  # old objects no chunk refers to any more (deleted after the delay)
    chunks_compacted: int = 0  # chunk rows merged away into compacted ones
    bytes_compacted: int = 0  # batch bytes copied into compacted objects
    runs_skipped: int = 0  # runs retention, DeleteRecords or a lost lease changed meanwhile
    failures: int = 0


@dataclass
class Run:
    """Consecutive chunks of one partition to merge, and the merged chunk once written."""

    part: PartitionLog
    epoch: int
    chunks: list[Chunk]
    merged: Chunk | None = None

    @property
    def size(self) -> int:
        return sum(c.byte_end - c.byte_start for c in self.chunks)


@dataclass
class Plan:
    runs: list[Run] = field(default_factory=list)
    key: str = ""  # the compacted object, once written
    delete_delay_ms: int = 0

    @property
    def size(self) -> int:
        return sum(r.size for r in self.runs)


def eligible_since_ms(now_ms: int, delete_delay_ms: int) -> int:
    """Objects written before this are not compacted: unreferenced now, they could reach the
    orphan sweep's grace before their deferred delete is due, and another broker's sweep
    would delete them under a reader."""
    return now_ms - (CLUSTER_ORPHAN_GRACE_MS - delete_delay_ms - GRACE_MARGIN_MS)


def find_runs(
    chunks: Sequence[Chunk], target_bytes: int, newest_append_ms: int, written_since_ms: int
) -> list[list[Chunk]]:
    """Runs of at least two consecutive compactable chunks, each run at most ``target_bytes``.
    A chunk is compactable when it is in a flush object written at or after
    ``written_since_ms``, all its batches were appended at or before ``newest_append_ms``,
    and it is smaller than the target."""
    runs: list[list[Chunk]] = []
    run: list[Chunk] = []
    size = 0
    for chunk in chunks:
        if chunk.max_append_ms > newest_append_ms:
            break  # the rest is newer still
        chunk_size = chunk.byte_end - chunk.byte_start
        fits = (
            not chunk.object_key.endswith(COMPACTED_SUFFIX)
            and segment_written_ms(chunk.object_key) >= written_since_ms
            and chunk_size < target_bytes
        )
        follows = bool(run) and run[-1].end_offset == chunk.base_offset
        if fits and follows and size + chunk_size <= target_bytes:
            run.append(chunk)
            size += chunk_size
            continue
        if len(run) > 1:
            runs.append(run)
        run, size = ([chunk], chunk_size) if fits else ([], 0)
    if len(run) > 1:
        runs.append(run)
    return runs


def merge(run: Sequence[Chunk], blobs: Sequence[bytes], key: str, position: int) -> Chunk:
    """The chunk holding ``run``'s batches, their bytes (``blobs``, one per chunk) at
    ``position`` of object ``key``: the same offsets, sizes, append times and timestamps.
    Each batch's bytes are checked against its index entry (base offset and size), so a
    chunk row that does not describe its bytes is never copied into a new one."""
    refs: list[BatchRef] = []
    shift = 0
    for chunk, blob in zip(run, blobs, strict=True):
        if len(blob) != chunk.byte_end - chunk.byte_start:
            raise ValueError(f"{chunk.object_key}: short read of {chunk.topic}-{chunk.partition}")
        for ref in chunk.refs:
            header = records.read_header(blob[ref.position : ref.position + ref.size])
            if header.base_offset != ref.base_offset or header.size != ref.size:
                raise ValueError(
                    f"{chunk.object_key}: the batch at offset {ref.base_offset} of "
                    f"{chunk.topic}-{chunk.partition} is not where the index says"
                )
            refs.append(
                BatchRef(
                    ref.base_offset,
                    shift + ref.position,
                    ref.size,
                    ref.append_ms,
                    ref.max_timestamp,
                )
            )
        shift += len(blob)
    first, last = run[0], run[-1]
    return Chunk(
        first.topic,
        first.partition,
        first.base_offset,
        last.end_offset,
        key,
        position,
        position + shift,
        min(c.min_append_ms for c in run),
        max(c.max_append_ms for c in run),
        pack_batch_index(refs),
    )


class Compactor:
    """Runs a compaction pass every ``segment.compaction.interval.ms`` until closed (cluster
    mode only: the SQLite broker's flush already writes big segments)."""

    def __init__(
        self, config: BrokerConfig, cluster: Cluster, logs: LogStore, retention: Retention
    ) -> None:
        assert logs.node_id is not None, "compaction is for cluster mode"
        self.node_id = logs.node_id
        self.cluster = cluster
        self.logs = logs
        self.retention = retention
        self.interval = config.segment_compaction_interval_ms / 1000
        self.target_bytes = config.segment_compaction_target_bytes
        self.min_age_ms = config.segment_compaction_min_age_ms
        self.status: CompactionStatus = logs.compaction
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="segment-compaction")

    async def close(self) -> None:
        """Stop after the pass in progress, if any: never cancelled, since a pass cut off
        between its index commit (in a thread, which would go on) and the swap in memory
        would leave this broker reading chunks the index no longer has."""
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)
            if self._stop.is_set():
                return
            try:
                while await self.run_once() >= self.target_bytes and not self._stop.is_set():
                    pass  # a full pass: more may wait
            except Exception as exc:  # e.g. Postgres or the object store away: retried
                self.status.failures += 1
                log.error(
                    "segment compaction pass failed, retrying in %.1fs (nothing half-done is "
                    "visible; a compacted object it wrote is left to the orphan sweep): %s",
                    self.interval,
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )

    async def run_once(self) -> int:
        """One pass: plan, write the compacted object, commit. Returns the bytes compacted."""
        plan = self.plan()
        if not plan.runs:
            self.status.passes += 1
            return 0
        await self.write(plan)
        return await self.commit(plan)

    def delete_delay_ms(self) -> int:
        """How long an unreferenced old object stays: the largest ``file.delete.delay.ms`` of
        the topics (an object holds chunks of any of them)."""
        default = int(topic_configs.KEYS["file.delete.delay.ms"].default or 0)
        delays = [int(t.config("file.delete.delay.ms")) for t in self.cluster.topics.values()]
        return max(delays, default=default)

    def plan(self) -> Plan:
        """The runs of this pass, at most ``target_bytes`` in all (synchronous: one state)."""
        now_ms = int(time.time() * 1000)
        plan = Plan(delete_delay_ms=self.delete_delay_ms())
        since = eligible_since_ms(now_ms, plan.delete_delay_ms)
        for key, part in sorted(self.logs.partitions.items()):
            epoch = self.logs.epochs.get(key)
            if epoch is None:
                continue
            for chunks in find_runs(
                part.chunks, self.target_bytes, now_ms - self.min_age_ms, since
            ):
                run = Run(part, epoch, chunks)
                if plan.runs and plan.size + run.size > self.target_bytes:
                    return plan
                plan.runs.append(run)
        return plan

    async def write(self, plan: Plan) -> None:
        """Read the runs' bytes (one ranged GET per old object) and put the compacted object."""
        plan.key = (
            f"{SEGMENT_PREFIX}{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:12]}"
            f"{COMPACTED_SUFFIX}"
        )
        blobs = await asyncio.to_thread(self._read, plan)
        parts: list[bytes] = []
        position = 0
        for run in plan.runs:
            run_blobs = [blobs[id(c)] for c in run.chunks]
            run.merged = merge(run.chunks, run_blobs, plan.key, position)
            parts.extend(run_blobs)
            position = run.merged.byte_end
        await asyncio.to_thread(self.logs.store.put, plan.key, b"".join(parts))
        self.status.objects_written += 1

    def _read(self, plan: Plan) -> dict[int, bytes]:
        spans: dict[str, tuple[int, int]] = {}
        for run in plan.runs:
            for c in run.chunks:
                lo, hi = spans.get(c.object_key, (c.byte_start, c.byte_end))
                spans[c.object_key] = (min(lo, c.byte_start), max(hi, c.byte_end))
        data = {
            key: (lo, self.logs.store.get_range(key, lo, hi)) for key, (lo, hi) in spans.items()
        }
        out: dict[int, bytes] = {}
        for run in plan.runs:
            for c in run.chunks:
                lo, blob = data[c.object_key]
                out[id(c)] = blob[c.byte_start - lo : c.byte_end - lo]
        return out

    async def commit(self, plan: Plan) -> int:
        """Replace the runs' chunk rows (fenced, each only if unchanged) and then the chunks in
        memory, under the index lock; hand the old objects no chunk refers to any more to
        retention's deferred deletion. Returns the bytes compacted."""
        async with self.logs.index_lock:
            runs = [r for r in plan.runs if r.merged is not None and self._unchanged(r)]
            replaced, released, found = await asyncio.to_thread(
                self.logs.metadata.replace_chunks,
                [(r.chunks, r.merged) for r in runs if r.merged is not None],
                (self.node_id, {(r.part.topic, r.part.partition): r.epoch for r in runs}),
            )
            done = [r for i, r in enumerate(runs) if i in replaced]
            for run in done:  # the lock held since _unchanged: they are all still there
                assert run.merged is not None
                part = run.part
                i = next(i for i, c in enumerate(part.chunks) if c is run.chunks[0])
                part.chunks[i : i + len(run.chunks)] = [run.merged]
                part.chunk_bases[i : i + len(run.chunks)] = [run.merged.base_offset]
            for i, rows in found.items():
                if not self._resync(runs[i], rows):  # its old objects are still read here
                    stale = {c.object_key for c in runs[i].chunks}
                    released = [k for k in released if k not in stale]
        skipped = len(plan.runs) - len(done)
        self.status.passes += 1
        self.status.runs_skipped += skipped
        self.status.chunks_compacted += sum(len(r.chunks) for r in done)
        compacted = sum(r.size for r in done)
        self.status.bytes_compacted += compacted
        self.status.objects_released += len(released)
        if not done:  # never indexed: no reader can know it
            await asyncio.to_thread(self.logs.store.delete, plan.key)
        self.retention.defer_delete(released, plan.delete_delay_ms)
        if done or skipped:
            log.info(
                "compaction: %d chunks of %d partitions into %s (%d bytes), %d runs skipped "
                "(changed meanwhile), %d old objects to delete",
                sum(len(r.chunks) for r in done),
                len({(r.part.topic, r.part.partition) for r in done}),
                plan.key,
                compacted,
                skipped,
                len(released),
            )
        return compacted

    def _resync(self, run: Run, rows: list[Chunk]) -> bool:
        """The index holds other rows over the offsets of a run of a partition this broker
        still leads at that epoch, while its log in memory held the run unchanged: only this
        broker changes them, so an earlier commit of its own went through though its answer was
        lost (the connection broke). The log takes the index's rows, else it would go on
        reading objects the index no longer refers to (deleted after the delay)."""
        first, last = run.chunks[0], run.chunks[-1]
        contiguous = all(a.end_offset == b.base_offset for a, b in itertools.pairwise(rows))
        if not (
            rows
            and contiguous
            and rows[0].base_offset == first.base_offset
            and rows[-1].end_offset == last.end_offset
        ):
            log.warning(
                "compaction: %s-%d offsets %d-%d differ in the index and in memory; left as "
                "they are",
                first.topic,
                first.partition,
                first.base_offset,
                last.end_offset,
            )
            return False
        part = run.part
        i = next(i for i, c in enumerate(part.chunks) if c is first)
        part.chunks[i : i + len(run.chunks)] = rows
        part.chunk_bases[i : i + len(run.chunks)] = [c.base_offset for c in rows]
        log.warning(
            "compaction: %s-%d offsets %d-%d were compacted by an earlier commit whose answer "
            "was lost; the log now reads what the index holds",
            first.topic,
            first.partition,
            first.base_offset,
            last.end_offset,
        )
        return True

    def _unchanged(self, run: Run) -> bool:
        """The run's partition is still led at the run's epoch and holds its chunks, in a row."""
        key = (run.part.topic, run.part.partition)
        part = run.part
        if self.logs.partitions.get(key) is not part or self.logs.epochs.get(key) != run.epoch:
            return False
        for i, chunk in enumerate(part.chunks):
            if chunk is run.chunks[0]:
                window = part.chunks[i : i + len(run.chunks)]
                return len(window) == len(run.chunks) and all(
                    a is b for a, b in zip(window, run.chunks, strict=True)
                )
        return False
