"""The table DAGs' timetables. Commit DAGs: the topic's commit interval as data intervals,
each run created a few seconds before its interval ends. Maintenance DAGs: every maintenance
interval, the first one interval after the topic's creation (``MaintenanceTimetable``).

A round's rows become visible at its commit, so what lies between an interval's end
and the commit adds to every row's freshness. With Airflow's own
``DeltaDataIntervalTimetable`` a run for [a, b) is created only once b has passed:
then the scheduler's loop finds it (up to ``scheduler_idle_sleep_time`` later, 1 s by default;
with SQLite at least the next whole second, as its ``CURRENT_TIMESTAMP`` has whole
seconds only), queues the round's first task, and a task process starts and parses
the DAG file, all after b: about 2 s of the 3.7 s from the interval's end to the commit's end
(docs/concepts/airflow.md, "Where a round's time goes under Airflow").

Here the run is created ``lead`` before b (4 s, at most half the interval), so
``commit`` is already running when the interval ends; it waits for b
(``planning.plan_round``) and only then asks the broker for the offsets appended
before b, which the broker does not answer before its own clock has passed b. The
data interval, the logical date, the offsets a run commits, backfills, manual runs
and catch-up are those of ``DeltaDataIntervalTimetable``; only ``run_after`` moves.

Airflow serializes a timetable that is not its own by import path and finds the
class among the plugins' ``timetables`` when it deserializes: the icefall plugin
registers both (``plugin.IcefallPlugin``), so the DAG processor, the scheduler
and the API server all know it. It subclasses the core timetable (not the Task SDK's
definition) because Airflow calls a custom timetable's own ``next_dagrun_info``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pendulum
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction
from airflow.timetables.interval import DeltaDataIntervalTimetable
from airflow.timetables.trigger import DeltaTriggerTimetable

# How long before its interval's end a run is created: the idle scheduler's loop (2 s under
# `icefall up`: broker/supervisor/up.py), SQLite's whole second and a task process's start and
# DAG parse (~0.5 s) fit in it.
DEFAULT_LEAD = timedelta(seconds=4)


class LeadingIntervalTimetable(DeltaDataIntervalTimetable):
    """Data intervals of ``delta``; the run for [a, b) is created at ``b - lead``
    (``lead`` capped at half of ``delta``, so a run never starts before its interval
    is half over)."""

    def __init__(self, delta: timedelta, lead: timedelta = DEFAULT_LEAD) -> None:
        super().__init__(delta)
        self.lead = min(lead, delta / 2)

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        info = super().next_dagrun_info(
            last_automated_data_interval=last_automated_data_interval, restriction=restriction
        )
        if info is None or info.data_interval is None:
            return info
        return info._replace(run_after=info.data_interval.end - self.lead)

    @property
    def delta(self) -> timedelta:
        """The commit interval."""
        return timedelta(seconds=self._delta.total_seconds())

    @property
    def summary(self) -> str:
        return f"{self._delta} (runs start {self.lead.total_seconds():g} s before the end)"

    def serialize(self) -> dict[str, Any]:
        return {"delta": self._delta.total_seconds(), "lead": self.lead.total_seconds()}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> LeadingIntervalTimetable:
        return cls(timedelta(seconds=data["delta"]), timedelta(seconds=data["lead"]))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LeadingIntervalTimetable):
            return NotImplemented
        return (self._delta, self.lead) == (other._delta, other.lead)

    def __hash__(self) -> int:
        return hash((self._delta, self.lead))


class MaintenanceTimetable(DeltaTriggerTimetable):
    """A run every ``delta`` (Airflow's ``DeltaTriggerTimetable``: no data interval, no
    catch-up), none before ``first_run``.

    Why not the DAG's ``start_date``: without catch-up a trigger timetable runs a DAG at once
    when its start date has passed, so a new topic's maintenance ran at its creation and found
    no table (no round had committed); a start date in the future, though, keeps a manual run
    (the UI's trigger button, ``dag.test()``) from running any task until then. ``first_run``
    (the topic's creation plus one interval) is stable from one parse to the next, unlike a
    "now + interval" that each re-parse would push on. It holds whatever runs the DAG id has
    had: a topic deleted and created again keeps its DAG id and the old runs in Airflow's
    database, and its new table is no more there at once than a new topic's. Once it has
    passed, runs follow Airflow's timetable (a run after ``first_run`` is followed by one a
    ``delta`` later, never earlier than ``first_run``)."""

    def __init__(self, delta: timedelta, first_run: datetime | None = None) -> None:
        super().__init__(delta)
        self.first_run = first_run

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        info = super().next_dagrun_info(
            last_automated_data_interval=last_automated_data_interval, restriction=restriction
        )
        first = self.first_run
        if info is None or first is None or info.run_after >= first:
            return info
        if restriction.latest is not None and restriction.latest < first:
            return None
        return DagRunInfo.interval(pendulum.instance(first), pendulum.instance(first))

    @property
    def delta(self) -> timedelta:
        """The maintenance interval."""
        return timedelta(seconds=self._delta.total_seconds())

    def serialize(self) -> dict[str, Any]:
        first = self.first_run
        return {
            "delta": self._delta.total_seconds(),
            "first_run": None if first is None else first.timestamp(),
        }

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> MaintenanceTimetable:
        first = data.get("first_run")
        return cls(
            timedelta(seconds=data["delta"]),
            None if first is None else datetime.fromtimestamp(first, tz=UTC),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MaintenanceTimetable):
            return NotImplemented
        return (self._delta, self.first_run) == (other._delta, other.first_run)

    def __hash__(self) -> int:
        return hash((self._delta, self.first_run))
