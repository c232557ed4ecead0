"""The commit step: ``spark_jobs/commit_round.py`` through spark-submit.

A SparkSubmitOperator (connection ``spark_default``; ``local[*]`` when that
connection does not exist, instead of the provider's YARN default) whose
arguments come from the plan task's XCom. Everything environment-specific (the
Iceberg jar, the Python of this venv) is looked up when the task runs, never at
DAG parse time. The job writes a result JSON; the operator returns it, so the
publish step reads it from XCom and does not need the same disk.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

SPARK_CONN_ID = "spark_default"
LOCAL_SPARK_CONNECTION = json.dumps({"conn_type": "spark", "host": "local[*]"})
SPARK_CONN_ENV = "AIRFLOW_CONN_SPARK_DEFAULT"
# The spark-submit JVM (the driver, in client mode) of a round mostly waits: the rows are
# decoded and written in Python. C1-only JIT halves its start-up CPU (about 1 s of a small
# round's 2-4 s here); set SPARK_SUBMIT_OPTS yourself to override.
DRIVER_JVM_OPTS = "-XX:TieredStopAtLevel=1"


def commit_round_script() -> str:
    """Path of the Spark application (next to the ``spark_jobs`` package helpers it imports)."""
    import spark_jobs

    return str(Path(spark_jobs.__file__).resolve().parent / "commit_round.py")


def commit_round_args(plan: dict[str, Any], result_path: str, admin_url: str) -> list[str]:
    """The job's command line for a plan (see ``spark_jobs/commit_round.py --help``)."""
    args = ["--topic", str(plan["topic"]),
            "--until-offsets", json.dumps(plan["end_offsets"], sort_keys=True, separators=(",", ":")),
            "--result", result_path, "--round-id", str(plan["round_id"]), "--admin-url", admin_url]
    if plan.get("max_records"):
        args += ["--max-records", str(int(plan["max_records"]))]
    return args


def ensure_spark_connection(conn_id: str) -> None:
    """Make ``spark_default`` mean ``local[*]`` when nobody defined it (the provider would say YARN)."""
    if conn_id != SPARK_CONN_ID or os.environ.get(SPARK_CONN_ENV):
        return
    from airflow.sdk import Connection

    try:
        Connection.get(conn_id)
    except Exception:  # noqa: BLE001 -- not defined anywhere: fall back to the single-machine default
        os.environ[SPARK_CONN_ENV] = LOCAL_SPARK_CONNECTION


class CommitRoundOperator(SparkSubmitOperator):
    """Run one commit round for the plan in XCom ``plan_task_id`` and return its result JSON."""

    def __init__(self, *, plan_task_id: str, admin_url: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        kwargs.setdefault("spark_binary", "spark-submit")
        super().__init__(**kwargs)
        self.plan_task_id = plan_task_id
        self.admin_url = admin_url

    def execute(self, context: Any) -> dict[str, Any]:  # type: ignore[override]  # the result goes to XCom
        from icefall_airflow import manifest
        from spark_jobs.jars import iceberg_jars

        plan = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if not plan:
            raise RuntimeError(f"no plan in XCom of task {self.plan_task_id}")
        admin_url = self.admin_url or manifest.admin_url()
        ensure_spark_connection(self._conn_id)
        with tempfile.TemporaryDirectory(prefix="icefall-round-") as tmp:
            result_path = os.path.join(tmp, "result.json")
            self.application = self.application or commit_round_script()
            self.jars = self.jars or ",".join(iceberg_jars())
            self.application_args = commit_round_args(plan, result_path, admin_url)
            python = sys.executable
            self.env_vars = {
                "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python,
                "PATH": os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]),
                "ICEFALL_ADMIN_URL": admin_url,
                "SPARK_SUBMIT_OPTS": os.environ.get("SPARK_SUBMIT_OPTS", DRIVER_JVM_OPTS),
                **(self.env_vars or {}),
            }
            self._hook = None  # built from the fields set above
            super().execute(context)
            try:
                result: dict[str, Any] = json.loads(Path(result_path).read_text())
            except FileNotFoundError:
                raise RuntimeError(f"{self.application} exited 0 but wrote no result to {result_path}") from None
        self.log.info("commit round %s: %s", plan["round_id"], json.dumps(result, sort_keys=True))
        return result
