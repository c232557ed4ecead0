"""What one commit round reads: per partition [start, end) and the segment byte ranges covering it.

Start offsets come from the table (``broker.checkpoint``), end offsets from
the broker's plan, so the same round run twice plans the same window, and a
round after a committed one starts where it ended. The ranges are grouped
into Spark tasks of a bounded byte size: a task reads its ranges in order
with one reader, so the records of a partition are never split mid-range.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.checkpoint import Checkpoint
from broker.contracts import TopicPlan, lag_start
from spark_jobs.decode.segments import SegmentRange, ranges_from_admin

MIN_TASK_BYTES = 1 << 20
MAX_TASK_BYTES = 128 << 20


@dataclass(frozen=True)
class PartitionWindow:
    partition: int
    start: int
    end: int
    log_start_offset: int
    skipped: int = (
        0  # records lost to retention before they were committed (start moved up to the log start)
    )

    @property
    def records(self) -> int:
        return max(self.end - self.start, 0)


@dataclass
class RoundPlan:
    windows: list[PartitionWindow]
    until_append_ms: int | None
    ranges: list[SegmentRange] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return all(w.records == 0 for w in self.windows)

    @property
    def bytes(self) -> int:
        """The segment bytes the round reads (``ranges``, once fetched)."""
        return sum(r.byte_end - r.byte_start for r in self.ranges)

    @property
    def offsets_before(self) -> dict[int, int]:
        return {w.partition: w.start for w in self.windows}

    @property
    def offsets_after(self) -> dict[int, int]:
        return {w.partition: max(w.end, w.start) for w in self.windows}


def windows(
    broker_plan: Mapping[str, Any] | TopicPlan,
    checkpoint: Checkpoint,
    topic_id: str,
    *,
    until_offsets: Mapping[int, int] | None = None,
    max_records: int | None = None,
) -> list[PartitionWindow]:
    """Per partition: start = the table's committed offset (the log start when
    the table has none, or when it holds offsets of an earlier topic of the
    same name), end = the broker's planned end (or ``until_offsets``), never
    below start: a round never moves a partition backwards."""
    committed_offsets = checkpoint.offsets_for(topic_id)
    out = []
    for entry in broker_plan["partitions"]:
        p = int(entry["partition"])
        log_start = int(entry["log_start_offset"])
        committed = committed_offsets.get(p)
        start = lag_start(committed, log_start)
        skipped = start - committed if committed is not None else 0
        end = int(entry["end_offset"])
        if until_offsets is not None:
            end = min(end, int(until_offsets.get(p, start)))
        if max_records is not None:
            end = min(end, start + max_records)
        out.append(PartitionWindow(p, start, max(end, start), log_start, skipped))
    return out


def task_groups(ranges: list[SegmentRange], parallelism: int) -> list[list[SegmentRange]]:
    """Consecutive ranges (any partitions; a partition's stay in offset order), about
    total / parallelism bytes a group, bounded: one task per core, as many as
    ``MAX_TASK_BYTES`` calls for on a larger round, and tiny ranges do not each cost a task.

    One task per core rather than several: every task costs fixed CPU however small it is (the
    spec with the table's metadata unpickled and parsed, Spark's scheduling, a worker's
    collection) and adds a data file to the round; with four tasks per core a 70 MB round was
    9 files and its Spark tasks cost several times the CPU of the same work in one process
    (bench/BENCHMARKS.md). Groups are cut by bytes, so the tasks are of a size."""
    total = sum(r.byte_end - r.byte_start for r in ranges)
    target = min(max(-(-total // max(parallelism, 1)), MIN_TASK_BYTES), MAX_TASK_BYTES)
    groups: list[list[SegmentRange]] = []
    size = 0
    for rng in ranges:
        length = rng.byte_end - rng.byte_start
        if groups and size + length <= target:
            groups[-1].append(rng)
            size += length
        else:
            groups.append([rng])
            size = length
    return groups


def fetch_ranges(admin: Any, topic: str, plan_windows: list[PartitionWindow]) -> list[SegmentRange]:
    """The byte ranges of every non-empty window, partition by partition in offset order."""
    out: list[SegmentRange] = []
    for w in plan_windows:
        if w.records:
            out.extend(ranges_from_admin(admin.ranges(topic, w.partition, w.start, w.end)))
    return out
