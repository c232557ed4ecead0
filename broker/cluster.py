"""Topics and their configs: the state CreateTopics, DeleteTopics and the
config APIs change, kept in SQLite and mirrored into the table-topic manifest.

The changes are coroutines: the metadata store (SQLite or Postgres) is called in a
thread so that a slow database does not stall the event loop, and one lock makes each
change (check, write, in-memory update) atomic against the others, as it was when they
ran without an await. Deleting a topic also holds the log store's index lock, so a
segment flush never indexes chunks of a topic being deleted (see LogStore.flush).

A change the metadata store cannot write (a full disk) is refused with the retriable
KAFKA_STORAGE_ERROR before anything changes in memory. A change it did write stands even
when the manifest cannot be rewritten after it: the manifest is rewritten every
``MANIFEST_RETRY_S`` until it can be (one log line when it fails, one when it is current)."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kio.schema.errors import ErrorCode

from broker import broker_configs, manifest, topic_configs
from broker.config import BrokerConfig
from broker.storage.failures import is_storage_failure
from broker.storage.logstore import LogStore
from broker.storage.metadata import Chunk, MetadataStore, TopicRecord

log = logging.getLogger(__name__)
MANIFEST_RETRY_S = 1.0
T = TypeVar("T")

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
MAX_PARTITIONS = 10_000


class TopicError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    created_ms: int = 0  # the metadata store's creation time (the maintenance DAG's start)

    @classmethod
    def from_record(cls, record: TopicRecord) -> Topic:
        return cls(
            record.name, record.topic_id, record.partitions, dict(record.configs), record.created_ms
        )

    def record(self) -> TopicRecord:
        return TopicRecord(self.name, self.topic_id, self.partitions, self.configs, self.created_ms)

    @property
    def is_internal(self) -> bool:
        return self.name.startswith("__") or self.name == "_schemas"

    def config(self, key: str) -> str:
        value = self.configs.get(key, topic_configs.KEYS[key].default)
        assert value is not None
        return value

    @property
    def max_message_bytes(self) -> int:
        return int(self.config("max.message.bytes"))


class Cluster:
    def __init__(self, config: BrokerConfig, metadata: MetadataStore, logs: LogStore) -> None:
        self.config = config
        self.metadata = metadata
        self.logs = logs
        self.topics: dict[str, Topic] = {t.name: Topic.from_record(t) for t in metadata.topics()}
        self.topics_by_id = {t.topic_id: t for t in self.topics.values()}
        self.broker_configs = metadata.broker_configs()
        self._changes = asyncio.Lock()
        # Cluster mode: a broker's log store holds only the partitions it leads, which the
        # membership loop (broker/membership.py) loads; a change here wakes it (``changed``).
        self.clustered = config.clustered
        self.changed: Callable[[], None] = lambda: None
        self.manifest_failure: BaseException | None = None  # why the manifest is stale
        self._manifest_retry: asyncio.TimerHandle | None = None

    def write_manifest(self) -> None:
        """Rewrite the manifest from the topics in memory. Storage that cannot write leaves
        the old one (written atomically) and a retry; the change it follows stands."""
        records = [t.record() for t in self.topics.values()]
        try:
            manifest.write_if_changed(
                self.config.manifest_path, manifest.render(records, self.config.admin_url)
            )
        except Exception as exc:
            if not is_storage_failure(exc):
                raise
            if self.manifest_failure is None:
                log.error(
                    "the table-topic manifest %s cannot be written, retrying every %.0f s "
                    "(Airflow sees the previous one meanwhile): %s",
                    self.config.manifest_path,
                    MANIFEST_RETRY_S,
                    exc,
                )
            self.manifest_failure = exc
            if self._manifest_retry is None:
                self._manifest_retry = asyncio.get_running_loop().call_later(
                    MANIFEST_RETRY_S, self._retry_manifest
                )
            return
        if self.manifest_failure is not None:
            log.warning("the table-topic manifest %s is current again", self.config.manifest_path)
            self.manifest_failure = None

    def _retry_manifest(self) -> None:
        self._manifest_retry = None
        if self.manifest_failure is not None:
            self.write_manifest()

    async def _write_metadata(self, call: Callable[..., T], *args: object) -> T:
        """``call(*args)`` on the metadata store, in a thread; storage that cannot write
        refuses the change with KAFKA_STORAGE_ERROR (nothing in memory has changed yet)."""
        try:
            return await asyncio.to_thread(call, *args)
        except Exception as exc:
            if is_storage_failure(exc):
                raise TopicError(
                    ErrorCode.kafka_storage_error, f"the metadata store cannot write: {exc}"
                ) from exc
            raise

    def validate_new_topic(
        self, name: str, partitions: int, configs: dict[str, str | None]
    ) -> dict[str, str]:
        if not _TOPIC_NAME.match(name) or name in (".", ".."):
            raise TopicError(
                ErrorCode.invalid_topic_exception,
                f"Topic name {name!r} is illegal: use up to 249 of [A-Za-z0-9._-]",
            )
        if name in self.topics:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        if partitions == -1:
            partitions = self.config.default_partitions
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise TopicError(
                ErrorCode.invalid_partitions,
                f"Number of partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}",
            )
        try:
            return topic_configs.validate_all(configs)
        except topic_configs.InvalidConfigError as exc:
            raise TopicError(ErrorCode.invalid_config, str(exc)) from None

    async def create_topic(
        self, name: str, partitions: int, configs: dict[str, str | None]
    ) -> Topic:
        async with self._changes:
            valid = self.validate_new_topic(name, partitions, configs)
            if partitions == -1:
                partitions = self.config.default_partitions
            record = await self._write_metadata(self.metadata.create_topic, name, partitions, valid)
            chunks = await asyncio.to_thread(self._stored_chunks, name, range(partitions))
            topic = Topic.from_record(record)
            if not self.clustered:
                for p in range(partitions):
                    self.logs.add_partition(name, p, chunks=chunks[p])
            self.topics[name] = topic
            self.topics_by_id[topic.topic_id] = topic
            self.write_manifest()
            log.info("created topic %s with %d partitions", name, partitions)
            self.changed()
            return topic

    async def delete_topic(self, name: str) -> Topic:
        async with self._changes:
            topic = self.topics.get(name)
            if topic is None:
                raise TopicError(
                    ErrorCode.unknown_topic_or_partition, f"Topic '{name}' does not exist."
                )
            # The database first (after a flush's index write, if one is running): a write
            # the disk refuses leaves the topic as it was, in memory and stored alike. Then
            # gone for clients with no await between: no request finds the topic while its
            # partitions are dropped.
            async with self.logs.index_lock:
                unreferenced = await asyncio.to_thread(self.metadata.delete_topic, name)
                del self.topics[name]
                self.topics_by_id.pop(topic.topic_id, None)
                self.logs.drop_topic(name)
            self.write_manifest()
            await asyncio.to_thread(self._delete_objects, unreferenced)
            log.info("deleted topic %s", name)
            return topic

    async def add_partitions(self, name: str, count: int, validate_only: bool) -> None:
        async with self._changes:
            topic = self.topics.get(name)
            if topic is None:
                raise TopicError(
                    ErrorCode.unknown_topic_or_partition, f"Topic '{name}' does not exist."
                )
            if count <= topic.partitions:
                raise TopicError(
                    ErrorCode.invalid_partitions,
                    f"Topic currently has {topic.partitions} partitions, {count} is not an increase.",
                )
            if count > MAX_PARTITIONS:
                raise TopicError(
                    ErrorCode.invalid_partitions, f"At most {MAX_PARTITIONS} partitions"
                )
            if validate_only:
                return
            await self._write_metadata(self.metadata.add_partitions, name, count)
            added = range(topic.partitions, count)
            if not self.clustered:
                chunks = await asyncio.to_thread(self._stored_chunks, name, added)
                for p in added:
                    self.logs.add_partition(name, p, chunks=chunks[p])
            topic.partitions = count
            self.write_manifest()
            self.changed()

    async def set_configs(self, name: str, configs: dict[str, str], validate_only: bool) -> None:
        async with self._changes:
            topic = self.topics.get(name)
            if topic is None:
                raise TopicError(
                    ErrorCode.unknown_topic_or_partition, f"Topic '{name}' does not exist."
                )
            try:
                valid = topic_configs.validate_all(dict(configs))
            except topic_configs.InvalidConfigError as exc:
                raise TopicError(ErrorCode.invalid_config, str(exc)) from None
            if validate_only:
                return
            await self._write_metadata(self.metadata.set_configs, name, valid)
            topic.configs = valid
            self.write_manifest()

    async def set_broker_configs(
        self, scope: str, configs: dict[str, str | None], validate_only: bool
    ) -> None:
        """The dynamic broker configs of ``scope`` (``""``: the cluster default, else a node id)
        replaced by ``configs`` (None values dropped)."""
        async with self._changes:
            try:
                valid = broker_configs.validate_all(configs)
            except topic_configs.InvalidConfigError as exc:
                raise TopicError(ErrorCode.invalid_config, str(exc)) from None
            if validate_only:
                return
            await self._write_metadata(self.metadata.set_broker_configs, scope, valid)
            self.broker_configs[scope] = valid

    async def refresh(self) -> None:
        """Cluster mode: take what other brokers changed (topics, their configs and partition
        counts, broker configs) from Postgres. A topic deleted elsewhere is dropped here too
        (the membership loop then releases its leases)."""
        async with self._changes:
            records = await asyncio.to_thread(self.metadata.topics)
            configs = await asyncio.to_thread(self.metadata.broker_configs)
            stored = {r.name: r for r in records}
            for name in [n for n in self.topics if n not in stored]:
                gone = self.topics.pop(name)
                self.topics_by_id.pop(gone.topic_id, None)
                async with self.logs.index_lock:
                    self.logs.drop_topic(name)
                log.info("topic %s was deleted by another broker", name)
            for name, r in stored.items():
                topic = self.topics.get(name)
                if topic is None or topic.topic_id != r.topic_id:
                    if topic is not None:  # deleted and created again elsewhere
                        self.topics_by_id.pop(topic.topic_id, None)
                        async with self.logs.index_lock:
                            self.logs.drop_topic(name)
                    topic = Topic.from_record(r)
                    self.topics[name] = topic
                    self.topics_by_id[topic.topic_id] = topic
                    log.info("topic %s was created by another broker", name)
                topic.partitions = r.partitions
                topic.configs = dict(r.configs)
            self.broker_configs = configs
            self.write_manifest()

    def _stored_chunks(self, name: str, partitions: range) -> dict[int, list[Chunk]]:
        """The index's chunks of new partitions (blocking: called in a thread)."""
        return {p: self.metadata.chunks(name, p) for p in partitions}

    def _delete_objects(self, keys: list[str]) -> None:
        """Delete segment objects no chunk refers to (blocking: called in a thread)."""
        for key in keys:
            try:
                self.logs.store.delete(key)
            except Exception as exc:  # an orphan object costs space, not correctness  # noqa: BLE001
                log.warning("could not delete segment object %s: %s", key, exc)
