"""``kill -9`` of one broker of a 3-broker cluster under acks=all load (issue 16 item 2), shared by
tests/reliability/test_cluster_kill.py (one trial) and ``bench/reliability.py --only cluster``.

One trial: a fresh topic spread over the three brokers; the three producers of
``crash_load`` (no retries, retries, idempotent) and a consumer group run; at a random moment
(seeded ``random.Random``) a random broker gets SIGKILL; its leases lapse, the two others take
its partitions; once a record produced after the kill was acknowledged on every moved
partition the broker is started again (same node id, same home), takes its share back (a
clean hand-over under load), the producers go on, and everything is read back from offset 0
and checked with ``crash_load.analyse``.

Measured per trial:

- ``failover_s``: per moved partition, kill to the first acknowledgement of a record
  *produced after the kill* (by any producer). The dead broker cannot acknowledge it, so it is
  the new leader's; a record produced before the kill and retried may be acknowledged a little
  earlier, so this is an upper bound by about one flush.
- ``metadata_s``: kill to every surviving broker's Metadata naming a live leader for every
  moved partition.
- ``restart_s``: the kill to the killed broker serving again; its start begins once the
  failover above was seen (it can register again only once its previous incarnation's
  heartbeat is older than the lease).
- ``group_s``: kill to the group having consumed, on every partition, a record produced after
  the kill (its coordinator may have been the killed broker: a rebalance at a new one).
  ``group_missing``: acknowledged records the group never delivered (at least once: 0 expected).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from tests.broker.clients import (
    GroupReader,
    TimedProducer,
    create_topic,
    read_partitions,
    stop_all,
)
from tests.postgres import PostgresServer
from tests.reliability.crash_load import PRODUCER_CONFS, ProducerOutcome, analyse
from tests.support import ClusterBrokerProcess, wait_for


@dataclass
class ClusterTrial:
    """One kill -9 of one broker of the cluster and what followed."""

    seed: int
    victim: int
    partitions: int
    topic: str = ""
    moved: list[int] = field(default_factory=list)
    kill_after_s: float = 0.0  # load running before the kill, after the first acks
    failover_s: dict[int, float] = field(default_factory=dict)
    metadata_s: float = 0.0
    restart_s: float = 0.0
    group_s: float | None = None
    group_missing: int = 0
    seconds: float = 0.0
    producers: dict[str, ProducerOutcome] = field(default_factory=dict)
    # the brokers' leadership moves of the topic, in time order, for a failure message
    events: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# log lines of a partition changing hands (broker/membership.py, broker/storage/logstore.py)
_EVENT_WORDS = ("unloaded:", "lost the leases", "took ", "released ")


def leadership_events(
    brokers: list[ClusterBrokerProcess], topic: str, limit: int = 80
) -> list[str]:
    """Each broker's log lines about ``topic`` changing hands, merged in time order (the lines
    start with their timestamp), and per broker how many of its produces it refused."""
    events: list[str] = []
    counts: list[str] = []
    for b in brokers:
        refused = 0
        for line in b.log_text().splitlines():
            if topic not in line:
                continue
            if "refused" in line:
                refused += 1
            elif any(word in line for word in _EVENT_WORDS):
                text = line[24:].split(": ", 1)[-1]
                events.append(f"{line[11:23]} node {b.node_id}: {text[:160]}")
        counts.append(f"node {b.node_id}: {refused} produces refused")
    return sorted(events)[:limit] + counts


@contextlib.contextmanager
def three_brokers(work: Path, **broker_args: Any) -> Iterator[dict[int, ClusterBrokerProcess]]:
    """Brokers 1, 2 and 3 of a cluster, running: a Postgres of its own, one object-store
    directory, their homes under ``work`` (``broker_args``: ``lease_ms``, ``heartbeat_ms``).
    After: every broker stopped, then Postgres, even when a stop fails (the first failure is
    raised then)."""
    postgres = PostgresServer().start()
    brokers: dict[int, ClusterBrokerProcess] = {}
    try:
        uri = postgres.create_database("kills")
        objects = work / "objects"
        objects.mkdir(parents=True)
        for node_id in (1, 2, 3):
            brokers[node_id] = ClusterBrokerProcess(
                work / f"node{node_id}", node_id, uri, str(objects), **broker_args
            )
            brokers[node_id].start()
        yield brokers
    finally:
        failed: BaseException | None = None
        for b in brokers.values():
            try:
                b.stop()
            except Exception as exc:  # noqa: BLE001 - the others are stopped still; raised below
                print(f"stopping broker {b.node_id}: {exc!r}", file=sys.stderr)
                failed = failed or exc
        postgres.stop()
        if failed is not None:
            raise failed


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> leader (-1 while none) in one broker's Metadata; {} on an error."""
    md = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(
        topic, timeout=10
    )
    found = md.topics.get(topic)
    if found is None or found.error is not None:
        return {}
    return {p: found.partitions[p].leader for p in found.partitions}


def settled(
    brokers: list[ClusterBrokerProcess], topic: str, partitions: int
) -> dict[int, int] | None:
    """partition -> leader when every live broker of ``brokers`` says the same, every partition
    is led by one of them and each of them leads at least one."""
    live = {b.node_id for b in brokers}
    seen = [leaders(b.bootstrap, topic) for b in brokers]
    first = seen[0]
    if len(first) != partitions or any(s != first for s in seen):
        return None
    if set(first.values()) != live and len(live) <= partitions:
        return None
    return first


def _start_again(broker: ClusterBrokerProcess) -> bool:
    """Start the killed broker; False while its old incarnation still holds its node id."""
    try:
        broker.start()
    except RuntimeError as exc:
        if "is in use" in str(exc):
            return False
        raise
    return True


def _start_load(
    everyone: list[ClusterBrokerProcess],
    topic: str,
    partitions: int,
    names: tuple[str, ...],
    rate: float,
    timeout_s: float,
) -> list[TimedProducer]:
    """A new topic spread over ``everyone``, and ``crash_load``'s producers ``names`` started on
    it at ``rate`` records/s each (acks=all)."""
    bootstrap = ",".join(b.bootstrap for b in everyone)
    create_topic(everyone[0].bootstrap, topic, partitions)
    wait_for(lambda: settled(everyone, topic, partitions), timeout_s, 0.2, "a spread topic")
    producers = [
        TimedProducer(
            bootstrap,
            topic,
            name,
            {**PRODUCER_CONFS[name], "log_level": 0, "message.timeout.ms": 60000},
            rate=rate,
            max_in_flight=5000,
        )
        for name in names
    ]
    for producer in producers:
        producer.start()
    return producers


def run_cluster_trial(
    brokers: dict[int, ClusterBrokerProcess],
    *,
    seed: int,
    partitions: int = 6,
    producer_names: tuple[str, ...] = ("noretry", "retry", "idem"),
    rate: float = 3000.0,
    max_run_s: float = 2.0,
    timeout_s: float = 90.0,
) -> ClusterTrial:
    """One trial on the running cluster ``brokers`` (node id -> process, all running)."""
    rng = random.Random(seed)
    started = time.monotonic()
    nodes = sorted(brokers)
    victim_id = rng.choice(nodes)
    topic = f"kills-{uuid.uuid4().hex[:8]}"
    trial = ClusterTrial(seed, victim_id, partitions, topic)
    everyone = list(brokers.values())
    bootstrap = ",".join(b.bootstrap for b in everyone)
    producers = _start_load(everyone, topic, partitions, producer_names, rate, timeout_s)
    group = GroupReader(bootstrap, topic, f"kills-{uuid.uuid4().hex[:8]}", {"log_level": 0})
    try:
        wait_for(lambda: all(p.acked_count >= 200 for p in producers), timeout_s, 0.1, "first acks")
        trial.kill_after_s = round(rng.uniform(0.1, max_run_s), 3)
        time.sleep(trial.kill_after_s)  # the random moment; the condition is the kill itself
        survivors = [b for b in everyone if b.node_id != victim_id]
        before = leaders(survivors[0].bootstrap, topic)
        trial.moved = sorted(p for p, n in before.items() if n == victim_id)
        brokers[victim_id].kill9()
        killed = time.monotonic()
        produced_at_kill = {p.name: p.produced for p in producers}
        for p in producers:
            p.mark(killed)

        def is_new(value: str) -> bool:
            name, _, n = value.rpartition("-")
            return name in produced_at_kill and int(n) >= produced_at_kill[name]

        group.watch(is_new, killed)

        def moved_led() -> bool:
            return all(
                all(
                    leaders(b.bootstrap, topic).get(p, -1) in {s.node_id for s in survivors}
                    for p in trial.moved
                )
                for b in survivors
            )

        wait_for(moved_led, timeout_s, 0.1, "new leaders of the moved partitions")
        trial.metadata_s = round(time.monotonic() - killed, 2)

        def moved_acked() -> bool:
            return all(any(p in pr.first_after for pr in producers) for p in trial.moved)

        wait_for(moved_acked, timeout_s, 0.1, "a produce acknowledged on every moved partition")
        trial.failover_s = {
            p: round(min(pr.first_after[p] for pr in producers if p in pr.first_after), 2)
            for p in trial.moved
        }
        wait_for(lambda: _start_again(brokers[victim_id]), timeout_s, 0.2, "the restart")
        trial.restart_s = round(time.monotonic() - killed, 2)
        wait_for(
            lambda: settled(everyone, topic, partitions), timeout_s, 0.2, "the victim leading again"
        )
        counts = [p.acked_count for p in producers]
        wait_for(
            lambda: all(p.acked_count >= c + 200 for p, c in zip(producers, counts, strict=True)),
            timeout_s,
            0.1,
            "acks after the restart",
        )
        try:
            wait_for(lambda: len(group.first_new) == partitions, timeout_s, 0.2, "group progress")
            trial.group_s = round(max(group.first_new.values()), 2)
        except TimeoutError:
            trial.group_s = None  # reported, and group_missing below says what it missed
    finally:
        try:
            stop_all(producers)
        finally:
            acked = {v for p in producers for v in p.acked}
            with contextlib.suppress(TimeoutError):  # group_missing says what it missed
                wait_for(lambda: acked <= group.values, 60, 0.2, "the group got every ack")
            group.stop()
    trial.group_missing = len(acked - group.values)
    log = read_partitions(bootstrap, topic, partitions, timeout=120)
    trial.producers = analyse(log, producers)
    trial.events = leadership_events(everyone, topic)
    trial.seconds = round(time.monotonic() - started, 1)
    return trial


@dataclass
class PauseTrial:
    """SIGSTOP of random brokers of the cluster, each for longer or shorter than a lease,
    under acks=all load; what the log holds for each producer afterwards."""

    seed: int
    topic: str
    pauses: list[tuple[int, float]] = field(default_factory=list)  # (node id, seconds stopped)
    seconds: float = 0.0
    producers: dict[str, ProducerOutcome] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_pause_trial(
    brokers: dict[int, ClusterBrokerProcess],
    *,
    seed: int,
    pauses: int = 4,
    partitions: int = 6,
    rate: float = 3000.0,
    longest_s: float = 6.0,
    timeout_s: float = 90.0,
) -> PauseTrial:
    """``pauses`` times: a random broker of the running cluster ``brokers`` is stopped
    (SIGSTOP) for a random 0.5..``longest_s`` seconds (the tests' lease is 3 s: a pause past it
    costs the broker its leases, and its heartbeats stop showing it live) and continued, while
    the three producers of ``crash_load`` run; then everything is read back and analysed.
    A paused broker is what a starved machine or a long GC-like stall looks like to the
    others: the case the lease fencing is for."""
    rng = random.Random(seed)
    started = time.monotonic()
    topic = f"pauses-{uuid.uuid4().hex[:8]}"
    trial = PauseTrial(seed, topic)
    everyone = list(brokers.values())
    bootstrap = ",".join(b.bootstrap for b in everyone)
    producers = _start_load(
        everyone, topic, partitions, ("noretry", "retry", "idem"), rate, timeout_s
    )
    try:
        for _ in range(pauses):
            wait_for(_acks_beyond(producers, 100), timeout_s, 0.1, "acks before a pause")
            victim = rng.choice(everyone)
            stopped_s = round(rng.uniform(0.5, longest_s), 2)
            assert victim.proc is not None
            os.kill(victim.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(stopped_s)  # the pause itself is what is measured against
            finally:
                os.kill(victim.proc.pid, signal.SIGCONT)
            trial.pauses.append((victim.node_id, stopped_s))
        wait_for(_acks_beyond(producers, 200), timeout_s, 0.1, "acks after the last pause")
    finally:
        stop_all(producers)
    log = read_partitions(bootstrap, topic, partitions, timeout=120)
    trial.producers = analyse(log, producers)
    trial.events = leadership_events(everyone, topic)
    trial.seconds = round(time.monotonic() - started, 1)
    return trial


def _acks_beyond(producers: list[TimedProducer], more: int) -> Callable[[], bool]:
    """A condition: every producer has ``more`` acknowledgements beyond what it has now."""
    counts = [p.acked_count for p in producers]
    return lambda: all(p.acked_count >= n + more for p, n in zip(producers, counts, strict=True))
