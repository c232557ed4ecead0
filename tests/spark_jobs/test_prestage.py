"""The warm driver's pre-stage (``spark_jobs/prestage.py``) against a real broker and catalog:
rows written ahead while the interval is open are committed once, with the rest, in the
round's own files; rows the round cannot use (another round committed first, written past
the round's end) are dropped and deleted, and the round reads everything itself. No Spark:
the rounds run in this process (``--without-spark``), as small rounds in the warm driver do."""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.contracts import RoundResult
from broker.http_security.client import REGISTRY_USER_INFO_ENV
from spark_jobs import commit_round
from spark_jobs import prestage as prestage_module
from spark_jobs.prestage import Prestager, StagedRows
from spark_jobs.rounds.plan import PartitionWindow
from spark_jobs.rounds.tasks import OpenTask, TaskSpec
from spark_jobs.warm_driver import CredentialGate
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    new_topic,
    round_args,
    table,
    table_offsets,
)
from tests.support import BrokerProcess, wait_for

IN_DRIVER = ("--without-spark", "--in-driver-max-bytes", str(64 << 20))


def clicks(start: int, count: int) -> list[dict[str, Any]]:
    return [
        {"id": i, "page": f"/p/{i % 5}", "score": i, "at": 1_700_000_000_000}
        for i in range(start, start + count)
    ]


def new_prestager() -> Prestager:
    locks: dict[str, threading.Lock] = {}
    return Prestager(
        CredentialGate().credentials_now, lambda t: locks.setdefault(t, threading.Lock())
    )


def run(broker: BrokerProcess, topic: str, staged: StagedRows | None, *extra: str) -> RoundResult:
    code, result = commit_round.run(
        round_args(broker, topic, None, *IN_DRIVER, *extra), staged=staged
    )
    assert code == 0 and result.status in ("committed", "nothing_new"), result
    return result


def prestage(
    prestager: Prestager, broker: BrokerProcess, topic: str, until_ms: int, *extra: str
) -> None:
    args = commit_round.parse_args(
        round_args(broker, topic, None, *IN_DRIVER, "--until-append-time", str(until_ms), *extra)
    )
    assert prestager.start(args, {}) == "writing ahead"


def written_ahead(prestager: Prestager, topic: str, records: int) -> None:
    wait_for(
        lambda: prestager.status().get(topic) == records,
        timeout=30,
        what=f"{records} records of {topic} written ahead (now {prestager.status()})",
    )


def data_files_on_disk(broker: BrokerProcess, topic: str) -> set[str]:
    location = urllib.parse.urlparse(table(broker, topic).location()).path
    return {str(p) for p in Path(location, "data").rglob("*.parquet")}


def data_files_of_table(broker: BrokerProcess, topic: str) -> set[str]:
    files = table(broker, topic).inspect.files().column("file_path").to_pylist()
    return {urllib.parse.urlparse(f).path for f in files}


def a_table_with(broker: BrokerProcess, records: int) -> tuple[str, AvroProducer]:
    topic = new_topic(broker, partitions=2)
    producer = AvroProducer(broker, topic, CLICK_V1)
    producer.send(clicks(0, records))
    assert run(broker, topic, None).rows == records  # the first round creates the table
    return topic, producer


def a_table_written_ahead(
    broker: BrokerProcess, first: int, ahead: int, partition: int | None = None
) -> tuple[str, AvroProducer, Prestager]:
    """A table of ``first`` records, then ``ahead`` more written ahead for the next round
    (whose interval ends in 30 s)."""
    topic, producer = a_table_with(broker, first)
    prestager = new_prestager()
    prestage(prestager, broker, topic, int(time.time() * 1000) + 30_000)
    producer.send(clicks(first, ahead), partition=partition)
    written_ahead(prestager, topic, ahead)
    return topic, producer, prestager


def test_rows_written_ahead_are_committed_once_with_the_rest_in_one_file(
    round_broker: BrokerProcess,
) -> None:
    topic, producer, prestager = a_table_written_ahead(round_broker, 100, 1000)
    # stopped first: a pre-stage still stepping would write these too once flushed (it did in
    # a CI run on a loaded machine, 1300 written ahead)
    staged = prestager.take(topic)
    assert staged is not None and prestager.status() == {}
    producer.send(clicks(1100, 300))  # after the pre-stage: the round reads these itself
    result = run(round_broker, topic, staged)
    assert (result.records, result.rows, result.prestaged_records) == (1300, 1300, 1000)
    assert result.data_files == 1  # the rows written ahead and the rest share the round's file
    assert table_offsets(round_broker, topic) == sorted(producer.acked)  # each record once
    assert data_files_on_disk(round_broker, topic) == data_files_of_table(round_broker, topic)


def test_rows_written_ahead_of_another_rounds_commit_are_dropped_and_deleted(
    round_broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    topic, producer, prestager = a_table_written_ahead(round_broker, 100, 500)
    assert run(round_broker, topic, None).rows == 500  # another round commits them first
    producer.send(clicks(600, 200))
    staged = prestager.take(topic)
    assert staged is not None
    with caplog.at_level(logging.INFO, logger="icefall.commit_round"):
        result = run(round_broker, topic, staged)
    assert (result.rows, result.prestaged_records) == (200, 0)
    assert "the table, its schemas or the topic's settings changed since" in caplog.text
    assert table_offsets(round_broker, topic) == sorted(producer.acked)
    # the file written ahead is gone: every data file left is the table's
    assert data_files_on_disk(round_broker, topic) == data_files_of_table(round_broker, topic)


def test_rows_written_past_the_rounds_end_are_not_used(
    round_broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    topic, producer, prestager = a_table_written_ahead(round_broker, 10, 400, partition=0)
    committed = [sum(1 for p, _ in producer.acked[:10] if p == q) for q in (0, 1)]
    until = f'{{"0": {committed[0] + 100}, "1": {committed[1]}}}'
    with caplog.at_level(logging.INFO, logger="icefall.commit_round"):
        result = run(round_broker, topic, prestager.take(topic), "--until-offsets", until)
    assert (result.rows, result.prestaged_records) == (100, 0)
    assert f"past the round's end {committed[0] + 100}" in caplog.text
    assert data_files_on_disk(round_broker, topic) == data_files_of_table(round_broker, topic)


def test_after_the_interval_ends_only_its_own_records_are_written_ahead(
    round_broker: BrokerProcess,
) -> None:
    topic, producer = a_table_with(round_broker, 10)
    producer.send(clicks(10, 600))
    acked_ms = time.time() * 1000
    until_ms = wait_for(
        lambda: (now := int(time.time() * 1000)) > acked_ms + 1 and now, what="a later ms"
    )
    producer.send(clicks(610, 200))  # appended after the interval's end
    prestager = new_prestager()
    prestage(prestager, round_broker, topic, until_ms)
    written_ahead(prestager, topic, 600)
    result = run(round_broker, topic, prestager.take(topic), "--until-append-time", str(until_ms))
    assert (result.rows, result.prestaged_records) == (600, 600)
    assert len(table_offsets(round_broker, topic)) == 610


def counted_steps(monkeypatch: pytest.MonkeyPatch, done_at: int | None) -> list[float]:
    """Pre-stage steps replaced by a counter (their times), reporting the round's records all
    written at the ``done_at``-th step (None: never); ``POLL_S`` 30 s, so that only the fast
    polls after the end can take several steps in a test's time."""
    monkeypatch.setattr(prestage_module, "POLL_S", 30.0)
    steps: list[float] = []

    def step(self: Any, round_: Any, spec: Any, found: Any) -> bool:
        steps.append(time.monotonic())
        return done_at is not None and len(steps) >= done_at

    monkeypatch.setattr(prestage_module._Staging, "_step", step)
    return steps


def test_after_the_end_the_last_records_are_asked_for_every_final_poll(
    round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the interval has ended, the round comes right after the flush its task forces and
    waits for the step in progress: the step that writes the last records must not be a
    ``POLL_S`` away. Here ``POLL_S`` is 30 s and the interval's records are "flushed" at the
    third ask after the end; once they are written, no step is taken any more."""
    topic, _ = a_table_with(round_broker, 10)
    steps = counted_steps(monkeypatch, done_at=3)
    prestager = new_prestager()
    prestage(prestager, round_broker, topic, int(time.time() * 1000) - 1)  # ended just now
    try:
        wait_for(lambda: len(steps) >= 3, timeout=10, what="three steps after the interval's end")
        assert steps[2] - steps[0] < 10 * prestage_module.FINAL_POLL_S + 1, steps
    finally:
        prestager.take(topic)  # stops the thread (its POLL_S wait ends at once)
    assert len(steps) == 3, "a step after the round's records were all written"


def test_fast_polls_stop_a_few_seconds_after_the_end(
    round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round held up elsewhere (its task failed, the broker does not flush) must not have the
    broker asked every 0.05 s until ``KEEP_S``: past ``FINAL_POLL_FOR_S`` after the end, every
    ``POLL_S`` again (30 s here, so one step in the test's time)."""
    topic, _ = a_table_with(round_broker, 10)
    steps = counted_steps(monkeypatch, done_at=None)  # never flushed
    prestager = new_prestager()
    late_ms = int((time.time() - prestage_module.FINAL_POLL_FOR_S - 1) * 1000)
    prestage(prestager, round_broker, topic, late_ms)  # ended over FINAL_POLL_FOR_S ago
    try:
        wait_for(lambda: steps, timeout=10, what="the first step")
        with pytest.raises(TimeoutError):  # fast polls would take 20 steps in this second
            wait_for(lambda: len(steps) >= 3, timeout=1.0, what="more steps")
    finally:
        prestager.take(topic)
    assert len(steps) == 1, f"{len(steps)} steps: fast polls past FINAL_POLL_FOR_S"


def test_a_round_uses_only_rows_of_its_spec_starting_where_its_windows_start() -> None:
    spec = TaskSpec(
        store=cast(Any, None),
        table_metadata_json="{}",
        io_properties=(("s3.access-key-id", "a"),),
        key_type="string",
        value_type="avro",
        registry_url="http://registry",
    )
    staged = StagedRows(cast(OpenTask, SimpleNamespace(spec=spec)), {0: 10, 1: 5}, {0: 40, 1: 5})
    windows = [PartitionWindow(0, 10, 50, 0), PartitionWindow(1, 5, 9, 0)]
    # new credentials from the catalog do not matter; anything else in the spec does
    fresh = TaskSpec(**{**spec.__dict__, "io_properties": (("s3.access-key-id", "b"),)})
    assert staged.mismatch(fresh, windows) is None
    assert [(w.start, w.end) for w in staged.rest(windows)] == [(40, 50), (5, 9)]
    other = TaskSpec(**{**spec.__dict__, "table_metadata_json": '{"x": 1}'})
    assert "changed" in (staged.mismatch(other, windows) or "")
    moved = [PartitionWindow(0, 12, 50, 0), windows[1]]
    assert "starts at offset 12" in (staged.mismatch(spec, moved) or "")
    short = [PartitionWindow(0, 10, 30, 0), windows[1]]
    assert "past the round's end 30" in (staged.mismatch(spec, short) or "")
    assert "partition 1 is not in" in (staged.mismatch(spec, windows[:1]) or "")


def test_a_prestage_needs_its_intervals_end_within_a_minute(round_broker: BrokerProcess) -> None:
    prestager = new_prestager()
    args = commit_round.parse_args(round_args(round_broker, "t", None))
    with pytest.raises(ValueError, match="--until-append-time"):
        prestager.start(args, {})
    args.until_append_time = int(time.time() * 1000) + 3_600_000
    with pytest.raises(ValueError, match="at most 60 s ahead"):
        prestager.start(args, {})


def test_a_round_too_large_for_the_driver_is_not_written_ahead(
    round_broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """Above ``--in-driver-max-bytes`` the round runs on Spark, which writes its own files."""
    topic, producer = a_table_with(round_broker, 10)
    prestager = new_prestager()
    with caplog.at_level(logging.INFO, logger="icefall.prestage"):
        prestage(
            prestager,
            round_broker,
            topic,
            int(time.time() * 1000) + 30_000,
            "--in-driver-max-bytes",
            "2000",
        )
        producer.send(clicks(10, 300))
        wait_for(lambda: "the round will run on Spark; dropped" in caplog.text, 30, what="the drop")
    assert prestager.take(topic) is None
    assert data_files_on_disk(round_broker, topic) == data_files_of_table(round_broker, topic)


def test_a_prestage_for_another_interval_or_that_no_round_takes_is_dropped(
    round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, producer = a_table_with(round_broker, 10)
    # row groups of 100 rows: the file written ahead is on disk once 100 rows are in it
    with table(round_broker, topic).transaction() as change:
        change.set_properties({"write.parquet.row-group-limit": "100"})
    committed = len(data_files_of_table(round_broker, topic))
    prestager = new_prestager()
    now_ms = int(time.time() * 1000)
    prestage(prestager, round_broker, topic, now_ms + 30_000)
    producer.send(clicks(10, 200))
    written_ahead(prestager, topic, 200)

    def on_disk(files: int) -> bool:
        return len(data_files_on_disk(round_broker, topic)) == files

    wait_for(lambda: on_disk(committed + 1), 10, what="the file written ahead")
    # the next interval's: the first one's file is deleted, the new one writes the rows again
    prestage(prestager, round_broker, topic, now_ms + 40_000)
    written_ahead(prestager, topic, 200)
    wait_for(lambda: on_disk(committed + 1), 10, what="one file written ahead")
    ahead = data_files_on_disk(round_broker, topic) - data_files_of_table(round_broker, topic)
    # a pre-stage no round takes is deleted KEEP_S after its interval's end
    monkeypatch.setattr(prestage_module, "KEEP_S", -40.0)
    wait_for(lambda: prestager.status() == {}, 30, what="the pre-stage to give up")
    assert data_files_on_disk(round_broker, topic) == data_files_of_table(round_broker, topic)
    assert not ahead & data_files_on_disk(round_broker, topic)
    assert prestager.take(topic) is None


def test_a_step_never_waits_for_credentials_a_round_waits_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REGISTRY_USER_INFO_ENV, "started:0")  # the gate's changes are undone
    gate = CredentialGate()
    a, b = {REGISTRY_USER_INFO_ENV: "a:1"}, {REGISTRY_USER_INFO_ENV: "b:2"}

    def round_with_b() -> None:
        with gate.credentials(b):
            pass

    with gate.credentials(a):
        with gate.credentials_now(a) as same:
            assert same  # the same credentials: in at once
        with gate.credentials_now(b) as other:
            assert not other  # others are applied: not now
        waiting = threading.Thread(target=round_with_b, daemon=True)
        waiting.start()
        wait_for(lambda: gate._waiting == 1, 10, what="the round to wait")
        with gate.credentials_now(a) as behind:
            assert not behind  # a round waits: steps stay out until it ran
    waiting.join(10)
    assert not waiting.is_alive()
    with gate.credentials_now(a) as after:
        assert after
