"""The DLQ reprocess DAG run by Airflow: a commit round sends records with a schema the registry
did not know yet to the DLQ; after the schema is registered, ``dag.test()`` of
``icefall_dlq_reprocess__<topic>`` spark-submits ``spark_jobs/dlq_reprocess.py``, the records move
into the table, and the publish step emits the moved offsets on the table's DLQ-reprocess asset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dags import airflow_env

airflow_env.configure()

from tests.support import BrokerProcess

TOPIC = "returns"


def asset_events(name: str) -> list[dict[str, Any]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = (
            session.execute(
                select(AssetEvent.extra)
                .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .where(AssetModel.name == name)
                .order_by(AssetEvent.id)
            )
            .scalars()
            .all()
        )
        return [dict(extra) for extra in rows]


def states(run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


@pytest.mark.timeout(600)
def test_reprocess_from_airflow_moves_the_records_that_now_decode(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    airflow_env.migrate_db()
    from icefall_airflow.tables import open_catalog

    from tests.spark_jobs.round_support import CLICK_V1, AvroProducer, new_topic
    from tests.spark_jobs.test_commit_round import clicks
    from tests.spark_jobs.test_round_dlq import LateSchema

    topic = new_topic(
        broker,
        partitions=1,
        prefix=TOPIC,
        configs={
            "automq.table.topic.namespace": "shop",
            "automq.table.topic.schema.validation": "false",
        },
    )
    table_name = topic.replace("-", "_")
    asset = f"icefall/shop/{table_name}/dlq-reprocess"
    monkeypatch.setenv("ICEFALL_HOME", str(broker.home))
    monkeypatch.setenv("ICEFALL_ADMIN_URL", broker.admin_url)
    AvroProducer(broker, topic, CLICK_V1).send(clicks(0, 4))
    late = LateSchema(broker, topic)
    late.send(clicks(4, 2, campaign="spring"))

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(airflow_env.REPO) / "dags"))
    assert bag.import_errors == {}
    run = bag.dags[f"icefall_commit__{topic}"].test(logical_date=None)
    assert str(run.state) == "success", states(run)
    catalog = open_catalog(broker.catalog_url)
    assert len(catalog.load_table(("shop", table_name)).scan().to_arrow()) == 4
    assert len(catalog.load_table(("shop", f"{table_name}__dlq")).scan().to_arrow()) == 2

    reprocess = bag.dags[f"icefall_dlq_reprocess__{topic}"]
    run = reprocess.test()
    assert states(run) == {"reprocess": "success", "publish": "skipped"}  # nothing decodes yet
    assert asset_events(asset) == []

    late.register()
    run = reprocess.test()
    assert states(run) == {"reprocess": "success", "publish": "success"}
    rows = (
        catalog.load_table(("shop", table_name))
        .scan(selected_fields=("id", "campaign"))
        .to_arrow()
        .to_pylist()
    )
    assert sorted((r["id"], r["campaign"]) for r in rows) == [
        (0, None),
        (1, None),
        (2, None),
        (3, None),
        (4, "spring"),
        (5, "spring"),
    ]
    assert len(catalog.load_table(("shop", f"{table_name}__dlq")).scan().to_arrow()) == 0
    [event] = asset_events(asset)
    assert (event["moved"], event["moved_offsets"], event["still_bad"]) == (2, {"0": [4, 5]}, 0)
    assert (
        event["snapshot_id"]
        == catalog.load_table(("shop", table_name)).current_snapshot().snapshot_id
    )
