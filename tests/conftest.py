from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import BrokerProcess


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    """Start brokers with extra flags; every one started is stopped at teardown."""
    started: list[BrokerProcess] = []

    def make(extra_args: list[str] | None = None, env: dict[str, str] | None = None, name: str = "home") -> BrokerProcess:
        broker = BrokerProcess(tmp_path / name, extra_args, env)
        started.append(broker)
        return broker.start()

    yield make
    for broker in started:
        try:
            broker.stop()
        except Exception:
            pass


@pytest.fixture
def broker(broker_factory: object) -> BrokerProcess:
    assert callable(broker_factory)
    result: BrokerProcess = broker_factory(["--segment-flush-ms", "200"])
    return result
