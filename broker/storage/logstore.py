"""Partition logs over the WAL and the object store.

A batch is accepted into a partition's in-memory tail (its base offset
rewritten), appended to the WAL, and becomes visible to consumers once the
WAL has fsync'd it (the high watermark). Every ``segment_flush_ms`` or
``segment_flush_bytes`` the tails of all partitions go into one segment object
and the segment index; the closed WAL files are then deleted.

Cluster mode (``node_id`` given: Postgres metadata, issue 16) has no WAL: a batch is
acknowledged, and visible, once a flush has put it in a segment object and committed its
chunk to the index (``broker/storage/acks.py``); flushes are group commits that start as soon
as a producer waits. This broker holds only the partitions it leads (``load_partition``, at
the lease's epoch) and every index commit is fenced by those epochs: a partition whose lease
was lost is unloaded and its waiting producers get NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from broker.config import BrokerConfig
from broker.kafka import records
from broker.storage.acks import IndexAcks
from broker.storage.compaction import CompactionStatus
from broker.storage.metadata import (
    BatchRef,
    Chunk,
    FencedError,
    MetadataStore,
    pack_batch_index,
)
from broker.storage.objectstore import ObjectStore
from broker.storage.retention import CLUSTER_ORPHAN_GRACE_MS, RetentionStatus
from broker.storage.wal import WalEntry, WriteAheadLog, read_entries

if TYPE_CHECKING:
    from broker.storage.leases import Leases

log = logging.getLogger(__name__)

MAX_RECENT_PRODUCER_BATCHES = 5
_FENCED = "fenced: its lease expired or another broker took it over"
# Segment objects are read and cached in blocks of this size: one read serves the chunks of
# every partition in the block (a segment holds all partitions' batches of a flush), and
# sequential consumers get the next block read ahead.
BLOCK_BYTES = 8 * 1024 * 1024
ATTR_LOG_APPEND_TIME = 0x08


class ProduceError(Exception):
    """A produce refused for one partition; ``code`` is the Kafka error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class UpgradedWalError(RuntimeError):
    """Cluster mode: the local WAL of this broker from before it was a cluster member holds
    batches it cannot put in the index now; the message says what to do."""


class SlowCommitError(RuntimeError):
    """Cluster mode: a segment object's put and commit took so long that another broker's
    orphan sweep may delete it; the flush does not commit it (its retry writes a new one)."""


@dataclass(slots=True)
class TailBatch:
    base_offset: int
    end_offset: int
    data: records.Buffer
    append_ms: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerState:
    epoch: int
    # (first sequence, last sequence, base offset) of the last few batches, oldest first
    recent: list[tuple[int, int, int]] = field(default_factory=list)
    # first offset of the producer's open transaction in this partition, -1 for none
    txn_first_offset: int = -1

    @property
    def last_sequence(self) -> int:
        return self.recent[-1][1] if self.recent else -1

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "epoch": self.epoch,
            "recent": list(self.recent),
        }  # a copy: later batches must not leak in
        if self.txn_first_offset >= 0:
            data["txn_first_offset"] = self.txn_first_offset
        return data

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProducerState:
        recent = data.get("recent", [])
        assert isinstance(recent, list)
        epoch = data["epoch"]
        assert isinstance(epoch, int)
        first = data.get("txn_first_offset", -1)
        assert isinstance(first, int)
        return cls(epoch, [tuple(r) for r in recent], first)


class PartitionLog:
    def __init__(
        self, topic: str, partition: int, chunks: list[Chunk], log_start_offset: int = 0
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.chunks = chunks
        self.chunk_bases = [c.base_offset for c in chunks]
        self.tail: list[TailBatch] = []
        self.log_start_offset = log_start_offset
        self.next_offset = chunks[-1].end_offset if chunks else log_start_offset
        self.high_watermark = self.next_offset
        self.producers: dict[int, ProducerState] = {}
        self.dirty_producers: set[int] = set()
        # transactions (KIP-98): producer id -> first offset of its open transaction here, and
        # the aborted ones, (producer id, first offset, marker offset) in marker order
        self.ongoing: dict[int, int] = {}
        self.aborted: list[tuple[int, int, int]] = []
        # cluster mode: the lease epoch it was loaded at, and why it was unloaded (if it was)
        self.epoch = -1
        self.unloaded: str | None = None
        # cluster mode: being handed over (why): no new appends, the accepted ones are flushed
        self.releasing: str | None = None

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the earliest open transaction, or the high watermark."""
        return min(self.high_watermark, min(self.ongoing.values(), default=self.high_watermark))

    def aborted_between(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """Aborted transactions with records in [start, end): their markers at or after start."""
        i = bisect.bisect_left(self.aborted, start, key=lambda a: a[2])
        return [a for a in self.aborted[i:] if a[1] < end]

    def load_transactions(self, aborted: list[tuple[int, int, int]]) -> None:
        """After a restart: the persisted aborted list and the open transactions of the producer states."""
        self.aborted = sorted(aborted, key=lambda a: a[2])
        self.ongoing = {
            pid: s.txn_first_offset for pid, s in self.producers.items() if s.txn_first_offset >= 0
        }

    @property
    def flushed_offset(self) -> int:
        """Offsets below this are in segment objects."""
        return self.chunks[-1].end_offset if self.chunks else self.log_start_offset

    def check_producer(self, header: records.BatchHeader) -> int | None:
        """Kafka's idempotence rules. Returns the original base offset for a
        duplicate, None for a new batch, or raises ProduceError."""
        if header.producer_id < 0 or header.base_sequence < 0:
            return None
        state = self.producers.get(header.producer_id)
        if state is None:
            return None
        if header.producer_epoch < state.epoch:
            raise ProduceError(
                ErrorCode.producer_fenced,
                f"producer epoch {header.producer_epoch} is fenced by {state.epoch}",
            )
        if header.producer_epoch > state.epoch:
            if header.base_sequence != 0:
                raise ProduceError(
                    ErrorCode.out_of_order_sequence_number,
                    f"new producer epoch {header.producer_epoch} must start at sequence 0, got {header.base_sequence}",
                )
            return None
        for first, last, base in state.recent:
            if first == header.base_sequence and last == header.last_sequence:
                return base
        expected = (state.last_sequence + 1) % (2**31)
        if header.base_sequence != expected:
            raise ProduceError(
                ErrorCode.out_of_order_sequence_number,
                f"out of order sequence {header.base_sequence} for producer {header.producer_id}, expected {expected}",
            )
        return None

    def record_producer(
        self, header: records.BatchHeader, base_offset: int, data: records.Buffer = b""
    ) -> None:
        if header.is_control:
            self._record_marker(header, base_offset, data)
            return
        if header.producer_id < 0 or header.base_sequence < 0:
            return
        state = self._producer_state(header.producer_id, header.producer_epoch)
        if header.is_transactional and header.producer_id not in self.ongoing:
            self.ongoing[header.producer_id] = base_offset
            state.txn_first_offset = base_offset
        state.recent.append((header.base_sequence, header.last_sequence, base_offset))
        del state.recent[:-MAX_RECENT_PRODUCER_BATCHES]
        self.dirty_producers.add(header.producer_id)

    def _producer_state(self, producer_id: int, epoch: int) -> ProducerState:
        """The producer's state, a fresh one (sequences reset) for a newer epoch; an open
        transaction's first offset carries over."""
        state = self.producers.get(producer_id)
        if state is None or epoch > state.epoch:
            state = ProducerState(epoch, txn_first_offset=state.txn_first_offset if state else -1)
            self.producers[producer_id] = state
        self.dirty_producers.add(producer_id)
        return state

    def _record_marker(
        self, header: records.BatchHeader, offset: int, data: records.Buffer
    ) -> None:
        """A commit or abort marker ends the producer's open transaction here."""
        state = self._producer_state(header.producer_id, header.producer_epoch)
        first = self.ongoing.pop(header.producer_id, -1)
        state.txn_first_offset = -1
        if first >= 0 and records.control_type(data) == records.CONTROL_ABORT:
            self.aborted.append((header.producer_id, first, offset))

    def accept(
        self, batch: records.Buffer, header: records.BatchHeader, append_ms: int
    ) -> TailBatch:
        base = self.next_offset
        data = records.with_base_offset(batch, base)
        tail = TailBatch(
            base, base + header.last_offset_delta + 1, data, append_ms, header.max_timestamp
        )
        self.tail.append(tail)
        self.next_offset = tail.end_offset
        self.record_producer(header, base, data)
        return tail

    def tail_index(self, offset: int) -> int:
        """Index of the tail batch containing ``offset``."""
        lo, hi = 0, len(self.tail)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.tail[mid].end_offset <= offset:
                lo = mid + 1
            else:
                hi = mid
        return lo


class LogStore:
    """The partition logs. ``node_id`` (cluster mode, Postgres metadata): this broker's id in
    the leases; the logs then hold only the partitions it leads, loaded by the membership loop
    (``load_partition`` / ``unload_partition``), and it feeds ``set_lease_deadline``."""

    def __init__(
        self,
        config: BrokerConfig,
        metadata: MetadataStore,
        store: ObjectStore,
        node_id: int | None = None,
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.store = store
        self.partitions: dict[tuple[str, int], PartitionLog] = {}
        self._flush_needed = asyncio.Event()
        self.node_id = node_id
        self.cluster = node_id is not None
        # cluster mode: the lease epoch of each partition this broker leads (the index
        # commit's fence), and the monotonic time after which it accepts no produce
        self.epochs: dict[tuple[str, int], int] = {}
        self.lease_deadline = 0.0
        self.wal: WriteAheadLog | IndexAcks = (
            IndexAcks(self._flush_needed.set)
            if self.cluster
            else WriteAheadLog(config.wal_dir, fsync=config.wal_fsync)
        )
        self.unflushed_bytes = 0
        self.max_unflushed_bytes = config.max_unflushed_bytes or max(
            256 * 1024 * 1024, 8 * config.segment_flush_bytes
        )
        self.produces_held = 0  # produce requests that had to wait for room (object store behind)
        self._flush_done = asyncio.Event()
        self._data_arrived = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        # Held from a flush's check of which partitions are still live to its index
        # write (done in a thread) and by a topic deletion: a deleted topic's chunks
        # never reach the index, and a new topic of that name never inherits them.
        self.index_lock = asyncio.Lock()
        # object keys DeleteRecords left without a chunk: retention deletes them after the delay
        self.released_objects: list[str] = []
        self._closing = False
        # Segment objects in blocks of BLOCK_BYTES, (key, block number) -> buffer, least
        # recently used first; and the block reads under way, shared by every reader of them.
        self._object_cache: OrderedDict[tuple[str, int], records.Buffer] = OrderedDict()
        self._object_cache_bytes = 0
        self.object_cache_limit = 64 * 1024 * 1024
        self._block_reads: dict[tuple[str, int], asyncio.Future[records.Buffer]] = {}
        self.block_reads = 0  # blocks read from the object store (cache misses and read-ahead)
        # bumped whenever data becomes visible, so a fetch that read and found too little knows
        # whether anything arrived during its reads (before it starts waiting)
        self.data_generation = 0
        self.flush_failures = 0
        self.segments_written = 0
        self.retention = RetentionStatus()  # what segment retention did and what tables hold back
        self.compaction = CompactionStatus()  # cluster mode: what compaction did
        # cluster mode: an object is committed only this long / 2 after its put began (the
        # orphan sweep's grace; a test shortens it)
        self.commit_grace_ms = CLUSTER_ORPHAN_GRACE_MS

    # ------------------------------------------------------------ lifecycle

    async def open(self, topics: dict[str, int], leases: Leases | None = None) -> None:
        """Load the segment index, replay the WAL, flush what it held. Cluster mode: nothing
        to load (partitions come with their leases: ``load_partition``), except a local WAL
        left by this broker before it was a cluster member (``_replay_upgraded_wal``)."""
        if isinstance(self.wal, WriteAheadLog):
            await self._open_local(self.wal, topics)
        elif leases is not None:
            await self._replay_upgraded_wal(leases, topics)
        self._flusher = asyncio.create_task(self._flush_loop(), name="segment-flusher")

    async def _replay_upgraded_wal(self, leases: Leases, topics: dict[str, int]) -> None:
        """A broker on Postgres metadata used to keep acknowledged batches in its local WAL
        (``wal_dir``) until a flush indexed them; a cluster member has no WAL. So an upgraded
        broker whose WAL still holds batches puts them in the index first: it acquires the
        leases of their partitions, loads them, appends the batches the index has not got, and
        flushes (fenced by those epochs, as any flush). If another broker holds one of those
        leases, or the flush fails, it refuses to start (``UpgradedWalError``), WAL untouched."""
        directory = self.config.wal_dir
        files = sorted(
            (p for p in directory.glob("*.wal") if p.stat().st_size > 0),
            key=lambda p: int(p.stem),
        )
        if not files:
            return
        entries = [entry for path in files for entry in read_entries(path)]
        wanted = sorted(
            {
                (e.topic, e.partition)
                for e in entries
                if e.partition < topics.get(e.topic, 0)  # a deleted topic's: nothing to keep
            }
        )
        what = (
            f"{directory} holds {len(files)} WAL files from before this broker was a cluster "
            f"member (metadata on Postgres), with acknowledged batches the index may not have "
            f"(partitions {', '.join(f'{t}-{p}' for t, p in wanted) or 'none'})"
        )
        acquired: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + leases.lease_ms / 1000
        try:
            for key in wanted:
                epoch = await asyncio.to_thread(leases.acquire, *key)
                if epoch is None:
                    raise UpgradedWalError(
                        f"{what}; another live broker holds the lease of {key[0]}-{key[1]}. Stop "
                        f"the other brokers (or wait {leases.lease_ms} ms after they stop) and "
                        "start this one first: it replays the WAL into the index, then deletes it"
                    )
                acquired[key] = epoch
            self.set_lease_deadline(deadline)
            for key, epoch in acquired.items():
                await self.load_partition(*key, epoch)
            replayed = sum(self._replay_entry(entry) for entry in entries)
            try:
                await self.flush()
            except Exception as exc:
                raise UpgradedWalError(
                    f"{what}; flushing them failed ({exc}). The WAL is kept: start again when "
                    "the object store and Postgres answer"
                ) from exc
            if lost := [k for k in wanted if k not in self.partitions or self.partitions[k].tail]:
                raise UpgradedWalError(
                    f"{what}; their index commit was fenced for {lost} (another broker took the "
                    "lease meanwhile). The WAL is kept: stop the other brokers and start again"
                )
        except BaseException:
            for key in acquired:
                await self.unload_partition(*key, "the upgraded WAL was not replayed")
            with contextlib.suppress(Exception):
                await asyncio.to_thread(leases.release, list(acquired))
            raise
        for path in files:
            path.unlink(missing_ok=True)
        log.warning(
            "replayed %d batches of %d partitions from the local WAL in %s into the index "
            "(an upgrade to cluster mode) and deleted it",
            replayed,
            len(wanted),
            directory,
        )

    def _replay_entry(self, entry: WalEntry) -> bool:
        """Append a WAL entry to its partition's tail unless the index has it already
        (or its partition is not here): whether it was appended."""
        part = self.partitions.get((entry.topic, entry.partition))
        if part is None:
            return False
        header = records.read_header(entry.batch)
        if header.base_offset < part.next_offset:
            return False  # already in a segment object
        if header.base_offset != part.next_offset:
            log.error(
                "WAL gap in %s-%d: expected offset %d, found %d",
                entry.topic,
                entry.partition,
                part.next_offset,
                header.base_offset,
            )
        tail = TailBatch(
            header.base_offset,
            header.base_offset + header.last_offset_delta + 1,
            entry.batch,
            entry.append_ms,
            header.max_timestamp,
        )
        part.tail.append(tail)
        part.next_offset = part.high_watermark = tail.end_offset
        part.record_producer(header, header.base_offset, entry.batch)
        self.unflushed_bytes += len(entry.batch)
        return True

    async def _open_local(self, wal: WriteAheadLog, topics: dict[str, int]) -> None:
        log_starts = self.metadata.log_start_offsets()
        for topic, partitions in topics.items():
            for p in range(partitions):
                self.add_partition(topic, p, log_starts.get((topic, p), 0))
        for (topic, p, pid), state in self.metadata.producer_states().items():
            part = self.partitions.get((topic, p))
            if part:
                part.producers[pid] = ProducerState.from_json(state)
        aborted = self.metadata.aborted_transactions()
        for (topic, p), part in self.partitions.items():
            part.load_transactions(aborted.get((topic, p), []))
        replayed = 0
        old_files = wal.files()
        old_files.remove(wal.current_file)
        for path in old_files:
            for entry in read_entries(path):
                replayed += self._replay_entry(entry)
        if replayed:
            log.info("replayed %d batches from %d WAL files", replayed, len(old_files))
        wal.start()
        try:
            await self.flush()
        except Exception as exc:  # noqa: BLE001 - any object store error; the WAL keeps the data
            # The replayed batches are served from memory and stay in the old WAL
            # files (the flusher's next roll includes them) until a flush succeeds:
            # an object store outage must not keep the broker from starting.
            self.flush_failures += 1
            log.error(
                "flushing the replayed WAL failed, the flusher will retry (data is safe in the WAL): %s",
                exc,
            )
        else:
            for path in old_files:
                path.unlink(missing_ok=True)

    async def close(self) -> None:
        if self._flusher:
            self._closing = True
            self._flush_needed.set()
            await self._flusher
        try:
            await self.flush()
        except Exception as exc:  # noqa: BLE001 - the WAL still has it
            log.warning(
                "final flush failed (%s): %s",
                "its producers were not acknowledged" if self.cluster else "data stays in the WAL",
                exc,
            )
        if isinstance(self.wal, WriteAheadLog):
            await self.wal.close()
        else:  # nothing unacknowledged may wait forever
            await self._unload_all("the broker is shutting down")

    def add_partition(
        self,
        topic: str,
        partition: int,
        log_start_offset: int = 0,
        chunks: list[Chunk] | None = None,
    ) -> PartitionLog:
        """Open a partition's log; ``chunks`` are its indexed chunks if the caller
        already read them (off the event loop), else they are read here."""
        if chunks is None:
            chunks = self.metadata.chunks(topic, partition)
        part = PartitionLog(topic, partition, chunks, log_start_offset)
        self.partitions[(topic, partition)] = part
        return part

    async def _drop_leading_chunks(
        self, part: PartitionLog, count: int, new_start: int
    ) -> list[str]:
        """The partition's first ``count`` chunks go and its log start moves up to
        ``new_start`` (retention's and DeleteRecords' one way to do it, under ``index_lock``):
        the index rows first, fenced by the partition's lease in cluster mode, then the log in
        memory. Returns the object keys no chunk refers to any more. A broker that lost the
        partition unloads it and raises ``FencedError``: what its caller answers differs."""
        try:
            keys = await asyncio.to_thread(
                self.metadata.drop_chunks_before,
                part.topic,
                part.partition,
                new_start,
                self._fence(part),
            )
        except FencedError:
            self._unload(part, _FENCED)
            raise
        del part.chunks[:count]
        del part.chunk_bases[:count]
        part.log_start_offset = max(part.log_start_offset, new_start)
        part.aborted = [a for a in part.aborted if a[2] >= part.log_start_offset]
        return keys

    async def drop_chunks(self, part: PartitionLog, end: int) -> list[str]:
        """Segment retention: drop the partition's leading chunks that end at or before ``end``
        and move its log start past them. Returns the object keys no chunk refers to any more,
        for the caller to delete (later: ``file.delete.delay.ms``). Counted under the lock, so
        a DeleteRecords that ran while retention waited for it never makes retention drop more
        than it decided to.

        The index rows go first, in a thread, under ``index_lock`` (which the flusher's index
        write and topic deletion also take, so neither runs in between); the log in memory
        moves after them. A fetch meanwhile still reads the old chunks, whose objects are
        not deleted yet. A partition deleted before the lock was ours is left alone."""
        async with self.index_lock:
            if self.partitions.get((part.topic, part.partition)) is not part:
                return []
            count = bisect.bisect_right([c.end_offset for c in part.chunks], end)
            if count == 0:
                return []
            try:
                return await self._drop_leading_chunks(
                    part, count, part.chunks[count - 1].end_offset
                )
            except FencedError:
                return []

    async def delete_records(self, part: PartitionLog, offset: int) -> int:
        """DeleteRecords: the partition's log start moves up to ``offset`` (at most the high
        watermark, checked by the caller); returns the new log start. Chunks wholly below it
        leave the index, as retention's do (``drop_chunks``); the objects no chunk refers to any
        more go to ``released_objects``, which retention deletes after ``file.delete.delay.ms``
        as its own; a chunk the new start cuts stays and reads from it start at ``offset``.

        Records still only in the WAL are flushed first, so the log start never passes the
        end of the indexed chunks (reads below ``flushed_offset`` come from segment objects)."""
        if offset > part.flushed_offset:
            await self.flush()
        async with self.index_lock:
            if self.partitions.get((part.topic, part.partition)) is not part:
                return part.log_start_offset
            if offset <= part.log_start_offset:
                return part.log_start_offset
            count = bisect.bisect_right([c.end_offset for c in part.chunks], offset)
            try:
                keys = await self._drop_leading_chunks(part, count, offset)
            except FencedError:
                raise ProduceError(
                    ErrorCode.not_leader_or_follower,
                    f"{part.topic}-{part.partition} is no longer led by this broker",
                ) from None
            self.released_objects.extend(keys)
            return offset

    async def unreferenced_objects(self, keys: list[str]) -> list[str]:
        """Those of ``keys`` no chunk refers to. Checked under the flush lock (a flush puts its
        object before it indexes it, so outside the lock a new object could look orphaned) and
        the index lock (a DeleteRecords lists the objects it unreferenced in
        ``released_objects`` before it lets go of it)."""
        async with self._flush_lock, self.index_lock:
            referenced = await asyncio.to_thread(self.metadata.object_keys)
        return [k for k in keys if k not in referenced]

    def forget_cached(self, key: str) -> None:
        for cached in [k for k in self._object_cache if k[0] == key]:
            self._object_cache_bytes -= len(self._object_cache.pop(cached))

    def drop_topic(self, topic: str) -> None:
        for key in [k for k in self.partitions if k[0] == topic]:
            part = self.partitions.pop(key)
            self.unflushed_bytes -= sum(len(b.data) for b in part.tail)
            if isinstance(self.wal, IndexAcks):
                part.unloaded = "the topic was deleted"
                self.epochs.pop(key, None)
                self.wal.dropped([key])

    # ------------------------------------------------------------ cluster mode: leadership

    def set_lease_deadline(self, deadline: float) -> None:
        """The membership loop, after each successful heartbeat: ``time.monotonic()`` at the
        start of that renewal + ``broker.lease.ms``. Past it this broker accepts no produce
        (NOT_LEADER_OR_FOLLOWER): its leases may have lapsed and another broker may lead."""
        self.lease_deadline = deadline

    async def load_partition(self, topic: str, partition: int, epoch: int) -> PartitionLog:
        """Lead a partition at the lease ``epoch`` just acquired: its chunks, log start,
        producer states and aborted transactions from the index (every acknowledged batch is
        there; nothing to replay). Loaded at an older epoch: that log is unloaded first."""
        key = (topic, partition)
        current = self.partitions.get(key)
        if current is not None and current.epoch == epoch:
            return current
        chunks, start, states, aborted = await asyncio.to_thread(
            self.metadata.load_partition, topic, partition
        )
        part = PartitionLog(topic, partition, chunks, start)
        part.epoch = epoch
        part.producers = {pid: ProducerState.from_json(state) for pid, state in states.items()}
        part.load_transactions(aborted)
        async with self.index_lock:
            current = self.partitions.get(key)
            if current is not None:
                self._unload(current, f"loaded again at lease epoch {epoch}")
            self.partitions[key] = part
            self.epochs[key] = epoch
        return part

    async def unload_partition(self, topic: str, partition: int, reason: str) -> None:
        """Stop leading a partition (released, lapsed, or fenced). Under the index lock, so a
        flush's index commit has it entirely or not at all; its unacknowledged batches are
        dropped and their producers get NOT_LEADER_OR_FOLLOWER. Release the lease after a
        flush (``flush()``) to hand everything over."""
        async with self.index_lock:
            part = self.partitions.get((topic, partition))
            if part is not None:
                self._unload(part, reason)

    async def hand_over(self, keys: list[tuple[str, int]], reason: str) -> None:
        """Give partitions up voluntarily (a rebalance, an operator's move, a clean shutdown),
        before their leases are released: first refuse every new append (and marker) with
        NOT_LEADER_OR_FOLLOWER, refused before it is accepted; then flush until every batch
        already accepted is acknowledged; then unload. So no producer is told to go elsewhere
        for a batch this broker took: a producer without idempotence re-sending such a batch
        after newer ones reached the new leader would reorder its records. Bounded by the
        lease deadline: what a failing flush could not index by then is refused as before."""
        parts = [self.partitions[k] for k in keys if k in self.partitions]
        for part in parts:
            part.releasing = reason
        while time.monotonic() < self.lease_deadline and any(
            p.unloaded is None and p.high_watermark < p.next_offset for p in parts
        ):
            try:
                await self.flush()
            except Exception as exc:  # noqa: BLE001 - retried until the deadline
                log.warning("flush before handing partitions over failed: %s", exc)
                await _wait_event(self._flush_done, 0.2)
        async with self.index_lock:
            for part in parts:
                self._unload(part, reason)

    def _fence(self, part: PartitionLog) -> tuple[int, int] | None:
        """What an index change of ``part`` is fenced by: (node id, epoch) in cluster mode."""
        return None if self.node_id is None else (self.node_id, part.epoch)

    def _unload(self, part: PartitionLog, reason: str) -> None:
        key = (part.topic, part.partition)
        if self.partitions.get(key) is part:
            del self.partitions[key]
            self.epochs.pop(key, None)
        part.unloaded = reason
        self.unflushed_bytes -= sum(len(b.data) for b in part.tail)
        part.tail.clear()
        if isinstance(self.wal, IndexAcks):
            self.wal.dropped([key])
        log.info("%s-%d unloaded: %s", part.topic, part.partition, reason)

    async def _unload_all(self, reason: str, only_unacked: bool = False) -> None:
        async with self.index_lock:
            for part in list(self.partitions.values()):
                if not only_unacked or part.high_watermark < part.next_offset:
                    self._unload(part, reason)

    def ack_error(self, part: PartitionLog, end_offset: int) -> ProduceError | None:
        """After ``wal.wait_durable``: why the records appended to ``part`` up to
        ``end_offset`` (its ``next_offset`` after the append) are not acknowledged, or None.
        Only cluster mode refuses here: its partition was unloaded before they were indexed."""
        if not self.cluster or part.high_watermark >= end_offset:
            return None
        return ProduceError(
            ErrorCode.not_leader_or_follower,
            f"{part.topic}-{part.partition} is no longer led by this broker "
            f"({part.unloaded or 'unloaded'}); nothing of this produce was written",
        )

    async def append_and_wait(self, part: PartitionLog, records_bytes: bytes) -> int:
        """Append and wait until acknowledged (both modes); the base offset. For the broker's
        own writers (internal topics) and tests; raises ProduceError."""
        base, seq = await self.append(part, records_bytes, 2**31 - 1)
        end = part.next_offset
        await self.wal.wait_durable(seq)
        if (error := self.ack_error(part, end)) is not None:
            raise error
        return base

    # ------------------------------------------------------------ produce

    async def append(
        self,
        part: PartitionLog,
        records_bytes: bytes,
        max_message_bytes: int,
        recheck: Callable[[], None] | None = None,
    ) -> tuple[int, int]:
        """Append a partition's records; returns (base offset, WAL sequence to await).
        ``recheck`` runs right before the records are accepted (after any wait for room) and
        may raise ``ProduceError``: a transaction checked before the wait may have ended."""
        try:
            headers = records.split_batches(records_bytes)
        except records.CorruptBatchError as exc:
            raise ProduceError(ErrorCode.corrupt_message, str(exc)) from None
        if not headers:
            raise ProduceError(ErrorCode.invalid_record, "produce request carries no record batch")
        self._check_wal()
        for header in headers:
            if header.size > max_message_bytes:
                raise ProduceError(
                    ErrorCode.message_too_large,
                    f"record batch of {header.size} bytes exceeds max.message.bytes {max_message_bytes}",
                )
            if header.is_control:
                raise ProduceError(
                    ErrorCode.invalid_record, "clients may not produce control batches"
                )
        if self.unflushed_bytes > self.max_unflushed_bytes:
            self.produces_held += 1
            await self._wait_for_room()
        if recheck is not None:
            recheck()
        if self.cluster:
            self._check_leading(part)
        self._check_wal()  # again: the WAL may have failed while this waited for room
        now = int(time.time() * 1000)
        first_base = -1
        seq = 0
        pos = 0
        for header in headers:
            batch = records_bytes[pos : pos + header.size]
            pos += header.size
            duplicate = part.check_producer(header)
            if duplicate is not None:
                if first_base < 0:
                    first_base = duplicate
                # the original may still be on its way to disk: acknowledge the retry
                # only once everything appended so far is durable
                seq = max(seq, self.wal.last_sequence)
                continue
            tail = part.accept(batch, header, now)
            if first_base < 0:
                first_base = tail.base_offset
            self.unflushed_bytes += len(tail.data)
            end = tail.end_offset
            seq = self.wal.append(
                WalEntry(part.topic, part.partition, now, tail.data),
                functools.partial(self._on_durable, part, end),
            )
        if self.unflushed_bytes >= self.config.segment_flush_bytes:
            self._flush_needed.set()
        return first_base, seq

    def append_marker(
        self, part: PartitionLog, producer_id: int, producer_epoch: int, commit: bool
    ) -> int:
        """Write a transaction marker (control batch) into the partition; the WAL sequence to
        await. Cluster mode: raises ``ProduceError`` (NOT_LEADER_OR_FOLLOWER) for a partition
        this broker no longer leads, and the caller checks ``ack_error(part, part.next_offset)``
        after the wait: a partition unloaded before the flush resolves the wait without the
        marker, which then belongs at the new leader. A failed WAL raises ``OSError`` before
        the marker takes an offset (as ``wait_durable`` would)."""
        if self.cluster:
            self._check_leading(part)
        if self.wal.failure is not None:
            raise OSError(f"write-ahead log failed: {self.wal.failure}")
        now = int(time.time() * 1000)
        batch = records.encode_control_batch(producer_id, producer_epoch, commit, now)
        header = records.read_header(batch)
        tail = part.accept(batch, header, now)
        self.unflushed_bytes += len(tail.data)
        return self.wal.append(
            WalEntry(part.topic, part.partition, now, tail.data),
            functools.partial(self._on_durable, part, tail.end_offset),
        )

    def _check_wal(self) -> None:
        """Refuse a produce while the WAL cannot write (a full disk): checked right before
        anything is accepted into memory, so a batch that cannot be made durable now takes no
        offset. KAFKA_STORAGE_ERROR is retriable: the WAL retries its queued entries and
        accepts appends again once the disk takes them (``broker/storage/wal.py``)."""
        if self.wal.failure is not None:
            raise ProduceError(
                ErrorCode.kafka_storage_error,
                f"write-ahead log cannot write ({self.wal.failure}); retry: produces are "
                "accepted again once the disk has room",
            )

    def _check_leading(self, part: PartitionLog) -> None:
        if part.unloaded is not None or part.releasing is not None:
            raise ProduceError(
                ErrorCode.not_leader_or_follower,
                f"{part.topic}-{part.partition} is no longer led by this broker "
                f"({part.unloaded or part.releasing})",
            )
        if time.monotonic() >= self.lease_deadline:
            raise ProduceError(
                ErrorCode.not_leader_or_follower,
                f"{part.topic}-{part.partition}: this broker could not renew its leases in time "
                "(metadata database unreachable?); another broker may lead it",
            )

    async def _wait_for_room(self) -> None:
        deadline = time.monotonic() + 30
        while self.unflushed_bytes > self.max_unflushed_bytes:
            self._flush_needed.set()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProduceError(
                    ErrorCode.kafka_storage_error,
                    "object store is not keeping up; the broker is holding back produces",
                )
            self._flush_done.clear()
            await _wait_event(self._flush_done, remaining)

    def _on_durable(self, part: PartitionLog, end_offset: int) -> None:
        part.high_watermark = max(part.high_watermark, end_offset)
        self.data_generation += 1
        self._data_arrived.set()

    async def wait_for_data(self, timeout: float, since: int | None = None) -> None:  # noqa: ASYNC109 (a poll deadline, not a cancellation)
        """Until data becomes visible or ``timeout``. With ``since`` (``data_generation`` as the
        caller saw it before reading), data that arrived during the caller's reads ends the
        wait at once instead of being missed."""
        if since is not None and since != self.data_generation:
            return
        self._data_arrived.clear()
        await _wait_event(self._data_arrived, timeout)

    # ------------------------------------------------------------ fetch

    async def read(
        self, part: PartitionLog, offset: int, max_bytes: int, limit: int | None = None
    ) -> bytes:
        """``read_pieces`` joined into one bytes object."""
        return b"".join(await self.read_pieces(part, offset, max_bytes, limit))

    async def read_pieces(
        self, part: PartitionLog, offset: int, max_bytes: int, limit: int | None = None
    ) -> list[records.Buffer]:
        """Whole batches from the one holding ``offset``, up to ``max_bytes``
        (but at least one batch), never past the high watermark (nor ``limit``,
        the last stable offset of a read_committed fetch: a batch boundary).

        The batches come as slices of cached blocks and tail batches, not copied: the
        Fetch response is written from them as they are. A read from the object store
        also starts reading the block the partition's next read will need (read-ahead),
        so a consumer going through the log finds it in memory."""
        out: list[records.Buffer] = []
        size = 0
        hw = part.high_watermark if limit is None else min(limit, part.high_watermark)
        full = False
        while offset < part.flushed_offset:
            if (
                offset < part.log_start_offset
            ):  # retention dropped it (maybe during the await below)
                full = True
                break
            # looked up on every pass: retention may drop leading chunks during the await below
            i = max(bisect.bisect_right(part.chunk_bases, offset) - 1, 0)
            while i < len(part.chunks) and part.chunks[i].end_offset <= offset:
                i += 1
            if i == len(part.chunks):
                break
            chunk = part.chunks[i]
            refs = chunk.refs
            k = max(bisect.bisect_right(chunk.ref_bases, offset) - 1, 0)
            start = end = refs[k].position
            while (
                k < len(refs)
                and refs[k].base_offset < hw
                and ((not out and end == start) or size + end - start + refs[k].size <= max_bytes)
            ):
                end = refs[k].position + refs[k].size
                k += 1
            if end == start:
                full = True
                break
            out.extend(
                await self._read_range(
                    chunk.object_key, chunk.byte_start + start, chunk.byte_start + end
                )
            )
            size += end - start
            self._read_ahead(part, chunk, k)
            if k < len(refs):
                full = True
                break
            offset = chunk.end_offset
            if offset >= hw:
                full = True
                break
        if not full:
            j = part.tail_index(offset)
            while j < len(part.tail):
                batch = part.tail[j]
                if batch.end_offset > hw or (out and size + len(batch.data) > max_bytes):
                    break
                out.append(batch.data)
                size += len(batch.data)
                j += 1
        return out

    async def _read_object(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a segment object, as one bytes object."""
        return b"".join(await self._read_range(key, start, end))

    async def _read_range(self, key: str, start: int, end: int) -> list[memoryview]:
        """Bytes [start, end) of a segment object as slices of its cached blocks (read
        whole, BLOCK_BYTES at a time, on a miss): one object read answers every partition
        whose chunk lies in that block, and no bytes are copied."""
        pieces: list[memoryview] = []
        for block in range(start // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1):
            data = self._cached_block(key, block)
            if data is None:
                data = await asyncio.shield(self._load_block(key, block))
            base = block * BLOCK_BYTES
            lo, hi = max(start - base, 0), min(end - base, BLOCK_BYTES)
            if hi > len(data):
                raise OSError(
                    f"segment object {key} ends at {base + len(data)}, "
                    f"before the indexed range [{start}, {end})"
                )
            pieces.append(memoryview(data)[lo:hi])
        return pieces

    def _cached_block(self, key: str, block: int) -> records.Buffer | None:
        data = self._object_cache.get((key, block))
        if data is not None:
            self._object_cache.move_to_end((key, block))
        return data

    def _load_block(self, key: str, block: int) -> asyncio.Future[records.Buffer]:
        """The read of one block (in a worker thread), started unless under way; it caches
        the block when done, whoever waits for it (or nobody: a read-ahead)."""
        loading = self._block_reads.get((key, block))
        if loading is None:
            start = block * BLOCK_BYTES
            loading = asyncio.get_running_loop().run_in_executor(
                None, self.store.read_block, key, start, start + BLOCK_BYTES
            )
            self._block_reads[(key, block)] = loading
            self.block_reads += 1
            loading.add_done_callback(functools.partial(self._block_loaded, key, block))
        return loading

    def _block_loaded(self, key: str, block: int, loading: asyncio.Future[records.Buffer]) -> None:
        self._block_reads.pop((key, block), None)
        if not loading.cancelled() and loading.exception() is None:
            self._cache_block(key, block, loading.result())

    def _read_ahead(self, part: PartitionLog, chunk: Chunk, k: int) -> None:
        """After a read of ``chunk`` that stopped before its batch ``k``: start reading the
        block holding that batch and, when it is the chunk's last block, the first block of
        the partition's next chunk (in another segment object)."""
        refs = chunk.refs
        targets: list[tuple[str, int]] = []
        last_block = (chunk.byte_end - 1) // BLOCK_BYTES
        block = last_block
        if k < len(refs):
            block = (chunk.byte_start + refs[k].position) // BLOCK_BYTES
            targets.append((chunk.object_key, block))
        if block == last_block:
            i = bisect.bisect_right(part.chunk_bases, chunk.base_offset)
            if i < len(part.chunks):
                following = part.chunks[i]
                targets.append((following.object_key, following.byte_start // BLOCK_BYTES))
        for key, number in targets:
            if (key, number) not in self._object_cache:
                self._load_block(key, number)

    def _cache_object(self, key: str, data: bytes) -> None:
        """A segment object just written: its blocks go into the cache (views, no copy)."""
        view = memoryview(data)
        for block, start in enumerate(range(0, len(data), BLOCK_BYTES)):
            self._cache_block(key, block, view[start : start + BLOCK_BYTES])

    def _cache_block(self, key: str, block: int, data: records.Buffer) -> None:
        previous = self._object_cache.pop((key, block), None)
        if previous is not None:
            self._object_cache_bytes -= len(previous)
        self._object_cache[(key, block)] = data
        self._object_cache_bytes += len(data)
        while self._object_cache_bytes > self.object_cache_limit and len(self._object_cache) > 1:
            _, evicted = self._object_cache.popitem(last=False)
            self._object_cache_bytes -= len(evicted)

    # ------------------------------------------------------------ offsets

    async def offset_for_timestamp(self, part: PartitionLog, timestamp: int) -> tuple[int, int]:
        """The first record whose timestamp is >= timestamp: (offset, timestamp), or (-1, -1).
        The batch index finds the batch (its max timestamp); the batch is read and decoded to
        find the record inside it, as Kafka answers (not the batch's base offset)."""
        found = await self._find_batch(part, lambda max_ts: max_ts >= timestamp)
        if found is None:
            return -1, -1
        for offset, ts in _record_timestamps(found):
            if ts >= timestamp and offset >= part.log_start_offset:
                return offset, ts
        return -1, -1

    async def max_timestamp(self, part: PartitionLog) -> tuple[int, int]:
        """The record with the largest timestamp (the first of several): (offset, timestamp)."""
        best = -1
        for chunk in part.chunks:
            best = max([best, *(ref.max_timestamp for ref in chunk.batches())])
        for batch in part.tail:
            if batch.end_offset <= part.high_watermark:
                best = max(best, batch.max_timestamp)
        if best < 0:
            return -1, -1
        found = await self._find_batch(part, lambda max_ts: max_ts == best)
        for offset, ts in _record_timestamps(found) if found is not None else ():
            if ts == best and offset >= part.log_start_offset:
                return offset, ts
        return -1, -1

    async def _find_batch(
        self, part: PartitionLog, wanted: Callable[[int], bool]
    ) -> records.Buffer | None:
        """The bytes of the first data batch (not a transaction marker) whose max timestamp is wanted."""
        for chunk in list(part.chunks):
            for ref in chunk.batches():
                if ref.max_timestamp >= 0 and wanted(ref.max_timestamp):
                    start = chunk.byte_start + ref.position
                    data = await self._read_object(chunk.object_key, start, start + ref.size)
                    if not records.read_header(data).is_control:
                        return data
        for batch in list(part.tail):
            if batch.end_offset > part.high_watermark:
                break
            if wanted(batch.max_timestamp) and not records.read_header(batch.data).is_control:
                return batch.data
        return None

    # ------------------------------------------------------------ flush

    async def _flush_loop(self) -> None:
        """Flush every interval or when enough bytes wait, until close() asks it to
        stop. It is never cancelled: a flush cut off inside the WAL roll would leave
        durability callbacks unrun (and close() waiting for them)."""
        interval = self.config.segment_flush_ms / 1000
        # cluster mode: producers wait for the flush itself, so a failed one is retried soon
        first_backoff = min(interval, 0.2) if self.cluster else interval
        backoff = first_backoff
        while not self._closing:
            await _wait_event(self._flush_needed, interval)
            self._flush_needed.clear()
            if self._closing:
                return
            try:
                await self.flush()
                backoff = first_backoff
            except Exception as exc:  # noqa: BLE001 - retried; the WAL keeps the data
                self.flush_failures += 1
                retry = backoff
                if self.cluster:
                    if time.monotonic() >= self.lease_deadline:
                        # Its leases may belong to others by now: the waiting producers get
                        # NOT_LEADER_OR_FOLLOWER (and retry with the new leader) instead of
                        # waiting for an index this broker may no longer write.
                        await self._unload_all(
                            "its lease lapsed before a flush could index it", True
                        )
                    else:  # try again by the deadline at the latest
                        retry = min(backoff, self.lease_deadline - time.monotonic() + 0.01)
                log.error(
                    "segment flush failed, retrying in %.1fs (%s): %s",
                    retry,
                    "nothing in it was acknowledged" if self.cluster else "data is safe in the WAL",
                    exc,
                )
                await _wait_event(self._flush_needed, retry)
                backoff = min(backoff * 2, 30.0)
                if self.cluster:  # the retry is now, not after another interval
                    self._flush_needed.set()

    async def flush(self) -> int:
        """Write every partition's tail into one segment object. Returns bytes written."""
        async with self._flush_lock:
            if isinstance(self.wal, IndexAcks):  # cluster mode: no WAL to roll
                closed: list[Path] = []
                covered = self.wal.take()
                snapshot = self._snapshot()
            else:
                closed, snapshot = await self.wal.roll(self._snapshot)
                covered = -1
            if not snapshot:
                for path in closed:
                    path.unlink(missing_ok=True)
                if isinstance(self.wal, IndexAcks):
                    self.wal.indexed(covered)
                return 0
            key = f"segments/{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:12]}.seg"
            parts: list[records.Buffer] = []
            chunks: list[tuple[PartitionLog, Chunk, int]] = []
            position = 0
            for part, batches, _ in snapshot:
                refs: list[BatchRef] = []
                chunk_start = position
                for batch in batches:
                    refs.append(
                        BatchRef(
                            batch.base_offset,
                            position - chunk_start,
                            len(batch.data),
                            batch.append_ms,
                            batch.max_timestamp,
                        )
                    )
                    parts.append(batch.data)
                    position += len(batch.data)
                chunk = Chunk(
                    part.topic,
                    part.partition,
                    batches[0].base_offset,
                    batches[-1].end_offset,
                    key,
                    chunk_start,
                    position,
                    min(b.append_ms for b in batches),
                    max(b.append_ms for b in batches),
                    pack_batch_index(refs),
                )
                chunks.append((part, chunk, len(batches)))
            data = b"".join(parts)
            put_started = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, self.store.put, key, data)
            async with self.index_lock:
                if self.cluster:
                    self._check_commit_in_grace(key, put_started)
                await self._index_segment(key, data, closed, snapshot, chunks)
                if isinstance(self.wal, IndexAcks):
                    self.wal.indexed(covered)
            return len(data)

    def _check_commit_in_grace(self, key: str, put_started: float) -> None:
        """Cluster mode: another broker's orphan sweep deletes unreferenced objects older than
        ``CLUSTER_ORPHAN_GRACE_MS`` (by the object store's clock), so an object is committed
        only within half of that after its put began. Later, this raises: nothing of it is
        indexed, the batches stay in the tails, and the flusher's retry writes them again
        under a new key (this one is an orphan for the sweep)."""
        elapsed = time.monotonic() - put_started
        if elapsed * 1000 > self.commit_grace_ms / 2:
            raise SlowCommitError(
                f"segment object {key} was put {elapsed:.1f}s ago, more than half the orphan "
                f"sweep's grace ({self.commit_grace_ms / 1000:.0f}s): not committing it, the "
                "batches are written again under a new key"
            )

    async def _index_segment(
        self,
        key: str,
        data: bytes,
        closed: list[Path],
        snapshot: list[tuple[PartitionLog, list[TailBatch], dict[int, dict[str, object]]]],
        chunks: list[tuple[PartitionLog, Chunk, int]],
    ) -> None:
        """Index a written segment's chunks and take them off the tails (under index_lock)."""
        # Topics deleted during the put: their chunks must not reach the index (a
        # topic created again under the same name would inherit them), and
        # drop_topic already took their bytes off unflushed_bytes.
        live = {
            id(part)
            for part, _, _ in snapshot
            if self.partitions.get((part.topic, part.partition)) is part
        }
        chunks = [c for c in chunks if id(c[0]) in live]
        # Producer states as of the WAL roll, i.e. matching the batches in this
        # segment. Taken now they could include batches not yet in the WAL, and a
        # broker restarted after a crash would acknowledge those as duplicates.
        producer_states = {
            (part.topic, part.partition, pid): state
            for part, _, states in snapshot
            if id(part) in live
            for pid, state in states.items()
        }
        aborted = [
            (part.topic, part.partition, *a)
            for part, chunk, _ in chunks
            for a in part.aborted_between(chunk.base_offset, chunk.end_offset)
            if a[2] < chunk.end_offset
        ]
        if not self.cluster:
            await asyncio.to_thread(
                self.metadata.add_chunks, [c for _, c, _ in chunks], producer_states, aborted
            )
        else:
            assert self.node_id is not None
            fence = (
                self.node_id,
                {k: e for k, e in self.epochs.items() if id(self.partitions[k]) in live},
            )
            fenced = await asyncio.to_thread(
                self.metadata.add_chunks,
                [c for _, c, _ in chunks],
                producer_states,
                aborted,
                fence,
            )
            for part, _, _ in snapshot:
                if (part.topic, part.partition) in fenced:
                    self._unload(part, _FENCED)
            chunks = [c for c in chunks if (c[1].topic, c[1].partition) not in fenced]
        for part, chunk, count in chunks:
            part.chunks.append(chunk)
            part.chunk_bases.append(chunk.base_offset)
            del part.tail[:count]
            self.unflushed_bytes -= chunk.byte_end - chunk.byte_start
            if self.cluster:  # acknowledged now: in the object store and the index
                part.high_watermark = max(part.high_watermark, chunk.end_offset)
        if self.cluster and chunks:
            self._data_arrived.set()
        for part, _, states in snapshot:  # saved, unless they changed since the roll
            for pid, state in states.items():
                if pid in part.producers and part.producers[pid].to_json() == state:
                    part.dirty_producers.discard(pid)
        self._cache_object(key, data)
        for path in closed:
            path.unlink(missing_ok=True)
        self.segments_written += 1
        self._flush_done.set()

    def _snapshot(self) -> list[tuple[PartitionLog, list[TailBatch], dict[int, dict[str, object]]]]:
        """Each partition's tail and the state of its changed producers, at the WAL roll point."""
        return [
            (
                part,
                list(part.tail),
                {
                    pid: part.producers[pid].to_json()
                    for pid in part.dirty_producers
                    if pid in part.producers
                },
            )
            for part in self.partitions.values()
            if part.tail
        ]


def _record_timestamps(batch: records.Buffer) -> list[tuple[int, int]]:
    """(offset, timestamp) of each record of a batch; LogAppendTime gives each the batch's."""
    header, decoded = records.decode_batch(batch)
    if header.attributes & ATTR_LOG_APPEND_TIME:
        return [(r.offset, header.max_timestamp) for r in decoded]
    return [(r.offset, r.timestamp) for r in decoded]


async def _wait_event(event: asyncio.Event, timeout: float) -> None:  # noqa: ASYNC109 (asyncio.timeout/wait_for cancellation can hang on 3.11)
    """Wait for ``event`` at most ``timeout`` seconds (without asyncio.wait_for,
    whose cancellation can hang on Python 3.11)."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout)
    finally:
        if not waiter.done():
            waiter.cancel()
