"""Closed event-time partitions as Airflow partitioned asset events (Airflow 3.2+).

A table partitioned by ``hour(...)`` or ``day(...)`` of a timestamp
(``automq.table.topic.partition.by``) gets, besides the per-commit event on
``icefall/<namespace>/<table>``, one event per hour or day that closed on
``icefall/<namespace>/<table>/closed-partitions``, with the window's start as the
partition key (``2026-01-01T10:00:00``, UTC: the input format of Airflow's
temporal partition mappers, so ``StartOfDayMapper`` and rollups work on it). A
DAG scheduled with ``PartitionedAssetTimetable`` on that asset runs once per
closed hour or day, with ``dag_run.partition_key`` naming it.

Which windows a commit closed is the commit round's business
(``spark_jobs/rounds/event_time.py``): it is decided in the round and recorded
in the snapshot it commits, so a window is closed by one snapshot only; this
module turns the round result's ``closed_windows`` into keys and back. Own
asset, own task (``announce``): Airflow gives a task one event per outlet, and
an event with partition keys triggers partition-aware DAGs only.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

KEY_FORMAT = "%Y-%m-%dT%H:%M:%S"
WINDOW = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
_TIME_TRANSFORM = re.compile(r"\b(hour|day)\s*\(")


def may_close_partitions(partition_by: str) -> bool:
    """Whether a table with this ``partition.by`` may have event-time partitions to announce
    (at parse time, from the config alone: the round decides with the column's type)."""
    return bool(_TIME_TRANSFORM.search(partition_by or ""))


def partition_key(start_ms: int) -> str:
    return datetime.fromtimestamp(start_ms / 1000, UTC).strftime(KEY_FORMAT)


def window(key: str, granularity: str) -> tuple[datetime, datetime]:
    """[start, end) of the partition ``key`` names (UTC); ValueError for a key or granularity
    that is not one of ours."""
    if granularity not in WINDOW:
        raise ValueError(f"unknown event-time granularity {granularity!r} (hour or day)")
    start = datetime.strptime(key, KEY_FORMAT).replace(tzinfo=UTC)
    return start, start + WINDOW[granularity]


def closed_keys(result: dict[str, Any]) -> list[str]:
    """The partition keys of the windows the round's commit closed."""
    if result.get("status") != "committed" or not result.get("event_time_granularity"):
        return []
    return [partition_key(int(ms)) for ms in result.get("closed_windows") or []]


def announce_extra(result: dict[str, Any]) -> dict[str, Any]:
    """The extra of the partitioned events (the same for every key of one commit): enough to read
    the partition, as of the snapshot that closed it."""
    return {
        "topic": result.get("topic"),
        "namespace": result.get("namespace"),
        "table": result.get("table"),
        "snapshot_id": result.get("snapshot_id"),
        "round_id": result.get("round_id"),
        "event_time_column": result.get("event_time_column"),
        "granularity": result.get("event_time_granularity"),
        "watermark_ms": result.get("watermark_ms"),
    }
