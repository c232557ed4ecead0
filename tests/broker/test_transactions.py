"""Kafka transactions (KIP-98) with real clients: confluent-kafka's transactional producer
and read_committed consumers, against a broker process.

Commit visible, abort invisible to read_committed (visible to read_uncommitted), the last
stable offset holding back readers of an open transaction, a zombie producer fenced by
epoch, consume-transform-produce with offsets committed in the transaction, the
transaction timeout aborting, and kill -9 mid-transaction: after the restart the open
transaction is never half-visible.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support import BrokerProcess, present, wait_for

AT_MS = 1_700_000_000_000
BROKER_ARGS = ["--segment-flush-ms", "100", "--transaction-cleanup-interval-ms", "100"]


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("txn") / "home", BROKER_ARGS).start()
    try:
        yield broker
    finally:
        broker.stop()


def _topic(broker: BrokerProcess, partitions: int = 2) -> str:
    name = f"txn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(10)
    return name


def _producer(broker: BrokerProcess, txn_id: str, **conf: Any) -> Producer:
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id, "linger.ms": 5, **conf}
    )
    producer.init_transactions(15)
    return producer


def _send(producer: Producer, topic: str, values: list[str], partitions: int = 2) -> None:
    for i, value in enumerate(values):
        producer.produce(topic, value=value.encode(), partition=i % partitions)
    assert producer.flush(15) == 0


def _read_all(broker: BrokerProcess, topic: str, isolation: str, partitions: int = 2) -> list[str]:
    """Every record a consumer of ``isolation`` sees up to the end it is given (ListOffsets:
    the high watermark, or for read_committed the last stable offset)."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"r-{uuid.uuid4().hex[:6]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[str] = []
        positions = dict.fromkeys(range(partitions), 0)

        def done() -> bool:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(present(msg.value()).decode())
            for p in range(partitions):
                position = consumer.position([TopicPartition(topic, p)])[0].offset
                positions[p] = max(positions[p], position)
            return all(positions[p] >= ends[p] for p in range(partitions))

        wait_for(done, 30, interval=0, what=f"{isolation} read of {topic} to {ends}")
        while (msg := consumer.poll(0.3)) is not None:  # anything at the very end
            if not msg.error():
                got.append(present(msg.value()).decode())
        return sorted(got)
    finally:
        consumer.close()


READS = ("read_committed", "read_uncommitted")


def _offset_for_time(broker: BrokerProcess, topic: str, ts: int, isolation: str) -> int:
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "times", "isolation.level": isolation}
    )
    try:
        [tp] = consumer.offsets_for_times([TopicPartition(topic, 0, ts)], 10)
        return int(tp.offset)
    finally:
        consumer.close()


def _offsets(broker: BrokerProcess, topic: str) -> dict[int, dict[str, Any]]:
    return {p["partition"]: p for p in broker.admin(f"/v1/topics/{topic}/offsets")["partitions"]}


def test_commit_is_visible_and_abort_only_to_read_uncommitted(txn_broker: BrokerProcess) -> None:
    topic = _topic(txn_broker)
    producer = _producer(txn_broker, f"tx-{uuid.uuid4().hex[:6]}")
    producer.begin_transaction()
    _send(producer, topic, [f"c1-{i}" for i in range(6)])
    producer.commit_transaction(15)
    producer.begin_transaction()
    _send(producer, topic, [f"ab-{i}" for i in range(4)])
    producer.abort_transaction(15)
    producer.begin_transaction()
    _send(producer, topic, [f"c2-{i}" for i in range(2)])
    producer.commit_transaction(15)

    committed = sorted([f"c1-{i}" for i in range(6)] + ["c2-0", "c2-1"])
    assert _read_all(txn_broker, topic, "read_committed") == committed
    assert _read_all(txn_broker, topic, "read_uncommitted") == sorted(
        committed + [f"ab-{i}" for i in range(4)]
    )
    for p in _offsets(txn_broker, topic).values():  # nothing open: the LSO is the end
        assert p["last_stable_offset"] == p["high_watermark"]


def test_an_open_transaction_holds_back_the_last_stable_offset(txn_broker: BrokerProcess) -> None:
    topic = _topic(txn_broker, partitions=1)
    plain = Producer({"bootstrap.servers": txn_broker.bootstrap})
    plain.produce(topic, value=b"before", timestamp=AT_MS)
    plain.flush(10)
    producer = _producer(txn_broker, f"tx-{uuid.uuid4().hex[:6]}")
    producer.begin_transaction()
    for i in range(2):
        producer.produce(topic, value=f"open-{i}".encode(), partition=0, timestamp=AT_MS + 1000)
    assert producer.flush(15) == 0
    plain.produce(topic, value=b"after", timestamp=AT_MS + 2000)  # past the open transaction
    plain.flush(10)

    offsets = _offsets(txn_broker, topic)[0]
    assert (offsets["last_stable_offset"], offsets["high_watermark"]) == (1, 4)
    assert _read_all(txn_broker, topic, "read_committed", 1) == ["before"]
    assert _read_all(txn_broker, topic, "read_uncommitted", 1) == sorted(
        ["before", "open-0", "open-1", "after"]
    )
    # ListOffsets by time: read_committed finds nothing at or past the LSO, as Kafka
    assert [_offset_for_time(txn_broker, topic, AT_MS + 500, i) for i in READS] == [-1, 1]
    producer.commit_transaction(15)
    assert [_offset_for_time(txn_broker, topic, AT_MS + 500, i) for i in READS] == [1, 1]
    assert _read_all(txn_broker, topic, "read_committed", 1) == sorted(
        ["before", "open-0", "open-1", "after"]
    )
    offsets = _offsets(txn_broker, topic)[0]
    assert offsets["last_stable_offset"] == offsets["high_watermark"] == 5  # with the marker


def test_a_zombie_producer_is_fenced_by_the_new_epoch(txn_broker: BrokerProcess) -> None:
    topic = _topic(txn_broker)
    txn_id = f"tx-{uuid.uuid4().hex[:6]}"
    zombie = _producer(txn_broker, txn_id)
    zombie.begin_transaction()
    _send(zombie, topic, ["zombie-0", "zombie-1"])
    successor = _producer(txn_broker, txn_id)  # bumps the epoch, aborts the zombie's transaction
    successor.begin_transaction()
    _send(successor, topic, ["new-0"])
    successor.commit_transaction(15)

    with pytest.raises(KafkaException) as fenced:
        zombie.produce(topic, value=b"zombie-late", partition=0)
        zombie.flush(10)
        zombie.commit_transaction(15)
    assert fenced.value.args[0].fatal() or "fenced" in str(fenced.value).lower()
    assert _read_all(txn_broker, topic, "read_committed") == ["new-0"]
    assert "zombie-late" not in _read_all(txn_broker, topic, "read_uncommitted")


def _group_committed(
    broker: BrokerProcess, group: str, topic: str, isolation: str = "read_uncommitted"
) -> list[int]:
    """The group's committed offsets; read_committed asks with require_stable (KIP-447)."""
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "isolation.level": isolation}
    )
    try:
        timeout = 10 if isolation == "read_uncommitted" else 1
        return [tp.offset for tp in consumer.committed([TopicPartition(topic, 0)], timeout)]
    finally:
        consumer.close()


def test_consume_transform_produce_commits_offsets_with_the_transaction(
    txn_broker: BrokerProcess,
) -> None:
    source, sink = _topic(txn_broker, 1), _topic(txn_broker, 1)
    plain = Producer({"bootstrap.servers": txn_broker.bootstrap})
    for i in range(10):
        plain.produce(source, value=f"in-{i}".encode())
    plain.flush(10)
    group = f"ctp-{uuid.uuid4().hex[:6]}"
    consumer = Consumer(
        {
            "bootstrap.servers": txn_broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    producer = _producer(txn_broker, f"ctp-{uuid.uuid4().hex[:6]}")
    try:
        consumer.subscribe([source])
        batches: list[list[Any]] = []

        def consumed(n: int) -> bool:
            msgs = consumer.consume(n - sum(map(len, batches)), 0.5)
            batches.append([m for m in msgs if not m.error()])
            return sum(map(len, batches)) >= n

        for n, commit in ((6, True), (10, False)):  # the first six committed, the rest aborted
            wait_for(functools.partial(consumed, n), 30, interval=0, what=f"{n} source records")
            taken = [m for b in batches for m in b][-(n - (0 if commit else 6)) :]
            producer.begin_transaction()
            _send(
                producer, sink, [present(m.value()).decode().replace("in", "out") for m in taken], 1
            )
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 10
            )
            # not yet visible; a stable read waits for the transaction (UNSTABLE_OFFSET_COMMIT)
            assert _group_committed(txn_broker, group, source) == ([-1001] if commit else [6])
            with pytest.raises(KafkaException, match="Timed out"):
                _group_committed(txn_broker, group, source, "read_committed")
            if commit:
                producer.commit_transaction(15)
                assert _group_committed(txn_broker, group, source) == [6]
            else:
                producer.abort_transaction(15)
                assert _group_committed(txn_broker, group, source) == [6]
    finally:
        consumer.close()
    assert _read_all(txn_broker, sink, "read_committed", 1) == sorted(f"out-{i}" for i in range(6))


def test_the_transaction_timeout_aborts(txn_broker: BrokerProcess) -> None:
    topic = _topic(txn_broker, 1)
    producer = _producer(
        txn_broker, f"tx-{uuid.uuid4().hex[:6]}", **{"transaction.timeout.ms": 1000}
    )
    producer.begin_transaction()
    _send(producer, topic, ["late-0", "late-1"], 1)
    wait_for(
        lambda: _offsets(txn_broker, topic)[0]["last_stable_offset"] == 3,
        15,
        what="the coordinator aborting the timed-out transaction (LSO past its marker)",
    )
    with pytest.raises(KafkaException):
        producer.commit_transaction(10)
    assert _read_all(txn_broker, topic, "read_committed", 1) == []
    assert _read_all(txn_broker, topic, "read_uncommitted", 1) == ["late-0", "late-1"]


def test_a_timeout_above_the_broker_maximum_is_refused(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "home", ["--transaction-max-timeout-ms", "5000"]).start()
    try:
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "transactional.id": "too-long",
                "transaction.timeout.ms": 60000,
            }
        )
        with pytest.raises(KafkaException) as refused:
            producer.init_transactions(10)
        assert (
            "INVALID_TRANSACTION_TIMEOUT" in str(refused.value)
            or "timeout" in str(refused.value).lower()
        )
    finally:
        broker.stop()


def test_kill9_mid_transaction_is_never_half_visible(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "home", BROKER_ARGS).start()
    try:
        topic = _topic(broker)
        done = _producer(broker, "kill-done")
        done.begin_transaction()
        _send(done, topic, [f"done-{i}" for i in range(4)])
        done.commit_transaction(15)
        open_one = _producer(broker, "kill-open", **{"transaction.timeout.ms": 3000})
        open_one.begin_transaction()
        _send(open_one, topic, [f"open-{i}" for i in range(4)])
        broker.admin("/v1/flush", method="POST")  # part in a segment object, the rest in the WAL
        _send(open_one, topic, [f"open-{i}" for i in range(4, 6)])

        broker.kill9()
        broker.start()
        before = _offsets(broker, topic)
        assert all(p["last_stable_offset"] < p["high_watermark"] for p in before.values())
        assert _read_all(broker, topic, "read_committed") == [f"done-{i}" for i in range(4)]
        wait_for(  # the open transaction's timeout (kept across the restart) aborts it
            lambda: all(
                p["last_stable_offset"] == p["high_watermark"]
                for p in _offsets(broker, topic).values()
            ),
            20,
            what="the open transaction aborted after the restart",
        )
        assert _read_all(broker, topic, "read_committed") == [f"done-{i}" for i in range(4)]
        assert len(_read_all(broker, topic, "read_uncommitted")) == 10
        successor = _producer(broker, "kill-open")  # the id goes on with a new epoch
        successor.begin_transaction()
        _send(successor, topic, ["after-0"])
        successor.commit_transaction(15)
        assert "after-0" in _read_all(broker, topic, "read_committed")
    finally:
        broker.stop()


def test_kafka_python_transactional_producer(txn_broker: BrokerProcess) -> None:
    from kafka import KafkaProducer

    topic = _topic(txn_broker, 1)
    producer = KafkaProducer(
        bootstrap_servers=txn_broker.bootstrap, transactional_id=f"kp-{uuid.uuid4().hex[:6]}"
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"kp-committed", partition=0)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send(topic, b"kp-aborted", partition=0)
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close(10)
    assert _read_all(txn_broker, topic, "read_committed", 1) == ["kp-committed"]
    assert _read_all(txn_broker, topic, "read_uncommitted", 1) == ["kp-aborted", "kp-committed"]


def test_aiokafka_transaction_with_offsets(txn_broker: BrokerProcess) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.structs import OffsetAndMetadata
    from aiokafka.structs import TopicPartition as AioTopicPartition

    source, sink = _topic(txn_broker, 1), _topic(txn_broker, 1)
    group = f"aio-{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=txn_broker.bootstrap, transactional_id=f"aio-{uuid.uuid4().hex[:6]}"
        )
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(sink, b"aio-committed", partition=0)
                await producer.send_offsets_to_transaction(
                    {AioTopicPartition(source, 0): OffsetAndMetadata(3, "")}, group
                )
            await producer.begin_transaction()
            await producer.send_and_wait(sink, b"aio-aborted", partition=0)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
    assert _read_all(txn_broker, sink, "read_committed", 1) == ["aio-committed"]
    assert _group_committed(txn_broker, group, source) == [3]


def test_a_transaction_decided_before_a_crash_is_completed_at_start(tmp_path: Path) -> None:
    """The window kill -9 rarely hits: the commit decision stored, no marker written yet. The
    restarted coordinator writes the markers and moves the offsets before anything is served."""
    import asyncio

    from broker.config import BrokerConfig
    from broker.kafka import records
    from broker.kafka.transactions import TransactionCoordinator
    from broker.storage.logstore import LogStore
    from broker.storage.metadata import MetadataStore
    from broker.storage.objectstore import LocalObjectStore
    from broker.storage.txn_metadata import COMPLETE_COMMIT, PREPARE_COMMIT, TxnRecord

    config = BrokerConfig(home=tmp_path, segment_flush_ms=600_000)

    async def scenario() -> None:
        metadata = MetadataStore(config.metadata_db)
        logs = LogStore(config, metadata, LocalObjectStore(tmp_path / "objects"))
        await logs.open({"t": 1})
        coordinator = TransactionCoordinator(metadata, logs)
        record = TxnRecord("decided", 1000, 3, PREPARE_COMMIT, 60_000, 0, {("t", 0)}, {"g"})
        coordinator.store.save(record)
        coordinator.store.add_offsets("decided", "g", [("src", 0, 42, -1, None)])
        await coordinator.recover()
        part = logs.partitions[("t", 0)]
        [marker] = part.tail
        header = records.read_header(marker.data)
        assert header.is_control and (header.producer_id, header.producer_epoch) == (1000, 3)
        assert records.control_type(marker.data) == records.CONTROL_COMMIT
        assert coordinator.txns["decided"].state == COMPLETE_COMMIT
        assert metadata.committed_offsets("g")[("src", 0)].offset == 42
        assert coordinator.pending_offsets("g") == set()
        await logs.close()
        metadata.close()

    asyncio.run(scenario())


def test_a_hanging_transaction_no_coordinator_covers_is_aborted(tmp_path: Path) -> None:
    """A transactional batch that got into a partition as its transaction ended would hold
    the partition's LSO forever: the coordinator's sweep aborts it."""
    import asyncio
    import struct

    import crc32c

    from broker.config import BrokerConfig
    from broker.kafka import records
    from broker.kafka.transactions import TransactionCoordinator
    from broker.storage.logstore import LogStore
    from broker.storage.metadata import MetadataStore
    from broker.storage.objectstore import LocalObjectStore

    batch = bytearray(records.encode_batch([(None, b"stray")], AT_MS))
    struct.pack_into(">hiqqqhi", batch, 21, records.ATTR_TRANSACTIONAL, 0, AT_MS, AT_MS, 77, 0, 0)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    config = BrokerConfig(home=tmp_path, segment_flush_ms=600_000)

    async def scenario() -> None:
        metadata = MetadataStore(config.metadata_db)
        logs = LogStore(config, metadata, LocalObjectStore(tmp_path / "objects"))
        await logs.open({"t": 1})
        part = logs.partitions[("t", 0)]
        _, seq = await logs.append(part, bytes(batch), 1 << 20)
        await logs.wal.wait_durable(seq)
        assert (part.last_stable_offset, part.high_watermark) == (0, 1)
        await TransactionCoordinator(metadata, logs).abort_hanging()
        assert part.last_stable_offset == part.high_watermark == 2
        assert part.aborted == [(77, 0, 1)]
        await logs.close()
        metadata.close()

    asyncio.run(scenario())


def _admin_call(broker: BrokerProcess, api_key: int, version: int, **fields: Any) -> Any:
    """One request of a flexible-version admin API, with its own header versions (kio)."""
    import io
    import socket
    import struct

    from kio.index import load_request_schema, load_response_schema
    from kio.serial import entity_reader, entity_writer
    from kio.static.primitive import i16, i32

    request_type = load_request_schema(api_key, version)
    response_type = load_response_schema(api_key, version)
    header_type = request_type.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_type)(
        buf,
        header_type(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(7),
            client_id="txn-admin",
        ),
    )
    entity_writer(request_type)(buf, request_type(**fields))
    with socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", buf.tell()) + buf.getvalue())
        frame = b""
        while len(frame) < 4 or len(frame) < 4 + struct.unpack(">i", frame[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            frame += chunk
    _, used = entity_reader(response_type.__header_schema__)(frame[4:], 0)
    return entity_reader(response_type)(frame[4:], used)[0]


def test_list_and_describe_transactions(txn_broker: BrokerProcess) -> None:
    topic = _topic(txn_broker)
    txn_id = f"admin-{uuid.uuid4().hex[:6]}"
    producer = _producer(txn_broker, txn_id)
    producer.begin_transaction()
    _send(producer, topic, ["a", "b"])
    listed = _admin_call(
        txn_broker,
        66,
        1,
        state_filters=("Ongoing", "Bogus"),
        producer_id_filters=(),
        duration_filter=-1,
    )
    assert listed.unknown_state_filters == ("Bogus",)
    [mine] = [t for t in listed.transaction_states if t.transactional_id == txn_id]
    assert mine.transaction_state == "Ongoing"
    described = _admin_call(txn_broker, 65, 0, transactional_ids=(txn_id, "nobody"))
    ours, unknown = described.transaction_states
    assert ours.transaction_state == "Ongoing" and ours.producer_id == mine.producer_id
    assert [(t.topic, sorted(t.partitions)) for t in ours.topics] == [(topic, [0, 1])]
    assert int(unknown.error_code) == 105  # TRANSACTIONAL_ID_NOT_FOUND
    producer.commit_transaction(15)
    described = _admin_call(txn_broker, 65, 0, transactional_ids=(txn_id,))
    assert described.transaction_states[0].transaction_state == "CompleteCommit"
