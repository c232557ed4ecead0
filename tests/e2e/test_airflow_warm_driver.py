"""Airflow's commit task through the warm round driver (``spark_jobs/warm_driver.py``), as
``icefall up`` supervises it (``broker.supervisor.warm_driver``): ``dag.test()`` runs the
commit task (plan, round, publish) against a real broker whose registry and catalog require
credentials (they reach the driver in the request, from the Airflow connections).

The driver dies right after a round's publish, before its reply (``ICEFALL_ROUND_KILL_AT``: an
``os._exit``, what kill -9 does at the worst moment); the supervisor restarts it, the task asks
the restarted driver again and the table holds each record once. The next round commits in the
restarted driver; so does the round after a kill -9 of the driver's process group between
rounds, asked as soon as the restarted driver listens (while it starts Spark the task waits for
it rather than falling back). A request without the token, or whose arguments are no round, gets a 401/400 with the
reason; a round that fails in the driver fails its task with the round's message; with the
driver stopped the task runs the round itself (a Python process: the round is small).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.dags import airflow_env

airflow_env.configure()

from tests.e2e.test_airflow_rounds import (
    TOPIC,
    create_table_topic,
    cut_after_now,
    produce,
    run_round,
    set_task_env,
    table_ids,
)
from tests.e2e.test_airflow_rounds import broker as broker  # the secured broker
from tests.support import BrokerProcess, free_port, present, wait_for

KILL_ENV = "ICEFALL_ROUND_KILL_AT"


@pytest.mark.timeout(600)
def test_warm_driver_rounds_survive_its_crash_and_fall_back(
    broker: BrokerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    airflow_env.migrate_db()
    from icefall_airflow.tables import open_catalog
    from icefall_airflow.warm_driver import (
        WarmDriverClient,
        WarmDriverStarting,
        WarmDriverUnreachable,
    )

    from broker.supervisor.warm_driver import WarmDriverProcess

    create_table_topic(broker)
    set_task_env(broker, monkeypatch)  # the driver has no credentials in its environment either

    driver = WarmDriverProcess({**os.environ, KILL_ENV: "after_publish"}, tmp_path, free_port())
    request.addfinalizer(driver.stop)
    for name, value in driver.airflow_connection().items():
        monkeypatch.setenv(name, value)
    driver.start()
    stop_supervising = threading.Event()

    def supervise() -> None:  # what icefall up's loop does, once a second
        while not stop_supervising.wait(0.5):
            if driver.proc is not None and driver.proc.poll() is not None:
                driver.env.pop(KILL_ENV, None)  # the restarted driver lives
            driver.check()

    supervisor = threading.Thread(target=supervise, daemon=True)
    supervisor.start()
    request.addfinalizer(stop_supervising.set)

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(airflow_env.REPO) / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags[f"icefall_commit__{TOPIC}"]
    catalog = open_catalog(broker.catalog_url)
    client = present(WarmDriverClient.from_connection())

    def rounds_run() -> int:  # the rounds the current driver ran; the reason if it is no warm one
        try:
            return int(client.health()["rounds"])
        except (WarmDriverStarting, WarmDriverUnreachable) as exc:
            log = driver.log_path.read_text(errors="replace").splitlines()
            tail = "\n".join([line for line in log if not line.startswith("\tat ")][-60:])
            raise AssertionError(f"{exc} after the round; its log ends:\n{tail}") from exc

    driver.wait_healthy()
    # healthy means warm: a Python worker per core started before the first request, alive
    warmed = client.health()
    assert warmed["rounds"] == 0 and warmed["warm_up"]["cores"] >= 1
    assert warmed["warm_up"]["python_workers"], warmed
    for pid in warmed["warm_up"]["python_workers"]:
        os.kill(pid, 0)  # raises if the worker is gone: the first round would start one
    # a request without the token, or that is no round, gets a precise error
    bad = WarmDriverClient(client.url, "wrong")
    with pytest.raises(WarmDriverUnreachable, match="401"):
        bad.health()
    for args, env, reason in (
        (["--topic", TOPIC, "--master", "local[1]"], {}, "sets --master itself"),
        (["--topic", TOPIC], {"PATH": "/tmp"}, "env may only set"),
        (["--until-now"], {}, "not commit_round arguments"),
    ):
        with pytest.raises(RuntimeError, match=f"answered 400: .*{reason}"):
            client.run_round(args, env, None)

    # round 1: the driver dies after publishing; the task asks the restarted one again
    produce(broker, 0, 50)
    run_round(dag, cut_after_now())
    assert driver.restarts == 1
    assert table_ids(catalog) == list(range(50))  # each record once
    assert rounds_run() == 1  # the re-asked round ran in the restarted driver

    # round 2: the restarted driver commits the next records
    produce(broker, 50, 30)
    run_round(dag, cut_after_now())
    assert table_ids(catalog) == list(range(80))
    assert rounds_run() == 2 and driver.restarts == 1

    # round 3, created ahead of its interval's end (as the timetable creates runs): while the
    # task waits for the end, the driver writes the round's rows ahead; the round commits them
    produce(broker, 80, 10)
    # (8 s ahead: the task reaches its plan a few seconds after ``dag.test`` starts, on two
    # busy cores, and must do so before the end for the pre-stage to be asked for)
    run_round(dag, datetime.fromtimestamp(time.time() + 8, UTC), prestaged=10)
    assert table_ids(catalog) == list(range(90))
    assert rounds_run() == 3

    # kill -9 between rounds: restarted, and the next round commits there
    assert driver.proc is not None
    os.killpg(driver.proc.pid, signal.SIGKILL)
    wait_for(lambda: driver.restarts == 2, 30, what="the supervisor's restart")

    answers: list[str] = []

    def listening() -> bool:  # it listens before Spark starts, answering 503 "starting"
        try:
            client.health()
        except WarmDriverStarting:
            answers.append("starting")
            return True
        except WarmDriverUnreachable:
            return False
        answers.append("warm")
        return True

    wait_for(listening, 60, what="the restarted driver to listen")
    assert answers == ["starting"]  # Spark takes seconds to start; the poll comes sooner
    produce(broker, 90, 10)
    run_round(dag, cut_after_now())
    assert table_ids(catalog) == list(range(100))
    assert rounds_run() == 1

    # a round failing in the driver fails its task with the round's message
    from icefall_airflow.commit_operator import CommitRoundOperator
    from icefall_airflow.job_operator import SparkJobFailed

    task = CommitRoundOperator(task_id="commit", plan_task_id="plan")
    args = ["--topic", "nosuch", "--admin-url", broker.admin_url]
    with pytest.raises(SparkJobFailed, match="commit round r of nosuch failed: .*nosuch"):
        task.run_warm(client, broker.admin_url, args, "commit round r of nosuch")
    assert task.job_result is not None and task.job_result["status"] == "failed"

    # no driver: the task logs why and runs the round itself (``python -m``, no Spark needed)
    stop_supervising.set()
    supervisor.join(5)
    driver.stop()
    produce(broker, 100, 5)
    run_round(dag, cut_after_now())
    assert table_ids(catalog) == list(range(105))
    wait_for(lambda: driver.proc is not None and driver.proc.poll() is not None, 10)
