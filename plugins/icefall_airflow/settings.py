"""Names and locations every Icefall DAG, task and view agrees on.

Everything comes from :class:`broker.config.BrokerConfig` (``ICEFALL_*``
variables), so the DAGs see the broker that ``icefall up`` started without a
setting of their own. Nothing here touches the network: DAG files call it at
parse time.
"""

from __future__ import annotations

import os
from pathlib import Path

from broker.config import BrokerConfig

COMMIT_DAG_PREFIX = "icefall_commit__"
MAINTAIN_DAG_PREFIX = "icefall_maintain__"
DLQ_DAG_PREFIX = "icefall_dlq_reprocess__"
POOL_PREFIX = "icefall_table__"
ASSET_PREFIX = "icefall/"
ADMIN_URL_ENV = "ICEFALL_ADMIN_URL"
# The shortest schedule a commit DAG gets: the topic config allows 1 ms, but
# an Airflow run costs about a second of scheduling, so faster is meaningless.
MIN_SCHEDULE_MS = 5_000


def broker_config() -> BrokerConfig:
    """The broker settings from the environment (``ICEFALL_HOME`` etc.)."""
    return BrokerConfig()


def manifest_path() -> Path:
    return broker_config().manifest_path


def default_admin_url() -> str:
    """``$ICEFALL_ADMIN_URL``, else the URL a default broker on this machine listens on."""
    return os.environ.get(ADMIN_URL_ENV) or broker_config().admin_url


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


def asset_name(namespace: str, table: str) -> str:
    return f"{ASSET_PREFIX}{namespace}/{table}"


def maintenance_asset_name(namespace: str, table: str) -> str:
    """Maintenance events go to their own asset: compaction and expiry change files, not rows,
    so the data teams' DAGs scheduled on the table's asset must not run for them."""
    return f"{asset_name(namespace, table)}/maintenance"


def pending_asset_name(namespace: str, table: str) -> str:
    """Where a table's size trigger reports that enough bytes wait (it schedules the commit DAG)."""
    return f"{asset_name(namespace, table)}/pending"


def dlq_asset_name(namespace: str, table: str) -> str:
    """DLQ reprocess events: rows moved from the DLQ into the table. Their own asset, because
    they are not a round's offset range (the extra lists the offsets moved)."""
    return f"{asset_name(namespace, table)}/dlq-reprocess"


def dlq_table(table: str) -> str:
    """Where the commit round puts records it could not convert (errors.tolerance)."""
    return f"{table}__dlq"
