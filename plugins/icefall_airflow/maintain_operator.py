"""The maintenance step: ``spark_jobs/maintenance.py`` through spark-submit.

Like the commit step (``commit_operator``): a SparkSubmitOperator on the
connection ``spark_default`` (``local[*]`` when it is not defined), with the
Iceberg jar and this venv's Python looked up when the task runs, never at parse
time. The job writes a result JSON, which the operator returns for XCom. When
an action fails the job exits 1: the task then fails with the job's own message
(which action, why) instead of spark-submit's bare exit code.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from icefall_airflow.commit_operator import SPARK_CONN_ID, ensure_spark_connection


class MaintenanceFailed(RuntimeError):
    """The maintenance job failed; the message is the job's."""


def maintenance_script() -> str:
    """Path of the Spark application (next to the ``spark_jobs`` helpers it imports)."""
    import spark_jobs

    return str(Path(spark_jobs.__file__).resolve().parent / "maintenance.py")


def maintenance_args(topic: str, result_path: str, admin_url: str, actions: Sequence[str] | None) -> list[str]:
    """The job's command line (see ``spark_jobs/maintenance.py --help``); settings come from the
    topic configs and table properties, so only the topic and the actions are passed."""
    args = ["--topic", topic, "--result", result_path, "--admin-url", admin_url]
    if actions:
        args += ["--actions", ",".join(actions)]
    return args


def read_result(path: str) -> dict[str, Any] | None:
    try:
        result: dict[str, Any] = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    return result


class MaintenanceOperator(SparkSubmitOperator):
    """Run table maintenance for ``topic`` (the actions in param ``actions``) and return the result JSON."""

    def __init__(self, *, topic: str, namespace: str, table: str, topic_enabled: bool = True,
                 admin_url: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        kwargs.setdefault("spark_binary", "spark-submit")
        super().__init__(**kwargs)
        self.topic = topic
        self.namespace = namespace
        self.table = table
        self.topic_enabled = topic_enabled
        self.admin_url = admin_url

    def _no_table_yet(self, admin_url: str) -> bool:
        """True when the catalog says the table does not exist: the job would find nothing to do,
        and a spark-submit costs a JVM start (a new table topic's first run, before its first
        round). When the broker or catalog cannot answer, the job runs and says why it fails."""
        from icefall_airflow.broker_client import BrokerClient, BrokerError
        from icefall_airflow.tables import open_catalog

        try:
            catalog = open_catalog(BrokerClient(admin_url).cluster()["catalog_url"])
            return not catalog.table_exists((self.namespace, self.table))
        except (BrokerError, OSError, KeyError):
            return False
        except Exception:  # noqa: BLE001 -- a catalog error: let the job report it
            return False

    def execute(self, context: Any) -> dict[str, Any]:  # type: ignore[override]  # the result goes to XCom
        from airflow.exceptions import AirflowException
        from airflow.sdk.exceptions import AirflowSkipException

        from icefall_airflow import manifest
        from spark_jobs.jars import iceberg_jars

        if not self.topic_enabled:
            raise AirflowSkipException(f"topic {self.topic} is not a table topic now "
                                       "(automq.table.topic.enable=false): no maintenance")
        actions = (context.get("params") or {}).get("actions")
        admin_url = self.admin_url or manifest.admin_url()
        if self._no_table_yet(admin_url):
            self.log.info("%s.%s does not exist yet (no round committed): nothing to maintain, no Spark started",
                          self.namespace, self.table)
            return {"status": "no_table", "topic": self.topic, "namespace": self.namespace, "table": self.table,
                    "actions": list(actions or []), "message": "the table does not exist yet"}
        ensure_spark_connection(self._conn_id)
        with tempfile.TemporaryDirectory(prefix="icefall-maintain-") as tmp:
            result_path = os.path.join(tmp, "result.json")
            self.application = self.application or maintenance_script()
            self.jars = self.jars or ",".join(iceberg_jars())
            self.application_args = maintenance_args(self.topic, result_path, admin_url, actions)
            python = sys.executable
            self.env_vars = {
                "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python,
                "PATH": os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]),
                "ICEFALL_ADMIN_URL": admin_url, **(self.env_vars or {}),
            }
            self._hook = None  # built from the fields set above
            try:
                super().execute(context)
            except AirflowException as exc:
                result = read_result(result_path)
                if result is None:
                    raise
                self.log.info("maintenance of %s: %s", self.topic, json.dumps(result, sort_keys=True))
                raise MaintenanceFailed(f"maintenance of {self.topic} failed: {result.get('message')}") from exc
            result = read_result(result_path)
            if result is None:
                raise MaintenanceFailed(f"{self.application} exited 0 but wrote no result to {result_path}")
        self.log.info("maintenance of %s: %s", self.topic, json.dumps(result, sort_keys=True))
        return result
