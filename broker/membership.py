"""Cluster membership: the loop that makes a broker one of several sharing Postgres and the
object store (cluster mode, ``metadata.uri = postgresql://...``).

At start the broker registers (``cluster_brokers``; a live broker with the same node id makes it
refuse to start, ``NodeIdInUseError``). Then, every ``broker.heartbeat.interval.ms``:

1. renew: the broker's row and every lease it still holds, in one transaction (Postgres time);
   a lease the renew did not return was lost (it expired, or another broker took it): the
   partition is unloaded at once, and the fencing epoch makes sure nothing this broker still
   had in flight for it becomes visible;
2. refresh what other brokers changed (topics, configs, ACLs) when ``cluster_state_version``
   moved;
3. read the live brokers and every lease into the ``Ownership`` view the Kafka handlers answer
   Metadata, FindCoordinator and the NOT_LEADER / NOT_COORDINATOR checks from;
4. rebalance, topic by topic (coordinator slots are two more "topics" of 50 lease-only
   partitions): a broker holding fewer than its share takes free or expired partitions (a new
   broker takes over without copying data: the partition's chunks, producer states and aborted
   transactions are loaded from Postgres), and one holding more than its share while another
   holds fewer releases the surplus after flushing it. Every broker computes the same plan
   from the same reading, and the most loaded ones give up partitions first, so they do not
   overshoot; each starts looking for free partitions at its own place in the ring, so brokers
   starting together do not fight over the same ones. An operator's move (``preferred_node``,
   ``icefall cluster move``) pins a partition to the broker named while that broker is live.

Clean shutdown (``handover``), a rebalance or an operator's move give partitions up the same
way: the partition first refuses new appends, then everything it accepted is flushed and
acknowledged, then it is unloaded and its lease released, so the others take it on their next
heartbeat (``deregister`` follows at shutdown). No accepted batch is refused on the way out: a
producer without idempotence would re-send it after newer ones and reorder its records.

Postgres unreachable: the renew fails, the leases lapse locally once ``broker.lease.ms`` has
passed since the last renew began (the log store then refuses produce with
NOT_LEADER_OR_FOLLOWER, a retriable error, and group/transaction requests get NOT_COORDINATOR);
when Postgres answers again the loop re-registers and takes partitions as any broker would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable

from broker.assignment import Assignment, BrokerEntry, PartitionEntry
from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.ownership import Member, Ownership, coordinator_slots, local_member
from broker.storage.leases import Lease, Leases, NodeIdInUseError
from broker.storage.logstore import LogStore
from broker.storage.metadata import MetadataStore

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# A broker whose heartbeats stopped stays in the Metadata others answer for this many leases
# (``Ownership.in_metadata``): long enough for a stalled broker to answer what it had in flight
# (it can write nothing after its lease), short enough that a dead one leaves soon. Leaders and
# coordinators are the live brokers' only.
LISTED_LEASES = 3
# (slot topic, slot, taken): the transaction coordinator reloads or drops that slot's ids
SlotHook = Callable[[str, int, bool], Awaitable[None]]


def share_plan(
    partitions: list[TopicPartition],
    holders: dict[TopicPartition, int],
    live: list[int],
) -> dict[int, int]:
    """How many of ``partitions`` each live broker should give up: the surplus of those above
    the ceiling of the fair share, and, while a broker is below the floor, one at a time from
    the most loaded (lowest node id first on ties) until the deficit is covered. Every broker
    computes the same plan from the same reading."""
    if not live or not partitions:
        return {}
    floor = len(partitions) // len(live)
    ceiling = math.ceil(len(partitions) / len(live))
    counts = {node: 0 for node in live}
    for tp in partitions:
        node = holders.get(tp)
        if node in counts:
            counts[node] += 1
    give = {node: max(0, n - ceiling) for node, n in counts.items()}
    deficit = sum(max(0, floor - n) for n in counts.values())
    deficit -= sum(give.values())
    while deficit > 0:
        loaded = sorted(
            (n - give[node], node) for node, n in counts.items() if n - give[node] > floor
        )
        if not loaded:
            break
        top = max(loaded, key=lambda x: (x[0], -x[1]))
        give[top[1]] += 1
        deficit -= 1
    return {node: n for node, n in give.items() if n}


class Membership:
    def __init__(
        self,
        config: BrokerConfig,
        metadata: MetadataStore,
        logs: LogStore,
        cluster: Cluster,
        ownership: Ownership,
        leases: Leases,
        on_refresh: Callable[[], None] | None = None,
        on_slot: SlotHook | None = None,
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.logs = logs
        self.cluster = cluster
        self.ownership = ownership
        self.on_refresh = on_refresh  # ACLs and other caches the handlers keep
        self.on_slot = on_slot  # a coordinator slot taken (True) or given up (False)
        # registered already (Broker.__init__: a live broker with this node id refuses the
        # start before anything else opens)
        self.leases = leases
        self.incarnation = leases.incarnation or uuid.uuid4().hex
        self.me: Member = local_member(config)
        self.interval = config.broker_heartbeat_interval_ms / 1000
        self.lease_s = config.broker_lease_ms / 1000
        self.held: dict[TopicPartition, int] = {}  # what this broker holds, with its epoch
        self.state_version: int | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._tick_lock = asyncio.Lock()
        self.registered = leases.incarnation is not None
        self.failures = 0  # heartbeats that failed (Postgres unreachable)
        self.moves = 0  # partitions taken or given up
        self._listed: list[Member] = []  # not live, still in Metadata (LISTED_LEASES)

    # ------------------------------------------------------------ lifecycle

    async def register(self) -> None:
        """Register this broker (raises NodeIdInUseError: a live broker has this node id)."""
        await asyncio.to_thread(
            self.leases.register, self.incarnation, dict(self.me.endpoints), self.config.broker_rack
        )
        self.registered = True
        self.state_version = await asyncio.to_thread(self.metadata.state_version)
        log.info(
            "broker %d joined the cluster (incarnation %s, lease %d ms, heartbeat %d ms)",
            self.config.node_id,
            self.incarnation,
            self.config.broker_lease_ms,
            self.config.broker_heartbeat_interval_ms,
        )

    async def start(self) -> None:
        """The first heartbeat (so the broker leads its share before it serves), then the loop."""
        try:
            await self.tick()
        except Exception:  # the loop retries
            log.exception("first cluster heartbeat failed")
        self._task = asyncio.create_task(self._loop(), name="cluster-membership")

    def nudge(self) -> None:
        """Heartbeat now (a topic was created here: lead its share without waiting)."""
        self._wake.set()

    async def _loop(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self.tick()
                if self.failures:
                    log.info("cluster heartbeat works again after %d failures", self.failures)
                self.failures = 0
            except NodeIdInUseError as exc:  # another broker took the node id over
                log.error("%s: giving up every partition", exc)
                async with self._tick_lock:
                    for tp in sorted(self.held):
                        await self._unload(tp, "the node id was taken over")
                    self.held.clear()
                    self._publish()
            except Exception as exc:  # noqa: BLE001 - Postgres unreachable: retried, leases lapse
                self.failures += 1
                if self.failures == 1 or self.failures % 100 == 0:
                    log.warning(
                        "cluster heartbeat failed (%d in a row; leases lapse %.1fs after the "
                        "last renew): %s",
                        self.failures,
                        self.lease_s,
                        exc,
                    )

    async def handover(self) -> None:
        """Clean shutdown, first half: no more heartbeats; flush, unload and release every
        partition, so other brokers take them on their next heartbeat."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        async with self._tick_lock:
            parts = sorted(self.held)
            if not parts:
                return
            await self._hand_over(parts, "broker shutting down")
            self.held.clear()
            self._publish()
            try:
                await asyncio.to_thread(self.leases.release, parts)
                log.info("released %d partition leases", len(parts))
            except Exception as exc:  # noqa: BLE001 - they expire by themselves
                log.warning(
                    "could not release the leases (they expire in %.1fs): %s", self.lease_s, exc
                )

    async def deregister(self) -> None:
        """Clean shutdown, second half: this broker leaves ``cluster_brokers``."""
        if not self.registered:
            return
        try:
            await asyncio.to_thread(self.leases.deregister)
        except Exception as exc:  # noqa: BLE001 - its row ages out by itself
            log.warning("could not deregister: %s", exc)

    # ------------------------------------------------------------ one heartbeat

    async def tick(self) -> None:
        async with self._tick_lock:
            if self._stopping:
                return
            await self._tick()

    async def _tick(self) -> None:
        if not self.registered:
            await self.register()
        started = time.monotonic()
        renewed: dict[TopicPartition, int] = dict(await asyncio.to_thread(self.leases.heartbeat))
        deadline = started + self.lease_s
        lost = [tp for tp, epoch in self.held.items() if renewed.get(tp) != epoch]
        for tp in lost:
            await self._unload(tp, "lease lost")
            del self.held[tp]
        if lost:
            log.warning("lost the leases of %d partitions: %s", len(lost), _names(sorted(lost)))
        self._set_deadline(deadline)
        version = await asyncio.to_thread(self.metadata.state_version)
        if version != self.state_version:
            self.state_version = version
            await self.cluster.refresh()
            if self.on_refresh is not None:
                self.on_refresh()
        universe = self._universe()
        for tp in renewed:  # renewed but not led here (a load that failed half-way)
            if tp not in self.held and tp in universe:
                # taken again, never adopted at its epoch: the epoch is bumped, so nothing
                # written under the old one can pass the fence
                epoch = await asyncio.to_thread(self.leases.acquire, tp[0], tp[1])
                if epoch is not None:
                    await self._take(tp, epoch)
        brokers = await asyncio.to_thread(
            self.leases.live_brokers, LISTED_LEASES * self.config.broker_lease_ms
        )
        leases = await asyncio.to_thread(self.leases.leases)
        seen = [
            (Member(b.node_id, dict(b.endpoints or {}), b.rack), b.heartbeat_age_ms)
            for b in brokers
            if b.node_id != self.config.node_id
        ]
        live = {m.node_id: m for m, age in seen if age < self.config.broker_lease_ms}
        live[self.config.node_id] = self.me
        self._listed = [m for m, _ in seen if m.node_id not in live]
        by_tp = {(x.topic, x.partition): x for x in leases}
        self._last_leases = by_tp
        self._live = live
        self._deadline = deadline
        self._publish()
        await self._rebalance(universe, by_tp, sorted(live))
        self._publish()

    def _set_deadline(self, deadline: float) -> None:
        self.logs.set_lease_deadline(deadline)
        self._deadline = deadline

    def _publish(self) -> None:
        """The Ownership view the handlers read, from the last reading and what is held now."""
        leases: dict[TopicPartition, Lease] = getattr(self, "_last_leases", {})
        live: dict[int, Member] = getattr(self, "_live", {self.config.node_id: self.me})
        leaders = {
            tp: (x.node_id, x.epoch)
            for tp, x in leases.items()
            if x.node_id in live and x.node_id != self.config.node_id and not _expired(x)
        }
        self.ownership.update(
            live.values(),
            leaders,
            self.held,
            getattr(self, "_deadline", 0.0),
            self._listed,
        )

    def _universe(self) -> dict[TopicPartition, bool]:
        """Every partition the brokers share out -> has a log (False: a coordinator slot)."""
        parts: dict[TopicPartition, bool] = {
            (name, p): True for name, t in self.cluster.topics.items() for p in range(t.partitions)
        }
        parts.update({tp: False for tp in coordinator_slots()})
        return parts

    async def _rebalance(
        self,
        universe: dict[TopicPartition, bool],
        leases: dict[TopicPartition, Lease],
        live: list[int],
    ) -> None:
        me = self.config.node_id
        for tp in [tp for tp in self.held if tp not in universe]:  # a deleted topic's
            await self._give_up([tp], "the topic is gone")
        # an operator's move: a partition pinned to another live broker goes there
        pinned_away = [
            tp
            for tp in self.held
            if (pref := _preferred(leases.get(tp))) is not None and pref != me and pref in live
        ]
        if pinned_away:
            await self._give_up(pinned_away, "moved by the operator")
        by_topic: dict[str, list[TopicPartition]] = {}
        for tp in universe:
            by_topic.setdefault(tp[0], []).append(tp)
        for _topic, parts in sorted(by_topic.items()):
            parts.sort()
            # pinned partitions are the operator's: left out of the fair share
            shared = [
                tp for tp in parts if tp in self.held or _preferred(leases.get(tp)) not in live
            ]
            holders: dict[TopicPartition, int] = {}
            for tp in shared:
                lease = leases.get(tp)
                if tp in self.held:
                    holders[tp] = me
                elif lease is not None and lease.node_id in live and lease.held:
                    holders[tp] = lease.node_id
            plan = share_plan(shared, holders, live)
            surplus = plan.get(me, 0)
            if surplus:
                mine = sorted(tp for tp in shared if tp in self.held)
                await self._give_up(mine[-surplus:], "rebalancing")
                continue
            ceiling = math.ceil(len(shared) / max(1, len(live)))
            room = ceiling - sum(1 for tp in shared if tp in self.held)
            wanted = [
                tp for tp in parts if _preferred(leases.get(tp)) == me and tp not in self.held
            ]
            if room > 0:
                start = live.index(me) * len(parts) // len(live) if me in live else 0
                ring = parts[start:] + parts[:start]
                candidates = [
                    tp for tp in ring if tp not in self.held and tp in shared and tp not in holders
                ]
                candidates.sort(key=lambda tp: leases.get(tp) is not None)  # never owned first
                wanted += candidates[:room]
            for tp in wanted:
                epoch = await asyncio.to_thread(self.leases.acquire, tp[0], tp[1])
                if epoch is None:
                    continue  # another broker was quicker, or it is still someone's
                if not await self._take(tp, epoch):
                    continue
                if universe.get(tp) is not None and tp[0] in self.cluster.topics:
                    log.info("took %s-%d (epoch %d)", tp[0], tp[1], epoch)

    async def _take(self, tp: TopicPartition, epoch: int) -> bool:
        """Lead a partition whose lease this broker just acquired: load its log from Postgres
        (a coordinator slot has none). A load that fails releases the lease again."""
        if tp[0] in self.cluster.topics:
            try:
                await self.logs.load_partition(tp[0], tp[1], epoch)
            except Exception as exc:  # noqa: BLE001 - Postgres or the object store: retried later
                log.warning("could not load %s-%d: %s; releasing it", tp[0], tp[1], exc)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.leases.release, [tp])
                return False
        self.held[tp] = epoch
        self.moves += 1
        if tp[0] not in self.cluster.topics and self.on_slot is not None:
            try:
                await self.on_slot(tp[0], tp[1], True)
            except Exception:  # the slot is held; its transactions complete on a retry
                log.exception("taking over coordinator slot %s-%d", *tp)
        return True

    async def _give_up(self, parts: Iterable[TopicPartition], why: str) -> None:
        """Flush, unload and release partitions (another broker takes them at once)."""
        parts = [tp for tp in parts if tp in self.held]
        if not parts:
            return
        await self._hand_over(parts, why)
        for tp in parts:
            del self.held[tp]
        self._publish()
        await asyncio.to_thread(self.leases.release, parts)
        self.moves += len(parts)
        log.info("released %d partitions (%s): %s", len(parts), why, _names(parts))

    async def _hand_over(self, parts: list[TopicPartition], why: str) -> None:
        """Partitions given up voluntarily: their logs stop accepting, flush until everything
        accepted is acknowledged and unload (``LogStore.hand_over``); coordinator slots are
        dropped. The caller releases the leases after."""
        await self.logs.hand_over([tp for tp in parts if tp in self.logs.partitions], why)
        for tp in parts:
            await self._unload(tp, why)

    async def _unload(self, tp: TopicPartition, reason: str) -> None:
        if (tp[0], tp[1]) in self.logs.partitions:
            await self.logs.unload_partition(tp[0], tp[1], reason)
        elif tp[0] not in self.cluster.topics and self.on_slot is not None:
            await self.on_slot(tp[0], tp[1], False)

    def assignment(self) -> Assignment:
        """What ``GET /v1/cluster/assignment`` shows: the live brokers, every partition of every
        topic with its leader (-1: none live) and lease epoch, as of the last heartbeat."""
        leases: dict[TopicPartition, Lease] = getattr(self, "_last_leases", {})
        partitions = []
        for name, topic in sorted(self.cluster.topics.items()):
            for p in range(topic.partitions):
                found = self.ownership.leader(name, p)
                lease = leases.get((name, p))
                partitions.append(
                    PartitionEntry(
                        topic=name,
                        partition=p,
                        leader=found[0] if found else -1,
                        epoch=found[1] if found else (lease.epoch if lease else -1),
                        preferred=_preferred(lease),
                    )
                )
        return Assignment(
            node_id=self.config.node_id,
            controller_id=self.ownership.controller_id,
            brokers=[
                BrokerEntry(node_id=m.node_id, rack=m.rack, endpoints=dict(m.endpoints))
                for m in self.ownership.live()
            ],
            partitions=partitions,
        )

    async def move(self, topic: str, partition: int, node_id: int | None) -> str | None:
        """An operator's move (None: done; else why not): the partition's preferred node, which
        its leader hands it to on the next heartbeat (both are woken now)."""
        known = self.cluster.topics.get(topic)
        if known is None or not 0 <= partition < known.partitions:
            return f"no partition {topic}-{partition}"
        if node_id is not None and node_id not in self.ownership.members:
            live = ", ".join(str(m.node_id) for m in self.ownership.live())
            return f"broker {node_id} is not live (live brokers: {live})"
        await asyncio.to_thread(self.leases.set_preferred, topic, partition, node_id)
        self.nudge()
        return None


def _preferred(lease: Lease | None) -> int | None:
    value = getattr(lease, "preferred_node", None) if lease is not None else None
    return None if value is None else int(value)


def _expired(lease: Lease) -> bool:
    return not lease.held


def _names(parts: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in parts)
