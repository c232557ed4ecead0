"""The classic consumer-group protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup).

One coordinator serves every group. A rebalance waits until every known member
has rejoined (or the rebalance timeout drops the laggards), then the leader
gets the member list, computes the assignment and hands it back in SyncGroup.
Committed offsets live in the metadata store, not in memory.

Static members (KIP-345, ``group.instance.id``) follow Apache Kafka's classic
coordinator: a static member that comes back under a new member id (a restart)
takes its old member's place and assignment without a rebalance when the group
is Stable, which is the point of static membership (a rolling restart does not
move partitions); the member id it replaced is fenced (FENCED_INSTANCE_ID), so
two processes started with one instance id cannot both consume. Static members
send no LeaveGroup on close: only their session timeout, or a LeaveGroup naming
their instance id (an admin's), removes them, and a rebalance does not drop one
that has not rejoined yet.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import uuid
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

log = logging.getLogger(__name__)

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
)


@dataclass
class JoinResult:
    error: int
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)
    skip_assignment: bool = False


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_seen: float = field(default_factory=time.monotonic)
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[tuple[int, bytes]] | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def subscribed_topics(self) -> set[str]:
        return subscribed_topics(self.protocols)


def subscribed_topics(protocols: list[tuple[str, bytes]]) -> set[str]:
    """The topics of a consumer member's subscription (the consumer protocol's
    ``ConsumerProtocolSubscription``: int16 version, then an array of int16-length names,
    the same in every version); empty when the metadata is not that."""
    topics: set[str] = set()
    for _, metadata in protocols:
        try:
            (count,) = struct.unpack_from(">i", metadata, 2)
            position = 6
            for _ in range(max(count, 0)):
                (length,) = struct.unpack_from(">h", metadata, position)
                topics.add(metadata[position + 2 : position + 2 + length].decode())
                position += 2 + length
        except (struct.error, UnicodeDecodeError):
            continue
    return topics


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending_members: set[str] = field(default_factory=set)
    rebalance_task: asyncio.Task[None] | None = None
    new_member_added: bool = False
    initial_join: bool = False

    def select_protocol(self) -> str | None:
        candidates: set[str] | None = None
        for member in self.members.values():
            names = {name for name, _ in member.protocols}
            candidates = names if candidates is None else candidates & names
        if not candidates:
            return None
        votes: dict[str, int] = {}
        for member in self.members.values():
            for name, _ in member.protocols:
                if name in candidates:
                    votes[name] = votes.get(name, 0) + 1
                    break
        return max(sorted(votes), key=lambda n: votes[n])

    def static_member(self, group_instance_id: str) -> Member | None:
        for member in self.members.values():
            if member.group_instance_id == group_instance_id:
                return member
        return None

    def validate_member(self, member_id: str, group_instance_id: str | None) -> int:
        """Kafka's ``validateMember``: an instance id must name this member id (another one
        fenced it: FENCED_INSTANCE_ID), and the member id must be one of the group's."""
        if group_instance_id is not None:
            static = self.static_member(group_instance_id)
            if static is None:
                return ErrorCode.unknown_member_id
            if static.member_id != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return ErrorCode.none

    def member_list(self) -> list[tuple[str, str | None, bytes]]:
        """What the leader gets in its JoinGroup response."""
        return [
            (m.member_id, m.group_instance_id, m.metadata_for(self.protocol_name or ""))
            for m in self.members.values()
        ]


class GroupCoordinator:
    def __init__(self, initial_rebalance_delay_ms: int = 300) -> None:
        self.groups: dict[str, Group] = {}
        self.initial_rebalance_delay = initial_rebalance_delay_ms / 1000
        self._reaper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._expire_sessions(), name="group-session-reaper")

    async def close(self) -> None:
        if self._reaper:
            self._reaper.cancel()
        for group in self.groups.values():
            if group.rebalance_task:
                group.rebalance_task.cancel()

    def group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        return group

    # ------------------------------------------------------------ join

    async def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
        supports_skip_assignment: bool = False,
    ) -> JoinResult:
        if not group_id:
            return JoinResult(ErrorCode.invalid_group_id)
        if not 1000 <= session_timeout_ms <= 30 * 60 * 1000:
            return JoinResult(ErrorCode.invalid_session_timeout)
        group = self.group(group_id)
        if group.state == DEAD:
            return JoinResult(ErrorCode.coordinator_not_available)
        if (
            group.protocol_type is not None
            and group.members
            and protocol_type != group.protocol_type
        ):
            return JoinResult(ErrorCode.inconsistent_group_protocol)
        if group.members and not self._supports_common_protocol(group, protocols, member_id):
            return JoinResult(ErrorCode.inconsistent_group_protocol)

        if group_instance_id is not None and not member_id:
            # a static member under a new member id: no MEMBER_ID_REQUIRED round trip (Kafka
            # asks that of dynamic members only), and it takes the place of its instance's member
            member_id = f"{group_instance_id}-{uuid.uuid4()}"
            existing = group.static_member(group_instance_id)
            if existing is not None:
                return await self._replace_static_member(
                    group,
                    existing,
                    member_id,
                    session_timeout_ms,
                    rebalance_timeout_ms,
                    protocols,
                    supports_skip_assignment,
                )
        elif not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id:
                group.pending_members.add(member_id)
                return JoinResult(ErrorCode.member_id_required, member_id=member_id)
        elif member_id not in group.pending_members:
            error = group.validate_member(member_id, group_instance_id)
            if error != ErrorCode.none:
                return JoinResult(error, member_id=member_id)
        group.pending_members.discard(member_id)

        member = group.members.get(member_id)
        if member is None:
            member = Member(
                member_id,
                group_instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocols,
            )
            group.members[member_id] = member
            group.new_member_added = True
        else:
            self._update_member(member, session_timeout_ms, rebalance_timeout_ms, protocols)
        group.protocol_type = protocol_type
        return await self._rejoin(group, member)

    @staticmethod
    def _update_member(
        member: Member,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocols: list[tuple[str, bytes]],
    ) -> None:
        member.protocols = protocols
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.last_seen = time.monotonic()

    async def _rejoin(self, group: Group, member: Member) -> JoinResult:
        """Park the member's JoinGroup until the rebalance it starts (or joins) completes."""
        member.last_seen = time.monotonic()
        if member.join_future and not member.join_future.done():
            member.join_future.set_result(JoinResult(ErrorCode.unknown_member_id))
        member.join_future = asyncio.get_running_loop().create_future()
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        return await member.join_future

    async def _replace_static_member(
        self,
        group: Group,
        old: Member,
        member_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocols: list[tuple[str, bytes]],
        supports_skip_assignment: bool,
    ) -> JoinResult:
        """A known ``group.instance.id`` under a new member id (Kafka's
        ``updateStaticMemberThenRebalanceOrCompleteJoin``): the new id replaces the old one,
        keeping its assignment, and the old id is fenced. In a Stable group whose protocol
        stays the same this is the whole join: the member gets the current generation back and
        its old assignment in SyncGroup, the others see nothing. Kafka checks only the protocol;
        a member whose subscribed topics changed also starts a rebalance here, so it is not
        left holding an assignment for topics it no longer reads."""
        previous_leader = group.leader
        subscription_kept = old.subscribed_topics() == subscribed_topics(protocols)
        member = self._fence_and_replace(group, old, member_id)
        self._update_member(member, session_timeout_ms, rebalance_timeout_ms, protocols)
        log.info(
            "group %s: static member %s rejoined as %s, replacing %s",
            group.group_id,
            member.group_instance_id,
            member_id,
            old.member_id,
        )
        unchanged = subscription_kept and group.select_protocol() == group.protocol_name
        if group.state == STABLE and unchanged:
            return self._current_generation(
                group, member, previous_leader, supports_skip_assignment
            )
        # otherwise a rebalance: in CompletingRebalance too, as Kafka (the leader may be
        # assigning to the old member id); in PreparingRebalance it joins the one under way
        return await self._rejoin(group, member)

    @staticmethod
    def _fence_and_replace(group: Group, old: Member, member_id: str) -> Member:
        del group.members[old.member_id]
        if old.join_future and not old.join_future.done():
            old.join_future.set_result(
                JoinResult(ErrorCode.fenced_instance_id, member_id=old.member_id)
            )
        if old.sync_future and not old.sync_future.done():
            old.sync_future.set_result((ErrorCode.fenced_instance_id, b""))
        member = Member(
            member_id,
            old.group_instance_id,
            old.client_id,
            old.client_host,
            old.session_timeout_ms,
            old.rebalance_timeout_ms,
            old.protocols,
            assignment=old.assignment,
        )
        group.members[member_id] = member
        if group.leader == old.member_id:
            group.leader = member_id
        return member

    @staticmethod
    def _current_generation(
        group: Group, member: Member, previous_leader: str | None, supports_skip_assignment: bool
    ) -> JoinResult:
        """The JoinGroup answer of a static member that rejoined a Stable group. Before
        JoinGroup v9 it names the previous leader id, so a rejoined leader acts as a follower
        (a Stable group would not take its new assignment anyway); from v9 the leader learns
        it leads, with the member list, and is told to skip the assignment (KIP-814)."""
        leads = supports_skip_assignment and group.leader == member.member_id
        return JoinResult(
            ErrorCode.none,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            (group.leader if supports_skip_assignment else previous_leader) or "",
            member.member_id,
            group.member_list() if leads else [],
            skip_assignment=leads,
        )

    def _supports_common_protocol(
        self, group: Group, protocols: list[tuple[str, bytes]], member_id: str
    ) -> bool:
        offered = {name for name, _ in protocols}
        for other in group.members.values():
            if other.member_id == member_id:
                continue
            if not offered & {name for name, _ in other.protocols}:
                return False
        return True

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state == PREPARING:
            return
        initial = group.state == EMPTY
        for member in group.members.values():
            if member.sync_future and not member.sync_future.done():
                member.sync_future.set_result((ErrorCode.rebalance_in_progress, b""))
        group.state = PREPARING
        group.initial_join = initial
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
        delay = self.initial_rebalance_delay if initial else timeout
        if group.rebalance_task:
            group.rebalance_task.cancel()
        group.rebalance_task = asyncio.create_task(self._rebalance_deadline(group, delay, initial))

    async def _rebalance_deadline(self, group: Group, delay: float, initial: bool) -> None:
        """Initial delay lets more members join an empty group; otherwise the
        rebalance timeout drops members that did not rejoin."""
        if initial:
            # keep extending while members arrive, up to the rebalance timeout
            deadline = (
                time.monotonic()
                + max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
            )
            while True:
                group.new_member_added = False
                await asyncio.sleep(delay)
                if not group.new_member_added or time.monotonic() >= deadline:
                    break
        else:
            await asyncio.sleep(delay)
        group.initial_join = False
        if group.state != PREPARING:
            return
        for member in list(group.members.values()):
            # a static member stays until its session times out (Kafka): it keeps its share
            # of the assignment meanwhile and takes it back when it returns
            if not member.awaiting_join and member.group_instance_id is None:
                log.info(
                    "group %s: member %s did not rejoin in time, removing",
                    group.group_id,
                    member.member_id,
                )
                del group.members[member.member_id]
        group.rebalance_task = None
        self._complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state != PREPARING:
            return
        if group.initial_join:
            return  # the initial delay is still gathering members
        if all(m.awaiting_join for m in group.members.values()):
            if group.rebalance_task:
                group.rebalance_task.cancel()
                group.rebalance_task = None
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if not group.members:
            group.state = EMPTY
            group.generation += 1
            group.leader = None
            group.protocol_name = None
            return
        leader = self._joined_leader(group)
        if leader is None:
            # only static members that have not rejoined: wait another rebalance timeout
            # for one of them (or for their sessions to run out), as Kafka does
            timeout = max(m.rebalance_timeout_ms for m in group.members.values()) / 1000
            group.rebalance_task = asyncio.create_task(
                self._rebalance_deadline(group, timeout, initial=False)
            )
            return
        group.leader = leader
        group.generation += 1
        group.protocol_name = group.select_protocol()
        group.state = COMPLETING
        assert group.protocol_name is not None
        member_list = group.member_list()
        for member in group.members.values():
            member.assignment = b""
            result = JoinResult(
                ErrorCode.none,
                group.generation,
                group.protocol_type,
                group.protocol_name,
                group.leader or "",
                member.member_id,
                member_list if member.member_id == group.leader else [],
            )
            if member.join_future and not member.join_future.done():
                member.join_future.set_result(result)
            member.last_seen = time.monotonic()
        log.info(
            "group %s: generation %d with %d members, leader %s",
            group.group_id,
            group.generation,
            len(group.members),
            group.leader,
        )

    @staticmethod
    def _joined_leader(group: Group) -> str | None:
        """The leader stays if it rejoined; else the first member that did (one that has not,
        a static member, could not compute the assignment)."""
        current = group.members.get(group.leader or "")
        if current is not None and current.awaiting_join:
            return current.member_id
        return next((m.member_id for m in group.members.values() if m.awaiting_join), None)

    # ------------------------------------------------------------ sync

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: dict[str, bytes],
        group_instance_id: str | None = None,
    ) -> tuple[int, bytes, str | None, str | None]:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id, b"", None, None
        error = group.validate_member(member_id, group_instance_id)
        if error != ErrorCode.none:
            return error, b"", None, None
        if generation != group.generation:
            return ErrorCode.illegal_generation, b"", None, None
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress, b"", None, None
        member = group.members[member_id]
        member.last_seen = time.monotonic()
        if group.state == STABLE:
            return ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name
        if member_id == group.leader:
            for mid, m in group.members.items():
                m.assignment = assignments.get(mid, b"")
            group.state = STABLE
            for m in group.members.values():
                if m.sync_future and not m.sync_future.done():
                    m.sync_future.set_result((ErrorCode.none, m.assignment))
            return ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name
        member.sync_future = asyncio.get_running_loop().create_future()
        error, assignment = await member.sync_future
        return error, assignment, group.protocol_type, group.protocol_name

    # ------------------------------------------------------------ heartbeat / leave

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, group_instance_id: str | None = None
    ) -> int:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        error = group.validate_member(member_id, group_instance_id)
        if error != ErrorCode.none:
            return error
        group.members[member_id].last_seen = time.monotonic()
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress
        if generation != group.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def leave(self, group_id: str, member_id: str, group_instance_id: str | None) -> int:
        """One member of a LeaveGroup. As Kafka: an instance id alone (an admin removing a
        static member) names its current member; a member id given with an instance id must be
        that instance's (FENCED_INSTANCE_ID otherwise)."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if not member_id:
            static = group.static_member(group_instance_id) if group_instance_id else None
            if static is None:
                return ErrorCode.unknown_member_id
            member_id = static.member_id
        elif member_id in group.pending_members:
            group.pending_members.discard(member_id)
            return ErrorCode.none
        else:
            error = group.validate_member(member_id, group_instance_id)
            if error != ErrorCode.none:
                return error
        log.info("group %s: member %s left", group.group_id, member_id)
        self._remove_member(group, member_id)
        return ErrorCode.none

    def _remove_member(self, group: Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        if member.join_future and not member.join_future.done():
            member.join_future.set_result(JoinResult(ErrorCode.unknown_member_id))
        if member.sync_future and not member.sync_future.done():
            member.sync_future.set_result((ErrorCode.unknown_member_id, b""))
        if group.leader == member_id:
            group.leader = None
        if group.state in (STABLE, COMPLETING):
            self._prepare_rebalance(group)
        if group.state == PREPARING:
            self._maybe_complete_join(group)
        if not group.members and group.state != PREPARING:
            group.state = EMPTY

    def validate_member(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None = None,
        transactional: bool = False,
    ) -> int:
        """May this (Txn)OffsetCommit commit? Kafka's classic ``validateOffsetCommit``: a simple
        commit (generation -1, no member id: a standalone consumer, an admin tool) only into an
        empty group; a member's commit from a current member of the current generation (its
        instance id not fenced), also while the group prepares a rebalance, but not while it
        completes one (REBALANCE_IN_PROGRESS, which does not apply to transactional commits).

        A group the coordinator does not know takes simple commits; a member's commit to one is
        UNKNOWN_MEMBER_ID (Kafka answers GROUP_ID_NOT_FOUND or ILLEGAL_GENERATION, but it keeps
        its groups' members across restarts and this coordinator does not: the likeliest sender
        is a member the restart forgot, which UNKNOWN_MEMBER_ID sends back to JoinGroup)."""
        group = self.groups.get(group_id)
        if group is None:
            simple = generation < 0 and not member_id and group_instance_id is None
            return ErrorCode.none if simple else ErrorCode.unknown_member_id
        if group.state == DEAD:
            return ErrorCode.coordinator_not_available
        if generation < 0 and group.state == EMPTY:
            return ErrorCode.none
        if generation >= 0 or member_id or group_instance_id is not None:
            error = group.validate_member(member_id, group_instance_id)
            if error != ErrorCode.none:
                return error
            if generation != group.generation:
                return ErrorCode.illegal_generation
        elif not transactional and group.state != EMPTY:
            return ErrorCode.unknown_member_id
        if not transactional and group.state == COMPLETING:
            return ErrorCode.rebalance_in_progress
        member = group.members.get(member_id)
        if member is not None and group.state in (STABLE, PREPARING):
            member.last_seen = time.monotonic()  # a commit keeps the session alive (Kafka)
        return ErrorCode.none

    async def _expire_sessions(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for group in list(self.groups.values()):
                for member in list(group.members.values()):
                    if member.awaiting_join:
                        continue
                    expired = now - member.last_seen > member.session_timeout_ms / 1000
                    if expired and member.member_id in group.members:
                        log.info(
                            "group %s: member %s session expired", group.group_id, member.member_id
                        )
                        self._remove_member(group, member.member_id)

    def unload(self, group_id: str) -> None:
        """Cluster mode: another broker coordinates this group now. Its members waiting here
        are told NOT_COORDINATOR (they find the new coordinator and rejoin there), and no
        stale copy stays behind should the group come back later."""
        group = self.groups.pop(group_id, None)
        if group is None:
            return
        if group.rebalance_task:
            group.rebalance_task.cancel()
        for member in group.members.values():
            if member.join_future and not member.join_future.done():
                member.join_future.set_result(JoinResult(ErrorCode.not_coordinator))
            if member.sync_future and not member.sync_future.done():
                member.sync_future.set_result((ErrorCode.not_coordinator, b""))

    def delete(self, group_id: str) -> int:
        group = self.groups.get(group_id)
        if group is not None and group.members:
            return ErrorCode.non_empty_group
        self.groups.pop(group_id, None)
        return ErrorCode.none
