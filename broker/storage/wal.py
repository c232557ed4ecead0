"""The local write-ahead log: every accepted batch is appended here and
fsync'd (group commit) before the producer is acknowledged.

Files roll when the log store flushes a segment: every entry of a closed file
is then in the object store, so the file can be deleted once the segment
index commits. Entries carry a CRC; replay stops at the first torn entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from crc32c import crc32c

from broker.kafka.records import Buffer

log = logging.getLogger(__name__)
T = TypeVar("T")

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

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.wal"), key=lambda p: int(p.stem))

    def _open_new(self) -> tuple[Path, int]:
        path = self.directory / f"{self._seq:020d}.wal"
        self._seq += 1
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return path, fd

    @property
    def current_file(self) -> Path:
        return self._file[0]

    def start(self) -> None:
        self._writer = asyncio.create_task(self._write_loop(), name="wal-writer")

    async def close(self) -> None:
        if self._writer:
            self._wakeup.set()
            await self.wait_durable(self._appended)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        os.close(self._file[1])

    def append(self, entry: WalEntry, on_durable: Callable[[], None]) -> int:
        """Queue an entry; returns its sequence number for ``wait_durable``."""
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
        """The write error that stopped this log, if any: nothing appended after it can
        be made durable, so the broker refuses produces until it is restarted."""
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
            await self._wakeup.wait()
            self._wakeup.clear()
            await self._write_pending()

    async def _write_pending(self) -> None:
        async with self._write_lock:
            await self._write_locked(self._take_pending())

    def _take_pending(self) -> tuple[list[Buffer], list[Callable[[], None]]]:
        taken = (self._pending, self._pending_callbacks)
        self._pending, self._pending_callbacks, self._pending_size = [], [], 0
        return taken

    async def _write_locked(self, taken: tuple[list[Buffer], list[Callable[[], None]]]) -> None:
        data, callbacks = taken
        if not data:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, self._write_sync, self._file[1], data
            )
        except OSError as exc:
            log.error("WAL write failed: %s", exc)
            self._failure = exc
            self._durable_event.set()
            raise
        for callback in callbacks:
            callback()
        self._durable += len(callbacks)
        self._durable_event.set()

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
