"""Topics and their configs: the state CreateTopics, DeleteTopics and the
config APIs change, kept in SQLite and mirrored into the table-topic manifest."""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from broker import manifest, topic_configs
from broker.config import BrokerConfig
from broker.storage.logstore import LogStore
from broker.storage.metadata import MetadataStore, TopicRecord

log = logging.getLogger(__name__)

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
        self.topics: dict[str, Topic] = {
            t.name: Topic(t.name, t.topic_id, t.partitions, t.configs) for t in metadata.topics()
        }
        self.topics_by_id = {t.topic_id: t for t in self.topics.values()}

    def write_manifest(self) -> None:
        records = [
            TopicRecord(t.name, t.topic_id, t.partitions, t.configs) for t in self.topics.values()
        ]
        manifest.write_atomically(
            self.config.manifest_path, manifest.render(records, self.config.admin_url)
        )

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

    def create_topic(self, name: str, partitions: int, configs: dict[str, str | None]) -> Topic:
        valid = self.validate_new_topic(name, partitions, configs)
        if partitions == -1:
            partitions = self.config.default_partitions
        record = self.metadata.create_topic(name, partitions, valid)
        topic = Topic(record.name, record.topic_id, record.partitions, dict(record.configs))
        self.topics[name] = topic
        self.topics_by_id[topic.topic_id] = topic
        for p in range(partitions):
            self.logs.add_partition(name, p)
        self.write_manifest()
        log.info("created topic %s with %d partitions", name, partitions)
        return topic

    def delete_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(
                ErrorCode.unknown_topic_or_partition, f"Topic '{name}' does not exist."
            )
        self.logs.drop_topic(name)
        unreferenced = self.metadata.delete_topic(name)
        for key in unreferenced:
            try:
                self.logs.store.delete(key)
            except Exception as exc:  # an orphan object costs space, not correctness  # noqa: BLE001
                log.warning("could not delete segment object %s: %s", key, exc)
        del self.topics[name]
        self.topics_by_id.pop(topic.topic_id, None)
        self.write_manifest()
        log.info("deleted topic %s", name)
        return topic

    def add_partitions(self, name: str, count: int, validate_only: bool) -> None:
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
            raise TopicError(ErrorCode.invalid_partitions, f"At most {MAX_PARTITIONS} partitions")
        if validate_only:
            return
        self.metadata.add_partitions(name, count)
        for p in range(topic.partitions, count):
            self.logs.add_partition(name, p)
        topic.partitions = count
        self.write_manifest()

    def set_configs(self, name: str, configs: dict[str, str], validate_only: bool) -> None:
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
        self.metadata.set_configs(name, valid)
        topic.configs = valid
        self.write_manifest()
