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


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = commit_round.spark_session("icefall-round-tests", "local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        yield session
    finally:
        session.stop()
