"""The KIP-848 coordinator in process (broker/kafka/consumer_groups.py): join and epochs, the
revoke-before-assign reconciliation, assignors, leave and static members, expiry, and the
errors Kafka answers with."""

from __future__ import annotations

import time
import uuid
from typing import Any, cast

import pytest
from kio.schema.errors import ErrorCode

from broker.cluster import Topic
from broker.kafka.consumer_groups import (
    Assignment,
    ConsumerGroupCoordinator,
    GroupError,
    HeartbeatRequest,
    HeartbeatResult,
)
from broker.kafka.groups import Group, GroupCoordinator, Member

TOPIC = Topic("orders", uuid.uuid4(), 4)
OTHER = Topic("payments", uuid.uuid4(), 2)


class FakeCluster:
    def __init__(self, *topics: Topic) -> None:
        self.topics = {t.name: t for t in topics}
        self.topics_by_id = {t.topic_id: t for t in topics}


@pytest.fixture
def coordinator() -> ConsumerGroupCoordinator:
    return ConsumerGroupCoordinator(
        cast(Any, FakeCluster(TOPIC, OTHER)), GroupCoordinator(), 500, 6000
    )


def beat(
    coordinator: ConsumerGroupCoordinator,
    member: str,
    epoch: int,
    owned: set[int] | None = None,
    *,
    topics: tuple[str, ...] | None = None,
    group: str = "g",
    version: int = 1,
    **fields: Any,
) -> HeartbeatResult:
    """A heartbeat as a client sends it: on joining, the subscription and no partitions."""
    joining = epoch == 0
    request = HeartbeatRequest(
        group_id=group,
        member_id=member,
        member_epoch=epoch,
        instance_id=fields.pop("instance_id", None),
        rack_id=None,
        rebalance_timeout_ms=fields.pop("rebalance_timeout_ms", 30_000 if joining else -1),
        subscribed_topic_names=topics if topics is not None else (("orders",) if joining else None),
        subscribed_topic_regex=fields.pop("regex", None),
        server_assignor=fields.pop("assignor", None),
        owned=({} if joining else None) if owned is None else _owned(owned),
        client_id=member,
        may_describe=fields.pop("may_describe", None),
    )
    assert not fields, fields
    return coordinator.heartbeat(request, version)


def _owned(partitions: set[int]) -> Assignment:
    return {TOPIC.topic_id: frozenset(partitions)} if partitions else {}


def parts(result: HeartbeatResult) -> set[int] | None:
    if result.assignment is None:
        return None
    return set(result.assignment.get(TOPIC.topic_id, frozenset()))


def error_of(call: Any) -> int:
    with pytest.raises(GroupError) as raised:
        call()
    return raised.value.code


def test_join_gets_everything_and_the_group_epoch(coordinator: ConsumerGroupCoordinator) -> None:
    joined = beat(coordinator, "a", 0)
    assert (joined.member_id, joined.member_epoch, parts(joined)) == ("a", 1, {0, 1, 2, 3})
    # a steady heartbeat: same epoch, no assignment repeated
    again = beat(coordinator, "a", 1, {0, 1, 2, 3})
    assert (again.member_epoch, again.assignment) == (1, None)
    assert coordinator.describe("g")["group_state"] == "Stable"


def test_v0_broker_names_the_member(coordinator: ConsumerGroupCoordinator) -> None:
    joined = beat(coordinator, "", 0, version=0)
    assert joined.member_id and joined.member_epoch == 1
    assert error_of(lambda: beat(coordinator, "", 0, version=1)) == ErrorCode.invalid_request


def test_a_partition_moves_only_once_its_owner_revoked_it(
    coordinator: ConsumerGroupCoordinator,
) -> None:
    beat(coordinator, "a", 0)
    b = beat(coordinator, "b", 0)
    # b is at the new epoch but gets nothing while a still holds everything
    assert (b.member_epoch, parts(b)) == (2, set())
    assert coordinator.describe("g")["group_state"] == "Reconciling"
    # a is asked to give up two partitions and stays in epoch 1 until it did
    a = beat(coordinator, "a", 1, {0, 1, 2, 3})
    kept = parts(a)
    assert a.member_epoch == 1 and kept is not None and len(kept) == 2
    assert parts(beat(coordinator, "b", 2, set())) in (None, set())
    a = beat(coordinator, "a", 1, {0, 1, 2, 3})  # not revoked yet: still waiting
    assert a.member_epoch == 1
    a = beat(coordinator, "a", 1, kept)
    assert a.member_epoch == 2
    b = beat(coordinator, "b", 2, set())
    assert parts(b) == {0, 1, 2, 3} - kept
    beat(coordinator, "b", 2, parts(b))
    assert coordinator.describe("g")["group_state"] == "Stable"


def test_a_third_member_rebalances_without_a_partition_held_twice(
    coordinator: ConsumerGroupCoordinator,
) -> None:
    owned: dict[str, set[int]] = {}
    epochs: dict[str, int] = {}

    def step(member: str) -> None:
        result = beat(coordinator, member, epochs.get(member, 0), owned.get(member, set()))
        epochs[member] = result.member_epoch
        if result.assignment is not None:
            owned[member] = parts(result) or set()
        held = [p for ps in owned.values() for p in ps]
        assert len(held) == len(set(held)), owned

    for member in ("a", "b", "a", "b", "c", "a", "b", "c", "a", "b", "c"):
        step(member)
    assert sorted(len(ps) for ps in owned.values()) == [1, 1, 2]
    assert set().union(*owned.values()) == {0, 1, 2, 3}


def test_range_assignor_and_unsupported_assignor(coordinator: ConsumerGroupCoordinator) -> None:
    beat(coordinator, "a", 0, assignor="range")
    beat(coordinator, "b", 0, assignor="range")
    described = coordinator.describe("g")
    assert described["assignor_name"] == "range"
    targets = {
        m["member_id"]: m["target_assignment"]["topic_partitions"][0]["partitions"]
        for m in described["members"]
    }
    assert targets == {"a": [0, 1], "b": [2, 3]}
    assert (
        error_of(lambda: beat(coordinator, "c", 0, assignor="sticky"))
        == ErrorCode.unsupported_assignor
    )


def test_regex_subscription(coordinator: ConsumerGroupCoordinator) -> None:
    joined = beat(coordinator, "a", 0, topics=(), regex="pay.*")
    assert joined.assignment == {OTHER.topic_id: frozenset({0, 1})}
    bad = lambda: beat(coordinator, "b", 0, topics=(), regex="(")  # noqa: E731
    assert error_of(bad) == ErrorCode.invalid_regular_expression
    # with an authorizer, a regex takes only the topics the member may DESCRIBE
    hidden = beat(
        coordinator, "c", 0, topics=(), regex=".*", group="acl", may_describe="orders".__eq__
    )
    assert hidden.assignment == {TOPIC.topic_id: frozenset({0, 1, 2, 3})}


def test_epoch_and_member_errors(coordinator: ConsumerGroupCoordinator) -> None:
    beat(coordinator, "a", 0)
    assert error_of(lambda: beat(coordinator, "nobody", 1, set())) == ErrorCode.unknown_member_id
    assert error_of(lambda: beat(coordinator, "a", 7, set())) == ErrorCode.fenced_member_epoch
    joining_with_partitions = lambda: beat(coordinator, "b", 0, {1})  # noqa: E731
    assert error_of(joining_with_partitions) == ErrorCode.invalid_request
    assert error_of(lambda: beat(coordinator, "a", -3, set())) == ErrorCode.invalid_request
    # a restarted broker has no group: the member is told to rejoin
    unknown_group = lambda: beat(coordinator, "a", 3, set(), group="forgotten")  # noqa: E731
    assert error_of(unknown_group) == ErrorCode.unknown_member_id
    leave_unknown = lambda: beat(coordinator, "a", -1, group="forgotten")  # noqa: E731
    assert error_of(leave_unknown) == ErrorCode.group_id_not_found


def test_a_classic_group_with_members_is_not_a_consumer_group(
    coordinator: ConsumerGroupCoordinator,
) -> None:
    classic = coordinator.classic.group("classic")
    classic.members["m"] = Member("m", None, "c", "h", 10_000, 10_000, [])
    joining = lambda: beat(coordinator, "a", 0, group="classic")  # noqa: E731
    assert error_of(joining) == ErrorCode.group_id_not_found
    # an empty classic group is converted
    coordinator.classic.groups["empty"] = Group("empty")
    assert beat(coordinator, "a", 0, group="empty").member_epoch == 1
    assert "empty" not in coordinator.classic.groups
    assert coordinator.describe("classic")["error_code"] == ErrorCode.group_id_not_found
    # and a JoinGroup to a consumer group with members is refused
    assert not coordinator.take_over_for_classic("empty")


def test_leave_frees_partitions(coordinator: ConsumerGroupCoordinator) -> None:
    beat(coordinator, "a", 0)
    b = beat(coordinator, "b", 0)
    left = beat(coordinator, "a", -1)
    assert left.member_epoch == -1
    b = beat(coordinator, "b", b.member_epoch, set())
    assert parts(b) == {0, 1, 2, 3}
    assert error_of(lambda: beat(coordinator, "a", -1)) == ErrorCode.unknown_member_id


def test_static_member_leaves_and_its_instance_takes_its_partitions_back(
    coordinator: ConsumerGroupCoordinator,
) -> None:
    first = beat(coordinator, "a1", 0, instance_id="host-a")
    beat(coordinator, "a1", first.member_epoch, {0, 1, 2, 3}, instance_id="host-a")
    assert beat(coordinator, "a1", -2, instance_id="host-a").member_epoch == -2
    epoch = coordinator.groups["g"].group_epoch
    again = beat(coordinator, "a2", 0, instance_id="host-a")
    # the same partitions, no rebalance
    assert parts(again) == {0, 1, 2, 3}
    assert coordinator.groups["g"].group_epoch == epoch
    taken = lambda: beat(coordinator, "a3", 0, instance_id="host-a")  # noqa: E731
    assert error_of(taken) == ErrorCode.unreleased_instance_id


def test_a_silent_member_expires_and_its_partitions_move(
    coordinator: ConsumerGroupCoordinator,
) -> None:
    a = beat(coordinator, "a", 0)
    beat(coordinator, "a", a.member_epoch, {0, 1, 2, 3})
    b = beat(coordinator, "b", 0)
    coordinator.groups["g"].members["b"].last_seen = time.monotonic()
    coordinator.expire(time.monotonic() + 5)  # within the 6 s session
    assert set(coordinator.groups["g"].members) == {"a", "b"}
    coordinator.groups["g"].members["b"].last_seen = time.monotonic() + 10
    coordinator.expire(time.monotonic() + 6.5)  # a is past its session, b is not
    assert set(coordinator.groups["g"].members) == {"b"}
    assert parts(beat(coordinator, "b", b.member_epoch, set())) == {0, 1, 2, 3}


def test_offset_commit_and_fetch_check_the_member_epoch(
    coordinator: ConsumerGroupCoordinator,
) -> None:
    a = beat(coordinator, "a", 0)
    epoch = a.member_epoch
    assert coordinator.validate_offset_commit("g", "a", epoch, 9) == ErrorCode.none
    # OffsetCommit before v9 cannot carry a member epoch; TxnOffsetCommit of any version can
    assert coordinator.validate_offset_commit("g", "a", epoch, 8) == ErrorCode.unsupported_version
    assert coordinator.validate_offset_commit("g", "a", epoch, 3, transactional=True) == 0
    beat(coordinator, "b", 0)
    beat(coordinator, "a", epoch, {0, 1, 2, 3})
    beat(coordinator, "a", epoch, set())  # revoked: a moves to the new epoch
    assert coordinator.validate_offset_commit("g", "a", epoch, 9) == ErrorCode.stale_member_epoch
    assert coordinator.validate_offset_commit("g", "a", 99, 9) == ErrorCode.fenced_member_epoch
    assert coordinator.validate_offset_commit("g", "x", epoch, 9) == ErrorCode.unknown_member_id
    assert coordinator.validate_offset_commit("g", "", -1, 9) == ErrorCode.unknown_member_id
    assert coordinator.validate_offset_fetch("g", None, -1) == ErrorCode.none
    assert coordinator.validate_offset_fetch("g", "a", epoch) == ErrorCode.stale_member_epoch
