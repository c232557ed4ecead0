"""Cluster mode's stand-in for the WAL (issue 16): a batch is durable once a flush has put it
in a segment object AND committed its chunk to the Postgres index, where any broker that takes
the partition over finds it. There is no local file: a broker's disk holds nothing another
broker would need.

It keeps the WAL's seam (``append`` gives a sequence number, ``wait_durable`` waits for it), so
the produce path, the transaction coordinator and the internal topics wait the same way in both
modes. A sequence is *resolved* when a flush whose snapshot covered it committed (its batches
are indexed, or their partition was fenced and unloaded), or when its partition was unloaded
first; the caller then checks its partition (``LogStore.ack_error``): resolved is not acked.
Waiting asks for a flush (``wake``) unless one already took that sequence: flushes are group
commits that start as soon as someone waits and the previous one ended, with no timer in the
ack path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from broker.storage.wal import WalEntry


class IndexAcks:
    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._appended = 0
        self._taken = 0  # the highest sequence a flush snapshot took
        # unresolved sequence -> its partition, in sequence order (dicts keep insertion order)
        self._unresolved: dict[int, tuple[str, int]] = {}
        self._resolved = asyncio.Event()

    # the WAL's seam
    failure: BaseException | None = None

    @property
    def last_sequence(self) -> int:
        return self._appended

    def append(self, entry: WalEntry, on_durable: Callable[[], None] | None = None) -> int:
        """A batch accepted into ``entry``'s partition tail; its sequence number. (The flush
        advances the high watermark itself: ``on_durable`` is the WAL's and is not called.)"""
        self._appended += 1
        self._unresolved[self._appended] = (entry.topic, entry.partition)
        return self._appended

    async def wait_durable(self, seq: int) -> None:
        """Until every sequence up to ``seq`` is resolved."""
        while self._unresolved and next(iter(self._unresolved)) <= seq:
            if seq > self._taken:
                self._wake()
            self._resolved.clear()
            await self._resolved.wait()

    # the flush's side

    def take(self) -> int:
        """A flush snapshot is being taken now: everything appended so far is in it."""
        self._taken = self._appended
        return self._taken

    def indexed(self, seq: int) -> None:
        """The flush that took ``seq`` committed its index transaction."""
        while self._unresolved:
            first = next(iter(self._unresolved))
            if first > seq:
                break
            del self._unresolved[first]
        self._resolved.set()

    def dropped(self, keys: Iterable[tuple[str, int]]) -> None:
        """These partitions were unloaded: their unflushed batches will never be acked."""
        gone = set(keys)
        for seq in [s for s, key in self._unresolved.items() if key in gone]:
            del self._unresolved[seq]
        self._resolved.set()
