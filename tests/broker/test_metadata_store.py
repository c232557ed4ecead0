"""The broker's metadata store on SQLite and on a real Postgres server (issue 7: "SQLite by
default, Postgres for several brokers"): the same operations give the same answers on both,
Postgres holds 64-bit offsets, several brokers share a Postgres database, and a broker process run
with ``--metadata-uri`` keeps topics, data and group offsets across a restart with no
``metadata.sqlite`` on its disk; a second broker with its node id is refused."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker.storage import metadata
from broker.storage.metadata import (
    BatchRef,
    Chunk,
    MetadataStore,
    MetadataUnavailableError,
    SchemaTooNewError,
    pack_batch_index,
)
from tests.postgres import PostgresServer
from tests.postgres import postgres as postgres  # one server for the module
from tests.support import BrokerProcess


def _database(postgres: PostgresServer) -> str:
    return postgres.create_database(f"meta_{uuid.uuid4().hex[:8]}")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    if request.param == "sqlite":
        return tmp_path / "metadata.sqlite"
    server: PostgresServer = request.getfixturevalue("postgres")
    return _database(server)


def _chunk(topic: str, base: int, count: int, key: str, at_ms: int = 1_000) -> Chunk:
    refs = [BatchRef(base + i, i * 100, 100, at_ms + i, at_ms + i) for i in range(count)]
    return Chunk(
        topic,
        0,
        base,
        base + count,
        key,
        0,
        100 * count,
        at_ms,
        at_ms + count - 1,
        pack_batch_index(refs),
    )


def test_every_operation_gives_the_same_answers(target: Path | str) -> None:
    store = MetadataStore(target)
    try:
        before_ms = int(time.time() * 1000)
        created = store.create_topic(
            "orders", 2, {"retention.ms": "1000", "automq.table.topic.enable": "true"}
        )
        assert before_ms <= created.created_ms <= int(time.time() * 1000)
        store.create_topic("other", 1, {})
        store.add_partitions("orders", 3)
        store.set_configs("orders", {"retention.ms": "2000"})
        assert [(t.name, t.partitions, t.configs) for t in store.topics()] == [
            ("orders", 3, {"retention.ms": "2000"}),
            ("other", 1, {}),
        ]
        assert store.topics()[0].topic_id == created.topic_id
        assert store.topics()[0].created_ms == created.created_ms  # the maintenance DAG's start

        big = 2**40  # offsets and times are 64-bit
        chunks = [
            _chunk("orders", 0, 3, "segments/a.seg"),
            _chunk("orders", 3, 2, "segments/b.seg"),
            _chunk("orders", big, 2, "segments/c.seg", at_ms=big),
            _chunk("other", 0, 1, "segments/b.seg"),
        ]
        states: dict[tuple[str, int, int], dict[str, object]] = {
            ("orders", 0, 1000): {"epoch": 0, "last_sequence": 4}
        }
        store.add_chunks(chunks, states)
        store.add_chunks(
            [chunks[0]], {("orders", 0, 1000): {"epoch": 0, "last_sequence": 9}}
        )  # replayed: replaced
        read = store.chunks("orders", 0)
        assert read == chunks[:3] and isinstance(read[0].batch_index, bytes)
        assert [r.base_offset for r in read[2].refs] == [big, big + 1]
        assert store.producer_states() == {("orders", 0, 1000): {"epoch": 0, "last_sequence": 9}}
        assert store.object_keys() == {"segments/a.seg", "segments/b.seg", "segments/c.seg"}

        # retention: a.seg is referenced by nothing else any more; b.seg still is (by "other")
        assert store.drop_chunks_before("orders", 0, 5) == ["segments/a.seg"]
        assert [c.base_offset for c in store.chunks("orders", 0)] == [big]
        assert store.log_start_offsets() == {("orders", 0): 5}
        assert store.drop_chunks_before("orders", 0, 5) == []
        assert store.log_start_offsets() == {("orders", 0): 5}

        store.commit_offsets("g1", [("orders", 0, 7, 0, "m"), ("orders", 1, 3, -1, None)])
        store.commit_offsets("g1", [("orders", 0, 9, 1, None)])
        store.commit_offsets("g2", [("other", 0, 1, 0, "")])
        got = store.committed_offsets("g1")
        assert {k: (v.offset, v.leader_epoch, v.metadata) for k, v in got.items()} == {
            ("orders", 0): (9, 1, None),
            ("orders", 1): (3, -1, None),
        }
        assert sorted(store.groups_with_offsets()) == ["g1", "g2"]
        store.delete_group_offsets("g2")
        assert store.groups_with_offsets() == ["g1"]

        assert [store.next_producer_id() for _ in range(3)] == [1000, 1001, 1002]

        literal = (2, "orders", 3, "User:alice", "*", 3, 3)
        prefixed = (2, "ord", 4, "User:*", "10.0.0.1", 4, 2)
        store.add_acls([literal, prefixed])
        store.add_acls([literal])  # stored once
        assert store.acls() == sorted([literal, prefixed])
        store.delete_acls([prefixed, (3, "g", 3, "User:bob", "*", 3, 3)])
        assert store.acls() == [literal]

        assert sorted(store.delete_topic("orders")) == ["segments/c.seg"]  # b.seg: still "other"'s
        assert [t.name for t in store.topics()] == ["other"]
        assert store.committed_offsets("g1") == {} and store.producer_states() == {}
    finally:
        store.close()

    reopened = MetadataStore(target)  # durable: a new connection sees it all
    try:
        assert [t.name for t in reopened.topics()] == ["other"]
        assert reopened.next_producer_id() == 1003
    finally:
        reopened.close()


def test_brokers_share_a_postgres_database(postgres: PostgresServer) -> None:
    """A cluster's brokers all open it (who leads what: tests/broker/test_leases.py)."""
    uri = _database(postgres)
    first = MetadataStore(uri)
    try:
        second = MetadataStore(uri)
        second.create_topic("shared", 1, {})
        assert [t.name for t in first.topics()] == ["shared"]
        second.close()
    finally:
        first.close()

    with pytest.raises(MetadataUnavailableError, match="cannot connect") as info:
        MetadataStore(f"postgresql://icefall:secret-pw@127.0.0.1:{postgres.port}/no_such_database")
    assert "secret-pw" not in str(info.value)


def _produce(broker: BrokerProcess, topic: str, values: list[bytes]) -> None:
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    for value in values:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(15) == 0


def _consume(broker: BrokerProcess, topic: str, count: int, group: str) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got: list[bytes] = []
    try:
        consumer.subscribe([topic])
        for _ in range(200):
            if len(got) >= count:
                break
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(bytes(msg.value() or b""))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def test_a_broker_on_postgres_keeps_topics_data_and_group_offsets_across_a_restart(
    postgres: PostgresServer, broker_factory: Callable[..., BrokerProcess]
) -> None:
    import psycopg

    uri = _database(postgres)
    # a lease longer than the test: the first broker stays live without relying on heartbeats
    args = ["--metadata-uri", uri, "--segment-flush-ms", "100", "--broker-lease-ms", "120000"]
    broker = broker_factory(args)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("events", 1, 1)]).values():
        future.result(10)
    _produce(broker, "events", [f"v{i}".encode() for i in range(20)])
    assert _consume(broker, "events", 20, "readers") == [f"v{i}".encode() for i in range(20)]
    broker.admin("/v1/flush", "POST")

    # a second broker with the same node id is refused with a clear message
    with pytest.raises(RuntimeError, match="node id 0 is in use: another live broker"):
        broker_factory(args, name="second")

    assert broker.stop() == 0
    assert not (broker.home / "metadata.sqlite").exists()
    with psycopg.connect(uri) as connection:
        [(chunks,)] = connection.execute(
            "SELECT count(*) FROM chunks WHERE topic = 'events'"
        ).fetchall()
        assert chunks >= 1

    broker.start()
    assert [
        t
        for t in AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics
        if t == "events"
    ] == ["events"]
    _produce(broker, "events", [b"after-restart"])
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "readers"})
    try:
        [committed] = consumer.committed([TopicPartition("events", 0)], timeout=10)
        assert committed.offset == 20  # the group's offset came back from Postgres
    finally:
        consumer.close()
    assert _consume(broker, "events", 21, "fresh") == [f"v{i}".encode() for i in range(20)] + [
        b"after-restart"
    ]


def test_a_metadata_uri_that_is_not_postgres_is_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from broker import cli

    assert cli.main(["broker", "--home", str(tmp_path), "--metadata-uri", "mysql://u@h/db"]) == 2
    assert "metadata URI must be postgresql://" in capsys.readouterr().err
    assert not (tmp_path / "metadata.sqlite").exists()


def _raw(target: Path | str) -> Any:
    """A bare autocommit connection to the store's database (what an operator would open)."""
    if isinstance(target, Path):
        import sqlite3

        return sqlite3.connect(target, isolation_level=None)
    import psycopg

    return psycopg.connect(target, autocommit=True)


def test_the_schema_is_versioned_and_migrated_once(target: Path | str) -> None:
    """A new database is at the newest version; one made before versions were recorded (the same
    tables, no schema_version) is adopted with its data; one a newer broker migrated is refused."""
    store = MetadataStore(target)
    store.create_topic("kept", 1, {})
    store.close()
    raw = _raw(target)
    try:
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [
            (len(metadata.MIGRATIONS),)
        ]
        raw.execute("DROP TABLE schema_version")  # as a database from before versions were recorded
    finally:
        raw.close()
    store = MetadataStore(target)
    try:
        assert "kept" in {t.name for t in store.topics()}
    finally:
        store.close()
    raw = _raw(target)
    try:
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [
            (len(metadata.MIGRATIONS),)
        ]
        raw.execute("UPDATE schema_version SET version = version + 1")
    finally:
        raw.close()
    with pytest.raises(SchemaTooNewError, match="newer than this broker's"):
        MetadataStore(target)


def test_transaction_state_round_trips(target: Path | str) -> None:
    """The coordinator's state, its open offsets and the aborted index, on both databases."""
    from broker.storage.txn_metadata import (
        COMPLETE_COMMIT,
        ONGOING,
        TransactionStore,
        TxnRecord,
    )

    store = MetadataStore(target)
    try:
        txns = TransactionStore(store)
        record = TxnRecord("t1", 1000, 2, ONGOING, 5000, 123, {("a", 0), ("b", 1)}, {"g"})
        txns.save(record)
        txns.add_offsets("t1", "g", [("src", 0, 2**40, 3, "m")])
        assert txns.load() == [record]
        assert txns.pending_offsets("g") == {("src", 0)}
        assert store.committed_offsets("g") == {}
        record.state, record.partitions, record.groups = COMPLETE_COMMIT, set(), set()
        txns.complete(record, commit=True)
        assert txns.load() == [record] and txns.pending_offsets("g") == set()
        assert store.committed_offsets("g")[("src", 0)].offset == 2**40
        store.create_topic("a", 1, {})
        store.add_chunks([_chunk("a", 0, 3, "k")], {}, [("a", 0, 1000, 0, 2)])
        assert store.aborted_transactions() == {("a", 0): [(1000, 0, 2)]}
        store.drop_chunks_before("a", 0, 3)
        assert store.aborted_transactions() == {}
    finally:
        store.close()
