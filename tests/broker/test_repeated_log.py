"""broker/repeated_log.py: a flood of like events makes a line an interval per key, and every
event left out is counted in a later line."""

from __future__ import annotations

import logging

import pytest

from broker.repeated_log import RepeatedLog
from broker.storage.failures import StorageFailureLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    found = [r.getMessage() for r in caplog.records]
    caplog.clear()
    return found


def test_a_flood_makes_one_line_an_interval_with_the_count(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    repeated = RepeatedLog(logging.getLogger("t"), 10.0, clock=clock)
    for i in range(500):
        clock.now += 0.01
        repeated.log(("t", 0), "produce to t-0 refused: %d", i)
    assert lines(caplog) == ["produce to t-0 refused: 0"]
    clock.now += 10
    repeated.log(("t", 0), "produce to t-0 refused: %d", 500)
    # the 499 left out spanned 4.99 s after the first line
    assert lines(caplog) == [
        "produce to t-0 refused: 500 (499 more like it in the 5 s after the last such line)"
    ]


def test_keys_are_limited_apart(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    repeated = RepeatedLog(logging.getLogger("t"), 10.0, clock=clock)
    for key in ("a", "b", "a", "b"):
        repeated.log(key, "event of %s", key)
    assert lines(caplog) == ["event of a", "event of b"]


def test_a_run_that_ended_is_summed_up_by_the_next_event_of_another_key(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    repeated = RepeatedLog(logging.getLogger("t"), 10.0, clock=clock)
    for key, n in (("a", 4), ("b", 2), ("c", 1)):
        for i in range(n):
            repeated.log(key, "%s %d", key, i)
            clock.now += 1
    assert lines(caplog) == ["a 0", "b 0", "c 0"]
    clock.now += 20
    repeated.log("d", "d 0")
    # a's last event left out with the two before it (3 s after a's line), b's one alone
    assert sorted(lines(caplog)) == [
        "a 3 (2 more like it in the 3 s after the last such line)",
        "b 1",
        "d 0",
    ]
    clock.now += 11
    repeated.log("d", "d 1")
    assert lines(caplog) == ["d 1"]  # the runs summed up are forgotten


def test_the_line_names_the_code_that_had_the_event(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    repeated = RepeatedLog(logging.getLogger("t"), 10.0, clock=clock)
    repeated.log("a", "a 0")
    repeated.log("a", "a 1")
    clock.now += 11
    repeated.log("b", "b 0")  # its sweep sums a up
    assert [(r.filename, r.funcName) for r in caplog.records] == [
        ("test_repeated_log.py", "test_the_line_names_the_code_that_had_the_event")
    ] * 3


def test_the_storage_failure_log_is_an_error_line_a_minute(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    failures = StorageFailureLog(logging.getLogger("t"), clock=clock)
    full = OSError(28, "No space left on device")
    for _ in range(3):
        failures.refused("produce to t-0", full)
        clock.now += 20
    failures.refused("produce to t-0", full)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.ERROR,
            f"produce to t-0 refused with KAFKA_STORAGE_ERROR, storage cannot write: {full}",
        ),
        (
            logging.ERROR,
            f"produce to t-0 refused with KAFKA_STORAGE_ERROR, storage cannot write: {full}"
            " (2 more like it in the 40 s after the last such line)",
        ),
    ]
