"""The maintenance DAG file imports, and its factory follows the broker's manifest."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pendulum
import pytest

from tests.dags import manifests
from tests.dags.test_dag_files import dagbag

INTERVAL = "automq.table.topic.maintenance.interval.ms"
ENABLE = "automq.table.topic.maintenance.enable"


def maintain_ids(bag: object) -> set[str]:
    return {d for d in bag.dag_ids if d.startswith("icefall_maintain__")}  # type: ignore[attr-defined]


def test_maintain_dag_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests.write(
        tmp_path,
        manifests.entry("shop.orders-v2", 30_000, "shop", 3, configs={INTERVAL: "7200000"}),
    )
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    dag = bag.dags["icefall_maintain__shop.orders-v2"]
    assert Path(dag.fileloc).name == "icefall_maintain.py"
    assert type(dag.timetable).__name__ == "MaintenanceTimetable"
    assert dag.timetable.delta == timedelta(hours=2)
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert [t.task_id for t in dag.topological_sort()] == ["maintain", "publish"]
    maintain = dag.task_dict["maintain"]
    assert type(maintain).__name__ == "MaintenanceOperator"
    # The same one-slot pool as the commit round of the same table: the two writers never race.
    assert (
        maintain.pool
        == bag.dags["icefall_commit__shop.orders-v2"].task_dict["commit"].pool
        == "icefall_table__shop.orders-v2"
    )
    outlets = dag.task_dict["publish"].outlets
    assert [(a.name, a.uri) for a in outlets] == [("icefall/shop/shop_orders_v2/maintenance",) * 2]
    assert dag.params["actions"] == ["compact", "manifests", "expire", "orphans"]


def test_maintain_factory_follows_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An old manifest without the interval key gets the default (1 h).
    manifests.write(
        tmp_path, manifests.entry("a"), manifests.entry("b", configs={INTERVAL: "600000"})
    )
    bag = dagbag(tmp_path, monkeypatch)
    assert maintain_ids(bag) == {"icefall_maintain__a", "icefall_maintain__b"}
    assert bag.dags["icefall_maintain__a"].timetable.delta == timedelta(hours=1)
    assert bag.dags["icefall_maintain__b"].timetable.delta == timedelta(minutes=10)

    # b turns maintenance off, a's interval changes, c appears; d's table-topic flag was set to false:
    # its DAG stays, marked disabled (icefall_airflow.sync pauses it, as it does the commit DAG).
    manifests.write(
        tmp_path,
        manifests.entry("a", configs={INTERVAL: "86400000"}),
        manifests.entry("b", configs={ENABLE: "false"}),
        manifests.entry("c", namespace="ns"),
        disabled=(manifests.disabled_entry("d"),),
    )
    bag = dagbag(tmp_path, monkeypatch)
    assert maintain_ids(bag) == {
        "icefall_maintain__a",
        "icefall_maintain__c",
        "icefall_maintain__d",
    }
    assert "icefall_commit__b" in bag.dag_ids  # the commit rounds go on
    assert bag.dags["icefall_maintain__a"].timetable.delta == timedelta(days=1)
    assert bag.dags["icefall_maintain__c"].task_dict["maintain"].pool == "icefall_table__c"
    disabled = bag.dags["icefall_maintain__d"]
    assert "disabled" in disabled.tags and "disabled" not in bag.dags["icefall_maintain__a"].tags
    assert disabled.task_dict["maintain"].topic_enabled is False and disabled.doc_md.startswith(
        "**Disabled**"
    )

    # gone from the manifest (topic deleted): no DAG
    manifests.write(tmp_path, manifests.entry("a"))
    assert maintain_ids(dagbag(tmp_path, monkeypatch)) == {"icefall_maintain__a"}


def test_maintain_dag_is_parsed_from_the_broker_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest as the broker writes it (effective configs, defaults included)."""
    import uuid

    from broker import manifest as broker_manifest
    from broker.storage.metadata import TopicRecord

    created_ms = int(time.time() * 1000)
    topics = [
        TopicRecord(
            "clicks",
            uuid.uuid4(),
            2,
            {"automq.table.topic.enable": "true", INTERVAL: "900000"},
            created_ms,
        ),
        TopicRecord("plain", uuid.uuid4(), 1, {}),
    ]
    broker_manifest.write_atomically(
        tmp_path / "table_topics.json", broker_manifest.render(topics, "http://127.0.0.1:1")
    )
    bag = dagbag(tmp_path, monkeypatch)
    assert maintain_ids(bag) == {"icefall_maintain__clicks"}
    dag = bag.dags["icefall_maintain__clicks"]
    assert dag.timetable.delta == timedelta(minutes=15)
    # the first scheduled run comes one interval after the topic's creation, not at once: a
    # new topic has no table to maintain before its first rounds
    first = datetime.fromtimestamp(created_ms / 1000, tz=UTC) + timedelta(minutes=15)
    from airflow.serialization.decoders import decode_timetable
    from airflow.serialization.encoders import encode_timetable
    from airflow.timetables.base import DataInterval, TimeRestriction
    from icefall_airflow.timetable import MaintenanceTimetable

    scheduled = decode_timetable(encode_timetable(dag.timetable))  # as the scheduler has it
    assert isinstance(scheduled, MaintenanceTimetable) and scheduled.first_run == first
    not_yet = TimeRestriction(earliest=dag.start_date, latest=None, catchup=False)
    planned = scheduled.next_dagrun_info(last_automated_data_interval=None, restriction=not_yet)
    assert planned is not None and planned.run_after == first
    # then every interval, as Airflow's DeltaTriggerTimetable
    last = DataInterval(pendulum.instance(first), pendulum.instance(first))
    planned = scheduled.next_dagrun_info(last_automated_data_interval=last, restriction=not_yet)
    assert planned is not None and planned.run_after == first + timedelta(minutes=15)
    # a topic deleted and created again: its DAG id's old runs do not bring the first run forward
    old = pendulum.instance(first) - timedelta(days=3)
    planned = scheduled.next_dagrun_info(
        last_automated_data_interval=DataInterval(old, old), restriction=not_yet
    )
    assert planned is not None and planned.run_after == first


def test_a_manifest_without_creation_times_runs_maintenance_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.timetables.base import TimeRestriction

    manifests.write(tmp_path, manifests.entry("old"))
    dag = dagbag(tmp_path, monkeypatch).dags["icefall_maintain__old"]
    restriction = TimeRestriction(earliest=dag.start_date, latest=None, catchup=False)
    before = datetime.now(UTC)
    planned = dag.timetable.next_dagrun_info(
        last_automated_data_interval=None, restriction=restriction
    )
    assert planned is not None and before <= planned.run_after <= datetime.now(UTC)


def test_a_disabled_topic_runs_no_maintenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even when someone runs the paused DAG: nothing is submitted, nothing is published."""
    from tests.dags import airflow_env

    airflow_env.migrate_db()
    manifests.write(tmp_path, disabled=(manifests.disabled_entry("off"),))
    dag = dagbag(tmp_path, monkeypatch).dags["icefall_maintain__off"]
    run = dag.test()
    assert {ti.task_id: str(ti.state) for ti in run.get_task_instances()} == {
        "maintain": "skipped",
        "publish": "skipped",
    }
