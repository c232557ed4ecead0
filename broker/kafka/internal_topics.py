"""Topics the broker writes itself (``_schemas``): appended through the same
log as client produces, so they are durable, replicated to the object store
and readable by any Kafka client, like the reference registry's topic."""

from __future__ import annotations

import time

from broker.cluster import Cluster
from broker.kafka import records
from broker.storage.logstore import LogStore, PartitionLog


class InternalTopic:
    def __init__(
        self, cluster: Cluster, logs: LogStore, name: str, configs: dict[str, str | None]
    ) -> None:
        self.cluster = cluster
        self.logs = logs
        self.name = name
        self.configs = configs

    async def ensure(self) -> None:
        if self.name not in self.cluster.topics:
            await self.cluster.create_topic(self.name, 1, self.configs)

    async def partition(self) -> PartitionLog:
        await self.ensure()
        return self.logs.partitions[(self.name, 0)]

    async def append(self, key: bytes | None, value: bytes | None) -> int:
        """Append one record and wait until it is durable; returns its offset."""
        batch = records.encode_batch([(key, value)], int(time.time() * 1000))
        base, seq = await self.logs.append(await self.partition(), batch, 2**31 - 1)
        await self.logs.wal.wait_durable(seq)
        return base

    def end_offset(self) -> int | None:
        """The high watermark; None while the topic does not exist (nothing is created)."""
        part = self.logs.partitions.get((self.name, 0))
        if part is None or self.name not in self.cluster.topics:
            return None
        return part.high_watermark

    async def wait_for_data(self, timeout: float) -> None:  # noqa: ASYNC109 (a poll deadline)
        """Return when any partition of the broker gets records, or after ``timeout``."""
        await self.logs.wait_for_data(timeout)

    async def read_from(self, offset: int) -> tuple[list[records.Record], int]:
        """Every record from ``offset`` (or the log start, if later) to the high watermark,
        in order, and the offset to read from next."""
        part = await self.partition()
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
