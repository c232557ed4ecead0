from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.support import BrokerProcess


@pytest.fixture(scope="module")
def registry_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for a whole test module; the tests keep apart by their subject names."""
    home: Path = tmp_path_factory.mktemp("registry") / "home"
    broker = BrokerProcess(home, ["--segment-flush-ms", "200"]).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def client(registry_broker: BrokerProcess) -> SchemaRegistryClient:
    """A fresh client (an empty cache) per test, so every call reaches the registry."""
    return SchemaRegistryClient({"url": registry_broker.registry_url, "max.retries": 0})
