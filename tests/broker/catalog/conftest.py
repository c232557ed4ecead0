from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog, load_catalog

from tests.broker.catalog.helpers import Http
from tests.support import BrokerProcess


@pytest.fixture(scope="module")
def catalog_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for a whole test module; tests keep apart by their namespaces."""
    home: Path = tmp_path_factory.mktemp("catalog") / "home"
    broker = BrokerProcess(home).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def http(catalog_broker: BrokerProcess) -> Http:
    return Http(catalog_broker.catalog_url)


@pytest.fixture
def rest(catalog_broker: BrokerProcess) -> Catalog:
    """pyiceberg's REST client on the broker's catalog."""
    return load_catalog("icefall", type="rest", uri=catalog_broker.catalog_url)


@pytest.fixture
def namespace(http: Http) -> str:
    """A fresh namespace per test."""
    name = f"ns_{uuid.uuid4().hex[:10]}"
    status, _ = http.post("/v1/namespaces", {"namespace": [name]})
    assert status == 200
    return name
