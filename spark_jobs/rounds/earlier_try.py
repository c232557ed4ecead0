"""A round committed by an earlier try of itself: its result, rebuilt from its snapshot.

A commit task can die after its round's catalog commit and before Airflow records the
task's success: the worker killed, the scheduler restarted, the warm driver's answer
lost. Airflow then retries the task under the same run, so the same round id
(``planning.round_request``), and the retry's plan is empty: the round's offsets are in
the table. Reported as ``nothing_new``, the commit would never get its asset event, and
the downstream DAGs scheduled on the table would miss it. So a round whose plan is empty
looks for its own round id on ``main`` (``checkpoint.find_round``) and, when it is
there, reports that commit as ``committed`` with ``from_earlier_try`` set; the commit
task then publishes the event unless one for that snapshot already exists (a run cleared
after its success, a backfill over committed intervals: still one event per snapshot).

The figures come from what the snapshot recorded in the same atomic commit (the
checkpoint offsets, the event-time state, the DLQ count, Iceberg's own ``added-*``
summary), so they are the commit's, not a guess. What only the first try's tasks knew
is left out: bytes read, the rows' event-time range, late windows, timings.
"""

from __future__ import annotations

import json
from typing import Any

from broker import checkpoint
from spark_jobs.rounds import dlq_catchup, event_time


def committed_values(
    metadata: Any, found: checkpoint.CommittedRound, topic_id: str
) -> dict[str, Any]:
    """``RoundResult`` fields of the commit ``found`` (``metadata``: the table's, to read the
    checkpoint snapshot the round started from)."""
    summary = checkpoint.summary_properties(found.snapshot)
    before = found.before.offsets_for(topic_id)
    after = found.checkpoint.offsets
    state_before = event_time.State.from_summary(
        checkpoint.summary_properties(metadata.snapshot_by_id(found.before.snapshot_id))
        if found.before.snapshot_id is not None and found.before.belongs_to(topic_id)
        else {}
    )
    state = event_time.State.from_summary(summary)
    granularity = summary.get(event_time.GRANULARITY) or None
    rows = int(summary.get("added-records", 0))
    return {
        "snapshot_id": found.snapshot.snapshot_id,
        "parent_snapshot_id": found.snapshot.parent_snapshot_id,
        "snapshot_timestamp_ms": found.snapshot.timestamp_ms,
        "offsets_before": before,
        "offsets_after": after,
        "records": sum(max(0, end - before.get(p, 0)) for p, end in after.items()),
        "rows": rows,
        "dlq_rows": int(summary.get(dlq_catchup.DLQ_ROWS, 0)),
        "data_files": int(summary.get("added-data-files", 0)),
        "from_earlier_try": True,
        "message": (
            f"committed by an earlier try of round {found.checkpoint.round_id}: snapshot "
            f"{found.snapshot.snapshot_id}, {rows} rows (figures from its snapshot summary)"
        ),
        "event_time_column": summary.get(event_time.COLUMN, ""),
        "event_time_granularity": granularity,
        "watermarks": state.watermarks,
        "watermark_before_ms": state_before.watermark,
        "watermark_ms": state.watermark,
        "closed_windows": [int(w) for w in json.loads(summary.get(event_time.CLOSED, "[]"))]
        if granularity
        else [],
    }
