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
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.rounds import complete_round, kill_round_at_random
from tests.spark_jobs.round_support import CLICK_V1, AvroProducer, new_topic, table_offsets
from tests.spark_jobs.test_commit_round import clicks
from tests.support import BrokerProcess

SEED = int(os.environ.get("ICEFALL_RELIABILITY_SEED") or random.randrange(1 << 30))


@pytest.mark.timeout(420)
def test_a_round_killed_at_a_random_moment_then_rerun_is_exact(broker_factory: Callable[..., BrokerProcess],
                                                                tmp_path: Path) -> None:
    broker = broker_factory(["--segment-flush-ms", "100"])
    rng = random.Random(SEED)
    topic = new_topic(broker, partitions=3)
    producer = AvroProducer(broker, topic, CLICK_V1)
    producer.send(clicks(0, 300))
    first = complete_round(broker, topic, tmp_path)
    assert first["status"] == "committed" and table_offsets(broker, topic) == sorted(producer.acked)
    producer.send(clicks(300, 300))
    # a round here takes roughly as long as the first one (JVM start included)
    delay, code = kill_round_at_random(broker, topic, tmp_path, rng, max_delay_s=first["seconds"]["total"] + 5)
    print({"seed": SEED, "kill_after_s": round(delay, 2), "finished_before_the_kill": code})
    rerun = complete_round(broker, topic, tmp_path)
    assert rerun["status"] in ("committed", "nothing_new"), rerun
    offsets = table_offsets(broker, topic)
    assert len(offsets) == len(set(offsets)), f"duplicate rows (seed {SEED}, kill after {delay:.2f}s)"
    assert offsets == sorted(producer.acked), f"missing rows (seed {SEED}, kill after {delay:.2f}s)"


@pytest.mark.timeout(420)
def test_a_round_over_1000_partitions_is_exact(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
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
