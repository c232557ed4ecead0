"""ListOffsets by timestamp and MAX_TIMESTAMP answer the record, not its batch's base offset:
five records with their own timestamps in one batch (confluent-kafka / librdkafka)."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from tests.support import BrokerProcess

AT = 1_700_000_000_000


def test_offsets_by_timestamp_are_exact_inside_a_batch(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("by-time", 1, 1)]).values():
        future.result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 200})
    stamps = [AT, AT + 10, AT + 20, AT + 50, AT + 30]  # the largest is not the last
    for ts in stamps:
        producer.produce("by-time", value=b"v", partition=0, timestamp=ts)
    assert producer.flush(10) == 0
    broker.admin("/v1/flush", method="POST")  # also from a segment object, not only the tail

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "by-time"})
    try:

        def offset_for(ts: int) -> int:
            [tp] = consumer.offsets_for_times([TopicPartition("by-time", 0, ts)], 10)
            return int(tp.offset)

        assert [offset_for(ts) for ts in (AT, AT + 5, AT + 20, AT + 21, AT + 50)] == [
            0,
            1,
            2,
            3,
            3,
        ]
        assert offset_for(AT + 51) == -1
    finally:
        consumer.close()
    tp = TopicPartition("by-time", 0)
    answer = admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(10)
    assert (answer.offset, answer.timestamp) == (3, AT + 50)
