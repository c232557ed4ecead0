"""The classic consumer-group protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup).

One coordinator serves every group. A rebalance waits until every known member
has rejoined (or the rebalance timeout drops the laggards), then the leader
gets the member list, computes the assignment and hands it back in SyncGroup.
Committed offsets live in the metadata store, not in memory.
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

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def subscribed_topics(self) -> set[str]:
        """The topics of a consumer member's subscription (the consumer protocol's
        ``ConsumerProtocolSubscription``: int16 version, then an array of int16-length names,
        the same in every version); empty when the metadata is not that."""
        topics: set[str] = set()
        for _, metadata in self.protocols:
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
            # static member rejoining: reuse its identity
            for existing in group.members.values():
                if existing.group_instance_id == group_instance_id:
                    member_id = existing.member_id
                    break
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id:
                group.pending_members.add(member_id)
                return JoinResult(ErrorCode.member_id_required, member_id=member_id)
        elif member_id not in group.members and member_id not in group.pending_members:
            return JoinResult(ErrorCode.unknown_member_id, member_id=member_id)
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
            member.protocols = protocols
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
        member.last_seen = time.monotonic()
        group.protocol_type = protocol_type
        if member.join_future and not member.join_future.done():
            member.join_future.set_result(JoinResult(ErrorCode.unknown_member_id))
        member.join_future = asyncio.get_running_loop().create_future()
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        return await member.join_future

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
            if member.join_future is None or member.join_future.done():
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
        if all(
            m.join_future is not None and not m.join_future.done() for m in group.members.values()
        ):
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
        group.generation += 1
        group.protocol_name = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = COMPLETING
        assert group.protocol_name is not None
        member_list = [
            (m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
            for m in group.members.values()
        ]
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

    # ------------------------------------------------------------ sync

    async def sync(
        self, group_id: str, generation: int, member_id: str, assignments: dict[str, bytes]
    ) -> tuple[int, bytes, str | None, str | None]:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return ErrorCode.unknown_member_id, b"", None, None
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

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> int:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return ErrorCode.unknown_member_id
        group.members[member_id].last_seen = time.monotonic()
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress
        if generation != group.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def leave(self, group_id: str, member_id: str, group_instance_id: str | None) -> int:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if not member_id and group_instance_id:
            for m in group.members.values():
                if m.group_instance_id == group_instance_id:
                    member_id = m.member_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
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

    def validate_member(self, group_id: str, generation: int, member_id: str) -> int:
        """For OffsetCommit: simple (generation -1) commits pass; group members must be current."""
        if generation < 0 and not member_id:
            return ErrorCode.none  # a standalone (assign-mode) consumer or an admin tool
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return ErrorCode.unknown_member_id
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress
        if generation != group.generation:
            return ErrorCode.illegal_generation
        group.members[member_id].last_seen = time.monotonic()
        return ErrorCode.none

    async def _expire_sessions(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for group in list(self.groups.values()):
                for member in list(group.members.values()):
                    waiting = member.join_future is not None and not member.join_future.done()
                    if waiting:
                        continue
                    if now - member.last_seen > member.session_timeout_ms / 1000:
                        log.info(
                            "group %s: member %s session expired", group.group_id, member.member_id
                        )
                        self._remove_member(group, member.member_id)

    def delete(self, group_id: str) -> int:
        group = self.groups.get(group_id)
        if group is not None and group.members:
            return ErrorCode.non_empty_group
        self.groups.pop(group_id, None)
        return ErrorCode.none
