"""The short record of one maintenance run: what it did, in a few numbers.

The full result JSON of ``spark_jobs/maintenance.py`` is long (settings, every
procedure's counters, the DLQ table). Three readers want the same short form:
the table itself (the property ``icefall.maintenance.last-run``, written by the
job, so the record travels with the table and any engine can read it with
``SHOW TBLPROPERTIES``), the maintenance DAG's asset event, and the "Table
topics" status view. One function builds it so the three cannot disagree.
Plain Python: Airflow imports it without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

LAST_RUN_PROPERTY = "icefall.maintenance.last-run"
MESSAGE_CHARS = 500  # a table property is no place for a stack trace


def _number(per_action: Mapping[str, Any], action: str, key: str) -> int | None:
    """A counter of one action; None when the action did not run (or failed before counting)."""
    done = per_action.get(action)
    if not isinstance(done, Mapping) or done.get(key) is None:
        return None
    return int(done[key])


def _nested(per_action: Mapping[str, Any], action: str, part: str, key: str) -> int | None:
    """A counter of a step inside an action (``compact`` -> ``position_deletes``)."""
    done = per_action.get(action)
    return _number(done, part, key) if isinstance(done, Mapping) else None


def summarize(result: Mapping[str, Any]) -> dict[str, Any]:
    """The short form of a maintenance result JSON (``MaintenanceResult.to_json()``)."""
    per_action: Mapping[str, Any] = result.get("per_action") or {}
    seconds: Mapping[str, Any] = result.get("seconds") or {}
    failed = sorted(
        name for name, done in per_action.items() if isinstance(done, Mapping) and "error" in done
    )
    return {
        "status": result.get("status"),
        "at_ms": result.get("now_ms"),
        "actions": list(result.get("actions") or []),
        "failed_actions": failed,
        "snapshot_id_before": result.get("snapshot_id_before"),
        "snapshot_id": result.get("snapshot_id"),
        "data_files_before": result.get("data_files_before"),
        "data_files_after": result.get("data_files_after"),
        "rewritten_data_files": _number(per_action, "compact", "rewritten_data_files"),
        "added_data_files": _number(per_action, "compact", "added_data_files"),
        "rewritten_bytes": _number(per_action, "compact", "rewritten_bytes"),
        "delete_files_before": result.get("delete_files_before"),
        "delete_files_after": result.get("delete_files_after"),
        "rewritten_position_delete_files": _nested(
            per_action, "compact", "position_deletes", "rewritten_delete_files"
        ),
        "added_position_delete_files": _nested(
            per_action, "compact", "position_deletes", "added_delete_files"
        ),
        "rewritten_manifests": _number(per_action, "manifests", "rewritten_manifests"),
        "snapshots_expired": _number(per_action, "expire", "snapshots_expired"),
        "expired_data_files_deleted": _number(per_action, "expire", "deleted_data_files"),
        "orphans_removed": _number(per_action, "orphans", "removed"),
        "seconds": seconds.get("total"),
        "message": str(result.get("message") or "")[:MESSAGE_CHARS],
    }


def to_property(summary: Mapping[str, Any]) -> str:
    return json.dumps(summary, sort_keys=True, separators=(",", ":"))


def from_properties(properties: Mapping[str, str]) -> dict[str, Any] | None:
    """The last run recorded on a table, None when there is none (or it is not ours to read)."""
    raw = properties.get(LAST_RUN_PROPERTY)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def one_line(summary: Mapping[str, Any]) -> str:
    """For logs and the status view: ``compacted 12 -> 2 data files; 4 -> 0 delete files; 3 snapshots
    expired; 0 orphans removed``."""
    parts = []
    if summary.get("rewritten_data_files") is not None:
        parts.append(
            f"compacted {summary['rewritten_data_files']} -> {summary.get('added_data_files')} data files"
        )
    if summary.get("delete_files_before") and summary.get("delete_files_after") is not None:
        parts.append(
            f"{summary['delete_files_before']} -> {summary['delete_files_after']} delete files"
        )
    if summary.get("snapshots_expired") is not None:
        parts.append(f"{summary['snapshots_expired']} snapshots expired")
    if summary.get("orphans_removed") is not None:
        parts.append(f"{summary['orphans_removed']} orphans removed")
    if summary.get("failed_actions"):
        parts.append("failed: " + ", ".join(summary["failed_actions"]))
    return "; ".join(parts) or str(summary.get("status") or "")
