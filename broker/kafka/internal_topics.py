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

    async def read_all(self) -> list[records.Record]:
        """Every record from the log start to the high watermark, in order."""
        part = await self.partition()
        out: list[records.Record] = []
        offset = part.log_start_offset
        while offset < part.high_watermark:
            data = await self.logs.read(part, offset, 4 * 1024 * 1024)
            if not data:
                break
            for _, batch in records.iter_batches(data):
                _, decoded = records.decode_batch(batch)
                out.extend(r for r in decoded if r.offset >= offset)
            offset = out[-1].offset + 1 if out else part.high_watermark
        return out
