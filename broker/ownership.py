"""Who leads what: the view of the cluster the Kafka handlers answer from.

One broker alone (SQLite metadata) leads every partition and coordinates every group and
transactional id, so the handlers behave exactly as before. In cluster mode (Postgres
metadata) the membership loop (``broker/membership.py``) refreshes this view every heartbeat
from the ``cluster_brokers`` and ``partition_leases`` tables; between heartbeats the handlers
read it without touching Postgres. It is a snapshot: a client sent to a broker that lost a
partition a moment ago gets NOT_LEADER_OR_FOLLOWER there and asks Metadata again, as with Kafka.

Coordinators are partitions too, as in Kafka: the group coordinator of group G is the leader of
``__consumer_offsets`` partition ``abs(hashCode(G)) % 50``, a transactional id's the leader of
that ``__transaction_state`` partition. Here those are lease-only rows (no log): taking one over
moves nothing, since committed offsets and transaction state already live in Postgres, and the
groups rebuild themselves when their members rejoin at the new coordinator.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.config import BrokerConfig

GROUP_SLOTS_TOPIC = "__consumer_offsets"
TXN_SLOTS_TOPIC = "__transaction_state"
COORDINATOR_SLOTS = (
    50  # Kafka's offsets.topic.num.partitions / transaction.state.log.num.partitions
)
KEY_GROUP = 0  # FindCoordinator's key types
KEY_TRANSACTION = 1


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit signed)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_slot(key: str, slots: int = COORDINATOR_SLOTS) -> int:
    """Kafka's ``Utils.abs(key.hashCode()) % slots`` (``Utils.abs(MIN_VALUE)`` is 0)."""
    h = java_hash(key)
    return (0 if h == -(2**31) else abs(h)) % slots


def slot_partition(key_type: int, key: str) -> tuple[str, int]:
    """The coordinator slot (topic, partition) of a group (0) or transactional id (1)."""
    topic = GROUP_SLOTS_TOPIC if key_type == KEY_GROUP else TXN_SLOTS_TOPIC
    return topic, coordinator_slot(key)


def coordinator_slots() -> list[tuple[str, int]]:
    """Every coordinator slot: lease-only partitions the brokers share out with the topics'."""
    return [(t, p) for t in (GROUP_SLOTS_TOPIC, TXN_SLOTS_TOPIC) for p in range(COORDINATOR_SLOTS)]


@dataclass(frozen=True)
class Member:
    """A live broker as clients reach it: ``endpoints`` maps each listener name to
    ``[host, port]`` (and ``admin``/``registry``/``catalog`` to URLs)."""

    node_id: int
    endpoints: Mapping[str, Any]
    rack: str | None = None

    def address(self, listener: str) -> tuple[str, int] | None:
        """Host and port of ``listener`` on this broker (None: it has no such listener)."""
        found = self.endpoints.get(listener)
        if not isinstance(found, list | tuple) or len(found) != 2:
            return None
        return str(found[0]), int(found[1])


@dataclass
class Ownership:
    """The leaders and live brokers as last read. ``clustered`` False: this broker is alone."""

    me: Member
    clustered: bool = False
    members: dict[int, Member] = field(default_factory=dict)
    # brokers not live now but still listed in Metadata (``membership.LISTED_LEASES``)
    listed: dict[int, Member] = field(default_factory=dict)
    # (topic, partition) -> (leader node id, lease epoch), every lease row read
    leaders: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    # what this broker holds, (topic, partition) -> epoch: the heartbeat's answer
    held: dict[tuple[str, int], int] = field(default_factory=dict)
    # monotonic time until which this broker's leases surely hold (the last renew + lease.ms)
    valid_until: float = float("inf")

    def __post_init__(self) -> None:
        self.members.setdefault(self.me.node_id, self.me)

    @property
    def node_id(self) -> int:
        return self.me.node_id

    def update(
        self,
        members: Iterable[Member],
        leaders: Mapping[tuple[str, int], tuple[int, int]],
        held: Mapping[tuple[str, int], int],
        valid_until: float,
        listed: Iterable[Member] = (),
    ) -> None:
        """A heartbeat's reading: the live brokers (this one always among them), the lease
        of every partition whose owner is live, what this broker holds, and the brokers that
        are not live but still listed in Metadata."""
        live = {m.node_id: m for m in members}
        live[self.me.node_id] = self.me
        self.members = live
        self.listed = {m.node_id: m for m in listed if m.node_id not in live}
        self.leaders = {tp: owner for tp, owner in leaders.items() if owner[0] in live}
        self.leaders.update({tp: (self.me.node_id, epoch) for tp, epoch in held.items()})
        self.held = dict(held)
        self.valid_until = valid_until

    def live(self) -> list[Member]:
        """The live brokers by node id."""
        return [self.members[n] for n in sorted(self.members)]

    def in_metadata(self) -> list[Member]:
        """The brokers Metadata and DescribeCluster list, by node id: the live ones and those
        whose heartbeats stopped only lately. A Kafka client drops a broker missing from
        Metadata and counts what it had in flight there as never written, re-sending it even
        with ``retries=0`` (librdkafka since 2.10: "Broker handle destroyed", MsgNotPersisted);
        a broker that was only stalled may have written some of it, so it stays listed past
        its lease, while the partitions it led already show their new leaders."""
        found = {**self.listed, **self.members}
        return [found[n] for n in sorted(found)]

    @property
    def controller_id(self) -> int:
        """DescribeCluster's and Metadata's controller: the live broker with the lowest id."""
        return min(self.members) if self.clustered else self.me.node_id

    def _holding(self, tp: tuple[str, int]) -> bool:
        return tp in self.held and time.monotonic() < self.valid_until

    def leader(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(leader node id, leader epoch) of a partition; None while no live broker leads it."""
        if not self.clustered:
            return self.me.node_id, 0
        if self._holding((topic, partition)):
            return self.me.node_id, self.held[(topic, partition)]
        owner = self.leaders.get((topic, partition))
        if owner is None or owner[0] == self.me.node_id:
            return None  # ours no more (lapsed locally), not yet anyone else's
        return owner

    def leader_epoch(self, topic: str, partition: int) -> int:
        found = self.leader(topic, partition)
        return found[1] if found else -1

    def coordinator(self, key_type: int, key: str) -> Member | None:
        """The broker coordinating a group (0) or transactional id (1); None while none does."""
        found = self.leader(*slot_partition(key_type, key))
        return self.members.get(found[0]) if found else None

    def slot_fence(self, key_type: int, key: str) -> tuple[str, int, int, int] | None:
        """What a coordinator's state write for ``key`` is fenced by (cluster mode): its slot,
        this node, and the slot lease's epoch as this broker holds it (-1: not held, so the
        write is refused). None alone: no fence."""
        if not self.clustered:
            return None
        topic, slot = slot_partition(key_type, key)
        return topic, slot, self.me.node_id, self.held.get((topic, slot), -1)

    def coordinates(self, key_type: int, key: str) -> bool:
        """This broker coordinates ``key`` (always, alone)."""
        return not self.clustered or self._holding(slot_partition(key_type, key))


def local_member(config: BrokerConfig) -> Member:
    """This broker as ``cluster_brokers`` records it: each Kafka listener's advertised address,
    and the URLs of its admin API, schema registry and REST catalog."""
    endpoints: dict[str, Any] = {
        x.name: [x.advertised_host, x.advertised_port] for x in config.listener_list()
    }
    endpoints.update(
        admin=config.admin_url,
        registry=config.registry_url,
        catalog=config.catalog_url,
    )
    return Member(config.node_id, endpoints, config.broker_rack)
