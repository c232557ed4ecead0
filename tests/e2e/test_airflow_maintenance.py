"""Airflow runs table maintenance for real: ``dag.test()`` of ``icefall_maintain__<topic>``
(spark-submit of ``spark_jobs/maintenance.py``, then the asset event) over a table
made of several real commit rounds. The file count drops, the rows stay, the event
says what was done, the table records it for the status view, and the next commit
round still starts from the exactly-once checkpoint.

The commit rounds run in-process on one Spark session (the commit DAG's own
``dag.test()`` path is covered by test_airflow_rounds.py; a spark-submit per
round would cost a Spark start each).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.dags import airflow_env

airflow_env.configure()

from spark_jobs import commit_round
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    new_topic,
    run_round,
    table,
    table_offsets,
)
from tests.spark_jobs.test_commit_round import clicks
from tests.support import BrokerProcess, present

ROUNDS = 4
PER_ROUND = 20
DAY_S = 86_400


def events_of(asset: str) -> list[dict[str, Any]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = (
            session.execute(
                select(AssetEvent.extra)
                .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .where(AssetModel.name == asset)
                .order_by(AssetEvent.id)
            )
            .scalars()
            .all()
        )
        return [dict(extra) for extra in rows]


def xcom(run_id: str, dag_id: str, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        [row] = (
            session.execute(
                XComModel.get_many(
                    run_id=run_id, dag_ids=dag_id, task_ids=task_id, key="return_value"
                )
            )
            .scalars()
            .all()
        )
        return XComModel.deserialize_value(row)


def data_files(broker: BrokerProcess, topic: str) -> int:
    return len(table(broker, topic).inspect.files())


def ids(broker: BrokerProcess, topic: str) -> list[int]:
    return sorted(
        table(broker, topic).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    )


@pytest.mark.timeout(900)
def test_maintenance_dag_compacts_a_table_of_rounds(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    airflow_env.migrate_db()
    topic = new_topic(broker, partitions=2, prefix="maint")
    monkeypatch.setenv("ICEFALL_HOME", str(broker.home))
    monkeypatch.setenv("ICEFALL_ADMIN_URL", broker.admin_url)
    producer = AvroProducer(broker, topic, CLICK_V1)

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(airflow_env.REPO) / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags[f"icefall_maintain__{topic}"]

    # Before the first round there is no table: the run finds nothing to do without starting Spark.
    run = dag.test()
    assert {ti.task_id: str(ti.state) for ti in run.get_task_instances()} == {
        "maintain": "success",
        "publish": "skipped",
    }
    assert xcom(run.run_id, dag.dag_id, "maintain") == {
        "status": "no_table",
        "topic": topic,
        "namespace": "default",
        "table": topic,
        "actions": ["compact", "manifests", "expire", "orphans"],
        "message": "the table does not exist yet",
    }
    assert events_of(f"icefall/default/{topic}/maintenance") == []

    spark = commit_round.spark_session("icefall-maintain-e2e", "local[1]")
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "1")
        for i in range(ROUNDS):
            producer.send(clicks(i * PER_ROUND, PER_ROUND))
            assert run_round(spark, broker, topic).status == "committed"
        files_before = data_files(broker, topic)
        assert files_before >= ROUNDS
        tbl = table(broker, topic)
        checkpoint_snapshot = present(tbl.current_snapshot()).snapshot_id
        # A few files per round is below Iceberg's default group of 5: let compaction take pairs.
        with tbl.transaction() as transaction:
            transaction.set_properties({"icefall.maintenance.compaction.min-input-files": "2"})
        # A crashed writer's leftover, older than S3 Tables' 3 days, and a young one that stays.
        data_dir = Path(tbl.location().removeprefix("file://").removeprefix("file:")) / "data"
        old, young = data_dir / "crashed-old.parquet", data_dir / "crashed-young.parquet"
        for stray in (old, young):
            stray.write_bytes(b"written by a round that died before it committed")
        four_days_ago = time.time() - 4 * DAY_S
        os.utime(old, (four_days_ago, four_days_ago))

        run = dag.test()
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        assert str(run.state) == "success", states
        assert states == {"maintain": "success", "publish": "success"}

        # Fewer files, the same rows, the orphan gone and the young file kept.
        files_after = data_files(broker, topic)
        assert files_after < files_before
        assert ids(broker, topic) == list(range(ROUNDS * PER_ROUND))
        assert table_offsets(broker, topic) == sorted(producer.acked)
        assert not old.exists() and young.exists()

        [event] = events_of(f"icefall/default/{topic}/maintenance")
        assert (event["topic"], event["namespace"], event["table"], event["status"]) == (
            topic,
            "default",
            topic,
            "done",
        )
        assert (
            event["data_files_before"] == files_before and event["data_files_after"] == files_after
        )
        assert (
            event["rewritten_data_files"] == files_before
            and 1 <= event["added_data_files"] < files_before
        )
        assert event["rewritten_bytes"] > 0 and event["orphans_removed"] == 1
        assert event["snapshots_expired"] == 0  # every snapshot is younger than the topic's 1 h
        assert event["snapshot_id_before"] == checkpoint_snapshot
        assert (
            event["snapshot_id"]
            == present(table(broker, topic).current_snapshot()).snapshot_id
            != checkpoint_snapshot
        )
        assert (
            events_of(f"icefall/default/{topic}") == []
        )  # the table's own asset: rows only, none added

        # The status view shows what the last maintenance did (recorded on the table by the job).
        from fastapi.testclient import TestClient
        from icefall_airflow.view import app

        client = TestClient(app, headers=airflow_env.auth_headers())
        row = client.get(f"/api/tables/{topic}").json()
        assert row["error"] is None, row["error"]
        summary = row["last_maintenance"]
        assert {
            k: summary[k]
            for k in ("rewritten_data_files", "added_data_files", "orphans_removed", "snapshot_id")
        } == {
            k: event[k]
            for k in ("rewritten_data_files", "added_data_files", "orphans_removed", "snapshot_id")
        }
        assert row["last_maintenance_ms"] == summary["at_ms"] == event["at_ms"]
        assert row["maintain_dag_id"] == f"icefall_maintain__{topic}"
        assert (
            f"compacted {files_before} -&gt; {event['added_data_files']} data files"
            in client.get("/").text
        )

        # The exactly-once checkpoint survived compaction: the next round takes only new records.
        producer.send(clicks(ROUNDS * PER_ROUND, 7))
        assert run_round(spark, broker, topic).status == "committed"
        assert table_offsets(broker, topic) == sorted(producer.acked)
    finally:
        spark.stop()
