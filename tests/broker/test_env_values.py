"""broker.env_values: the numbers the commit tasks and jobs read from their environment, each
refused with its name when it cannot be used (it used to be a bare ``float()``: "abc" failed
every round unnamed, "-1" was a deadline already passed, "nan" one that never passes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from broker.env_values import PLAN_DEADLINE_S, ROUND_IN_DRIVER_MAX_BYTES, EnvValueError
from tests.support import REPO


def test_unset_or_empty_is_the_default_and_a_value_is_read() -> None:
    assert PLAN_DEADLINE_S.read({}) == 120.0
    assert PLAN_DEADLINE_S.read({PLAN_DEADLINE_S.name: "  "}) == 120.0
    assert PLAN_DEADLINE_S.read({PLAN_DEADLINE_S.name: "2.5"}) == 2.5
    assert ROUND_IN_DRIVER_MAX_BYTES.read({}) == 1 << 30
    assert ROUND_IN_DRIVER_MAX_BYTES.read({ROUND_IN_DRIVER_MAX_BYTES.name: "0"}) == 0
    assert ROUND_IN_DRIVER_MAX_BYTES.read({ROUND_IN_DRIVER_MAX_BYTES.name: "1024"}) == 1024


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "nan", "inf"])
def test_a_deadline_that_cannot_be_one_is_named(raw: str) -> None:
    with pytest.raises(EnvValueError) as refused:
        PLAN_DEADLINE_S.read({PLAN_DEADLINE_S.name: raw})
    assert str(refused.value) == f"ICEFALL_PLAN_DEADLINE_S={raw!r}: expected a number > 0.0"


@pytest.mark.parametrize("raw", ["abc", "1.5", "-1", "1e3"])
def test_a_byte_limit_that_is_no_count_is_named(raw: str) -> None:
    with pytest.raises(EnvValueError, match=rf"^ICEFALL_ROUND_IN_DRIVER_MAX_BYTES='{raw}': "):
        ROUND_IN_DRIVER_MAX_BYTES.read({ROUND_IN_DRIVER_MAX_BYTES.name: raw})


@pytest.mark.parametrize("job", ["spark_jobs.commit_round", "spark_jobs.dlq_reprocess"])
def test_a_job_with_a_bad_limit_is_a_usage_error_naming_it(job: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", job, "--topic", "t"],
        cwd=REPO,
        env={**os.environ, ROUND_IN_DRIVER_MAX_BYTES.name: "lots"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done
    assert "ICEFALL_ROUND_IN_DRIVER_MAX_BYTES='lots': expected an integer >= 0" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr
