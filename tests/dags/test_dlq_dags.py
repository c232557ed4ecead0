"""The DLQ reprocess DAG file imports, its factory follows the broker's manifest, and its
publish step turns the job's result into an asset event (or a skip)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dags import manifests
from tests.dags.test_dag_files import dagbag

MOVED = {
    "status": "moved",
    "topic": "orders",
    "round_id": "r1",
    "moved": 2,
    "moved_offsets": {"0": [4, 7]},
    "superseded": 1,
    "still_bad": 3,
    "snapshot_id": 11,
    "dlq_snapshot_id": 12,
    "only_in_dlq": 0,
    "unavailable": 0,
    "schema_changes": ["add campaign"],
    "seconds": 1.5,
    "message": "moved 2 records",
}


def dlq_ids(bag: object) -> set[str]:
    return {d for d in bag.dag_ids if d.startswith("icefall_dlq_reprocess__")}  # type: ignore[attr-defined]


def test_dlq_dag_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests.write(tmp_path, manifests.entry("shop.orders-v2", 30_000, "shop", 3))
    bag = dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    dag = bag.dags["icefall_dlq_reprocess__shop.orders-v2"]
    assert Path(dag.fileloc).name == "icefall_dlq_reprocess.py"
    assert type(dag.timetable).__name__ == "NullTimetable"  # triggered by hand only
    assert dag.max_active_runs == 1
    assert [t.task_id for t in dag.topological_sort()] == ["reprocess", "publish"]
    reprocess = dag.task_dict["reprocess"]
    assert type(reprocess).__name__ == "DlqReprocessOperator"
    # a writer of the table: the pool of its commit rounds and maintenance
    assert reprocess.pool == bag.dags["icefall_commit__shop.orders-v2"].task_dict["commit"].pool
    outlets = dag.task_dict["publish"].outlets
    assert [(a.name, a.uri) for a in outlets] == [
        ("icefall/shop/shop_orders_v2/dlq-reprocess",) * 2
    ]


def test_dlq_factory_follows_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests.write(tmp_path, manifests.entry("a"), manifests.entry("b"))
    assert dlq_ids(dagbag(tmp_path, monkeypatch)) == {
        "icefall_dlq_reprocess__a",
        "icefall_dlq_reprocess__b",
    }
    manifests.write(tmp_path, manifests.entry("a"), disabled=(manifests.disabled_entry("b"),))
    bag = dagbag(tmp_path, monkeypatch)
    assert dlq_ids(bag) == {"icefall_dlq_reprocess__a", "icefall_dlq_reprocess__b"}
    disabled = bag.dags["icefall_dlq_reprocess__b"]
    assert "disabled" in disabled.tags and disabled.task_dict["reprocess"].topic_enabled is False
    manifests.write(tmp_path, manifests.entry("a"))
    assert dlq_ids(dagbag(tmp_path, monkeypatch)) == {"icefall_dlq_reprocess__a"}


def test_publish_contract() -> None:
    from icefall_airflow import dlq_factory, manifest

    entry = manifest.TableTopic.from_json(manifests.entry("orders", namespace="shop"))
    extra = dlq_factory.asset_extra(entry, dlq_factory.check_result(MOVED))
    assert (extra["namespace"], extra["table"], extra["snapshot_id"], extra["moved_offsets"]) == (
        "shop",
        "orders",
        11,
        {"0": [4, 7]},
    )
    assert (extra["moved"], extra["superseded"], extra["still_bad"]) == (2, 1, 3)
    bad: Any
    for bad in (None, [], {"status": "failed"}, {"status": "committed"}):
        with pytest.raises(ValueError, match="DLQ reprocess"):
            dlq_factory.check_result(bad)


def test_a_disabled_topic_reprocesses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.dags import airflow_env

    airflow_env.migrate_db()
    manifests.write(tmp_path, disabled=(manifests.disabled_entry("off"),))
    run = dagbag(tmp_path, monkeypatch).dags["icefall_dlq_reprocess__off"].test()
    assert {ti.task_id: str(ti.state) for ti in run.get_task_instances()} == {
        "reprocess": "skipped",
        "publish": "skipped",
    }
