"""``SparkJobOperator`` does what the apache-spark provider's ``SparkSubmitOperator`` does without
subclassing it (its module costs every DAG parse and task process OpenLineage's imports): the
same keyword arguments and templated fields, and the same spark-submit command line and
environment from the provider's hook. A provider upgrade that adds an argument fails here."""

from __future__ import annotations

import inspect
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from icefall_airflow.job_operator import SparkJobOperator

SETTINGS: dict[str, Any] = {
    "application": "app.py",
    "conf": {"spark.sql.shuffle.partitions": "4"},
    "conn_id": "icefall_test_spark_job",
    "files": "a.txt",
    "py_files": "code.zip",
    "archives": "env.tar.gz#env",
    "driver_class_path": "/drv",
    "jars": "a.jar,b.jar",
    "packages": "org.example:x:1",
    "exclude_packages": "org.example:y",
    "repositories": "https://repo.example",
    "total_executor_cores": 3,
    "executor_cores": 2,
    "executor_memory": "2g",
    "driver_memory": "1g",
    "proxy_user": "someone",
    "name": "icefall-test",
    "num_executors": 2,
    "application_args": ["--topic", "t"],
    "env_vars": {"ICEFALL_X": "1"},
    "verbose": True,
    "spark_binary": "spark-submit",
    "properties_file": "/props.conf",
    "yarn_queue": "q",
    "deploy_mode": "client",
}


def test_same_arguments_fields_and_command_as_the_providers(monkeypatch: Any) -> None:
    ours = set(inspect.signature(SparkJobOperator.__init__).parameters)
    theirs = set(inspect.signature(SparkSubmitOperator.__init__).parameters)
    assert ours == theirs
    assert tuple(SparkJobOperator.template_fields) == tuple(SparkSubmitOperator.template_fields)

    monkeypatch.setenv(
        "AIRFLOW_CONN_ICEFALL_TEST_SPARK_JOB", '{"conn_type": "spark", "host": "yarn"}'
    )
    mine = SparkJobOperator(task_id="ours", **SETTINGS)._get_hook()
    provider = SparkSubmitOperator(task_id="theirs", **SETTINGS)._get_hook()
    command = mine._build_spark_submit_command("app.py")
    assert command == provider._build_spark_submit_command("app.py")
    assert command[command.index("--executor-memory") :][:2] == ["--executor-memory", "2g"]
    assert mine._env == provider._env

    # the defaults: spark_default (local[*] when undefined, ``ensure_spark_connection``), spark-submit
    default = SparkJobOperator(task_id="default")
    assert default._conn_id == "spark_default"
    assert default._get_hook()._connection["spark_binary"] == "spark-submit"
