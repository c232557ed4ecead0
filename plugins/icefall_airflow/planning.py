"""The plan step of a commit round: which offsets this run commits.

A run for the data interval [a, b) commits, per partition, the offsets whose
broker append time is before b. That bound does not depend on when the run
executes, so re-running a run, or backfilling an interval, asks for the same
offsets again and the commit round finds nothing new. A manual run without a
logical date (or with ``until=now``) commits what was appended before the time the
caller gives (the commit DAG gives the run's ``run_after``, so every try of the task plans
the same offsets);
``until=offsets`` commits up to an explicit offset map.

Before the commit may read them, those offsets must be in segment objects: the
plan waits, with a deadline, until the broker reports them flushed (asking it
to flush now rather than waiting for its timer).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from broker import contracts
from icefall_airflow.broker_client import BrokerClient

log = logging.getLogger(__name__)

UNTIL_INTERVAL = "interval"
UNTIL_NOW = "now"
UNTIL_OFFSETS = "offsets"
UNTIL_CHOICES = (UNTIL_INTERVAL, UNTIL_NOW, UNTIL_OFFSETS)
# The longest a plan waits for its interval's end: the timetable creates runs at most 4 s
# early (timetable.DEFAULT_LEAD); a run whose interval ends later than this is refused.
MAX_EARLY_S = 60.0


class PlanError(RuntimeError):
    """The round cannot be planned (bad parameters, or the broker did not flush in time)."""


@dataclass(frozen=True)
class RoundRequest:
    """What a run asked for, before the broker is asked anything."""

    topic: str
    round_id: str
    until_append_ms: int | None = None  # commit offsets appended before this time
    until_offsets: dict[int, int] | None = None  # or up to these offsets (exclusive)
    max_records: int | None = None


@dataclass(frozen=True)
class RoundPlan:
    """The offsets the commit step is told to commit up to, and where the log stood."""

    request: RoundRequest
    end_offsets: dict[int, int]
    high_watermarks: dict[int, int] = field(default_factory=dict)
    log_start_offsets: dict[int, int] = field(default_factory=dict)
    planned_at_ms: int = 0

    def to_contract(self) -> contracts.RoundPlan:
        return contracts.RoundPlan(
            topic=self.request.topic,
            round_id=self.request.round_id,
            until_append_ms=self.request.until_append_ms,
            max_records=self.request.max_records,
            end_offsets=self.end_offsets,
            high_watermarks=self.high_watermarks,
            log_start_offsets=self.log_start_offsets,
            planned_at_ms=self.planned_at_ms,
        )

    def to_xcom(self) -> dict[str, Any]:
        """The plan as JSON (``broker.contracts.RoundPlan``): the commit task's XCom ``plan``."""
        return self.to_contract().to_json()


def parse_offsets(value: object) -> dict[int, int]:
    """An offset map from a Param: a dict or its JSON text, partition -> offset (exclusive end)."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if not isinstance(value, Mapping):
        raise PlanError(
            f"until_offsets must be a JSON object of partition -> offset, got {value!r}"
        )
    try:
        offsets = {int(p): int(o) for p, o in value.items()}
    except (TypeError, ValueError) as exc:
        raise PlanError(
            f"until_offsets must map partition numbers to offsets, got {value!r}"
        ) from exc
    if not offsets or any(o < 0 or p < 0 for p, o in offsets.items()):
        raise PlanError(
            f"until_offsets needs at least one partition and no negative numbers, got {value!r}"
        )
    return offsets


def round_request(
    topic: str,
    params: Mapping[str, Any],
    data_interval_end: datetime | None,
    run_id: str,
    now_ms: int,
) -> RoundRequest:
    """Turn a run's params and data interval into what the round commits.

    Scheduled and backfill runs (``until=interval``) are bounded by the interval
    end and get a round id derived from it, so every re-run of the interval is
    recognisably the same round.
    """
    until = str(params.get("until") or UNTIL_INTERVAL)
    if until not in UNTIL_CHOICES:
        raise PlanError(f"param until must be one of {', '.join(UNTIL_CHOICES)}, got {until!r}")
    max_records = params.get("max_records")
    max_records = int(max_records) if max_records not in (None, "", 0) else None
    if until == UNTIL_OFFSETS:
        offsets = parse_offsets(params.get("until_offsets"))
        return RoundRequest(
            topic, f"{topic}@{run_id}", until_offsets=offsets, max_records=max_records
        )
    if until == UNTIL_INTERVAL and data_interval_end is not None:
        until_ms = int(data_interval_end.timestamp() * 1000)
        return RoundRequest(
            topic, f"{topic}@{until_ms}", until_append_ms=until_ms, max_records=max_records
        )
    return RoundRequest(topic, f"{topic}@{run_id}", until_append_ms=now_ms, max_records=max_records)


def _by_partition(rows: list[Any], key: str) -> dict[int, int]:
    return {row.partition: int(getattr(row, key)) for row in rows}


def plan_round(
    client: BrokerClient,
    request: RoundRequest,
    deadline_s: float = 120.0,
    poll_s: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
) -> RoundPlan:
    """Ask the broker for the round's end offsets; wait until they are all in segment objects.

    A run created ahead of its interval's end (``timetable.LeadingIntervalTimetable``)
    first sleeps until that end; the deadline counts from then. Until the broker's own
    clock has passed it too, the broker reports nothing flushed and is asked again."""
    if (
        request.until_append_ms is not None
        and (ahead_s := request.until_append_ms / 1000 - wall()) > 0
    ):
        if ahead_s > MAX_EARLY_S:  # not a run of the timetable: a manual one, dated ahead
            raise PlanError(
                f"this run commits the offsets appended before {request.until_append_ms} ms, "
                f"{ahead_s:.0f} s from now: it cannot be planned before then; trigger it "
                "without a logical date (it commits up to now) or once that time has passed"
            )
        log.info("the interval ends in %.2f s: waiting for its end", ahead_s)
        sleep(ahead_s)
    deadline = clock() + deadline_s
    hurried = False
    while True:
        plan, waiting_for, early = _try_plan(client, request)
        if plan is not None:
            return plan
        if clock() > deadline:
            raise PlanError(
                f"the broker's clock did not reach the end of the interval of {request.topic} "
                f"({request.until_append_ms} ms) within {deadline_s:g} s: is it behind "
                "Airflow's?"
                if early
                else f"the broker did not flush {request.topic} partitions {waiting_for} within "
                f"{deadline_s:g} s; is its object store reachable? (see its /healthz)"
            )
        # the flush timer would get there too; a round should not wait for it (a flush
        # before the broker's clock reached the interval's end might miss its last batches).
        # The flush answers once it is done: ask again at once.
        if not hurried and not early:
            client.flush()
            hurried = True
            continue
        sleep(poll_s)


def _try_plan(
    client: BrokerClient, request: RoundRequest
) -> tuple[RoundPlan | None, list[int], bool]:
    """The plan, or None with the partitions not flushed yet and whether the broker's
    clock had not reached ``until_append_ms`` yet."""
    now_ms = int(time.time() * 1000)
    if request.until_offsets is None:
        plan = contracts.TopicPlan.model_validate(
            client.plan(request.topic, request.until_append_ms)
        )
        rows: list[Any] = plan.partitions
        waiting = plan.not_flushed
        if waiting or plan.early:
            return None, waiting, plan.early
        return (
            RoundPlan(
                request,
                _by_partition(rows, "end_offset"),
                _by_partition(rows, "high_watermark"),
                _by_partition(rows, "log_start_offset"),
                now_ms,
            ),
            [],
            False,
        )
    offsets = contracts.TopicOffsets.model_validate(client.offsets(request.topic))
    rows = offsets.partitions
    known = {r.partition: r for r in offsets.partitions}
    unknown = sorted(set(request.until_offsets) - set(known))
    if unknown:
        raise PlanError(f"{request.topic} has no partitions {unknown} (it has {len(known)})")
    beyond = {p: o for p, o in request.until_offsets.items() if o > known[p].high_watermark}
    if beyond:
        raise PlanError(
            f"until_offsets {beyond} are beyond the end of {request.topic}: "
            f"{ {p: known[p].high_watermark for p in beyond} }"
        )
    waiting = [p for p, o in request.until_offsets.items() if known[p].flushed_offset < o]
    if waiting:
        return None, waiting, False
    return (
        RoundPlan(
            request,
            dict(request.until_offsets),
            _by_partition(rows, "high_watermark"),
            _by_partition(rows, "log_start_offset"),
            now_ms,
        ),
        [],
        False,
    )
