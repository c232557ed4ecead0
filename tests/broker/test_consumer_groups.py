"""The KIP-848 consumer group protocol with real clients: confluent-kafka (librdkafka)
consumers with ``group.protocol=consumer`` split partitions, rebalance as members come and go
(never holding a partition twice), keep committed offsets, and are described by the admin
client; Kafka's Java console consumer joins such a group too."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kio.static.primitive import i16, i32, i32Timedelta

from tests.broker.test_groups import Member
from tests.kafka_tools import KAFKA_JARS, kafka_tool
from tests.support import REPO, BrokerProcess, wait_for

PARTITIONS = 6
HEARTBEAT_MS = 300
SESSION_MS = 4000


@pytest.fixture
def broker(broker_factory: Any) -> BrokerProcess:
    """Heartbeats and sessions short enough for a test (Kafka's defaults: 5 s and 45 s)."""
    result: BrokerProcess = broker_factory(
        [
            "--segment-flush-ms",
            "200",
            "--group-consumer-heartbeat-interval-ms",
            str(HEARTBEAT_MS),
            "--group-consumer-session-timeout-ms",
            str(SESSION_MS),
        ]
    )
    return result


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for member in started:
        if member.is_alive():
            member._stop_event.set()
    for member in started:
        member.join(30)


def _create(broker: BrokerProcess, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(10)


def _config(broker: BrokerProcess, group: str, client_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": broker.bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "client.id": client_id,
        "auto.offset.reset": "earliest",
        **extra,
    }


def consumer_member(broker: BrokerProcess, group: str, topic: str, client_id: str) -> Member:
    def make(member: Member) -> Consumer:
        consumer = Consumer(_config(broker, group, client_id))
        consumer.subscribe([topic], on_assign=lambda *_: member.assigned())
        return consumer

    def poll(member: Member, consumer: Consumer) -> None:
        consumer.poll(0.1)

    return Member(make, poll, lambda c: {tp.partition for tp in c.assignment()})


def _described(broker: BrokerProcess, group: str) -> Any:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    return admin.describe_consumer_groups([group])[group].result(10)


def _split(*members: Member) -> bool:
    owned = [m.partitions for m in members]
    union = frozenset().union(*owned)
    return (
        all(owned)
        and sum(len(o) for o in owned) == len(union)
        and union == frozenset(range(PARTITIONS))
    )


def _coordinator_never_doubles(broker: BrokerProcess, group: str, seen: list[str]) -> bool:
    """The assignments the coordinator reports hold no partition twice; records what it saw."""
    described = _described(broker, group)
    held = [tp.partition for m in described.members for tp in m.assignment.topic_partitions]
    seen.append(str(sorted(held)))
    assert len(held) == len(set(held)), held
    return True


def test_members_split_rebalance_and_leave(broker: BrokerProcess, members: list[Member]) -> None:
    topic, group = "kip848", "kip848-group"
    _create(broker, topic)
    everything = frozenset(range(PARTITIONS))
    seen: list[str] = []

    first = consumer_member(broker, group, topic, "first")
    members.append(first)
    wait_for(lambda: first.partitions == everything, 30, what="the first member to own all")

    second = consumer_member(broker, group, topic, "second")
    members.append(second)
    wait_for(
        lambda: _coordinator_never_doubles(broker, group, seen) and _split(first, second),
        30,
        what="the two members to split the partitions",
    )
    assert {len(first.partitions), len(second.partitions)} == {3}

    third = consumer_member(broker, group, topic, "third")
    members.append(third)
    wait_for(
        lambda: _coordinator_never_doubles(broker, group, seen) and _split(first, second, third),
        30,
        what="three members to split the partitions",
    )
    assert {len(m.partitions) for m in (first, second, third)} == {2}

    described = _described(broker, group)
    assert described.type == ConsumerGroupType.CONSUMER
    assert described.state == ConsumerGroupState.STABLE
    assert described.partition_assignor == "uniform"
    by_client = {m.client_id: m for m in described.members}
    assert set(by_client) == {"first", "second", "third"}
    for name, member in (("first", first), ("second", second), ("third", third)):
        reported = {tp.partition for tp in by_client[name].assignment.topic_partitions}
        target = {tp.partition for tp in by_client[name].target_assignment.topic_partitions}
        assert reported == target == set(member.partitions)

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listing = admin.list_consumer_groups(request_timeout=10).result()
    listed = {g.group_id: g for g in listing.valid}
    assert listed[group].type == ConsumerGroupType.CONSUMER
    assert listed[group].state == ConsumerGroupState.STABLE

    third.leave()
    wait_for(
        lambda: _coordinator_never_doubles(broker, group, seen) and _split(first, second),
        30,
        what="the leaver's partitions to move to the other two",
    )
    first.leave()
    second.leave()
    wait_for(
        lambda: _described(broker, group).state == ConsumerGroupState.EMPTY,
        20,
        what="the group to be empty",
    )


def test_committed_offsets_survive_the_members(broker: BrokerProcess) -> None:
    topic, group = "kip848-offsets", "kip848-offsets-group"
    _create(broker, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(30):
        producer.produce(topic, value=f"old-{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0

    def consume(count: int) -> list[str]:
        consumer = Consumer(_config(broker, group, "reader", **{"enable.auto.commit": False}))
        consumer.subscribe([topic])
        got: list[str] = []
        try:

            def poll() -> bool:
                msg = consumer.poll(0.2)
                if msg is not None and not msg.error():
                    got.append(bytes(msg.value() or b"").decode())
                    consumer.commit(message=msg, asynchronous=False)
                return len(got) >= count

            wait_for(poll, 30, interval=0, what=f"{count} records")
        finally:
            consumer.close()
        return got

    assert sorted(consume(30)) == sorted(f"old-{i}" for i in range(30))
    for i in range(6):
        producer.produce(topic, value=f"new-{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    # a new member of the group starts from the committed offsets: only the new records
    assert sorted(consume(6)) == sorted(f"new-{i}" for i in range(6))

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    offsets = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(6)])]
    )[group].result(10)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions} == {
        p: 6 for p in range(PARTITIONS)
    }


_DOOMED_MEMBER = textwrap.dedent("""
    import json, sys
    from confluent_kafka import Consumer
    bootstrap, group, topic = sys.argv[1:4]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "doomed",
                         "group.protocol": "consumer"})
    consumer.subscribe([topic])
    last = None
    while True:
        consumer.poll(0.1)
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != last:
            print(json.dumps(now), flush=True)
            last = now
""")


def test_a_silent_member_expires_and_its_partitions_move(
    broker: BrokerProcess, members: list[Member], tmp_path: Path
) -> None:
    topic, group = "kip848-expiry", "kip848-expiry-group"
    _create(broker, topic)
    everything = frozenset(range(PARTITIONS))
    survivor = consumer_member(broker, group, topic, "survivor")
    members.append(survivor)
    wait_for(lambda: survivor.partitions == everything, 30, what="the survivor to own all")

    doomed_log = tmp_path / "doomed.log"
    with open(doomed_log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", _DOOMED_MEMBER, broker.bootstrap, group, topic],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
    seen: list[list[int]] = []

    def read_assignments() -> None:
        for line in proc.stdout or []:
            seen.append(json.loads(line))

    threading.Thread(target=read_assignments, daemon=True).start()
    try:
        wait_for(
            lambda: seen and len(seen[-1]) == PARTITIONS // 2,
            30,
            what=f"the doomed member to get half (its log: {doomed_log})",
        )
        wait_for(lambda: len(survivor.partitions) == 3, 30, what="the survivor to give up half")
        os.killpg(proc.pid, signal.SIGKILL)  # no leave heartbeat
        proc.wait(10)
        wait_for(
            lambda: survivor.partitions == everything,
            SESSION_MS / 1000 + 10,
            what="the survivor to get the dead member's partitions",
        )
        assert {m.client_id for m in _described(broker, group).members} == {"survivor"}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    survivor.leave()


@pytest.mark.skipif(not (KAFKA_JARS / ".pinned").exists(), reason="Kafka's jars not copied")
def test_java_console_consumer_with_the_consumer_protocol(broker: BrokerProcess) -> None:
    topic, group = "kip848-java", "kip848-java-group"
    _create(broker, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    lines = [f"line-{i}" for i in range(12)]
    for i, line in enumerate(lines):
        producer.produce(topic, value=line.encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    consumed = kafka_tool(
        "kafka-console-consumer",
        "--bootstrap-server",
        broker.bootstrap,
        "--topic",
        topic,
        "--group",
        group,
        "--from-beginning",
        "--max-messages",
        str(len(lines)),
        "--consumer-property",
        "group.protocol=consumer",
    ).stdout.split()
    assert sorted(consumed) == sorted(lines)
    described = kafka_tool(
        "kafka-consumer-groups",
        "--bootstrap-server",
        broker.bootstrap,
        "--describe",
        "--group",
        group,
    ).stdout
    rows = [line.split() for line in described.splitlines() if line.startswith(group)]
    # every partition committed at its end: no lag
    assert len(rows) == PARTITIONS and all(row[5] == "0" for row in rows), described


def _flexible_round_trip(bootstrap: str, api_key: int, version: int, request: Any) -> Any:
    """One request of a flexible version (request header v2, response header v1)."""
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.schema.response_header.v1.header import ResponseHeader
    from kio.serial import entity_reader, entity_writer

    from broker.kafka.codec import response_schema

    buf = io.BytesIO()
    header = RequestHeader(
        request_api_key=i16(api_key),
        request_api_version=i16(version),
        correlation_id=i32(7),
        client_id="raw",
    )
    entity_writer(RequestHeader)(buf, header)
    entity_writer(type(request))(buf, request)
    payload = buf.getvalue()
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _recv(sock, 4))[0]
        frame = _recv(sock, size)
    _, used = entity_reader(ResponseHeader)(frame, 0)
    response, _ = entity_reader(response_schema(api_key, version))(frame, used)
    return response


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def test_heartbeat_errors_and_describe_on_the_wire(broker: BrokerProcess) -> None:
    """What a client reads in the two APIs' answers, and the classic APIs' view of the group."""
    from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
    from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
    from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
    from kio.schema.errors import ErrorCode
    from kio.schema.types import GroupId, TopicName

    _create(broker, "wire")

    def heartbeat(**fields: Any) -> Any:
        values: dict[str, Any] = {
            "group_id": GroupId("wire-group"),
            "member_id": "m-1",
            "rebalance_timeout": i32Timedelta.parse(timedelta(seconds=30)),
            "subscribed_topic_names": (TopicName("wire"),),
            "topic_partitions": (),
            **fields,
        }
        values["member_epoch"] = i32(values.pop("member_epoch", 0))
        request = ConsumerGroupHeartbeatRequest(**values)
        return _flexible_round_trip(broker.bootstrap, 68, 1, request)

    refused = heartbeat(server_assignor="sticky")
    assert refused.error_code == ErrorCode.unsupported_assignor
    assert "uniform, range" in (refused.error_message or "")
    assert heartbeat(member_id="").error_code == ErrorCode.invalid_request

    joined = heartbeat()
    assert (joined.error_code, joined.member_id, joined.member_epoch) == (ErrorCode.none, "m-1", 1)
    assert joined.heartbeat_interval == timedelta(milliseconds=HEARTBEAT_MS)
    assert joined.assignment is not None
    assert sorted(joined.assignment.topic_partitions[0].partitions) == list(range(PARTITIONS))
    assert heartbeat(member_epoch=5).error_code == ErrorCode.fenced_member_epoch
    assert heartbeat(member_id="m-2", member_epoch=1).error_code == ErrorCode.unknown_member_id

    described = _flexible_round_trip(
        broker.bootstrap,
        69,
        1,
        ConsumerGroupDescribeRequest(
            group_ids=(GroupId("wire-group"), GroupId("no-such-group")),
            include_authorized_operations=False,
        ),
    ).groups
    assert (described[0].error_code, described[0].group_epoch) == (ErrorCode.none, 1)
    assert described[0].members[0].member_epoch == 1
    assert described[1].error_code == ErrorCode.group_id_not_found

    classic_view = _flexible_round_trip(
        broker.bootstrap,
        15,
        5,
        DescribeGroupsRequest(groups=(GroupId("wire-group"),), include_authorized_operations=False),
    ).groups[0]
    assert (classic_view.error_code, classic_view.group_state) == (ErrorCode.none, "Dead")

    left = heartbeat(member_epoch=-1, subscribed_topic_names=None, topic_partitions=None)
    assert (left.error_code, left.member_epoch) == (ErrorCode.none, -1)
