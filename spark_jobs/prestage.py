"""A round's rows read, decoded and written while its interval is still open: the warm
driver's pre-stage.

A commit round starts once its interval has ended and the broker has flushed it; then it
reads the interval's records from the segment objects, decodes them and encodes Parquet
(``rounds.tasks``), and commits. For 10,000 records a second on a 20 s interval that read and
write is ~0.5-0.7 s of the ~0.9 s between the interval's end and the snapshot (on two shared
cores): most of the round's contribution to the table's freshness. Yet all but the last second
of the interval's records were in segment objects long before its end (the broker flushes
every ``segment.flush.ms``, 1 s by default).

So the commit task, which Airflow starts a few seconds before the interval's end
(``timetable``), first asks the warm driver to pre-stage the round (``POST /v1/prestage``,
the round's arguments with ``--until-append-time``). A thread here then writes, every
``POLL_S``, the records the broker has flushed since the table's last checkpoint into the
round's data files, kept open (``tasks.OpenTask``). Once the interval has ended it asks every
``FINAL_POLL_S`` until the last of them are written (for ``FINAL_POLL_FOR_S`` at most): the
task has the broker flush them at once, and the round, which comes right after, waits for the
step in progress rather than doing that part itself after a poll's pause.

When the round itself arrives (after its plan) it takes them: it checks that they were written
for the task spec it built (the same table metadata, schemas and types) and that each
partition's staged offsets are a start of its own window (the same first offset, an end not
past the round's), then adds the rest of its ranges to the same files, closes them and commits
as always. Anything else (the table changed, another round committed, a partition moved on) and
the round drops the staged files and reads everything itself. Either way the round commits
exactly its plan's offsets in one snapshot: the pre-stage only moves work earlier, and files no
round took are deleted (a driver killed with them open leaves them unreferenced, as a killed
round does).

What is staged is bounded by the round's own plan: before the broker's clock reaches the
interval's end, only records already flushed (so appended before it); after it, only up to the
end offsets for that time once flushed. A pre-stage no round takes within ``KEEP_S`` of its
interval's end is dropped; one for a round that would run on Spark (over
``--in-driver-max-bytes``), or for a table whose rows cannot stream (partitioned, not Parquet,
upsert, JSON, format v3: ``CommitRound.prestage_start``) stops, and the round does it all.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from spark_jobs.rounds import plan as round_plan
from spark_jobs.rounds.plan import PartitionWindow
from spark_jobs.rounds.tasks import OpenTask, TaskOutput, TaskSpec

log = logging.getLogger("icefall.prestage")
# how often the broker is asked what it flushed (it flushes every segment.flush.ms, 1 s)
POLL_S = 0.5
# how often once the interval has ended, until its last records are written: the commit task
# has the broker flush them at once (planning.plan_round), and the round waits for this step;
# for FINAL_POLL_FOR_S at most (past that something else holds the round up: POLL_S again)
FINAL_POLL_S = 0.05
FINAL_POLL_FOR_S = 5.0
# a pre-stage no round took this long after its interval's end is dropped
KEEP_S = 120.0
# this close to the interval's end, a step also asks for the end's offsets (it caps at them)
END_MARGIN_MS = 2000
# the longest ahead of its interval's end a pre-stage may be asked for (the timetable creates
# runs 4 s early; planning.MAX_EARLY_S refuses runs more than a minute ahead)
MAX_AHEAD_S = 60.0


def _comparable(spec: TaskSpec) -> TaskSpec:
    """The spec without its FileIO settings: a catalog may vend new credentials at each load."""
    return dataclasses.replace(spec, io_properties=())


@dataclass
class StagedRows:
    """The rows a pre-stage wrote for a topic's next round: per partition the offsets from
    ``starts`` up to ``ends`` (exclusive), in ``task``'s files, still open."""

    task: OpenTask
    starts: dict[int, int]
    ends: dict[int, int]

    @property
    def records(self) -> int:
        return sum(self.ends[p] - self.starts[p] for p in self.ends)

    @property
    def bytes(self) -> int:
        return self.task.bytes_read

    def mismatch(self, spec: TaskSpec, windows: list[PartitionWindow]) -> str | None:
        """Why the round of ``spec`` and ``windows`` cannot use these rows, None if it can: it
        must be the spec they were written with (its FileIO settings aside) and, per partition,
        its window must start where they start and end no earlier than they end."""
        if _comparable(spec) != _comparable(self.task.spec):
            return "the table, its schemas or the topic's settings changed since"
        by_partition = {w.partition: w for w in windows}
        for partition, end in sorted(self.ends.items()):
            window = by_partition.get(partition)
            if window is None:
                return f"partition {partition} is not in the round"
            if window.start != self.starts[partition]:
                return (
                    f"partition {partition}: the round starts at offset {window.start}, "
                    f"the rows written ahead at {self.starts[partition]}"
                )
            if end > window.end:
                return (
                    f"partition {partition}: rows were written ahead up to offset {end}, "
                    f"past the round's end {window.end}"
                )
        return None

    def rest(self, windows: list[PartitionWindow]) -> list[PartitionWindow]:
        """What the round has to read itself: each window from where these rows end."""
        return [
            dataclasses.replace(w, start=max(w.start, self.ends.get(w.partition, w.start)))
            for w in windows
        ]

    def finish(self, ranges: list[Any]) -> TaskOutput:
        """The round's output: ``ranges`` (the rest) added, the files closed."""
        self.task.add(ranges)
        return self.task.finish()

    def drop(self) -> None:
        """Delete the files (nothing if ``finish`` handed them out already)."""
        self.task.abandon()


# enters the credentials of a request for a step, or yields False if others are in use now
CredentialsGate = Callable[[dict[str, str]], AbstractContextManager[bool]]


class _Staging:
    """One topic's pre-stage: a thread writing its next round's rows until taken or given up."""

    def __init__(
        self,
        args: argparse.Namespace,
        env: dict[str, str],
        gate: CredentialsGate,
        topic_lock: threading.Lock,
        forget: Callable[[_Staging], None],
    ) -> None:
        self.args = args
        self.env = env
        self.until_ms: int = args.until_append_time
        self._gate = gate
        self._topic_lock = topic_lock
        self._forget = forget
        self._stop = threading.Event()
        self._complete = False  # the round's records are all written
        self.staged: StagedRows | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"icefall-prestage-{args.topic}", daemon=True
        )

    def take(self) -> StagedRows | None:
        """Stop the thread (after its step in progress) and hand over what it wrote."""
        self._stop.set()
        self.thread.join()
        staged, self.staged = self.staged, None
        return staged

    def _run(self) -> None:
        try:
            self._stage()
        except Exception as exc:  # the round reads it all itself
            log.warning("pre-stage of %s stopped: %s", self.args.topic, exc, exc_info=True)
            self._give_up()
        finally:
            self._forget(self)

    def _give_up(self) -> None:
        if self.staged is not None:
            self.staged.drop()
            self.staged = None

    def _steps(self) -> Iterator[None]:
        """A step now, then one every ``POLL_S`` (``FINAL_POLL_S`` from the interval's end until
        its records are all written, for ``FINAL_POLL_FOR_S`` at most) until taken or ``KEEP_S``
        after the end."""
        while not self._stop.is_set():
            if time.time() * 1000 > self.until_ms + KEEP_S * 1000:
                log.info("pre-stage of %s: no round took it; dropped", self.args.topic)
                self._give_up()
                return
            yield
            since_end_s = time.time() - self.until_ms / 1000
            final = 0 <= since_end_s < FINAL_POLL_FOR_S and not self._complete
            self._stop.wait(FINAL_POLL_S if final else POLL_S)

    def _stage(self) -> None:
        from spark_jobs.commit_round import CommitRound

        topic = self.args.topic
        # a round of the topic still running commits first: the next one starts from there
        while not self._topic_lock.acquire(timeout=POLL_S):
            if self._stop.is_set():
                return
        self._topic_lock.release()
        round_: CommitRound | None = None
        found: Any = None
        spec: TaskSpec | None = None
        for _ in self._steps():
            if self._complete:
                continue
            with self._gate(self.env) as entered:
                if not entered:  # rounds with other credentials run now: later
                    continue
                if round_ is None:
                    round_ = CommitRound(self.args)
                    start = round_.prestage_start()
                    if isinstance(start, str):
                        log.info("pre-stage of %s: not written ahead: %s", topic, start)
                        return
                    spec, found = start
                assert spec is not None
                self._complete = self._step(round_, spec, found)

    def _step(self, round_: Any, spec: TaskSpec, found: Any) -> bool:
        """Write what the broker flushed since the last step (within the round's bound); True
        once the round's records are all written."""
        topic = self.args.topic
        broker_plan = round_.admin.plan(topic, None)  # up to what is flushed (and stable)
        now_ms = broker_plan.broker_time_ms
        final = now_ms is None or now_ms >= self.until_ms
        if final:  # the interval has ended: only its own records, once flushed
            broker_plan = round_.admin.plan(topic, self.until_ms)
            if not broker_plan.flushed:
                return False
        windows = round_plan.windows(broker_plan, found, round_.topic.topic_id)
        if not final and now_ms is not None and now_ms >= self.until_ms - END_MARGIN_MS:
            # the broker's clock may pass the end while it answers: not past the end's offsets
            at_end = round_.admin.plan(topic, self.until_ms).partitions
            ends = {p.partition: p.end_offset for p in at_end}
            windows = [
                dataclasses.replace(w, end=max(w.start, min(w.end, ends.get(w.partition, w.end))))
                for w in windows
            ]
        if self.staged is None:
            starts = {w.partition: w.start for w in windows}
            self.staged = StagedRows(OpenTask(spec), starts, dict(starts))
        staged = self.staged
        new = [
            dataclasses.replace(w, start=staged.ends[w.partition])
            for w in windows
            if w.partition in staged.ends and w.end > staged.ends[w.partition]
        ]
        if new:
            ranges = round_plan.fetch_ranges(round_.admin, topic, new)
            if staged.bytes + sum(r.byte_end - r.byte_start for r in ranges) > (
                self.args.in_driver_max_bytes
            ):
                log.info("pre-stage of %s: the round will run on Spark; dropped", topic)
                self._give_up()
                self._stop.set()
                return True
            staged.task.add(ranges)
            staged.ends.update({w.partition: w.end for w in new})
        return final


class Prestager:
    """The warm driver's pre-stages: at most one per topic, taken by the topic's next round."""

    def __init__(self, gate: CredentialsGate, topic_lock: Callable[[str], threading.Lock]) -> None:
        self._gate = gate
        self._topic_lock = topic_lock
        self._guard = threading.Lock()
        self._by_topic: dict[str, _Staging] = {}

    def start(self, args: argparse.Namespace, env: dict[str, str]) -> str:
        """Start writing ahead for the round of ``args`` (``--until-append-time`` needed);
        a pre-stage of the topic for another interval is dropped. What it did, in words."""
        if args.until_append_time is None:
            raise ValueError("a pre-stage needs --until-append-time (the interval's end)")
        ahead_s = args.until_append_time / 1000 - time.time()
        if ahead_s > MAX_AHEAD_S:
            raise ValueError(
                f"the interval ends in {ahead_s:.0f} s: a pre-stage is asked for at most "
                f"{MAX_AHEAD_S:.0f} s ahead"
            )
        with self._guard:
            running = self._by_topic.get(args.topic)
            if running is not None and running.until_ms == args.until_append_time:
                return "already writing ahead"
            staging = _Staging(args, env, self._gate, self._topic_lock(args.topic), self._forget)
            self._by_topic[args.topic] = staging
            staging.thread.start()  # before anyone can find it: ``take`` joins a started thread
        if running is not None:
            dropped = running.take()
            if dropped is not None:
                dropped.drop()
        return "writing ahead"

    def take(self, topic: str) -> StagedRows | None:
        """The rows written ahead for the topic's round, if any (the pre-stage stops)."""
        with self._guard:
            staging = self._by_topic.pop(topic, None)
        return staging.take() if staging is not None else None

    def status(self) -> dict[str, int]:
        """Per topic being written ahead, the records written so far (the driver's health)."""
        with self._guard:
            stagings = list(self._by_topic.items())
        return {
            topic: staged.records
            for topic, staging in stagings
            if (staged := staging.staged) is not None
        }

    def _forget(self, staging: _Staging) -> None:
        with self._guard:
            if self._by_topic.get(staging.args.topic) is staging:
                del self._by_topic[staging.args.topic]
