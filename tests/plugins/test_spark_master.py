"""The Spark master a job's connection names (``job_operator.spark_master``), read from the
connection's public fields, is the one the apache-spark provider's hook submits to: it decides
whether the executors get the code zip (``py_files``)."""

from __future__ import annotations

import pytest
from icefall_airflow.job_operator import spark_master


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
