"""Brokers of one cluster at the log store, in-process (no Kafka protocol, no broker process):
each its own metadata store on one Postgres database and its own log store over one shared
object store, as ``test_leases.py`` and ``test_compaction.py`` drive them. Several brokers
in one event loop make a race (a lease moved between a write and its commit, a flush fenced)
a sequence of awaits the test orders."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from broker.checkpoint import Checkpoint
from broker.config import BrokerConfig
from broker.storage.leases import Leases
from broker.storage.logstore import LogStore, PartitionLog
from broker.storage.metadata import MetadataStore
from broker.storage.objectstore import ObjectStore


@asynccontextmanager
async def log_stores(
    uri: str, objects: ObjectStore, *configs: BrokerConfig
) -> AsyncIterator[list[tuple[MetadataStore, LogStore]]]:
    """Per config, in order, a broker (node ids 1, 2, ...): its metadata store on the database
    at ``uri`` and its log store over ``objects``, opened (cluster mode: nothing to load until
    a partition comes with its lease). Every log store is closed after, then every metadata
    store."""
    metas = [MetadataStore(uri) for _ in configs]
    stores = [
        LogStore(config, meta, objects, node_id=node_id)
        for node_id, (config, meta) in enumerate(zip(configs, metas, strict=True), start=1)
    ]
    try:
        for logs in stores:
            await logs.open({})
        yield list(zip(metas, stores, strict=True))
    finally:
        for logs in stores:
            await logs.close()
        for meta in metas:
            meta.close()


async def lead(
    logs: LogStore, leases: Leases, partitions: Iterable[tuple[str, int]]
) -> list[PartitionLog]:
    """The ``partitions`` loaded into ``logs`` under the leases ``leases`` takes now (epoch 0
    where another broker holds one: its first flush is fenced), and the broker's lease deadline
    ten minutes ahead (no lapse unless the test makes one)."""
    parts = [await logs.load_partition(t, p, leases.acquire(t, p) or 0) for t, p in partitions]
    logs.set_lease_deadline(time.monotonic() + 600)
    return parts


def no_tables(namespace: str, table: str) -> Checkpoint:
    """Retention's checkpoint reader where no topic is a table topic."""
    raise AssertionError("no table topics here")
