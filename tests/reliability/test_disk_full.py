"""The disk under the WAL fills up. Kafka takes a failed log directory offline;
here the WAL stops for good: nothing acknowledged is lost, every later produce
is answered KAFKA_STORAGE_ERROR (retriable; the connection stays open, nothing
takes an offset), ``/healthz`` answers 503 so a supervisor restarts the broker,
and after a restart with space again the producers carry on.

The in-process test makes the WAL write fail with ENOSPC; the real one puts the
broker's home on a small tmpfs (needs root and mount; skipped otherwise)."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.storage.logstore import ProduceError
from tests.broker.clients import ContinuousProducer, create_topic, read_partitions, stop_all
from tests.broker.test_durability import _append, _batch, _open, _wal
from tests.reliability.crash_load import analyse
from tests.support import BrokerProcess, wait_for


def test_a_failed_wal_write_refuses_later_produces_without_taking_offsets(tmp_path: Path) -> None:
    async def scenario() -> None:
        logs = await _open(tmp_path / "home", {"t": 1})
        try:
            await _append(logs, "t", _batch(b"v0"))

            def disk_full(fd: int, buffers: object) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")

            _wal(logs)._write_sync = disk_full  # type: ignore[method-assign]
            with pytest.raises(OSError, match="No space"):
                await _append(logs, "t", _batch(b"v1"))
            part = logs.partitions[("t", 0)]
            taken = part.next_offset
            assert part.high_watermark == 1, "a record that never reached the disk became visible"
            with pytest.raises(ProduceError) as refused:
                await _append(logs, "t", _batch(b"v2"))
            assert refused.value.code == 56 and "write-ahead log failed" in refused.value.message
            assert part.next_offset == taken, "a refused batch took an offset"
        finally:
            with pytest.raises(OSError, match="write-ahead log failed"):
                await logs.close()  # flushes what it can, then reports the WAL it could not finish

    asyncio.run(scenario())


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _health_status(broker: BrokerProcess) -> int:
    try:
        broker.admin("/healthz")
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


@pytest.mark.timeout(240)
def test_disk_full_under_load_loses_nothing_acknowledged(small_disk: Path, tmp_path: Path) -> None:
    broker = BrokerProcess(
        small_disk / "home",
        ["--segment-flush-ms", "100", "--object-store", str(tmp_path / "objects")],
    )
    broker.log_path = tmp_path / "broker.log"
    broker.start()
    try:
        create_topic(broker.bootstrap, "full", 3)
        ballast = small_disk / "ballast"
        stat = os.statvfs(small_disk)
        ballast.write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 3 * 2**20))
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
        try:
            wait_for(
                lambda: _health_status(broker) == 503, 60, what="the WAL to fail on the full disk"
            )
            failed_before = len(producers[0].failed)
            wait_for(
                lambda: len(producers[0].failed) > failed_before + 100,
                30,
                what="produces refused while the disk is full",
            )
            assert broker.proc is not None and broker.proc.poll() is None, "the broker died"
            assert "handler failed" not in broker.log_text(), (
                "produces were answered by closing the connection"
            )
            ballast.unlink()
            broker.stop()
            counts = [p.acked_count for p in producers]
            broker.start()
            assert _health_status(broker) == 200
            wait_for(
                lambda: all(
                    p.acked_count > c + 200 for p, c in zip(producers, counts, strict=True)
                ),
                60,
                what="acks after the restart",
            )
        finally:
            stop_all(producers)
        outcomes = analyse(read_partitions(broker.bootstrap, "full", 3, timeout=60), producers)
        print(outcomes)
        for name, o in outcomes.items():
            assert o.acked_lost == o.acked_misplaced == o.unknown == 0, (name, o)
        assert outcomes["idem"].duplicates == outcomes["idem"].order_violations == 0, outcomes[
            "idem"
        ]
    finally:
        broker.stop()
