"""A commit round on a table topic written by a transactional producer: it commits only
below the last stable offset (an open transaction is left for a later round) and skips the
records of aborted transactions, reading them with Kafka's read_committed rules. In the
driver (no Spark session): the ranges carry the aborted transactions the same way to a
Spark task (``tasks.encode_group``)."""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Producer

from spark_jobs.decode.segments import SegmentRange
from spark_jobs.rounds.tasks import decode_group, encode_group
from tests.spark_jobs.round_support import CLICK_V1, AvroProducer, new_topic, run_round, table
from tests.spark_jobs.test_commit_round import clicks
from tests.support import BrokerProcess

IN_DRIVER = ("--in-driver-max-bytes", str(64 << 20))


def _ids(broker: BrokerProcess, topic: str) -> list[int]:
    return sorted(
        table(broker, topic).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    )


def test_a_round_commits_below_the_lso_and_skips_aborted_records(
    round_broker: BrokerProcess,
) -> None:
    topic = new_topic(round_broker, partitions=1)
    txn = AvroProducer(round_broker, topic, CLICK_V1)
    txn.producer = Producer(
        {
            "bootstrap.servers": round_broker.bootstrap,
            "transactional.id": f"round-{uuid.uuid4().hex[:6]}",
            "linger.ms": 5,
        }
    )
    txn.producer.init_transactions(15)
    plain = AvroProducer(round_broker, topic, CLICK_V1)
    for start, n, commit in ((0, 5, True), (100, 3, False), (5, 4, True)):
        txn.producer.begin_transaction()
        txn.send(clicks(start, n))
        if commit:
            txn.producer.commit_transaction(15)
        else:
            txn.producer.abort_transaction(15)
    txn.producer.begin_transaction()
    txn.send(clicks(200, 2))  # left open over the first round
    plain.send(clicks(9, 2))  # not transactional, but after the open transaction's start

    offsets = round_broker.admin(f"/v1/topics/{topic}/offsets")["partitions"][0]
    lso = offsets["last_stable_offset"]
    assert lso < offsets["high_watermark"]
    first: Any = run_round(None, round_broker, topic, *IN_DRIVER)
    assert first.status == "committed", first
    assert first.offsets_after == {0: lso}
    assert _ids(round_broker, topic) == list(range(9))  # no aborted 100s, nothing open

    txn.producer.commit_transaction(15)
    second: Any = run_round(None, round_broker, topic, *IN_DRIVER)
    assert second.status == "committed", second
    assert _ids(round_broker, topic) == [*range(11), 200, 201]


def test_ranges_carry_their_aborted_transactions_to_spark_tasks() -> None:
    group = [
        SegmentRange("a", 0, 10, 0, 5, 50, ((1000, 7),)),
        SegmentRange("b", 0, 10, 0, 5, 50),
    ]
    assert decode_group(encode_group(group)) == group
