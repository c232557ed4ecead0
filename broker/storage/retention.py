"""Segment retention: Kafka's ``retention.ms``/``retention.bytes``, held back by the table.

Every ``retention_check_interval_ms`` (Kafka's ``log.retention.check.interval.ms``)
the broker looks at each partition of each topic whose ``cleanup.policy``
includes ``delete`` and, as Kafka does, picks the oldest chunks to drop:

- by time: leading chunks whose largest timestamp (the producer's max
  timestamp; the broker append time for ``LogAppendTime`` topics, or when a
  batch carries none) is more than ``retention.ms`` old;
- by size: leading chunks that can go while the partition keeps at least
  ``retention.bytes`` (unflushed bytes count towards the size, as Kafka's active
  segment does).

The larger of the two prefixes wins; ``-1`` disables either. A chunk is the
unit (Kafka's is the segment file), so the log start moves to a chunk boundary.

A table topic never loses a record that is not in its table: only chunks that
end at or below the table's committed offset (the checkpoint in the snapshot
summary, ``broker.checkpoint``) may go. What retention wanted but could not
delete is kept, logged as a warning (once per partition every
``WARN_EVERY_S``) and counted in ``LogStore.retention`` (per partition
``blocked``, plus totals), which the admin API serves at ``GET /v1/retention``
and as Prometheus metrics (``icefall_retention_held_back_offsets`` etc.).

Deleting is crash-safe in two steps: one metadata transaction drops the chunk
rows and stores the new log start, then objects no chunk refers to any more are
deleted after the topic's ``file.delete.delay.ms`` (so a fetch that already
looked a chunk up can still read it). A crash in between leaves an orphan
object, never an index row pointing at a missing object; every pass also sweeps
``segments/`` for objects no chunk refers to and deletes them.

The catalog reads and object-store calls run in threads; the index changes run
on the event loop in one synchronous step, so no flush or fetch sees half of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker import contracts, names, topic_configs
from broker.checkpoint import Checkpoint

if TYPE_CHECKING:
    from broker.cluster import Cluster, Topic
    from broker.storage.logstore import LogStore, PartitionLog
    from broker.storage.metadata import Chunk

log = logging.getLogger(__name__)

SEGMENT_PREFIX = "segments/"
# Cluster mode: another broker's segment object is put before its index commit, and this
# broker's flush lock does not cover that gap, so the sweep leaves objects younger than this,
# by the object store's own clock (``ObjectStore.list_ages``: no two brokers' clocks are
# compared); a flush whose put-to-commit took more than half of it does not commit that object
# (``LogStore.flush`` writes the data again under a new key).
CLUSTER_ORPHAN_GRACE_MS = 10 * 60 * 1000
WARN_EVERY_S = 600.0

# (namespace, table name) -> the table's checkpoint; raises when the catalog cannot answer
CheckpointReader = Callable[[str, str], Checkpoint]


# ---------------------------------------------------------------- status


@dataclass
class Blocked:
    """A table topic partition whose retention waits for the table to commit."""

    log_start_offset: int
    wanted_log_start_offset: int  # where retention.ms/bytes would put the log start
    committed_offset: int  # the table's next offset for this partition
    bytes: int  # segment bytes kept only because the table has not committed them
    since_ms: int
    passes: int = 1

    def answer(self, topic: str, partition: int) -> contracts.RetentionBlocked:
        return contracts.RetentionBlocked(
            topic=topic,
            partition=partition,
            log_start_offset=self.log_start_offset,
            wanted_log_start_offset=self.wanted_log_start_offset,
            committed_offset=self.committed_offset,
            blocked_offsets=self.wanted_log_start_offset - self.log_start_offset,
            blocked_bytes=self.bytes,
            since_ms=self.since_ms,
            passes=self.passes,
        )


@dataclass
class RetentionStatus:
    """Counters since the broker started, and the partitions retention cannot trim now."""

    passes: int = 0
    chunks_deleted: int = 0
    bytes_deleted: int = 0
    objects_deleted: int = 0
    orphans_deleted: int = 0
    delete_failures: int = 0
    blocked_passes: int = 0  # partition-passes where the table held retention back
    last_pass_ms: int | None = None
    blocked: dict[tuple[str, int], Blocked] = field(default_factory=dict)

    def answer(self) -> contracts.Retention:
        """What ``GET /v1/retention`` serves."""
        return contracts.Retention(
            passes=self.passes,
            chunks_deleted=self.chunks_deleted,
            bytes_deleted=self.bytes_deleted,
            objects_deleted=self.objects_deleted,
            orphans_deleted=self.orphans_deleted,
            delete_failures=self.delete_failures,
            blocked_passes=self.blocked_passes,
            last_pass_ms=self.last_pass_ms,
            blocked=[b.answer(t, p) for (t, p), b in sorted(self.blocked.items())],
        )

    def to_json(self) -> dict[str, Any]:
        return self.answer().to_json()


# ---------------------------------------------------------------- policy (pure)


@dataclass(frozen=True)
class Policy:
    retention_ms: int  # -1: no time limit
    retention_bytes: int  # -1: no size limit
    log_append_time: bool
    table: tuple[str, str] | None  # (namespace, table) of a table topic
    file_delete_delay_ms: int

    @classmethod
    def of(cls, topic: Topic) -> Policy | None:
        """The topic's retention settings, or None when nothing may be deleted by age or size."""
        if "delete" not in topic.config("cleanup.policy").split(","):
            return None  # compacted only (e.g. _schemas): retention does not apply
        policy = cls(
            int(topic.config("retention.ms")),
            int(topic.config("retention.bytes")),
            topic.config("message.timestamp.type") == "LogAppendTime",
            (
                (topic_configs.TableSettings(topic.configs).namespace, names.table_name(topic.name))
                if topic_configs.is_table_topic(topic.configs)
                else None
            ),
            int(topic.config("file.delete.delay.ms")),
        )
        return policy if policy.retention_ms >= 0 or policy.retention_bytes >= 0 else None


def chunk_timestamp(chunk: Chunk, log_append_time: bool) -> int:
    """The chunk's largest timestamp, which Kafka compares with retention.ms."""
    if log_append_time:
        return chunk.max_append_ms
    largest = max((ref.max_timestamp for ref in chunk.refs), default=-1)
    return largest if largest >= 0 else chunk.max_append_ms


def chunk_bytes(chunk: Chunk) -> int:
    return chunk.byte_end - chunk.byte_start


def expired_chunks(
    chunks: Sequence[Chunk], unflushed_bytes: int, policy: Policy, now_ms: int
) -> int:
    """How many leading chunks retention.ms or retention.bytes asks to delete."""
    by_time = 0
    if policy.retention_ms >= 0:
        for chunk in chunks:
            if now_ms - chunk_timestamp(chunk, policy.log_append_time) <= policy.retention_ms:
                break
            by_time += 1
    by_size = 0
    if policy.retention_bytes >= 0:
        excess = sum(chunk_bytes(c) for c in chunks) + unflushed_bytes - policy.retention_bytes
        for chunk in chunks:
            if excess - chunk_bytes(chunk) < 0:
                break
            excess -= chunk_bytes(chunk)
            by_size += 1
    return max(by_time, by_size)


def committed_chunks(chunks: Sequence[Chunk], count: int, committed: int) -> int:
    """Of the first ``count`` chunks, how many lie wholly below the committed offset."""
    allowed = 0
    while allowed < count and chunks[allowed].end_offset <= committed:
        allowed += 1
    return allowed


def committed_offsets(checkpoint: Checkpoint, topic_id: str) -> dict[int, int]:
    """The table's offsets, if they belong to this topic (``Checkpoint.offsets_for``)."""
    return checkpoint.offsets_for(topic_id)


# ---------------------------------------------------------------- the periodic task


@dataclass
class _Candidate:
    topic: Topic
    part: PartitionLog
    policy: Policy
    chunks: list[Chunk]  # the partition's first ``count`` chunks when the pass looked
    count: int  # leading chunks retention wants gone


class Retention:
    """Runs a retention pass every ``interval_ms`` until closed."""

    def __init__(
        self, cluster: Cluster, logs: LogStore, checkpoints: CheckpointReader, interval_ms: int
    ) -> None:
        self.cluster = cluster
        self.logs = logs
        self.checkpoints = checkpoints
        self.interval = interval_ms / 1000
        self.status: RetentionStatus = logs.retention
        self.pending: dict[str, float] = {}  # object key -> monotonic time it may be deleted
        self._warned: dict[tuple[str, int], float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="segment-retention")

    async def close(self) -> None:
        """Stop between steps: cancellation can only land on an await, and every
        index change is one synchronous step, so a stop leaves at most orphans."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.run_once()
            except Exception:
                log.exception("segment retention pass failed; retrying in %.1fs", self.interval)

    async def run_once(self) -> None:
        """One pass: trim every partition, delete due objects, sweep orphans."""
        now_ms = int(time.time() * 1000)
        candidates = self._candidates(now_ms)
        committed = await self._committed(
            {c.topic.name: c for c in candidates if c.policy.table}.values()
        )
        for candidate in candidates:
            await self._trim(candidate, committed.get(candidate.topic.name), now_ms)
        self._take_released()
        await self._delete_due()
        await self._sweep_orphans()
        self.status.passes += 1
        self.status.last_pass_ms = now_ms

    def _candidates(self, now_ms: int) -> list[_Candidate]:
        out = []
        seen = set()
        for topic in list(self.cluster.topics.values()):
            policy = Policy.of(topic)
            for p in range(topic.partitions):
                seen.add((topic.name, p))
                part = self.logs.partitions.get((topic.name, p))
                if policy is None or part is None:
                    continue
                unflushed = sum(len(b.data) for b in part.tail)
                count = expired_chunks(part.chunks, unflushed, policy, now_ms)
                if count:  # a copy of the prefix: the pass awaits before it trims
                    out.append(_Candidate(topic, part, policy, part.chunks[:count], count))
                else:
                    self.status.blocked.pop((topic.name, p), None)
        for key in [k for k in self.status.blocked if k not in seen]:  # deleted topics
            del self.status.blocked[key]
            self._warned.pop(key, None)
        return out

    async def _committed(
        self, candidates: Iterable[_Candidate]
    ) -> dict[str, dict[int, int] | None]:
        """Each table topic's committed offsets (None when the catalog could not say:
        then nothing of that topic is deleted)."""
        out: dict[str, dict[int, int] | None] = {}
        for candidate in candidates:
            assert candidate.policy.table is not None
            namespace, table = candidate.policy.table
            try:
                checkpoint = await asyncio.to_thread(self.checkpoints, namespace, table)
            except Exception as exc:  # noqa: BLE001 - any catalog failure means: keep everything
                log.error(
                    "retention of table topic %s skipped: cannot read the checkpoint of %s.%s: %s",
                    candidate.topic.name,
                    namespace,
                    table,
                    exc,
                )
                out[candidate.topic.name] = None
                continue
            out[candidate.topic.name] = committed_offsets(checkpoint, str(candidate.topic.topic_id))
        return out

    async def _trim(
        self, candidate: _Candidate, committed: dict[int, int] | None, now_ms: int
    ) -> None:
        part, chunks, count = candidate.part, candidate.chunks, candidate.count
        key = (part.topic, part.partition)
        if self.logs.partitions.get(key) is not part:
            return  # the topic was deleted (or deleted and created again) meanwhile
        allowed = count
        if candidate.policy.table is not None:
            if committed is None:
                return
            allowed = committed_chunks(chunks, count, committed.get(part.partition, 0))
            if allowed < count:
                self._blocked(candidate, allowed, committed.get(part.partition, 0), now_ms)
            else:
                self.status.blocked.pop(key, None)
        if allowed == 0:
            return
        if not part.chunks or part.chunks[0] is not chunks[0]:
            return  # DeleteRecords moved the log start meanwhile: the next pass looks again
        end = chunks[allowed - 1].end_offset
        keys = await self.logs.drop_chunks(part, end)
        self.status.chunks_deleted += allowed
        self.status.bytes_deleted += sum(chunk_bytes(c) for c in chunks[:allowed])
        due = time.monotonic() + candidate.policy.file_delete_delay_ms / 1000
        for object_key in keys:
            self.pending[object_key] = min(self.pending.get(object_key, due), due)
        log.info(
            "retention: %s-%d now starts at offset %d (%d chunks dropped, %d objects to delete)",
            part.topic,
            part.partition,
            end,
            allowed,
            len(keys),
        )

    def _blocked(self, candidate: _Candidate, allowed: int, committed: int, now_ms: int) -> None:
        part, chunks = candidate.part, candidate.chunks
        key = (part.topic, part.partition)
        start = chunks[allowed - 1].end_offset if allowed else part.log_start_offset
        wanted = chunks[candidate.count - 1].end_offset
        kept = sum(chunk_bytes(c) for c in chunks[allowed : candidate.count])
        previous = self.status.blocked.get(key)
        self.status.blocked[key] = Blocked(
            start,
            wanted,
            committed,
            kept,
            previous.since_ms if previous else now_ms,
            previous.passes + 1 if previous else 1,
        )
        self.status.blocked_passes += 1
        last = self._warned.get(key)
        if last is None or time.monotonic() - last >= WARN_EVERY_S:
            self._warned[key] = time.monotonic()
            log.warning(
                "retention of table topic %s-%d is held back: offsets %d-%d (%d bytes) are past retention.ms/"
                "retention.bytes but the table has committed only up to offset %d; they stay until a commit round "
                "takes them",
                part.topic,
                part.partition,
                start,
                wanted,
                kept,
                committed,
            )

    async def _delete_due(self) -> None:
        now = time.monotonic()
        due = [key for key, when in self.pending.items() if when <= now]
        for key in due:
            if await self._delete(key):
                del self.pending[key]
                self.status.objects_deleted += 1

    def defer_delete(self, keys: Iterable[str], delay_ms: int) -> None:
        """Delete these objects (no chunk refers to them any more) on the first pass at least
        ``delay_ms`` from now: compaction's old objects (``broker/storage/compaction.py``)."""
        due = time.monotonic() + delay_ms / 1000
        for key in keys:
            self.pending[key] = min(self.pending.get(key, due), due)

    def _take_released(self) -> None:
        """The objects DeleteRecords left without a chunk, deleted after ``file.delete.delay.ms``
        (the default's: a fetch that looked a chunk up may still read them)."""
        delay_ms = int(topic_configs.KEYS["file.delete.delay.ms"].default or 0)
        due = time.monotonic() + delay_ms / 1000
        while self.logs.released_objects:
            key = self.logs.released_objects.pop()
            self.pending[key] = min(self.pending.get(key, due), due)

    async def _sweep_orphans(self) -> None:
        """Delete segment objects no chunk refers to: left by a crash between a retention
        commit and its deletes, or by a flush whose index write failed after its put."""
        if self.logs.cluster:
            ages = await asyncio.to_thread(self.logs.store.list_ages, SEGMENT_PREFIX)
            grace_s = CLUSTER_ORPHAN_GRACE_MS / 1000
            listed = sorted(k for k, age in ages.items() if age > grace_s)
        else:
            listed = await asyncio.to_thread(self.logs.store.list, SEGMENT_PREFIX)
        unreferenced = await self.logs.unreferenced_objects(listed)
        released = set(self.logs.released_objects)  # DeleteRecords' since _take_released
        orphans = [k for k in unreferenced if k not in self.pending and k not in released]
        for key in orphans:
            if await self._delete(key):
                self.status.orphans_deleted += 1
                log.info("retention: deleted orphaned segment object %s", key)

    async def _delete(self, key: str) -> bool:
        self.logs.forget_cached(key)
        try:
            await asyncio.to_thread(self.logs.store.delete, key)
        except Exception as exc:  # noqa: BLE001 - a leftover object costs space, not correctness; retried
            self.status.delete_failures += 1
            log.warning(
                "retention: could not delete segment object %s (retrying next pass): %s", key, exc
            )
            return False
        return True
