"""Round planning without a broker: windows from a checkpoint and a broker plan, task groups."""

from __future__ import annotations

from broker.checkpoint import NO_CHECKPOINT, Checkpoint
from spark_jobs.decode.segments import SegmentRange
from spark_jobs.rounds.plan import MAX_TASK_BYTES, MIN_TASK_BYTES, task_groups, windows

PLAN = {
    "partitions": [
        {"partition": 0, "log_start_offset": 0, "end_offset": 100},
        {"partition": 1, "log_start_offset": 40, "end_offset": 90},
        {"partition": 2, "log_start_offset": 0, "end_offset": 5},
    ]
}


def test_windows_start_at_the_checkpoint_or_the_log_start() -> None:
    got = windows(PLAN, Checkpoint({0: 30, 1: 10, 2: 9}, 1, topic_id="tid"), "tid")
    assert [(w.partition, w.start, w.end, w.skipped) for w in got] == [
        (0, 30, 100, 0),
        (1, 40, 90, 30),
        (2, 9, 9, 0),
    ]
    assert [(w.start, w.end) for w in windows(PLAN, NO_CHECKPOINT, "tid")] == [
        (0, 100),
        (40, 90),
        (0, 5),
    ]


def test_offsets_of_an_earlier_topic_of_the_same_name_are_ignored() -> None:
    got = windows(PLAN, Checkpoint({0: 99}, 1, topic_id="old"), "new")
    assert got[0].start == 0


def test_until_offsets_and_max_records_only_shorten() -> None:
    got = windows(PLAN, NO_CHECKPOINT, "t", until_offsets={0: 50, 1: 200}, max_records=20)
    assert [(w.start, w.end) for w in got] == [
        (0, 20),
        (40, 60),
        (0, 0),
    ]  # a partition not named: nothing


def _ranges(sizes: list[int], partition_of: list[int]) -> list[SegmentRange]:
    return [
        SegmentRange(f"o{i}", 0, size, p, 0, 10)
        for i, (size, p) in enumerate(zip(sizes, partition_of, strict=True))
    ]


def test_task_groups_keep_order_and_spread_bytes() -> None:
    ranges = _ranges([4 << 20] * 16, [i // 4 for i in range(16)])
    groups = task_groups(ranges, parallelism=2)
    assert [r for g in groups for r in g] == ranges
    # one task per core
    assert len(groups) == 2 and all(sum(r.byte_end for r in g) == 32 << 20 for g in groups)
    # a larger round: tasks of at most MAX_TASK_BYTES
    big = _ranges([32 << 20] * 16, [i // 4 for i in range(16)])
    groups = task_groups(big, parallelism=2)
    assert [r for g in groups for r in g] == big
    assert len(groups) == 4 and all(sum(r.byte_end for r in g) == MAX_TASK_BYTES for g in groups)


def test_tiny_ranges_share_one_task() -> None:
    groups = task_groups(_ranges([1000] * 50, [i % 3 for i in range(50)]), parallelism=2)
    assert len(groups) == 1 and MIN_TASK_BYTES > 50_000
