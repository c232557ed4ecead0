"""A read-only view of a partition as the segment index holds it, for partitions this
broker does not lead.

In cluster mode (metadata in Postgres) a broker's ``LogStore`` holds only the partitions
it leads, yet the admin API (commit rounds, Airflow) and the schema registry's readers
must see every partition from any broker. They can, without asking the leader: a
cluster-mode broker acknowledges a batch only once its chunk is in the Postgres index
(``LogStore.flush`` then ``MetadataStore.add_chunks``), so the index *is* the
acknowledged log. A view is a ``PartitionLog`` with no tail, built from the partition's
chunks, log start, aborted transactions and open transactions (producer states), all read
in one snapshot so they agree; its high watermark and flushed offset are both the end of
its last chunk. Being a ``PartitionLog``, it goes through the same code as a led
partition: the admin API's planning (``end_offset_before``, ``ranges_for``) and
``LogStore.read`` for the bytes.

Blocking SQL: call these in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import json
from typing import Any

from broker.storage.logstore import PartitionLog, ProducerState
from broker.storage.metadata import Chunk, MetadataStore, _chunk

_COLUMNS = (
    "SELECT topic, partition, base_offset, end_offset, object_key, byte_start, byte_end, "
    "min_append_ms, max_append_ms, batch_index FROM chunks "
)
_CHUNKS = _COLUMNS + "WHERE topic = ? AND partition = ? ORDER BY base_offset"
_CHUNKS_BETWEEN = (
    _COLUMNS + "WHERE topic = ? AND partition = ? AND end_offset > ? AND base_offset < ? "
    "ORDER BY base_offset"
)
_LOG_START = "SELECT log_start_offset FROM partition_state WHERE topic = ? AND partition = ?"
_ABORTED = (
    "SELECT producer_id, first_offset, last_offset FROM aborted_txns "
    "WHERE topic = ? AND partition = ? ORDER BY last_offset"
)
_PRODUCERS = "SELECT producer_id, state FROM producer_state WHERE topic = ? AND partition = ?"
_END = "SELECT max(end_offset) FROM chunks WHERE topic = ? AND partition = ?"


def partition_view(
    metadata: MetadataStore, topic: str, partition: int, between: tuple[int, int] | None = None
) -> PartitionLog:
    """The partition as the index holds it: every acknowledged batch (in cluster mode).
    ``between`` (start, end): only the chunks holding offsets in [start, end), what the byte
    ranges of those offsets need (a partition of many small segments has many chunks)."""
    db = metadata.db
    key = (topic, partition)
    if db.postgres:
        # one snapshot: the chunks and the producer states committed with them agree
        with db.transaction():
            db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            rows = _read(metadata, key, between)
    else:
        rows = _read(metadata, key, between)
    chunks, log_start, aborted, producers = rows
    part = PartitionLog(topic, partition, chunks, log_start)
    for pid, state in producers:
        part.producers[int(pid)] = ProducerState.from_json(json.loads(state))
    part.load_transactions([(int(p), int(f), int(last)) for p, f, last in aborted])
    return part


def _read(
    metadata: MetadataStore, key: tuple[str, int], between: tuple[int, int] | None
) -> tuple[list[Chunk], int, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    db = metadata.db
    chunks = [
        _chunk(row)
        for row in (
            db.query(_CHUNKS, key)
            if between is None
            else db.query(_CHUNKS_BETWEEN, (*key, *between))
        )
    ]
    start = db.query(_LOG_START, key)
    log_start = int(start[0][0]) if start else 0
    return chunks, log_start, db.query(_ABORTED, key), db.query(_PRODUCERS, key)


def end_offset(metadata: MetadataStore, topic: str, partition: int) -> int:
    """The partition's indexed end (its high watermark as any broker sees it): one cheap query,
    what a reader polls before it reads the view."""
    db = metadata.db
    key = (topic, partition)
    [(end,)] = db.query(_END, key)
    if end is not None:
        return int(end)
    start = db.query(_LOG_START, key)
    return int(start[0][0]) if start else 0
