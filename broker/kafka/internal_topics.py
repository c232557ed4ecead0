"""Topics the broker writes itself (``_schemas``): appended through the same
log as client produces, so they are durable, replicated to the object store
and readable by any Kafka client, like the reference registry's topic.

In cluster mode only the leader of partition 0 has it in its log (and only it appends:
the registry's writer, ``broker.registry.forward``); every other broker reads the topic
from the segment index and the object store (``broker.storage.index_view``), where every
acknowledged record is, polling the index's end offset while it waits for data."""

from __future__ import annotations

import asyncio
import time

from broker.cluster import Cluster
from broker.kafka import records
from broker.storage import index_view
from broker.storage.logstore import LogStore, PartitionLog

# how often a broker that does not lead the topic asks the index for new records
INDEX_POLL_S = 0.25


class NotLeaderError(RuntimeError):
    """An append on a broker that does not lead the topic's partition (cluster mode)."""


class InternalTopic:
    def __init__(
        self, cluster: Cluster, logs: LogStore, name: str, configs: dict[str, str | None]
    ) -> None:
        self.cluster = cluster
        self.logs = logs
        self.name = name
        self.configs = configs
        # cluster mode, not the leader: the index's view, as of the last look
        self._view: PartitionLog | None = None

    async def ensure(self) -> None:
        if self.name not in self.cluster.topics:
            await self.cluster.create_topic(self.name, 1, self.configs)

    async def ensure_in_cluster(self) -> None:
        """Cluster mode, at start: the topic exists (created by whichever broker starts first;
        one that loses the race to create it takes the winner's from Postgres)."""
        if self.name in self.cluster.topics:
            return
        try:
            await self.cluster.create_topic(self.name, 1, self.configs)
        except Exception as exc:  # another broker created it first: read it
            await self.cluster.refresh()
            if self.name not in self.cluster.topics:
                raise RuntimeError(f"cannot create {self.name}: {exc}") from exc

    @property
    def clustered(self) -> bool:
        return self.cluster.config.metadata_uri is not None

    def leads(self) -> bool:
        """This broker has partition 0 in its log: it is the one that appends (cluster mode)."""
        return (self.name, 0) in self.logs.partitions

    async def partition(self) -> PartitionLog:
        await self.ensure()
        return self.logs.partitions[(self.name, 0)]

    async def _readable(self) -> PartitionLog:
        """The log to read: this broker's when it leads, else the index's view, looked up now."""
        if not self.clustered or self.leads():
            return await self.partition()
        self._view = await asyncio.to_thread(
            index_view.partition_view, self.logs.metadata, self.name, 0
        )
        return self._view

    async def append(self, key: bytes | None, value: bytes | None) -> int:
        """Append one record and wait until it is durable; returns its offset."""
        if self.clustered and self.name in self.cluster.topics and not self.leads():
            raise NotLeaderError(
                f"this broker does not lead {self.name}-0 (the leader appends; it moved away)"
            )
        batch = records.encode_batch([(key, value)], int(time.time() * 1000))
        # acknowledged: in the WAL, or (cluster mode) in a segment object and the index; a
        # ProduceError when the partition moved away before that
        return await self.logs.append_and_wait(await self.partition(), batch)

    async def refresh(self) -> None:
        """Cluster mode, not the leader: catch the view up with the index now (``end_offset``
        then tells everything acknowledged so far)."""
        if self.clustered and not self.leads() and self.name in self.cluster.topics:
            # the index's end first (one cheap query); the view is read again only if it moved
            end = await asyncio.to_thread(index_view.end_offset, self.logs.metadata, self.name, 0)
            if self._view is None or end != self._view.high_watermark:
                await self._readable()

    def end_offset(self) -> int | None:
        """The high watermark; None while the topic does not exist (nothing is created)."""
        part = self.logs.partitions.get((self.name, 0))
        if part is None and self.clustered:
            part = self._view
        if part is None or self.name not in self.cluster.topics:
            return None
        return part.high_watermark

    async def wait_for_data(self, timeout: float) -> None:  # noqa: ASYNC109 (a poll deadline)
        """Return when any partition of the broker gets records, or after ``timeout``. Cluster
        mode, not the leader: after ``INDEX_POLL_S`` at most, with the index's end looked up
        (and the view read again when it moved), so ``end_offset`` tells what is new."""
        if not self.clustered or self.leads():
            await self.logs.wait_for_data(timeout)
            return
        await self.logs.wait_for_data(min(timeout, INDEX_POLL_S))
        if self.name not in self.cluster.topics or self.leads():
            return
        end = await asyncio.to_thread(index_view.end_offset, self.logs.metadata, self.name, 0)
        if self._view is None or end != self._view.high_watermark:
            await self._readable()

    async def read_from(self, offset: int) -> tuple[list[records.Record], int]:
        """Every record from ``offset`` (or the log start, if later) to the high watermark,
        in order, and the offset to read from next."""
        part = await self._readable()
        out: list[records.Record] = []
        offset = max(offset, part.log_start_offset)
        while offset < part.high_watermark:
            data = await self.logs.read(part, offset, 4 * 1024 * 1024)
            if not data:
                break
            start = len(out)
            for _, batch in records.iter_batches(data):
                _, decoded = records.decode_batch(batch)
                out.extend(r for r in decoded if r.offset >= offset)
            offset = out[-1].offset + 1 if len(out) > start else part.high_watermark
        return out, offset

    async def read_all(self) -> list[records.Record]:
        """Every record from the log start to the high watermark, in order."""
        return (await self.read_from(0))[0]
