"""The maintenance step: ``spark_jobs/maintenance.py`` through spark-submit.

A ``SparkJobOperator`` (``job_operator``), like the commit step. When an action
fails the job exits 1 and the task fails with the job's own message (which
action, why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icefall_airflow.job_operator import TableJobOperator


def maintenance_args(topic: str, admin_url: str, actions: Sequence[str] | None) -> list[str]:
    """The job's command line (see ``spark_jobs/maintenance.py --help``); settings come from the
    topic configs and table properties, so only the topic and the actions are passed."""
    args = ["--topic", topic, "--admin-url", admin_url]
    if actions:
        args += ["--actions", ",".join(actions)]
    return args


def table_missing(admin_url: str, namespace: str, table: str) -> bool:
    """True when the catalog says the table does not exist: the job would find nothing to do,
    and a spark-submit costs a JVM start (a new table topic's first run, before its first
    round). When the broker or catalog cannot answer, the job runs and says why it fails."""
    from icefall_airflow.broker_client import BrokerClient, BrokerError
    from icefall_airflow.tables import open_catalog

    try:
        catalog = open_catalog(BrokerClient(admin_url).cluster().tables_catalog)
        return not catalog.table_exists((namespace, table))
    except (
        BrokerError,
        OSError,
        ValueError,
    ):  # ValueError: pydantic's, an answer that is not ClusterInfo
        return False
    except Exception:  # noqa: BLE001 -- a catalog error: let the job report it
        return False


class MaintenanceOperator(TableJobOperator):
    """Run table maintenance for ``topic`` (the actions in param ``actions``) and return the result JSON."""

    script = "maintenance.py"
    when_disabled = "no maintenance"

    def __init__(self, *, namespace: str, table: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.namespace = namespace
        self.table = table

    def lineage(self, result: dict[str, Any], cluster: Any) -> Any:
        from icefall_airflow.lineage import maintenance_lineage

        if result.get("status") != "done":
            return None
        return maintenance_lineage(result, cluster, self.namespace, self.table)

    def execute(self, context: Any) -> dict[str, Any]:  # the result goes to XCom
        admin_url = self.admin_url_or_skip()
        actions = (context.get("params") or {}).get("actions")
        if table_missing(admin_url, self.namespace, self.table):
            self.log.info(
                "%s.%s does not exist yet (no round committed): nothing to maintain, no Spark started",
                self.namespace,
                self.table,
            )
            return {
                "status": "no_table",
                "topic": self.topic,
                "namespace": self.namespace,
                "table": self.table,
                "actions": list(actions or []),
                "message": "the table does not exist yet",
            }
        return self.run_job(
            context,
            admin_url,
            maintenance_args(self.topic, admin_url, actions),
            f"maintenance of {self.topic}",
        )
