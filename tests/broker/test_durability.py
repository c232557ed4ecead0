"""Crash durability: kill -9 the broker while producers with acks=all are
producing, restart it on the same home and ports, and check that every
acknowledged record is still there, at the offset it was acknowledged with,
exactly once, with contiguous offsets. At the end, in-process tests of crash
windows too narrow to hit with a real kill."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crc32c import crc32c

from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.kafka import records
from broker.storage.logstore import LogStore
from broker.storage.metadata import MetadataStore
from broker.storage.objectstore import LocalObjectStore
from broker.storage.wal import WriteAheadLog
from tests.broker.clients import (
    ContinuousProducer,
    create_topic,
    read_partitions,
    stop_all,
    verify_log,
)
from tests.support import BrokerProcess, wait_for

TOPIC = "durable"
PARTITIONS = 3


def _producers(broker: BrokerProcess) -> list[ContinuousProducer]:
    return [
        # no retries: a record the broker wrote but could not acknowledge before the
        # kill is reported as failed, never written twice
        ContinuousProducer(
            broker.bootstrap, TOPIC, "plain", {"enable.idempotence": False, "retries": 0}
        ),
        # retries across the restart; the broker must recognise the duplicates
        ContinuousProducer(broker.bootstrap, TOPIC, "idem", {"enable.idempotence": True}),
    ]


def _offsets(broker: BrokerProcess) -> dict[int, dict[str, Any]]:
    data = broker.admin(f"/v1/topics/{TOPIC}/offsets")
    return {p["partition"]: p for p in data["partitions"]}


def _all_acked_beyond(producers: list[ContinuousProducer], counts: list[int], more: int) -> bool:
    return all(p.acked_count >= c + more for p, c in zip(producers, counts, strict=True))


def _restart_after_kill9(
    broker: BrokerProcess, producers: list[ContinuousProducer]
) -> dict[str, tuple[int, int]]:
    """kill -9, restart on the same home and ports, wait until both producers
    get acks again. Returns the records acknowledged before the kill."""
    broker.kill9()
    before_kill = {v: po for pr in producers for v, po in list(pr.acked.items())}
    counts = [p.acked_count for p in producers]
    broker.start()
    wait_for(
        lambda: _all_acked_beyond(producers, counts, 300),
        40,
        what="producers acknowledged again after the restart",
    )
    return before_kill


def _check_after_restart(
    broker: BrokerProcess,
    producers: list[ContinuousProducer],
    acked_before_kill: dict[str, tuple[int, int]],
) -> None:
    log = read_partitions(broker.bootstrap, TOPIC, PARTITIONS)
    verify_log(log, producers)
    offsets = _offsets(broker)
    for p, entries in log.items():
        assert offsets[p]["log_start_offset"] == 0
        assert offsets[p]["high_watermark"] == len(entries)
        assert offsets[p]["flushed_offset"] <= offsets[p]["high_watermark"]
    # what the WAL held at the kill was replayed and flushed when the broker opened
    for value, (p, offset) in acked_before_kill.items():
        assert offsets[p]["flushed_offset"] > offset, (
            f"{value} at {p}/{offset} not flushed after the restart"
        )


def _run(broker: BrokerProcess, kill_when: Callable[[], bool], cycles: int = 1) -> None:
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    producers = [p.start() for p in _producers(broker)]
    acked_before_kill: dict[str, tuple[int, int]] = {}
    try:
        for _ in range(cycles):
            counts = [p.acked_count for p in producers]

            def ready(counts: list[int] = counts) -> bool:
                return _all_acked_beyond(producers, counts, 1000) and kill_when()

            wait_for(ready, 40, what="records acknowledged before the kill")
            acked_before_kill.update(_restart_after_kill9(broker, producers))
    finally:
        stop_all(producers)
    _check_after_restart(broker, producers, acked_before_kill)


def test_kill9_while_records_are_only_in_the_wal(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(["--segment-flush-ms", "60000"])
    segments = broker.home / "objects" / "segments"

    def nothing_flushed() -> bool:
        offsets = _offsets(broker)
        assert all(
            o["flushed_offset"] == 0 and o["high_watermark"] > 0 for o in offsets.values()
        ), offsets
        assert not (segments.exists() and any(segments.iterdir())), "a segment object was written"
        assert any((broker.home / "wal").glob("*.wal"))
        return True

    _run(broker, nothing_flushed)
    assert segments.exists() and any(segments.iterdir()), (
        "the replayed WAL was not flushed at startup"
    )


def test_kill9_after_segments_were_flushed(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(["--segment-flush-ms", "100"])

    def some_flushed() -> bool:
        health = broker.admin("/healthz")
        offsets = _offsets(broker)
        return bool(
            health["segments_written"] >= 3
            and all(o["flushed_offset"] > 0 for o in offsets.values())
        )

    _run(broker, some_flushed, cycles=2)


def test_sigterm_restart_keeps_everything(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(["--segment-flush-ms", "60000"])
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    producers = [p.start() for p in _producers(broker)]
    try:
        wait_for(
            lambda: _all_acked_beyond(producers, [0, 0], 1000), 40, what="records acknowledged"
        )
        assert all(o["flushed_offset"] == 0 for o in _offsets(broker).values())
        assert broker.stop() == 0
        acked_before_stop = {v: po for pr in producers for v, po in list(pr.acked.items())}
        counts = [p.acked_count for p in producers]
        broker.start()
        wait_for(
            lambda: _all_acked_beyond(producers, counts, 300), 40, what="acks after the restart"
        )
    finally:
        stop_all(producers)
    assert "replayed" not in broker.log_text(), "a clean stop should leave nothing to replay"
    log = read_partitions(broker.bootstrap, TOPIC, PARTITIONS)
    verify_log(log, producers)
    offsets = _offsets(broker)
    assert [offsets[p]["high_watermark"] for p in range(PARTITIONS)] == [
        len(log[p]) for p in range(PARTITIONS)
    ]
    # the clean stop flushed everything acknowledged before it
    for value, (p, offset) in acked_before_stop.items():
        assert offsets[p]["flushed_offset"] > offset, value


def test_kill9_of_an_idle_broker_then_again_after_produce(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """A topic with no records survives kill -9 (empty WAL); one with records survives a second one."""
    broker = broker_factory(["--segment-flush-ms", "100"])
    create_topic(broker.bootstrap, TOPIC, PARTITIONS)
    broker.kill9()
    broker.start()
    assert [o["high_watermark"] for o in _offsets(broker).values()] == [0] * PARTITIONS
    producers = [p.start() for p in _producers(broker)]
    try:
        wait_for(lambda: _all_acked_beyond(producers, [0, 0], 500), 40, what="records acknowledged")
    finally:
        stop_all(producers)
    broker.kill9()
    broker.start()
    verify_log(read_partitions(broker.bootstrap, TOPIC, PARTITIONS), producers)


# ---------------------------------------------------------------- crash windows, in process
#
# Windows too narrow to hit reliably with kill -9: the log store runs in this
# process with its object store put or its WAL write held at a chosen point,
# and a "crash" is a second LogStore opened on the same home while the first
# one can no longer write anything.


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _batch(value: bytes, producer_id: int = -1, sequence: int = -1, epoch: int = 0) -> bytes:
    """A one-record v2 batch, uncompressed (producer_id -1: not idempotent)."""
    ts = 1_700_000_000_000
    body = (
        b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(len(value)) + value + _varint(0)
    )
    after_crc = (
        struct.pack(
            ">hiqqqhii", 0, 0, ts, ts, producer_id, epoch if producer_id >= 0 else -1, sequence, 1
        )
        + _varint(len(body))
        + body
    )
    rest = struct.pack(">iBI", 0, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(rest)) + rest


class _Gate:
    """Holds a blocking call (run in an executor thread) until released."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self.call = call
        self.entered = threading.Event()
        self.release = threading.Event()
        self.dead = False  # released as a dead process: do nothing

    def __call__(self, *args: Any) -> Any:
        self.entered.set()
        assert self.release.wait(30), "gate never released"
        return None if self.dead else self.call(*args)


def _wal(logs: LogStore) -> WriteAheadLog:
    """The log store's WAL (one broker on SQLite: not cluster mode)."""
    assert isinstance(logs.wal, WriteAheadLog)
    return logs.wal


async def _open(home: Path, topics: dict[str, int]) -> LogStore:
    config = BrokerConfig(home=home, segment_flush_ms=600_000)
    logs = LogStore(config, MetadataStore(config.metadata_db), LocalObjectStore(home / "objects"))
    await logs.open(topics)
    return logs


async def _append(
    logs: LogStore, topic: str, batch: bytes, durable: bool = True
) -> tuple[int, int]:
    base, seq = await logs.append(logs.partitions[(topic, 0)], batch, 1 << 20)
    if durable:
        await asyncio.wait_for(logs.wal.wait_durable(seq), 10)
    return base, seq


async def _values(logs: LogStore, topic: str) -> list[tuple[int, bytes | None]]:
    data = await logs.read(logs.partitions[(topic, 0)], 0, 1 << 20)
    return [
        (r.offset, r.value)
        for _, b in records.iter_batches(data)
        for r in records.decode_batch(b)[1]
    ]


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def _abandon(logs: LogStore, *gates: _Gate) -> None:
    """What is left of a killed broker: let held threads return without writing."""
    for gate in gates:
        gate.dead = True
        gate.release.set()
    for task in (logs._flusher, _wal(logs)._writer):
        if task is not None:
            task.cancel()


def test_crash_after_a_flush_does_not_turn_a_lost_batch_into_a_duplicate(tmp_path: Path) -> None:
    """The producer state saved with a segment must describe exactly the batches
    up to the WAL roll. Saved later, it can name a batch that never reached the
    WAL; after a crash the producer's retry of it was acknowledged as a
    duplicate at an offset that then went to the next batch."""

    async def scenario() -> None:
        home = tmp_path / "home"
        logs = await _open(home, {"t": 1})
        await _append(logs, "t", _batch(b"v0", 1000, 0))
        put = _Gate(logs.store.put)
        logs.store.put = put  # type: ignore[method-assign, assignment]
        flush = asyncio.create_task(logs.flush())
        await _until(put.entered.is_set, "the segment put")  # the WAL has rolled
        write = _Gate(_wal(logs)._write_sync)
        _wal(logs)._write_sync = write  # type: ignore[method-assign, assignment]
        await _append(logs, "t", _batch(b"v1", 1000, 1), durable=False)
        await _until(write.entered.is_set, "the WAL write of v1")
        put.release.set()
        await flush  # the segment and the producer state are committed; v1 is not on disk
        # kill -9 here: v1 was never acknowledged, the producer will send it again
        restarted = await _open(home, {"t": 1})
        _abandon(logs, write)
        try:
            assert restarted.partitions[("t", 0)].next_offset == 1
            retry_base, _ = await _append(restarted, "t", _batch(b"v1", 1000, 1))
            next_base, _ = await _append(restarted, "t", _batch(b"v2", 1000, 2))
            assert (retry_base, next_base) == (1, 2)
            assert await _values(restarted, "t") == [(0, b"v0"), (1, b"v1"), (2, b"v2")]
        finally:
            await restarted.close()

    asyncio.run(scenario())


def test_a_retried_batch_is_acknowledged_only_when_the_original_is_durable(tmp_path: Path) -> None:
    async def scenario() -> None:
        logs = await _open(tmp_path / "home", {"t": 1})
        write = _Gate(_wal(logs)._write_sync)
        _wal(logs)._write_sync = write  # type: ignore[method-assign, assignment]
        try:
            _, first = await _append(logs, "t", _batch(b"v0", 1000, 0), durable=False)
            base, retry = await _append(logs, "t", _batch(b"v0", 1000, 0), durable=False)
            assert base == 0
            assert retry >= first, "the retry's ack would not wait for the original's fsync"
        finally:
            write.release.set()
            await logs.close()

    asyncio.run(scenario())


def test_close_while_the_flusher_writes_the_wal_does_not_hang(tmp_path: Path) -> None:
    async def scenario() -> None:
        logs = await _open(tmp_path / "home", {"t": 1})
        write = _Gate(_wal(logs)._write_sync)
        _wal(logs)._write_sync = write  # type: ignore[method-assign, assignment]
        # the flusher's roll, not the WAL writer, takes the next append to disk
        await _wal(logs)._write_lock.acquire()
        logs._flush_needed.set()
        # holding the flush lock, the flusher is already waiting for the WAL (its only suspension point)
        await _until(logs._flush_lock.locked, "the flusher to wait for the WAL")
        await _append(logs, "t", _batch(b"v0"), durable=False)
        _wal(logs)._write_lock.release()
        await _until(write.entered.is_set, "the roll's WAL write")
        closing = asyncio.create_task(logs.close())
        await asyncio.sleep(0)  # let close() run up to where it waits
        write.release.set()
        await asyncio.wait_for(closing, 10)

    asyncio.run(scenario())


def test_a_topic_deleted_during_a_flush_leaves_nothing_in_the_index(tmp_path: Path) -> None:
    async def scenario() -> None:
        logs = await _open(tmp_path / "home", {"gone": 1, "kept": 1})
        try:
            await _append(logs, "gone", _batch(b"g"))
            await _append(logs, "kept", _batch(b"k"))
            put = _Gate(logs.store.put)
            logs.store.put = put  # type: ignore[method-assign, assignment]
            flush = asyncio.create_task(logs.flush())
            await _until(put.entered.is_set, "the segment put")
            logs.drop_topic("gone")  # what Cluster.delete_topic does
            logs.metadata.delete_topic("gone")
            put.release.set()
            await flush
            assert logs.metadata.chunks("gone", 0) == [], (
                "a topic created again as 'gone' would inherit this"
            )
            assert len(logs.metadata.chunks("kept", 0)) == 1
            assert logs.unflushed_bytes == 0
            assert await _values(logs, "kept") == [(0, b"k")]
        finally:
            await logs.close()

    asyncio.run(scenario())


def test_a_topic_deleted_during_the_index_write_waits_for_it(tmp_path: Path) -> None:
    """The flusher's index write runs in a thread under LogStore.index_lock;
    Cluster.delete_topic writes the database first, under that lock too, so it waits
    for the index write: meanwhile the topic is still listed and readable and the event
    loop keeps serving. Once the index write is done, the delete removes the chunks it
    just indexed (they do not outlive the topic), then the topic leaves the cluster."""

    async def scenario() -> None:
        logs = await _open(tmp_path / "home", {})
        cluster = Cluster(logs.config, logs.metadata, logs)
        try:
            await cluster.create_topic("gone", 1, {})
            await cluster.create_topic("kept", 1, {})
            gone_id = cluster.topics["gone"].topic_id
            await _append(logs, "gone", _batch(b"g"))
            await _append(logs, "kept", _batch(b"k"))
            order: list[str] = []
            add_chunks, delete_in_db = logs.metadata.add_chunks, logs.metadata.delete_topic

            def indexed(*args: Any) -> Any:
                result = add_chunks(*args)
                order.append("index")
                return result

            def deleted(name: str) -> list[str]:
                order.append(f"delete {name}")
                return delete_in_db(name)

            index = _Gate(indexed)
            logs.metadata.add_chunks = index  # type: ignore[method-assign, assignment]
            logs.metadata.delete_topic = deleted  # type: ignore[method-assign]
            flush = asyncio.create_task(logs.flush())
            await _until(index.entered.is_set, "the index write")
            delete = asyncio.create_task(cluster.delete_topic("gone"))
            # the delete holds the cluster's change lock: it is waiting on the index lock
            # (nothing between the two can suspend it)
            await _until(cluster._changes.locked, "the delete to start")
            assert logs.index_lock.locked() and not delete.done() and order == []
            # the topic is as it was, and the loop serves reads and produces meanwhile
            assert "gone" in cluster.topics and gone_id in cluster.topics_by_id
            assert {t.name for t in logs.metadata.topics()} == {"gone", "kept"}
            assert await _values(logs, "gone") == [(0, b"g")]
            assert (await _append(logs, "kept", _batch(b"k2")))[0] == 1
            assert await _values(logs, "kept") == [(0, b"k"), (1, b"k2")]
            index.release.set()
            await asyncio.wait_for(asyncio.gather(flush, delete), 10)
            assert order == ["index", "delete gone"]
            assert "gone" not in cluster.topics and gone_id not in cluster.topics_by_id
            assert ("gone", 0) not in logs.partitions
            assert {t.name for t in logs.metadata.topics()} == {"kept"}
            assert logs.metadata.chunks("gone", 0) == []
            # the record produced during the wait is in the tail: the next flush writes it
            await logs.flush()
            assert len(logs.metadata.chunks("kept", 0)) == 2
            assert logs.unflushed_bytes == 0
            assert await _values(logs, "kept") == [(0, b"k"), (1, b"k2")]
        finally:
            await logs.close()

    asyncio.run(scenario())
