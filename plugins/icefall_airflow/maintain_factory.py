"""The maintenance DAG factory: one DAG per table topic, ``icefall_maintain__<topic>``.

Built from the broker's manifest file only, like the commit DAGs (no network,
no database at parse time). Each run is S3 Tables' three jobs on the table
(``spark_jobs/maintenance.py``: compaction, manifest rewrite, snapshot expiry,
orphan removal). Maintenance is a writer, so its ``maintain`` task takes the
table's one-slot pool, the one the commit DAG's ``commit`` task takes: a round
and a compaction never race (they would not corrupt anything, but the loser of
the publish race would redo its work). ``publish`` only emits the asset event
(the job itself records its summary on the table), so it needs no slot.

Schedule: the topic's ``automq.table.topic.maintenance.interval.ms`` (default
1 h) as a trigger timetable: maintenance has no data interval, a run works on
the table as it is. The first scheduled run comes one interval after the
topic's creation (``timetable.MaintenanceTimetable``), not at once: a new
topic has no table yet; a manual run works at any time.
``automq.table.topic.maintenance.enable=false`` removes the DAG. Each run that found a table emits an event on
``icefall/<namespace>/<table>/maintenance`` (not the table's asset: data
teams' DAGs on the table's asset read the rows a commit added, and compaction
adds none).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, Metadata, Param, task

from broker import contracts, topic_configs
from icefall_airflow import manifest, settings
from icefall_airflow.assets import maintenance_asset
from icefall_airflow.job_operator import check_job_result
from icefall_airflow.maintain_operator import MaintenanceOperator
from icefall_airflow.timetable import MaintenanceTimetable
from spark_jobs.maintain import summary as maintenance_summary
from spark_jobs.maintain.settings import ACTIONS

log = logging.getLogger(__name__)

START_DATE = datetime(2026, 1, 1, tzinfo=UTC)
ENABLE_KEY = topic_configs.MAINTENANCE_ENABLE
INTERVAL_KEY = topic_configs.MAINTENANCE_INTERVAL
DEFAULT_INTERVAL_MS = topic_configs.MAINTENANCE_INTERVAL_MS
MIN_INTERVAL_MS = topic_configs.MIN_MAINTENANCE_INTERVAL_MS
RESULT_STATUSES = contracts.MAINTENANCE_STATUSES

DOC = """\
### Maintenance of `{namespace}.{table}` (topic `{topic}`)

Every {interval} (the topic's `automq.table.topic.maintenance.interval.ms`): compaction
(`rewrite_data_files`), `rewrite_manifests`, `expire_snapshots` (the `icefall-checkpoint` tag
survives) and `remove_orphan_files`, with the settings of the topic configs and table properties
(see the README, "Table maintenance"). Runs in the pool `{pool}`, shared with the commit rounds.
Each run emits an event on `{asset}` and records its summary in the table property
`icefall.maintenance.last-run` (the "Table topics" view shows it).

Manual run param: `actions`, a subset of {actions}.
"""


def maintenance_enabled(entry: manifest.TableTopic) -> bool:
    return entry.settings.maintenance_enabled


def maintenance_interval_ms(entry: manifest.TableTopic) -> int:
    """The topic's maintenance interval (the broker validated it; an old manifest may lack it)."""
    return max(entry.settings.maintenance_interval_ms, MIN_INTERVAL_MS)


def first_run(entry: manifest.TableTopic) -> datetime | None:
    """When the first scheduled run comes: one interval after the topic's creation, when its
    first rounds have made a table to maintain; None (at once) for manifests written before
    ``created_ms``."""
    if entry.created_ms <= 0:
        return None
    return datetime.fromtimestamp(
        (entry.created_ms + maintenance_interval_ms(entry)) / 1000, tz=UTC
    )


def maintenance_params() -> dict[str, Param]:
    return {
        "actions": Param(
            list(ACTIONS),
            type="array",
            items={"type": "string", "enum": list(ACTIONS)},
            minItems=1,
            uniqueItems=True,
            description="which maintenance actions to run (they run in the order "
            + ", ".join(ACTIONS)
            + ")",
        ),
    }


def check_result(result: Any) -> dict[str, Any]:
    return check_job_result(result, "maintenance", RESULT_STATUSES, contracts.MaintenanceResult)


def asset_extra(entry: manifest.TableTopic, result: dict[str, Any]) -> dict[str, Any]:
    """The event's extra: which table, and what the run did (files rewritten, bytes, snapshots
    expired, orphans removed), the same summary the table's ``icefall.maintenance.last-run`` holds."""
    dlq = result.get("dlq")
    return {
        "topic": entry.topic,
        "namespace": entry.namespace,
        "table": entry.table,
        **maintenance_summary.summarize(result),
        "dlq_data_files_before": dlq.get("data_files_before") if isinstance(dlq, dict) else None,
        "dlq_data_files_after": dlq.get("data_files_after") if isinstance(dlq, dict) else None,
    }


def _publish(
    entry: manifest.TableTopic, asset: Asset, result: dict[str, Any]
) -> Iterator[Metadata]:
    from airflow.sdk.exceptions import AirflowSkipException

    check_result(result)
    if result["status"] == "no_table":
        raise AirflowSkipException(
            f"{entry.namespace}.{entry.table} does not exist yet: nothing to maintain"
        )
    extra = asset_extra(entry, result)
    log.info(
        "maintenance of %s.%s: %s",
        entry.namespace,
        entry.table,
        maintenance_summary.one_line(extra),
    )
    yield Metadata(asset, extra)


def _interval_text(ms: int) -> str:
    if ms % 3_600_000 == 0:
        return f"{ms // 3_600_000} h"
    if ms % 60_000 == 0:
        return f"{ms // 60_000} min"
    return f"{ms / 1000:g} s"


def build_maintain_dag(entry: manifest.TableTopic) -> DAG:
    asset = maintenance_asset(entry.namespace, entry.table)
    interval_ms = maintenance_interval_ms(entry)
    with DAG(
        dag_id=settings.maintain_dag_id(entry.topic),
        description=f"Table maintenance of Iceberg {entry.namespace}.{entry.table} (Kafka topic {entry.topic})",
        schedule=MaintenanceTimetable(timedelta(milliseconds=interval_ms), first_run(entry)),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=False,
        dagrun_timeout=timedelta(hours=6),
        params=maintenance_params(),
        tags=entry.dag_tags("maintenance"),
        doc_md=entry.disabled_note
        + DOC.format(
            topic=entry.topic,
            namespace=entry.namespace,
            table=entry.table,
            interval=_interval_text(interval_ms),
            pool=entry.pool,
            asset=settings.maintenance_asset_name(entry.namespace, entry.table),
            actions=", ".join(ACTIONS),
        ),
        default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    ) as dag:
        maintain = MaintenanceOperator(
            task_id="maintain",
            topic=entry.topic,
            namespace=entry.namespace,
            table=entry.table,
            topic_enabled=entry.enabled,
            pool=entry.pool,
            name=f"icefall-maintain-{entry.topic}",
            execution_timeout=timedelta(hours=4),
        )
        published = task(task_id="publish", outlets=[asset], retries=0)(_publish)(
            entry,
            asset,
            maintain.output,  # type: ignore[arg-type]  # XComArgs resolve at run time
        )
        maintain >> published
    return dag


def build_all(path: Path | None = None) -> dict[str, DAG]:
    """One maintenance DAG per table topic of the manifest (default ``HOME/table_topics.json``)
    whose ``automq.table.topic.maintenance.enable`` is not false.

    Like the commit DAGs: a topic whose ``automq.table.topic.enable`` was set to ``false`` keeps
    its DAG, marked disabled (``icefall_airflow.sync`` pauses it; a run skips); a topic deleted
    drops out and Airflow marks the DAG stale."""
    current = manifest.read(path)
    dags: dict[str, DAG] = {}
    for entry in current.to_build(settings.maintain_dag_id):
        if maintenance_enabled(entry):
            dag = build_maintain_dag(entry)
            dags[dag.dag_id] = dag
    return dags
