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


def test_list_offsets_v0_for_old_clients(broker: BrokerProcess) -> None:
    """ListOffsets v0 (``max_num_offsets``, ``old_style_offsets``), encoded by kafka-python's
    own v0 structs: -2 is the log start, -1 the log end, newest first, at most as many as
    asked; a timestamp before everything finds nothing; an unknown partition is named."""
    import socket
    import struct

    from kafka.protocol.old.list_offsets import ListOffsetsRequest_v0, ListOffsetsResponse_v0

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("old-client", 1, 1)])["old-client"].result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce("old-client", value=b"%d" % i)
    assert producer.flush(10) == 0

    def ask(*partitions: tuple[int, int, int]) -> list[tuple[int, int, list[int]]]:
        request = ListOffsetsRequest_v0(replica_id=-1, topics=[("old-client", list(partitions))])
        request.with_header(correlation_id=7, client_id="old")
        host, port = broker.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request.encode(header=True, framed=True))
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            frame = sock.recv(size, socket.MSG_WAITALL)
        assert struct.unpack(">i", frame[:4])[0] == 7  # the correlation id
        response = ListOffsetsResponse_v0.decode(frame[4:])
        [(name, answers)] = response.topics
        assert name == "old-client"
        return [(p, e, list(o)) for p, e, o in answers]

    assert ask((0, -1, 1), (0, -2, 1)) == [(0, 0, [10]), (0, 0, [0])]
    assert ask((0, -1, 5))[0][2][0] == 10  # newest first
    assert ask((0, 0, 5)) == [(0, 0, [])]  # nothing was appended before 1970
    assert ask((3, -1, 1)) == [(3, 3, [])]  # UNKNOWN_TOPIC_OR_PARTITION
