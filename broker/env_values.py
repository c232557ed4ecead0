"""Numbers that Icefall's Airflow tasks and Spark jobs read from their environment, each
declared once with its bounds, and an error that names the variable.

Two settings reach the commit tasks and the jobs as environment variables (Airflow hands its
own environment to its task processes, spark-submit to the driver): how long a commit task
waits for its plan, and the size up to which a round runs without Spark. Read with ``float()``
and ``int()`` where they were used, ``ICEFALL_PLAN_DEADLINE_S=abc`` failed every round with
"could not convert string to float" and no name; ``-1`` was a deadline already passed (the
task blamed the broker's flush), ``nan`` one that never passes. ``icefall up`` checks every
one of ``TASK_NUMBERS`` before it starts anything (``broker.supervisor.up_settings``); a task
or job under another Airflow fails naming the variable and what it accepts (a job run by hand
exits 2; asked of the warm driver, which ``icefall up`` starts only after the check, the round
is refused as bad arguments and the driver's log names the variable).

A dataclass, not pydantic: the Spark jobs' drivers read these as their flags' defaults, and one
message format is all they need. An empty variable counts as unset.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

N = TypeVar("N", int, float)


class EnvValueError(ValueError):
    """A variable whose value cannot be used; the message names it and what it accepts."""


@dataclass(frozen=True)
class EnvNumber(Generic[N]):
    """``name``'s value as ``kind``, ``default`` when unset; at least ``minimum`` (above it
    when ``above``), finite."""

    name: str
    default: N
    kind: Callable[[str], N]
    minimum: N
    above: bool = False
    meaning: str = ""
    read_by: str = ""

    def accepts(self) -> str:
        kind = "an integer" if self.kind is int else "a number"
        return f"{kind} {'>' if self.above else '>='} {self.minimum}"

    def read(self, environ: Mapping[str, str] | None = None) -> N:
        raw = (os.environ if environ is None else environ).get(self.name, "").strip()
        if not raw:
            return self.default
        try:
            value = self.kind(raw)
        except ValueError:
            value = None
        if (
            value is None
            or not math.isfinite(value)
            or value < self.minimum
            or (self.above and value == self.minimum)
        ):
            raise EnvValueError(f"{self.name}={raw!r}: expected {self.accepts()}")
        return value


PLAN_DEADLINE_S = EnvNumber(
    "ICEFALL_PLAN_DEADLINE_S",
    120.0,
    float,
    0.0,
    above=True,
    meaning="how long a commit task waits for the broker to flush its plan's offsets (seconds)",
    read_by="the commit task",
)
# The size up to which a round runs in the driver's Python process, without Spark tasks (why 1
# GiB: ``spark_jobs.commit_round``); 0: every round with records runs on Spark.
ROUND_IN_DRIVER_MAX_BYTES = EnvNumber(
    "ICEFALL_ROUND_IN_DRIVER_MAX_BYTES",
    1 << 30,
    int,
    0,
    meaning="a round reading at most this many segment bytes runs without Spark (0: always Spark)",
    read_by="the commit task, the commit round and DLQ reprocess jobs",
)
TASK_NUMBERS: tuple[EnvNumber[int] | EnvNumber[float], ...] = (
    PLAN_DEADLINE_S,
    ROUND_IN_DRIVER_MAX_BYTES,
)
