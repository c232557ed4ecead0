"""The transaction coordinator's durable state, in the broker's metadata database.

Why in the metadata store and not a ``__transaction_state`` topic as Kafka has: the store is
already the broker's transactional database, so a state change and the move of a committed
transaction's offsets into the group's offsets are one SQL transaction, and a broker killed
at any point restarts with every transaction either open, decided (``Prepare*``, which the
coordinator completes before it serves), or complete: never half-visible.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.storage.metadata import MetadataStore, SlotFence

EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"

_COLUMNS = (
    "transactional_id",
    "producer_id",
    "producer_epoch",
    "state",
    "timeout_ms",
    "start_ms",
    "partitions",
    "groups",
    "update_ms",
)
_UPSERT = (
    f"INSERT INTO transactions ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)}) "
    "ON CONFLICT (transactional_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS[1:])
)
_UPSERT_GROUP_OFFSET = (
    "INSERT INTO group_offsets (group_id, topic, partition, committed_offset, leader_epoch, "
    "metadata, commit_ms) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (group_id, topic, partition) "
    "DO UPDATE SET committed_offset = excluded.committed_offset, "
    "leader_epoch = excluded.leader_epoch, metadata = excluded.metadata, "
    "commit_ms = excluded.commit_ms"
)
_UPSERT_TXN_OFFSET = (
    "INSERT INTO txn_offsets VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (transactional_id, group_id, topic, partition) DO UPDATE SET "
    "committed_offset = excluded.committed_offset, leader_epoch = excluded.leader_epoch, "
    "metadata = excluded.metadata"
)

Offset = tuple[str, int, int, int, str | None]  # topic, partition, offset, leader epoch, metadata


@dataclass
class TxnRecord:
    """One transactional id's state (Kafka's TransactionMetadata)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str = EMPTY
    timeout_ms: int = 60_000
    start_ms: int = -1
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)

    def row(self) -> tuple[object, ...]:
        return (
            self.transactional_id,
            self.producer_id,
            self.producer_epoch,
            self.state,
            self.timeout_ms,
            self.start_ms,
            json.dumps(sorted(self.partitions)),
            json.dumps(sorted(self.groups)),
            int(time.time() * 1000),
        )


class TransactionStore:
    """The SQL of the coordinator; each method one short database transaction (blocking:
    the coordinator calls them from a thread)."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.db = metadata.db
        self.metadata = metadata

    def load(self, transactional_id: str | None = None) -> list[TxnRecord]:
        """Every transactional id's record, or the one named (cluster mode: a broker that
        is not its coordinator reads it fresh, ``TransactionCoordinator.refresh_foreign``)."""
        where, params = (
            (" WHERE transactional_id = ?", (transactional_id,))
            if transactional_id is not None
            else ("", ())
        )
        return [
            TxnRecord(
                tid,
                pid,
                epoch,
                state,
                timeout,
                start,
                {(t, p) for t, p in json.loads(parts)},
                set(json.loads(groups)),
            )
            for tid, pid, epoch, state, timeout, start, parts, groups in self.db.query(
                "SELECT transactional_id, producer_id, producer_epoch, state, timeout_ms, "
                "start_ms, partitions, groups FROM transactions" + where,
                params,
            )
        ]

    def save(self, record: TxnRecord, fence: SlotFence | None = None) -> None:
        """``fence`` (cluster mode): the transactional id's coordinator slot, checked in the
        same transaction (``CoordinatorFencedError``: nothing written)."""
        with self.db.transaction():
            self.metadata.check_slot(fence)
            self.db.execute(_UPSERT, record.row())

    def add_offsets(
        self,
        transactional_id: str,
        group_id: str,
        offsets: Sequence[Offset],
        fence: SlotFence | None = None,
    ) -> None:
        """A TxnOffsetCommit's pending offsets; ``fence`` (cluster mode): the group's coordinator
        slot, as for a plain offset commit (``MetadataStore.commit_offsets``)."""
        with self.db.transaction():
            self.metadata.check_slot(fence)
            self.db.executemany(
                _UPSERT_TXN_OFFSET,
                [(transactional_id, group_id, t, p, o, e, m) for t, p, o, e, m in offsets],
            )

    def complete(self, record: TxnRecord, commit: bool, fence: SlotFence | None = None) -> None:
        """Save the completed state; on commit the transaction's offsets become the groups'.
        ``fence`` as for ``save``."""
        now = int(time.time() * 1000)
        with self.db.transaction():
            self.metadata.check_slot(fence)
            if commit:
                rows = self.db.query(
                    "SELECT group_id, topic, partition, committed_offset, leader_epoch, metadata "
                    "FROM txn_offsets WHERE transactional_id = ?",
                    (record.transactional_id,),
                )
                self.db.executemany(_UPSERT_GROUP_OFFSET, [(*r, now) for r in rows])
            self.db.execute(
                "DELETE FROM txn_offsets WHERE transactional_id = ?", (record.transactional_id,)
            )
            self.db.execute(_UPSERT, record.row())

    def pending_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """Partitions of the group with offsets in an open transaction."""
        return {
            (t, p)
            for t, p in self.db.query(
                "SELECT topic, partition FROM txn_offsets WHERE group_id = ?", (group_id,)
            )
        }
