"""Airflow drives commit rounds for real: ``dag.test()`` runs plan -> spark-submit of
``spark_jobs/commit_round.py`` -> publish against a real broker, through two
rounds; a re-run of round 1 is a no-op; dropping and recreating the table and
re-running both intervals (what a backfill does) rebuilds it from the segments.

The broker's registry requires basic auth and its catalog OAuth2: the rounds, the
plugin and the status view take their credentials from the Airflow connections
``icefall_registry`` and ``icefall_catalog``, and no secret reaches an asset event.
"""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.dags import airflow_env

airflow_env.configure()

from broker.http_security.client import CATALOG_CREDENTIAL_ENV, REGISTRY_USER_INFO_ENV
from tests.http_security_support import PASSWORDS, SECRETS, airflow_connections, secured_args
from tests.support import BrokerProcess, wait_for

TOPIC = "orders"
SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "icefall.test",
        "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
    }
)
ASSET = "icefall/shop/orders"


@pytest.fixture
def broker(broker_factory: Any, tmp_path: Path) -> BrokerProcess:
    """A broker whose registry and catalog require credentials."""
    args, env = secured_args(tmp_path / "security")
    started: BrokerProcess = broker_factory([*args, "--segment-flush-ms", "200"], env)
    return started


def produce(broker: BrokerProcess, first: int, count: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    registry = SchemaRegistryClient(
        {"url": broker.registry_url, "basic.auth.user.info": f"writer:{PASSWORDS['writer']}"}
    )
    serialize = AvroSerializer(registry, SCHEMA)
    context = SerializationContext(TOPIC, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(first, first + count):
        producer.produce(
            TOPIC,
            key=str(i).encode(),
            value=serialize({"id": i, "item": f"item-{i}"}, context),
            partition=i % 2,
        )
    assert producer.flush(10) == 0


def cut_after_now() -> datetime:
    """A data interval end strictly after every record produced so far (append times are in ms)."""
    cut_ms = int(time.time() * 1000) + 2
    wait_for(lambda: int(time.time() * 1000) > cut_ms, 5, what="the clock to pass the cut")
    return datetime.fromtimestamp(cut_ms / 1000, UTC)


def asset_events() -> list[dict[str, Any]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = (
            session.execute(
                select(AssetEvent.extra)
                .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .where(AssetModel.name == ASSET)
                .order_by(AssetEvent.id)
            )
            .scalars()
            .all()
        )
        return [dict(extra) for extra in rows]


def table_ids(catalog: Any) -> list[int]:
    table = catalog.load_table(("shop", "orders"))
    return sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def run_round(dag: Any, logical_date: datetime) -> dict[str, str]:
    run = dag.test(logical_date=logical_date)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert str(run.state) == "success", states
    return states


@pytest.mark.timeout(900)
def test_two_rounds_rerun_and_rebuild(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    airflow_env.migrate_db()
    from confluent_kafka.admin import AdminClient, NewTopic
    from icefall_airflow.tables import open_catalog

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "automq.table.topic.enable": "true",
        "automq.table.topic.namespace": "shop",
        "automq.table.topic.commit.interval.ms": "30000",
    }
    for future in admin.create_topics([NewTopic(TOPIC, 2, 1, config=config)]).values():
        future.result(10)
    monkeypatch.setenv("ICEFALL_HOME", str(broker.home))
    monkeypatch.setenv("ICEFALL_ADMIN_URL", broker.admin_url)
    for name, value in airflow_connections().items():
        monkeypatch.setenv(name, value)
    for name in (REGISTRY_USER_INFO_ENV, CATALOG_CREDENTIAL_ENV):  # unset now, unset after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(airflow_env.REPO) / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags[f"icefall_commit__{TOPIC}"]
    catalog = open_catalog(broker.catalog_url)

    produce(broker, 0, 50)
    cut1 = cut_after_now()
    produce(broker, 50, 30)  # after cut 1: round 1 must not take these
    cut2 = cut_after_now()
    produce(broker, 80, 5)  # after cut 2: left for a later round

    assert run_round(dag, cut1)["publish"] == "success"
    assert table_ids(catalog) == list(range(50))
    events = asset_events()
    assert len(events) == 1 and events[0]["rows"] == 50
    assert events[0]["offsets_after"] == {"0": 25, "1": 25}
    assert (
        events[0]["snapshot_id"]
        == catalog.load_table(("shop", "orders")).current_snapshot().snapshot_id
    )
    assert events[0]["lag_records"] == 35  # 30 + 5 produced after the cut

    assert run_round(dag, cut2)["publish"] == "success"
    assert table_ids(catalog) == list(range(80))
    events = asset_events()
    assert len(events) == 2 and events[1]["rows"] == 30
    assert events[1]["offsets_before"] == {"0": 25, "1": 25} and events[1]["offsets_after"] == {
        "0": 40,
        "1": 40,
    }
    snapshot_after_two = catalog.load_table(("shop", "orders")).current_snapshot().snapshot_id

    # Re-running round 1: nothing new, no asset event, the table unchanged.
    assert run_round(dag, cut1)["publish"] == "skipped"
    assert len(asset_events()) == 2
    assert (
        catalog.load_table(("shop", "orders")).current_snapshot().snapshot_id == snapshot_after_two
    )
    assert table_ids(catalog) == list(range(80))

    # The status view agrees: 5 records behind.
    from fastapi.testclient import TestClient
    from icefall_airflow.view import app

    [row] = TestClient(app).get("/api/tables").json()["tables"]
    assert (row["lag_records"], row["rows"], row["snapshot_id"]) == (5, 80, snapshot_after_two)
    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    labels = '{topic="orders",namespace="shop",table="orders"}'
    assert f"icefall_table_lag_records{labels} 5\n" in metrics
    assert f"icefall_table_rows{labels} 80\n" in metrics
    assert f'icefall_table_committed_offset{labels[:-1]},partition="1"}} 40\n' in metrics
    events_text = json.dumps(asset_events())
    assert all(secret not in events_text for secret in SECRETS)

    # Drop and recreate the table, re-run both intervals: rebuilt from the retained segments.
    catalog.drop_table(("shop", "orders"))
    run_round(dag, cut1)
    assert table_ids(catalog) == list(range(50))
    run_round(dag, cut2)
    assert table_ids(catalog) == list(range(80))
    assert len(asset_events()) == 4

    # A manual run without a logical date commits up to the broker's current end.
    run = dag.test(logical_date=None)
    assert str(run.state) == "success" and run.logical_date is None
    assert table_ids(catalog) == list(range(85))
    assert asset_events()[-1]["offsets_after"] == {"0": 43, "1": 42}
