"""aiokafka end to end: admin, acks and codecs, the idempotent producer, positions and seeks, groups."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import OffsetAndMetadata

from tests.broker.rawkafka import batch_codecs, batches, produce_raw, with_sequence
from tests.support import BrokerProcess

TEST_TIMEOUT = 60.0
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
TOPIC_ALREADY_EXISTS = 36
SOURCE_DYNAMIC_TOPIC, SOURCE_DEFAULT = 1, 5


def async_test(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body in its own event loop, with an overall deadline."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), TEST_TIMEOUT))

    return run


async def until(
    condition: Callable[[], Any],
    timeout: float = 30.0,  # noqa: ASYNC109 (a poll deadline, not a cancellation)
    what: str = "condition",
) -> Any:
    """The async twin of tests.support.wait_for: poll until truthy, fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def drain(
    consumer: AIOKafkaConsumer,
    count: int,
    timeout: float = 30.0,  # noqa: ASYNC109 (a poll deadline, not a cancellation)
) -> list[ConsumerRecord]:
    """Records until ``count`` arrived (fails on timeout), plus whatever else is already pending."""
    got: list[ConsumerRecord] = []

    async def more() -> bool:
        for records in (await consumer.getmany(timeout_ms=200)).values():
            got.extend(records)
        return len(got) >= count

    await until(more, timeout, what=f"{count} records")
    for records in (await consumer.getmany(timeout_ms=300)).values():
        got.extend(records)
    return got


async def _admin(broker: BrokerProcess) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    return admin


async def _create(
    admin: AIOKafkaAdminClient, name: str, partitions: int = 1, **configs: str
) -> None:
    response = await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
    assert [(t[0], t[1]) for t in response.topic_errors] == [(name, 0)]


async def _consumer(broker: BrokerProcess, *topics: str, **conf: Any) -> AIOKafkaConsumer:
    conf.setdefault("enable_auto_commit", False)
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=broker.bootstrap, **conf)
    await consumer.start()
    return consumer


@async_test
async def test_admin_topics_and_configs(broker: BrokerProcess) -> None:
    admin = await _admin(broker)
    try:
        await _create(admin, "ak-orders", 4, **{"retention.ms": "7200000"})
        await _create(admin, "ak-plain", 2)
        again = await admin.create_topics([NewTopic("ak-orders", 1, 1)])
        assert [(t[0], t[1]) for t in again.topic_errors] == [("ak-orders", TOPIC_ALREADY_EXISTS)]
        assert {"ak-orders", "ak-plain"} <= set(await admin.list_topics())
        described = {t["topic"]: t for t in await admin.describe_topics(["ak-orders", "ak-plain"])}
        assert sorted(p["partition"] for p in described["ak-orders"]["partitions"]) == [0, 1, 2, 3]
        assert len(described["ak-plain"]["partitions"]) == 2

        async def configs(topic: str) -> dict[str, tuple[str, int]]:
            (response,) = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)]
            )
            (resource,) = response.to_object()["resources"]
            assert resource["error_code"] == 0
            return {
                c["config_names"]: (c["config_value"], c["config_source"])
                for c in resource["config_entries"]
            }

        orders, plain = await configs("ak-orders"), await configs("ak-plain")
        assert orders["retention.ms"] == ("7200000", SOURCE_DYNAMIC_TOPIC)
        assert plain["retention.ms"][1] == SOURCE_DEFAULT and plain["retention.ms"][0] != "7200000"
        assert set(orders) == set(plain)  # every topic describes the same keys

        (altered,) = await admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    "ak-plain",
                    {"retention.ms": "60000", "cleanup.policy": "compact"},
                )
            ]
        )
        assert [r[0] for r in altered.resources] == [0]
        plain = await configs("ak-plain")
        assert plain["retention.ms"] == ("60000", SOURCE_DYNAMIC_TOPIC)
        assert plain["cleanup.policy"] == ("compact", SOURCE_DYNAMIC_TOPIC)

        deleted = await admin.delete_topics(["ak-orders"])
        assert [tuple(t) for t in deleted.topic_error_codes] == [("ak-orders", 0)]
        remaining = await admin.list_topics()
        assert "ak-orders" not in remaining and "ak-plain" in remaining
    finally:
        await admin.close()


@pytest.mark.parametrize(
    ("acks", "codec"),
    [
        (0, None),
        (1, None),
        ("all", None),
        ("all", "gzip"),
        ("all", "snappy"),
        ("all", "lz4"),
        ("all", "zstd"),
    ],
)
@async_test
async def test_produce_acks_and_codecs(
    broker: BrokerProcess, acks: int | str, codec: str | None
) -> None:
    topic = f"ak-{acks}-{codec}"
    admin = await _admin(broker)
    await _create(admin, topic, 2)
    await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap, acks=acks, compression_type=codec, linger_ms=10
    )
    await producer.start()
    sent = {f"k{i}".encode(): f"value-{i}-{'y' * 100}".encode() for i in range(500)}
    try:
        futures = [
            await producer.send(topic, value=v, key=k, headers=[("k", k)]) for k, v in sent.items()
        ]
        results = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    if acks != 0:  # an acks=0 produce is not answered, so there are no offsets to check
        for partition in (0, 1):
            offsets = sorted(r.offset for r in results if r.partition == partition)
            assert offsets == list(range(len(offsets)))

    consumer = await _consumer(
        broker, topic, group_id=f"g-{uuid.uuid4()}", auto_offset_reset="earliest"
    )
    try:
        got = await drain(consumer, len(sent))
    finally:
        await consumer.stop()
    assert len(got) == len(sent)
    assert {r.key: r.value for r in got} == sent
    assert all(dict(r.headers)["k"] == r.key for r in got)
    for partition in (0, 1):
        assert set(batch_codecs(broker.bootstrap, topic, partition)) == {codec or "none"}


@async_test
async def test_idempotent_producer(broker: BrokerProcess) -> None:
    topic = "ak-idempotent"
    admin = await _admin(broker)
    await _create(admin, topic, 2)
    await admin.close()

    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap, enable_idempotence=True, linger_ms=5
    )
    await producer.start()
    results = []
    try:
        for chunk in range(0, 600, 50):  # awaited in chunks: several batches per partition
            futures = [
                await producer.send(topic, value=f"{i}".encode(), partition=i % 2)
                for i in range(chunk, chunk + 50)
            ]
            results += await asyncio.gather(*futures)
    finally:
        await producer.stop()
    second = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True)
    await second.start()
    try:
        other = await second.send_and_wait(topic, b"second", partition=0)
    finally:
        await second.stop()

    for partition in (0, 1):
        offsets = [r.offset for r in results if r.partition == partition]
        assert offsets == list(range(300))
        stored = batches(broker.bootstrap, topic, partition)
        mine = [b for b in stored if b.base_offset < 300]
        assert len(mine) > 5  # several batches, so sequences must chain across them
        # one producer id and epoch, handed out by the broker; sequences continue batch to batch
        assert (
            len({(b.producer_id, b.producer_epoch) for b in mine}) == 1 and mine[0].producer_id >= 0
        )
        expected_sequence = 0
        for batch in mine:
            assert batch.base_sequence == expected_sequence
            expected_sequence += batch.record_count
        if partition == 0:
            (theirs,) = [b for b in stored if b.base_offset == other.offset]
            assert theirs.producer_id != mine[0].producer_id  # each producer gets its own id

        # a retried batch (the same producer id and sequences) is acknowledged, not appended again:
        # the last five batches of a producer are remembered (up to five may be in flight)
        high_watermark = stored[-1].base_offset + stored[-1].record_count
        for batch in (mine[-1], mine[-5]):
            assert produce_raw(broker.bootstrap, topic, partition, batch.data) == (
                0,
                batch.base_offset,
            )
        # a gap in the sequence is refused
        gap = with_sequence(mine[-1].data, expected_sequence + 5)
        assert (
            produce_raw(broker.bootstrap, topic, partition, gap)[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
        )
        after = batches(broker.bootstrap, topic, partition)
        assert after[-1].base_offset + after[-1].record_count == high_watermark

    consumer = await _consumer(
        broker, topic, group_id="ak-idem-check", auto_offset_reset="earliest"
    )
    try:
        got = await drain(consumer, 601)
    finally:
        await consumer.stop()
    values = sorted(r.value for r in got)
    assert values == sorted(
        [f"{i}".encode() for i in range(600)] + [b"second"]
    )  # each exactly once


@async_test
async def test_positions_seek_and_offsets_for_times(broker: BrokerProcess) -> None:
    topic = "ak-seek"
    admin = await _admin(broker)
    await _create(admin, topic, 1)
    await admin.close()
    tp = TopicPartition(topic, 0)
    base = 1_690_000_000_000
    stamps = [base + i * 500 for i in range(30)]
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        for i, ts in enumerate(stamps):
            await producer.send_and_wait(topic, f"old-{i}".encode(), partition=0, timestamp_ms=ts)

        latest = await _consumer(broker, topic, group_id="ak-latest", auto_offset_reset="latest")
        try:
            await until(
                lambda: latest.assignment() == {tp}, 20, what="the latest consumer's assignment"
            )
            assert await latest.position(tp) == len(stamps)
            new = [f"new-{i}".encode() for i in range(5)]
            for value in new:
                await producer.send_and_wait(topic, value, partition=0)
            assert [r.value for r in await drain(latest, len(new))] == new
        finally:
            await latest.stop()
    finally:
        await producer.stop()
    total = len(stamps) + len(new)

    earliest = await _consumer(broker, topic, group_id="ak-earliest", auto_offset_reset="earliest")
    try:
        got = await drain(earliest, total)
        assert [r.offset for r in got] == list(range(total))
        assert [r.timestamp for r in got[: len(stamps)]] == stamps
    finally:
        await earliest.stop()

    manual = await _consumer(broker)
    try:
        manual.assign([tp])
        assert await manual.beginning_offsets([tp]) == {tp: 0}
        assert await manual.end_offsets([tp]) == {tp: total}
        manual.seek(tp, 12)
        got = await drain(manual, total - 12)
        assert [r.offset for r in got] == list(range(12, total))
        await manual.seek_to_beginning(tp)
        assert await manual.position(tp) == 0
        await manual.seek_to_end(tp)
        assert await manual.position(tp) == total

        for query in (base - 1, base + 7_250, stamps[-1]):
            index = next(i for i, ts in enumerate(stamps) if ts >= query)
            found = (await manual.offsets_for_times({tp: query}))[tp]
            assert found is not None and (found.offset, found.timestamp) == (
                index,
                stamps[index],
            ), query
        start = (await manual.offsets_for_times({tp: base + 10_000}))[tp]
        manual.seek(tp, start.offset)
        got = await drain(manual, total - start.offset)
        assert got[0].timestamp >= base + 10_000 and got[0].offset == start.offset
    finally:
        await manual.stop()


@async_test
async def test_consumer_group_commit_and_describe(broker: BrokerProcess) -> None:
    topic = "ak-group"
    admin = await _admin(broker)
    try:
        await _create(admin, topic, 3)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            for p in range(3):
                for i in range(10):
                    await producer.send(topic, f"{p}-{i}".encode(), partition=p)
            await producer.flush()
        finally:
            await producer.stop()
        tps = [TopicPartition(topic, p) for p in range(3)]

        group = "ak-group-1"
        consumer = await _consumer(
            broker, topic, group_id=group, auto_offset_reset="earliest", client_id="ak-member"
        )
        try:
            got = await drain(consumer, 30)
            assert len(got) == 30
            assert consumer.assignment() == set(tps)
            assert await consumer.committed(tps[0]) is None
            await consumer.commit()
            assert [await consumer.committed(tp) for tp in tps] == [10, 10, 10]
            wanted = {tps[0]: 3, tps[1]: 7, tps[2]: 10}
            await consumer.commit(
                {tp: OffsetAndMetadata(o, f"meta-{o}") for tp, o in wanted.items()}
            )
            assert {tp: await consumer.committed(tp) for tp in tps} == wanted

            assert (group, "consumer") in await admin.list_consumer_groups()
            (response,) = await admin.describe_consumer_groups([group])
            (described,) = response.to_object()["groups"]
            assert (described["error_code"], described["group"], described["state"]) == (
                0,
                group,
                "Stable",
            )
            assert [m["client_id"] for m in described["members"]] == ["ak-member"]
        finally:
            await consumer.stop()

        committed = await admin.list_consumer_group_offsets(group)
        assert {tp: (o.offset, o.metadata) for tp, o in committed.items()} == {
            tp: (o, f"meta-{o}") for tp, o in wanted.items()
        }

        resumed = await _consumer(broker, topic, group_id=group, auto_offset_reset="earliest")
        try:
            got = await drain(resumed, sum(10 - o for o in wanted.values()))
        finally:
            await resumed.stop()
        assert sorted((r.partition, r.offset) for r in got) == sorted(
            (tp.partition, o) for tp, start in wanted.items() for o in range(start, 10)
        )
    finally:
        await admin.close()
