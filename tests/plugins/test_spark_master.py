"""The Spark master a job's connection names (``job_operator.spark_master``), read from the
connection's public fields, is the one the apache-spark provider's hook submits to: it decides
whether the executors get the code zip (``py_files``). The deploy mode too: with ``cluster`` the
commit task spark-submits every round instead of trying it as a Python process first."""

from __future__ import annotations

from typing import Any

import pytest
from icefall_airflow.job_operator import spark_deploy_mode, spark_master

from tests.support import BrokerProcess


@pytest.mark.parametrize(
    ("connection", "master"),
    [
        ('{"conn_type": "spark", "host": "local[2]"}', "local[2]"),
        (
            '{"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077}',
            "spark://10.0.0.5:7077",
        ),
        ('{"conn_type": "spark", "host": "yarn"}', "yarn"),
        ("spark://master-host:7077", "spark://master-host:7077"),
    ],
)
def test_the_master_is_the_hooks(
    connection: str, master: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_ICEFALL_TEST_SPARK", connection)
    assert spark_master("icefall_test_spark") == master
    hook = SparkSubmitHook(conn_id="icefall_test_spark")
    assert hook._build_spark_submit_command("app.py")[1:3] == ["--master", master]


@pytest.mark.parametrize(
    ("connection", "given", "mode"),
    [
        ('{"conn_type": "spark", "host": "spark://m", "port": 7077}', None, None),
        (
            '{"conn_type": "spark", "host": "spark://m", "port": 7077, "extra": {"deploy-mode": "cluster"}}',
            None,
            "cluster",
        ),
        (
            '{"conn_type": "spark", "host": "spark://m", "port": 7077, "extra": {"deploy-mode": "cluster"}}',
            "client",
            "client",
        ),
        (None, None, None),  # no such connection: local[*]
    ],
)
def test_the_deploy_mode_is_the_hooks(
    connection: str | None, given: str | None, mode: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit task runs a round itself (no spark-submit) unless the driver belongs on the
    cluster: the operator's ``deploy_mode``, else the connection's ``deploy-mode``, as the hook
    reads them."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    if connection is None:
        monkeypatch.delenv("AIRFLOW_CONN_ICEFALL_TEST_SPARK", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW_CONN_ICEFALL_TEST_SPARK", connection)
    assert spark_deploy_mode("icefall_test_spark", given) == mode
    if connection is not None:
        hook = SparkSubmitHook(conn_id="icefall_test_spark", deploy_mode=given)
        assert hook._connection["deploy_mode"] == mode


def test_killing_the_task_stops_its_round_process() -> None:
    """``on_kill`` while the task runs the round as a Python process terminates that process
    (not spark-submit's hook, which has nothing running)."""
    import subprocess
    import sys

    from icefall_airflow.commit_operator import CommitRoundOperator

    operator = CommitRoundOperator(task_id="commit", plan_task_id="plan")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], text=True)
    try:
        operator._round_process = proc
        operator.on_kill()
        assert proc.wait(10) == -15
    finally:
        proc.kill()
        proc.wait()


def test_a_round_is_tried_in_python_first_unless_it_would_be_spark_submitted_anyway(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every round is spark-submitted at once when the driver belongs on the cluster (the
    operator's deploy mode, else the connection's, else the ``spark.submit.deployMode`` conf)
    and when the driver's limit is 0 bytes; on a table whose rounds with records always need
    Spark, when the broker says records wait for the table (an idle one's round: Python)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from icefall_airflow.commit_operator import CommitRoundOperator

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {"automq.table.topic.enable": "true", "automq.table.topic.convert.value.type": "json"}
    for future in admin.create_topics([NewTopic("json_t", 1, 1, config=config)]).values():
        future.result(10)
    monkeypatch.setenv(
        "AIRFLOW_CONN_ICEFALL_TEST_SPARK",
        '{"conn_type": "spark", "host": "spark://m", "port": 7077}',
    )
    monkeypatch.delenv("ICEFALL_ROUND_IN_DRIVER_MAX_BYTES", raising=False)

    def first(topic: str = "json_t", **kwargs: Any) -> bool:
        operator = CommitRoundOperator(
            task_id="commit", plan_task_id="plan", conn_id="icefall_test_spark", **kwargs
        )
        return operator.python_first(topic, broker.admin_url)

    assert first()
    assert not first(deploy_mode="cluster")
    assert not first(conf={"spark.submit.deployMode": "cluster"})
    assert first(deploy_mode="client", conf={"spark.submit.deployMode": "cluster"})
    assert first(rounds_need_spark=True)  # nothing waits for json_t's table
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("json_t", value=b'{"id": 1}')
    assert producer.flush(10) == 0
    assert not first(rounds_need_spark=True)
    assert first(rounds_need_spark=False)
    assert first("no_such_topic", rounds_need_spark=True)  # the Python process will say why
    monkeypatch.setenv("ICEFALL_ROUND_IN_DRIVER_MAX_BYTES", "0")
    assert not first()
    monkeypatch.setenv("ICEFALL_ROUND_IN_DRIVER_MAX_BYTES", str(1 << 20))
    assert first()
    monkeypatch.setenv(
        "AIRFLOW_CONN_ICEFALL_TEST_SPARK",
        '{"conn_type": "spark", "host": "spark://m", "port": 7077, "extra": {"deploy-mode": "cluster"}}',
    )
    assert not first()
    assert not first(conf={"spark.submit.deployMode": "client"})  # spark-submit's order
