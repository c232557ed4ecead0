"""Prometheus metrics of the broker (``GET /metrics`` on the admin API).

Two kinds of series, in the text exposition format (no client library: the
format is a few lines and the broker has no other use for one):

- the log: per partition the log start, high watermark, flushed offset and
  last append time; the flusher's counters; segment retention's counters and
  the partitions whose retention a table topic's table holds back;
- the tables, the same figures as Airflow's "Table topics" view: per table
  topic the committed offsets (from the Iceberg checkpoint), lag in records
  and in seconds of append time, freshness against the topic's SLA
  (``contracts.Freshness``), last commit time, rows and DLQ rows.

The catalog reads block, so they run in a thread; the log is read on the event
loop in one synchronous step (no flush or produce changes it half-way).
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker import contracts, names, topic_configs
from broker.checkpoint import NO_CHECKPOINT, Checkpoint, read_checkpoint
from broker.contracts import CatalogSpec

if TYPE_CHECKING:
    from broker.cluster import Cluster
    from broker.config import BrokerConfig
    from broker.security.stats import AuthStats
    from broker.storage.compaction import CompactionStatus
    from broker.storage.logstore import LogStore, PartitionLog
    from broker.storage.retention import RetentionStatus

log = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class TableFacts:
    """What the catalog says about one table topic's table (and its ``<table>__dlq``)."""

    checkpoint: Checkpoint = NO_CHECKPOINT
    rows: int | None = None
    dlq_rows: int | None = None
    error: str | None = None


@dataclass
class Family:
    """One metric family: HELP/TYPE lines and its samples."""

    name: str
    kind: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: dict[str, str], value: float) -> None:
        self.samples.append((labels, value))

    def render(self, common: dict[str, str] | None = None) -> str:
        """The family's lines; ``common`` labels go on every sample (cluster mode: the node id)."""
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        for own, value in self.samples:
            labels = {**(common or {}), **own}
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(
                f"{self.name}{{{text}}} {_number(value)}"
                if text
                else f"{self.name} {_number(value)}"
            )
        return "\n".join(lines)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _total_records(table: Any) -> int | None:
    snapshot = table.current_snapshot()
    if snapshot is None:
        return 0
    value = snapshot.summary.get("total-records") if snapshot.summary is not None else None
    return int(value) if value is not None else None


class CatalogReader:
    """Reads checkpoints and row counts through the tables' catalog (pyiceberg's client): the
    broker's own REST catalog, or the one ``automq.table.topic.catalog.*`` names."""

    def __init__(self, spec: CatalogSpec, local: Any = None) -> None:
        """``local``: the broker's own catalog store, read in-process (no HTTP, so no token
        when the catalog requires OAuth2)."""
        self.spec = spec
        self.local = local
        self._catalog: Any = None

    def _load(self, namespace: str, table: str) -> Any | None:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        if self.local is not None:
            from broker.catalog.store import sql_identifier

            try:
                return self.local.sql.load_table(sql_identifier((namespace, table)))
            except (NoSuchTableError, NoSuchNamespaceError):
                return None
        if self._catalog is None:
            self._catalog = load_catalog("icefall-metrics", **self.spec.pyiceberg_properties())
        try:
            return self._catalog.load_table((namespace, table))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    def table(self, namespace: str, table: str) -> Any | None:
        """The table (pyiceberg), None when it does not exist; raises when the catalog cannot answer."""
        try:
            return self._load(namespace, table)
        except Exception:
            self._catalog = None
            raise

    def checkpoint(self, namespace: str, table: str) -> Checkpoint:
        """Only the table's offsets checkpoint (none yet: the empty one); raises when the catalog cannot answer."""
        try:
            loaded = self._load(namespace, table)
        except Exception:
            self._catalog = None
            raise
        return read_checkpoint(loaded.metadata) if loaded is not None else NO_CHECKPOINT

    def facts(self, namespace: str, table: str) -> TableFacts:
        try:
            loaded = self._load(namespace, table)
            if loaded is None:
                return TableFacts()
            dlq = self._load(namespace, names.dlq_table(table))
            return TableFacts(
                read_checkpoint(loaded.metadata),
                _total_records(loaded),
                _total_records(dlq) if dlq is not None else None,
            )
        except Exception as exc:  # noqa: BLE001 -- a scrape reports what it can; the error is a series of its own
            self._catalog = None
            return TableFacts(error=f"{type(exc).__name__}: {exc}")


_readers: dict[str, CatalogReader] = {}


def catalog_reader(spec: CatalogSpec) -> CatalogReader:
    key = spec.model_dump_json()
    if key not in _readers:
        _readers[key] = CatalogReader(spec)
    return _readers[key]


def pending_in(part: PartitionLog, start: int) -> tuple[int, int]:
    """Records and bytes (whole batches, in segments or still in the WAL tail) from ``start`` to the
    high watermark (batches accepted but not yet durable in the WAL are not counted: no client reads them)."""
    size = 0
    i = max(bisect.bisect_right(part.chunk_bases, start) - 1, 0)
    for chunk in part.chunks[i:]:
        if chunk.end_offset <= start:
            continue
        first = max(bisect.bisect_right(chunk.ref_bases, start) - 1, 0)
        size += sum(ref.size for ref in chunk.refs[first:])
    flushed = part.flushed_offset
    hwm = part.high_watermark
    size += sum(
        len(b.data) for b in part.tail if start < b.end_offset <= hwm and b.base_offset >= flushed
    )
    return max(part.high_watermark - start, 0), size


def append_ms_at(part: PartitionLog, offset: int) -> int | None:
    """Append time of the batch holding ``offset`` (segment index, else the WAL tail)."""
    for chunk in part.chunks:
        if chunk.end_offset <= offset:
            continue
        if chunk.base_offset > offset:  # the offset fell in a gap: the next batch is the oldest
            return chunk.min_append_ms
        index = max(bisect.bisect_right(chunk.ref_bases, offset) - 1, 0)
        return int(chunk.refs[index].append_ms)
    for batch in part.tail:
        if batch.end_offset > offset:
            return batch.append_ms
    return None


def _table_topics(cluster: Cluster) -> list[Any]:
    return [t for t in cluster.topics.values() if topic_configs.is_table_topic(t.configs)]


def _ident(topic: Any) -> tuple[str, str]:
    return topic_configs.TableSettings(topic.configs).namespace, names.table_name(topic.name)


# An unlabelled counter per field of a status dataclass: (the name between the prefix and
# "_total", the status field it reads, help). One table names each counter once: its family
# and its sample.
Counters = list[tuple[str, str, str]]


def _counter_families(prefix: str, counters: Counters) -> list[tuple[str, str, str]]:
    return [(f"{prefix}_{name}_total", "counter", text) for name, _, text in counters]


def _add_counters(f: dict[str, Family], prefix: str, counters: Counters, status: Any) -> None:
    for name, attribute, _ in counters:
        f[f"{prefix}_{name}_total"].add({}, getattr(status, attribute))


# Segment retention (broker/storage/retention.py): what it deleted, and where a table topic's table holds it
# back (records past retention.ms/bytes kept because no commit round has taken them yet). Alert on
# icefall_retention_held_back_offsets > 0 for long: the commit DAG is stalled and the log grows.
RETENTION_COUNTERS: Counters = [
    ("passes", "passes", "Segment retention passes"),
    ("deleted_chunks", "chunks_deleted", "Partition chunks dropped by retention.ms/bytes"),
    ("deleted_bytes", "bytes_deleted", "Segment bytes dropped by retention.ms/bytes"),
    ("deleted_objects", "objects_deleted", "Segment objects deleted"),
    ("orphans_deleted", "orphans_deleted", "Unreferenced segment objects swept"),
    ("delete_failures", "delete_failures", "Segment object deletes that failed (retried)"),
    (
        "held_back_passes",
        "blocked_passes",
        "Partition-passes where a table topic's uncommitted records stopped retention",
    ),
]
RETENTION_FAMILIES = [
    *_counter_families("icefall_retention", RETENTION_COUNTERS),
    (
        "icefall_retention_held_back_offsets",
        "gauge",
        "Offsets past retention.ms/bytes kept because the table has not committed them",
    ),
    (
        "icefall_retention_held_back_bytes",
        "gauge",
        "Segment bytes kept because the table has not committed them",
    ),
    (
        "icefall_retention_held_back_since_timestamp_seconds",
        "gauge",
        "Since when retention of this partition has been held back",
    ),
]


# Compaction of small segment objects (cluster mode, broker/storage/compaction.py).
COMPACTION_COUNTERS: Counters = [
    ("passes", "passes", "Segment compaction passes"),
    ("objects_written", "objects_written", "Compacted segment objects written"),
    (
        "objects_released",
        "objects_released",
        "Small segment objects no chunk refers to after compaction (deleted after file.delete.delay.ms)",
    ),
    ("chunks", "chunks_compacted", "Chunks merged into compacted chunks"),
    ("bytes", "bytes_compacted", "Batch bytes copied into compacted objects"),
    (
        "runs_skipped",
        "runs_skipped",
        "Chunk runs left as they were: retention, DeleteRecords or a new leader changed them",
    ),
    ("failures", "failures", "Compaction passes that failed (retried)"),
]
COMPACTION_FAMILIES = _counter_families("icefall_compaction", COMPACTION_COUNTERS)


def _compaction(f: dict[str, Family], status: CompactionStatus) -> None:
    _add_counters(f, "icefall_compaction", COMPACTION_COUNTERS, status)


def _retention(f: dict[str, Family], status: RetentionStatus) -> None:
    _add_counters(f, "icefall_retention", RETENTION_COUNTERS, status)
    for (topic, partition), blocked in sorted(status.blocked.items()):
        labels = {"topic": topic, "partition": str(partition)}
        f["icefall_retention_held_back_offsets"].add(
            labels, blocked.wanted_log_start_offset - blocked.log_start_offset
        )
        f["icefall_retention_held_back_bytes"].add(labels, blocked.bytes)
        f["icefall_retention_held_back_since_timestamp_seconds"].add(
            labels, blocked.since_ms / 1000
        )


# Logins on the Kafka listeners (broker/security): alert on a rising failure rate.
SECURITY_FAMILIES = [
    (
        "icefall_successful_authentications_total",
        "counter",
        "SASL logins that succeeded (re-authentications included), per listener and mechanism",
    ),
    (
        "icefall_failed_authentications_total",
        "counter",
        "SASL logins refused (wrong password, unknown user, mechanism not enabled)",
    ),
    (
        "icefall_successful_reauthentications_total",
        "counter",
        "SASL re-authentications on open connections (KIP-368)",
    ),
    (
        "icefall_tls_handshake_failures_total",
        "counter",
        "TLS handshakes that failed, and TLS attempted on a plaintext listener",
    ),
    (
        "icefall_expired_sessions_total",
        "counter",
        "Connections closed because their SASL session expired without re-authentication",
    ),
]


def _security(f: dict[str, Family], auth: AuthStats) -> None:
    for family, counts in (
        ("icefall_successful_authentications_total", auth.successes),
        ("icefall_failed_authentications_total", auth.failures),
        ("icefall_successful_reauthentications_total", auth.reauthentications),
    ):
        for (listener, mechanism), value in sorted(counts.items()):
            f[family].add({"listener": listener, "mechanism": mechanism}, value)
    for family, per_listener in (
        ("icefall_tls_handshake_failures_total", auth.tls_failures),
        ("icefall_expired_sessions_total", auth.expired_sessions),
    ):
        for listener, value in sorted(per_listener.items()):
            f[family].add({"listener": listener}, value)


def render_metrics(
    cluster: Cluster,
    logs: LogStore,
    facts: dict[str, TableFacts],
    now_ms: int,
    auth: AuthStats | None = None,
    node_id: int | None = None,
) -> str:
    """The exposition text; synchronous, so it sees one consistent state of the log.
    ``node_id`` (cluster mode): a ``node_id`` label on every sample. Each broker reports the
    partitions it leads (and the table lag over them), so Prometheus scrapes every broker
    and sums (or, for seconds, takes the max) across ``node_id``."""
    f = {
        name: Family(name, kind, text)
        for name, kind, text in [
            ("icefall_partition_log_start_offset", "gauge", "First offset still readable"),
            ("icefall_partition_high_watermark", "gauge", "Offset the next record gets"),
            (
                "icefall_partition_flushed_offset",
                "gauge",
                "Offsets below this are in segment objects",
            ),
            (
                "icefall_partition_last_append_timestamp_seconds",
                "gauge",
                "Broker append time of the newest batch",
            ),
            ("icefall_segments_written_total", "counter", "Segment objects written"),
            ("icefall_flush_failures_total", "counter", "Failed segment flushes"),
            (
                "icefall_unflushed_bytes",
                "gauge",
                "Bytes in the write-ahead log not yet in segment objects",
            ),
            (
                "icefall_table_committed_offset",
                "gauge",
                "Next offset the table holds (its Iceberg checkpoint)",
            ),
            ("icefall_table_lag_records", "gauge", "Records in the topic not yet in the table"),
            (
                "icefall_table_lag_bytes",
                "gauge",
                "Bytes (whole batches) in the topic not yet in the table",
            ),
            (
                "icefall_table_lag_seconds",
                "gauge",
                "Age of the oldest record not yet in the table (append time)",
            ),
            (
                "icefall_table_last_commit_timestamp_seconds",
                "gauge",
                "Time of the snapshot holding the checkpoint",
            ),
            (
                "icefall_table_freshness_seconds",
                "gauge",
                "How long the oldest record not yet in the table has waited (0: it holds every record)",
            ),
            (
                "icefall_table_freshness_sla_seconds",
                "gauge",
                "The topic's automq.table.topic.freshness.sla.ms, in seconds (only when set)",
            ),
            (
                "icefall_table_freshness_sla_breached",
                "gauge",
                "1 while the table's freshness is past its SLA (only when set)",
            ),
            ("icefall_table_rows", "gauge", "Rows in the table's current snapshot"),
            ("icefall_table_dlq_rows", "gauge", "Rows in the table's DLQ table <table>__dlq"),
            ("icefall_table_catalog_up", "gauge", "1 when the catalog answered for this table"),
            *RETENTION_FAMILIES,
            *COMPACTION_FAMILIES,
            *SECURITY_FAMILIES,
        ]
    }
    f["icefall_segments_written_total"].add({}, logs.segments_written)
    f["icefall_flush_failures_total"].add({}, logs.flush_failures)
    f["icefall_unflushed_bytes"].add({}, logs.unflushed_bytes)
    _retention(f, logs.retention)
    _compaction(f, logs.compaction)
    if auth is not None:
        _security(f, auth)
    for topic in sorted(cluster.topics.values(), key=lambda t: t.name):
        for p in range(topic.partitions):
            part = logs.partitions.get((topic.name, p))
            if part is None:
                continue
            labels = {"topic": topic.name, "partition": str(p)}
            f["icefall_partition_log_start_offset"].add(labels, part.log_start_offset)
            f["icefall_partition_high_watermark"].add(labels, part.high_watermark)
            f["icefall_partition_flushed_offset"].add(labels, part.flushed_offset)
            last = (
                part.tail[-1].append_ms
                if part.tail
                else part.chunks[-1].max_append_ms
                if part.chunks
                else None
            )
            if last is not None:
                f["icefall_partition_last_append_timestamp_seconds"].add(labels, last / 1000)
    for topic in sorted(_table_topics(cluster), key=lambda t: t.name):
        namespace, table = _ident(topic)
        got = facts.get(topic.name, TableFacts(error="not read"))
        labels = {"topic": topic.name, "namespace": namespace, "table": table}
        f["icefall_table_catalog_up"].add(labels, 0 if got.error else 1)
        if got.error:
            continue
        committed_offsets = got.checkpoint.offsets_for(str(topic.topic_id))
        behind_bytes = 0
        lags = []
        for p in range(topic.partitions):
            part = logs.partitions.get((topic.name, p))
            if part is None:
                continue
            committed = committed_offsets.get(p)
            f["icefall_table_committed_offset"].add({**labels, "partition": str(p)}, committed or 0)
            lag = contracts.PartitionLag.of(
                p,
                part.log_start_offset,
                part.high_watermark,
                committed,
                functools.partial(append_ms_at, part),
            )
            lags.append(lag)
            if lag.lag_records:
                behind_bytes += pending_in(
                    part, contracts.lag_start(committed, part.log_start_offset)
                )[1]
        lag_of_table = contracts.Lag.of(lags, now_ms)
        f["icefall_table_lag_records"].add(labels, lag_of_table.records)
        f["icefall_table_lag_bytes"].add(labels, behind_bytes)
        f["icefall_table_lag_seconds"].add(labels, lag_of_table.seconds)
        fresh = contracts.Freshness.of(
            lag_of_table, topic_configs.TableSettings(topic.configs).freshness_sla_ms
        )
        f["icefall_table_freshness_seconds"].add(labels, fresh.seconds)
        if fresh.sla_ms is not None:
            f["icefall_table_freshness_sla_seconds"].add(labels, fresh.sla_ms / 1000)
            f["icefall_table_freshness_sla_breached"].add(labels, int(fresh.breached))
        if got.checkpoint.timestamp_ms is not None:
            f["icefall_table_last_commit_timestamp_seconds"].add(
                labels, got.checkpoint.timestamp_ms / 1000
            )
        if got.rows is not None:
            f["icefall_table_rows"].add(labels, got.rows)
        if got.dlq_rows is not None:
            f["icefall_table_dlq_rows"].add(labels, got.dlq_rows)
    common = {"node_id": str(node_id)} if node_id is not None else None
    return "\n".join(family.render(common) for family in f.values()) + "\n"


def _read_facts(
    reader: CatalogReader, tables: Iterable[tuple[str, str, str]]
) -> dict[str, TableFacts]:
    return {topic: reader.facts(namespace, table) for topic, namespace, table in tables}


async def scrape(
    config: BrokerConfig,
    cluster: Cluster,
    logs: LogStore,
    auth: AuthStats | None = None,
    reader: CatalogReader | None = None,
) -> str:
    """Catalog facts in a thread, then the log on the loop. ``reader``: the broker's reader of
    the tables' catalog (default: one through pyiceberg)."""
    tables = [(t.name, *_ident(t)) for t in _table_topics(cluster)]
    reader = reader or catalog_reader(config.tables_catalog)
    facts = await asyncio.to_thread(_read_facts, reader, tables)
    node_id = config.node_id if config.metadata_uri is not None else None
    return render_metrics(cluster, logs, facts, int(time.time() * 1000), auth, node_id)


def authentication_failures(failures: dict[str, int], node_id: int | None = None) -> str:
    """``icefall_http_authentication_failures_total`` per HTTP service that requires credentials
    (wrong or missing passwords, secrets and tokens); empty when none does."""
    if not failures:
        return ""
    family = Family(
        "icefall_http_authentication_failures_total",
        "counter",
        "Requests refused for missing or wrong credentials, per HTTP service",
    )
    for service, count in sorted(failures.items()):
        family.add({"service": service}, count)
    return family.render({"node_id": str(node_id)} if node_id is not None else None) + "\n"
