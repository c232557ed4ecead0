"""Cluster membership and partition leases in a real Postgres (issue 16): a node id is one live
broker's, leases are taken only when free and every change of owner bumps the epoch, an
operator's preferred node is respected, and the index commit of a flush fences a broker that
lost a lease (its chunks, producer states and aborted transactions never reach the index)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.kafka import records
from broker.kafka.transactions import TransactionCoordinator
from broker.storage.leases import Leases, NodeIdInUseError
from broker.storage.logstore import (
    LogStore,
    PartitionLog,
    ProduceError,
    ProducerState,
    UpgradedWalError,
)
from broker.storage.metadata import (
    MIGRATIONS,
    BatchRef,
    Chunk,
    CoordinatorFencedError,
    FencedError,
    MetadataStore,
    pack_batch_index,
)
from broker.storage.objectstore import LocalObjectStore
from broker.storage.retention import CLUSTER_ORPHAN_GRACE_MS, Retention
from broker.storage.txn_metadata import COMPLETE_COMMIT, ONGOING, TransactionStore
from broker.storage.wal import WriteAheadLog
from tests.broker.cluster_logs import lead, log_stores, no_tables
from tests.postgres import PostgresServer
from tests.postgres import postgres as postgres  # one server for the module
from tests.support import free_port, wait_for

LEASE_MS = 6000
SHORT_MS = 300  # a lease made to lapse within a test


@pytest.fixture
def uri(postgres: PostgresServer) -> str:
    return postgres.create_database(f"leases_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def stores(uri: str) -> Iterator[list[MetadataStore]]:
    """Three brokers' metadata stores on one fresh database, opened at once (their migrations
    race: the advisory lock around ``migrate`` must make that safe)."""
    opened: list[MetadataStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            store = MetadataStore(uri)
            opened.append(store)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert not errors, errors
        assert len(opened) == 3
        yield opened
    finally:
        for store in opened:
            store.close()


def _member(store: MetadataStore, node_id: int, lease_ms: int = LEASE_MS) -> Leases:
    leases = Leases(store, node_id, lease_ms)
    leases.register(uuid.uuid4().hex, {"PLAINTEXT": ["127.0.0.1", 9000 + node_id]}, "r1")
    return leases


def test_a_node_id_is_one_live_brokers(stores: list[MetadataStore]) -> None:
    [(version,)] = stores[0].db.query("SELECT version FROM schema_version")
    assert version == len(MIGRATIONS)
    one = _member(stores[0], 1)
    with pytest.raises(NodeIdInUseError, match="node id 1 is in use: another live broker"):
        _member(stores[1], 1)
    two = _member(stores[1], 2)  # another id is welcome
    live = one.live_brokers()
    assert [(b.node_id, b.endpoints, b.rack) for b in live] == [
        (1, {"PLAINTEXT": ["127.0.0.1", 9001]}, "r1"),
        (2, {"PLAINTEXT": ["127.0.0.1", 9002]}, "r1"),
    ]
    assert all(0 <= b.heartbeat_age_ms < LEASE_MS for b in live)
    assert one.incarnation is not None
    one.register(one.incarnation, {}, None)  # the same incarnation again: fine

    # a clean shutdown frees the id at once
    one.deregister()
    assert [b.node_id for b in two.live_brokers()] == [2]
    again = _member(stores[2], 1)

    # a broker that stops heartbeating loses its id after a lease
    quiet = Leases(stores[0], 3, SHORT_MS)
    quiet.register("old", {}, None)
    successor = Leases(stores[1], 3, SHORT_MS)
    wait_for(
        lambda: _registered(successor, "new"), timeout=10, what="the lapsed node id taken over"
    )
    with pytest.raises(NodeIdInUseError, match="taken over by another broker"):
        quiet.heartbeat()
    assert successor.heartbeat() == {}
    assert {b.node_id for b in again.live_brokers()} == {1, 2, 3}


def _registered(leases: Leases, incarnation: str) -> bool:
    try:
        leases.register(incarnation, {}, None)
    except NodeIdInUseError:
        return False
    return True


def test_leases_are_taken_when_free_and_every_new_owner_bumps_the_epoch(
    stores: list[MetadataStore],
) -> None:
    short = _member(stores[0], 1, SHORT_MS)
    two = _member(stores[1], 2)
    assert short.acquire("t", 0) == 1
    assert two.acquire("t", 0) is None  # held
    assert short.acquire("t", 0) == 2  # taken again by its holder: a new epoch all the same
    assert short.heartbeat() == {("t", 0): 2}
    [lease] = two.leases()
    assert (lease.topic, lease.partition, lease.node_id, lease.epoch) == ("t", 0, 1, 2)
    assert lease.held and 0 < lease.remaining_ms <= SHORT_MS

    # not renewed: it lapses and the other broker takes it, with a new epoch
    assert wait_for(lambda: two.acquire("t", 0), timeout=10, what="the lapsed lease") == 3
    assert short.heartbeat() == {}  # no longer its to renew
    assert short.acquire("t", 0) is None
    assert two.heartbeat() == {("t", 0): 3}

    # released: free at once, epoch unchanged until the next owner takes it
    two.release([("t", 0)])
    [lease] = short.leases()
    assert (lease.node_id, lease.epoch, lease.held) == (2, 3, False)
    assert two.heartbeat() == {}
    assert short.acquire("t", 0) == 4

    # coordinator slots are lease rows like any partition
    assert two.acquire("__consumer_offsets", 7) == 1
    assert two.heartbeat() == {("__consumer_offsets", 7): 1}


def test_a_preferred_node_gets_the_partition(stores: list[MetadataStore]) -> None:
    one = _member(stores[0], 1)
    two = _member(stores[1], 2)
    one.set_preferred("t", 0, 2)  # before anyone held it: a row that was never held
    [lease] = one.leases()
    assert (lease.node_id, lease.epoch, lease.held, lease.preferred_node) == (-1, 0, False, 2)
    assert one.acquire("t", 0) is None  # node 2 is live: it is 2's
    assert two.acquire("t", 0) == 1

    # moved while held: the holder keeps it until it releases (after a flush)
    assert one.acquire("t", 1) == 1
    one.set_preferred("t", 1, 2)
    assert one.heartbeat() == {("t", 1): 1}
    assert two.acquire("t", 1) is None
    one.release([("t", 1)])
    assert one.acquire("t", 1) is None
    assert two.acquire("t", 1) == 2

    # a preferred node that is not live does not keep a free partition from the others
    one.set_preferred("t", 2, 9)
    assert one.acquire("t", 2) == 1
    two.deregister()
    two.release([("t", 0)])  # (a deregistered broker's leases: released or lapsed)
    assert one.acquire("t", 0) == 2
    one.set_preferred("t", 0, None)
    assert {(x.partition, x.preferred_node) for x in one.leases()} == {(0, None), (1, 2), (2, 9)}


def _chunk(topic: str, partition: int, base: int, key: str) -> Chunk:
    refs = [BatchRef(base, 0, 100, 1_000, 1_000)]
    return Chunk(
        topic, partition, base, base + 1, key, 0, 100, 1_000, 1_000, pack_batch_index(refs)
    )


def test_the_index_commit_fences_partitions_whose_lease_was_lost(
    stores: list[MetadataStore],
) -> None:
    store = stores[0]
    store.create_topic("t", 4, {})
    one = _member(store, 1)
    two = _member(stores[1], 2)
    epochs = {("t", p): one.acquire("t", p) or 0 for p in range(3)}
    assert epochs == {("t", 0): 1, ("t", 1): 1, ("t", 2): 1}
    one.release([("t", 1)])
    assert two.acquire("t", 1) == 2  # a new owner: node 1 is fenced on t-1
    one.release([("t", 2)])  # released, nobody took it: fenced too (expired)

    def write(key: str, fence_epochs: dict[tuple[str, int], int]) -> set[tuple[str, int]]:
        return store.add_chunks(
            [_chunk("t", p, 0, key) for p in range(4)],
            {("t", p, 1000): {"epoch": 0, "recent": [[0, 0, 0]]} for p in range(4)},
            [("t", p, 1000, 0, 0) for p in range(4)],
            fence=(1, fence_epochs),
        )

    # t-3: never leased, and not among the epochs this node claims
    assert write("segments/a.seg", epochs) == {("t", 1), ("t", 2), ("t", 3)}
    assert [c.object_key for c in store.chunks("t", 0)] == ["segments/a.seg"]
    assert [store.chunks("t", p) for p in (1, 2, 3)] == [[], [], []]
    assert set(store.producer_states()) == {("t", 0, 1000)}
    assert set(store.aborted_transactions()) == {("t", 0)}
    chunks, start, states, aborted = stores[1].load_partition("t", 0)  # as a new leader would
    assert ([c.object_key for c in chunks], start) == (["segments/a.seg"], 0)
    assert (states, aborted) == ({1000: {"epoch": 0, "recent": [[0, 0, 0]]}}, [(1000, 0, 0)])

    # a stale epoch of a lease held again by the same node is fenced as well
    assert one.acquire("t", 0) == 2
    assert store.add_chunks([_chunk("t", 0, 1, "segments/b.seg")], {}, (), (1, epochs)) == {
        ("t", 0)
    }
    assert [c.object_key for c in store.chunks("t", 0)] == ["segments/a.seg"]
    # the new owner of t-1 writes it (through its own store: it knows its incarnation)
    node2 = stores[1]
    assert (
        node2.add_chunks([_chunk("t", 1, 0, "segments/c.seg")], {}, (), (2, {("t", 1): 2})) == set()
    )
    assert [c.object_key for c in store.chunks("t", 1)] == ["segments/c.seg"]
    assert store.object_keys() == {"segments/a.seg", "segments/c.seg"}  # b.seg: for the sweep

    # retention and DeleteRecords are fenced the same way
    with pytest.raises(FencedError):
        store.drop_chunks_before("t", 1, 1, fence=(1, 1))
    assert [c.object_key for c in store.chunks("t", 1)] == ["segments/c.seg"]
    assert node2.drop_chunks_before("t", 1, 1, fence=(2, 2)) == ["segments/c.seg"]
    assert store.log_start_offsets()[("t", 1)] == 1


def test_changes_the_other_brokers_must_see_bump_the_state_version(
    stores: list[MetadataStore],
) -> None:
    store, other = stores[0], stores[1]
    seen = [other.state_version()]

    def changed() -> None:
        seen.append(other.state_version())
        assert seen[-1] > seen[-2]

    store.create_topic("t", 1, {})
    changed()
    store.add_partitions("t", 2)
    changed()
    store.set_configs("t", {"retention.ms": "1"})
    changed()
    store.set_broker_configs("", {"log.retention.ms": "1"})
    changed()
    acl = (2, "t", 3, "User:a", "*", 3, 3)
    store.add_acls([acl])
    changed()
    store.delete_acls([acl])
    changed()
    store.alter_scram_credentials([], [("u", "SCRAM-SHA-256", b"s", b"k", b"v", 4096)])
    changed()
    store.delete_topic("t")
    changed()
    store.commit_offsets("g", [("t", 0, 1, 0, None)])  # not cluster state
    store.add_chunks([_chunk("x", 0, 0, "k")], {})
    assert other.state_version() == seen[-1]


# ---------------------------------------------------------------- the log store in cluster mode


def _idempotent(value: bytes, producer_id: int, sequence: int) -> bytes:
    return records.encode_batch(
        [(None, value)], 1_700_000_000_000, producer=(producer_id, 0, sequence)
    )


async def _refused(call: Awaitable[object]) -> ProduceError:
    try:
        await call
    except ProduceError as exc:
        return exc
    raise AssertionError("the produce was acknowledged")


class SlowFirstPut(LocalObjectStore):
    """The directory store whose first put takes ``delay`` seconds (a slow object store, once),
    recording the keys put."""

    def __init__(self, store: LocalObjectStore, delay: float) -> None:
        super().__init__(store.root)
        self.delay = delay
        self.keys: list[str] = []

    def put(self, key: str, data: bytes) -> None:
        self.keys.append(key)
        if len(self.keys) == 1:
            time.sleep(self.delay)
        super().put(key, data)


async def _values(logs: LogStore, part: PartitionLog) -> list[bytes | None]:
    data = await logs.read(part, part.log_start_offset, 1 << 20)
    return [r.value for _, b in records.iter_batches(data) for r in records.decode_batch(b)[1]]


def test_a_new_leader_loads_exactly_the_acknowledged_batches_and_fences_the_old_one(
    uri: str, tmp_path: Path
) -> None:
    """Two brokers' log stores on one Postgres database and one object-store directory. A
    leads t-0 and t-1 (a short lease it does not renew, as if paused) and acknowledges
    idempotent batches; one more is accepted but never acknowledged. B takes t-0 over: it
    loads exactly the acknowledged batches, the next offset and the producer's sequences (a
    retried duplicate is recognised). A's next flush is fenced on t-0 (a new owner) and on t-1
    (expired, no new owner): refused with NOT_LEADER_OR_FOLLOWER, nothing of it indexed."""

    async def scenario() -> None:
        objects = LocalObjectStore(tmp_path / "objects")  # every broker reaches it
        # no timer flushes: acknowledging must not wait for one
        config_a = BrokerConfig(home=tmp_path / "a", segment_flush_ms=600_000)
        config_b = BrokerConfig(home=tmp_path / "b", segment_flush_ms=600_000)
        async with log_stores(uri, objects, config_a, config_b) as [(meta_a, a), (meta_b, b)]:
            meta_a.create_topic("t", 2, {})
            leases_a, leases_b = Leases(meta_a, 1, SHORT_MS), Leases(meta_b, 2, LEASE_MS)
            leases_a.register("a", {}, None)
            leases_b.register("b", {}, None)
            a_parts = await lead(a, leases_a, [("t", 0), ("t", 1)])  # A's clock: it still leads
            assert a.epochs == {("t", 0): 1, ("t", 1): 1}
            pid = meta_a.next_producer_id()
            bases = await asyncio.gather(
                *(a.append_and_wait(a_parts[0], _idempotent(b"v%d" % i, pid, i)) for i in range(3))
            )
            assert sorted(bases) == [0, 1, 2] and a_parts[0].high_watermark == 3
            assert await a.delete_records(a_parts[0], 1) == 1  # the log start moves too
            assert (
                await a.append_and_wait(a_parts[1], records.encode_batch([(None, b"x0")], 1)) == 0
            )
            await a.append(a_parts[0], _idempotent(b"v3", pid, 3), 1 << 20)  # never acknowledged
            assert a_parts[0].next_offset == 4 and a_parts[0].high_watermark == 3
            assert not config_a.wal_dir.exists()  # no local WAL in cluster mode

            epoch = await asyncio.to_thread(
                wait_for, lambda: leases_b.acquire("t", 0), 10, 0.05, "A's lapsed lease"
            )
            assert epoch == 2
            part = await b.load_partition("t", 0, epoch)
            b.set_lease_deadline(time.monotonic() + LEASE_MS / 1000)
            assert (part.log_start_offset, part.next_offset, part.high_watermark) == (1, 3, 3)
            assert await _values(b, part) == [b"v1", b"v2"]
            # the producer's retry of v2 (its ack lost) is a duplicate on B too; v3 goes on
            assert await b.append_and_wait(part, _idempotent(b"v2", pid, 2)) == 2
            assert await b.append_and_wait(part, _idempotent(b"v3", pid, 3)) == 3
            assert part.next_offset == 4

            # A, still running, tries to make v3 (and v4) and x1 visible: fenced
            written = a.segments_written
            errors = await asyncio.gather(
                _refused(a.append_and_wait(a_parts[0], _idempotent(b"v4", pid, 4))),
                _refused(a.append_and_wait(a_parts[1], records.encode_batch([(None, b"x1")], 1))),
            )
            assert [e.code for e in errors] == [ErrorCode.not_leader_or_follower] * 2
            assert "fenced" in errors[0].message
            assert a.segments_written == written + 1  # written, then found fenced
            assert a.partitions == {} and a.epochs == {}
            refused = await _refused(a.append_and_wait(a_parts[0], _idempotent(b"v5", pid, 5)))
            assert refused.code == ErrorCode.not_leader_or_follower
            assert [(c.base_offset, c.end_offset) for c in meta_b.chunks("t", 0)][-1] == (3, 4)
            assert [c.end_offset for c in meta_b.chunks("t", 1)] == [1]
            state = ProducerState.from_json(meta_b.load_partition("t", 0)[2][pid])
            assert state.last_sequence == 3  # B's v3; nothing of A's v3, v4
            again = await b.load_partition("t", 0, epoch)  # the same epoch: the same log
            assert again is part and await _values(b, part) == [b"v1", b"v2", b"v3"]

            # B's orphan sweep leaves an object another broker just put (its index commit
            # may still be on its way) and deletes an old one no chunk refers to, by the
            # store's clock: the writer's clock in the key (here far behind for the fresh
            # one, far ahead for the old one) does not count
            fresh = "segments/0000000000001-inflight.seg"
            old = f"segments/{int(time.time() * 1000) + 3_600_000:013d}-orphan.seg"
            for key in (fresh, old):
                objects.put(key, b"x")
            long_ago = time.time() - 2 * CLUSTER_ORPHAN_GRACE_MS / 1000
            os.utime(tmp_path / "objects" / old, (long_ago, long_ago))
            retention = Retention(Cluster(config_b, meta_b, b), b, no_tables, 600_000)
            await retention._sweep_orphans()
            listed = set(objects.list("segments/"))
            assert fresh in listed and old not in listed
            assert {c.object_key for c in meta_b.chunks("t", 0)} <= listed

            # a put whose commit comes later than half the sweep's grace is not committed:
            # the batch is written again under a new key, and acknowledged from that one
            b.commit_grace_ms = 1000
            slow = SlowFirstPut(objects, 0.7)
            b.store = slow
            assert await b.append_and_wait(part, records.encode_batch([(None, b"v4")], 1)) == 4
            assert len(slow.keys) == 2 and slow.keys[0] != slow.keys[1]
            indexed = {c.object_key for c in meta_b.chunks("t", 0)}
            assert slow.keys[1] in indexed and slow.keys[0] not in indexed
            assert await _values(b, part) == [b"v1", b"v2", b"v3", b"v4"]
            b.store = objects

            # the local rule: past its lease deadline a broker refuses before trying
            epoch_a = leases_a.acquire("t", 1)
            assert epoch_a == 2
            mine = await a.load_partition("t", 1, epoch_a)
            assert await _values(a, mine) == [b"x0"]
            a.set_lease_deadline(time.monotonic() - 0.001)
            written = a.segments_written
            refused = await _refused(
                a.append_and_wait(mine, records.encode_batch([(None, b"x2")], 1))
            )
            assert refused.code == ErrorCode.not_leader_or_follower
            assert "could not renew its leases" in refused.message
            assert a.segments_written == written and mine.next_offset == 1

    asyncio.run(scenario())


def test_a_store_outlives_its_connection(stores: list[MetadataStore]) -> None:
    """The database restarted or the connection cut: the call that finds it dead fails (a
    heartbeat or a flush retries), the next one reconnects; a lease taken before is there."""
    import psycopg

    store, other = stores[0], stores[1]
    leases = _member(store, 1)
    assert leases.acquire("t", 0) == 1
    [(pid,)] = leases.db.query("SELECT pg_backend_pid()")
    other.db.query("SELECT pg_terminate_backend(?)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        leases.heartbeat()
    assert leases.heartbeat() == {("t", 0): 1}
    assert leases.db.query("SELECT pg_backend_pid()") != [(pid,)]


def test_a_heartbeat_never_waits_behind_a_long_statement(stores: list[MetadataStore]) -> None:
    """A long statement on the metadata store's connection (an orphan sweep listing every
    object, an index read) does not hold the heartbeat up: the heartbeat has a connection of
    its own, and returns while the long statement still runs."""
    store, other = stores[0], stores[1]
    leases = _member(store, 1)
    assert leases.acquire("t", 0) == 1
    long = threading.Thread(target=store.db.query, args=("SELECT pg_sleep(2)",))
    long.start()
    try:
        wait_for(
            lambda: (
                other.db.query(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = ?",
                    ("SELECT pg_sleep(2)",),
                )
                == [(1,)]
            ),
            10,
            0.02,
            "the long statement running",
        )
        assert leases.heartbeat() == {("t", 0): 1}
        assert long.is_alive()  # the heartbeat did not wait for it
    finally:
        long.join(30)


def test_producers_waiting_when_the_lease_lapses_are_told_to_go_elsewhere(
    uri: str, tmp_path: Path
) -> None:
    """Flushes keep failing (here the object store refuses every segment: a file stands where
    its directory should be) until the local lease deadline passes: the waiting producer gets
    NOT_LEADER_OR_FOLLOWER then (its batch was never indexed), not an endless wait."""

    async def scenario() -> None:
        root = tmp_path / "objects"
        objects = LocalObjectStore(root)
        (root / "segments").write_bytes(b"")
        config = BrokerConfig(home=tmp_path / "a", segment_flush_ms=600_000)
        async with log_stores(uri, objects, config) as [(meta, logs)]:
            meta.create_topic("t", 1, {})
            leases = _member(meta, 1)
            part = await logs.load_partition("t", 0, leases.acquire("t", 0) or 0)
            logs.set_lease_deadline(time.monotonic() + 0.5)
            refused = await asyncio.wait_for(
                _refused(logs.append_and_wait(part, records.encode_batch([(None, b"v")], 1))), 10
            )
            assert refused.code == ErrorCode.not_leader_or_follower
            assert "lapsed" in refused.message
            assert logs.flush_failures >= 1 and logs.partitions == {}
            assert meta.chunks("t", 0) == [] and logs.unflushed_bytes == 0

    asyncio.run(scenario())


def test_a_marker_lost_to_an_unload_before_its_flush_goes_to_the_new_leader(
    uri: str, tmp_path: Path
) -> None:
    """The coordinator writes a commit marker into a partition it leads, and that partition is
    unloaded (its lease lost, a hand-over) before the flush indexed the marker: the wait
    resolves without it. The transaction must not complete as if it had been written: the
    marker goes to the new leader (WriteTxnMarkers, here B's log store), and only then is the
    transaction COMPLETE_COMMIT."""

    async def scenario() -> None:
        objects = LocalObjectStore(tmp_path / "objects")
        config = BrokerConfig(home=tmp_path / "a", segment_flush_ms=600_000)
        config_b = config.model_copy(update={"home": tmp_path / "b"})
        async with log_stores(uri, objects, config, config_b) as [(meta_a, a), (meta_b, b)]:
            meta_a.create_topic("t", 1, {})
            leases_a, leases_b = _member(meta_a, 1), _member(meta_b, 2)
            [part] = await lead(a, leases_a, [("t", 0)])
            coordinator = TransactionCoordinator(meta_a, a)
            coordinator.partition_exists = lambda tp: tp == ("t", 0)
            sent: list[tuple[str, int]] = []

            async def remote_markers(
                pid: int, epoch: int, commit: bool, parts: list[tuple[str, int]]
            ) -> None:  # what B does with a WriteTxnMarkers once it leads t-0
                sent.extend(parts)
                taken = await asyncio.to_thread(leases_b.acquire, "t", 0)
                assert taken is not None
                there = await b.load_partition("t", 0, taken)
                b.set_lease_deadline(time.monotonic() + 600)
                seq = b.append_marker(there, pid, epoch, commit)
                await b.wal.wait_durable(seq)
                assert b.ack_error(there, there.next_offset) is None

            coordinator.remote_markers = remote_markers
            error, pid, epoch = await coordinator.init_producer_id("tx", 60_000, -1, -1)
            assert error == ErrorCode.none
            assert await coordinator.add_partitions("tx", pid, epoch, [("t", 0)]) == {
                ("t", 0): ErrorCode.none
            }
            async with a._flush_lock:  # the flush waits until t-0 is gone
                ending = asyncio.create_task(coordinator.end_txn("tx", pid, epoch, True))
                await asyncio.to_thread(
                    wait_for, lambda: part.next_offset == 1, 10, 0.01, "the marker appended"
                )
                await asyncio.to_thread(leases_a.release, [("t", 0)])
                await a.unload_partition("t", 0, "handed over")
            assert await asyncio.wait_for(ending, 30) == ErrorCode.none
            assert sent == [("t", 0)]
            assert coordinator.txns["tx"].state == COMPLETE_COMMIT
            [chunk] = meta_b.chunks("t", 0)  # the marker, indexed by B
            data = await b.read(b.partitions[("t", 0)], 0, 1 << 20)
            assert [h.is_control for h, _ in records.iter_batches(data)] == [True]
            assert chunk.end_offset == 1

    asyncio.run(scenario())


def test_deleting_a_topic_fences_its_leader(uri: str, tmp_path: Path) -> None:
    """A topic deleted through another broker while its leader still has an unflushed tail,
    then created again under the same name: the old leader's next flush is fenced (its lease
    was taken in the deletion's transaction), so the new topic starts empty, and its first
    lease has a newer epoch than any the old topic had."""

    async def scenario() -> None:
        meta_a, meta_b = MetadataStore(uri), MetadataStore(uri)
        objects = LocalObjectStore(tmp_path / "objects")
        a = LogStore(
            BrokerConfig(home=tmp_path / "a", segment_flush_ms=600_000), meta_a, objects, node_id=1
        )
        try:
            meta_a.create_topic("t", 1, {})
            leases_a, leases_b = _member(meta_a, 1), _member(meta_b, 2)
            await a.open({})
            [part] = await lead(a, leases_a, [("t", 0)])
            await a.append(part, records.encode_batch([(None, b"old")], 1), 1 << 20)
            meta_b.delete_topic("t")  # through broker B, which A has not heard from
            meta_b.create_topic("t", 1, {})
            await a.flush()
            assert a.partitions == {} and "fenced" in (part.unloaded or "")
            assert meta_b.chunks("t", 0) == []
            assert meta_b.load_partition("t", 0)[:2] == ([], 0)
            assert leases_a.heartbeat() == {}  # A leads nothing of it any more
            epoch = leases_b.acquire("t", 0)
            assert epoch is not None and epoch > 1
        finally:
            await a.close()
            meta_a.close()
            meta_b.close()

    asyncio.run(scenario())


def test_a_broker_that_fails_to_start_frees_its_node_id(uri: str, tmp_path: Path) -> None:
    """A cluster broker registers its node id first; when the rest of its start fails (here
    its admin port is taken) it leaves again, so the node id is free for the next start at
    once instead of being "in use" until its row ages out."""
    from broker.app import Broker

    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    config = BrokerConfig(
        home=tmp_path / "a",
        metadata_uri=uri,
        node_id=7,
        kafka_port=free_port(),
        registry_port=free_port(),
        catalog_port=free_port(),
        admin_port=blocker.getsockname()[1],
    )

    async def scenario() -> None:
        broker = Broker(config)
        with pytest.raises(OSError):
            await broker.start()

    try:
        asyncio.run(scenario())
    finally:
        blocker.close()
    meta = MetadataStore(uri)
    try:
        assert meta.db.query("SELECT count(*) FROM cluster_brokers WHERE node_id = 7") == [(0,)]
        held = meta.db.query(
            "SELECT count(*) FROM partition_leases WHERE node_id = 7 "
            "AND expires_at > clock_timestamp()"
        )
        assert held == [(0,)]
        Leases(meta, 7, LEASE_MS).register("next", {}, None)  # not "in use"
    finally:
        meta.close()


def test_a_partition_given_up_refuses_new_batches_first_and_acknowledges_every_accepted_one(
    uri: str, tmp_path: Path
) -> None:
    """A voluntary hand-over (a rebalance, a move, SIGTERM) of a partition with a batch
    accepted but not yet flushed: from the start of the hand-over a new batch is refused with
    NOT_LEADER_OR_FOLLOWER before it is accepted (no offset taken), the accepted one is
    flushed and acknowledged (not refused: a producer without idempotence would re-send it
    after newer batches reached the new leader), and only then is the lease released."""
    from broker.membership import Membership
    from broker.ownership import Ownership, local_member

    async def scenario() -> None:
        config = BrokerConfig(home=tmp_path / "a", segment_flush_ms=600_000, node_id=1)
        objects = LocalObjectStore(tmp_path / "objects")
        async with log_stores(uri, objects, config) as [(meta, logs)]:
            meta.create_topic("t", 1, {})
            leases = _member(meta, 1)
            epoch = leases.acquire("t", 0) or 0
            part = await logs.load_partition("t", 0, epoch)
            logs.set_lease_deadline(time.monotonic() + 600)
            membership = Membership(
                config,
                meta,
                logs,
                Cluster(config, meta, logs),
                Ownership(local_member(config), clustered=True),
                leases,
            )
            membership.held[("t", 0)] = epoch
            async with logs._flush_lock:  # the flush of the hand-over waits until we look
                first = asyncio.create_task(
                    logs.append_and_wait(part, records.encode_batch([(None, b"first")], 1))
                )
                await asyncio.to_thread(
                    wait_for, lambda: part.next_offset == 1, 10, 0.01, "the first batch accepted"
                )
                giving = asyncio.create_task(membership._give_up([("t", 0)], "rebalancing"))
                await asyncio.to_thread(
                    wait_for, lambda: part.releasing is not None, 10, 0.01, "the hand-over"
                )
                late = await _refused(
                    logs.append(part, records.encode_batch([(None, b"late")], 1), 1 << 20)
                )
                assert late.code == ErrorCode.not_leader_or_follower
                assert part.next_offset == 1  # refused before it took an offset
            assert await asyncio.wait_for(first, 30) == 0  # acknowledged, not refused
            await asyncio.wait_for(giving, 30)
            assert [c.end_offset for c in meta.chunks("t", 0)] == [1]
            assert logs.partitions == {} and membership.held == {}
            assert leases.heartbeat() == {}  # released

    asyncio.run(scenario())


def test_two_incarnations_of_a_node_id_never_share_a_lease(
    stores: list[MetadataStore],
) -> None:
    """A broker restarted with the same node id while its old process still runs (paused, cut
    off: its heartbeats stopped, a lease it took is still unexpired): the new incarnation
    neither renews nor adopts that lease, cannot write under it, and takes the partition only
    once it is free, at a new epoch that fences the old process."""
    old_store, new_store = stores[0], stores[1]
    old_store.create_topic("t", 1, {})
    old = Leases(old_store, 5, SHORT_MS * 3)
    old.register("old", {}, None)
    assert old.acquire("t", 0) == 1
    # the old process stops heartbeating; its row ages out (as after a pause)
    old_store.db.execute(
        "UPDATE cluster_brokers SET heartbeat_at = clock_timestamp() - interval '1 hour' "
        "WHERE node_id = 5"
    )
    new = Leases(new_store, 5, SHORT_MS * 3)
    new.register("new", {}, None)
    assert new.heartbeat() == {}  # the old incarnation's lease is not renewed as ours
    assert new.acquire("t", 0) is None  # nor taken while it may still be used
    chunk = _chunk("t", 0, 0, "segments/new.seg")
    assert new_store.add_chunks([chunk], {}, (), (5, {("t", 0): 1})) == {("t", 0)}
    epoch = wait_for(lambda: new.acquire("t", 0), 10, 0.05, "the old lease lapsed")
    assert epoch == 2
    stale = _chunk("t", 0, 0, "segments/old.seg")
    assert old_store.add_chunks([stale], {}, (), (5, {("t", 0): 1})) == {("t", 0)}
    assert new_store.add_chunks([chunk], {}, (), (5, {("t", 0): 2})) == set()
    assert [c.object_key for c in new_store.chunks("t", 0)] == ["segments/new.seg"]


def test_coordinator_state_writes_are_fenced_by_the_slot_lease(uri: str, tmp_path: Path) -> None:
    """A transaction coordinator and a group coordinator write their state under their slot's
    lease (a transaction's pending offsets under the group's): once another broker took the
    slot, a write of the old coordinator (which has not noticed yet) gets NOT_COORDINATOR and
    nothing of it reaches Postgres."""
    from broker.ownership import KEY_GROUP, KEY_TRANSACTION, Member, Ownership, slot_partition

    async def scenario() -> None:
        meta_a, meta_b = MetadataStore(uri), MetadataStore(uri)
        try:
            meta_a.create_topic("t", 1, {})
            leases_a, leases_b = _member(meta_a, 1), _member(meta_b, 2)
            txn_slot, group_slot = (
                slot_partition(KEY_TRANSACTION, "tx"),
                slot_partition(KEY_GROUP, "g"),
            )
            held = {tp: leases_a.acquire(*tp) or 0 for tp in (txn_slot, group_slot)}
            ownership = Ownership(Member(1, {}), clustered=True)
            ownership.update([], {}, held, time.monotonic() + 600)
            config = BrokerConfig(home=tmp_path / "a")
            logs = LogStore(config, meta_a, LocalObjectStore(tmp_path / "objects"), node_id=1)
            coordinator = TransactionCoordinator(meta_a, logs)
            coordinator.slot_fence = lambda tid: ownership.slot_fence(KEY_TRANSACTION, tid)
            coordinator.partition_exists = lambda tp: tp == ("t", 0)
            error, pid, epoch = await coordinator.init_producer_id("tx", 60_000, -1, -1)
            assert error == ErrorCode.none
            meta_a.commit_offsets(
                "g", [("t", 0, 5, -1, None)], ownership.slot_fence(KEY_GROUP, "g")
            )
            assert meta_b.committed_offsets("g")[("t", 0)].offset == 5
            assert await coordinator.add_offsets("tx", pid, epoch, "g") == ErrorCode.none
            group_fence = ownership.slot_fence(KEY_GROUP, "g")
            pending = [("t", 0, 7, -1, None)]
            assert (
                await coordinator.txn_offset_commit("tx", pid, epoch, "g", pending, group_fence)
                == ErrorCode.none
            )
            assert TransactionStore(meta_b).pending_offsets("g") == {("t", 0)}
            meta_a.db.execute("DELETE FROM txn_offsets WHERE transactional_id = 'tx'")

            # broker 2 takes both slots over; broker 1 has not heard yet
            leases_a.release(list(held))
            assert all(leases_b.acquire(*tp) for tp in held)
            refused = await coordinator.add_partitions("tx", pid, epoch, [("t", 0)])
            assert refused == {("t", 0): ErrorCode.not_coordinator}
            [record] = TransactionStore(meta_b).load("tx")
            assert record.state == ONGOING and record.partitions == set()  # only the group
            with pytest.raises(CoordinatorFencedError):
                meta_a.commit_offsets(
                    "g", [("t", 0, 9, -1, None)], ownership.slot_fence(KEY_GROUP, "g")
                )
            assert meta_b.committed_offsets("g")[("t", 0)].offset == 5
            # a TxnOffsetCommit the old group coordinator takes: refused, nothing pending
            refused_offsets = await coordinator.txn_offset_commit(
                "tx", pid, epoch, "g", [("t", 0, 9, -1, None)], group_fence
            )
            assert refused_offsets == ErrorCode.not_coordinator
            assert TransactionStore(meta_b).pending_offsets("g") == set()
        finally:
            meta_a.close()
            meta_b.close()

    asyncio.run(scenario())


def test_an_upgraded_broker_replays_its_local_wal_into_the_index_or_refuses(
    uri: str, tmp_path: Path
) -> None:
    """A broker on Postgres metadata before cluster mode kept acknowledged batches in its local
    WAL until a flush indexed them. Upgraded (now a cluster member, no WAL), it must not start
    as if that WAL were not there: while another broker holds the lease of a partition in it,
    it refuses, naming the directory, and keeps the WAL; once the lease is free it takes it,
    puts the batches the index lacks in the index (fenced by its epoch) and deletes the WAL."""

    async def scenario() -> None:
        meta = MetadataStore(uri)
        objects = LocalObjectStore(tmp_path / "objects")
        config = BrokerConfig(home=tmp_path / "one", segment_flush_ms=600_000)
        meta.create_topic("u", 1, {})
        # the broker before the upgrade: Postgres metadata and the local WAL (no node id)
        old = LogStore(config, meta, objects)
        await old.open({"u": 1})
        part = old.partitions[("u", 0)]
        for i in range(2):
            await old.append_and_wait(part, records.encode_batch([(None, b"w%d" % i)], 1))
        await old.flush()  # w0, w1 indexed; w2, w3 acknowledged from the WAL only
        for i in range(2, 4):
            await old.append_and_wait(part, records.encode_batch([(None, b"w%d" % i)], 1))
        old._closing = True  # stopped without a last flush (a crash, or the old version's)
        old._flush_needed.set()
        assert old._flusher is not None
        await old._flusher
        assert isinstance(old.wal, WriteAheadLog)
        await old.wal.close()
        assert [c.end_offset for c in meta.chunks("u", 0)] == [2]
        wal_files = sorted(config.wal_dir.glob("*.wal"))
        assert wal_files

        other_meta = MetadataStore(uri)
        other = _member(other_meta, 2)
        assert other.acquire("u", 0) == 1
        leases = _member(meta, 1)
        upgraded = LogStore(config, meta, objects, node_id=1)
        with pytest.raises(UpgradedWalError, match=str(config.wal_dir)) as refused:
            await upgraded.open({"u": 1}, leases)
        assert "u-0" in str(refused.value) and "start this one first" in str(refused.value)
        assert sorted(config.wal_dir.glob("*.wal")) == wal_files and upgraded.partitions == {}

        other.release([("u", 0)])
        upgraded = LogStore(config, meta, objects, node_id=1)
        try:
            await upgraded.open({"u": 1}, leases)
            assert upgraded.epochs == {("u", 0): 2}
            mine = upgraded.partitions[("u", 0)]
            assert await _values(upgraded, mine) == [b"w0", b"w1", b"w2", b"w3"]
            assert [c.end_offset for c in meta.chunks("u", 0)] == [2, 4]
            assert not list(config.wal_dir.glob("*.wal"))
        finally:
            await upgraded.close()
            other_meta.close()
            meta.close()

    asyncio.run(scenario())
