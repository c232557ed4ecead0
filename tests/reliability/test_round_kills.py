"""Commit rounds killed with SIGKILL (driver and JVM together) at a random
moment, then run again to completion: the table holds every acknowledged
record exactly once. tests/spark_jobs/test_round_exactly_once.py kills at four
named points; here the moment is random (seeded; printed on failure; set
``ICEFALL_RELIABILITY_SEED`` to replay), so it also lands inside Spark's write
and the Iceberg commit. bench/reliability.py repeats it many times. Also: a
round over a 1,000-partition topic completes and is exact."""

from __future__ import annotations

import os
import random
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.rounds import complete_round, kill_round_at_random, round_process
from tests.spark_jobs.round_support import CLICK_V1, AvroProducer, new_topic, table_offsets
from tests.spark_jobs.test_commit_round import clicks
from tests.support import BrokerProcess

SEED = int(os.environ.get("ICEFALL_RELIABILITY_SEED") or random.randrange(1 << 30))


@pytest.mark.timeout(420)
def test_a_round_over_1000_partitions_is_exact(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(["--segment-flush-ms", "200"])
    topic = new_topic(broker, partitions=1000)
    producer = AvroProducer(broker, topic, CLICK_V1)
    producer.send(clicks(0, 5000), key=lambda v: str(v["id"]).encode())
    assert len({p for p, _ in producer.acked}) > 900
    result = complete_round(broker, topic, tmp_path)
    assert result["status"] == "committed", result
    per_partition = Counter(p for p, _ in producer.acked)
    assert result["offsets_after"] == {str(p): per_partition.get(p, 0) for p in range(1000)}
    assert table_offsets(broker, topic) == sorted(producer.acked)


def _assert_exact(broker: BrokerProcess, topic: str, producer: AvroProducer, what: str) -> None:
    offsets = table_offsets(broker, topic)
    assert len(offsets) == len(set(offsets)), f"duplicate rows after {what} (seed {SEED})"
    assert offsets == sorted(producer.acked), f"missing rows after {what} (seed {SEED})"


@pytest.mark.timeout(420)
def test_a_round_or_the_broker_killed_at_a_random_moment_then_the_round_rerun_is_exact(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """First the round itself is killed (driver and JVM); then the broker (its catalog
    and admin API with it) during a round, which fails or completes. Each time the
    next round leaves the table exact."""
    broker = broker_factory(["--segment-flush-ms", "100"])
    rng = random.Random(SEED)
    topic = new_topic(broker, partitions=3)
    producer = AvroProducer(broker, topic, CLICK_V1)
    producer.send(clicks(0, 300))
    first = complete_round(broker, topic, tmp_path)
    assert first["status"] == "committed"
    _assert_exact(broker, topic, producer, "the first round")
    window = (
        first["seconds"]["total"] + 5
    )  # a round takes about as long as the first (JVM start included)

    producer.send(clicks(300, 300))
    delay, code = kill_round_at_random(broker, topic, tmp_path, rng, max_delay_s=window)
    print({"seed": SEED, "round_killed_after_s": round(delay, 2), "finished_before_the_kill": code})
    assert complete_round(broker, topic, tmp_path)["status"] in ("committed", "nothing_new")
    _assert_exact(broker, topic, producer, f"a round killed after {delay:.2f}s")

    producer.send(clicks(600, 300))
    delay = rng.uniform(0, window)
    proc = round_process(broker, topic, tmp_path / "broker-killed.json")
    try:
        code = proc.wait(delay)
    except subprocess.TimeoutExpired:
        code = None
        broker.kill9()
        broker.start()
        proc.wait(300)
    print(
        {
            "seed": SEED,
            "broker_killed_after_s": round(delay, 2),
            "round_exit": proc.returncode,
            "finished_before_the_kill": code,
        }
    )
    complete_round(broker, topic, tmp_path)
    _assert_exact(broker, topic, producer, f"the broker killed {delay:.2f}s into a round")
