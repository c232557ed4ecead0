"""Names and locations every Icefall DAG, task and view agrees on.

The names (DAG ids, pools, assets, the DLQ table) are :mod:`broker.names`',
re-exported here: the Spark jobs and the broker build the same strings from the
same module. The locations come from :class:`broker.config.BrokerConfig` (``ICEFALL_*``
variables), so the DAGs see the broker that ``icefall up`` started without a
setting of their own. Nothing here touches the network: DAG files call it at
parse time.
"""

from __future__ import annotations

import os
from pathlib import Path

from broker.config import BrokerConfig
from broker.names import (  # noqa: F401 -- re-exported: the plugin's modules and tests use settings.<name>
    ASSET_PREFIX,
    COMMIT_DAG_PREFIX,
    DLQ_DAG_PREFIX,
    MAINTAIN_DAG_PREFIX,
    POOL_PREFIX,
    asset_name,
    closed_partitions_asset_name,
    commit_dag_id,
    dlq_asset_name,
    dlq_dag_id,
    dlq_table,
    maintain_dag_id,
    maintenance_asset_name,
    pending_asset_name,
    pool_name,
    writer_dag_ids,
)

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
