"""The publish step: from the commit round's result to an asset event.

The result is the JSON of ``broker.contracts.RoundResult`` (the XCom the commit
task returned): checked against that model, then read as the dict it is, since
XComs and asset-event extras are JSON.

Data teams schedule their DAGs on ``Asset("icefall/<namespace>/<table>")``;
each event's extra says which snapshot to read, which offsets it added (per
partition), how many rows, and the event-time range of those rows. Tables
partitioned by hour or day also get partitioned events when an hour or day
closes (``event_partitions``). A
round that committed nothing emits no event (the step is skipped), so
downstream DAGs run once per new snapshot, never for a re-run. A retry of a round
whose commit landed before its task died reports that commit again
(``from_earlier_try``); its event is emitted then, unless the asset already has
one for that snapshot.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from broker import contracts
from icefall_airflow import event_partitions

RESULT_STATUSES = contracts.ROUND_STATUSES


class ResultError(ValueError):
    """The commit round's result JSON is not what the contract says."""


def check_result(result: Any) -> dict[str, Any]:
    if not isinstance(result, dict):
        raise ResultError(f"the commit round returned {type(result).__name__}, not a result object")
    status = result.get("status")
    if status not in RESULT_STATUSES:
        raise ResultError(
            f"unknown commit round status {status!r} (expected one of {RESULT_STATUSES})"
        )
    if status == "committed" and result.get("snapshot_id") is None:
        raise ResultError("a committed round must name its snapshot_id")
    try:
        contracts.RoundResult.model_validate(result)
    except ValidationError as exc:
        raise ResultError(f"the commit round's result is not a RoundResult: {exc}") from exc
    return result


def committed_offsets(result: dict[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for p, o in (result.get("offsets_after") or {}).items()}


def asset_extra(
    result: dict[str, Any], plan: dict[str, Any], lag: dict[str, Any] | None
) -> dict[str, Any]:
    """The event's extra: JSON-serialisable, small, enough to read exactly this commit."""
    return {
        "topic": result.get("topic", plan.get("topic")),
        "namespace": result.get("namespace"),
        "table": result.get("table"),
        "snapshot_id": result.get("snapshot_id"),
        "round_id": result.get("round_id", plan.get("round_id")),
        "offsets_before": result.get("offsets_before") or {},
        "offsets_after": result.get("offsets_after") or {},
        "until_append_ms": plan.get("until_append_ms"),
        "rows": result.get("rows"),
        "dlq_rows": result.get("dlq_rows"),
        "records": result.get("records"),
        "bytes": result.get("bytes_read"),
        "data_files": result.get("data_files"),
        "seconds": result.get("seconds"),
        "executor": result.get("executor"),
        "lag_records": None if lag is None else lag["records"],
        "lag_seconds": None if lag is None else lag["seconds"],
        "offset_ranges": offset_ranges(result),
        "event_time_column": result.get("event_time_column"),
        "event_time_min_ms": result.get("event_time_min_ms"),
        "event_time_max_ms": result.get("event_time_max_ms"),
        "watermark_ms": result.get("watermark_ms"),
        "closed_partitions": event_partitions.closed_keys(result),
        "late_partitions": [
            event_partitions.partition_key(int(ms)) for ms in result.get("late_windows") or []
        ],
    }


def offset_ranges(result: dict[str, Any]) -> dict[str, dict[str, int]]:
    """``{"<partition>": {"start": first offset, "end": exclusive end}}`` of the partitions the
    commit moved (start: where the table stood before)."""
    before = result.get("offsets_before") or {}
    return {
        str(p): {"start": int(before.get(p, 0)), "end": int(end)}
        for p, end in (result.get("offsets_after") or {}).items()
        if int(end) > int(before.get(p, 0))
    }


def summary_line(result: dict[str, Any]) -> str:
    if result["status"] == "nothing_new":
        return (
            f"round {result.get('round_id')}: nothing new to commit to "
            f"{result.get('namespace')}.{result.get('table')} (offsets {result.get('offsets_after')})"
        )
    by = " (by an earlier try of the round)" if result.get("from_earlier_try") else ""
    return (
        f"round {result.get('round_id')}: committed{by} snapshot {result['snapshot_id']} to "
        f"{result.get('namespace')}.{result.get('table')}: {result.get('rows')} rows, "
        f"{result.get('dlq_rows')} DLQ rows, offsets {result.get('offsets_before')} -> "
        f"{result.get('offsets_after')}"
    )
