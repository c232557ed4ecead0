"""The commit DAGs' timetable: Airflow's data intervals, each run created ``lead`` before
its interval ends, and serialized the way Airflow stores a custom timetable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pendulum
from airflow.serialization.decoders import decode_timetable
from airflow.serialization.encoders import encode_timetable
from airflow.timetables.base import DataInterval, TimeRestriction
from airflow.timetables.interval import DeltaDataIntervalTimetable
from icefall_airflow.timetable import LeadingIntervalTimetable

START = pendulum.instance(datetime(2026, 1, 1, tzinfo=UTC))
A = pendulum.instance(datetime(2026, 11, 26, 10, 0, 0, tzinfo=UTC))
B = A + timedelta(seconds=20)


def test_runs_have_airflows_intervals_and_are_created_lead_before_their_end() -> None:
    ours = LeadingIntervalTimetable(timedelta(seconds=20))
    theirs = DeltaDataIntervalTimetable(timedelta(seconds=20))
    restriction = TimeRestriction(earliest=START, latest=None, catchup=True)
    for last in (DataInterval(A, B), DataInterval(B, B + timedelta(seconds=20))):
        info = ours.next_dagrun_info(last_automated_data_interval=last, restriction=restriction)
        expected = theirs.next_dagrun_info(
            last_automated_data_interval=last, restriction=restriction
        )
        assert info is not None and expected is not None and info.data_interval is not None
        assert info.data_interval == expected.data_interval  # the same [a, b)
        assert info.data_interval.start == last.end
        assert info.run_after == expected.run_after - timedelta(seconds=4)
        assert info.logical_date == expected.logical_date


def test_without_catchup_the_next_run_is_the_latest_interval_still_created_early() -> None:
    ours = LeadingIntervalTimetable(timedelta(seconds=20))
    restriction = TimeRestriction(earliest=START, latest=None, catchup=False)
    info = ours.next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
    now = pendulum.now("UTC")
    assert info is not None and info.data_interval is not None
    # the latest interval that has ended (as Airflow's), created 4 s before its end
    assert info.data_interval.end <= now < info.data_interval.end + timedelta(seconds=20)
    assert info.run_after == info.data_interval.end - timedelta(seconds=4)


def test_the_lead_is_at_most_half_the_interval() -> None:
    assert LeadingIntervalTimetable(timedelta(seconds=4)).lead == timedelta(seconds=2)
    assert LeadingIntervalTimetable(timedelta(minutes=5)).lead == timedelta(seconds=4)
    assert LeadingIntervalTimetable(timedelta(minutes=5), timedelta(seconds=10)).lead == (
        timedelta(seconds=10)
    )


def test_airflow_serializes_it_by_import_path_and_finds_it_among_the_plugins() -> None:
    timetable = LeadingIntervalTimetable(timedelta(seconds=20), timedelta(seconds=2))
    encoded = encode_timetable(timetable)  # raises unless a plugin registers the class
    assert encoded["__type"] == "icefall_airflow.timetable.LeadingIntervalTimetable"
    assert encoded["__var"] == {"delta": 20.0, "lead": 2.0}
    decoded = decode_timetable(encoded)
    assert decoded == timetable and decoded.summary == "0:00:20 (runs start 2 s before the end)"
