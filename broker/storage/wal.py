"""The local write-ahead log: every accepted batch is appended here and
fsync'd (group commit) before the producer is acknowledged.

Files roll when the log store flushes a segment: every entry of a closed file
is then in the object store, so the file can be deleted once the segment
index commits. Entries carry a CRC; replay stops at the first torn entry.

A write or fsync that fails (ENOSPC on a full disk, EIO) does not stop the log
for good: its waiters are told at once (the producers get the retriable
KAFKA_STORAGE_ERROR, nothing of it was acknowledged), the file is cut back to
its last durable byte (a torn entry in the middle would end a replay before the
entries written after it), new appends are refused while it lasts, and the
entries that failed stay queued, in order, and are written again every
``RETRY_S`` until the disk takes them. They already have their offsets in the
partitions' tails, so writing them later is what keeps those offsets right; an
idempotent producer's retry of one of them is then acknowledged as the
duplicate it is (``LogStore.append``). One log line when it fails, one when it
recovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from crc32c import crc32c

from broker.kafka.records import Buffer

log = logging.getLogger(__name__)
T = TypeVar("T")
# how often a failed log tries its queued entries again (space may be back)
RETRY_S = 1.0

# entry length (after this header), crc32c of the rest, topic length, partition, append time
_ENTRY = struct.Struct(">IIHiq")


@dataclass(frozen=True, slots=True)
class WalEntry:
    topic: str
    partition: int
    append_ms: int
    batch: Buffer


def encode_entry(entry: WalEntry) -> list[Buffer]:
    """The entry as buffers to write in order; the batch itself is not copied."""
    topic = entry.topic.encode()
    head = struct.pack(">Hiq", len(topic), entry.partition, entry.append_ms) + topic
    crc = crc32c(entry.batch, crc32c(head))
    return [struct.pack(">II", len(head) + len(entry.batch), crc) + head, entry.batch]


def read_entries(path: Path) -> Iterator[WalEntry]:
    data = path.read_bytes()
    pos = 0
    while pos + 8 <= len(data):
        length, crc = struct.unpack_from(">II", data, pos)
        rest = data[pos + 8 : pos + 8 + length]
        if len(rest) != length or crc32c(rest) != crc:
            log.warning("WAL %s: torn entry at byte %d, replay stops there", path.name, pos)
            return
        topic_len, partition, append_ms = struct.unpack_from(">Hiq", rest, 0)
        topic = rest[14 : 14 + topic_len].decode()
        yield WalEntry(topic, partition, append_ms, rest[14 + topic_len :])
        pos += 8 + length


class WriteAheadLog:
    """Group-committing appender. ``append`` is synchronous (it fixes the order);
    ``wait_durable`` returns once that append is on disk."""

    def __init__(self, directory: Path, fsync: bool = True) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        existing = self.files()
        self._seq = (int(existing[-1].stem) + 1) if existing else 1
        self._file = self._open_new()
        self._pending: list[Buffer] = []
        self._pending_size = 0
        self._pending_callbacks: list[Callable[[], None]] = []
        self._appended = 0
        self._durable = 0
        self._durable_event = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._failed_at = 0.0  # time.monotonic() of the failure, for the recovery's log line
        # bytes of the current file that hold whole, written entries: a failed write is cut back to it
        self._good_size = os.fstat(self._file[1]).st_size

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.wal"), key=lambda p: int(p.stem))

    def _open_new(self) -> tuple[Path, int]:
        path = self.directory / f"{self._seq:020d}.wal"
        self._seq += 1
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            os.close(fd)
            raise
        self._good_size = 0
        return path, fd

    @property
    def current_file(self) -> Path:
        return self._file[0]

    def start(self) -> None:
        self._writer = asyncio.create_task(self._write_loop(), name="wal-writer")

    async def close(self) -> None:
        """Write what is queued, then stop. Entries a failed log still could not write were
        never acknowledged: they are dropped (logged), as a crash would drop them."""
        if self._writer:
            self._wakeup.set()
            try:
                await self._write_pending()
            except OSError as exc:
                log.error(
                    "WAL closed with %d unacknowledged entries it could not write: %s",
                    len(self._pending_callbacks),
                    exc,
                )
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        os.close(self._file[1])

    def append(self, entry: WalEntry, on_durable: Callable[[], None]) -> int:
        """Queue an entry; returns its sequence number for ``wait_durable``. Refused while
        the log is failed: the queue holds only what already failed, until it is written."""
        if self._failure is not None:
            raise OSError(f"write-ahead log failed: {self._failure}")
        buffers = encode_entry(entry)
        self._pending.extend(buffers)
        self._pending_size += sum(len(b) for b in buffers)
        self._pending_callbacks.append(on_durable)
        self._appended += 1
        self._wakeup.set()
        return self._appended

    @property
    def failure(self) -> BaseException | None:
        """The write error the log is failed with, if any (None again once a retry wrote
        the queued entries): meanwhile the broker refuses produces (KAFKA_STORAGE_ERROR)."""
        return self._failure

    @property
    def last_sequence(self) -> int:
        """The sequence number of the latest append: waiting for it covers all earlier ones."""
        return self._appended

    async def wait_durable(self, seq: int) -> None:
        while self._durable < seq:
            if self._failure is not None:
                raise OSError(f"write-ahead log failed: {self._failure}")
            self._durable_event.clear()
            await self._durable_event.wait()

    async def _write_loop(self) -> None:
        while True:
            if self._failure is None:
                await self._wakeup.wait()
            else:  # retry the queued entries now and then: the disk may have room again
                waiter = asyncio.ensure_future(self._wakeup.wait())
                try:
                    await asyncio.wait({waiter}, timeout=RETRY_S)
                finally:
                    waiter.cancel()
            self._wakeup.clear()
            with contextlib.suppress(OSError):  # recorded in _failure, retried
                await self._write_pending()

    async def _write_pending(self) -> None:
        async with self._write_lock:
            await self._write_locked(self._take_pending())

    def _take_pending(self) -> tuple[list[Buffer], list[Callable[[], None]]]:
        taken = (self._pending, self._pending_callbacks)
        self._pending, self._pending_callbacks, self._pending_size = [], [], 0
        return taken

    async def _write_locked(self, taken: tuple[list[Buffer], list[Callable[[], None]]]) -> None:
        """Write and fsync ``taken``; on failure put it back at the head of the queue (the
        order is the offsets' order) and fail the log, whose waiters then raise."""
        data, callbacks = taken
        if not data:
            return
        size = sum(len(b) for b in data)
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, self._write_at_good_size, self._file[1], data
            )
        except OSError as exc:
            self._pending[:0] = data
            self._pending_callbacks[:0] = callbacks
            self._pending_size += size
            if self._failure is None:
                self._failed_at = time.monotonic()
                log.error(
                    "WAL write failed, refusing produces (KAFKA_STORAGE_ERROR) and retrying "
                    "every %.0f s; nothing unwritten was acknowledged: %s",
                    RETRY_S,
                    exc,
                )
            self._failure = exc
            self._durable_event.set()
            raise
        self._good_size += size
        if self._failure is not None:
            log.warning(
                "WAL writable again after %.1f s (%d queued entries written); accepting produces",
                time.monotonic() - self._failed_at,
                len(callbacks),
            )
            self._failure = None
        for callback in callbacks:
            callback()
        self._durable += len(callbacks)
        self._durable_event.set()

    def _write_at_good_size(self, fd: int, buffers: list[Buffer]) -> None:
        """After a failure the file may end in part of an entry (a short write, or a write
        whose fsync failed): it is cut back to its last whole entry first, so what is written
        now follows it (O_APPEND) and a replay reads on past the failure. If the cut fails
        too, nothing is written (a torn entry would hide what follows it)."""
        if self._failure is not None:
            os.ftruncate(fd, self._good_size)
        try:
            self._write_sync(fd, buffers)
        except OSError:
            with contextlib.suppress(OSError):  # give the space back now; retried before a write
                os.ftruncate(fd, self._good_size)
            raise

    def _write_sync(self, fd: int, buffers: list[Buffer]) -> None:
        write_all(fd, buffers)
        if self.fsync:
            os.fdatasync(fd)

    async def roll(self, snapshot: Callable[[], T]) -> tuple[list[Path], T]:
        """Close the current file with everything appended so far made durable,
        and take ``snapshot()`` at exactly that point: what it sees is all in the
        closed files, what comes after goes to the new file."""
        async with self._write_lock:
            taken = self._take_pending()
            result = snapshot()
            await self._write_locked(taken)
            closed = [p for p in self.files() if p != self._file[0]]
            if os.fstat(self._file[1]).st_size > 0:
                old = self._file
                self._file = self._open_new()  # if this fails, the old file stays in use
                os.close(old[1])
                closed.append(old[0])
            return closed, result


def write_all(fd: int, buffers: list[Buffer]) -> None:
    """writev every buffer, resuming after partial writes (at most IOV_MAX at a time)."""
    views = [memoryview(b) for b in buffers if len(b)]
    while views:
        batch = views[:1024]
        written = os.writev(fd, batch)
        consumed = 0
        while consumed < len(batch) and written >= len(batch[consumed]):
            written -= len(batch[consumed])
            consumed += 1
        views = views[consumed:]
        if written:
            views[0] = views[0][written:]
