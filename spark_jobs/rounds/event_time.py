"""Event time of a round's rows: their range, the table's watermark, and the hours or days it closes.

Each commit event says which event times arrived (the min and max of the rows'
event-time column), and where the table is partitioned by an ``hour(...)`` or
``day(...)`` transform of a timestamp column (``automq.table.topic.partition.by``),
the round also says which of those hours or days are now *closed*, so a
downstream DAG can run once per closed partition instead of once per commit.

- The event-time column: the source column of the first hour/day partition field
  when it is a timestamp (or a date, for ``day``) in the rows the tasks write;
  else the Kafka record timestamp ``_kafka_metadata.timestamp``, with no
  windows. The tasks compute it in the pass that writes the rows (``observe``,
  vectorised on the Arrow batch: a min/max and a unique of the window numbers).
- The watermark of a Kafka partition: the largest event time the table has
  committed from it. The table's watermark: the least of the partitions'
  watermarks, leaving out partitions the round committed up to the broker's end
  (idle: nothing of theirs is waiting, as Flink's idle sources), or the largest
  when all are idle; it never goes back. A partition that is not idle and has
  committed nothing holds the watermark where it is.
- A window [start, start + hour or day) the table has rows in is closed once the
  watermark reaches its end. Windows with rows that are not closed yet stay
  *open*. Rows arriving for a window that was already closed (late rows) are
  written, and the window is reported as ``late_windows``, not announced again.

The state (per-partition watermarks, the watermark, the open windows, and the
windows this snapshot closed) is written in the round's snapshot summary, in
the same atomic catalog commit as the checkpoint offsets; the next round starts
from its checkpoint snapshot's. So each window is closed by exactly one
snapshot, whatever rounds are retried or re-run (a re-run commits nothing and
closes nothing), and the commit DAG announces it once, from that round's result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

RECORD_TIMESTAMP = "_kafka_metadata.timestamp"
WINDOW_MS = {"hour": 3_600_000, "day": 86_400_000}

# snapshot summary keys
WATERMARKS = "icefall.event-time.watermarks"  # {"<partition>": ms}
WATERMARK = "icefall.event-time.watermark"  # ms
OPEN = "icefall.event-time.open"  # [window start ms, ...]
CLOSED = "icefall.event-time.closed"  # [window start ms, ...] closed by this snapshot
COLUMN = "icefall.event-time.column"
GRANULARITY = "icefall.event-time.granularity"

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UNIT_SCALE = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}


@dataclass(frozen=True)
class EventTimeSpec:
    """Which column is the event time, and the window of the table's time partitions (None: none)."""

    column: str = RECORD_TIMESTAMP
    granularity: str | None = None

    @property
    def window_ms(self) -> int | None:
        return WINDOW_MS[self.granularity] if self.granularity else None

    @classmethod
    def of(cls, partition_by: str, schema: Any) -> EventTimeSpec:
        """From the topic's ``partition.by`` and the schema of the rows the tasks write (pyiceberg)."""
        from pyiceberg.transforms import DayTransform, HourTransform
        from pyiceberg.types import DateType, TimestampType, TimestamptzType

        from spark_jobs.rounds import partitioning

        for item in partitioning.parse(partition_by or ""):
            if not isinstance(item.transform, HourTransform | DayTransform):
                continue
            try:
                column_type = schema.find_type(item.column)
            except ValueError:  # not in the rows the tasks write (JSON values parse later)
                continue
            timestamp = isinstance(column_type, TimestampType | TimestamptzType)
            date = isinstance(column_type, DateType) and isinstance(item.transform, DayTransform)
            if timestamp or date:
                granularity = "hour" if isinstance(item.transform, HourTransform) else "day"
                return cls(item.column, granularity)
        return cls()


@dataclass
class Observed:
    """What the tasks saw of the event times: per Kafka partition (min, max) ms, and the windows."""

    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    windows: set[int] = field(default_factory=set)

    def merge(self, other: Observed) -> Observed:
        for partition, (low, high) in other.ranges.items():
            known = self.ranges.get(partition)
            self.ranges[partition] = (
                (low, high) if known is None else (min(known[0], low), max(known[1], high))
            )
        self.windows |= other.windows
        return self

    @property
    def min_ms(self) -> int | None:
        return min((low for low, _ in self.ranges.values()), default=None)

    @property
    def max_ms(self) -> int | None:
        return max((high for _, high in self.ranges.values()), default=None)


def _column(batch: pa.RecordBatch, path: str) -> pa.Array | None:
    names = path.split(".")
    if names[0] not in batch.schema.names:
        return None
    array: Any = batch.column(names[0])
    for name in names[1:]:
        if not pa.types.is_struct(array.type) or array.type.get_field_index(name) < 0:
            return None
        array = pc.struct_field(array, name)
    return array


def _scale(kind: pa.DataType) -> tuple[int, int] | None:
    """(multiplier, divisor) from a column's int64 values to ms, or None for a column of another type."""
    if pa.types.is_timestamp(kind):
        return _UNIT_SCALE[kind.unit]
    if pa.types.is_date32(kind):
        return WINDOW_MS["day"], 1
    return None


def observe(spec: EventTimeSpec, batch: pa.RecordBatch, partition: int, into: Observed) -> None:
    """Add one batch of rows (all of Kafka partition ``partition``) to ``into``.

    Why not convert the column to ms first: the range needs only its two ends (a floor is
    monotonic, so the ends of the raw values give the ends in ms, converted in Python), and the
    windows one division of values made non-negative (then truncation is the floor; no value
    can overflow, ``_window_numbers``). Converting
    every value took ~8 passes over the batch (a floor for pre-1970 values in Arrow's truncating
    division): 6 % of the warm driver's CPU at 10,000 records/s (py-spy, vs_connect.py)."""
    if not batch.num_rows:
        return
    column = _column(batch, spec.column)
    scale = None if column is None else _scale(column.type)
    if scale is None or column is None or column.null_count == len(column):
        return
    # days to int64 by way of int32 (Arrow has no direct cast; the day partitions of a date column)
    raw = (column.cast(pa.int32()) if pa.types.is_date32(column.type) else column).cast(pa.int64())
    bounds = pc.min_max(raw)
    mul, div = scale
    low_raw, high_raw = int(bounds["min"].as_py()), int(bounds["max"].as_py())
    into.merge(Observed({partition: (low_raw * mul // div, high_raw * mul // div)}))
    window = spec.window_ms
    if window:
        into.windows.update(
            n * window for n in _window_numbers(raw, low_raw, high_raw, window, scale)
        )


def _window_numbers(
    raw: pa.Array, low: int, high: int, window_ms: int, scale: tuple[int, int]
) -> list[int]:
    """floor(ms / window_ms) of every value, each once; ``low``/``high`` the values' ends."""
    mul, div = scale
    per_window, rest = divmod(window_ms * div, mul)  # raw units in a window
    if rest or not per_window:  # not a whole number of units (no spec has one): value by value
        values = pc.unique(raw).drop_null().to_pylist()
        return sorted({(v * mul // div) // window_ms for v in values})
    first = low // per_window  # Python's floor: the first window's number
    base = first * per_window
    if base >= _INT64_MIN and high - base <= _INT64_MAX:
        # shifted to be non-negative, Arrow's truncating division is the floor
        after_first = pc.divide(pc.subtract(raw, base), per_window)
        return [first + n for n in pc.unique(after_first).to_pylist() if n is not None]
    # values spread wider than int64 holds their differences (a -2**63 placeholder, centuries
    # of ns): truncated, then one less where that rounded a negative value up
    truncated = pc.divide(raw, per_window)
    below = pc.less(raw, pc.multiply(truncated, per_window))
    numbers = pc.subtract(truncated, below.cast(pa.int64()))
    return [n for n in pc.unique(numbers).to_pylist() if n is not None]


@dataclass(frozen=True)
class State:
    """The event-time state a checkpoint snapshot carries."""

    watermarks: dict[int, int] = field(default_factory=dict)
    watermark: int | None = None
    open_windows: tuple[int, ...] = ()

    @classmethod
    def from_summary(cls, props: Mapping[str, str]) -> State:
        try:
            marks = {int(p): int(ms) for p, ms in json.loads(props.get(WATERMARKS, "{}")).items()}
            watermark = int(props[WATERMARK]) if props.get(WATERMARK) else None
            open_windows = tuple(int(w) for w in json.loads(props.get(OPEN, "[]")))
        except (ValueError, TypeError, AttributeError):  # not ours: start afresh, never guess
            return cls()
        return cls(marks, watermark, open_windows)


@dataclass(frozen=True)
class Advance:
    """A round's step: the new state, the windows it closes and the late ones."""

    before: State
    after: State
    closed: list[int]
    late: list[int]

    def summary(self, spec: EventTimeSpec) -> dict[str, str]:
        """The snapshot summary properties that record it."""
        props = {
            COLUMN: spec.column,
            WATERMARKS: json.dumps(
                {str(p): ms for p, ms in sorted(self.after.watermarks.items())},
                separators=(",", ":"),
            ),
        }
        if self.after.watermark is not None:
            props[WATERMARK] = str(self.after.watermark)
        if spec.granularity:
            props[GRANULARITY] = spec.granularity
            props[OPEN] = json.dumps(list(self.after.open_windows), separators=(",", ":"))
            props[CLOSED] = json.dumps(self.closed, separators=(",", ":"))
        return props


def advance(
    state: State,
    spec: EventTimeSpec,
    observed: Observed,
    partitions: Iterable[int],
    idle: set[int],
) -> Advance:
    """The state after a round that committed ``observed`` (``partitions``: the topic's;
    ``idle``: those the round committed up to the broker's end)."""
    marks = dict(state.watermarks)
    for partition, (_, high) in observed.ranges.items():
        marks[partition] = max(marks.get(partition, high), high)
    active = [p for p in partitions if p not in idle]
    computed: int | None
    if any(p not in marks for p in active):
        computed = None
    elif active:
        computed = min(marks[p] for p in active)
    else:
        computed = max(marks.values(), default=None)
    known = [w for w in (state.watermark, computed) if w is not None]
    watermark = max(known) if known else None
    window = spec.window_ms
    if not window:
        return Advance(state, State(marks, watermark, ()), [], [])
    late = sorted(
        w for w in observed.windows if state.watermark is not None and w + window <= state.watermark
    )
    candidates = (set(state.open_windows) | observed.windows) - set(late)
    closed = sorted(w for w in candidates if watermark is not None and w + window <= watermark)
    still_open = tuple(sorted(candidates - set(closed)))
    return Advance(state, State(marks, watermark, still_open), closed, late)
