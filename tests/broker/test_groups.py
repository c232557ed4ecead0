"""Consumer groups across clients: rebalances on join, leave and session expiry; offsets across restarts;
ListGroups / DescribeGroups; static membership (KIP-345); which OffsetCommits a group takes in which
state, as Kafka's classic coordinator decides."""

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
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import ConsumerRebalanceListener, KafkaAdminClient, KafkaConsumer
from kafka.errors import FencedInstanceIdError

from tests.broker import rawkafka
from tests.support import REPO, BrokerProcess, wait_for

PARTITIONS = 4
HEARTBEAT_MS = 500
SESSION_MS = 6000


def _create(broker: BrokerProcess, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(10)


class Member(threading.Thread):
    """A group consumer polled in its own thread; ``partitions`` is its current assignment,
    ``rebalances`` how many assignments its client has been handed (one per rebalance it took
    part in), ``fatal`` the fatal error its client reported, if any."""

    def __init__(
        self,
        make: Callable[[Member], Any],
        poll: Callable[[Member, Any], None],
        assigned: Callable[[Any], set[int]],
    ) -> None:
        super().__init__(daemon=True)
        self._make, self._poll, self._assigned = make, poll, assigned
        self._partitions: frozenset[int] = frozenset()
        self._stop_event = threading.Event()
        self.error: BaseException | None = None
        self.rebalances = 0
        self.fatal: str | None = None
        self.start()

    def assigned(self) -> None:
        self.rebalances += 1

    def run(self) -> None:
        try:
            consumer = self._make(self)
            try:
                while not self._stop_event.is_set() and self.fatal is None:
                    self._poll(self, consumer)
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
    instance_id: str | None = None,
) -> Member:
    def make(member: Member) -> Consumer:
        config: dict[str, Any] = {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "client.id": client_id,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "max.poll.interval.ms": 15000,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": strategy,
        }
        if instance_id is not None:
            config["group.instance.id"] = instance_id
        consumer = Consumer(config)
        consumer.subscribe([topic], on_assign=lambda *_: member.assigned())
        return consumer

    def poll(member: Member, consumer: Consumer) -> None:
        msg = consumer.poll(0.1)
        error = msg.error() if msg is not None else None
        if error is not None and error.code() == KafkaError._FATAL:  # a fenced instance id, say
            member.fatal = str(error)

    return Member(make, poll, lambda c: {tp.partition for tp in c.assignment()})


class _Counted(ConsumerRebalanceListener):
    def __init__(self, member: Member) -> None:
        self.member = member

    def on_partitions_revoked(self, revoked: Any) -> None:
        pass

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.member.assigned()


def kafka_python_member(
    broker: BrokerProcess,
    group: str,
    topic: str,
    client_id: str,
    instance_id: str | None = None,
) -> Member:
    def make(member: Member) -> KafkaConsumer:
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            group_id=group,
            client_id=client_id,
            group_instance_id=instance_id,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            max_poll_interval_ms=15000,
            auto_offset_reset="earliest",
        )
        consumer.subscribe([topic], listener=_Counted(member))
        return consumer

    def poll(member: Member, consumer: KafkaConsumer) -> None:
        try:
            consumer.poll(timeout_ms=100)
        except FencedInstanceIdError as exc:
            member.fatal = repr(exc)

    return Member(make, poll, lambda c: {tp.partition for tp in c.assignment()})


def cooperative_member(
    broker: BrokerProcess, group: str, topic: str, client_id: str, instance_id: str | None = None
) -> Member:
    """librdkafka's incremental (cooperative-sticky) rebalancing over the classic protocol."""
    return confluent_member(
        broker, group, topic, client_id, strategy="cooperative-sticky", instance_id=instance_id
    )


MEMBER_KINDS: dict[str, Callable[..., Member]] = {
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
    from confluent_kafka import KafkaException

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


# ---------------------------------------------------------------- static membership (KIP-345)

STATIC_KINDS: dict[str, Callable[..., Member]] = {
    "confluent": confluent_member,
    "kafka-python": kafka_python_member,
}


def _described(broker: BrokerProcess, group: str) -> dict[str | None, str]:
    """Instance id (None for a dynamic member) -> member id, as DescribeGroups reports them."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(10)
    return {m.group_instance_id: m.member_id for m in described.members}


@pytest.mark.parametrize("kind", list(STATIC_KINDS))
def test_restarted_static_member_gets_its_assignment_back_without_a_rebalance(
    broker: BrokerProcess, members: list[Member], kind: str
) -> None:
    topic = group = f"static-restart-{kind}"
    _create(broker, topic)
    make = STATIC_KINDS[kind]
    everything = frozenset(range(PARTITIONS))
    other = make(broker, group, topic, "other")  # a dynamic member beside it
    members.append(other)
    wait_for(lambda: other.partitions == everything, 30, what="the first member to own everything")
    static = make(broker, group, topic, "static", instance_id="static-1")
    members.append(static)
    wait_for(lambda: _split(other, static), 30, what="the assignment to split between the two")
    owned, before, rebalances = static.partitions, _described(broker, group), other.rebalances
    assert set(before) == {None, "static-1"}

    static.leave()  # a static member closes without a LeaveGroup: the group keeps it
    assert _described(broker, group) == before
    restarted = make(broker, group, topic, "static", instance_id="static-1")
    members.append(restarted)
    wait_for(
        lambda: restarted.partitions == owned, 30, what="the restarted member to own its partitions"
    )
    after = _described(broker, group)
    assert after[None] == before[None]
    assert after["static-1"] != before["static-1"]  # the new member id replaced the old one
    # no rebalance: the other member was not handed a new assignment and kept its own
    assert other.rebalances == rebalances
    assert other.partitions == everything - owned
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert admin.describe_consumer_groups([group])[group].result(10).state == (
        ConsumerGroupState.STABLE
    )


def test_static_member_that_stops_is_removed_when_its_session_times_out(
    broker: BrokerProcess, members: list[Member]
) -> None:
    topic = group = "static-expiry"
    _create(broker, topic)
    everything = frozenset(range(PARTITIONS))
    other = confluent_member(broker, group, topic, "other")
    static = confluent_member(broker, group, topic, "static", instance_id="static-2")
    members.extend([other, static])
    wait_for(lambda: _split(other, static), 30, what="the assignment to split between the two")

    static.leave()  # no LeaveGroup: only its session timeout removes it
    stopped_at = time.monotonic()
    assert set(_described(broker, group)) == {None, "static-2"}
    wait_for(
        lambda: other.partitions == everything,
        SESSION_MS / 1000 + 8,
        what="the other member to get every partition once the static member's session ran out",
    )
    assert time.monotonic() - stopped_at >= SESSION_MS / 1000 / 2
    assert set(_described(broker, group)) == {None}


def test_leave_group_naming_an_instance_id_removes_that_static_member(
    broker: BrokerProcess, members: list[Member]
) -> None:
    """What an admin's ``removeMembersFromConsumerGroup`` sends: LeaveGroup v3+ by instance id."""
    from kio.schema.errors import ErrorCode

    topic = group = "static-removed"
    _create(broker, topic)
    everything = frozenset(range(PARTITIONS))
    other = confluent_member(broker, group, topic, "other")
    static = confluent_member(broker, group, topic, "static", instance_id="static-3")
    members.extend([other, static])
    wait_for(lambda: _split(other, static), 30, what="the assignment to split between the two")
    static.leave()
    member_id = _described(broker, group)["static-3"]

    assert rawkafka.leave_group(broker.bootstrap, group, [("", "no-such-instance")]) == [
        ErrorCode.unknown_member_id
    ]
    assert rawkafka.leave_group(broker.bootstrap, group, [("not-its-member-id", "static-3")]) == [
        ErrorCode.fenced_instance_id
    ]
    assert rawkafka.leave_group(broker.bootstrap, group, [("", "static-3")]) == [ErrorCode.none]
    assert set(_described(broker, group)) == {None}  # at once, not at its session's end
    assert rawkafka.leave_group(broker.bootstrap, group, [(member_id, "static-3")]) == [
        ErrorCode.unknown_member_id
    ]
    wait_for(
        lambda: other.partitions == everything, 30, what="the other member to get every partition"
    )


@pytest.mark.parametrize("kind", list(STATIC_KINDS))
def test_second_member_with_an_instance_id_in_use_fences_the_first(
    broker: BrokerProcess, members: list[Member], kind: str
) -> None:
    topic = group = f"static-fenced-{kind}"
    _create(broker, topic)
    make = STATIC_KINDS[kind]
    everything = frozenset(range(PARTITIONS))
    first = make(broker, group, topic, "first", instance_id="twice")
    members.append(first)
    wait_for(lambda: first.partitions == everything, 30, what="the first member to own everything")
    first_id = _described(broker, group)["twice"]

    second = make(broker, group, topic, "second", instance_id="twice")
    members.append(second)
    wait_for(lambda: second.partitions == everything, 30, what="the second member to take over")
    wait_for(lambda: first.fatal, 30, what="the first member's client to report it was fenced")
    assert "fenced" in (first.fatal or "").lower(), first.fatal
    described = _described(broker, group)
    assert set(described) == {"twice"} and described["twice"] != first_id


def test_static_member_fencing_answers_every_group_request(broker: BrokerProcess) -> None:
    """A static member rejoining under a new member id takes the old one's place in the
    current generation; the old id is fenced in Heartbeat, SyncGroup, OffsetCommit, JoinGroup
    and LeaveGroup. A JoinGroup v9 leader is told to skip the assignment (KIP-814)."""
    from kio.schema.errors import ErrorCode

    topic = group = "static-raw"
    _create(broker, topic, 1)
    bootstrap = broker.bootstrap
    first = rawkafka.join_group(bootstrap, group, (topic,), instance_id="i")
    assert (first.error, first.leader, first.members) == (0, first.member_id, [first.member_id])
    assert rawkafka.sync_group(
        bootstrap, group, first.generation, first.member_id, "i", {first.member_id: b"its share"}
    ) == (0, b"its share")

    second = rawkafka.join_group(bootstrap, group, (topic,), instance_id="i")
    assert second.error == 0 and second.member_id != first.member_id
    # the same generation, and (before v9) the old leader id, so it does not assign
    assert (second.generation, second.leader, second.members) == (
        first.generation,
        first.member_id,
        [],
    )
    assert rawkafka.sync_group(bootstrap, group, second.generation, second.member_id, "i") == (
        0,
        b"its share",
    )
    fenced = ErrorCode.fenced_instance_id
    generation, old = first.generation, first.member_id
    assert rawkafka.heartbeat(bootstrap, group, generation, old, "i") == fenced
    assert rawkafka.sync_group(bootstrap, group, generation, old, "i")[0] == fenced
    assert rawkafka.commit_offset(bootstrap, group, generation, old, topic, 1, "i") == fenced
    assert rawkafka.join_group(bootstrap, group, (topic,), old, "i").error == fenced
    assert rawkafka.leave_group(bootstrap, group, [(old, "i")]) == [fenced]
    assert rawkafka.heartbeat(bootstrap, group, generation, second.member_id, "i") == 0
    assert (
        rawkafka.commit_offset(bootstrap, group, generation, second.member_id, topic, 1, "i") == 0
    )

    third = rawkafka.join_group(bootstrap, group, (topic,), instance_id="i", version=9)
    assert (third.error, third.generation, third.leader) == (0, generation, third.member_id)
    assert third.skip_assignment and third.members == [third.member_id]
    assert rawkafka.sync_group(bootstrap, group, generation, third.member_id, "i") == (
        0,
        b"its share",
    )
    assert rawkafka.heartbeat(bootstrap, group, generation, second.member_id, "i") == fenced
    assert rawkafka.leave_group(bootstrap, group, [(third.member_id, "i")]) == [0]
    assert rawkafka.heartbeat(bootstrap, group, generation, third.member_id, "i") == (
        ErrorCode.unknown_member_id
    )


def test_rebalance_keeps_a_static_member_that_has_not_rejoined(broker: BrokerProcess) -> None:
    """A rebalance drops the dynamic members that did not rejoin in time, not a static one
    (only its session timeout does): the leader still assigns it a share, which it takes back
    when it returns under a new member id, with no further rebalance."""
    topic = group = "static-kept"
    _create(broker, topic, 1)
    bootstrap, rebalance_ms = broker.bootstrap, 1500
    static = rawkafka.join_group(
        bootstrap, group, (topic,), instance_id="s", rebalance_ms=rebalance_ms
    )
    shares = {static.member_id: b"static share"}
    assert (
        rawkafka.sync_group(bootstrap, group, static.generation, static.member_id, "s", shares)[0]
        == 0
    )
    dynamic = rawkafka.join_group(bootstrap, group, (topic,), rebalance_ms=rebalance_ms)
    # the static member did not rejoin within the rebalance timeout: the dynamic one leads
    assert dynamic.error == 0 and dynamic.generation == static.generation + 1
    assert dynamic.leader == dynamic.member_id
    assert sorted(dynamic.members) == sorted([static.member_id, dynamic.member_id])
    shares = {static.member_id: b"static share 2", dynamic.member_id: b"dynamic share"}
    assert rawkafka.sync_group(
        bootstrap, group, dynamic.generation, dynamic.member_id, None, shares
    ) == (0, b"dynamic share")

    back = rawkafka.join_group(
        bootstrap, group, (topic,), instance_id="s", rebalance_ms=rebalance_ms
    )
    assert (back.error, back.generation) == (0, dynamic.generation)
    assert rawkafka.sync_group(bootstrap, group, back.generation, back.member_id, "s") == (
        0,
        b"static share 2",
    )
    assert rawkafka.heartbeat(bootstrap, group, dynamic.generation, dynamic.member_id) == 0


def test_static_member_rejoining_with_other_topics_rebalances(broker: BrokerProcess) -> None:
    """Kafka lets a static member back into a Stable group without a rebalance whenever the
    protocol stays; here a changed subscription also rebalances, so the member is not left
    with an assignment for the topics it had."""
    topic = group = "static-resubscribed"
    _create(broker, topic, 1)
    _create(broker, "static-resubscribed-2", 1)
    bootstrap = broker.bootstrap
    first = rawkafka.join_group(bootstrap, group, (topic,), instance_id="r")
    assert rawkafka.sync_group(bootstrap, group, first.generation, first.member_id, "r")[0] == 0
    again = rawkafka.join_group(bootstrap, group, (topic, "static-resubscribed-2"), instance_id="r")
    assert again.error == 0 and again.generation == first.generation + 1
    assert (again.leader, again.members) == (again.member_id, [again.member_id])


# ---------------------------------------------------------------- OffsetCommit and group states


def test_offset_commit_in_each_group_state_as_kafka_answers(broker: BrokerProcess) -> None:
    """Kafka's classic ``validateOffsetCommit``: a simple commit (generation -1, no member id)
    only into an empty group; a member's commit from a current member of the current
    generation, also while the group prepares a rebalance, but REBALANCE_IN_PROGRESS while it
    completes one (the member has a new generation and no assignment yet)."""
    from kio.schema.errors import ErrorCode

    topic = group = "commit-states"
    _create(broker, topic, 1)
    bootstrap = broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def state() -> ConsumerGroupState:
        return admin.describe_consumer_groups([group])[group].result(10).state

    def committed() -> int:
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]
        (tp,) = admin.list_consumer_group_offsets(request)[group].result(10).topic_partitions
        return tp.offset

    def commit(generation: int, member_id: str, offset: int) -> int:
        return rawkafka.commit_offset(bootstrap, group, generation, member_id, topic, offset)

    assert commit(-1, "", 1) == ErrorCode.none  # a group nobody joined takes a simple commit
    a = rawkafka.join_group(bootstrap, group, (topic,))
    assert a.error == 0 and a.leader == a.member_id
    assert rawkafka.sync_group(bootstrap, group, a.generation, a.member_id, None, {}) == (0, b"")
    assert state() == ConsumerGroupState.STABLE

    assert commit(-1, "", 2) == ErrorCode.unknown_member_id  # not into a group with members
    assert commit(a.generation, "not-a-member", 2) == ErrorCode.unknown_member_id
    assert commit(a.generation + 1, a.member_id, 2) == ErrorCode.illegal_generation
    assert commit(a.generation, a.member_id, 2) == ErrorCode.none
    assert committed() == 2

    joined: list[rawkafka.Joined] = []
    joiner = threading.Thread(
        target=lambda: joined.append(rawkafka.join_group(bootstrap, group, (topic,))), daemon=True
    )
    joiner.start()  # its JoinGroup waits for the first member to rejoin
    wait_for(lambda: state() == ConsumerGroupState.PREPARING_REBALANCING, 10, what="a rebalance")
    assert commit(a.generation, a.member_id, 3) == ErrorCode.none
    assert committed() == 3
    assert commit(-1, "", 4) == ErrorCode.unknown_member_id

    rejoined = rawkafka.join_group(bootstrap, group, (topic,), a.member_id)
    assert rejoined.error == 0 and rejoined.generation == a.generation + 1
    joiner.join(10)
    (b,) = joined
    assert b.error == 0 and b.generation == rejoined.generation
    assert state() == ConsumerGroupState.COMPLETING_REBALANCING
    assert commit(rejoined.generation, a.member_id, 4) == ErrorCode.rebalance_in_progress
    assert commit(a.generation, a.member_id, 4) == ErrorCode.illegal_generation

    leader = rejoined if rejoined.leader == a.member_id else b
    assert rawkafka.sync_group(bootstrap, group, leader.generation, leader.member_id)[0] == 0
    assert commit(b.generation, b.member_id, 5) == ErrorCode.none
    assert committed() == 5

    assert rawkafka.leave_group(bootstrap, group, [(a.member_id, None), (b.member_id, None)]) == [
        0,
        0,
    ]
    wait_for(lambda: state() == ConsumerGroupState.EMPTY, 10, what="the group to be empty")
    assert commit(-1, "", 6) == ErrorCode.none
    assert committed() == 6
