"""Cluster membership and partition leadership in Postgres (issue 16): which brokers are live
and which one leads each partition, with a fencing epoch.

A broker registers under its node id (a second live broker with the same id is refused), then
heartbeats: one transaction renews its row and every lease it still holds. A lease is taken
only when free (expired, released, or never taken) and every change of owner bumps its epoch,
which the index commit of a flush checks (``MetadataStore.add_chunks(fence=...)``): a broker
that lost a lease can keep running but can never make data visible for that partition again.

Time is always the database's (``clock_timestamp()``): brokers' clocks may disagree, the
database's is the one every lease is compared with. SQL only, blocking: the broker calls these
from a thread (``asyncio.to_thread``) on a connection of their own (``side_connection``), so a
heartbeat never waits behind a long statement of the metadata store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.storage.metadata import MetadataInUseError, MetadataStore

# "now + lease_ms", "now - lease_ms" in the database's clock; ``?`` is the lease in ms.
_UNTIL = "clock_timestamp() + (? * interval '1 millisecond')"
_SINCE = "clock_timestamp() - (? * interval '1 millisecond')"
_REMAINING_MS = "(extract(epoch FROM (expires_at - clock_timestamp())) * 1000)::bigint"


class NodeIdInUseError(MetadataInUseError):
    """Another live broker (a recent heartbeat, another incarnation) has this node id."""


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A registered broker. ``endpoints``: listener name -> [host, port] (advertised), plus
    "admin"/"registry"/"catalog" -> URL. ``heartbeat_age_ms``: since its last heartbeat, by
    the database's clock."""

    node_id: int
    incarnation: str
    endpoints: dict[str, Any]
    rack: str | None
    started_at: datetime
    heartbeat_age_ms: int


@dataclass(frozen=True, slots=True)
class Lease:
    """A partition's lease row. ``node_id``: its holder, or the last one when it expired (-1:
    never held; a row ``set_preferred`` made). ``remaining_ms``: until it expires, by the
    database's clock (<= 0: free). ``preferred_node``: the owner an operator asked for."""

    topic: str
    partition: int
    node_id: int
    epoch: int
    remaining_ms: int
    preferred_node: int | None

    @property
    def held(self) -> bool:
        return self.node_id >= 0 and self.remaining_ms > 0


class Leases:
    """One broker's view of the cluster tables; ``metadata`` must be on Postgres."""

    def __init__(self, metadata: MetadataStore, node_id: int, lease_ms: int) -> None:
        if not metadata.db.postgres:
            raise ValueError("leases are a cluster's: the metadata database must be Postgres")
        # its own connection: a heartbeat never waits behind the store's long statements
        # (the orphan sweep, index reads), and gives up before its lease would lapse
        self.db = metadata.side_connection(statement_timeout_ms=lease_ms)
        self.metadata = metadata
        self.node_id = node_id
        self.lease_ms = lease_ms
        self.incarnation: str | None = None
        self._owner: str | None = None

    # ------------------------------------------------------------ brokers

    def register(self, incarnation: str, endpoints: dict[str, Any], rack: str | None) -> None:
        """Insert or take over this node id's row. One statement, so two brokers starting at
        once with the same id cannot both win: the row is taken only when it is new, ours
        (same incarnation) or its holder has not heartbeated for ``lease_ms``."""
        rows = self.db.query(
            "INSERT INTO cluster_brokers AS b "
            "(node_id, incarnation, endpoints, rack, started_at, heartbeat_at) "
            "VALUES (?, ?, ?, ?, clock_timestamp(), clock_timestamp()) "
            "ON CONFLICT (node_id) DO UPDATE SET incarnation = excluded.incarnation, "
            "endpoints = excluded.endpoints, rack = excluded.rack, "
            "started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at "
            f"WHERE b.incarnation = excluded.incarnation OR b.heartbeat_at <= {_SINCE} "
            "RETURNING node_id",
            (self.node_id, incarnation, json.dumps(endpoints), rack, self.lease_ms),
        )
        if not rows:
            raise NodeIdInUseError(
                f"node id {self.node_id} is in use: another live broker with that id "
                f"heartbeated within the last {self.lease_ms} ms (broker.lease.ms) in this "
                "metadata database; give every broker of a cluster its own --node-id "
                "(node.id), or wait for the old one's lease to lapse"
            )
        self.incarnation = incarnation
        self._owner = incarnation  # whose leases ``release`` may give up, after deregister too
        self.metadata.incarnation = incarnation  # the index commit's fence matches it

    def heartbeat(self) -> dict[tuple[str, int], int]:
        """Renew this broker's row and every lease it still holds (unexpired), in one
        transaction; returns those held: (topic, partition) -> epoch. Raises
        ``NodeIdInUseError`` when another incarnation took the node id over (this broker
        missed heartbeats for longer than a lease): it must stop leading anything."""
        if self.incarnation is None:
            raise RuntimeError("heartbeat before register")
        with self.db.transaction():
            mine = self.db.query(
                "UPDATE cluster_brokers SET heartbeat_at = clock_timestamp() "
                "WHERE node_id = ? AND incarnation = ? RETURNING node_id",
                (self.node_id, self.incarnation),
            )
            if not mine:
                other = self.db.query(
                    "SELECT incarnation FROM cluster_brokers WHERE node_id = ?", (self.node_id,)
                )
                if other:
                    raise NodeIdInUseError(
                        f"node id {self.node_id} was taken over by another broker "
                        f"(incarnation {other[0][0]}) after this one missed its heartbeats"
                    )
                # our row was removed (an operator, or a deregister): put it back
                self.db.execute(
                    "INSERT INTO cluster_brokers "
                    "(node_id, incarnation, endpoints, rack, started_at, heartbeat_at) "
                    "VALUES (?, ?, '{}', NULL, clock_timestamp(), clock_timestamp())",
                    (self.node_id, self.incarnation),
                )
            rows = self.db.query(
                f"UPDATE partition_leases SET expires_at = {_UNTIL} "
                "WHERE node_id = ? AND incarnation = ? AND expires_at > clock_timestamp() "
                "RETURNING topic, partition, epoch",
                (self.lease_ms, self.node_id, self.incarnation),
            )
        return {(t, int(p)): int(e) for t, p, e in rows}

    def live_brokers(self, within_ms: int | None = None) -> list[BrokerInfo]:
        """Brokers that heartbeated within ``within_ms`` (default ``lease_ms``: the live ones),
        by node id."""
        return [
            BrokerInfo(int(node_id), incarnation, json.loads(endpoints), rack, started_at, int(age))
            for node_id, incarnation, endpoints, rack, started_at, age in self.db.query(
                "SELECT node_id, incarnation, endpoints, rack, started_at, "
                "(extract(epoch FROM (clock_timestamp() - heartbeat_at)) * 1000)::bigint "
                f"FROM cluster_brokers WHERE heartbeat_at > {_SINCE} ORDER BY node_id",
                (self.lease_ms if within_ms is None else within_ms,),
            )
        ]

    def deregister(self) -> None:
        """Clean shutdown (after ``release``): the row goes, so the others stop counting this
        broker at once and the node id is free for its next start."""
        self.db.execute(
            "DELETE FROM cluster_brokers WHERE node_id = ? AND incarnation = ?",
            (self.node_id, self.incarnation),
        )
        self.incarnation = None

    # ------------------------------------------------------------ leases

    def leases(self) -> list[Lease]:
        """Every lease row (held, expired, or only a preference), by topic and partition."""
        return [
            Lease(t, int(p), int(n), int(e), int(r), None if pref is None else int(pref))
            for t, p, n, e, r, pref in self.db.query(
                f"SELECT topic, partition, node_id, epoch, {_REMAINING_MS}, preferred_node "
                "FROM partition_leases ORDER BY topic, partition"
            )
        ]

    def acquire(self, topic: str, partition: int) -> int | None:
        """Take the partition's lease for ``lease_ms``: the new epoch, or None when it is not
        free. Free: no row yet, expired or released, or already this incarnation's (taking it
        again bumps the epoch too: whatever the broker had in flight under the old one is
        fenced). A lease another incarnation of this node id holds is not free: that process
        may still run, and sharing the lease would let both pass the fence.
        A partition an operator prefers on another node is left to that node while it is
        live; when it is not, it is taken like any other (free only)."""
        rows = self.db.query(
            "INSERT INTO partition_leases AS l "
            "(topic, partition, node_id, epoch, expires_at, preferred_node, incarnation) "
            f"VALUES (?, ?, ?, 1, {_UNTIL}, NULL, ?) "
            "ON CONFLICT (topic, partition) DO UPDATE SET node_id = excluded.node_id, "
            "epoch = l.epoch + 1, expires_at = excluded.expires_at, "
            "incarnation = excluded.incarnation "
            "WHERE (l.expires_at <= clock_timestamp() OR (l.node_id = excluded.node_id "
            "AND l.incarnation = excluded.incarnation)) "
            "AND NOT (l.preferred_node IS NOT NULL AND l.preferred_node <> excluded.node_id "
            "AND EXISTS (SELECT 1 FROM cluster_brokers b WHERE b.node_id = l.preferred_node "
            f"AND b.heartbeat_at > {_SINCE})) "
            "RETURNING epoch",
            (topic, partition, self.node_id, self.lease_ms, self.incarnation, self.lease_ms),
        )
        return int(rows[0][0]) if rows else None

    def release(self, parts: list[tuple[str, int]] | set[tuple[str, int]]) -> None:
        """Expire this node's leases of ``parts`` now (epoch unchanged): another broker can
        take them at its next heartbeat. The caller flushed them first."""
        with self.db.transaction():
            self.db.executemany(
                "UPDATE partition_leases SET expires_at = clock_timestamp() "
                "WHERE topic = ? AND partition = ? AND node_id = ? AND incarnation = ? "
                "AND expires_at > clock_timestamp()",
                [(t, p, self.node_id, self._owner) for t, p in sorted(parts)],
            )

    def set_preferred(self, topic: str, partition: int, node_id: int | None) -> None:
        """The owner an operator wants for a partition (None: no preference). Its current
        holder is expected to release it (after a flush) when the preferred node is live; the
        row is made (never held, epoch 0) when the partition has none yet."""
        self.db.execute(
            "INSERT INTO partition_leases AS l "
            "(topic, partition, node_id, epoch, expires_at, preferred_node) "
            "VALUES (?, ?, -1, 0, clock_timestamp(), ?) "
            "ON CONFLICT (topic, partition) DO UPDATE SET preferred_node = excluded.preferred_node",
            (topic, partition, node_id),
        )
