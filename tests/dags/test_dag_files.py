"""Every DAG file imports cleanly, and the factory follows the broker's manifest."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.dags import manifests
from tests.support import REPO


def dagbag(home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("ICEFALL_HOME", str(home))
    return DagBag(dag_folder=str(REPO / "dags"))


def test_every_dag_file_imports_without_a_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {
        "icefall_example_downstream__clicks",
        "icefall_example_hourly__clicks",
    }


def test_every_dag_file_imports_with_table_topics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests.write(
        tmp_path, manifests.entry("clicks"), manifests.entry("shop.orders-v2", 30_000, "shop", 3)
    )
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    files = {Path(d.fileloc).name for d in bag.dags.values()}
    assert files == {p.name for p in (REPO / "dags").glob("*.py")}, "a DAG file defines no DAG"
    assert {"icefall_commit__clicks", "icefall_commit__shop.orders-v2"} <= set(bag.dag_ids)


def test_a_task_process_builds_only_its_dag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task process parses its DAG's file with Airflow's parsing context naming the DAG: the
    factories build that DAG alone, not one per table topic."""
    # what the task runner's parsing context manager sets (it does not unset it)
    from airflow.sdk.definitions.context import _AIRFLOW_PARSING_CONTEXT_DAG_ID

    manifests.write(
        tmp_path, manifests.entry("clicks"), manifests.entry("shop.orders-v2", 30_000, "shop", 3)
    )
    for dag_id in ("icefall_commit__clicks", "icefall_maintain__shop.orders-v2"):
        monkeypatch.setenv(_AIRFLOW_PARSING_CONTEXT_DAG_ID, dag_id)
        bag = dagbag(tmp_path, monkeypatch)
        assert bag.import_errors == {}
        assert {d for d in bag.dag_ids if d.startswith("icefall_") and "example" not in d} == {
            dag_id
        }


def test_commit_dag_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests.write(tmp_path, manifests.entry("shop.orders-v2", 30_000, "shop", 3))
    dag = dagbag(tmp_path, monkeypatch).dags["icefall_commit__shop.orders-v2"]
    assert type(dag.timetable).__name__ == "LeadingIntervalTimetable"
    assert dag.timetable.delta == timedelta(seconds=30)  # the commit interval
    assert dag.timetable.lead == timedelta(seconds=4)  # a run is created 4 s before its end
    assert dag.max_active_runs == 1 and dag.catchup is False
    # one task a round: it plans, commits and publishes (no scheduler hand-over in between)
    assert [t.task_id for t in dag.topological_sort()] == ["commit"]
    commit = dag.task_dict["commit"]
    assert commit.pool == "icefall_table__shop.orders-v2"
    assert type(commit).__name__ == "CommitRoundOperator"
    assert commit.planner is not None and commit.publisher is not None
    assert commit.plan_task_id is None and commit.retries >= 1
    outlets = commit.outlets
    assert [(a.name, a.uri) for a in outlets] == [("icefall/shop/shop_orders_v2",) * 2]
    assert set(dag.params.keys()) == {"until", "until_offsets", "max_records"}
    assert dag.params["until"] == "interval"
    assert not dag.deadline  # no freshness SLA on the topic
    assert commit.rounds_need_spark is False  # an append table: rounds tried in Python first


def test_tables_whose_rounds_need_spark_tell_the_commit_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upsert and JSON tables (and format v3): a round with records is spark-submitted at once;
    a format version the manifest cannot read does not break the DAG file."""
    upsert = {"automq.table.topic.upsert.enable": "true", "automq.table.topic.id.columns": "[id]"}
    json_values = {"automq.table.topic.convert.value.type": "json"}
    unreadable = {"automq.table.topic.format.version": "two"}  # a hand-edited manifest
    manifests.write(
        tmp_path,
        manifests.entry("up", configs=upsert),
        manifests.entry("js", configs=json_values),
        manifests.entry("odd", configs=unreadable),
    )
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    need = {
        t: bag.dags[f"icefall_commit__{t}"].task_dict["commit"].rounds_need_spark
        for t in ("up", "js", "odd")
    }
    assert need == {"up": True, "js": True, "odd": False}


def test_a_freshness_sla_puts_a_deadline_on_each_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sla = {"automq.table.topic.freshness.sla.ms": "90000"}
    manifests.write(tmp_path, manifests.entry("orders", 30_000, "shop", configs=sla))
    dag = dagbag(tmp_path, monkeypatch).dags["icefall_commit__orders"]
    [alert] = dag.deadline
    assert type(alert.reference).__name__ == "DagRunLogicalDateDeadline"  # the interval's start
    assert alert.interval == timedelta(seconds=90)
    assert type(alert.callback).__name__ == "AsyncCallback"
    assert alert.callback.path == "icefall_airflow.freshness.freshness_deadline_missed"
    assert alert.callback.kwargs == {
        "topic": "orders",
        "namespace": "shop",
        "table": "orders",
        "sla_ms": 90000,
    }

    # partitioned by hour: the announce task emits the closed hours on their own asset
    hourly = manifests.entry("t", configs={"automq.table.topic.partition.by": "[hour(at)]"})
    manifests.write(tmp_path, hourly)
    dag = dagbag(tmp_path, monkeypatch).dags["icefall_commit__t"]
    assert [t.task_id for t in dag.topological_sort()] == ["commit", "announce"]
    announce = dag.task_dict["announce"]
    # the closure is in the snapshot already: a failed announce or API call must not lose it
    assert announce.upstream_task_ids == {"commit"} and announce.retries >= 1
    outlets = announce.outlets
    assert [a.name for a in outlets] == ["icefall/default/t/closed-partitions"]


def test_factory_follows_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests.write(tmp_path, manifests.entry("a", 60_000), manifests.entry("b", 1))
    bag = dagbag(tmp_path, monkeypatch)
    assert {d for d in bag.dag_ids if d.startswith("icefall_commit__")} == {
        "icefall_commit__a",
        "icefall_commit__b",
    }
    # A 1 ms commit interval is clamped to the shortest schedule Airflow can keep.
    assert bag.dags["icefall_commit__b"].timetable.delta == timedelta(seconds=5)

    # b is no longer a table topic (the broker drops it from the manifest), c became one,
    # a's interval changed: the next parse follows.
    manifests.write(tmp_path, manifests.entry("a", 120_000), manifests.entry("c", 10_000, "ns"))
    bag = dagbag(tmp_path, monkeypatch)
    assert {d for d in bag.dag_ids if d.startswith("icefall_commit__")} == {
        "icefall_commit__a",
        "icefall_commit__c",
    }
    assert bag.dags["icefall_commit__a"].timetable.delta == timedelta(minutes=2)
    assert bag.dags["icefall_commit__c"].task_dict["commit"].pool == "icefall_table__c"


def test_a_broken_manifest_is_an_import_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "table_topics.json").write_text('{"no": "manifest"}')
    bag = dagbag(tmp_path, monkeypatch)
    assert sorted(Path(f).name for f in bag.import_errors) == [
        "icefall_commit.py",
        "icefall_dlq_reprocess.py",
        "icefall_maintain.py",
    ]
    assert all("not an Icefall table-topic manifest" in e for e in bag.import_errors.values())


def test_a_disabled_topic_keeps_its_dag_marked_disabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests.write(
        tmp_path, manifests.entry("on"), disabled=(manifests.disabled_entry("off", 30_000),)
    )
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    dag = bag.dags["icefall_commit__off"]
    assert "disabled" in dag.tags and "disabled" not in bag.dags["icefall_commit__on"].tags
    assert dag.timetable.delta == timedelta(
        seconds=30
    )  # the schedule is kept for when it comes back
    assert dag.doc_md.startswith("**Disabled**")


def test_a_size_trigger_schedules_rounds_on_the_interval_or_the_pending_asset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests.write(
        tmp_path,
        manifests.entry(
            "bursts", 900_000, configs={"automq.table.topic.commit.trigger.bytes": "65536"}
        ),
        manifests.entry("steady", 60_000),
    )
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    timetable = bag.dags["icefall_commit__bursts"].timetable
    assert type(timetable).__name__ == "AssetOrTimeSchedule"
    assert timetable.timetable.delta == timedelta(
        minutes=15
    )  # backfills still have their intervals
    asset = timetable.asset_condition
    assert asset.name == "icefall/default/bursts/pending"
    [watcher] = asset.watchers
    assert watcher.trigger.serialize() == (
        "icefall_airflow.pending_trigger.PendingBytesTrigger",
        {"topic": "bursts", "threshold_bytes": 65536, "admin_url": None, "poll_interval_s": 2.0},
    )
    assert type(bag.dags["icefall_commit__steady"].timetable).__name__ == "LeadingIntervalTimetable"
