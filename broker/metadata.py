"""The broker's metadata in SQLite: topics, configs, the segment index, group
offsets and producer state.

The segment index maps (topic, partition, offset range) to (object key, byte
range) with a packed per-batch index, so a reader can find the exact byte
position of any offset and the broker can answer "last offset appended before
T" without opening objects.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    topic_id TEXT NOT NULL,
    partitions INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS topic_configs (
    topic TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (topic, key)
);
CREATE TABLE IF NOT EXISTS chunks (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    base_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    object_key TEXT NOT NULL,
    byte_start INTEGER NOT NULL,
    byte_end INTEGER NOT NULL,
    min_append_ms INTEGER NOT NULL,
    max_append_ms INTEGER NOT NULL,
    batch_index BLOB NOT NULL,
    PRIMARY KEY (topic, partition, base_offset)
);
CREATE INDEX IF NOT EXISTS chunks_by_object ON chunks (object_key);
CREATE TABLE IF NOT EXISTS partition_state (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    log_start_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset INTEGER NOT NULL,
    leader_epoch INTEGER NOT NULL,
    metadata TEXT,
    commit_ms INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
CREATE TABLE IF NOT EXISTS producer_state (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    producer_id INTEGER NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (topic, partition, producer_id)
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""

# One batch inside a chunk: base offset, byte position within the chunk, size,
# broker append time, producer max timestamp.
BATCH_INDEX_ENTRY = struct.Struct(">qIIqq")


@dataclass(frozen=True, slots=True)
class BatchRef:
    base_offset: int
    position: int
    size: int
    append_ms: int
    max_timestamp: int


@dataclass(frozen=True)
class Chunk:
    """A contiguous run of one partition's batches inside one segment object."""

    topic: str
    partition: int
    base_offset: int
    end_offset: int
    object_key: str
    byte_start: int
    byte_end: int
    min_append_ms: int
    max_append_ms: int
    batch_index: bytes

    def batches(self) -> Iterator[BatchRef]:
        return iter(self.refs)

    @cached_property
    def refs(self) -> list[BatchRef]:
        """The unpacked batch index, once per chunk (fetches look it up often)."""
        return [BatchRef(*fields) for fields in BATCH_INDEX_ENTRY.iter_unpack(self.batch_index)]

    @cached_property
    def ref_bases(self) -> list[int]:
        return [ref.base_offset for ref in self.refs]


def pack_batch_index(batches: Iterable[BatchRef]) -> bytes:
    return b"".join(
        BATCH_INDEX_ENTRY.pack(b.base_offset, b.position, b.size, b.append_ms, b.max_timestamp)
        for b in batches
    )


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str]


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None


class MetadataStore:
    """SQLite access; every method is one short transaction."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------ topics

    def topics(self) -> list[TopicRecord]:
        configs: dict[str, dict[str, str]] = {}
        for topic, key, value in self.db.execute("SELECT topic, key, value FROM topic_configs"):
            configs.setdefault(topic, {})[key] = value
        return [
            TopicRecord(name, uuid.UUID(topic_id), partitions, configs.get(name, {}))
            for name, topic_id, partitions in self.db.execute(
                "SELECT name, topic_id, partitions FROM topics ORDER BY name"
            )
        ]

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicRecord:
        topic_id = uuid.uuid4()
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(
                "INSERT INTO topics VALUES (?, ?, ?, ?)", (name, str(topic_id), partitions, _now_ms())
            )
            self.db.executemany(
                "INSERT INTO topic_configs VALUES (?, ?, ?)", [(name, k, v) for k, v in configs.items()]
            )
        return TopicRecord(name, topic_id, partitions, dict(configs))

    def add_partitions(self, name: str, partitions: int) -> None:
        self.db.execute("UPDATE topics SET partitions = ? WHERE name = ?", (partitions, name))

    def delete_topic(self, name: str) -> list[str]:
        """Forget a topic; returns the object keys no other chunk refers to any more."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            keys = [k for (k,) in self.db.execute("SELECT DISTINCT object_key FROM chunks WHERE topic = ?", (name,))]
            for table in ("topic_configs", "chunks", "partition_state", "producer_state"):
                self.db.execute(f"DELETE FROM {table} WHERE topic = ?", (name,))
            self.db.execute("DELETE FROM group_offsets WHERE topic = ?", (name,))
            self.db.execute("DELETE FROM topics WHERE name = ?", (name,))
            unreferenced = [
                k for k in keys
                if self.db.execute("SELECT 1 FROM chunks WHERE object_key = ? LIMIT 1", (k,)).fetchone() is None
            ]
        return unreferenced

    def set_configs(self, name: str, configs: dict[str, str]) -> None:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("DELETE FROM topic_configs WHERE topic = ?", (name,))
            self.db.executemany(
                "INSERT INTO topic_configs VALUES (?, ?, ?)", [(name, k, v) for k, v in configs.items()]
            )

    # ------------------------------------------------------------ segment index

    def add_chunks(self, chunks: list[Chunk], producer_states: dict[tuple[str, int, int], dict[str, object]]) -> None:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.executemany(
                "INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (c.topic, c.partition, c.base_offset, c.end_offset, c.object_key, c.byte_start,
                     c.byte_end, c.min_append_ms, c.max_append_ms, c.batch_index)
                    for c in chunks
                ],
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO producer_state VALUES (?, ?, ?, ?)",
                [(t, p, pid, json.dumps(state)) for (t, p, pid), state in producer_states.items()],
            )

    def chunks(self, topic: str, partition: int) -> list[Chunk]:
        return [
            Chunk(*row)
            for row in self.db.execute(
                "SELECT * FROM chunks WHERE topic = ? AND partition = ? ORDER BY base_offset", (topic, partition)
            )
        ]

    def producer_states(self) -> dict[tuple[str, int, int], dict[str, object]]:
        return {
            (t, p, pid): json.loads(state)
            for t, p, pid, state in self.db.execute("SELECT topic, partition, producer_id, state FROM producer_state")
        }

    def drop_chunks_before(self, topic: str, partition: int, offset: int) -> list[str]:
        """Segment retention: forget the partition's chunks below ``offset`` and make
        ``offset`` its log start, in one transaction; returns the object keys that no
        chunk refers to any more. The caller deletes those objects only after this
        commits, so the index never points at a deleted object, whatever crashes when."""
        where = "topic = ? AND partition = ? AND end_offset <= ?"
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            keys = [k for (k,) in self.db.execute(f"SELECT DISTINCT object_key FROM chunks WHERE {where}",
                                                  (topic, partition, offset))]
            self.db.execute(f"DELETE FROM chunks WHERE {where}", (topic, partition, offset))
            self.db.execute("INSERT OR REPLACE INTO partition_state VALUES (?, ?, ?)", (topic, partition, offset))
            unreferenced = [
                k for k in keys
                if self.db.execute("SELECT 1 FROM chunks WHERE object_key = ? LIMIT 1", (k,)).fetchone() is None
            ]
        return unreferenced

    def object_keys(self) -> set[str]:
        """Every object some chunk refers to (the orphan sweep keeps these)."""
        return {k for (k,) in self.db.execute("SELECT DISTINCT object_key FROM chunks")}

    def log_start_offsets(self) -> dict[tuple[str, int], int]:
        return {(t, p): o for t, p, o in self.db.execute("SELECT * FROM partition_state")}

    # ------------------------------------------------------------ groups

    def commit_offsets(self, group_id: str, offsets: list[tuple[str, int, int, int, str | None]]) -> None:
        now = _now_ms()
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.executemany(
                "INSERT OR REPLACE INTO group_offsets VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(group_id, t, p, o, e, m, now) for t, p, o, e, m in offsets],
            )

    def committed_offsets(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        return {
            (t, p): CommittedOffset(o, e, m)
            for t, p, o, e, m in self.db.execute(
                "SELECT topic, partition, committed_offset, leader_epoch, metadata FROM group_offsets "
                "WHERE group_id = ?",
                (group_id,),
            )
        }

    def groups_with_offsets(self) -> list[str]:
        return [g for (g,) in self.db.execute("SELECT DISTINCT group_id FROM group_offsets")]

    def delete_group_offsets(self, group_id: str) -> None:
        self.db.execute("DELETE FROM group_offsets WHERE group_id = ?", (group_id,))

    # ------------------------------------------------------------ counters

    def next_producer_id(self) -> int:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute("SELECT value FROM counters WHERE name = 'producer_id'").fetchone()
            value = (row[0] if row else 999) + 1
            self.db.execute("INSERT OR REPLACE INTO counters VALUES ('producer_id', ?)", (value,))
        return value


def _now_ms() -> int:
    return int(time.time() * 1000)
