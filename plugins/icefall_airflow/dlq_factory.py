"""The DLQ reprocess DAGs: one per table topic, ``icefall_dlq_reprocess__<topic>``, run by hand.

After a fix (a schema registered late, a config corrected) a user triggers the
table's DLQ reprocess from the UI instead of a shell: ``spark_jobs/dlq_reprocess.py``
moves the DLQ records that now decode into the table (merged by id on upsert
tables) and out of ``<table>__dlq`` in one catalog transaction. It writes the
table, so its ``reprocess`` task takes the table's one-slot pool, like the
commit rounds and maintenance: it never races them. A run that moved rows
emits an event on ``icefall/<namespace>/<table>/dlq-reprocess`` whose extra
lists the offsets moved (the new rows of that snapshot).

No schedule: nothing changes in the DLQ by itself. Built from the broker's
manifest file only, like the other DAGs (no network, no database at parse time).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, Metadata, task

from broker import contracts
from icefall_airflow import manifest, settings
from icefall_airflow.assets import dlq_reprocess_asset
from icefall_airflow.job_operator import TableJobOperator, check_job_result

log = logging.getLogger(__name__)

START_DATE = datetime(2026, 1, 1, tzinfo=UTC)
RESULT_STATUSES = ("moved", "nothing_to_move")

DOC = """\
### Reprocess the DLQ of `{namespace}.{table}` (topic `{topic}`)

Trigger it after fixing what sent records to `{namespace}.{dlq}` (register the missing schema,
correct a topic config). The records that now decode move to the table and leave the DLQ in one
commit; the others stay. On an upsert table a record moves into the table only if no later record
of its id has been committed since. Runs in the pool `{pool}`, shared with the commit rounds and
maintenance. A run that moved rows emits an event on `{asset}` (extra: the offsets moved).
"""


def check_result(result: Any) -> dict[str, Any]:
    return check_job_result(result, "DLQ reprocess", RESULT_STATUSES, contracts.ReprocessResult)


def asset_extra(entry: manifest.TableTopic, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "topic": entry.topic,
        "namespace": entry.namespace,
        "table": entry.table,
        **{
            key: result.get(key)
            for key in (
                "snapshot_id",
                "dlq_snapshot_id",
                "round_id",
                "moved",
                "moved_offsets",
                "superseded",
                "still_bad",
                "only_in_dlq",
                "unavailable",
                "schema_changes",
                "seconds",
            )
        },
    }


class DlqReprocessOperator(TableJobOperator):
    """Run ``spark_jobs/dlq_reprocess.py`` for ``topic`` and return its result JSON."""

    script = "dlq_reprocess.py"
    when_disabled = "nothing to reprocess into"

    def __init__(self, *, namespace: str, table: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.namespace = namespace
        self.table = table

    def lineage(self, result: dict[str, Any], cluster: Any) -> Any:
        from icefall_airflow.lineage import reprocess_lineage

        if result.get("status") != "moved":
            return None
        return reprocess_lineage(result, cluster, self.namespace, self.table)

    def execute(self, context: Any) -> dict[str, Any]:  # the result goes to XCom
        admin_url = self.admin_url_or_skip()
        return self.run_job(
            context,
            admin_url,
            ["--topic", self.topic, "--admin-url", admin_url],
            f"DLQ reprocess of {self.topic}",
        )


def _publish(
    entry: manifest.TableTopic, asset: Asset, result: dict[str, Any]
) -> Iterator[Metadata]:
    from airflow.sdk.exceptions import AirflowSkipException

    check_result(result)
    log.info("DLQ reprocess of %s: %s", entry.topic, result.get("message"))
    if result["status"] == "nothing_to_move":
        raise AirflowSkipException(f"nothing moved: {result.get('message')}")
    yield Metadata(asset, asset_extra(entry, result))


def build_dlq_dag(entry: manifest.TableTopic) -> DAG:
    asset = dlq_reprocess_asset(entry.namespace, entry.table)
    with DAG(
        dag_id=settings.dlq_dag_id(entry.topic),
        description=f"Move records that now decode from {entry.namespace}.{settings.dlq_table(entry.table)} "
        f"into {entry.namespace}.{entry.table} (Kafka topic {entry.topic})",
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=False,
        dagrun_timeout=timedelta(hours=2),
        tags=entry.dag_tags("dlq"),
        doc_md=entry.disabled_note
        + DOC.format(
            topic=entry.topic,
            namespace=entry.namespace,
            table=entry.table,
            dlq=settings.dlq_table(entry.table),
            pool=entry.pool,
            asset=settings.dlq_asset_name(entry.namespace, entry.table),
        ),
    ) as dag:
        reprocess = DlqReprocessOperator(
            task_id="reprocess",
            topic=entry.topic,
            namespace=entry.namespace,
            table=entry.table,
            topic_enabled=entry.enabled,
            pool=entry.pool,
            name=f"icefall-dlq-{entry.topic}",
            execution_timeout=timedelta(hours=1),
        )
        published = task(task_id="publish", outlets=[asset], retries=0)(_publish)(
            entry,
            asset,
            reprocess.output,  # type: ignore[arg-type]  # XComArgs resolve at run time
        )
        reprocess >> published
    return dag


def build_all(path: Path | None = None) -> dict[str, DAG]:
    """One DLQ reprocess DAG per table topic of the manifest (default ``HOME/table_topics.json``);
    a disabled topic keeps its DAG, marked disabled, and a run skips."""
    current = manifest.read(path)
    dags: dict[str, DAG] = {}
    for entry in current.to_build(settings.dlq_dag_id):
        dag = build_dlq_dag(entry)
        dags[dag.dag_id] = dag
    return dags
