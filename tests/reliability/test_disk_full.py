"""The broker's disk fills up. Produces are refused with the retriable
KAFKA_STORAGE_ERROR (the connection stays open, nothing refused takes an
offset), Metadata and Fetch keep serving, nothing acknowledged is lost, and once
there is room again the broker carries on by itself: the WAL writes what it had
queued and accepts produces again, with no restart and no duplicate for an
idempotent producer's retries (``broker/storage/wal.py``).

The in-process test makes WAL writes fail with ENOSPC after a short write; the
real one puts the broker's whole home (WAL, segment objects, metadata database)
on a small tmpfs (needs root and mount; skipped otherwise) and fills it with a
ballast file, then deletes the ballast."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import struct
import subprocess
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from crc32c import crc32c
from kio.schema.errors import ErrorCode

from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.kafka import records
from broker.kafka.records import Buffer
from broker.kafka.transactions import TransactionCoordinator
from broker.storage.logstore import LogStore, ProduceError
from broker.storage.metadata import MetadataStore
from broker.storage.objectstore import LocalObjectStore
from broker.storage.txn_metadata import COMPLETE_COMMIT, PREPARE_COMMIT
from broker.storage.wal import read_entries
from tests.broker.clients import ContinuousProducer, create_topic, read_partitions, stop_all
from tests.broker.rawkafka import TxnOffsets, commit_offset
from tests.broker.test_durability import _append, _batch, _open, _until, _values, _wal
from tests.reliability.crash_load import analyse
from tests.support import BrokerProcess, wait_for


def test_a_failed_wal_write_refuses_produces_then_recovers(tmp_path: Path) -> None:
    async def scenario() -> None:
        logs = await _open(tmp_path / "home", {"t": 1})
        wal = _wal(logs)
        part = logs.partitions[("t", 0)]
        try:
            await _append(logs, "t", _batch(b"v0", producer_id=7, sequence=0))
            good_size = wal.current_file.stat().st_size
            write = wal._write_sync

            def disk_full(fd: int, buffers: list[Buffer]) -> None:
                os.write(fd, bytes(buffers[0])[:5])  # part of the entry got in: a short write
                raise OSError(errno.ENOSPC, "No space left on device")

            wal._write_sync = disk_full  # type: ignore[method-assign]
            with pytest.raises(OSError, match="No space"):
                await _append(logs, "t", _batch(b"v1", producer_id=7, sequence=1))
            assert part.high_watermark == 1, "a record that never reached the disk became visible"
            assert wal.current_file.stat().st_size == good_size, "the torn entry was left"
            taken = part.next_offset
            # the idempotent producer's retry and a new record: refused, no offset taken
            for batch in (_batch(b"v1", producer_id=7, sequence=1), _batch(b"v2")):
                with pytest.raises(ProduceError) as refused:
                    await _append(logs, "t", batch)
                assert refused.value.code == 56, refused.value.message
            assert part.next_offset == taken, "a refused batch took an offset"

            wal._write_sync = write  # type: ignore[method-assign]  # room again
            await _until(lambda: wal.failure is None, "the WAL to write its queued entry")
            assert part.high_watermark == 2
            base, _ = await _append(logs, "t", _batch(b"v1", producer_id=7, sequence=1))
            assert base == 1, "the retry of the queued batch was not taken as its duplicate"
            await _append(logs, "t", _batch(b"v2"))
            assert [v for _, v in await _values(logs, "t")] == [b"v0", b"v1", b"v2"]
            # the WAL file reads on past the failure: no torn entry in the middle
            entries = [e.partition for e in read_entries(wal.current_file)]
            assert len(entries) == 3, entries
        finally:
            await logs.close()

    asyncio.run(scenario())


def test_a_commit_decided_while_the_wal_fails_completes_once_it_writes(tmp_path: Path) -> None:
    """EndTxn while the WAL cannot write: the decision is stored, its markers are not; the
    producer's retries get CONCURRENT_TRANSACTIONS, and the coordinator's next pass after
    the WAL recovers writes the markers (the partition's LSO moves on), no restart."""

    async def scenario() -> None:
        logs = await _open(tmp_path / "home", {"t": 1})
        wal = _wal(logs)
        part = logs.partitions[("t", 0)]
        coordinator = TransactionCoordinator(logs.metadata, logs)
        try:
            error, pid, epoch = await coordinator.init_producer_id("tx", 60_000, -1, -1)
            assert error == ErrorCode.none
            assert await coordinator.add_partitions("tx", pid, epoch, [("t", 0)]) == {
                ("t", 0): ErrorCode.none
            }
            batch = bytearray(records.encode_batch([(None, b"in-tx")], 1_700_000_000_000))
            struct.pack_into(">hi", batch, 21, records.ATTR_TRANSACTIONAL, 0)
            struct.pack_into(">qhi", batch, 43, pid, epoch, 0)
            struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
            await _append(logs, "t", bytes(batch))
            assert (part.last_stable_offset, part.high_watermark) == (0, 1)

            write = wal._write_sync

            def disk_full(fd: int, buffers: list[Buffer]) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")

            wal._write_sync = disk_full  # type: ignore[method-assign]
            # the WAL fails on its next write: the commit's marker
            assert await coordinator.end_txn("tx", pid, epoch, True) == (
                ErrorCode.kafka_storage_error
            )
            assert wal.failure is not None
            assert await coordinator.end_txn("tx", pid, epoch, True) == (
                ErrorCode.concurrent_transactions
            )
            await coordinator.complete_decided()  # the WAL still fails: nothing to do yet
            assert coordinator.txns["tx"].state == PREPARE_COMMIT

            wal._write_sync = write  # type: ignore[method-assign]
            await _until(lambda: wal.failure is None, "the WAL to write its queued marker")
            await coordinator.complete_decided()
            assert coordinator.txns["tx"].state == COMPLETE_COMMIT
            assert part.last_stable_offset == part.high_watermark > 1
            assert await coordinator.end_txn("tx", pid, epoch, True) == ErrorCode.none
        finally:
            await logs.close()

    asyncio.run(scenario())


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs at ``tmp_path/disk``, unmounted at teardown (its source is named
    ``icefall-test-disk``, so a leftover is easy to find in ``mount``)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "icefall-test-disk", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_manifest_the_full_disk_refuses_is_written_once_there_is_room(
    small_disk: Path, tmp_path: Path
) -> None:
    """A topic change the metadata store took stands when the manifest beside it cannot be
    written: the manifest is rewritten by itself once the disk has room."""

    async def scenario() -> None:
        config = BrokerConfig(home=small_disk / "home", segment_flush_ms=600_000)
        metadata = MetadataStore(tmp_path / "metadata.sqlite")  # on a disk with room
        logs = LogStore(config, metadata, LocalObjectStore(tmp_path / "objects"))
        cluster = Cluster(config, metadata, logs)
        try:
            ballast = small_disk / "ballast"
            _fill(ballast)
            await cluster.create_topic("tt", 1, {"automq.table.topic.enable": "true"})
            assert cluster.manifest_failure is not None
            assert not config.manifest_path.exists()
            ballast.unlink()
            await _until(lambda: cluster.manifest_failure is None, "the manifest to be written")
            written = json.loads(config.manifest_path.read_text())
            assert [t["topic"] for t in written["table_topics"]] == ["tt"]
            assert [t.name for t in metadata.topics()] == ["tt"]
        finally:
            await _wal(logs).close()
            metadata.close()

    asyncio.run(scenario())


def _fill(path: Path) -> None:
    """Append to ``path`` until its disk is full (a short write, then ENOSPC)."""
    with open(path, "ab", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 2**16)


def _create_table_topic(broker: BrokerProcess) -> str:
    """Create the table topic ``late_table``: "created", or the name of the error code."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = NewTopic("late_table", 1, 1, config={"automq.table.topic.enable": "true"})
    try:
        admin.create_topics([topic])["late_table"].result(15)
    except KafkaException as exc:
        return str(exc.args[0].name())
    return "created"


def _register(broker: BrokerProcess, name: str) -> tuple[int, dict[str, object]]:
    """Register a record schema named ``name`` under the subject ``{name}-value``."""
    schema = {"type": "record", "name": name, "fields": [{"name": "f", "type": "string"}]}
    request = urllib.request.Request(
        f"{broker.registry_url}/subjects/{name}-value/versions",
        data=json.dumps({"schema": json.dumps(schema)}).encode(),
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(15) == 0, "records not delivered"


def _admin_writes(admin: AdminClient, partitions: int) -> dict[str, str]:
    """The admin writes of the disk-full test on ``doomed`` (grown to ``partitions``) and the
    group ``gone``, in an order that works once the disk has room (the delete last): each one's
    error name, or "done". After each, the same client's Metadata must answer (its connection
    was kept)."""
    calls: dict[str, Callable[[], dict[Any, Future[Any]]]] = {
        "create_partitions": lambda: admin.create_partitions([NewPartitions("doomed", partitions)]),
        "incremental_alter_configs": lambda: admin.incremental_alter_configs(
            [
                ConfigResource(
                    ResourceType.TOPIC,
                    "doomed",
                    incremental_configs=[
                        ConfigEntry(
                            "retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET
                        )
                    ],
                )
            ]
        ),
        "alter_configs": lambda: admin.alter_configs(
            [ConfigResource(ResourceType.TOPIC, "doomed", set_config={"retention.ms": "3600000"})]
        ),
        "delete_groups": lambda: admin.delete_consumer_groups(["gone"]),
        "delete_topics": lambda: admin.delete_topics(["doomed"]),
    }
    outcome: dict[str, str] = {}
    for name, call in calls.items():
        try:
            for future in call().values():
                future.result(15)
            outcome[name] = "done"
        except KafkaException as exc:
            outcome[name] = str(exc.args[0].name())
        assert "full" in admin.list_topics(timeout=10).topics, f"no Metadata after {name}"
    return outcome


def _health_status(broker: BrokerProcess) -> int:
    try:
        broker.admin("/healthz")
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


@pytest.mark.timeout(240)
@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_disk_full_refuses_produces_keeps_serving_and_recovers(
    small_disk: Path, tmp_path: Path
) -> None:
    broker = BrokerProcess(small_disk / "home", ["--segment-flush-ms", "100"])
    broker.log_path = tmp_path / "broker.log"  # not on the full disk
    broker.start()
    try:
        producers: list[ContinuousProducer] = []
        try:
            create_topic(broker.bootstrap, "full", 3)
            create_topic(broker.bootstrap, "doomed", 1)
            _produce(broker.bootstrap, "doomed", [b"d0", b"d1", b"d2"])
            assert commit_offset(broker.bootstrap, "gone", -1, "", "doomed", 1) == ErrorCode.none
            assert _register(broker, "first")[0] == 200  # _schemas exists before the disk fills
            txn = TxnOffsets(broker.bootstrap, "disk-txn", "txn-group")  # its state stored
            producers = [
                ContinuousProducer(
                    broker.bootstrap,
                    "full",
                    "noretry",
                    {"enable.idempotence": False, "retries": 0, "log_level": 0},
                    rate=20000,
                ).start(),
                ContinuousProducer(
                    broker.bootstrap,
                    "full",
                    "idem",
                    {"enable.idempotence": True, "message.timeout.ms": 120000, "log_level": 0},
                    rate=20000,
                ).start(),
            ]
            wait_for(lambda: all(p.acked_count > 100 for p in producers), 30, what="first acks")
            ballast = small_disk / "ballast"
            stat = os.statvfs(small_disk)
            ballast.write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 3 * 2**20))
            wait_for(
                lambda: _health_status(broker) == 503, 60, what="the WAL to fail on the full disk"
            )
            _fill(ballast)  # the room the failed WAL write gave back too: small writes fail now
            failed_before = len(producers[0].failed)
            wait_for(
                lambda: len(producers[0].failed) > failed_before + 100,
                30,
                what="produces refused while the disk is full",
            )
            refusals = Counter(e.split(",")[0] for e in producers[0].failed)
            assert set(refusals) == {"KafkaError{code=KAFKA_STORAGE_ERROR"}, refusals
            assert broker.proc is not None and broker.proc.poll() is None, "the broker died"
            assert "handler failed" not in broker.log_text(), "a produce closed its connection"

            # Metadata and Fetch serve on: every record acknowledged so far reads back, once
            topic = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics("full", 10)
            assert topic.topics["full"].error is None and len(topic.topics["full"].partitions) == 3
            acked = {v: po for p in producers for v, po in list(p.acked.items())}
            log = read_partitions(broker.bootstrap, "full", 3)
            found = Counter(v for entries in log.values() for _, v in entries)
            for value, (p, offset) in acked.items():
                assert log[p][offset][1] == value.encode(), (value, p, offset)
                assert found[value.encode()] == 1, value
            assert _health_status(broker) == 503, "the disk is still full"
            # a topic created now: refused with KAFKA_STORAGE_ERROR (or, when SQLite finds room in
            # its own files, created and put in the manifest once the disk has room)
            created = _create_table_topic(broker)
            assert created in ("created", "KAFKA_STORAGE_ERROR"), created
            # a group's offset commit: refused with the retriable COORDINATOR_NOT_AVAILABLE, as
            # Kafka's coordinator answers a failed offsets append (or stored, likewise)
            committed = commit_offset(broker.bootstrap, "g", -1, "", "full", 1)
            assert committed in (ErrorCode.none, ErrorCode.coordinator_not_available), committed
            # admin writes without a top-level error code: refused per item, the connection
            # open (the same client's Metadata answers), a refused delete leaves the topic
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            refused = _admin_writes(admin, 2)
            # a new partition is one small row: SQLite may find room for it in its own files,
            # so it is refused or stored, and the topic's partitions say which
            grown = refused.pop("create_partitions")
            assert grown in ("KAFKA_STORAGE_ERROR", "done"), grown
            assert refused == {
                "delete_topics": "KAFKA_STORAGE_ERROR",
                "incremental_alter_configs": "KAFKA_STORAGE_ERROR",
                "alter_configs": "KAFKA_STORAGE_ERROR",
                "delete_groups": "COORDINATOR_NOT_AVAILABLE",
            }, refused
            # TxnOffsetCommit: COORDINATOR_NOT_AVAILABLE, the connection open (Metadata on it)
            assert txn.commit("full", 5) == ErrorCode.coordinator_not_available
            doomed = admin.list_topics("doomed", 10).topics["doomed"]
            assert doomed.error is None, "refused delete: gone"
            assert len(doomed.partitions) == (2 if grown == "done" else 1), (
                grown,
                doomed.partitions,
            )
            assert [v for _, v in read_partitions(broker.bootstrap, "doomed", 1)[0]] == [
                b"d0",
                b"d1",
                b"d2",
            ]
            # a schema registered now: 50001, "error in the backend data store", as Confluent's
            for _ in range(3):
                status, body = _register(broker, "late")
                assert (status, body.get("error_code")) == (500, 50001), (status, body)
            # an idempotent producer starting now cannot get its producer id stored: it waits
            producers.append(
                ContinuousProducer(
                    broker.bootstrap,
                    "full",
                    "late",
                    {"enable.idempotence": True, "message.timeout.ms": 120000, "log_level": 0},
                    rate=2000,
                ).start()
            )

            ballast.unlink()
            wait_for(lambda: _health_status(broker) == 200, 30, what="the WAL to recover")
            if created != "created":
                assert _create_table_topic(broker) == "created"
            assert commit_offset(broker.bootstrap, "g", -1, "", "full", 2) == ErrorCode.none
            assert _register(broker, "late")[0] == 200
            assert txn.commit("full", 6) == ErrorCode.none
            txn.close()
            done = _admin_writes(admin, 3 if grown == "done" else 2)
            assert set(done.values()) == {"done"}, done
            assert "doomed" not in admin.list_topics(timeout=10).topics
            manifest = small_disk / "home" / "table_topics.json"
            wait_for(
                lambda: (
                    "late_table"
                    in {t["topic"] for t in json.loads(manifest.read_text())["table_topics"]}
                ),
                30,
                what="the new table topic in the manifest",
            )
            counts = [p.acked_count for p in producers]
            wait_for(
                lambda: all(
                    p.acked_count > c + 200 for p, c in zip(producers, counts, strict=True)
                ),
                60,
                what="acks again with room on the disk, without a restart",
            )
        finally:
            stop_all(producers)
        outcomes = analyse(read_partitions(broker.bootstrap, "full", 3, timeout=60), producers)
        print(outcomes)
        for name, o in outcomes.items():
            assert o.acked_lost == o.acked_misplaced == o.unknown == 0, (name, o)
        for idem in (outcomes["idem"], outcomes["late"]):
            assert idem.duplicates == idem.order_violations == 0, idem
        text = broker.log_text()
        assert "handler failed" not in text, "a request closed its connection"
        # the registry's refusals: one line (a minute), no traceback each
        assert text.count("refused with 50001") == 1, text.count("refused with 50001")
        assert "writing to _schemas failed" not in text
        failed, recovered = text.count("WAL write failed"), text.count("WAL writable again")
        assert 1 <= failed <= recovered + 1, (failed, recovered)  # one line each, not per request
        assert failed < len(producers[0].failed) / 10, (failed, len(producers[0].failed))
    finally:
        code = broker.stop()
    assert code == 0, broker.log_text()[-3000:]
