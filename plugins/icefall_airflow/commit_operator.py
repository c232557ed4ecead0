"""The commit step: ``spark_jobs/commit_round.py`` through spark-submit, or a warm driver.

A ``SparkJobOperator`` (``job_operator``) whose arguments come from the plan
task's XCom (``broker.contracts.RoundPlan``); the round's result JSON
(``broker.contracts.RoundResult``) goes to XCom for the publish step. When the
connection ``icefall_warm_driver`` is defined (``icefall up`` defines it) the round runs
in that long-lived driver instead (``warm_driver``: no JVM start per round), with the same
arguments and result; a driver that cannot be reached makes the task log why and run
spark-submit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from broker import contracts
from icefall_airflow.job_operator import SparkJobFailed, SparkJobOperator, job_script
from icefall_airflow.warm_driver import WarmDriverClient, WarmDriverUnreachable

# The spark-submit JVM (the driver, in client mode) of a round mostly waits: the rows are
# decoded and written in Python. C1-only JIT halves its start-up CPU (about 1 s of a small
# round's 2-4 s here); set SPARK_SUBMIT_OPTS yourself to override.
DRIVER_JVM_OPTS = "-XX:TieredStopAtLevel=1"


def commit_round_script() -> str:
    return job_script("commit_round.py")


def commit_round_args(plan: Mapping[str, Any] | contracts.RoundPlan, admin_url: str) -> list[str]:
    """The job's command line for a plan (the plan task's XCom, ``broker.contracts.RoundPlan``; see
    ``spark_jobs/commit_round.py --help``; the operator adds ``--result``)."""
    planned = contracts.RoundPlan.model_validate(plan)
    args = [
        "--topic",
        planned.topic,
        "--until-offsets",
        json.dumps(planned.to_json()["end_offsets"], sort_keys=True, separators=(",", ":")),
        "--round-id",
        planned.round_id,
        "--admin-url",
        admin_url,
    ]
    if planned.max_records:
        args += ["--max-records", str(int(planned.max_records))]
    return args


class CommitRoundOperator(SparkJobOperator):
    """Run one commit round for the plan in XCom ``plan_task_id`` and return its result JSON."""

    script = "commit_round.py"
    driver_jvm_opts = DRIVER_JVM_OPTS

    def __init__(self, *, plan_task_id: str, admin_url: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan_task_id = plan_task_id
        self.admin_url = admin_url

    def lineage(self, result: dict[str, Any], cluster: Any) -> Any:
        from icefall_airflow.lineage import round_lineage

        return round_lineage(result, cluster)

    def execute(self, context: Any) -> dict[str, Any]:  # the result goes to XCom
        from icefall_airflow import manifest

        plan = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if not plan:
            raise RuntimeError(f"no plan in XCom of task {self.plan_task_id}")
        admin_url = self.admin_url or manifest.admin_url()
        args = commit_round_args(plan, admin_url)
        label = f"commit round {plan['round_id']} of {plan['topic']}"
        warm = WarmDriverClient.from_connection()
        if warm is not None:
            try:
                return self.run_warm(warm, admin_url, args, label)
            except WarmDriverUnreachable as exc:
                self.log.warning("%s; running %s with spark-submit instead", exc, label)
        return self.run_job(context, admin_url, args, label)

    def run_warm(
        self, warm: WarmDriverClient, admin_url: str, args: list[str], label: str
    ) -> dict[str, Any]:
        """The round in the warm driver: its result JSON, or ``SparkJobFailed`` with its message."""
        from icefall_airflow import credentials

        self.log.info("%s: asking the warm driver at %s", label, warm.url)
        code, result = warm.run_round(args, credentials.job_env(), self.log)
        self.job_result, self.lineage_admin_url = result, admin_url
        self.log.info("%s: %s", label, json.dumps(result, sort_keys=True))
        if code != 0:
            raise SparkJobFailed(f"{label} failed: {result.get('message')}")
        return result
