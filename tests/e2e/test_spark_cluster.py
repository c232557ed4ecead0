"""Commit rounds on a real Spark standalone cluster (``tests/spark_cluster.py``: a master and two
one-core workers on loopback), submitted as Airflow submits them: through the ``spark_default``
connection (``spark://127.0.0.1:<port>``, client deploy mode), with the jars and the
``--py-files`` zip the plugin adds; the executors read the segments from S3 (moto) with the
settings the job hands them (the workers' environment has no ``AWS_*`` and no ``PYTHONPATH``).

- The same records committed once on ``local[*]`` (the operator's spark-submit command line)
  and, after the table is dropped, once on the cluster by a real Airflow DAG run
  (``dag.test()`` of the commit task) give the same rows, the same number of data files
  and the same committed offsets; the round's tasks ran in executors on the workers.
- An executor JVM killed with SIGKILL while the round's Python tasks run breaks nothing: the
  round completes (Spark runs the task again elsewhere) or fails and the next one commits, and
  the table holds every acknowledged record exactly once.

One cluster, one broker and one moto server for the module; one or two rounds per check.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dags import airflow_env

airflow_env.configure()

from broker import checkpoint  # noqa: E402 -- after Airflow's configuration
from spark_jobs.rounds.tasks import TASK_DELAY_ENV  # noqa: E402
from tests.conftest import MotoS3, set_moto_credentials_only, start_s3_broker  # noqa: E402
from tests.spark_cluster import SparkCluster  # noqa: E402
from tests.spark_jobs.round_support import (  # noqa: E402
    CLICK_V1,
    AvroProducer,
    new_topic,
    table,
    table_offsets,
)
from tests.spark_jobs.test_commit_round import clicks  # noqa: E402
from tests.support import REPO, BrokerProcess, wait_for  # noqa: E402

LOCAL_SPARK = json.dumps({"conn_type": "spark", "host": "local[*]"})


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    started = SparkCluster(root=tmp_path_factory.mktemp("spark-cluster")).launch()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def cluster(launched: SparkCluster, broker: BrokerProcess) -> SparkCluster:
    """The cluster, up: its JVMs start while the broker does."""
    return launched.wait_ready()


@pytest.fixture(scope="module")
def env() -> Iterator[pytest.MonkeyPatch]:
    """This process's (the driver's) environment: S3 credentials only (the endpoint comes from
    the broker), rounds always on Spark's task path (they are small), Spark on loopback."""
    with pytest.MonkeyPatch.context() as mp:
        set_moto_credentials_only(mp)
        mp.setenv("ICEFALL_ROUND_IN_DRIVER_MAX_BYTES", "0")
        # the driver on loopback too: Spark would take the first interface's address when the
        # hostname resolves to 127.0.0.1, and the executors would call it there
        mp.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        yield mp


@pytest.fixture(scope="module")
def broker(
    moto_s3: MotoS3, env: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    started, _ = start_s3_broker(
        moto_s3, tmp_path_factory.mktemp("cluster-rounds") / "home", ["--segment-flush-ms", "100"]
    )
    try:
        yield started
    finally:
        started.stop()


def submit_command(
    broker: BrokerProcess, args: list[str], result: Path
) -> tuple[list[str], dict[str, str]]:
    """The spark-submit command line and environment the DAG's commit operator builds for
    ``args`` on the connection ``spark_default`` as the environment defines it now."""
    from icefall_airflow.commit_operator import CommitRoundOperator

    operator = CommitRoundOperator(
        task_id="commit", plan_task_id="plan", name="icefall-commit-test"
    )
    operator.prepare(broker.admin_url, args, str(result))
    hook = operator._get_hook()
    command = hook._build_spark_submit_command(operator.application)
    return command, {**os.environ, **(hook._env or {})}


def submit(
    broker: BrokerProcess, args: list[str], result: Path, executor_env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """spark-submit the round; ``executor_env``: variables for the executors (``--conf
    spark.executorEnv.*``), for this run only."""
    command, environment = submit_command(broker, args, result)
    for name, value in (executor_env or {}).items():
        command[1:1] = ["--conf", f"spark.executorEnv.{name}={value}"]
    return subprocess.Popen(
        command,
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(
    proc: subprocess.Popen[str], result: Path, timeout: float = 300
) -> tuple[dict[str, Any], str]:
    """The round's result JSON and spark-submit's output."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise
    assert result.is_file(), output[-4000:]
    found: dict[str, Any] = json.loads(result.read_text())
    assert (proc.returncode == 0) == (found["status"] != "failed"), output[-4000:]
    return found, output


def table_facts(
    broker: BrokerProcess, topic: str
) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
    """Every row (by partition and offset), the data files of the current snapshot, and the
    committed offsets (its checkpoint)."""
    current = table(broker, topic)
    rows = current.scan().to_arrow().to_pylist()
    rows.sort(key=lambda r: (r["_kafka_metadata"]["partition"], r["_kafka_metadata"]["offset"]))
    files = len(current.inspect.files())
    snapshot = current.current_snapshot()
    assert snapshot is not None
    offsets = json.loads(checkpoint.summary_properties(snapshot)[checkpoint.OFFSETS])
    return rows, files, offsets


def tasks_ran_on_workers(cluster: SparkCluster, app_name: str) -> list[str]:
    """The ids of the applications named ``app_name`` that the master ran, after checking that
    each had executors on this cluster's workers and that those executors ran tasks (their own
    log in the worker's work directory says so) with the shipped code zip beside them."""
    apps = [a["id"] for a in cluster.applications() if a["name"] == app_name]
    assert apps, f"the master ran no application {app_name}: {cluster.applications()}"
    for app in apps:
        executors = cluster.executors_of(app)
        assert executors, f"{app} ran no executor on a worker"
        logs = list(cluster.root.glob(f"work-*/{app}/*/stderr"))
        ran = [p for p in logs if "Running task" in p.read_text(errors="replace")]
        assert ran, f"no executor of {app} ran a task: {logs}"
        assert any(p.parent.glob("icefall-py-files-*.zip") for p in ran), ran
    return apps


@pytest.mark.timeout(600)
def test_a_round_on_the_cluster_commits_what_local_spark_commits(
    cluster: SparkCluster, broker: BrokerProcess, env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    airflow_env.migrate_db()
    topic = new_topic(broker, partitions=2)
    producer = AvroProducer(broker, topic, CLICK_V1)
    producer.send(clicks(0, 400), key=lambda v: str(v["id"]).encode())
    ends = {str(p): 1 + max(o for q, o in producer.acked if q == p) for p in (0, 1)}

    # local[*]: the operator's own command line
    env.setenv("AIRFLOW_CONN_SPARK_DEFAULT", LOCAL_SPARK)
    command, _ = submit_command(broker, ["--topic", topic], tmp_path / "unused.json")
    assert "--py-files" not in command  # local executors import the installed package
    result, _ = finish(
        submit(
            broker, ["--topic", topic, "--until-offsets", json.dumps(ends)], tmp_path / "local.json"
        ),
        tmp_path / "local.json",
    )
    assert result["status"] == "committed" and result["executor"] == "spark", result
    local = table_facts(broker, topic)
    assert local[2] == ends and len(local[0]) == 400
    assert not [a for a in cluster.applications() if a["name"] == f"icefall-commit-{topic}"]

    # the same records again, on the cluster, by the commit DAG
    from pyiceberg.catalog import load_catalog

    load_catalog("c", type="rest", uri=broker.catalog_url).drop_table(
        ("default", topic.replace("-", "_"))
    )
    env.setenv("AIRFLOW_CONN_SPARK_DEFAULT", cluster.airflow_connection())
    env.setenv("ICEFALL_HOME", str(broker.home))
    env.setenv("ICEFALL_ADMIN_URL", broker.admin_url)
    command, _ = submit_command(broker, ["--topic", topic], tmp_path / "unused.json")
    assert command[command.index("--master") + 1] == cluster.master_url
    assert command[command.index("--deploy-mode") + 1] == "client"
    assert command[command.index("--py-files") + 1].endswith(".zip")
    assert "iceberg-spark-runtime" in command[command.index("--jars") + 1]

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags[f"icefall_commit__{topic}"]
    run = dag.test(logical_date=None)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert str(run.state) == "success", states
    assert table_facts(broker, topic) == local
    tasks_ran_on_workers(cluster, f"icefall-commit-{topic}")


@pytest.mark.timeout(600)
def test_an_executor_killed_mid_round_breaks_nothing(
    cluster: SparkCluster, broker: BrokerProcess, env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env.setenv("AIRFLOW_CONN_SPARK_DEFAULT", cluster.airflow_connection())
    topic = new_topic(broker, partitions=3)
    producer = AvroProducer(broker, topic, CLICK_V1)
    producer.send(clicks(0, 3000), key=lambda v: str(v["id"]).encode())
    round_args = ["--topic", topic, "--until-now"]

    # each task of this round waits 2 s before it reads (a hook for tests only): the kill below
    # lands while a task certainly runs, not after the round happened to end between two polls
    slow = {TASK_DELAY_ENV: "2"}
    proc = submit(broker, round_args, tmp_path / "killed.json", executor_env=slow)

    def busy_executor() -> int | None:
        """An executor JVM whose Python workers have started: a round's task is running there
        (-1: the round ended before any did; the tasks' delay makes that a failure to report)."""
        if proc.poll() is not None:
            return -1
        return next(
            (pid for pid in cluster.executor_pids() if cluster.python_workers_of(pid)), None
        )

    victim = wait_for(busy_executor, 180, interval=0.02, what="a task of the round on an executor")
    assert victim != -1, "the round ended before any task ran on an executor"
    driver = re.search(
        r"--driver-url spark://CoarseGrainedScheduler@([^:]+):", cluster.cmdline(victim)
    )
    assert driver and driver.group(1) in ("127.0.0.1", "localhost"), cluster.cmdline(victim)
    os.kill(victim, signal.SIGKILL)
    first, output = finish(proc, tmp_path / "killed.json")
    print({"executor_killed": victim, "round": first["status"], "message": first.get("message")})
    # the driver saw the executor go, and a task of the round with it (TaskSetManager's warning)
    assert "Lost executor" in output and "Lost task" in output, output[-4000:]
    assert first["status"] in ("committed", "failed"), first
    if first["status"] == "failed":
        again, _ = finish(
            submit(broker, round_args, tmp_path / "again.json"), tmp_path / "again.json"
        )
        assert again["status"] == "committed", again
    last = table(broker, topic).current_snapshot()
    assert last is not None
    ends = {str(p): 1 + max(o for q, o in producer.acked if q == p) for p in (0, 1, 2)}
    assert json.loads(checkpoint.summary_properties(last)[checkpoint.OFFSETS]) == ends
    offsets = table_offsets(broker, topic)
    assert len(offsets) == len(set(offsets)), "duplicate rows"
    assert offsets == sorted(producer.acked), "missing rows"
