"""The commit step: ``spark_jobs/commit_round.py`` in a warm driver, as a Python process, or
through spark-submit.

A ``SparkJobOperator`` (``job_operator``) whose arguments come from a plan
(``broker.contracts.RoundPlan``); the round's result JSON
(``broker.contracts.RoundResult``) goes to XCom. When the connection
``icefall_warm_driver`` is defined (``icefall up`` defines it) the round runs in that
long-lived driver instead (``warm_driver``: no JVM start per round), with the same
arguments and result; a driver that cannot be reached makes the task log why and run
the round itself, as below.

Without a warm driver the task first runs the round as a Python process,
``python -m spark_jobs.commit_round --without-spark``. A round with nothing new, or one
small enough for its one task to run in the driver (``--in-driver-max-bytes``, 1 GiB by
default) and written by pyiceberg, never starts Spark anyway: under spark-submit it paid a
JVM's start for nothing, once per interval per topic, idle or not. Measured
(``bench/task_round.py``, two cores): an empty round 3.8 s and 4.4 CPU-s spark-submitted,
1.6 s and 1.7 CPU-s as a Python process (1.2 CPU-s since ``broker.iceberg_fileio`` makes
pyarrow's FileIO at the first file: an empty round opens none); a 4 MiB round 4.0 s and 4.7 CPU-s against 2.0 s and
2.0 CPU-s.
A round that needs Spark (larger than that, or a table that turned format v3) says so from
its plan before it writes any rows (``spark_needed``; a DLQ commit a crash left half done
may be finished first, as every round does), and the task spark-submits it. Every round is
spark-submitted, as before, when the driver belongs on the cluster (deploy mode ``cluster``:
the operator's, the connection's ``deploy-mode`` or the ``spark.submit.deployMode`` conf),
and when ``ICEFALL_ROUND_IN_DRIVER_MAX_BYTES=0`` in the workers' environment sends every
round with records to Spark. On a table whose rounds with records always need Spark (upsert,
JSON values, format v3: ``TableSettings.rounds_need_spark``, which the factory passes on) a
round is spark-submitted at once when the broker says records wait for the table (its
``pending``), else tried as a Python process (an idle interval's round: no JVM).

The commit DAGs run a whole round in this one task: ``planner`` plans it in the task
(the plan also goes to XCom, key ``plan``) and ``publisher`` turns the result into the
table's asset event. Plan, commit and publish used to be three tasks; each hand-over
waited for the scheduler's next loop (0.6-0.8 s, median, between the plan's end and the
commit's start, all of it in the round's freshness) and each task was a process start,
parse and a few API calls (``bench/airflow_cpu.py``). Nothing is lost by the merge: a
plan for an interval depends only on the interval (``planning``), so a retried task plans
the same offsets, and the round is exactly once whatever it is told (``commit_round``).
Other callers give ``plan_task_id`` instead and read the plan from that task's XCom.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from broker import contracts
from broker.env_values import ROUND_IN_DRIVER_MAX_BYTES
from icefall_airflow.job_operator import (
    SparkJobFailed,
    SparkJobOperator,
    job_script,
    read_result,
    spark_deploy_mode,
)
from icefall_airflow.warm_driver import WarmDriverClient, WarmDriverUnreachable

# The spark-submit JVM (the driver, in client mode) of a round mostly waits: the rows are
# decoded and written in Python. C1-only JIT halves its start-up CPU (about 1 s of a small
# round's 2-4 s here); set SPARK_SUBMIT_OPTS yourself to override.
DRIVER_JVM_OPTS = "-XX:TieredStopAtLevel=1"


def _stop(proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """Terminate the round's process, kill it if it has not exited within ``grace_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def commit_round_script() -> str:
    return job_script("commit_round.py")


def commit_round_args(plan: Mapping[str, Any] | contracts.RoundPlan, admin_url: str) -> list[str]:
    """The job's command line for a plan (``broker.contracts.RoundPlan``, the commit task's
    XCom ``plan``; see ``spark_jobs/commit_round.py --help``; the operator adds ``--result``)."""
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


# the plan (a ``broker.contracts.RoundPlan`` as JSON), made in the task
Planner = Callable[[], dict[str, Any]]
# called with the round's result and its plan once the round ran; raises to skip or fail
Publisher = Callable[[dict[str, Any], dict[str, Any]], None]


class CommitRoundOperator(SparkJobOperator):
    """Run one commit round and return its result JSON: for the plan ``planner`` makes in the
    task, or for the one in XCom of ``plan_task_id``; then ``publisher``, if given."""

    script = "commit_round.py"
    driver_jvm_opts = DRIVER_JVM_OPTS

    def __init__(
        self,
        *,
        plan_task_id: str | None = None,
        rounds_need_spark: bool = False,
        planner: Planner | None = None,
        publisher: Publisher | None = None,
        admin_url: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (plan_task_id is None) == (planner is None):
            raise ValueError("give the commit task either plan_task_id or planner, not both")
        self.plan_task_id = plan_task_id
        # every round with records needs Spark (``TableSettings.rounds_need_spark``, the
        # factory's): such a round is spark-submitted at once (``python_first``)
        self.rounds_need_spark = rounds_need_spark
        self.planner = planner
        self.publisher = publisher
        self.admin_url = admin_url

    def plan(self, context: Any) -> dict[str, Any]:
        if self.planner is not None:
            plan = self.planner()
            context["ti"].xcom_push(key="plan", value=plan)
            return plan
        plan = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if not plan:
            raise RuntimeError(f"no plan in XCom of task {self.plan_task_id}")
        return dict(plan)

    def lineage(self, result: dict[str, Any], cluster: Any) -> Any:
        from icefall_airflow.lineage import round_lineage

        return round_lineage(result, cluster)

    def execute(self, context: Any) -> dict[str, Any]:  # the result goes to XCom
        from icefall_airflow import manifest

        plan = self.plan(context)
        admin_url = self.admin_url or manifest.admin_url()
        result = self.run_round(context, plan, admin_url)
        if self.publisher is not None:
            self.publisher(result, plan)
        return result

    def run_round(self, context: Any, plan: dict[str, Any], admin_url: str) -> dict[str, Any]:
        args = commit_round_args(plan, admin_url)
        label = f"commit round {plan['round_id']} of {plan['topic']}"
        warm = WarmDriverClient.from_connection()
        if warm is not None:
            try:
                return self.run_warm(warm, admin_url, args, label)
            except WarmDriverUnreachable as exc:
                self.log.warning("%s; running %s without it", exc, label)
        if self.python_first(plan["topic"], admin_url):
            result = self.run_without_spark(admin_url, args, label)
            if result["status"] != contracts.ROUND_SPARK_NEEDED:
                return result
            self.log.info("%s: %s; running it with spark-submit", label, result["message"])
            if self._killed:  # between the two processes: nothing is running for on_kill to stop
                raise SparkJobFailed(f"{label}: the task was stopped before its spark-submit")
            self.job_result = None
        return self.run_job(context, admin_url, args, label)

    def python_first(self, topic: str, admin_url: str) -> bool:
        """Whether the round runs as a Python process before any spark-submit: not when its
        driver belongs on the cluster (deploy mode ``cluster``: the operator's, else the
        connection's, else the ``spark.submit.deployMode`` conf, spark-submit's own order), nor
        when a driver limit of 0 bytes sends every round with records to Spark; on a table whose
        rounds with records always need Spark (``rounds_need_spark``), only when no record
        waits for it (the broker's ``pending``): an idle interval's round then costs no JVM,
        and a round with records does not pay the Python process's start on top of
        spark-submit's."""
        mode = spark_deploy_mode(self._conn_id, self._hook_args["deploy_mode"]) or (
            self.conf or {}
        ).get("spark.submit.deployMode")
        if mode == "cluster" or ROUND_IN_DRIVER_MAX_BYTES.read() == 0:
            return False
        if not self.rounds_need_spark:
            return True
        from icefall_airflow.broker_client import BrokerClient

        try:
            waiting = BrokerClient(admin_url).pending(topic).records
        except Exception as exc:  # noqa: BLE001 -- the Python process asks again and decides
            self.log.info("could not ask what waits for %s's table (%s)", topic, exc)
            return True
        return waiting == 0

    def run_without_spark(self, admin_url: str, args: list[str], label: str) -> dict[str, Any]:
        """The round as ``python -m spark_jobs.commit_round --without-spark`` in this task's
        environment plus the job's (``job_env``, as spark-submit gets it): its result JSON, or
        ``SparkJobFailed`` with its message."""
        env = {**os.environ, **self.job_env(admin_url)}
        self.log.info("%s: as a Python process (Spark only if it needs it)", label)
        with tempfile.TemporaryDirectory(prefix="icefall-job-") as tmp:
            result_path = os.path.join(tmp, "result.json")
            # -P: the installed package, never a source tree in the working directory (an image's)
            command = [sys.executable, "-P", "-m", "spark_jobs.commit_round", *args]
            proc = subprocess.Popen(
                [*command, "--without-spark", "--result", result_path],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            self._round_process = proc
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    self.log.info("%s", line.rstrip())
                code = proc.wait()
            except BaseException:  # the task's timeout, a kill: the round goes with the task
                _stop(proc)
                raise
            finally:
                self._round_process = None
                if proc.stdout is not None:
                    proc.stdout.close()
            result = read_result(result_path)
        if result is None:
            self.job_result, self.lineage_admin_url = None, admin_url
            raise SparkJobFailed(f"{label} exited {code} and wrote no result")
        return self._finish(label, admin_url, code, result)

    _round_process: subprocess.Popen[str] | None = None
    _killed = False

    def on_kill(self) -> None:
        self._killed = True
        proc = self._round_process
        if proc is not None and proc.poll() is None:
            proc.terminate()
        elif self._hook is not None:  # a spark-submit was started (else there is none to kill)
            self._hook.on_kill()

    def run_warm(
        self, warm: WarmDriverClient, admin_url: str, args: list[str], label: str
    ) -> dict[str, Any]:
        """The round in the warm driver: its result JSON, or ``SparkJobFailed`` with its message."""
        from icefall_airflow import credentials

        self.log.info("%s: asking the warm driver at %s", label, warm.url)
        code, result = warm.run_round(args, credentials.job_env(), self.log)
        return self._finish(label, admin_url, code, result)

    def _finish(
        self, label: str, admin_url: str, code: int, result: dict[str, Any]
    ) -> dict[str, Any]:
        """A round run in the warm driver or as a Python process: its result kept for lineage
        and logged; ``SparkJobFailed`` with its message when it exited non-zero."""
        self.job_result, self.lineage_admin_url = result, admin_url
        self.log.info("%s: %s", label, json.dumps(result, sort_keys=True))
        if code != 0:
            raise SparkJobFailed(f"{label} failed: {result.get('message')}")
        return result
