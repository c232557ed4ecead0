"""Consumer groups across clients: rebalances on join, leave and session expiry; offsets across restarts;
ListGroups / DescribeGroups."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer

from tests.support import REPO, BrokerProcess, wait_for

PARTITIONS = 4
HEARTBEAT_MS = 500
SESSION_MS = 6000


def _create(broker: BrokerProcess, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(10)


class Member(threading.Thread):
    """A group consumer polled in its own thread; ``partitions`` is its current assignment."""

    def __init__(
        self,
        make: Callable[[], Any],
        poll: Callable[[Any], None],
        assigned: Callable[[Any], set[int]],
    ) -> None:
        super().__init__(daemon=True)
        self._make, self._poll, self._assigned = make, poll, assigned
        self._partitions: frozenset[int] = frozenset()
        self._stop_event = threading.Event()
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            consumer = self._make()
            try:
                while not self._stop_event.is_set():
                    self._poll(consumer)
                    self._partitions = frozenset(self._assigned(consumer))
            finally:
                consumer.close()  # leaves the group
            self._partitions = frozenset()
        except BaseException as exc:  # noqa: BLE001 - reported to the test by .partitions / .leave()
            self.error = exc

    @property
    def partitions(self) -> frozenset[int]:
        if self.error is not None:
            raise AssertionError(f"consumer thread failed: {self.error!r}") from self.error
        return self._partitions

    def leave(self) -> None:
        self._stop_event.set()
        self.join(30)
        assert not self.is_alive(), "consumer thread did not stop"
        if self.error is not None:
            raise AssertionError(f"consumer thread failed: {self.error!r}") from self.error


def confluent_member(
    broker: BrokerProcess,
    group: str,
    topic: str,
    client_id: str,
    strategy: str = "range,roundrobin",
) -> Member:
    def make() -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": group,
                "client.id": client_id,
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "max.poll.interval.ms": 15000,
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": strategy,
            }
        )
        consumer.subscribe([topic])
        return consumer

    return Member(make, lambda c: c.poll(0.1), lambda c: {tp.partition for tp in c.assignment()})


def kafka_python_member(broker: BrokerProcess, group: str, topic: str, client_id: str) -> Member:
    def make() -> KafkaConsumer:
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            group_id=group,
            client_id=client_id,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            max_poll_interval_ms=15000,
            auto_offset_reset="earliest",
        )
        consumer.subscribe([topic])
        return consumer

    return Member(
        make, lambda c: c.poll(timeout_ms=100), lambda c: {tp.partition for tp in c.assignment()}
    )


def cooperative_member(broker: BrokerProcess, group: str, topic: str, client_id: str) -> Member:
    """librdkafka's incremental (cooperative-sticky) rebalancing over the classic protocol."""
    return confluent_member(broker, group, topic, client_id, strategy="cooperative-sticky")


MEMBER_KINDS = {
    "confluent": confluent_member,
    "confluent-cooperative": cooperative_member,
    "kafka-python": kafka_python_member,
}


@pytest.fixture
def members() -> Iterator[list[Member]]:
    """Members a test starts (append them); any still running leave at teardown."""
    started: list[Member] = []
    yield started
    for member in started:
        if member.is_alive():
            member._stop_event.set()
    for member in started:
        member.join(30)


def _split(*members: Member) -> bool:
    """Every member owns something, no partition twice, all partitions owned."""
    owned = [m.partitions for m in members]
    union = frozenset().union(*owned)
    return (
        all(owned)
        and sum(len(o) for o in owned) == len(union)
        and union == frozenset(range(PARTITIONS))
    )


@pytest.mark.parametrize("kind", list(MEMBER_KINDS))
def test_rebalance_on_join_and_leave(
    broker: BrokerProcess, members: list[Member], kind: str
) -> None:
    topic, group = f"rebalance-{kind}", f"group-{kind}"
    _create(broker, topic)
    make = MEMBER_KINDS[kind]
    everything = frozenset(range(PARTITIONS))

    first = make(broker, group, topic, "first")
    members.append(first)
    wait_for(
        lambda: first.partitions == everything, 30, what="the first member to own every partition"
    )

    second = make(broker, group, topic, "second")
    members.append(second)
    wait_for(
        lambda: _split(first, second), 30, what="the assignment to split between the two members"
    )
    assert abs(len(first.partitions) - len(second.partitions)) <= 1  # both assignors balance

    second.leave()
    wait_for(
        lambda: first.partitions == everything,
        30,
        what="the first member to own every partition again",
    )
    first.leave()


_DOOMED_MEMBER = textwrap.dedent("""
    import json, sys
    from kafka import KafkaConsumer
    bootstrap, group, topic, session_ms, heartbeat_ms = sys.argv[1:6]
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, client_id="doomed",
                             session_timeout_ms=int(session_ms), heartbeat_interval_ms=int(heartbeat_ms),
                             max_poll_interval_ms=15000)
    consumer.subscribe([topic])
    last = None
    while True:
        consumer.poll(timeout_ms=100)
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != last:
            print(json.dumps(now), flush=True)
            last = now
""")


def test_member_that_stops_heartbeating_is_removed_after_session_timeout(
    broker: BrokerProcess, members: list[Member], tmp_path: Path
) -> None:
    topic, group = "expiry", "expiry-group"
    _create(broker, topic)
    everything = frozenset(range(PARTITIONS))
    survivor = confluent_member(broker, group, topic, "survivor")
    members.append(survivor)
    wait_for(
        lambda: survivor.partitions == everything, 30, what="the survivor to own every partition"
    )

    doomed_session_ms = 3000
    doomed_log = tmp_path / "doomed-member.log"
    with open(doomed_log, "w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _DOOMED_MEMBER,
                broker.bootstrap,
                group,
                topic,
                str(doomed_session_ms),
                str(HEARTBEAT_MS),
            ],
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
            lambda: (
                seen
                and seen[-1]
                and set(seen[-1]).isdisjoint(survivor.partitions)
                and set(seen[-1]) | survivor.partitions == everything
            ),
            30,
            what=f"the doomed member to get a share of the partitions (its log: {doomed_log})",
        )
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})

        def client_ids() -> set[str]:
            described = admin.describe_consumer_groups([group])[group].result(10)
            return {m.client_id for m in described.members}

        assert client_ids() == {"survivor", "doomed"}

        os.killpg(proc.pid, signal.SIGKILL)  # no LeaveGroup, no more heartbeats
        killed_at = time.monotonic()
        proc.wait(10)
        wait_for(
            lambda: survivor.partitions == everything,
            doomed_session_ms / 1000 + 8,
            what="the survivor to get every partition back",
        )
        regained_after = time.monotonic() - killed_at
        assert client_ids() == {"survivor"}
        # the dead member was kept until its session ran out, not dropped when its connection died
        # (half the session timeout: its last heartbeat came some time before the kill)
        assert regained_after >= doomed_session_ms / 1000 / 2, regained_after
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    survivor.leave()


def test_committed_offsets_survive_broker_restart(broker: BrokerProcess) -> None:
    topic, group = "restart-offsets", "restart-group"
    _create(broker, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for p in range(PARTITIONS):
        for i in range(25):
            producer.produce(topic, value=f"{p}-{i}".encode(), partition=p)
    assert producer.flush(30) == 0

    committed = {0: 3, 1: 11, 2: 25, 3: 0}
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o, metadata=f"m{p}") for p, o in committed.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()

    def fetched() -> dict[int, tuple[int, str | None]]:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        request = [
            ConsumerGroupTopicPartitions(
                group, [TopicPartition(topic, p) for p in range(PARTITIONS)]
            )
        ]
        result = admin.list_consumer_group_offsets(request)[group].result(10)
        return {tp.partition: (tp.offset, tp.metadata) for tp in result.topic_partitions}

    before = fetched()
    assert before == {p: (o, f"m{p}") for p, o in committed.items()}

    assert broker.stop() == 0
    broker.start()

    assert fetched() == before
    # the group is known again from its offsets alone: empty, no members
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(10)
    assert (described.state, described.members) == (ConsumerGroupState.EMPTY, [])
    listed = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert group in {g["group_id"] for g in listed.list_groups()}
    finally:
        listed.close()

    # a member of the group starts at the committed offsets, not at auto.offset.reset
    resumed = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "latest",
            "enable.auto.commit": False,
        }
    )
    resumed.subscribe([topic])
    got: list[tuple[int, int]] = []
    expected = sorted((p, o) for p, start in committed.items() for o in range(start, 25))
    try:

        def poll() -> bool:
            msg = resumed.poll(0.2)
            if msg is not None and not msg.error():
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None
                got.append((partition, offset))
            return len(got) >= len(expected)

        wait_for(poll, 30, interval=0, what=f"{len(expected)} records from the committed offsets")
    finally:
        resumed.close()
    assert sorted(got) == expected


def test_list_and_describe_groups(broker: BrokerProcess, members: list[Member]) -> None:
    topic, group = "described", "described-group"
    _create(broker, topic)
    a = confluent_member(broker, group, topic, "member-a")
    b = confluent_member(broker, group, topic, "member-b")
    members.extend([a, b])
    wait_for(lambda: _split(a, b), 30, what="the assignment to split between the two members")

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listing = admin.list_consumer_groups(request_timeout=10).result()
    assert not listing.errors
    states = {g.group_id: g.state for g in listing.valid}
    assert states.get(group) == ConsumerGroupState.STABLE

    described = admin.describe_consumer_groups([group])[group].result(10)
    assert described.group_id == group and described.state == ConsumerGroupState.STABLE
    assert not described.is_simple_consumer_group
    by_client = {m.client_id: m for m in described.members}
    assert set(by_client) == {"member-a", "member-b"}
    assert len({m.member_id for m in described.members}) == 2
    # each member's assignment as the coordinator reports it is what that consumer holds
    for name, member in (("member-a", a), ("member-b", b)):
        reported = {(tp.topic, tp.partition) for tp in by_client[name].assignment.topic_partitions}
        assert reported == {(topic, p) for p in member.partitions}
    assert described.partition_assignor in ("range", "roundrobin", "cooperative-sticky")

    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert {"group_id": group, "protocol_type": "consumer"}.items() <= next(
            g for g in kp_admin.list_groups() if g["group_id"] == group
        ).items()
        kp_described = kp_admin.describe_groups([group])[group]
        assert kp_described["error"] is None and kp_described["group_state"] == "Stable"
        assert {m["member_id"] for m in kp_described["members"]} == {
            m.member_id for m in described.members
        }

        a.leave()
        b.leave()

        def emptied() -> bool:
            info = admin.describe_consumer_groups([group])[group].result(10)
            return info.state == ConsumerGroupState.EMPTY and not info.members

        wait_for(emptied, 20, what="the group to be empty after both members left")
        assert kp_admin.describe_groups([group])[group]["members"] == []
    finally:
        kp_admin.close()


def test_delete_groups_deletes_offsets_and_names_an_unknown_group(broker: BrokerProcess) -> None:
    """DeleteGroups: an empty group's committed offsets go; a group the broker never saw is
    GROUP_ID_NOT_FOUND, as Kafka answers."""
    from confluent_kafka import KafkaError, KafkaException

    topic, group = "deleted-group-topic", "to-delete"
    _create(broker, topic, 1)
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    assert [tp.offset for tp in listed[group].result(10).topic_partitions] == [7]

    admin.delete_consumer_groups([group], request_timeout=10)[group].result(10)
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    assert [tp.offset for tp in listed[group].result(10).topic_partitions] == []

    with pytest.raises(KafkaException) as unknown:
        admin.delete_consumer_groups(["never-seen"], request_timeout=10)["never-seen"].result(10)
    assert unknown.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND
