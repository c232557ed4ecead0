"""broker.ownership: what a cluster member answers from its last heartbeat's reading. The
brokers Metadata lists are the live ones and those silent for less than ``LISTED_LEASES``
leases; leaders and coordinators are the live brokers' only, so a listed broker is never
where a client is sent, only a connection the client keeps (tests/broker/test_cluster.py has
the stalled broker itself)."""

from __future__ import annotations

import time

from broker.ownership import KEY_GROUP, Member, Ownership, slot_partition


def _member(node_id: int) -> Member:
    return Member(node_id, {"PLAINTEXT": ["127.0.0.1", 9000 + node_id]})


def test_a_silent_broker_is_listed_but_leads_and_coordinates_nothing() -> None:
    ownership = Ownership(_member(1), clustered=True)
    slot = slot_partition(KEY_GROUP, "g")
    ownership.update(
        [_member(2)],
        {("t", 0): (2, 4), ("t", 1): (3, 7), slot: (3, 2)},
        {},
        time.monotonic() + 60,
        listed=[_member(3), _member(2)],  # 2 is live: listed once
    )
    assert [m.node_id for m in ownership.live()] == [1, 2]
    assert [m.node_id for m in ownership.in_metadata()] == [1, 2, 3]
    assert ownership.leader("t", 0) == (2, 4)
    assert ownership.leader("t", 1) is None  # broker 3's lease: not a live broker's
    assert ownership.coordinator(KEY_GROUP, "g") is None
    assert ownership.controller_id == 1


def test_the_next_reading_replaces_the_listed_brokers() -> None:
    ownership = Ownership(_member(1), clustered=True)
    ownership.update([], {}, {}, time.monotonic() + 60, listed=[_member(3)])
    assert [m.node_id for m in ownership.in_metadata()] == [1, 3]
    ownership.update([_member(3)], {}, {}, time.monotonic() + 60)  # 3 is back
    assert [m.node_id for m in ownership.in_metadata()] == [1, 3]
    assert [m.node_id for m in ownership.live()] == [1, 3]
    ownership.update([], {}, {}, time.monotonic() + 60)  # 3 silent for too long, or gone
    assert [m.node_id for m in ownership.in_metadata()] == [1]
