"""The KIP-848 consumer group protocol: ConsumerGroupHeartbeat (API 68) and
ConsumerGroupDescribe (API 69).

Why: Kafka 4 clients offer ``group.protocol=consumer`` (the Java consumer, librdkafka 2.x),
where the broker, not a leader member, computes the assignment and each member moves to it
partition by partition through its heartbeats: no stop-the-world JoinGroup/SyncGroup
rebalance.

What is served, as Kafka's group coordinator does it:

- a heartbeat with member epoch 0 joins (v0: the broker names the member; v1: the client
  does); any change of the members, their subscriptions (topic names or a regex, matched
  with RE2, linear time, against the topic names), their server assignor or the subscribed
  topics' partitions bumps the group epoch, and the next heartbeat computes the target
  assignment of that epoch with the ``uniform`` (default) or ``range`` assignor;
- each member reconciles to its target as KIP-848's current-assignment builder does: it
  first revokes what it must give up (it stays in its epoch until a heartbeat no longer
  lists those partitions), then gets what is free, and moves to the target epoch; a
  partition still held by another member is given only once that member released it;
- member epoch -1 leaves; -2 is a static member's temporary leave (its instance id may
  rejoin and take over its assignment within the session timeout);
- a member silent for ``group.consumer.session.timeout.ms`` (45 s) is removed, and one that
  does not revoke within its rebalance timeout is fenced; heartbeats answer
  ``group.consumer.heartbeat.interval.ms`` (5 s);
- errors: UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, UNSUPPORTED_ASSIGNOR, INVALID_REQUEST,
  INVALID_REGULAR_EXPRESSION, UNRELEASED_INSTANCE_ID, FENCED_INSTANCE_ID, GROUP_ID_NOT_FOUND;
  OffsetCommit (v9+) and OffsetFetch (v9) of a member check its epoch (STALE_MEMBER_EPOCH).

A group id is either a classic group (broker.kafka.groups) or a consumer group: an empty one of
either kind is converted on first use by the other protocol, as Kafka does; a classic group
with members refuses consumer heartbeats (GROUP_ID_NOT_FOUND) and a consumer group with
members refuses JoinGroup (INCONSISTENT_GROUP_PROTOCOL).

Not served: classic-protocol members inside a consumer group and the online upgrade of a
classic group with members (Kafka 4 can mix both), client-side assignors, rack-aware
assignment, group configs (``consumer.session.timeout.ms`` per group). Groups live in memory
like the classic ones: after a broker restart a member's heartbeat gets UNKNOWN_MEMBER_ID (not
Kafka's GROUP_ID_NOT_FOUND, which Kafka's persisted groups never need here) so it rejoins.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import re2
from kio.schema.errors import ErrorCode

from broker.cluster import Cluster
from broker.kafka.acl_apis import AclApis, denied_message
from broker.kafka.authorizer import ResourceType
from broker.kafka.codec import Responder, ms
from broker.kafka.groups import GroupCoordinator

log = logging.getLogger(__name__)

LEAVE_EPOCH, STATIC_LEAVE_EPOCH = -1, -2
ASSIGNORS = ("uniform", "range")  # the first is the default, as Kafka's group.consumer.assignors
EMPTY, ASSIGNING, RECONCILING, STABLE, DEAD = (
    "Empty",
    "Assigning",
    "Reconciling",
    "Stable",
    "Dead",
)
# a member's reconciliation state (Kafka's MemberState)
M_STABLE, M_UNREVOKED, M_UNRELEASED = "stable", "unrevoked_partitions", "unreleased_partitions"
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)

Assignment = dict[uuid.UUID, frozenset[int]]


class GroupError(Exception):
    """A heartbeat answered with an error code and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> Any:
    """A subscription's topic regex, compiled once, with RE2 (as Kafka's RE2/J): matching takes
    linear time whatever the client sends, so no pattern can stall the event loop."""
    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options)


@dataclass
class ConsumerMember:
    member_id: str
    client_id: str = ""
    client_host: str = ""
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = 300_000
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: str = M_STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    last_seen: float = field(default_factory=time.monotonic)
    revoke_deadline: float | None = None
    may_describe: Callable[[str], bool] | None = field(default=None, repr=False, compare=False)


@dataclass
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    # the subscribed topics as the last epoch saw them: name -> (id, partitions)
    topics_seen: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state != M_STABLE:
                return RECONCILING
        return STABLE

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def assignor(self) -> str:
        """The server assignor most members ask for, else the default (as Kafka picks it)."""
        votes: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if not votes:
            return ASSIGNORS[0]
        return max(sorted(votes), key=lambda name: votes[name])

    def partition_owner(self, topic_id: uuid.UUID, partition: int) -> str | None:
        """The member holding a partition (assigned to it or still to be revoked by it)."""
        for m in self.members.values():
            if partition in m.assigned.get(topic_id, ()) or partition in m.pending_revocation.get(
                topic_id, ()
            ):
                return m.member_id
        return None


# ---------------------------------------------------------------- assignors


def _uniform(
    subscriptions: dict[str, set[str]],
    partitions: dict[str, int],
    previous: dict[str, set[tuple[str, int]]],
) -> dict[str, set[tuple[str, int]]]:
    """Balanced (member loads differ by one at most where subscriptions allow) and sticky:
    what a member had in the previous target stays with it unless balance needs it elsewhere."""
    result: dict[str, set[tuple[str, int]]] = {m: set() for m in subscriptions}
    owner: dict[tuple[str, int], str] = {}
    for member, owned in sorted(previous.items()):
        for tp in sorted(owned):
            topic, p = tp
            still_valid = (
                member in result and topic in subscriptions[member] and p < partitions.get(topic, 0)
            )
            if still_valid and tp not in owner:
                owner[tp] = member
                result[member].add(tp)
    everything = [(t, p) for t in sorted(partitions) for p in range(partitions[t])]
    candidates = {
        t: sorted(m for m, subs in subscriptions.items() if t in subs) for t in partitions
    }
    for tp in everything:
        if tp in owner or not candidates[tp[0]]:
            continue
        member = min(candidates[tp[0]], key=lambda m: (len(result[m]), m))
        owner[tp] = member
        result[member].add(tp)
    _balance(result, candidates)
    return result


def _balance(result: dict[str, set[tuple[str, int]]], candidates: dict[str, list[str]]) -> None:
    """Move partitions from the most to the least loaded members allowed to take them, until
    no move narrows a gap of two or more (each move lowers the sum of squared loads)."""
    moved = True
    while moved:
        moved = False
        for giver in sorted(result, key=lambda m: (-len(result[m]), m)):
            for tp in sorted(result[giver]):
                taker = min(candidates[tp[0]], key=lambda m: (len(result[m]), m))
                if len(result[giver]) - len(result[taker]) >= 2:
                    result[giver].discard(tp)
                    result[taker].add(tp)
                    moved = True
                    break
            if moved:
                break


def _range(
    subscriptions: dict[str, set[str]],
    partitions: dict[str, int],
    previous: dict[str, set[tuple[str, int]]],
) -> dict[str, set[tuple[str, int]]]:
    """Per topic, contiguous ranges to the subscribed members in member id order, the first
    ones taking one more when the partitions do not divide evenly (as the range assignor)."""
    result: dict[str, set[tuple[str, int]]] = {m: set() for m in subscriptions}
    for topic in sorted(partitions):
        members = sorted(m for m, subs in subscriptions.items() if topic in subs)
        if not members:
            continue
        share, extra = divmod(partitions[topic], len(members))
        start = 0
        for i, member in enumerate(members):
            count = share + (1 if i < extra else 0)
            result[member].update((topic, p) for p in range(start, start + count))
            start += count
    return result


ASSIGNOR_FUNCTIONS = {"uniform": _uniform, "range": _range}


# ---------------------------------------------------------------- reconciliation


def _union(a: Assignment, b: Assignment) -> Assignment:
    out = dict(a)
    for t, ps in b.items():
        out[t] = out.get(t, frozenset()) | ps
    return {t: ps for t, ps in out.items() if ps}


def _owns_any(owned: Assignment | None, partitions: Assignment) -> bool:
    """Whether the member still owns any of ``partitions`` (unknown: it does, as Kafka)."""
    if owned is None:
        return True
    return any(owned.get(t, frozenset()) & ps for t, ps in partitions.items())


def _is_subset(owned: Assignment | None, assigned: Assignment) -> bool:
    if owned is None:
        return False
    return all(ps <= assigned.get(t, frozenset()) for t, ps in owned.items())


def _next_assignment(
    group: ConsumerGroup, member: ConsumerMember, owned: Assignment | None
) -> None:
    """Kafka's CurrentAssignmentBuilder.computeNextAssignment: revoke first (staying in the
    epoch), else take what is free and move to the target epoch."""
    target = group.target.get(member.member_id, {})
    kept: Assignment = {}
    revoke: Assignment = {}
    to_assign: Assignment = {}
    unreleased = False
    for topic in set(target) | set(member.assigned):
        want = target.get(topic, frozenset())
        have = member.assigned.get(topic, frozenset())
        if have & want:
            kept[topic] = have & want
        if have - want:
            revoke[topic] = have - want
        free = set()
        for p in want - have:
            holder = group.partition_owner(topic, p)
            if holder is None or (
                holder == member.member_id and p in member.pending_revocation.get(topic, ())
            ):
                free.add(p)
            else:
                unreleased = True
        if free:
            to_assign[topic] = frozenset(free)
    if revoke and _owns_any(owned, revoke):
        member.state = M_UNREVOKED
        member.assigned = kept
        member.pending_revocation = revoke
        member.revoke_deadline = time.monotonic() + member.rebalance_timeout_ms / 1000
        return
    member.assigned = _union(kept, to_assign)
    member.pending_revocation = {}
    member.revoke_deadline = None
    member.state = M_UNRELEASED if unreleased else M_STABLE
    if member.member_epoch != group.assignment_epoch:
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = group.assignment_epoch


def reconcile(group: ConsumerGroup, member: ConsumerMember, owned: Assignment | None) -> None:
    if member.state == M_STABLE and member.member_epoch == group.assignment_epoch:
        return
    if member.state == M_UNREVOKED and _owns_any(owned, member.pending_revocation):
        return  # still waiting for the member to give those up
    _next_assignment(group, member, owned)


# ---------------------------------------------------------------- coordinator


@dataclass
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int
    subscribed_topic_names: tuple[str, ...] | None
    subscribed_topic_regex: str | None
    server_assignor: str | None
    owned: Assignment | None
    client_id: str = ""
    client_host: str = ""
    # the topics the member may DESCRIBE (the authorizer's answer; None: all): a regex
    # subscription takes only those, as Kafka's
    may_describe: Callable[[str], bool] | None = None


@dataclass
class HeartbeatResult:
    member_id: str
    member_epoch: int
    assignment: Assignment | None = None


class ConsumerGroupCoordinator:
    def __init__(
        self,
        cluster: Cluster,
        classic: GroupCoordinator,
        heartbeat_interval_ms: int = 5000,
        session_timeout_ms: int = 45_000,
    ) -> None:
        self.cluster = cluster
        self.classic = classic
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.groups: dict[str, ConsumerGroup] = {}
        self._reaper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._expire(), name="consumer-group-reaper")

    async def close(self) -> None:
        if self._reaper:
            self._reaper.cancel()

    # ------------------------------------------------------------ heartbeat

    def heartbeat(self, req: HeartbeatRequest, version: int) -> HeartbeatResult:
        """Raises GroupError for an error answer."""
        self._validate(req, version)
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(req)
        group = self._group_for_heartbeat(req)
        member_id = req.member_id or str(uuid.uuid4())
        member, is_new = self._member(group, req, member_id)
        before = member.assigned
        bump = is_new or group.group_epoch == 0
        bump |= self._update_member(member, req)
        if is_new:
            group.members[member.member_id] = member
        topics = self._subscribed_topics(group)
        if bump or topics != group.topics_seen:
            group.topics_seen = topics
            group.group_epoch += 1
            log.info("consumer group %s: epoch %d", group.group_id, group.group_epoch)
        if group.group_epoch > group.assignment_epoch:
            self._compute_target(group)
        reconcile(group, member, req.owned)
        member.last_seen = time.monotonic()
        full = req.member_epoch == 0 or (
            req.rebalance_timeout_ms != -1
            and req.subscribed_topic_names is not None
            and req.owned is not None
        )
        return HeartbeatResult(
            member.member_id,
            member.member_epoch,
            member.assigned if full or member.assigned != before else None,
        )

    @staticmethod
    def _validate(req: HeartbeatRequest, version: int) -> None:
        def invalid(message: str) -> GroupError:
            return GroupError(ErrorCode.invalid_request, message)

        if (version >= 1 or req.member_epoch > 0 or req.member_epoch == LEAVE_EPOCH) and (
            not req.member_id
        ):
            raise invalid("MemberId can't be empty.")
        if not req.group_id:
            raise invalid("GroupId can't be empty.")
        if req.instance_id == "":
            raise invalid("InstanceId can't be empty.")
        if req.rack_id == "":
            raise invalid("RackId can't be empty.")
        if req.member_epoch == 0:
            if req.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if req.owned is None or req.owned:
                raise invalid("TopicPartitions must be empty when (re-)joining.")
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                raise invalid(
                    "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null "
                    "when (re-)joining."
                )
        elif req.member_epoch == STATIC_LEAVE_EPOCH and req.instance_id is None:
            raise invalid("InstanceId can't be null.")
        elif req.member_epoch < STATIC_LEAVE_EPOCH:
            raise invalid("MemberEpoch is invalid.")
        if req.server_assignor is not None and req.server_assignor not in ASSIGNORS:
            raise GroupError(
                ErrorCode.unsupported_assignor,
                f"ServerAssignor {req.server_assignor} is not supported. "
                f"Supported assignors: {', '.join(ASSIGNORS)}.",
            )
        if req.subscribed_topic_regex is not None:
            try:
                _regex(req.subscribed_topic_regex)
            except re2.error as exc:
                raise GroupError(
                    ErrorCode.invalid_regular_expression,
                    f"SubscribedTopicRegex `{req.subscribed_topic_regex}` is not a valid "
                    f"regular expression: {exc}.",
                ) from exc

    def _group_for_heartbeat(self, req: HeartbeatRequest) -> ConsumerGroup:
        group = self.groups.get(req.group_id)
        if group is not None:
            return group
        classic = self.classic.groups.get(req.group_id)
        if req.member_epoch != 0:
            if classic is not None:
                raise GroupError(
                    ErrorCode.group_id_not_found, f"Group {req.group_id} is not a consumer group."
                )
            # A restarted broker forgot its groups: the member rejoins, as after a fence.
            raise GroupError(
                ErrorCode.unknown_member_id,
                f"Consumer group {req.group_id} not found: rejoin with member epoch 0.",
            )
        if classic is not None:
            if classic.members:
                raise GroupError(
                    ErrorCode.group_id_not_found,
                    f"Group {req.group_id} is a classic group with members: this broker does "
                    "not upgrade a classic group to a consumer group online.",
                )
            self.classic.groups.pop(req.group_id, None)  # an empty classic group converts
            log.info("converted the empty classic group %s to a consumer group", req.group_id)
        group = self.groups[req.group_id] = ConsumerGroup(req.group_id)
        return group

    def _member(
        self, group: ConsumerGroup, req: HeartbeatRequest, member_id: str
    ) -> tuple[ConsumerMember, bool]:
        """The member the heartbeat is from, and whether it is new."""
        if req.instance_id is not None:
            return self._static_member(group, req, member_id)
        member = group.members.get(member_id)
        if member is None:
            if req.member_epoch != 0:
                raise GroupError(
                    ErrorCode.unknown_member_id,
                    f"Member {member_id} is not a member of group {group.group_id}.",
                )
            return ConsumerMember(member_id), True
        if req.member_epoch != 0:
            self._check_epoch(member, req.member_epoch, req.owned)
        return member, False

    def _static_member(
        self, group: ConsumerGroup, req: HeartbeatRequest, member_id: str
    ) -> tuple[ConsumerMember, bool]:
        assert req.instance_id is not None
        existing = group.static_member(req.instance_id)
        if req.member_epoch == 0:
            if existing is None:
                return ConsumerMember(member_id), True
            if existing.member_epoch != STATIC_LEAVE_EPOCH and existing.member_id != member_id:
                raise GroupError(
                    ErrorCode.unreleased_instance_id,
                    f"Static member {member_id} with instance id {req.instance_id} cannot join "
                    f"the group because the instance id is owned by {existing.member_id} member.",
                )
            # the instance rejoins: the new member takes over the old one's assignment
            del group.members[existing.member_id]
            replaced = ConsumerMember(
                member_id,
                instance_id=existing.instance_id,
                subscribed_topic_names=existing.subscribed_topic_names,
                subscribed_topic_regex=existing.subscribed_topic_regex,
                server_assignor=existing.server_assignor,
                rebalance_timeout_ms=existing.rebalance_timeout_ms,
                assigned=existing.assigned,
                pending_revocation=existing.pending_revocation,
                state=existing.state,
                member_epoch=0,
            )
            if existing.member_id in group.target:
                group.target[member_id] = group.target.pop(existing.member_id)
            group.members[member_id] = replaced
            return replaced, False
        if existing is None:
            raise GroupError(
                ErrorCode.unknown_member_id, f"Instance id {req.instance_id} is unknown."
            )
        if existing.member_id != member_id:
            raise GroupError(
                ErrorCode.fenced_instance_id,
                f"Static member {member_id} with instance id {req.instance_id} was fenced by "
                f"member {existing.member_id}.",
            )
        self._check_epoch(existing, req.member_epoch, req.owned)
        return existing, False

    @staticmethod
    def _check_epoch(member: ConsumerMember, epoch: int, owned: Assignment | None) -> None:
        """FENCED_MEMBER_EPOCH unless the epoch is the member's, or its previous one with owned
        partitions within its assignment (the answer that bumped it may have been lost)."""
        if epoch == member.member_epoch:
            return
        if (
            epoch < member.member_epoch
            and epoch == member.previous_member_epoch
            and _is_subset(owned, member.assigned)
        ):
            return
        relation = "greater" if epoch > member.member_epoch else "smaller"
        raise GroupError(
            ErrorCode.fenced_member_epoch,
            f"The consumer group member has a {relation} member epoch ({epoch}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must abandon "
            "all its partitions and rejoin.",
        )

    @staticmethod
    def _update_member(member: ConsumerMember, req: HeartbeatRequest) -> bool:
        """Apply the fields the heartbeat sets; whether the subscription changed."""
        changed = False
        if req.instance_id is not None:
            member.instance_id = req.instance_id
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.subscribed_topic_names is not None:
            names = tuple(sorted(set(req.subscribed_topic_names)))
            changed |= names != member.subscribed_topic_names
            member.subscribed_topic_names = names
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None
            changed |= regex != member.subscribed_topic_regex
            member.subscribed_topic_regex = regex
        if req.server_assignor is not None:
            changed |= req.server_assignor != member.server_assignor
            member.server_assignor = req.server_assignor
        member.client_id = req.client_id
        member.client_host = req.client_host
        member.may_describe = req.may_describe
        return changed

    def _member_topics(self, member: ConsumerMember) -> set[str]:
        topics = {t for t in member.subscribed_topic_names if t in self.cluster.topics}
        if member.subscribed_topic_regex:
            pattern = _regex(member.subscribed_topic_regex)
            topics |= {
                name
                for name, topic in self.cluster.topics.items()
                if not topic.is_internal
                and pattern.fullmatch(name)
                and (member.may_describe is None or member.may_describe(name))
            }
        return topics

    def _subscribed_topics(self, group: ConsumerGroup) -> dict[str, tuple[uuid.UUID, int]]:
        names: set[str] = set()
        for m in group.members.values():
            names |= self._member_topics(m)
        return {
            n: (self.cluster.topics[n].topic_id, self.cluster.topics[n].partitions) for n in names
        }

    def _compute_target(self, group: ConsumerGroup) -> None:
        subscriptions = {mid: self._member_topics(m) for mid, m in group.members.items()}
        partitions = {name: count for name, (_, count) in group.topics_seen.items()}
        ids = {name: topic_id for name, (topic_id, _) in group.topics_seen.items()}
        names = {topic_id: name for name, topic_id in ids.items()}
        previous = {
            mid: {(names[t], p) for t, ps in target.items() if t in names for p in ps}
            for mid, target in group.target.items()
        }
        assign = ASSIGNOR_FUNCTIONS[group.assignor()]
        computed = assign(subscriptions, partitions, previous)
        group.target = {mid: _by_topic_id(tps, ids) for mid, tps in computed.items()}
        group.assignment_epoch = group.group_epoch
        log.info(
            "consumer group %s: target assignment of epoch %d (%s): %s",
            group.group_id,
            group.assignment_epoch,
            group.assignor(),
            {mid: sorted(tps) for mid, tps in computed.items()},
        )

    # ------------------------------------------------------------ leave / expiry

    def _leave(self, req: HeartbeatRequest) -> HeartbeatResult:
        group = self.groups.get(req.group_id)
        if group is None:
            raise GroupError(
                ErrorCode.group_id_not_found, f"Consumer group {req.group_id} not found."
            )
        if req.instance_id is not None:
            member = group.static_member(req.instance_id)
            if member is None:
                raise GroupError(
                    ErrorCode.unknown_member_id, f"Instance id {req.instance_id} is unknown."
                )
            if member.member_id != req.member_id:
                raise GroupError(
                    ErrorCode.fenced_instance_id,
                    f"Static member {req.member_id} with instance id {req.instance_id} was "
                    f"fenced by member {member.member_id}.",
                )
        else:
            found = group.members.get(req.member_id)
            if found is None:
                raise GroupError(
                    ErrorCode.unknown_member_id,
                    f"Member {req.member_id} is not a member of group {group.group_id}.",
                )
            member = found
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = STATIC_LEAVE_EPOCH  # kept until its session runs out
            member.last_seen = time.monotonic()
            log.info(
                "consumer group %s: static member %s left for now", group.group_id, member.member_id
            )
        else:
            self.remove_member(group, member.member_id, "left the group")
        return HeartbeatResult(req.member_id, req.member_epoch)

    def remove_member(self, group: ConsumerGroup, member_id: str, why: str) -> None:
        group.members.pop(member_id, None)
        group.target.pop(member_id, None)
        group.group_epoch += 1
        log.info(
            "consumer group %s: member %s %s; epoch %d",
            group.group_id,
            member_id,
            why,
            group.group_epoch,
        )

    def expire(self, now: float) -> None:
        """Remove members silent for the session timeout, fence those that did not revoke
        within their rebalance timeout."""
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                if now - member.last_seen > self.session_timeout_ms / 1000:
                    self.remove_member(group, member.member_id, "let its session time out")
                elif (
                    member.state == M_UNREVOKED
                    and member.revoke_deadline is not None
                    and now > member.revoke_deadline
                ):
                    self.remove_member(
                        group, member.member_id, "did not revoke within its rebalance timeout"
                    )

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            self.expire(time.monotonic())

    # ------------------------------------------------------------ other APIs

    def is_consumer_group(self, group_id: str) -> bool:
        return group_id in self.groups

    def take_over_for_classic(self, group_id: str) -> bool:
        """Before a JoinGroup: False if the id is a consumer group with members (Kafka's
        INCONSISTENT_GROUP_PROTOCOL); an empty consumer group converts to a classic one."""
        group = self.groups.get(group_id)
        if group is None:
            return True
        if group.members:
            return False
        del self.groups[group_id]
        return True

    def validate_offset_commit(
        self, group_id: str, member_id: str, epoch: int, version: int, transactional: bool = False
    ) -> int:
        """ConsumerGroup.validateOffsetCommit: an admin's or standalone consumer's commit (epoch
        < 0) only to an empty group; a member's with its current epoch, in OffsetCommit v9+
        (any TxnOffsetCommit version)."""
        group = self.groups[group_id]
        if epoch < 0 and not group.members:
            return ErrorCode.none
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if version < 9 and not transactional:
            return ErrorCode.unsupported_version
        return self._epoch_error(epoch, member)

    def validate_offset_fetch(self, group_id: str, member_id: str | None, epoch: int) -> int:
        group = self.groups.get(group_id)
        if group is None or (member_id is None and epoch < 0):
            return ErrorCode.none
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        return self._epoch_error(epoch, member)

    @staticmethod
    def _epoch_error(epoch: int, member: ConsumerMember) -> int:
        if epoch > member.member_epoch:
            return ErrorCode.fenced_member_epoch
        if epoch < member.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    def subscribed_topics(self, group_id: str) -> set[str]:
        group = self.groups.get(group_id)
        if group is None:
            return set()
        return set().union(*(self._member_topics(m) for m in group.members.values()))

    def delete(self, group_id: str) -> int | None:
        """DeleteGroups of a consumer group (None: not one)."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        if group.members:
            return ErrorCode.non_empty_group
        del self.groups[group_id]
        return ErrorCode.none

    def listed(self) -> list[dict[str, Any]]:
        return [
            {
                "group_id": g.group_id,
                "protocol_type": "consumer",
                "group_state": g.state,
                "group_type": "consumer",
            }
            for g in self.groups.values()
        ]

    def describe(self, group_id: str) -> dict[str, Any]:
        group = self.groups.get(group_id)
        if group is None:
            reason = "is not a consumer group" if group_id in self.classic.groups else "not found"
            return {
                "error_code": ErrorCode.group_id_not_found,
                "error_message": f"Group {group_id} {reason}.",
                "group_id": group_id,
                "group_state": DEAD,
                "group_epoch": -1,
                "assignment_epoch": -1,
                "assignor_name": "",
                "members": [],
                "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
            }
        return {
            "error_code": ErrorCode.none,
            "error_message": None,
            "group_id": group_id,
            "group_state": group.state,
            "group_epoch": group.group_epoch,
            "assignment_epoch": group.assignment_epoch,
            "assignor_name": group.assignor(),
            "members": [self._described_member(group, m) for m in group.members.values()],
            "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    def _described_member(self, group: ConsumerGroup, m: ConsumerMember) -> dict[str, Any]:
        return {
            "member_id": m.member_id,
            "instance_id": m.instance_id,
            "rack_id": m.rack_id,
            "member_epoch": m.member_epoch,
            "client_id": m.client_id,
            "client_host": m.client_host,
            "subscribed_topic_names": list(m.subscribed_topic_names),
            "subscribed_topic_regex": m.subscribed_topic_regex,
            "assignment": {"topic_partitions": self._named(m.assigned)},
            "target_assignment": {
                "topic_partitions": self._named(group.target.get(m.member_id, {}))
            },
            "member_type": 1,
        }

    def _named(self, assignment: Assignment) -> list[dict[str, Any]]:
        out = []
        for topic_id, partitions in assignment.items():
            topic = self.cluster.topics_by_id.get(topic_id)
            out.append(
                {
                    "topic_id": topic_id,
                    "topic_name": topic.name if topic else "",
                    "partitions": sorted(partitions),
                }
            )
        return sorted(out, key=lambda t: t["topic_name"])


def _by_topic_id(tps: Iterable[tuple[str, int]], ids: dict[str, uuid.UUID]) -> Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for topic, p in tps:
        out.setdefault(ids[topic], set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}


def owned_partitions(topic_partitions: Any) -> Assignment | None:
    """A heartbeat's ``topic_partitions`` (null: unchanged since the last heartbeat)."""
    if topic_partitions is None:
        return None
    out: dict[uuid.UUID, frozenset[int]] = {}
    for tp in topic_partitions:
        if tp.topic_id is not None and tp.partitions:
            out[tp.topic_id] = out.get(tp.topic_id, frozenset()) | frozenset(tp.partitions)
    return out


class ConsumerGroupApis(AclApis):
    """The two APIs' handlers (mixed into KafkaHandlers)."""

    consumer_groups: ConsumerGroupCoordinator

    async def consumer_group_heartbeat(self, ctx: Any, req: Any, R: Responder) -> Any:
        # READ on the group: acl_apis.REQUEST_CHECKS. Subscribed topics the member may not
        # DESCRIBE: TOPIC_AUTHORIZATION_FAILED, as Kafka (the names are not echoed).
        hidden = [t for t in req.subscribed_topic_names or () if not self.topic_allowed(ctx, R, t)]
        if hidden:
            return R.error(
                ErrorCode.topic_authorization_failed,
                "The member is not authorized to describe some of its subscribed topics.",
            )
        request = HeartbeatRequest(
            group_id=req.group_id,
            member_id=req.member_id,
            member_epoch=req.member_epoch,
            instance_id=req.instance_id,
            rack_id=req.rack_id,
            rebalance_timeout_ms=ms(req.rebalance_timeout),
            subscribed_topic_names=req.subscribed_topic_names,
            subscribed_topic_regex=getattr(req, "subscribed_topic_regex", None),
            server_assignor=req.server_assignor,
            owned=owned_partitions(req.topic_partitions),
            client_id=ctx.client_id,
            client_host=ctx.client_host,
            may_describe=None
            if self.authorizer is None
            else functools.partial(self.topic_allowed, ctx, R),
        )
        interval = self.consumer_groups.heartbeat_interval_ms
        try:
            result = self.consumer_groups.heartbeat(request, R.version)
        except GroupError as exc:
            return R(
                error_code=exc.code,
                error_message=exc.message,
                member_id=None,
                member_epoch=0,
                heartbeat_interval=0,
                assignment=None,
            )
        assignment = None
        if result.assignment is not None:
            assignment = {
                "topic_partitions": [
                    {"topic_id": t, "partitions": sorted(ps)}
                    for t, ps in sorted(result.assignment.items())
                ]
            }
        return R(
            error_code=ErrorCode.none,
            error_message=None,
            member_id=result.member_id,
            member_epoch=result.member_epoch,
            heartbeat_interval=interval,
            assignment=assignment,
        )

    async def consumer_group_describe(self, ctx: Any, req: Any, R: Responder) -> Any:
        """DESCRIBE on each group (GROUP_AUTHORIZATION_FAILED), its authorized operations when
        asked (KIP-430)."""
        with_operations = getattr(req, "include_authorized_operations", False)
        groups = []
        for group_id in req.group_ids:
            described = self.consumer_groups.describe(group_id)
            if not self.group_allowed(ctx, R, group_id):
                described.update(  # nothing about the group but its id, as Kafka
                    error_code=ErrorCode.group_authorization_failed,
                    error_message=denied_message(ResourceType.GROUP, group_id),
                    group_state="",
                    group_epoch=0,
                    assignment_epoch=0,
                    assignor_name="",
                    members=[],
                )
            elif with_operations and described["error_code"] == ErrorCode.none:
                described["authorized_operations"] = self.authorized_operations(
                    ctx, ResourceType.GROUP, group_id
                )
            groups.append(described)
        return R(groups=groups)
