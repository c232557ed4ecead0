"""The commit task's round and publish steps around the commit round's contract (its CLI and result JSON)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from icefall_airflow import publish
from icefall_airflow.commit_operator import commit_round_args, commit_round_script

PLAN = {
    "topic": "clicks",
    "round_id": "clicks@1000",
    "until_append_ms": 1000,
    "max_records": None,
    "end_offsets": {"0": 10, "1": 4},
}
COMMITTED = {
    "status": "committed",
    "topic": "clicks",
    "namespace": "default",
    "table": "clicks",
    "round_id": "clicks@1000",
    "snapshot_id": 42,
    "offsets_before": {"0": 0, "1": 0},
    "offsets_after": {"0": 10, "1": 4},
    "rows": 14,
    "dlq_rows": 0,
    "records": 14,
    "bytes_read": 900,
    "data_files": 2,
    "until_append_ms": None,
    "seconds": {"plan": 0.1, "read_write": 2.0, "commit": 0.2, "total": 2.3},
}


def test_commit_round_command_line() -> None:
    args = commit_round_args({**PLAN, "max_records": 5}, "http://127.0.0.1:8090")
    assert args[args.index("--until-offsets") + 1] == '{"0":10,"1":4}'
    assert args[args.index("--round-id") + 1] == "clicks@1000"
    assert args[args.index("--max-records") + 1] == "5"
    assert (
        "--until-append-time" not in args
    )  # the plan's offsets are the bound: what was planned is committed
    assert commit_round_script().endswith("spark_jobs/commit_round.py")


def test_asset_extra_of_a_commit() -> None:
    lag = {"records": 3, "seconds": 1.5}
    extra = publish.asset_extra(publish.check_result(COMMITTED), PLAN, lag)
    assert extra["snapshot_id"] == 42 and extra["rows"] == 14 and extra["bytes"] == 900
    assert extra["offsets_after"] == {"0": 10, "1": 4} and extra["until_append_ms"] == 1000
    assert (extra["lag_records"], extra["lag_seconds"]) == (3, 1.5)
    json.dumps(extra)  # an asset event's extra must be JSON
    assert publish.committed_offsets(COMMITTED) == {0: 10, 1: 4}
    assert "committed snapshot 42" in publish.summary_line(COMMITTED)


@pytest.mark.parametrize(
    "bad", [None, [], {"status": "failed"}, {"status": "committed", "snapshot_id": None}]
)
def test_results_outside_the_contract_are_refused(bad: Any) -> None:
    with pytest.raises(publish.ResultError):
        publish.check_result(bad)


def test_nothing_new_skips_the_asset_event(tmp_path: Any) -> None:
    from airflow.sdk.exceptions import AirflowSkipException
    from icefall_airflow.factory import _publish
    from icefall_airflow.manifest import TableTopic

    entry = TableTopic("clicks", "default", "clicks", 1, 60_000)
    nothing = {**COMMITTED, "status": "nothing_new", "rows": 0, "offsets_before": {"0": 10, "1": 4}}
    with pytest.raises(AirflowSkipException, match="nothing new"):
        _publish(entry, None, nothing, PLAN)  # type: ignore[arg-type]


def test_event_time_in_the_extra_and_closed_partitions_as_keys() -> None:
    from icefall_airflow import event_partitions

    hour = 1_767_261_600_000  # 2026-01-01T10:00:00Z
    result = {
        **COMMITTED,
        "offsets_before": {"0": 0, "1": 4},
        "event_time_column": "at",
        "event_time_min_ms": hour + 5,
        "event_time_max_ms": hour + 3_600_000,
        "event_time_granularity": "hour",
        "watermark_ms": hour + 3_600_000,
        "closed_windows": [hour],
        "late_windows": [hour - 3_600_000],
    }
    extra = publish.asset_extra(publish.check_result(result), PLAN, None)
    assert extra["offset_ranges"] == {"0": {"start": 0, "end": 10}}  # partition 1 did not move
    assert (extra["event_time_min_ms"], extra["event_time_max_ms"]) == (hour + 5, hour + 3_600_000)
    assert extra["closed_partitions"] == ["2026-01-01T10:00:00"]
    assert extra["late_partitions"] == ["2026-01-01T09:00:00"]
    json.dumps(extra)
    start, end = event_partitions.window("2026-01-01T10:00:00", "day")
    assert (start.isoformat(), end.isoformat()) == (
        "2026-01-01T10:00:00+00:00",
        "2026-01-02T10:00:00+00:00",
    )
    assert event_partitions.may_close_partitions("[day(at), bucket(id, 4)]")
    assert not event_partitions.may_close_partitions("[month(at)]")
    assert event_partitions.closed_keys({**result, "status": "nothing_new"}) == []
    with pytest.raises(ValueError, match="granularity"):
        event_partitions.window("2026-01-01T10:00:00", "week")


def test_lineage_of_a_round_names_topic_and_table_as_openlineage_does() -> None:
    from icefall_airflow import lineage
    from openlineage.client.serde import Serde

    from broker.contracts import ClusterInfo

    cluster = ClusterInfo(
        cluster_id="c",
        bootstrap="127.0.0.1:9092,127.0.0.1:9093",
        registry_url="http://127.0.0.1:8081",
        catalog_url="http://127.0.0.1:1/catalog",  # nothing listens: tables named by the catalog
        object_store="file:///tmp/x",
    )
    result = {**COMMITTED, "dlq_rows": 2}
    found = lineage.round_lineage(result, cluster)
    [topic] = [json.loads(Serde.to_json(d)) for d in found.inputs]
    assert (topic["namespace"], topic["name"]) == ("kafka://127.0.0.1:9092", "clicks")
    assert topic["inputFacets"]["inputStatistics"]["rowCount"] == 14
    table, dlq = (json.loads(Serde.to_json(d)) for d in found.outputs)
    assert (table["namespace"], table["name"]) == ("http://127.0.0.1:1/catalog", "default.clicks")
    assert table["facets"]["version"]["datasetVersion"] == "42"
    assert table["outputFacets"]["outputStatistics"]["rowCount"] == 14
    assert dlq["name"] == "default.clicks__dlq"
    assert dlq["outputFacets"]["outputStatistics"]["rowCount"] == 2
    assert lineage.location_name("s3://lake/wh/default/clicks") == (
        "s3://lake",
        "wh/default/clicks",
    )
    assert lineage.location_name("/data/wh/default/clicks") == ("file", "/data/wh/default/clicks")

    moved = {
        "status": "moved",
        "topic": "clicks",
        "moved": 3,
        "snapshot_id": 7,
        "dlq_snapshot_id": 8,
    }
    found = lineage.reprocess_lineage(moved, cluster, "default", "clicks")
    assert [d.name for d in found.inputs] == ["default.clicks__dlq"]
    assert [(d.name, d.facets["version"].datasetVersion) for d in found.outputs] == [
        ("default.clicks", "7"),
        ("default.clicks__dlq", "8"),
    ]
    assert found.outputs[0].outputFacets["outputStatistics"].rowCount == 3
    done = {"status": "done", "topic": "clicks", "snapshot_id_before": 1, "snapshot_id": 2}
    found = lineage.maintenance_lineage(done, cluster, "default", "clicks")
    assert [d.facets["version"].datasetVersion for d in [*found.inputs, *found.outputs]] == [
        "1",
        "2",
    ]
