"""The transaction coordinator (KIP-98): transactional ids, epochs and fencing, the
partitions and groups of each open transaction, commit/abort markers, timeouts.

Kafka's state machine, on one node: InitProducerId bumps the epoch of a transactional
id (aborting its open transaction first, with markers of the new epoch, so a zombie's
late writes are fenced); AddPartitionsToTxn / AddOffsetsToTxn move it to ``Ongoing``;
EndTxn records the decision (``PrepareCommit``/``PrepareAbort``) durably, writes a
marker into every partition of the transaction, waits for the WAL, then completes:
the transaction's offsets (TxnOffsetCommit) become the groups' in the same database
transaction. A broker restarted after kill -9 completes every decided transaction
before it serves (``recover``); open ones stay open until their producer ends them or
``transaction.timeout.ms`` runs out, when the coordinator aborts them with a bumped
epoch, as Kafka does.

In a cluster (Postgres metadata) each broker coordinates the transactional ids of the
``__transaction_state`` slots it holds (``take_slot`` reads their records fresh from Postgres
and completes the decided ones, as a restart would); markers for partitions other brokers
lead go to them as WriteTxnMarkers (``remote_markers``), and a leader or group coordinator
that is not the transaction's coordinator checks a transactional produce or TxnOffsetCommit
against the record the coordinator saved in Postgres (``refresh_foreign``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

from kio.schema.errors import ErrorCode

from broker.storage.logstore import LogStore, PartitionLog, ProduceError
from broker.storage.metadata import CoordinatorFencedError, MetadataStore, SlotFence
from broker.storage.txn_metadata import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    Offset,
    TransactionStore,
    TxnRecord,
)

log = logging.getLogger(__name__)

# cluster mode: (producer id, epoch, commit, partitions led elsewhere) -> the markers written
# there (broker.kafka.peer.MarkerSender); raises TimeoutError when a leader cannot be reached
RemoteMarkers = Callable[[int, int, bool, list[tuple[str, int]]], Awaitable[None]]

T = TypeVar("T")

MAX_EPOCH = 32767 - 1  # Short.MAX_VALUE - 1: past it, a new producer id (KIP-360)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _unless_fenced(transactional_id: str, call: Awaitable[T], fenced: T) -> T:
    """``call``'s answer, or ``fenced`` (NOT_COORDINATOR) when the transactional id's slot moved
    to another broker meanwhile (``CoordinatorFencedError``): the client finds the new
    coordinator and asks again."""
    try:
        return await call
    except CoordinatorFencedError as exc:
        log.info("transaction %s: %s", transactional_id, exc)
        return fenced


class TransactionCoordinator:
    def __init__(
        self,
        metadata: MetadataStore,
        logs: LogStore,
        max_timeout_ms: int = 900_000,
        cleanup_interval_ms: int = 10_000,
    ) -> None:
        self.metadata = metadata
        self.store = TransactionStore(metadata)
        self.logs = logs
        self.max_timeout_ms = max_timeout_ms
        self.cleanup_interval_ms = cleanup_interval_ms
        self.txns: dict[str, TxnRecord] = {}
        # Cluster mode (set by the app): which transactional ids this broker coordinates (the
        # leader of their __transaction_state slot), whether a partition exists anywhere in the
        # cluster, and how markers reach partitions other brokers lead (WriteTxnMarkers).
        self.coordinates: Callable[[str], bool] = lambda transactional_id: True
        self.partition_exists: Callable[[tuple[str, int]], bool] | None = None
        self.remote_markers: RemoteMarkers | None = None
        # cluster mode: the coordinator slot lease a transactional id's state writes are fenced
        # by (its slot, this node, the epoch held); None: no fence (one broker)
        self.slot_fence: Callable[[str], SlotFence | None] = lambda transactional_id: None
        # records of transactions coordinated elsewhere, read fresh from Postgres for a
        # transactional produce or TxnOffsetCommit this broker serves as leader / group coordinator
        self.foreign: dict[str, TxnRecord] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._expirer: asyncio.Task[None] | None = None
        self.timed_out = 0  # transactions the coordinator aborted on their timeout

    async def _save(self, record: TxnRecord) -> None:
        """Save a record, fenced by its coordinator slot's lease (cluster mode): raises
        ``CoordinatorFencedError`` when this broker lost the slot, nothing written."""
        await asyncio.to_thread(self.store.save, record, self.slot_fence(record.transactional_id))

    def _lock(self, transactional_id: str) -> asyncio.Lock:
        return self._locks.setdefault(transactional_id, asyncio.Lock())

    # ------------------------------------------------------------ lifecycle

    async def recover(self) -> None:
        """Load every transactional id; complete the transactions decided before a crash."""
        for record in await asyncio.to_thread(self.store.load):
            self.txns[record.transactional_id] = record
        for record in list(self.txns.values()):
            if record.state in (PREPARE_COMMIT, PREPARE_ABORT):
                commit = record.state == PREPARE_COMMIT
                log.info(
                    "completing the %s of transaction %s decided before the restart",
                    "commit" if commit else "abort",
                    record.transactional_id,
                )
                await self._write_markers_and_complete(record, commit)

    async def take_slot(self, slot: int) -> None:
        """Cluster mode: this broker now coordinates the transactional ids of a
        ``__transaction_state`` slot. Their records are read again from Postgres (the previous
        coordinator changed them), and the transactions decided but not completed there are
        completed here (as ``recover`` does after a restart)."""
        from broker.ownership import coordinator_slot

        records = [
            r
            for r in await asyncio.to_thread(self.store.load)
            if coordinator_slot(r.transactional_id) == slot
        ]
        for record in records:
            self.txns[record.transactional_id] = record
        for record in records:
            if record.state in (PREPARE_COMMIT, PREPARE_ABORT):
                async with self._lock(record.transactional_id):
                    if record.state in (PREPARE_COMMIT, PREPARE_ABORT):
                        await self._write_markers_and_complete(
                            record, record.state == PREPARE_COMMIT
                        )

    def drop_slot(self, slot: int) -> None:
        """Cluster mode: another broker coordinates this slot's transactional ids now."""
        from broker.ownership import coordinator_slot

        for tid in [t for t in self.txns if coordinator_slot(t) == slot]:
            del self.txns[tid]

    async def refresh_foreign(self, transactional_id: str) -> None:
        """Cluster mode, before a transactional produce or TxnOffsetCommit on a broker that
        does not coordinate ``transactional_id``: its record as the coordinator last saved it
        (the coordinator saves before it answers AddPartitionsToTxn / AddOffsetsToTxn)."""
        if self.coordinates(transactional_id):
            return
        found = await asyncio.to_thread(self.store.load, transactional_id)
        if found:
            self.foreign[transactional_id] = found[0]
        else:
            self.foreign.pop(transactional_id, None)

    def _record(self, transactional_id: str) -> TxnRecord | None:
        if self.coordinates(transactional_id):
            return self.txns.get(transactional_id)
        return self.foreign.get(transactional_id)

    def start(self) -> None:
        self._expirer = asyncio.create_task(self._expire_loop(), name="transaction-timeouts")

    async def close(self) -> None:
        if self._expirer is not None:
            self._expirer.cancel()
            await asyncio.gather(self._expirer, return_exceptions=True)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cleanup_interval_ms / 1000)
            try:
                await self.abort_timed_out()
            except Exception:  # logged; the next pass tries again
                log.exception("aborting timed-out transactions failed")

    async def abort_hanging(self) -> None:
        """Open transactions in a partition that no transaction of the coordinator covers (a
        batch that got in as its transaction ended) would hold the partition's LSO forever:
        they get an abort marker, as ``kafka-transactions.sh abort`` would write."""
        # cluster mode: transactions coordinated elsewhere cover partitions led here too
        known = (
            list(self.txns.values())
            if self.partition_exists is None
            else await asyncio.to_thread(self.store.load)
        )
        covered = {
            (r.producer_id, tp)
            for r in known
            if r.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT)
            for tp in r.partitions
        }
        seq = -1
        for key, part in list(self.logs.partitions.items()):
            for pid in list(part.ongoing):
                if (pid, key) in covered:
                    continue
                log.warning("%s-%d: aborting the hanging transaction of producer %d", *key, pid)
                epoch = part.producers[pid].epoch if pid in part.producers else 0
                try:
                    seq = max(seq, self.logs.append_marker(part, pid, epoch, commit=False))
                except ProduceError:  # cluster mode: unloaded meanwhile; its leader sees to it
                    continue
        if seq >= 0:
            await self.logs.wal.wait_durable(seq)

    async def complete_decided(self) -> None:
        """Complete the transactions decided here (PREPARE_COMMIT / PREPARE_ABORT) whose
        markers could not be written then (the WAL could not write: a full disk), as
        ``recover`` does after a restart: once the WAL can write again, without one. Their
        producers get CONCURRENT_TRANSACTIONS meanwhile and retry. A decision being
        completed right now holds its lock: left to that."""
        for record in list(self.txns.values()):
            tid = record.transactional_id
            if record.state not in (PREPARE_COMMIT, PREPARE_ABORT) or not self.coordinates(tid):
                continue
            if self._lock(tid).locked() or self.logs.wal.failure is not None:
                continue
            async with self._lock(tid):
                if record.state in (PREPARE_COMMIT, PREPARE_ABORT):
                    await _unless_fenced(
                        tid,
                        self._write_markers_and_complete(record, record.state == PREPARE_COMMIT),
                        ErrorCode.not_coordinator,
                    )

    async def abort_timed_out(self) -> None:
        await self.complete_decided()
        await self.abort_hanging()
        now = _now_ms()
        for record in list(self.txns.values()):
            if record.state != ONGOING or record.start_ms + record.timeout_ms > now:
                continue
            async with self._lock(record.transactional_id):
                if record.state != ONGOING or record.start_ms + record.timeout_ms > _now_ms():
                    continue
                log.info(
                    "transaction %s (producer %d epoch %d) timed out after %d ms: aborting",
                    record.transactional_id,
                    record.producer_id,
                    record.producer_epoch,
                    record.timeout_ms,
                )
                self.timed_out += 1
                # the epoch is bumped first: the producer is fenced, its late writes refused
                self._bump_epoch(record)
                try:
                    await self._end(record, commit=False)
                except CoordinatorFencedError as exc:  # the slot moved: its new coordinator
                    log.info("transaction %s: %s", record.transactional_id, exc)

    # ------------------------------------------------------------ the APIs

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int
    ) -> tuple[int, int, int]:
        return await _unless_fenced(
            transactional_id,
            self._init_producer_id(transactional_id, timeout_ms, producer_id, producer_epoch),
            (ErrorCode.not_coordinator, -1, -1),
        )

    async def _init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int
    ) -> tuple[int, int, int]:
        """(error, producer id, epoch) for InitProducerId with a transactional id."""
        if timeout_ms <= 0 or timeout_ms > self.max_timeout_ms:
            return ErrorCode.invalid_transaction_timeout, -1, -1
        async with self._lock(transactional_id):
            record = self.txns.get(transactional_id)
            if record is None:
                pid = await asyncio.to_thread(self.metadata.next_producer_id)
                record = TxnRecord(transactional_id, pid, 0, EMPTY, timeout_ms)
                await self._save(record)
                self.txns[transactional_id] = record
                return ErrorCode.none, pid, 0
            if producer_id >= 0 and (
                producer_id != record.producer_id or producer_epoch != record.producer_epoch
            ):
                return ErrorCode.producer_fenced, -1, -1
            if record.state in (PREPARE_COMMIT, PREPARE_ABORT):
                return ErrorCode.concurrent_transactions, -1, -1
            self._bump_epoch(record)
            if record.state == ONGOING:  # fence the previous producer: abort with the new epoch
                await self._end(record, commit=False)
            if record.producer_epoch >= MAX_EPOCH:  # epochs used up: a new producer id (KIP-360)
                record.producer_id = await asyncio.to_thread(self.metadata.next_producer_id)
                record.producer_epoch = 0
            record.timeout_ms = timeout_ms
            await self._save(record)
            return ErrorCode.none, record.producer_id, record.producer_epoch

    def _bump_epoch(self, record: TxnRecord) -> None:
        record.producer_epoch = min(record.producer_epoch + 1, MAX_EPOCH)

    def _check(self, transactional_id: str, producer_id: int, producer_epoch: int) -> int:
        record = self._record(transactional_id)
        if record is None or record.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if producer_epoch != record.producer_epoch:
            return ErrorCode.producer_fenced
        if record.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return ErrorCode.concurrent_transactions
        return ErrorCode.none

    def _begin(self, record: TxnRecord) -> None:
        if record.state != ONGOING:
            record.state = ONGOING
            record.start_ms = _now_ms()
            record.partitions.clear()
            record.groups.clear()

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[tuple[str, int]],
        verify_only: bool = False,
    ) -> dict[tuple[str, int], int]:
        """The error of each partition (all the same unless some are unknown)."""
        return await _unless_fenced(
            transactional_id,
            self._add_partitions(
                transactional_id, producer_id, producer_epoch, partitions, verify_only
            ),
            dict.fromkeys(partitions, ErrorCode.not_coordinator),
        )

    async def _add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[tuple[str, int]],
        verify_only: bool = False,
    ) -> dict[tuple[str, int], int]:
        """The error of each partition (all the same unless some are unknown)."""
        async with self._lock(transactional_id):
            error = self._check(transactional_id, producer_id, producer_epoch)
            exists = self.partition_exists or (lambda tp: tp in self.logs.partitions)
            unknown = [tp for tp in partitions if not exists(tp)]
            if error == ErrorCode.none and unknown:
                return {
                    tp: ErrorCode.unknown_topic_or_partition
                    if tp in unknown
                    else ErrorCode.operation_not_attempted
                    for tp in partitions
                }
            if error != ErrorCode.none:
                return dict.fromkeys(partitions, error)
            record = self.txns[transactional_id]
            if verify_only:
                return {
                    tp: ErrorCode.none
                    if record.state == ONGOING and tp in record.partitions
                    else ErrorCode.invalid_txn_state
                    for tp in partitions
                }
            if not (record.state == ONGOING and record.partitions.issuperset(partitions)):
                self._begin(record)
                record.partitions.update(partitions)
                await self._save(record)
            return dict.fromkeys(partitions, ErrorCode.none)

    async def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> int:
        return await _unless_fenced(
            transactional_id,
            self._add_offsets(transactional_id, producer_id, producer_epoch, group_id),
            ErrorCode.not_coordinator,
        )

    async def _add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> int:
        async with self._lock(transactional_id):
            error = self._check(transactional_id, producer_id, producer_epoch)
            if error != ErrorCode.none:
                return error
            record = self.txns[transactional_id]
            if not (record.state == ONGOING and group_id in record.groups):
                self._begin(record)
                record.groups.add(group_id)
                await self._save(record)
            return ErrorCode.none

    async def txn_offset_commit(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        offsets: Sequence[Offset],
        group_fence: SlotFence | None = None,
    ) -> int:
        """Offsets that the group sees once the transaction commits. ``group_fence`` (cluster
        mode): the group coordinator's slot lease; lost, the offsets are refused with
        NOT_COORDINATOR (nothing written) and the client asks the group's new coordinator."""
        async with self._lock(transactional_id):
            error = self._check(transactional_id, producer_id, producer_epoch)
            if error != ErrorCode.none:
                return error
            record = self._record(transactional_id)
            assert record is not None  # _check found it
            if record.state != ONGOING or group_id not in record.groups:
                return ErrorCode.invalid_txn_state  # AddOffsetsToTxn first
            if offsets:
                try:
                    await asyncio.to_thread(
                        self.store.add_offsets, transactional_id, group_id, offsets, group_fence
                    )
                except CoordinatorFencedError as exc:
                    log.info(
                        "TxnOffsetCommit of %s for group %s: %s", transactional_id, group_id, exc
                    )
                    return ErrorCode.not_coordinator
            return ErrorCode.none

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> int:
        return await _unless_fenced(
            transactional_id,
            self._end_txn(transactional_id, producer_id, producer_epoch, commit),
            ErrorCode.not_coordinator,
        )

    async def _end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> int:
        async with self._lock(transactional_id):
            record = self.txns.get(transactional_id)
            if record is None or record.producer_id != producer_id:
                return ErrorCode.invalid_producer_id_mapping
            if producer_epoch != record.producer_epoch:
                return ErrorCode.producer_fenced
            if record.state == ONGOING:
                return await self._end(record, commit)
            if record.state == COMPLETE_COMMIT and commit:
                return ErrorCode.none  # a retry of the commit that completed
            if record.state == COMPLETE_ABORT and not commit:
                return ErrorCode.none
            if record.state in (PREPARE_COMMIT, PREPARE_ABORT):
                return ErrorCode.concurrent_transactions
            return ErrorCode.invalid_txn_state

    async def _end(self, record: TxnRecord, commit: bool) -> int:
        record.state = PREPARE_COMMIT if commit else PREPARE_ABORT
        await self._save(record)  # the decision is durable first
        return await self._write_markers_and_complete(record, commit)

    async def _write_markers_and_complete(self, record: TxnRecord, commit: bool) -> int:
        """Every partition of the transaction gets its marker, then the transaction completes.
        Cluster mode: a marker written here counts only once acknowledged (``ack_error``): a
        partition unloaded before the flush indexed it (a lease lost, a hand-over) resolves
        the wait without it, and its marker goes to the new leader as WriteTxnMarkers like
        any partition led elsewhere; completing without it would leave the transaction
        committed in some partitions and open (later aborted) in that one."""
        seq = 0
        elsewhere = []  # cluster mode: partitions other brokers lead
        local: list[tuple[PartitionLog, int]] = []  # markers written here: (log, end offset)
        try:
            for topic, partition in sorted(record.partitions):
                part = self.logs.partitions.get((topic, partition))
                if part is None:
                    if self.partition_exists is not None and self.partition_exists(
                        (topic, partition)
                    ):
                        elsewhere.append((topic, partition))
                    continue  # else deleted since: nothing to mark
                try:
                    marker = self.logs.append_marker(
                        part, record.producer_id, record.producer_epoch, commit
                    )
                except ProduceError:  # cluster mode: no longer led here
                    elsewhere.append((topic, partition))
                    continue
                seq = max(seq, marker)
                local.append((part, part.next_offset))
            await self.logs.wal.wait_durable(seq)
            for part, end in local:
                if self.logs.ack_error(part, end) is not None:
                    log.info(
                        "transaction %s: %s-%d was unloaded before its marker was indexed; "
                        "sending it to the new leader",
                        record.transactional_id,
                        part.topic,
                        part.partition,
                    )
                    elsewhere.append((part.topic, part.partition))
            if elsewhere:
                if self.remote_markers is None:  # one broker alone never unloads
                    raise TimeoutError(f"markers of {sorted(elsewhere)} were not written")
                await self.remote_markers(
                    record.producer_id, record.producer_epoch, commit, sorted(set(elsewhere))
                )
        except (OSError, TimeoutError) as exc:
            # the WAL or a leader failed: the decision stays; a restart (or the next coordinator
            # of the slot) completes it
            log.error("transaction %s: writing markers failed: %s", record.transactional_id, exc)
            return ErrorCode.kafka_storage_error
        record.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        record.partitions = set()
        record.groups = set()
        try:
            await asyncio.to_thread(
                self.store.complete, record, commit, self.slot_fence(record.transactional_id)
            )
        except CoordinatorFencedError as exc:  # the slot's new coordinator completes it
            log.info("transaction %s: %s", record.transactional_id, exc)
            return ErrorCode.not_coordinator
        return ErrorCode.none

    # ------------------------------------------------------------ for Produce and OffsetFetch

    def verify_produce(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> tuple[int, str | None]:
        """A transactional produce must come from the current epoch, into a partition of the
        open transaction (KIP-890's verification: a batch no marker would end is refused)."""
        record = self._record(transactional_id)
        if record is None or record.producer_id != producer_id:
            return (
                ErrorCode.invalid_producer_id_mapping,
                f"transactional id {transactional_id} does not have producer id {producer_id}",
            )
        if producer_epoch < record.producer_epoch:
            return (
                ErrorCode.invalid_producer_epoch,
                f"producer epoch {producer_epoch} is fenced by epoch {record.producer_epoch}",
            )
        if record.state != ONGOING or (topic, partition) not in record.partitions:
            return (
                ErrorCode.invalid_txn_state,
                f"{topic}-{partition} is not part of an open transaction of {transactional_id}",
            )
        return ErrorCode.none, None

    def pending_offsets(self, group_id: str) -> set[tuple[str, int]]:
        return self.store.pending_offsets(group_id)

    def describe(self, transactional_ids: Iterable[str]) -> list[TxnRecord | None]:
        return [self.txns.get(t) for t in transactional_ids]
