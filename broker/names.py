"""Every name the broker, the DAGs and the Spark jobs must spell the same way.

A table topic is known by many names: its table (``clicks-v2`` -> ``clicks_v2``),
the DLQ table next to it (``clicks_v2__dlq``), the schema registry subject its
values are registered under (``clicks-v2-value``), its Airflow DAGs
(``icefall_commit__clicks-v2``...), the pool that serialises its table's
writers and the assets its commits are published on. Each side used to build
these strings itself; a typo on one side would not fail a test, it would make a
DAG wait on an asset nobody emits, or a round read a table nobody writes. So
they are built here, once.

Pure string functions, no imports beyond the standard library: DAG files call
them at parse time, and Spark executors import them.
"""

from __future__ import annotations

# Airflow: DAG ids, pools, the size trigger's watcher.
COMMIT_DAG_PREFIX = "icefall_commit__"
MAINTAIN_DAG_PREFIX = "icefall_maintain__"
DLQ_DAG_PREFIX = "icefall_dlq_reprocess__"
POOL_PREFIX = "icefall_table__"
PENDING_WATCHER_PREFIX = "icefall_pending__"
# Assets: ``icefall/<namespace>/<table>`` and its sub-assets.
ASSET_PREFIX = "icefall/"
MAINTENANCE_ASSET_SUFFIX = "/maintenance"
PENDING_ASSET_SUFFIX = "/pending"
DLQ_ASSET_SUFFIX = "/dlq-reprocess"
CLOSED_PARTITIONS_ASSET_SUFFIX = "/closed-partitions"
# Iceberg: the DLQ table beside each table.
DLQ_SUFFIX = "__dlq"
# Schema registry: TopicNameStrategy, as Confluent's serializers register values.
VALUE_SUBJECT_SUFFIX = "-value"
KEY_SUBJECT_SUFFIX = "-key"


def table_name(topic: str) -> str:
    """The Iceberg table of a topic: dots and dashes are not identifiers, so they become ``_``."""
    return topic.replace(".", "_").replace("-", "_")


def dlq_table(table: str) -> str:
    """Where the commit round puts records it could not convert (errors.tolerance)."""
    return table + DLQ_SUFFIX


def dlq_of(dlq: str) -> str:
    """The table a DLQ table belongs to (its name without the suffix)."""
    return dlq.removesuffix(DLQ_SUFFIX)


def value_subject(topic: str) -> str:
    """The registry subject of a topic's value schemas (TopicNameStrategy)."""
    return topic + VALUE_SUBJECT_SUFFIX


def key_subject(topic: str) -> str:
    """The registry subject of a topic's key schemas (TopicNameStrategy)."""
    return topic + KEY_SUBJECT_SUFFIX


def commit_dag_id(topic: str) -> str:
    return COMMIT_DAG_PREFIX + topic


def maintain_dag_id(topic: str) -> str:
    return MAINTAIN_DAG_PREFIX + topic


def dlq_dag_id(topic: str) -> str:
    return DLQ_DAG_PREFIX + topic


def writer_dag_ids(topic: str) -> tuple[str, str]:
    """The DAGs that write the topic's table: paused together when the topic stops being a table topic."""
    return commit_dag_id(topic), maintain_dag_id(topic)


def pool_name(topic: str) -> str:
    """The one-slot pool that serialises every writer of the topic's table (commit and maintenance)."""
    return POOL_PREFIX + topic


def pending_watcher_name(topic: str) -> str:
    """The asset watcher that runs a topic's size trigger."""
    return PENDING_WATCHER_PREFIX + topic


def asset_name(namespace: str, table: str) -> str:
    """``icefall/<namespace>/<table>``: one event per commit round that added a snapshot."""
    return f"{ASSET_PREFIX}{namespace}/{table}"


def maintenance_asset_name(namespace: str, table: str) -> str:
    """Maintenance events go to their own asset: compaction and expiry change files, not rows,
    so the data teams' DAGs scheduled on the table's asset must not run for them."""
    return asset_name(namespace, table) + MAINTENANCE_ASSET_SUFFIX


def pending_asset_name(namespace: str, table: str) -> str:
    """Where a table's size trigger reports that enough bytes wait (it schedules the commit DAG)."""
    return asset_name(namespace, table) + PENDING_ASSET_SUFFIX


def closed_partitions_asset_name(namespace: str, table: str) -> str:
    """Partitioned events, one per event-time partition (hour or day) of the table that closed:
    their own asset, since an asset event with a partition key triggers partition-aware DAGs only."""
    return asset_name(namespace, table) + CLOSED_PARTITIONS_ASSET_SUFFIX


def dlq_asset_name(namespace: str, table: str) -> str:
    """DLQ reprocess events: rows moved from the DLQ into the table. Their own asset, because
    they are not a round's offset range (the extra lists the offsets moved)."""
    return asset_name(namespace, table) + DLQ_ASSET_SUFFIX
