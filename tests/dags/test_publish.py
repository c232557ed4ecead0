"""The commit and publish steps around the commit round's contract (its CLI and result JSON)."""

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
        next(_publish(entry, None, nothing, PLAN))  # type: ignore[arg-type]
