"""The sustained benchmark's producer (bench/rate_producer.py) counts what the broker stored.

The benchmark's figure rests on its counts: "acknowledged" (sent - not yet delivered -
failed, without a Python callback per record) is what the lag is measured against, and a
record the broker refuses must fail the run, not vanish. One broker: a group of two producer
processes sharing a rate, whose every record the broker's offsets account for, and one
process whose records the broker refuses (a topic with a tiny ``max.message.bytes``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.rate_producer import ProducerGroup, ProducerProcess
from tests.support import BrokerProcess, wait_for


def test_counts_match_the_broker_and_refused_records_fail(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topics = [NewTopic("ok", 4, 1), NewTopic("tiny", 1, 1, config={"max.message.bytes": "64"})]
    for future in admin.create_topics(topics).values():
        future.result(15)

    with ProducerGroup(broker.bootstrap, "ok", 7, tmp_path / "ok.log", 2) as producer:
        producer.set_rate(4.0)
        wait_for(lambda: producer.stat("acked") >= 20_000, 60, what="20,000 acknowledged")
        producer.check()
        assert producer.stat("acked") <= producer.stat("sent")
    for member in producer.members:  # stopped: flushed, every record acknowledged
        assert member.last["done"] and member.last["failures"] == 0, member.last
        assert member.last["pending"] == 0 and member.last["acked"] == member.last["sent"] > 0
    last = {name: producer.stat(name) for name in ("sent", "acked", "value_bytes")}
    assert last["acked"] == last["sent"] >= 20_000
    assert last["value_bytes"] > 400 * last["sent"]  # ~500 B values, all counted
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "count"})
    try:
        ends = [consumer.get_watermark_offsets(TopicPartition("ok", p), 10)[1] for p in range(4)]
    finally:
        consumer.close()
    assert sum(ends) == last["sent"]
    assert all(ends), ends  # keyed records spread over the partitions

    with ProducerProcess(broker.bootstrap, "tiny", 7, tmp_path / "tiny.log") as refused:
        refused.set_rate(0.05)
        wait_for(lambda: refused.stat("failures") > 0, 60, what="a refused record counted")
        with pytest.raises(RuntimeError, match="records failed to produce"):
            refused.check()
    assert refused.last["done"] and refused.last["acked"] == 0
    assert refused.last["errors"], refused.last
