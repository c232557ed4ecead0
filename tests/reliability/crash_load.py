"""Broker crash under load, shared by tests/reliability and bench/reliability.py.

Producers send acks=all at full speed from background threads while the broker
is killed with SIGKILL at random moments (a seeded ``random.Random``, so a
failing run can be replayed) and restarted on the same home and ports.
Afterwards every partition is read back from offset 0 with a real consumer and
compared with what the delivery callbacks reported as acknowledged.

Three producers, because Kafka promises different things to each:

- ``noretry``: idempotence off, ``retries=0``. Never resends, so it can lose
  unacknowledged records but never duplicates anything.
- ``retry``: idempotence off, librdkafka's default retries. A retry after a
  lost ack writes the record twice and can reorder (Kafka's at-least-once): the
  duplicates and order violations are reported, not asserted.
- ``idem``: ``enable.idempotence=true``. No duplicates, no reordering.

For every producer, the number of acknowledged records that are missing must
be 0 (a missing record is one not at its acknowledged partition and offset).
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from tests.broker.clients import ContinuousProducer, Log, create_topic, read_partitions, stop_all
from tests.support import BrokerProcess, wait_for

PRODUCER_CONFS: dict[str, dict[str, Any]] = {
    "noretry": {"enable.idempotence": False, "retries": 0},
    "retry": {"enable.idempotence": False},
    "idem": {"enable.idempotence": True},
}


DUPLICATE_EXAMPLES = 5


@dataclass
class ProducerOutcome:
    """What one producer was promised and what the log holds for it."""

    name: str
    produced: int = 0
    acked: int = 0
    failed: int = 0  # delivery reports with an error: the client knows these may be lost
    stored: int = 0  # distinct values of this producer in the log
    acked_lost: int = 0  # acknowledged, found nowhere in the log
    acked_misplaced: int = (
        0  # acknowledged, in the log, but not at the acknowledged partition/offset
    )
    duplicates: int = 0  # extra copies of values (a value stored n times counts n - 1)
    order_violations: int = (
        0  # per partition: a value stored after a later value of the same producer
    )
    unknown: int = 0  # values in the log this producer never sent
    # a few duplicated values -> every (partition, offset) holding them, for a failure message:
    # where the copies sit (how far apart, which chunks) is what tells a re-send from a re-append
    duplicate_examples: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


@dataclass
class CrashRun:
    """One run: a topic, some producers, ``kills`` SIGKILLs at random moments."""

    backend: str
    seed: int
    kills: int
    partitions: int
    seconds: float = 0.0
    outage_seconds: float = 0.0  # object store unreachable, summed
    restart_seconds: list[float] = field(default_factory=list)  # kill -> broker ready again
    startup_kills: int = 0  # kills that landed while the broker was starting (replaying its WAL)
    producers: dict[str, ProducerOutcome] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def analyse(log: Log, producers: Sequence[ContinuousProducer]) -> dict[str, ProducerOutcome]:
    """Compare the log read back with each producer's delivery reports."""
    by_name = {p.name: p for p in producers}
    outcomes = {
        p.name: ProducerOutcome(p.name, p.produced, p.acked_count, len(p.failed)) for p in producers
    }
    counts: Counter[str] = Counter()
    first_at: dict[str, tuple[int, int]] = {}
    for p, entries in log.items():
        offsets = [o for o, _ in entries]
        assert offsets == list(range(len(offsets))), (
            f"partition {p}: offsets are not contiguous from 0"
        )
        highest: dict[str, int] = {}
        for offset, raw in entries:
            assert raw is not None, f"partition {p}: a null value nobody produced"
            value = raw.decode()
            name, _, n_text = value.rpartition("-")
            counts[value] += 1
            outcome = outcomes.get(name)
            if counts[value] == 1:
                first_at[value] = (p, offset)
            elif outcome is not None and (
                value in outcome.duplicate_examples
                or len(outcome.duplicate_examples) < DUPLICATE_EXAMPLES
            ):
                outcome.duplicate_examples.setdefault(value, [first_at[value]]).append((p, offset))
            if outcome is None or not n_text.isdigit() or int(n_text) >= by_name[name].produced:
                if outcome is not None:
                    outcome.unknown += 1
                continue
            if counts[value] > 1:
                continue  # a duplicate: counted below, not an ordering question
            n = int(n_text)
            if n < highest.get(name, -1):
                outcome.order_violations += 1
            highest[name] = max(highest.get(name, -1), n)
    stored: dict[str, int] = defaultdict(int)
    for value, n in counts.items():
        name = value.rpartition("-")[0]
        if name in outcomes:
            stored[name] += 1
            outcomes[name].duplicates += n - 1
    for name, producer in by_name.items():
        outcome = outcomes[name]
        outcome.stored = stored[name]
        for value, (p, offset) in list(producer.acked.items()):
            entries = log.get(p, [])
            if offset < len(entries) and entries[offset][1] == value.encode():
                continue
            if counts[value]:
                outcome.acked_misplaced += 1
            else:
                outcome.acked_lost += 1
    return outcomes


def _acked_beyond(producers: list[ContinuousProducer], counts: list[int], more: int) -> bool:
    return all(p.acked_count >= c + more for p, c in zip(producers, counts, strict=True))


def run_crashes(
    broker: BrokerProcess,
    *,
    kills: int,
    seed: int,
    backend: str,
    topic: str = "crash-load",
    partitions: int = 3,
    producer_names: tuple[str, ...] = ("noretry", "retry", "idem"),
    rate: float = 1e9,
    max_in_flight: int = 5000,
    max_run_s: float = 1.5,
    max_down_s: float = 0.5,
    outage: tuple[Callable[[], None], Callable[[], None]] | None = None,
) -> CrashRun:
    """Kill ``broker`` ``kills`` times at random moments under load, then read everything back.

    Between kills the producers run for a random 0.1..``max_run_s`` seconds after
    they got acks again; the broker stays down a random 0..``max_down_s`` seconds,
    and half the restarts are killed once more at a random moment while starting.
    ``outage`` = (down, up): the object store becomes unreachable at a random
    kill cycle and comes back two cycles later, so kills hit a broker whose data
    is only in its WAL, and restarts happen while the store is still away.
    """
    rng = random.Random(seed)
    run = CrashRun(backend, seed, kills, partitions)
    started = time.monotonic()
    create_topic(broker.bootstrap, topic, partitions)
    producers = [
        ContinuousProducer(
            broker.bootstrap,
            topic,
            name,
            {**PRODUCER_CONFS[name], "log_level": 0},
            rate=rate,
            max_in_flight=max_in_flight,
        ).start()
        for name in producer_names
    ]
    outage_at = rng.randrange(kills) if outage else -1
    outage_since: float | None = None
    try:
        for cycle in range(kills):
            if cycle == outage_at and outage:
                outage[0]()
                outage_since = time.monotonic()
            counts = [p.acked_count for p in producers]

            def fifty_more_acked(counts: list[int] = counts) -> bool:
                return _acked_beyond(producers, counts, 50)

            wait_for(fifty_more_acked, 60, what=f"acks before kill {cycle + 1}")
            time.sleep(
                rng.uniform(0.1, max_run_s)
            )  # the random moment; the condition is the kill itself
            broker.kill9()
            killed = time.monotonic()
            time.sleep(rng.uniform(0.0, max_down_s))  # down for a random while, producers retrying
            if rng.random() < 0.5:
                # kill it again while it starts: WAL replay and its first flush are the target
                try:
                    broker.start(timeout=rng.uniform(0.2, 2.0))
                except TimeoutError:
                    broker.kill9()
                    run.startup_kills += 1
                else:
                    broker.kill9()  # it was ready before the moment came: a kill right after start
            broker.start()
            run.restart_seconds.append(round(time.monotonic() - killed, 3))
            if outage_since is not None and outage and cycle >= outage_at + 1:
                outage[1]()
                run.outage_seconds += time.monotonic() - outage_since
                outage_since = None
        counts = [p.acked_count for p in producers]
        wait_for(
            lambda: _acked_beyond(producers, counts, 50), 60, what="acks after the last restart"
        )
    finally:
        if outage_since is not None and outage:
            outage[1]()
            run.outage_seconds += time.monotonic() - outage_since
        stop_all(producers)
    log = read_partitions(broker.bootstrap, topic, partitions, timeout=120)
    run.producers = analyse(log, producers)
    run.seconds = round(time.monotonic() - started, 1)
    run.outage_seconds = round(run.outage_seconds, 1)
    return run


class Outcomes(Protocol):
    """A run or trial with per-producer outcomes: a ``CrashRun``, a ``cluster_kills.ClusterTrial``."""

    producers: dict[str, ProducerOutcome]

    def as_dict(self) -> dict[str, Any]: ...


def assert_guarantees(run: Outcomes) -> None:
    """What Kafka promises each producer; ``retry``'s duplicates and reordering are allowed."""
    for name, o in run.producers.items():
        assert o.acked > 0, f"{name}: nothing acknowledged at all"
        assert o.acked_lost == 0, (
            f"{name}: {o.acked_lost} acknowledged records lost ({run.as_dict()})"
        )
        assert o.acked_misplaced == 0, (
            f"{name}: {o.acked_misplaced} acknowledged records not at their offset"
        )
        assert o.unknown == 0, f"{name}: {o.unknown} values that were never produced"
        assert o.acked <= o.stored <= o.produced, f"{name}: {o}"
        if name in ("noretry", "idem"):
            assert o.duplicates == 0, (
                f"{name}: {o.duplicates} duplicates, e.g. {o.duplicate_examples} ({run.as_dict()})"
            )
        if name == "idem":
            assert o.order_violations == 0, f"{name}: {o.order_violations} order violations"
