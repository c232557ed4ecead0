"""Fixtures of the commit-round tests: one broker and one Spark session per test
module (Spark takes 5-20 s to start); tests keep apart by their topics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_jobs import commit_round
from tests.support import BrokerProcess


@pytest.fixture(scope="module")
def round_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("rounds") / "home", ["--segment-flush-ms", "100"]
    ).start()
    try:
        yield broker
    finally:
        broker.stop()


def stop_spark_jvm() -> None:
    """End the driver JVM PySpark started in this process, if any, so the next session starts
    a new one: ``SparkSession.stop`` keeps the JVM (and the ``-D`` options it was started with)
    for the next session of the process."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:  # the JVM exits when its stdin closes (PythonGatewayServer)
        proc.stdin.close()
        proc.wait(60)
    SparkContext._gateway = None
    SparkContext._jvm = None


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = commit_round.spark_session("icefall-round-tests", "local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        yield session
    finally:
        session.stop()
