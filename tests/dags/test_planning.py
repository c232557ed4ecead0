"""The plan step: which offsets a run commits, waiting for its interval to end and for the
broker to flush them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest
from icefall_airflow.broker_client import BrokerClient
from icefall_airflow.planning import PlanError, RoundPlan, RoundRequest, plan_round, round_request

END = datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC)
END_MS = int(END.timestamp() * 1000)


def test_a_scheduled_run_commits_up_to_its_interval_end_with_a_stable_round_id() -> None:
    request = round_request("clicks", {"until": "interval"}, END, "scheduled__x", now_ms=1)
    assert request == RoundRequest("clicks", f"clicks@{END_MS}", until_append_ms=END_MS)
    again = round_request("clicks", {}, END, "manual__rerun", now_ms=2)
    assert again.round_id == request.round_id and again.until_append_ms == END_MS


def test_a_manual_run_without_logical_date_commits_up_to_now() -> None:
    request = round_request(
        "clicks", {"until": "interval", "max_records": 10}, None, "manual__1", now_ms=1234
    )
    assert request.until_append_ms == 1234 and request.max_records == 10
    assert round_request("clicks", {"until": "now"}, END, "manual__2", 99).until_append_ms == 99


def test_until_offsets_param() -> None:
    request = round_request(
        "clicks", {"until": "offsets", "until_offsets": {"0": 5, "2": 7}}, END, "m", 1
    )
    assert request.until_offsets == {0: 5, 2: 7} and request.until_append_ms is None
    assert round_request(
        "clicks", {"until": "offsets", "until_offsets": '{"1": 3}'}, END, "m", 1
    ).until_offsets == {1: 3}
    for bad in (
        {"until": "offsets"},
        {"until": "offsets", "until_offsets": {"x": 1}},
        {"until": "offsets", "until_offsets": {"0": -1}},
        {"until": "tomorrow"},
    ):
        with pytest.raises(PlanError):
            round_request("clicks", bad, END, "m", 1)


class FakeBroker:
    """The admin API's plan/offsets answers; partition 1 becomes flushed after ``flush_after`` polls."""

    def __init__(self, flush_after: int) -> None:
        self.polls = 0
        self.flushes = 0
        self.flush_after = flush_after

    def _flushed(self) -> bool:
        return self.polls > self.flush_after

    def plan(self, topic: str, until_append_ms: int | None) -> dict[str, Any]:
        self.polls += 1
        return {
            "partitions": [
                {
                    "partition": 0,
                    "log_start_offset": 0,
                    "end_offset": 10,
                    "flushed": True,
                    "high_watermark": 12,
                },
                {
                    "partition": 1,
                    "log_start_offset": 2,
                    "end_offset": 8,
                    "flushed": self._flushed(),
                    "high_watermark": 8,
                },
            ]
        }

    def offsets(self, topic: str) -> dict[str, Any]:
        self.polls += 1
        flushed = 8 if self._flushed() else 5
        return {
            "partitions": [
                {"partition": 0, "log_start_offset": 0, "high_watermark": 12, "flushed_offset": 12},
                {
                    "partition": 1,
                    "log_start_offset": 2,
                    "high_watermark": 8,
                    "flushed_offset": flushed,
                },
            ]
        }

    def flush(self) -> dict[str, Any]:
        self.flushes += 1
        return {"bytes_written": 0}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def fake_plan_round(
    broker: FakeBroker, request: RoundRequest, deadline_s: float, clock: Clock
) -> RoundPlan:
    """plan_round over the fake broker (it answers the calls plan_round makes) and the fake clock."""
    return plan_round(cast(BrokerClient, broker), request, deadline_s, 0.5, clock, clock.sleep)


def test_plan_waits_until_flushed_and_hurries_the_broker_once() -> None:
    broker, clock = FakeBroker(flush_after=3), Clock()
    plan = fake_plan_round(broker, RoundRequest("t", "r", until_append_ms=5), 10, clock)
    assert plan.end_offsets == {0: 10, 1: 8}
    assert plan.high_watermarks == {0: 12, 1: 8} and plan.log_start_offsets == {0: 0, 1: 2}
    assert broker.flushes == 1 and broker.polls == 4
    assert plan.to_xcom()["end_offsets"] == {"0": 10, "1": 8}


def test_plan_gives_up_at_the_deadline() -> None:
    broker, clock = FakeBroker(flush_after=1_000), Clock()
    with pytest.raises(PlanError, match=r"did not flush t partitions \[1\] within 3 s"):
        fake_plan_round(broker, RoundRequest("t", "r", until_append_ms=5), 3, clock)


def test_plan_for_explicit_offsets_checks_them_against_the_log() -> None:
    broker, clock = FakeBroker(flush_after=2), Clock()
    plan = fake_plan_round(broker, RoundRequest("t", "r", until_offsets={1: 7}), 10, clock)
    assert plan.end_offsets == {1: 7} and broker.flushes == 1
    with pytest.raises(PlanError, match="beyond the end"):
        fake_plan_round(broker, RoundRequest("t", "r", until_offsets={0: 13}), 10, clock)
    with pytest.raises(PlanError, match="no partitions"):
        fake_plan_round(broker, RoundRequest("t", "r", until_offsets={5: 1}), 10, clock)


class ClockedBroker(FakeBroker):
    """A broker with its own clock (``skew_s`` behind the test's): asked for a time it has
    not reached, it reports nothing flushed, as the admin API does. Records when it was
    asked to plan and to flush, on the test's clock."""

    def __init__(self, clock: Clock, flush_after: int, skew_s: float = 0.0) -> None:
        super().__init__(flush_after)
        self.clock, self.skew_s = clock, skew_s
        self.planned_at: list[float] = []
        self.flushed_at: list[float] = []

    def plan(self, topic: str, until_append_ms: int | None) -> dict[str, Any]:
        answer = super().plan(topic, until_append_ms)
        self.planned_at.append(self.clock())
        now_ms = int((self.clock() - self.skew_s) * 1000)
        answer.update(until_append_ms=until_append_ms, broker_time_ms=now_ms)
        if until_append_ms is not None and until_append_ms > now_ms:
            for row in answer["partitions"]:
                row["flushed"] = False
        return answer

    def flush(self) -> dict[str, Any]:
        self.flushed_at.append(self.clock())
        return super().flush()


def clocked_plan_round(broker: ClockedBroker, until_s: float, deadline_s: float) -> RoundPlan:
    clock = broker.clock
    request = RoundRequest("t", "r", until_append_ms=int(until_s * 1000))
    return plan_round(
        cast(BrokerClient, broker), request, deadline_s, 0.5, clock, clock.sleep, wall=clock
    )


def test_a_run_started_before_its_interval_ends_asks_the_broker_only_after_the_end() -> None:
    clock = Clock()
    clock.now = 100.0
    broker = ClockedBroker(clock, flush_after=1)
    plan = clocked_plan_round(broker, until_s=103.0, deadline_s=10)
    assert broker.planned_at[0] == 103.0  # slept until the interval's end, then asked
    assert broker.flushed_at == [103.0]  # and hurried the flush from then on
    assert plan.end_offsets == {0: 10, 1: 8}


def test_a_broker_whose_clock_is_behind_is_asked_again_and_hurried_only_once_it_is_past() -> None:
    clock = Clock()
    clock.now = 100.0
    broker = ClockedBroker(clock, flush_after=4, skew_s=1.2)
    plan = clocked_plan_round(broker, until_s=103.0, deadline_s=10)
    # asked at 103.0, 103.5 and 104.0 (its clock 101.8, 102.3, 102.8: not final), then at
    # 104.5 (103.3): partition 1 not flushed yet, so hurried then, and not before
    assert broker.planned_at[:4] == [103.0, 103.5, 104.0, 104.5]
    assert broker.flushed_at == [104.5]
    assert plan.end_offsets == {0: 10, 1: 8}


def test_a_broker_clock_that_never_reaches_the_end_fails_the_plan_with_that_reason() -> None:
    clock = Clock()
    clock.now = 100.0
    broker = ClockedBroker(clock, flush_after=0, skew_s=60.0)
    with pytest.raises(PlanError, match="broker's clock did not reach the end of the interval"):
        clocked_plan_round(broker, until_s=101.0, deadline_s=5)
    assert broker.flushed_at == []


def test_a_run_whose_interval_ends_far_ahead_is_refused_at_once() -> None:
    clock = Clock()
    clock.now = 100.0
    broker = ClockedBroker(clock, flush_after=0)
    with pytest.raises(PlanError, match="3600 s from now: it cannot be planned before then"):
        clocked_plan_round(broker, until_s=3700.0, deadline_s=10)
    assert broker.planned_at == [] and clock.now == 100.0
