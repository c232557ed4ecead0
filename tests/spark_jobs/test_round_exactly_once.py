"""Exactly once: a round killed at each point and re-run, two rounds at once, a
concurrent writer moving ``main`` mid-round. The check is always the same:
the (partition, offset) of every row, duplicates kept, equals what the
producer had acknowledged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker import checkpoint
from spark_jobs import commit_round
from tests.conftest import MotoS3
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    crash_round_at,
    new_topic,
    round_args,
    run_round,
    run_round_process,
    table,
    table_offsets,
)
from tests.spark_jobs.test_commit_round import clicks
from tests.support import REPO, BrokerProcess, wait_for


def round_branches(broker: BrokerProcess, topic: str) -> list[str]:
    return [
        r
        for r in table(broker, topic).metadata.refs
        if r.startswith(checkpoint.ROUND_BRANCH_PREFIX)
    ]


@pytest.mark.parametrize(
    "point", ["before_write", "after_write", "before_publish", "after_publish"]
)
def test_a_round_crashing_at_each_point_then_rerun_commits_each_record_once(
    point: str, spark: Any, round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = new_topic(round_broker)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 50))
    first = run_round(spark, round_broker, topic)  # the table exists and holds a first round
    producer.send(clicks(50, 70))

    crash_round_at(point, spark, round_broker, topic, monkeypatch, "--round-id", "r2")
    crashed_after_commit = point == "after_publish"
    assert len(table_offsets(round_broker, topic)) == (120 if crashed_after_commit else 50)
    current = table(round_broker, topic).current_snapshot()

    # The same round tried again (what Airflow's retry of the task does): a commit its crashed
    # try made is reported as that commit, so its asset event is not lost.
    retry = run_round(spark, round_broker, topic, "--round-id", "r2")
    assert retry.status == "committed", retry.message
    assert retry.from_earlier_try == crashed_after_commit
    if crashed_after_commit:
        assert current is not None and retry.snapshot_id == current.snapshot_id
    assert (retry.offsets_before, retry.records, retry.rows) == (first.offsets_after, 70, 70)
    held = checkpoint.read_checkpoint(table(round_broker, topic).metadata)
    assert retry.offsets_after == held.offsets and sum(held.offsets.values()) == 120
    assert retry.snapshot_timestamp_ms is not None and retry.snapshot_timestamp_ms > 0
    # another round: nothing new
    rerun = run_round(spark, round_broker, topic)
    assert rerun.status == "nothing_new" and not rerun.from_earlier_try, rerun.message
    assert table_offsets(round_broker, topic) == sorted(producer.acked)


def test_a_round_process_exiting_before_publish_then_rerun(
    spark: Any, round_broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = new_topic(round_broker)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 70))
    killed = run_round_process(
        round_broker,
        topic,
        tmp_path / "killed.json",
        env={commit_round.KILL_POINT_ENV: "before_publish"},
    )
    assert killed.returncode == 137, killed.stderr[-2000:]
    assert not (tmp_path / "killed.json").exists()
    assert table_offsets(round_broker, topic) == [] and round_branches(round_broker, topic)
    assert run_round(spark, round_broker, topic).status == "committed"
    assert table_offsets(round_broker, topic) == sorted(producer.acked)


def test_a_round_killed_during_the_spark_write_then_rerun(
    round_broker: BrokerProcess, spark: Any, tmp_path: Path
) -> None:
    topic = new_topic(round_broker)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 20000))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spark_jobs.commit_round",
            *round_args(round_broker, topic, tmp_path / "r.json", "--master", "local[2]"),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def writing() -> bool:
        return proc.poll() is not None or bool(
            _exists(round_broker, topic) and round_branches(round_broker, topic)
        )

    try:
        wait_for(writing, timeout=180, interval=0.05, what="the round's branch")
        assert proc.poll() is None, "the round ended before it could be killed mid-write"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert table_offsets(round_broker, topic) == []
    assert run_round(spark, round_broker, topic).status == "committed"
    assert table_offsets(round_broker, topic) == sorted(producer.acked)


def _exists(broker: BrokerProcess, topic: str) -> bool:
    from tests.spark_jobs.round_support import catalog

    return catalog(broker).table_exists(("default", topic))


def test_two_rounds_at_once_commit_each_record_once(
    round_broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = new_topic(round_broker)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 500))
    cmd = [sys.executable, "-m", "spark_jobs.commit_round", "--master", "local[1]"]
    procs = [
        subprocess.Popen(
            [*cmd, *round_args(round_broker, topic, tmp_path / f"r{i}.json")],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for i in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    statuses = sorted(json.loads((tmp_path / f"r{i}.json").read_text())["status"] for i in range(2))
    assert statuses in (["committed", "nothing_new"], ["committed", "committed"])
    assert table_offsets(round_broker, topic) == sorted(producer.acked)


def test_a_round_that_planned_before_the_table_existed_starts_over(
    spark: Any, round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another round creates the table and commits between this round's plan (no table, so no
    checkpoint) and its write: this one must start over, not write the same offsets again (found by
    two rounds at once in CI: every record twice)."""
    from spark_jobs.rounds import table_setup

    topic = new_topic(round_broker, partitions=1)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 20))
    real = table_setup.load_or_create
    calls: list[int] = []

    def another_round_first(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            assert run_round(spark, round_broker, topic).status == "committed"
        return real(*args, **kwargs)

    monkeypatch.setattr(table_setup, "load_or_create", another_round_first)
    result = run_round(spark, round_broker, topic)
    assert (result.status, result.attempts) == ("nothing_new", 2), result
    assert table_offsets(round_broker, topic) == sorted(producer.acked)


def test_a_concurrent_writer_on_main_makes_the_round_start_over(
    spark: Any, round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = new_topic(round_broker, partitions=1)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 20))
    run_round(spark, round_broker, topic)
    producer.send(clicks(20, 30))
    real_publish = commit_round.publish
    calls: list[int] = []

    def publish_after_someone_else(catalog: Any, tbl: Any, *args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # another writer commits to main between our write and our publish
            with table(round_broker, topic).transaction() as tx, tx.update_snapshot().fast_append():
                pass
        return real_publish(catalog, tbl, *args)

    monkeypatch.setattr(commit_round, "publish", publish_after_someone_else)
    result = run_round(spark, round_broker, topic)
    assert result.status == "committed" and result.attempts == 2, result
    assert table_offsets(round_broker, topic) == sorted(producer.acked)
    assert round_branches(round_broker, topic) == []


def test_segments_on_s3_are_read_by_the_executors(
    broker_factory: Any,
    moto_s3: MotoS3,
    s3_bucket: str,
    spark: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = moto_s3.env()
    broker = broker_factory(
        ["--segment-flush-ms", "100", "--object-store", f"s3://{s3_bucket}/segments"],
        env,
        name="s3home",
    )
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    topic = new_topic(broker)
    producer = AvroProducer(broker, topic, CLICK_V1)
    producer.send(clicks(0, 300))
    result = run_round(spark, broker, topic)
    keys = [
        o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    ]
    assert keys and all(k.startswith("segments/") for k in keys)
    assert result.status == "committed" and result.rows == 300 and result.bytes_read > 0, (
        result.message
    )
    assert table_offsets(broker, topic) == sorted(producer.acked)
