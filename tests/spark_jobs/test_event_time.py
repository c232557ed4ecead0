"""spark_jobs/rounds/event_time.py ``observe``: the range and the windows of a batch's event
times in ms, floored (pre-1970 values too), for every timestamp unit and dates; nulls and
columns of other types add nothing. The expected figures are worked out by hand."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from spark_jobs.rounds.event_time import EventTimeSpec, Observed, observe

HOUR = 3_600_000
DAY = 86_400_000


def _observed(column: pa.Array, granularity: str | None, path: str = "at") -> Observed:
    if "." in path:
        outer, inner = path.split(".")
        batch = pa.RecordBatch.from_arrays([pa.StructArray.from_arrays([column], [inner])], [outer])
    else:
        batch = pa.RecordBatch.from_arrays([column], [path])
    into = Observed()
    observe(EventTimeSpec(path, granularity), batch, 3, into)
    return into


@pytest.mark.parametrize(
    ("column", "granularity", "ms_range", "windows"),
    [
        # -1 µs is in the millisecond before the epoch and in the hour before it
        (
            pa.array([-1, 3_599_999_999, 3_600_000_000, None], pa.timestamp("us")),
            "hour",
            (-1, 3_600_000),
            {-HOUR, 0, HOUR},
        ),
        (pa.array([None, -1, 1_000_000], pa.timestamp("ns", "UTC")), "hour", (-1, 1), {-HOUR, 0}),
        (pa.array([-1, 3_600], pa.timestamp("s")), "hour", (-1_000, HOUR), {-HOUR, HOUR}),
        (
            pa.array([DAY - 1, -DAY - 1], pa.timestamp("ms")),
            "day",
            (-DAY - 1, DAY - 1),
            {-2 * DAY, 0},
        ),
        (pa.array([2, -1, 0], pa.date32()), "day", (-DAY, 2 * DAY), {-DAY, 0, 2 * DAY}),
        (pa.array([5, 7], pa.timestamp("ms")), None, (5, 7), set()),
    ],
)
def test_the_range_and_the_windows_are_floored_in_ms(
    column: pa.Array, granularity: str | None, ms_range: tuple[int, int], windows: set[int]
) -> None:
    seen = _observed(column, granularity)
    assert seen.ranges == {3: ms_range}
    assert seen.windows == windows


def test_a_nested_column_is_found_by_its_path() -> None:
    seen = _observed(pa.array([HOUR + 1, 2 * HOUR], pa.timestamp("ms")), "hour", "meta.at")
    assert seen.ranges == {3: (HOUR + 1, 2 * HOUR)}
    assert seen.windows == {HOUR, 2 * HOUR}


@pytest.mark.parametrize(
    "column",
    [pa.array([None, None], pa.timestamp("us")), pa.array(["2026-01-01"]), pa.array([1, 2])],
)
def test_nulls_and_other_types_add_nothing(column: pa.Array) -> None:
    assert _observed(column, "hour") == Observed()


def test_a_missing_column_adds_nothing() -> None:
    batch = pa.RecordBatch.from_arrays([pa.array([1], pa.timestamp("ms"))], ["other"])
    into = Observed()
    observe(EventTimeSpec("at", "hour"), batch, 0, into)
    assert into == Observed()


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _reference(
    values: list[int | None], unit: str, window: int
) -> tuple[tuple[int, int], set[int]]:
    """Python's floor on Python's ints, value by value."""
    mul, div = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}[unit]
    ms = [v * mul // div for v in values if v is not None]
    return (min(ms), max(ms)), {m // window * window for m in ms}


@pytest.mark.parametrize(
    ("values", "unit"),
    [
        ([INT64_MIN, 0, 5], "us"),  # a "missing" placeholder beside real values
        ([INT64_MIN, INT64_MAX], "ns"),
        ([-(2**62), 2**62, None], "ns"),  # centuries apart
        ([INT64_MIN + 1, -1, INT64_MAX], "ms"),
        ([-(10**15), 10**15], "s"),
    ],
)
@pytest.mark.parametrize("granularity", ["hour", "day"])
def test_values_at_the_ends_of_int64_neither_overflow_nor_fail(
    values: list[int | None], unit: str, granularity: str
) -> None:
    window = HOUR if granularity == "hour" else DAY
    seen = _observed(pa.array(values, pa.timestamp(unit)), granularity)
    ms_range, windows = _reference(values, unit, window)
    assert seen.ranges == {3: ms_range}
    assert seen.windows == windows


def test_random_values_match_the_reference() -> None:
    rng = random.Random(20261128)
    for _ in range(300):
        unit = rng.choice(["s", "ms", "us", "ns"])
        span = rng.choice([10**3, 10**9, 10**13, 2**62])
        values: list[int | None] = [
            None if rng.random() < 0.1 else rng.randint(-span, span) for _ in range(20)
        ]
        if all(v is None for v in values):
            continue
        if unit == "s":  # seconds in ms must fit int64, as Arrow's own timestamps
            values = [None if v is None else v // 1000 for v in values]
        granularity = rng.choice(["hour", "day"])
        window = HOUR if granularity == "hour" else DAY
        seen = _observed(pa.array(values, pa.timestamp(unit)), granularity)
        ms_range, windows = _reference(values, unit, window)
        assert (seen.ranges, seen.windows) == ({3: ms_range}, windows), (unit, values)
