"""The "Table topics" status: one row per table topic, for the view and its JSON endpoint.

Per table: broker end offsets against committed offsets (lag in records and in
seconds of append time, ``broker.contracts.Lag``, the broker's metrics' figures),
freshness against the topic's ``automq.table.topic.freshness.sla.ms`` (``freshness_seconds``,
``freshness_sla_ms``, ``freshness_breached``: ``broker.contracts.Freshness``),
the last commit (time, snapshot id, round id), rows in the table and in its DLQ
table, the last compaction and who maintains the table (Icefall's maintenance DAG, or AWS
S3 Tables itself for a tablebucket catalog), and where its DAG runs are. A table whose broker or
catalog cannot be reached gets an ``error`` instead of failing the whole page.
"""

from __future__ import annotations

import time
from typing import Any

from broker import names
from broker.contracts import Freshness
from icefall_airflow import lag, manifest, tables
from icefall_airflow.broker_client import BrokerClient, BrokerError
from spark_jobs.maintain import s3tables as s3tables_maintenance


def table_status(
    client: BrokerClient, catalog: Any, entry: manifest.TableTopic, now_ms: int
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "topic": entry.topic,
        "namespace": entry.namespace,
        "table": entry.table,
        "partitions": entry.partitions,
        "commit_interval_ms": entry.commit_interval_ms,
        "dag_id": entry.dag_id,
        "asset": entry.asset_name,
        "pool": entry.pool,
        "dag_runs_url": f"dags/{entry.dag_id}/runs",
        "maintain_dag_id": names.maintain_dag_id(entry.topic),
        "dlq_dag_id": names.dlq_dag_id(entry.topic),
        "freshness_sla_ms": entry.settings.freshness_sla_ms,
        "error": None,
    }
    try:
        facts = tables.table_facts(catalog, entry.namespace, entry.table)
        measured = lag.measure_checkpoint(
            client, entry.topic, entry.topic_id, facts.checkpoint, now_ms
        )
        row.update(
            {
                "table_exists": facts.exists,
                "committed_offsets": {
                    str(p): o for p, o in sorted(facts.checkpoint.offsets.items())
                },
                "end_offsets": {str(p.partition): p.end_offset for p in measured.partitions},
                "lag_records": measured.records,
                "lag_seconds": measured.seconds,
                "lag": measured.to_json(),
                # contracts.Freshness: the same figure as the broker's icefall_table_freshness_*
                **{
                    f"freshness_{k}": v
                    for k, v in Freshness.of(measured, entry.settings.freshness_sla_ms)
                    .model_dump()
                    .items()
                },
                "last_commit_ms": facts.checkpoint.timestamp_ms,
                "snapshot_id": facts.checkpoint.snapshot_id,
                "round_id": facts.checkpoint.round_id,
                "rows": facts.rows,
                "current_snapshot_id": facts.current_snapshot_id,
                "last_maintenance_ms": facts.last_maintenance_ms,
                "last_maintenance": facts.last_maintenance,
                "dlq_table": entry.dlq_table,
                "dlq_rows": tables.row_count(catalog, entry.namespace, entry.dlq_table),
            }
        )
    except (BrokerError, OSError, ValueError) as exc:
        row["error"] = str(exc)
    except Exception as exc:  # noqa: BLE001 -- a catalog error must not take the whole view down
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def all_statuses(admin_url: str | None = None) -> dict[str, Any]:
    """Status of every table topic in the broker's manifest (read from the admin API,
    so the view is right even when the API server runs on another machine)."""
    client = BrokerClient(admin_url or manifest.admin_url())
    now_ms = int(time.time() * 1000)
    try:
        answer = client.table_topics()
        cluster = client.cluster()
    except BrokerError as exc:
        return {
            "admin_url": client.admin_url,
            "error": str(exc),
            "generated_at_ms": now_ms,
            "tables": [],
        }
    entries = [manifest.TableTopic.from_json(t) for t in answer.table_topics]
    catalog = tables.open_catalog(cluster.tables_catalog)
    # S3 Tables compacts and expires its tables itself; the maintenance DAG writes its settings there
    maintained_by = s3tables_maintenance.maintainer(cluster.tables_catalog.type)
    return {
        "admin_url": client.admin_url,
        # a catalog without a URI (glue): its type and warehouse
        "catalog_url": cluster.catalog_url
        or f"{cluster.tables_catalog.type} ({cluster.tables_catalog.warehouse})",
        "error": None,
        "generated_at_ms": now_ms,
        "tables": [
            {**table_status(client, catalog, e, now_ms), "maintained_by": maintained_by}
            for e in entries
        ],
    }
