"""The broker's metadata: topics, configs, the segment index, group offsets and
producer state. In SQLite (``HOME/metadata.sqlite``) by default, or in Postgres
(``--metadata-uri postgresql://...``), so the metadata lives with the rest of a
deployment's databases instead of on the broker's disk.

The segment index maps (topic, partition, offset range) to (object key, byte
range) with a packed per-batch index, so a reader can find the exact byte
position of any offset and the broker can answer "last offset appended before
T" without opening objects.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    topic_id TEXT NOT NULL,
    partitions BIGINT NOT NULL,
    created_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS topic_configs (
    topic TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (topic, key)
);
CREATE TABLE IF NOT EXISTS chunks (
    topic TEXT NOT NULL,
    partition BIGINT NOT NULL,
    base_offset BIGINT NOT NULL,
    end_offset BIGINT NOT NULL,
    object_key TEXT NOT NULL,
    byte_start BIGINT NOT NULL,
    byte_end BIGINT NOT NULL,
    min_append_ms BIGINT NOT NULL,
    max_append_ms BIGINT NOT NULL,
    batch_index BLOB NOT NULL,
    PRIMARY KEY (topic, partition, base_offset)
);
CREATE INDEX IF NOT EXISTS chunks_by_object ON chunks (object_key);
CREATE TABLE IF NOT EXISTS partition_state (
    topic TEXT NOT NULL,
    partition BIGINT NOT NULL,
    log_start_offset BIGINT NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition BIGINT NOT NULL,
    committed_offset BIGINT NOT NULL,
    leader_epoch BIGINT NOT NULL,
    metadata TEXT,
    commit_ms BIGINT NOT NULL,
    PRIMARY KEY (group_id, topic, partition)
);
CREATE TABLE IF NOT EXISTS producer_state (
    topic TEXT NOT NULL,
    partition BIGINT NOT NULL,
    producer_id BIGINT NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (topic, partition, producer_id)
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
"""

# Transactions (KIP-98): the coordinator's state per transactional id, offsets committed in an
# open transaction (visible to the group on commit only), and each partition's aborted
# transactions whose markers are in segment objects (the rest are replayed from the WAL).
_TRANSACTIONS = """
CREATE TABLE IF NOT EXISTS transactions (
    transactional_id TEXT PRIMARY KEY,
    producer_id BIGINT NOT NULL,
    producer_epoch BIGINT NOT NULL,
    state TEXT NOT NULL,
    timeout_ms BIGINT NOT NULL,
    start_ms BIGINT NOT NULL,
    partitions TEXT NOT NULL,
    groups TEXT NOT NULL,
    update_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS txn_offsets (
    transactional_id TEXT NOT NULL,
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    partition BIGINT NOT NULL,
    committed_offset BIGINT NOT NULL,
    leader_epoch BIGINT NOT NULL,
    metadata TEXT,
    PRIMARY KEY (transactional_id, group_id, topic, partition)
);
CREATE TABLE IF NOT EXISTS aborted_txns (
    topic TEXT NOT NULL,
    partition BIGINT NOT NULL,
    producer_id BIGINT NOT NULL,
    first_offset BIGINT NOT NULL,
    last_offset BIGINT NOT NULL,
    PRIMARY KEY (topic, partition, last_offset)
);
"""

# The schema as a versioned list: a database records the number of migrations applied to it
# (table schema_version) and a broker applies the ones it lacks, each in its own transaction, at
# start. Migration 1 is the schema every database had before versions were recorded (its
# CREATE ... IF NOT EXISTS adopts such a database as it is). Add a migration; never edit one.
_BROKER_CONFIGS = """
CREATE TABLE IF NOT EXISTS broker_configs (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (scope, name)
);
"""

# SCRAM credentials (broker/security/scram.py): salt, iterations and the two derived keys per user
# and mechanism, never a password; managed with Describe/AlterUserScramCredentials.
_SCRAM_CREDENTIALS = """
CREATE TABLE IF NOT EXISTS scram_credentials (
    user_name TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    salt BLOB NOT NULL,
    stored_key BLOB NOT NULL,
    server_key BLOB NOT NULL,
    iterations BIGINT NOT NULL,
    PRIMARY KEY (user_name, mechanism)
);
"""

# ACLs (CreateAcls/DeleteAcls), one row per binding; the authorizer keeps them all in memory.
_ACLS = """
CREATE TABLE IF NOT EXISTS acls (
    resource_type INTEGER NOT NULL,
    resource_name TEXT NOT NULL,
    pattern_type INTEGER NOT NULL,
    principal TEXT NOT NULL,
    host TEXT NOT NULL,
    operation INTEGER NOT NULL,
    permission_type INTEGER NOT NULL,
    PRIMARY KEY (resource_type, resource_name, pattern_type, principal, host, operation,
                 permission_type)
);
"""

# The cluster (issue 16, Postgres; SQLite gets the tables too, unused, so both databases keep one
# migration list): the live brokers and each partition's lease. Times are the database's
# clock only (``clock_timestamp()``), never a broker's. A lease's epoch only grows: every change
# of owner bumps it, and the index commit of a flush checks it (``add_chunks(fence=...)``).
# node_id -1: never owned (a row made by ``set_preferred``); preferred_node: the owner an
# operator asked for (``icefall cluster move``). The cluster state version is the counters row
# ``cluster_state_version``: every change of topics, configs, ACLs or SCRAM credentials bumps
# it in its own transaction, so the other brokers know when to read them again. A lease is held
# by one incarnation of a node id, not the node id alone: a broker restarted with the same id
# while its old process still runs (paused, cut off) must not share its leases, so the renewal
# and the index commit's fence match the incarnation too.
_CLUSTER = """
CREATE TABLE IF NOT EXISTS cluster_brokers (
    node_id INTEGER PRIMARY KEY,
    incarnation TEXT NOT NULL,
    endpoints TEXT NOT NULL,
    rack TEXT,
    started_at TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS partition_leases (
    topic TEXT NOT NULL,
    partition BIGINT NOT NULL,
    node_id INTEGER NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    preferred_node INTEGER,
    incarnation TEXT,
    PRIMARY KEY (topic, partition)
);
CREATE INDEX IF NOT EXISTS partition_leases_by_node ON partition_leases (node_id);
INSERT INTO counters (name, value) VALUES ('cluster_state_version', 0) ON CONFLICT DO NOTHING;
"""

MIGRATIONS: tuple[str, ...] = (
    _SCHEMA,
    _TRANSACTIONS,
    _BROKER_CONFIGS,
    _SCRAM_CREDENTIALS,
    _ACLS,
    _CLUSTER,
)
_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"


def _statements(script: str, postgres: bool) -> list[str]:
    script = script.replace("BLOB", "BYTEA") if postgres else script
    return [statement for statement in script.split(";") if statement.strip()]


def migrate(connection: Any, postgres: bool) -> int:
    """Apply the migrations the database lacks; the version it is at now. ``connection`` is
    in autocommit mode (sqlite3 with ``isolation_level=None``, psycopg with ``autocommit``)."""
    connection.execute(_VERSION_TABLE)
    row = connection.execute("SELECT max(version) FROM schema_version").fetchone()
    version = int(row[0]) if row and row[0] is not None else 0
    if version > len(MIGRATIONS):
        raise SchemaTooNewError(
            f"the metadata database is at schema version {version}, newer than this "
            f"broker's {len(MIGRATIONS)}: run a broker at least as new as the one that migrated it"
        )
    for number in range(version + 1, len(MIGRATIONS) + 1):
        connection.execute("BEGIN")
        try:
            for statement in _statements(MIGRATIONS[number - 1], postgres):
                connection.execute(statement)
            connection.execute("DELETE FROM schema_version")
            connection.execute(
                "INSERT INTO schema_version (version) VALUES (%s)"
                if postgres
                else "INSERT INTO schema_version (version) VALUES (?)",
                (number,),
            )
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
    return len(MIGRATIONS)


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
    created_ms: int = 0  # when it was created (ms since the epoch); 0 where not known


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None


class _Database:
    """One connection to SQLite or Postgres behind the few calls the store makes.

    The store writes its SQL once, in the dialect both speak (``?`` placeholders,
    ``INSERT ... ON CONFLICT ... DO UPDATE``, ``RETURNING``); Postgres gets ``%s``.
    A lock makes a transaction and every single statement exclusive on the shared
    connection: the event loop and ``to_thread`` workers both use the store.
    """

    def __init__(self, connection: Any, *, postgres: bool) -> None:
        self.connection = connection
        self.postgres = postgres
        self._lock = threading.RLock()
        # Postgres: a new connection after the old one broke (the server restarted, the
        # network failed), so a cluster member resumes when the database is back
        self.reconnect: Callable[[], Any] | None = None

    def _live(self) -> Any:
        """The connection, a new one first when the last broke (the call that found it
        broken failed; this one tries again)."""
        if self.reconnect is not None and (self.connection.closed or self.connection.broken):
            self.connection = self.reconnect()
        return self.connection

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return [tuple(row) for row in self._live().execute(self._sql(sql), params).fetchall()]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        with self._lock:
            self._live().execute(self._sql(sql), params)

    def executemany(self, sql: str, rows: list[Sequence[Any]]) -> None:
        if not rows:
            return
        with self._lock:
            if self.postgres:
                with self._live().cursor() as cursor:
                    cursor.executemany(self._sql(sql), rows)
            else:
                self.connection.executemany(sql, rows)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """All or nothing; SQLite takes its write lock at the start (``BEGIN IMMEDIATE``)."""
        with self._lock:
            if self.postgres:
                with self._live().transaction():
                    yield
            else:
                with self.connection:
                    self.connection.execute("BEGIN IMMEDIATE")
                    yield

    def close(self) -> None:
        with self._lock:
            self.reconnect = None  # closed for good
            self.connection.close()


def _upsert(table: str, columns: Sequence[str], key: Sequence[str]) -> str:
    """``INSERT ... ON CONFLICT (key) DO UPDATE``: a replace that both SQLite and Postgres run."""
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)}) "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )


_CHUNK_COLUMNS = (
    "topic",
    "partition",
    "base_offset",
    "end_offset",
    "object_key",
    "byte_start",
    "byte_end",
    "min_append_ms",
    "max_append_ms",
    "batch_index",
)
_UPSERT_CHUNK = _upsert("chunks", _CHUNK_COLUMNS, ("topic", "partition", "base_offset"))
_UPSERT_PRODUCER = _upsert(
    "producer_state",
    ("topic", "partition", "producer_id", "state"),
    ("topic", "partition", "producer_id"),
)
_UPSERT_LOG_START = _upsert(
    "partition_state", ("topic", "partition", "log_start_offset"), ("topic", "partition")
)
_UPSERT_GROUP_OFFSET = _upsert(
    "group_offsets",
    ("group_id", "topic", "partition", "committed_offset", "leader_epoch", "metadata", "commit_ms"),
    ("group_id", "topic", "partition"),
)
_UPSERT_SCRAM = _upsert(
    "scram_credentials",
    ("user_name", "mechanism", "salt", "stored_key", "server_key", "iterations"),
    ("user_name", "mechanism"),
)
_ACL_COLUMNS = (
    "resource_type, resource_name, pattern_type, principal, host, operation, permission_type"
)
# 64-bit key of the Postgres advisory lock a broker holds while it migrates the schema: brokers
# of a cluster starting at once against a fresh database would otherwise race on CREATE TABLE.
POSTGRES_MIGRATION_LOCK_KEY = 0x1CEFA11


class MetadataUnavailableError(RuntimeError):
    """The metadata database cannot be used: unreachable, refused, or in use by another broker."""


class MetadataInUseError(MetadataUnavailableError):
    """Another broker already uses this database in a way this one cannot share (its node id)."""


# cluster mode: (coordinator slot topic, slot, node id, the slot's lease epoch held) a
# coordinator's state write is fenced by (``MetadataStore.check_slot``)
SlotFence = tuple[str, int, int, int]


class CoordinatorFencedError(RuntimeError):
    """A coordinator's state write refused: the coordinator slot's lease is not this broker's
    (this incarnation, the epoch it holds, unexpired) any more. The request gets
    NOT_COORDINATOR and the client finds the new coordinator."""


class FencedError(RuntimeError):
    """Cluster mode: this broker no longer holds the partition's lease at its epoch."""


class SchemaTooNewError(MetadataUnavailableError):
    """The database was migrated by a newer broker than this one."""


def _open_sqlite(path: Path) -> _Database:
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    migrate(connection, postgres=False)
    return _Database(connection, postgres=False)


# A database cut off (no answer, rather than refused) fails a call within seconds instead of
# the kernel's minutes: the flush and the heartbeat retry, and the lease rules keep it safe.
_KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}


# The shared connection serves long statements too (the orphan sweep's object list, the index
# views, transaction loads): none may hold the store's lock for ever. The heartbeat has its own
# connection (``MetadataStore.side_connection``), so it never waits behind them.
SHARED_STATEMENT_TIMEOUT_MS = 60_000


def _open_postgres(uri: str, statement_timeout_ms: int = SHARED_STATEMENT_TIMEOUT_MS) -> _Database:
    """Autocommit connection, schema migrated under an advisory lock (several brokers of a
    cluster may start at once against a fresh database; the lock is released right after).
    Several brokers share the database: who leads which partition is in ``partition_leases``
    (``broker/storage/leases.py``), and a second live broker with the same node id is refused
    there (``Leases.register``)."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    shown = _redact(uri)
    # for the reconnects too
    uri = make_conninfo(uri, **_KEEPALIVES, options=f"-c statement_timeout={statement_timeout_ms}")
    try:
        connection = psycopg.connect(uri, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise MetadataUnavailableError(
            f"cannot connect to the metadata database {shown}: {exc}"
        ) from exc
    try:
        connection.execute("SELECT pg_advisory_lock(%s)", (POSTGRES_MIGRATION_LOCK_KEY,))
        try:
            migrate(connection, postgres=True)
        finally:
            connection.execute("SELECT pg_advisory_unlock(%s)", (POSTGRES_MIGRATION_LOCK_KEY,))
    except BaseException:
        connection.close()
        raise
    db = _Database(connection, postgres=True)
    db.reconnect = lambda: psycopg.connect(uri, autocommit=True, connect_timeout=5)
    return db


def _redact(uri: str) -> str:
    """The URI without its password, for messages."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def is_postgres_uri(uri: str) -> bool:
    return uri.split(":", 1)[0] in ("postgresql", "postgres")


class MetadataStore:
    """The broker's metadata; every method is one short transaction.

    ``target``: a SQLite file path (the default, ``HOME/metadata.sqlite``: one broker) or a
    ``postgresql://`` URI (a cluster: several brokers share it; see ``_open_postgres``).
    """

    def __init__(self, target: Path | str) -> None:
        self._target = target
        self._side: list[_Database] = []
        if isinstance(target, str) and is_postgres_uri(target):
            self.db = _open_postgres(target)
        else:
            self.db = _open_sqlite(Path(target))
        # cluster mode: this broker's incarnation (``Leases.register`` sets it); the fence of
        # an index commit matches it as well as the node id and epoch
        self.incarnation: str | None = None

    def side_connection(self, statement_timeout_ms: int) -> _Database:
        """Postgres: another connection to the same database, with its own lock, for what must
        never wait behind the store's long statements (the cluster heartbeat: a lease lapses
        if it is late). Closed with the store."""
        if not isinstance(self._target, str) or not self.db.postgres:
            raise ValueError("a side connection is Postgres's (cluster mode)")
        db = _open_postgres(self._target, statement_timeout_ms)
        self._side.append(db)
        return db

    def close(self) -> None:
        for side in self._side:
            side.close()
        self.db.close()

    # ------------------------------------------------------------ topics

    def topics(self) -> list[TopicRecord]:
        configs: dict[str, dict[str, str]] = {}
        for topic, key, value in self.db.query("SELECT topic, key, value FROM topic_configs"):
            configs.setdefault(topic, {})[key] = value
        return [
            TopicRecord(name, uuid.UUID(topic_id), partitions, configs.get(name, {}), created_ms)
            for name, topic_id, partitions, created_ms in self.db.query(
                "SELECT name, topic_id, partitions, created_ms FROM topics ORDER BY name"
            )
        ]

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicRecord:
        topic_id = uuid.uuid4()
        created_ms = _now_ms()
        with self.db.transaction():
            self.db.execute(
                "INSERT INTO topics VALUES (?, ?, ?, ?)",
                (name, str(topic_id), partitions, created_ms),
            )
            self.db.executemany(
                "INSERT INTO topic_configs VALUES (?, ?, ?)",
                [(name, k, v) for k, v in configs.items()],
            )
            self._bump_state_version()
        return TopicRecord(name, topic_id, partitions, dict(configs), created_ms)

    def add_partitions(self, name: str, partitions: int) -> None:
        with self.db.transaction():
            self.db.execute("UPDATE topics SET partitions = ? WHERE name = ?", (partitions, name))
            self._bump_state_version()

    def delete_topic(self, name: str) -> list[str]:
        """Forget a topic; returns the object keys no other chunk refers to any more.

        Cluster mode: its partitions' leases are taken from their leaders in the same
        transaction (the epoch bumped, no owner, expired), so a leader that has not yet seen
        the deletion is fenced at its next index commit: its unflushed tail can never land in
        a topic created again under the same name. The rows are kept, not deleted: a lease
        epoch only grows, so a re-created topic's first lease never repeats an old epoch."""
        with self.db.transaction():
            if self.db.postgres:  # first: leases before chunks, the lock order of add_chunks
                self.db.execute(
                    "UPDATE partition_leases SET node_id = -1, epoch = epoch + 1, "
                    "expires_at = clock_timestamp(), preferred_node = NULL WHERE topic = ?",
                    (name,),
                )
            keys = [
                k
                for (k,) in self.db.query(
                    "SELECT DISTINCT object_key FROM chunks WHERE topic = ?", (name,)
                )
            ]
            for table in (
                "topic_configs",
                "chunks",
                "partition_state",
                "producer_state",
                "aborted_txns",
            ):
                self.db.execute(f"DELETE FROM {table} WHERE topic = ?", (name,))
            self.db.execute("DELETE FROM group_offsets WHERE topic = ?", (name,))
            self.db.execute("DELETE FROM topics WHERE name = ?", (name,))
            self._bump_state_version()
            unreferenced = [
                k
                for k in keys
                if not self.db.query("SELECT 1 FROM chunks WHERE object_key = ? LIMIT 1", (k,))
            ]
        return unreferenced

    def set_configs(self, name: str, configs: dict[str, str]) -> None:
        with self.db.transaction():
            self.db.execute("DELETE FROM topic_configs WHERE topic = ?", (name,))
            self.db.executemany(
                "INSERT INTO topic_configs VALUES (?, ?, ?)",
                [(name, k, v) for k, v in configs.items()],
            )
            self._bump_state_version()

    # ------------------------------------------------------------ segment index

    def add_chunks(
        self,
        chunks: list[Chunk],
        producer_states: dict[tuple[str, int, int], dict[str, object]],
        aborted: Sequence[tuple[str, int, int, int, int]] = (),
        fence: tuple[int, dict[tuple[str, int], int]] | None = None,
    ) -> set[tuple[str, int]]:
        """Index chunks, with the producer states and the aborted transactions (topic, partition,
        producer id, first offset, marker offset) whose markers they hold, in one transaction.

        ``fence`` (cluster mode, Postgres): (this node id, the lease epoch it holds per
        partition). In the same transaction each written partition's lease row is locked
        (``FOR UPDATE``, so an ``acquire`` waits for this commit or this check sees it) and a
        partition whose row is not (this node, that epoch, unexpired by the database's clock)
        is fenced: nothing of it is written. Returns the fenced partitions. So a broker that
        lost a lease (paused, cut off, or just slow) never makes data visible after the new
        owner loaded the partition; its segment object is garbage for the orphan sweep."""
        with self.db.transaction():
            fenced: set[tuple[str, int]] = set()
            if fence is not None:
                written = (
                    {(c.topic, c.partition) for c in chunks}
                    | {(t, p) for t, p, _ in producer_states}
                    | {(a[0], a[1]) for a in aborted}
                )
                fenced = written - self._held_leases(fence[0], fence[1], written)
                if fenced:
                    chunks = [c for c in chunks if (c.topic, c.partition) not in fenced]
                    producer_states = {
                        k: v for k, v in producer_states.items() if (k[0], k[1]) not in fenced
                    }
                    aborted = [a for a in aborted if (a[0], a[1]) not in fenced]
            self.db.executemany(
                "INSERT INTO aborted_txns VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (topic, partition, last_offset) DO NOTHING",
                list(aborted),
            )
            self.db.executemany(
                _UPSERT_CHUNK,
                [
                    (
                        c.topic,
                        c.partition,
                        c.base_offset,
                        c.end_offset,
                        c.object_key,
                        c.byte_start,
                        c.byte_end,
                        c.min_append_ms,
                        c.max_append_ms,
                        c.batch_index,
                    )
                    for c in chunks
                ],
            )
            self.db.executemany(
                _UPSERT_PRODUCER,
                [(t, p, pid, json.dumps(state)) for (t, p, pid), state in producer_states.items()],
            )
        return fenced

    def _held_leases(
        self, node_id: int, epochs: dict[tuple[str, int], int], wanted: set[tuple[str, int]]
    ) -> set[tuple[str, int]]:
        """Of ``wanted``, the partitions whose lease this node (this incarnation of it) holds at
        the given epoch, the rows locked until the transaction ends (Postgres only: leases are
        a cluster's)."""
        if not wanted:
            return set()
        if not self.db.postgres:
            raise ValueError("fencing needs the cluster's leases: Postgres metadata")
        ordered = sorted(wanted)  # one lock order for every broker
        rows = self.db.query(
            "SELECT l.topic, l.partition, l.epoch FROM partition_leases l "
            "JOIN unnest(?::text[], ?::bigint[]) AS w(topic, partition) "
            "ON l.topic = w.topic AND l.partition = w.partition "
            "WHERE l.node_id = ? AND l.incarnation IS NOT DISTINCT FROM ? "
            "AND l.expires_at > clock_timestamp() "
            "ORDER BY l.topic, l.partition FOR UPDATE OF l",
            ([t for t, _ in ordered], [p for _, p in ordered], node_id, self.incarnation),
        )
        return {(t, p) for t, p, epoch in rows if epochs.get((t, p)) == epoch}

    def chunks(self, topic: str, partition: int) -> list[Chunk]:
        return [
            _chunk(row)
            for row in self.db.query(
                f"SELECT {', '.join(_CHUNK_COLUMNS)} FROM chunks "
                "WHERE topic = ? AND partition = ? ORDER BY base_offset",
                (topic, partition),
            )
        ]

    def producer_states(self) -> dict[tuple[str, int, int], dict[str, object]]:
        return {
            (t, p, pid): json.loads(state)
            for t, p, pid, state in self.db.query(
                "SELECT topic, partition, producer_id, state FROM producer_state"
            )
        }

    def aborted_transactions(self) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
        """Per partition: (producer id, first offset, marker offset) of its aborted transactions."""
        out: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
        for t, p, pid, first, last in self.db.query(
            "SELECT topic, partition, producer_id, first_offset, last_offset FROM aborted_txns "
            "ORDER BY last_offset"
        ):
            out.setdefault((t, p), []).append((pid, first, last))
        return out

    def load_partition(
        self, topic: str, partition: int
    ) -> tuple[list[Chunk], int, dict[int, dict[str, object]], list[tuple[int, int, int]]]:
        """One partition as its new leader loads it (cluster mode), in one transaction: its
        chunks, log start offset, producer states by producer id, and aborted transactions
        (producer id, first offset, marker offset) in marker order."""
        key = (topic, partition)
        with self.db.transaction():
            chunks = self.chunks(topic, partition)
            start = self.db.query(
                "SELECT log_start_offset FROM partition_state WHERE topic = ? AND partition = ?",
                key,
            )
            states = {
                int(pid): json.loads(state)
                for pid, state in self.db.query(
                    "SELECT producer_id, state FROM producer_state "
                    "WHERE topic = ? AND partition = ?",
                    key,
                )
            }
            aborted = [
                (int(pid), int(first), int(last))
                for pid, first, last in self.db.query(
                    "SELECT producer_id, first_offset, last_offset FROM aborted_txns "
                    "WHERE topic = ? AND partition = ? ORDER BY last_offset",
                    key,
                )
            ]
        return chunks, int(start[0][0]) if start else 0, states, aborted

    def drop_chunks_before(
        self, topic: str, partition: int, offset: int, fence: tuple[int, int] | None = None
    ) -> list[str]:
        """Segment retention: forget the partition's chunks below ``offset`` and make
        ``offset`` its log start, in one transaction; returns the object keys that no
        chunk refers to any more. The caller deletes those objects only after this
        commits, so the index never points at a deleted object, whatever crashes when.
        ``fence`` (cluster mode): (node id, lease epoch) this broker leads the partition
        at; ``FencedError`` and nothing changed when it no longer does (``add_chunks``)."""
        where = "topic = ? AND partition = ? AND end_offset <= ?"
        with self.db.transaction():
            if fence is not None and not self._held_leases(
                fence[0], {(topic, partition): fence[1]}, {(topic, partition)}
            ):
                raise FencedError(f"{topic}-{partition}: lease epoch {fence[1]} lost")
            keys = [
                k
                for (k,) in self.db.query(
                    f"SELECT DISTINCT object_key FROM chunks WHERE {where}",
                    (topic, partition, offset),
                )
            ]
            self.db.execute(f"DELETE FROM chunks WHERE {where}", (topic, partition, offset))
            self.db.execute(
                "DELETE FROM aborted_txns WHERE topic = ? AND partition = ? AND last_offset < ?",
                (topic, partition, offset),
            )
            self.db.execute(_UPSERT_LOG_START, (topic, partition, offset))
            unreferenced = [
                k
                for k in keys
                if not self.db.query("SELECT 1 FROM chunks WHERE object_key = ? LIMIT 1", (k,))
            ]
        return unreferenced

    def replace_chunks(
        self,
        replacements: Sequence[tuple[Sequence[Chunk], Chunk]],
        fence: tuple[int, dict[tuple[str, int], int]] | None = None,
    ) -> tuple[set[int], list[str], dict[int, list[Chunk]]]:
        """Compaction (``broker/storage/compaction.py``): each (old consecutive chunks of one
        partition, the merged chunk holding the same batches) replaces exactly those rows by
        the merged one, in one transaction. A replacement whose partition is fenced (``fence``
        as in ``add_chunks``) or whose rows are not all there unchanged (retention,
        DeleteRecords or a new leader changed them) is skipped. Returns the indexes of the
        replacements done, the old object keys no chunk refers to any more (for the caller's
        deferred delete, after this commits), and for each replacement skipped though its
        partition is not fenced, the rows found over its offsets (the caller's view may be
        stale: an earlier commit whose answer was lost)."""
        done: set[int] = set()
        found: dict[int, list[Chunk]] = {}
        with self.db.transaction():
            held = None
            if fence is not None:
                wanted = {(new.topic, new.partition) for _, new in replacements}
                held = self._held_leases(fence[0], fence[1], wanted)
            lock = " FOR UPDATE" if self.db.postgres else ""
            for i, (old, new) in enumerate(replacements):
                key = (new.topic, new.partition)
                if held is not None and key not in held:
                    continue
                span = (*key, old[0].base_offset, old[-1].end_offset)
                rows = self.db.query(
                    "SELECT base_offset, end_offset, object_key, byte_start, byte_end FROM chunks "
                    "WHERE topic = ? AND partition = ? AND base_offset >= ? AND base_offset < ? "
                    f"ORDER BY base_offset{lock}",
                    span,
                )
                expected = [
                    (c.base_offset, c.end_offset, c.object_key, c.byte_start, c.byte_end)
                    for c in old
                ]
                if [tuple(r) for r in rows] != expected:
                    found[i] = [
                        _chunk(row)
                        for row in self.db.query(
                            f"SELECT {', '.join(_CHUNK_COLUMNS)} FROM chunks WHERE topic = ? "
                            "AND partition = ? AND base_offset >= ? AND base_offset < ? "
                            "ORDER BY base_offset",
                            span,
                        )
                    ]
                    continue
                self.db.execute(
                    "DELETE FROM chunks WHERE topic = ? AND partition = ? "
                    "AND base_offset >= ? AND base_offset < ?",
                    span,
                )
                self.db.execute(
                    _UPSERT_CHUNK,
                    (
                        new.topic,
                        new.partition,
                        new.base_offset,
                        new.end_offset,
                        new.object_key,
                        new.byte_start,
                        new.byte_end,
                        new.min_append_ms,
                        new.max_append_ms,
                        new.batch_index,
                    ),
                )
                done.add(i)
            keys = sorted({c.object_key for i in (*done, *found) for c in replacements[i][0]})
            unreferenced = [
                k
                for k in keys
                if not self.db.query("SELECT 1 FROM chunks WHERE object_key = ? LIMIT 1", (k,))
            ]
        return done, unreferenced, found

    def object_keys(self) -> set[str]:
        """Every object some chunk refers to (the orphan sweep keeps these)."""
        return {k for (k,) in self.db.query("SELECT DISTINCT object_key FROM chunks")}

    def log_start_offsets(self) -> dict[tuple[str, int], int]:
        return {
            (t, p): o
            for t, p, o in self.db.query(
                "SELECT topic, partition, log_start_offset FROM partition_state"
            )
        }

    # ------------------------------------------------------------ groups

    def check_slot(self, fence: SlotFence | None) -> None:
        """Inside a transaction: lock the coordinator slot's lease row and raise
        ``CoordinatorFencedError`` unless this broker (this incarnation) holds it at the epoch
        given, unexpired, as ``add_chunks`` fences a partition. The lock makes a takeover
        wait for this write or this write see the takeover. None: no fence (one broker)."""
        if fence is None:
            return
        topic, slot, node_id, epoch = fence
        if not self._held_leases(node_id, {(topic, slot): epoch}, {(topic, slot)}):
            raise CoordinatorFencedError(
                f"{topic}-{slot}: this broker no longer coordinates it (lease epoch {epoch} lost)"
            )

    def commit_offsets(
        self,
        group_id: str,
        offsets: list[tuple[str, int, int, int, str | None]],
        fence: SlotFence | None = None,
    ) -> None:
        """A group's committed offsets; ``fence`` (cluster mode): the group's coordinator slot
        (raises ``CoordinatorFencedError``, nothing written, when it was lost)."""
        now = _now_ms()
        with self.db.transaction():
            self.check_slot(fence)
            self.db.executemany(
                _UPSERT_GROUP_OFFSET, [(group_id, t, p, o, e, m, now) for t, p, o, e, m in offsets]
            )

    def committed_offsets(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        return {
            (t, p): CommittedOffset(o, e, m)
            for t, p, o, e, m in self.db.query(
                "SELECT topic, partition, committed_offset, leader_epoch, metadata FROM group_offsets "
                "WHERE group_id = ?",
                (group_id,),
            )
        }

    def groups_with_offsets(self) -> list[str]:
        return [g for (g,) in self.db.query("SELECT DISTINCT group_id FROM group_offsets")]

    def broker_configs(self) -> dict[str, dict[str, str]]:
        """The dynamic broker configs by scope: ``""`` the cluster default, else a node id."""
        out: dict[str, dict[str, str]] = {}
        for scope, name, value in self.db.query("SELECT scope, name, value FROM broker_configs"):
            out.setdefault(scope, {})[name] = value
        return out

    def set_broker_configs(self, scope: str, configs: dict[str, str]) -> None:
        """Replace the dynamic broker configs of one scope, in one transaction."""
        with self.db.transaction():
            self.db.execute("DELETE FROM broker_configs WHERE scope = ?", (scope,))
            self.db.executemany(
                "INSERT INTO broker_configs (scope, name, value) VALUES (?, ?, ?)",
                [(scope, name, value) for name, value in configs.items()],
            )
            self._bump_state_version()

    # ------------------------------------------------------------ ACLs

    def acls(self) -> list[tuple[int, str, int, str, str, int, int]]:
        """Every ACL: (resource type, name, pattern type, principal, host, operation,
        permission type), Kafka's codes."""
        return [
            (int(t), n, int(pt), pr, h, int(o), int(pe))
            for t, n, pt, pr, h, o, pe in self.db.query(
                f"SELECT {_ACL_COLUMNS} FROM acls ORDER BY {_ACL_COLUMNS}"
            )
        ]

    def add_acls(self, rows: Sequence[tuple[int, str, int, str, str, int, int]]) -> None:
        """Store bindings (one already stored is left as it is), in one transaction."""
        with self.db.transaction():
            self.db.executemany(
                f"INSERT INTO acls ({_ACL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                list(rows),
            )
            self._bump_state_version()

    def delete_acls(self, rows: Sequence[tuple[int, str, int, str, str, int, int]]) -> None:
        with self.db.transaction():
            self.db.executemany(
                "DELETE FROM acls WHERE resource_type = ? AND resource_name = ? AND "
                "pattern_type = ? AND principal = ? AND host = ? AND operation = ? AND "
                "permission_type = ?",
                list(rows),
            )
            self._bump_state_version()

    def delete_partition_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> None:
        """OffsetDelete: the group's committed offsets of these partitions."""
        self.db.executemany(
            "DELETE FROM group_offsets WHERE group_id = ? AND topic = ? AND partition = ?",
            [(group_id, topic, partition) for topic, partition in partitions],
        )

    def delete_group_offsets(self, group_id: str) -> int:
        """Deletes the group's committed offsets; how many partitions had one."""
        rows = self.db.query(
            "DELETE FROM group_offsets WHERE group_id = ? RETURNING partition", (group_id,)
        )
        return len(rows)

    # ------------------------------------------------------------ SCRAM credentials

    def scram_credential(self, user: str, mechanism: str) -> tuple[bytes, bytes, bytes, int] | None:
        """(salt, stored key, server key, iterations) of a user's credential, or None."""
        rows = self.db.query(
            "SELECT salt, stored_key, server_key, iterations FROM scram_credentials "
            "WHERE user_name = ? AND mechanism = ?",
            (user, mechanism),
        )
        if not rows:
            return None
        salt, stored_key, server_key, iterations = rows[0]
        return bytes(salt), bytes(stored_key), bytes(server_key), int(iterations)

    def scram_users(self) -> dict[str, dict[str, int]]:
        """Per user, the iterations of each mechanism it has a credential for."""
        out: dict[str, dict[str, int]] = {}
        for user, mechanism, iterations in self.db.query(
            "SELECT user_name, mechanism, iterations FROM scram_credentials ORDER BY user_name, mechanism"
        ):
            out.setdefault(user, {})[mechanism] = int(iterations)
        return out

    def alter_scram_credentials(
        self,
        deletions: Sequence[tuple[str, str]],
        upsertions: Sequence[tuple[str, str, bytes, bytes, bytes, int]],
    ) -> None:
        """Delete (user, mechanism) and upsert (user, mechanism, salt, stored key, server key,
        iterations), all in one transaction."""
        with self.db.transaction():
            self.db.executemany(
                "DELETE FROM scram_credentials WHERE user_name = ? AND mechanism = ?",
                list(deletions),
            )
            self.db.executemany(_UPSERT_SCRAM, list(upsertions))
            self._bump_state_version()

    # ------------------------------------------------------------ counters

    def state_version(self) -> int:
        """The cluster state version: it changes whenever topics, topic or broker configs, ACLs
        or SCRAM credentials do (through any broker sharing the database), so a broker reads
        them again only when it moved."""
        rows = self.db.query("SELECT value FROM counters WHERE name = 'cluster_state_version'")
        return int(rows[0][0]) if rows else 0

    def _bump_state_version(self) -> None:
        """Inside the transaction of a change the other brokers must see."""
        self.db.execute(
            "INSERT INTO counters (name, value) VALUES ('cluster_state_version', 1) "
            "ON CONFLICT (name) DO UPDATE SET value = counters.value + 1"
        )

    def next_producer_id(self) -> int:
        """1000, 1001, ...: one atomic statement, so even two writers never get the same id."""
        [(value,)] = self.db.query(
            "INSERT INTO counters (name, value) VALUES ('producer_id', 1000) "
            "ON CONFLICT (name) DO UPDATE SET value = counters.value + 1 RETURNING value"
        )
        return int(value)


def _chunk(row: tuple[Any, ...]) -> Chunk:
    topic, partition, base, end, key, byte_start, byte_end, min_ms, max_ms, index = row
    return Chunk(
        topic, partition, base, end, key, byte_start, byte_end, min_ms, max_ms, bytes(index)
    )


def _now_ms() -> int:
    return int(time.time() * 1000)
