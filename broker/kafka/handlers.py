"""Handlers for every Kafka API the broker serves, written once for all versions.

A handler gets the parsed request and a ``Responder`` for its version and
returns the response, ``None`` (acks=0 produce), or an awaitable of the
response (a produce waiting for the WAL's fsync), so the connection can read
the next request meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from broker import broker_configs, topic_configs
from broker.cluster import Cluster, TopicError
from broker.config import LISTENER_PREFIX, SECRET_FIELDS, BrokerConfig, property_key
from broker.gate import DataQualityGate, GateRejection, gate_applies
from broker.kafka import records
from broker.kafka.acl_apis import (
    DENIED_CODE,
    AclApis,
    client_ip,
    denied_message,
    open_authorizer,
)
from broker.kafka.authorizer import CLUSTER_NAME, Operation, ResourceType
from broker.kafka.codec import Responder, Spliced, field, ms
from broker.kafka.consumer_groups import ConsumerGroupApis, ConsumerGroupCoordinator
from broker.kafka.groups import GroupCoordinator
from broker.kafka.replica_apis import ReplicaApis
from broker.kafka.routing import route
from broker.kafka.security_apis import SecurityApis
from broker.kafka.transactions import TransactionCoordinator
from broker.kafka.txn_apis import TransactionApis, fenced_for
from broker.ownership import KEY_GROUP, KEY_TRANSACTION, Ownership, local_member
from broker.repeated_log import RepeatedLog
from broker.security.listeners import Listener
from broker.storage.failures import StorageFailureLog, is_storage_failure
from broker.storage.logstore import LogStore, PartitionLog, ProduceError
from broker.storage.metadata import CoordinatorFencedError, MetadataStore

log = logging.getLogger(__name__)


RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
CONFIG_TYPE_PASSWORD = 9  # DescribeConfigs' ConfigType of a secret
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)

# The versions served: kio's range, capped where a newer version switches to
# topic ids in place of names or needs transactions.
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    0: (3, 12),  # Produce
    1: (4, 12),  # Fetch
    2: (0, 10),  # ListOffsets (v0: broker/kafka/legacy_schemas.py; Kafka 4 dropped it)
    3: (0, 12),  # Metadata
    8: (2, 9),  # OffsetCommit
    9: (1, 9),  # OffsetFetch
    10: (0, 6),  # FindCoordinator
    11: (0, 9),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 6),  # DescribeGroups
    16: (0, 5),  # ListGroups
    17: (
        1,
        1,
    ),  # SaslHandshake (v0, raw tokens without SaslAuthenticate: dropped in Kafka 4, KIP-896)
    18: (0, 4),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 5),  # InitProducerId
    23: (2, 4),  # OffsetForLeaderEpoch
    24: (0, 4),  # AddPartitionsToTxn (v4+ batched, as brokers send it)
    25: (0, 3),  # AddOffsetsToTxn
    26: (0, 3),  # EndTxn (v5 needs transaction.version 2, KIP-890)
    27: (1, 1),  # WriteTxnMarkers (cluster mode: from the transaction's coordinator)
    28: (0, 3),  # TxnOffsetCommit
    29: (1, 3),  # DescribeAcls (v0 removed in Kafka 4, KIP-896)
    30: (1, 3),  # CreateAcls
    31: (1, 3),  # DeleteAcls
    32: (1, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs
    35: (1, 4),  # DescribeLogDirs (v0 removed in Kafka 4, KIP-896)
    36: (0, 2),  # SaslAuthenticate
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    43: (0, 2),  # ElectLeaders
    44: (0, 1),  # IncrementalAlterConfigs
    45: (0, 0),  # AlterPartitionReassignments
    46: (0, 0),  # ListPartitionReassignments
    47: (0, 0),  # OffsetDelete
    50: (0, 0),  # DescribeUserScramCredentials
    51: (0, 0),  # AlterUserScramCredentials
    60: (0, 1),  # DescribeCluster
    65: (0, 0),  # DescribeTransactions
    66: (0, 1),  # ListTransactions
    68: (0, 1),  # ConsumerGroupHeartbeat (KIP-848)
    69: (0, 1),  # ConsumerGroupDescribe (KIP-848)
}

# What ApiVersions lists. As Apache Kafka 4 does (KAFKA-18659), Produce is listed
# from v0 though only v3+ is served (an older request still closes the connection):
# librdkafka before the fix of its issue #4956 (2.0.2 in Debian's kcat, say)
# compresses with gzip, snappy or lz4 only if the broker lists Produce v0, and
# otherwise sends every batch uncompressed without a word.
#
# SaslHandshake likewise from v0 (only v1 is served): librdkafka 2.0.2 refuses SCRAM ("SASL
# Handshake not supported by broker") unless the range it asks for, 0..1, starts where ours does.
ADVERTISED_VERSIONS: dict[int, tuple[int, int]] = {
    **SUPPORTED_VERSIONS,
    0: (0, SUPPORTED_VERSIONS[0][1]),
    17: (0, SUPPORTED_VERSIONS[17][1]),
}


# A few broker-level configs, so DescribeConfigs(BROKER) answers admin tools.
def _broker_configs(config: BrokerConfig) -> dict[str, str]:
    return {
        "broker.id": str(config.node_id),
        "node.id": str(config.node_id),
        "auto.create.topics.enable": str(config.auto_create_topics).lower(),
        "num.partitions": str(config.default_partitions),
        "message.max.bytes": "1048588",
        "socket.request.max.bytes": str(config.max_request_bytes),
        "log.retention.ms": "604800000",
        "default.replication.factor": "1",
        "offsets.topic.replication.factor": "1",
        "listeners": ",".join(str(x) for x in config.listener_list()),
        "advertised.listeners": ",".join(
            f"{x.name}://{x.advertised_host}:{x.advertised_port}" for x in config.listener_list()
        ),
        "listener.security.protocol.map": ",".join(
            f"{x.name}:{x.protocol}" for x in config.listener_list()
        ),
        "sasl.enabled.mechanisms": config.sasl_enabled_mechanisms,
        "ssl.client.auth": config.ssl_client_auth,
        "connections.max.reauth.ms": str(config.connections_max_reauth_ms),
        "process.roles": "broker,controller",
        "authorizer.class.name": config.authorizer_class_name,
        "allow.everyone.if.no.acl.found": str(config.allow_everyone_if_no_acl_found).lower(),
        "super.users": config.super_users,
        "log.dirs": str(config.wal_dir),
        "icefall.segment.flush.ms": str(config.segment_flush_ms),
        "icefall.segment.flush.bytes": str(config.segment_flush_bytes),
        "icefall.object.store": config.store.url,
    }


class CloseConnection(Exception):
    """Close the client's connection instead of answering (how Kafka tells an
    acks=0 producer that its produce failed)."""


@dataclass
class ConnectionContext:
    client_id: str
    client_host: str
    # Who the client is: User:ANONYMOUS until TLS (a client certificate) or SASL says otherwise.
    principal: str = "User:ANONYMOUS"
    # The listener the connection came in on: Metadata answers with its advertised address.
    listener: str = "PLAINTEXT"
    sasl: Any = None  # broker.security.sasl.SaslSession on SASL listeners


Handler = Callable[[ConnectionContext, Any, Responder], Awaitable[Any]]


class KafkaHandlers(TransactionApis, ReplicaApis, ConsumerGroupApis, SecurityApis, AclApis):
    def __init__(
        self,
        config: BrokerConfig,
        cluster: Cluster,
        logs: LogStore,
        groups: GroupCoordinator,
        transactions: TransactionCoordinator,
        consumer_groups: ConsumerGroupCoordinator | None = None,
        ownership: Ownership | None = None,
    ) -> None:
        self.config = config
        # who leads what (cluster mode: refreshed by broker/membership.py every heartbeat)
        self.ownership = ownership or Ownership(local_member(config))
        self.cluster = cluster
        self.logs = logs
        self.groups = groups
        self.transactions = transactions
        self.consumer_groups = consumer_groups or ConsumerGroupCoordinator(cluster, groups)
        self.gate: DataQualityGate | None = None  # set once the schema registry is up
        self.authorizer = open_authorizer(config, cluster.metadata)
        self.storage_failures = StorageFailureLog(log)  # a full disk: a line a minute
        # refused produces: a line a partition and reason every 10 s, with the count
        self.refusals = RepeatedLog(log)
        self.by_key: dict[int, Handler] = {
            0: self.produce,
            1: self.fetch,
            2: self.list_offsets,
            3: self.metadata,
            8: self.offset_commit,
            9: self.offset_fetch,
            10: self.find_coordinator,
            11: self.join_group,
            12: self.heartbeat,
            13: self.leave_group,
            14: self.sync_group,
            15: self.describe_groups,
            16: self.list_groups,
            17: self.sasl_handshake,
            18: self.api_versions,
            19: self.create_topics,
            20: self.delete_topics,
            22: self.init_producer_id,
            23: self.offset_for_leader_epoch,
            24: self.add_partitions_to_txn,
            25: self.add_offsets_to_txn,
            26: self.end_txn,
            27: self.write_txn_markers,
            28: self.txn_offset_commit,
            29: self.describe_acls,
            30: self.create_acls,
            31: self.delete_acls,
            32: self.describe_configs,
            33: self.alter_configs,
            37: self.create_partitions,
            42: self.delete_groups,
            21: self.delete_records,
            47: self.offset_delete,
            35: self.describe_log_dirs,
            36: self.sasl_authenticate,
            50: self.describe_user_scram_credentials,
            51: self.alter_user_scram_credentials,
            43: self.elect_leaders,
            45: self.alter_partition_reassignments,
            46: self.list_partition_reassignments,
            44: self.incremental_alter_configs,
            60: self.describe_cluster,
            65: self.describe_transactions,
            66: self.list_transactions,
            68: self.consumer_group_heartbeat,
            69: self.consumer_group_describe,
        }
        # the one place requests refused as a whole are refused (acl_apis.REQUEST_CHECKS)
        self.by_key = {key: self.guarded(key, handler) for key, handler in self.by_key.items()}
        # cluster mode: group and transaction APIs only at the key's coordinator (routing.py)
        self.by_key = {
            key: route(self.ownership, key, handler) for key, handler in self.by_key.items()
        }

        self.listeners: dict[str, Listener] = {x.name: x for x in config.listener_list()}

    def reload_acls(self) -> None:
        """Cluster mode: the ACLs again from Postgres (another broker changed them)."""
        if self.authorizer is not None:
            self.authorizer = open_authorizer(self.config, self.cluster.metadata)

    def _metadata_store(self) -> MetadataStore:
        return self.cluster.metadata

    def _broker(self, ctx: ConnectionContext) -> dict[str, Any]:
        """This broker as the client's listener advertises it (as Kafka answers Metadata)."""
        listener = self.listeners.get(ctx.listener) or next(iter(self.listeners.values()))
        return {
            "node_id": self.config.node_id,
            "broker_id": self.config.node_id,
            "host": listener.advertised_host,
            "port": listener.advertised_port,
            "rack": self.config.broker_rack,
        }

    def _brokers(self, ctx: ConnectionContext) -> list[dict[str, Any]]:
        """Every broker Metadata lists (``Ownership.in_metadata``: the live ones and the lately
        stalled) on the listener the request came in on (a broker without that listener is
        left out, as Kafka leaves out brokers without the listener's name)."""
        listener = self._broker(ctx)
        found = [listener]
        for member in self.ownership.in_metadata():
            if member.node_id == self.config.node_id:
                continue
            address = member.address(ctx.listener)
            if address is not None:
                found.append(
                    {
                        "node_id": member.node_id,
                        "broker_id": member.node_id,
                        "host": address[0],
                        "port": address[1],
                        "rack": member.rack,
                    }
                )
        return sorted(found, key=lambda b: int(b["node_id"]))

    def _partition(self, topic: str, partition: int) -> Any:
        return self.logs.partitions.get((topic, partition))

    def _exists(self, topic: str, partition: int) -> bool:
        """The partition exists (led here or, in cluster mode, by any broker)."""
        if (topic, partition) in self.logs.partitions:
            return True
        known = self.cluster.topics.get(topic)
        return self.ownership.clustered and known is not None and 0 <= partition < known.partitions

    def _absent(self, topic: str, partition: int) -> int:
        """Why a partition is not in this broker's logs: another broker leads it (cluster mode:
        NOT_LEADER_OR_FOLLOWER, the client asks Metadata again), or it does not exist."""
        known = self.cluster.topics.get(topic)
        if self.ownership.clustered and known is not None and 0 <= partition < known.partitions:
            return ErrorCode.not_leader_or_follower
        return ErrorCode.unknown_topic_or_partition

    def _leader_hint(self, topic: str, partition: int) -> dict[str, int]:
        """Produce v10+ / Fetch v12+'s ``current_leader`` (KIP-951): the leader as last read."""
        found = self.ownership.leader(topic, partition)
        return {"leader_id": found[0] if found else -1, "leader_epoch": found[1] if found else -1}

    # ------------------------------------------------------------ versions / cluster

    async def api_versions(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        return api_versions_response(R, ErrorCode.none)

    async def describe_cluster(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        """Served to anyone, as Kafka; the authorized operations only to who may DESCRIBE the
        cluster (0 to others)."""
        return R(
            error_code=ErrorCode.none,
            error_message=None,
            endpoint_type=1,
            cluster_id=self.config.cluster_id,
            controller_id=self.ownership.controller_id,
            brokers=self._brokers(ctx),
            cluster_authorized_operations=self._cluster_operations(
                ctx, field(req, "include_cluster_authorized_operations", False)
            ),
        )

    def _cluster_operations(self, ctx: ConnectionContext, requested: bool) -> int:
        if not requested:
            return AUTHORIZED_OPERATIONS_OMITTED
        if not self.allowed(ctx, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return 0
        return self.authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)

    async def metadata(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        """As Kafka: all topics lists those the principal may DESCRIBE; a topic named and not
        describable is TOPIC_AUTHORIZATION_FAILED; auto-creating one needs CREATE on the cluster
        or on the topic."""
        requested = field(req, "topics")
        if R.version == 0 and requested == ():
            requested = None
        names: list[tuple[str | None, Any]]
        if requested is None:
            names = [
                (name, None)
                for name in sorted(self.cluster.topics)
                if self.topic_allowed(ctx, R, name)
            ]
        else:
            names = []
            for t in requested:
                name = field(t, "name")
                topic_id = field(t, "topic_id")
                if name is None and topic_id is not None:
                    found = self.cluster.topics_by_id.get(topic_id)
                    name = found.name if found else None
                names.append((name, topic_id))
        auto_create = (
            field(req, "allow_auto_topic_creation", True) and self.config.auto_create_topics
        )
        topics = []
        may_create_any = auto_create and self.allowed(
            ctx, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME
        )
        with_operations = field(req, "include_topic_authorized_operations", False)
        for name, topic_id in names:
            if requested is not None and name and not self.topic_allowed(ctx, R, name):
                topics.append(
                    self._metadata_error(name, topic_id, ErrorCode.topic_authorization_failed)
                )
                continue
            topic = self.cluster.topics.get(name) if name else None
            if (
                topic is None
                and name
                and auto_create
                and not may_create_any
                and not self.allowed(ctx, Operation.CREATE, ResourceType.TOPIC, name)
            ):
                topics.append(
                    self._metadata_error(name, topic_id, ErrorCode.topic_authorization_failed)
                )
                continue
            if topic is None and name and auto_create:
                try:
                    topic = await self.cluster.create_topic(name, -1, {})
                except TopicError as exc:
                    # Another request may have created it while this one waited.
                    topic = self.cluster.topics.get(name)
                    if topic is None:
                        topics.append(self._metadata_error(name, topic_id, exc.code))
                        continue
            if topic is None:
                topics.append(
                    self._metadata_error(name, topic_id, ErrorCode.unknown_topic_or_partition)
                )
                continue
            topics.append(
                {
                    "error_code": ErrorCode.none,
                    "name": topic.name,
                    "topic_id": topic.topic_id,
                    "is_internal": topic.is_internal,
                    "partitions": [
                        self._metadata_partition(topic.name, p) for p in range(topic.partitions)
                    ],
                    "topic_authorized_operations": self.authorized_operations(
                        ctx, ResourceType.TOPIC, topic.name
                    )
                    if with_operations
                    else AUTHORIZED_OPERATIONS_OMITTED,
                }
            )
        return R(
            brokers=self._brokers(ctx),
            cluster_id=self.config.cluster_id,
            controller_id=self.ownership.controller_id,
            topics=topics,
            cluster_authorized_operations=self._cluster_operations(
                ctx, field(req, "include_cluster_authorized_operations", False)
            ),
        )

    def _metadata_partition(self, topic: str, partition: int) -> dict[str, Any]:
        """A partition in Metadata: its leader and lease epoch (one replica: the leader);
        LEADER_NOT_AVAILABLE while no live broker holds its lease (cluster mode)."""
        found = self.ownership.leader(topic, partition)
        leader, epoch = found if found else (-1, -1)
        return {
            "error_code": ErrorCode.none if found else ErrorCode.leader_not_available,
            "partition_index": partition,
            "leader_id": leader,
            "leader_epoch": epoch,
            "replica_nodes": [leader] if found else [],
            "isr_nodes": [leader] if found else [],
            "offline_replicas": [],
        }

    @staticmethod
    def _metadata_error(name: str | None, topic_id: Any, code: int) -> dict[str, Any]:
        import uuid

        return {
            "error_code": code,
            "name": name or "",
            "topic_id": topic_id or uuid.UUID(int=0),
            "is_internal": False,
            "partitions": [],
            "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    # ------------------------------------------------------------ produce / fetch

    async def produce(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:  # noqa: C901 (Produce's checks in the order Kafka makes them)
        acks = req.acks
        if acks not in (0, 1, -1):
            return R(
                responses=_produce_refused(
                    req,
                    ErrorCode.invalid_required_acks,
                    f"acks must be 0, 1 or -1 (all), got {acks}",
                )
            )
        if req.transactional_id is not None and not self.allowed(
            ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id
        ):
            code = ErrorCode.transactional_id_authorization_failed
            message = denied_message(ResourceType.TRANSACTIONAL_ID, req.transactional_id)
            if acks == 0:
                raise CloseConnection(f"acks=0 produce refused: {message}")
            return R(responses=_produce_refused(req, code, message))
        if req.transactional_id is not None:  # cluster mode: coordinated elsewhere?
            await self.transactions.refresh_foreign(req.transactional_id)
        results: list[tuple[str, list[dict[str, Any]]]] = []
        last_seq = 0
        appended: list[tuple[dict[str, Any], PartitionLog, int]] = []  # entry, log, end offset
        for td in req.topic_data:
            writable = self.topic_allowed(ctx, R, td.name)
            internal = self.internal_write_refusal(ctx, td.name, "append to")
            topic = self.cluster.topics.get(td.name) if writable and not internal else None
            partitions = []
            for pd in td.partition_data:
                entry: dict[str, Any] = {
                    "index": pd.index,
                    "error_code": ErrorCode.none,
                    "base_offset": -1,
                    "log_append_time": None,
                    "log_start_offset": -1,
                    "record_errors": [],
                    "error_message": None,
                }
                part = self._partition(td.name, pd.index) if topic else None
                refusal = (
                    self._transactional_refusal(req.transactional_id, td.name, pd.index, pd.records)
                    if topic is not None and part is not None
                    else None
                )
                if not writable:
                    entry.update(
                        error_code=ErrorCode.topic_authorization_failed,
                        error_message=denied_message(ResourceType.TOPIC, td.name),
                    )
                elif internal is not None:
                    entry.update(
                        error_code=ErrorCode.invalid_topic_exception, error_message=internal
                    )
                elif topic is None or part is None:
                    absent = self._absent(td.name, pd.index)
                    entry.update(
                        error_code=absent,
                        error_message=f"This server does not host this topic-partition: {td.name}-{pd.index}"
                        if absent == ErrorCode.unknown_topic_or_partition
                        else f"This broker does not lead {td.name}-{pd.index}",
                    )
                    if absent == ErrorCode.not_leader_or_follower:
                        entry["current_leader"] = self._leader_hint(td.name, pd.index)
                elif pd.records is None:
                    entry.update(
                        error_code=ErrorCode.invalid_record,
                        error_message="produce request has no records",
                    )
                elif refusal is not None:
                    entry.update(error_code=refusal[0], error_message=refusal[1])
                elif (
                    rejection := await self._gate_rejection(topic.configs, pd.records)
                    or _keyless_in_compacted(topic.config("cleanup.policy"), pd.records)
                ) is not None:
                    self.refusals.log(
                        (td.name, pd.index, rejection.rule),
                        "produce to %s-%d refused by %s: %s",
                        td.name,
                        pd.index,
                        "the compacted topic's key rule"
                        if rejection.rule == "compaction"
                        else "the data quality gate",
                        rejection.message,
                    )
                    entry.update(
                        error_code=ErrorCode.invalid_record,
                        error_message=rejection.message,
                        record_errors=[
                            {
                                "batch_index": rejection.batch_index,
                                "batch_index_error_message": rejection.message,
                            }
                        ],
                    )
                else:
                    try:
                        base, seq = await self.logs.append(
                            part,
                            pd.records,
                            topic.max_message_bytes,
                            None
                            if req.transactional_id is None
                            else functools.partial(
                                self._recheck_transaction,
                                req.transactional_id,
                                td.name,
                                pd.index,
                                pd.records,
                            ),
                        )
                        last_seq = max(last_seq, seq)
                        appended.append((entry, part, part.next_offset))
                        entry.update(base_offset=base, log_start_offset=part.log_start_offset)
                    except ProduceError as exc:
                        # a WAL that cannot write logs that once, not once per produce
                        if exc.code != ErrorCode.kafka_storage_error:
                            self.refusals.log(
                                (td.name, pd.index, exc.code),
                                "produce to %s-%d refused: %s",
                                td.name,
                                pd.index,
                                exc.message,
                            )
                        entry.update(error_code=exc.code, error_message=exc.message)
                partitions.append(entry)
            results.append((td.name, partitions))

        async def respond() -> Any:
            try:
                await self.logs.wal.wait_durable(last_seq)
                for entry, part, end in appended:  # cluster mode: its lease may be lost since
                    if (unacked := self.logs.ack_error(part, end)) is not None:
                        self.refusals.log(
                            (part.topic, part.partition, "unacked"),
                            "produce to %s-%d accepted, then refused: %s",
                            part.topic,
                            part.partition,
                            unacked.message,
                        )
                        entry.update(
                            error_code=unacked.code, error_message=unacked.message, base_offset=-1
                        )
            except OSError as exc:
                for _, partitions in results:
                    for entry in partitions:
                        if entry["error_code"] == ErrorCode.none:
                            entry.update(
                                error_code=ErrorCode.kafka_storage_error,
                                error_message=str(exc),
                                base_offset=-1,
                            )
            return R(
                responses=[{"name": name, "partition_responses": parts} for name, parts in results]
            )

        if acks == 0:
            failed = [e for _, parts in results for e in parts if e["error_code"] != ErrorCode.none]
            if failed:
                raise CloseConnection(f"acks=0 produce refused: {failed[0]['error_message']}")
            return None
        return respond()

    async def write_txn_markers(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        """WriteTxnMarkers (cluster mode): the coordinator of a transaction asks the leader of
        each of its partitions to write the commit or abort marker, as Kafka's coordinator
        does; answered once the markers are acknowledged (in the object store and the index)."""
        seq = -1
        written: list[tuple[dict[str, Any], Any, int]] = []
        markers = []
        for m in req.markers:
            topics = []
            for t in m.topics:
                partitions = []
                for p in t.partition_indexes:
                    entry: dict[str, Any] = {"partition_index": p, "error_code": ErrorCode.none}
                    part = self._partition(t.name, p)
                    if part is None:
                        entry["error_code"] = self._absent(t.name, p)
                    else:
                        try:
                            marker = self.logs.append_marker(
                                part, m.producer_id, m.producer_epoch, m.transaction_result
                            )
                        except ProduceError as exc:  # unloaded meanwhile: the coordinator retries
                            entry["error_code"] = exc.code
                        else:
                            seq = max(seq, marker)
                            written.append((entry, part, part.next_offset))
                    partitions.append(entry)
                topics.append({"name": t.name, "partitions": partitions})
            markers.append({"producer_id": m.producer_id, "topics": topics})
        try:
            if seq >= 0:
                await self.logs.wal.wait_durable(seq)
            for entry, part, end in written:
                if (error := self.logs.ack_error(part, end)) is not None:
                    entry["error_code"] = error.code
        except OSError as exc:
            log.warning("write txn markers: %s", exc)
            for entry, _, _ in written:
                entry["error_code"] = ErrorCode.kafka_storage_error
        return R(markers=markers)

    def _transactional_refusal(
        self, transactional_id: str | None, topic: str, partition: int, data: bytes | None
    ) -> tuple[int, str | None] | None:
        """Why a produce's transactional batches are refused (None: they are not, or there
        are none). Checked against the coordinator: the current epoch, a partition added."""
        if not data:
            return None
        try:
            header = records.read_header(data)
        except records.CorruptBatchError:
            return None  # the append refuses it with the details
        if not header.is_transactional:
            return None
        if transactional_id is None:
            return ErrorCode.invalid_record, "a transactional batch needs the transactional id"
        error, message = self.transactions.verify_produce(
            transactional_id, header.producer_id, header.producer_epoch, topic, partition
        )
        return None if error == ErrorCode.none else (error, message)

    def _recheck_transaction(
        self, transactional_id: str | None, topic: str, partition: int, data: bytes
    ) -> None:
        refusal = self._transactional_refusal(transactional_id, topic, partition, data)
        if refusal is not None:
            raise ProduceError(refusal[0], refusal[1] or "transaction ended")

    async def _gate_rejection(
        self, configs: dict[str, str], records_bytes: bytes
    ) -> GateRejection | None:
        if self.gate is None or not gate_applies(configs):
            return None
        return await self.gate.check_caught_up(records_bytes)

    async def fetch(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        deadline = time.monotonic() + ms(req.max_wait) / 1000
        min_bytes = req.min_bytes
        max_bytes = field(req, "max_bytes", 2**31 - 1)
        while True:
            total = 0
            errors = False
            responses = []
            generation = self.logs.data_generation
            for ft in req.topics:
                partitions = []
                readable = self.topic_allowed(ctx, R, ft.topic)
                for fp in ft.partitions:
                    part = self._partition(ft.topic, fp.partition) if readable else None
                    entry: dict[str, Any] = {
                        "partition_index": fp.partition,
                        "error_code": ErrorCode.none,
                        "high_watermark": -1,
                        "last_stable_offset": -1,
                        "log_start_offset": -1,
                        "aborted_transactions": None,
                        "preferred_read_replica": -1,
                        "records": b"",
                    }
                    if not readable:
                        entry["error_code"] = ErrorCode.topic_authorization_failed
                        errors = True
                    elif part is None:
                        entry["error_code"] = self._absent(ft.topic, fp.partition)
                        if entry["error_code"] == ErrorCode.not_leader_or_follower:
                            entry["current_leader"] = self._leader_hint(ft.topic, fp.partition)
                        errors = True
                    else:
                        hw = part.high_watermark
                        lso = part.last_stable_offset
                        committed = field(req, "isolation_level", 0) == 1
                        entry.update(
                            high_watermark=hw,
                            last_stable_offset=lso,
                            log_start_offset=part.log_start_offset,
                        )
                        offset = fp.fetch_offset
                        if committed:
                            entry["aborted_transactions"] = [
                                {"producer_id": pid, "first_offset": first}
                                for pid, first, _ in part.aborted_between(offset, lso)
                            ]
                        if offset < part.log_start_offset or offset > hw:
                            entry["error_code"] = ErrorCode.offset_out_of_range
                            errors = True
                        elif offset < (lso if committed else hw) and total < max_bytes:
                            budget = min(fp.partition_max_bytes, max_bytes - total)
                            try:
                                data = Spliced(
                                    await self.logs.read_pieces(
                                        part, offset, budget, lso if committed else None
                                    )
                                )
                            except Exception as exc:  # noqa: BLE001 - the object store failed: a retriable per-partition error
                                log.warning(
                                    "fetch %s-%d at %d: object store read failed: %s",
                                    ft.topic,
                                    fp.partition,
                                    offset,
                                    exc,
                                )
                                entry["error_code"] = ErrorCode.kafka_storage_error
                                errors = True
                            else:
                                entry["records"] = data
                                total += len(data)
                    partitions.append(entry)
                responses.append({"topic": ft.topic, "partitions": partitions})
            remaining = deadline - time.monotonic()
            if total >= min_bytes or errors or remaining <= 0:
                return R(error_code=ErrorCode.none, session_id=0, responses=responses)
            await self.logs.wait_for_data(remaining, since=generation)

    async def list_offsets(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        if R.version == 0:
            return self._list_offsets_v0(ctx, req, R)
        topics = []
        for t in req.topics:
            partitions = []
            describable = self.topic_allowed(ctx, R, t.name)
            for p in t.partitions:
                part = self._partition(t.name, p.partition_index)
                entry: dict[str, Any] = {
                    "partition_index": p.partition_index,
                    "error_code": ErrorCode.none,
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": self.ownership.leader_epoch(t.name, p.partition_index)
                    if part is not None
                    else -1,
                }
                if not describable:
                    entry["error_code"] = ErrorCode.topic_authorization_failed
                elif part is None:
                    entry["error_code"] = self._absent(t.name, p.partition_index)
                elif p.timestamp == -1:  # latest (read_committed: the last stable offset)
                    entry["offset"] = (
                        part.last_stable_offset
                        if field(req, "isolation_level", 0) == 1
                        else part.high_watermark
                    )
                elif p.timestamp in (-2, -4, -5):  # earliest (and earliest local / tiered)
                    entry["offset"] = part.log_start_offset
                elif p.timestamp == -3 or p.timestamp >= 0:  # max timestamp, or by timestamp
                    try:  # to the record: the batch found is read and decoded
                        entry["offset"], entry["timestamp"] = (
                            await self.logs.max_timestamp(part)
                            if p.timestamp == -3
                            else await self.logs.offset_for_timestamp(part, p.timestamp)
                        )
                    except Exception as exc:  # noqa: BLE001 - the object store failed: retriable
                        log.warning("list offsets of %s-%d: %s", t.name, p.partition_index, exc)
                        entry["error_code"] = ErrorCode.kafka_storage_error
                    else:  # as Kafka: read_committed finds nothing at or past the LSO
                        committed = field(req, "isolation_level", 0) == 1
                        if (
                            committed
                            and p.timestamp >= 0
                            and entry["offset"] >= part.last_stable_offset
                        ):
                            entry["offset"], entry["timestamp"] = -1, -1
                else:
                    entry["error_code"] = ErrorCode.invalid_request
                partitions.append(entry)
            topics.append({"name": t.name, "partitions": partitions})
        return R(topics=topics)

    def _list_offsets_v0(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        """ListOffsets v0 as Kafka before 0.10.1 answered it (``fetchOffsetsBefore``): up to
        ``max_num_offsets`` offsets, newest first, from the log end and the starts of the
        segments (here: chunks) last appended to before ``timestamp``; -1 is the log end, -2
        the log start."""
        topics = []
        for t in req.topics:
            partitions = []
            describable = self.topic_allowed(ctx, R, t.name)
            for p in t.partitions:
                part = self._partition(t.name, p.partition_index)
                if part is None or not describable:
                    partitions.append(
                        {
                            "partition_index": p.partition_index,
                            "error_code": self._absent(t.name, p.partition_index)
                            if describable
                            else ErrorCode.topic_authorization_failed,
                            "old_style_offsets": [],
                        }
                    )
                    continue
                if p.timestamp == -2:
                    offsets = [part.log_start_offset]
                else:
                    candidates = [(c.base_offset, c.max_append_ms) for c in part.chunks]
                    candidates.append((part.high_watermark, int(time.time() * 1000)))
                    before = p.timestamp if p.timestamp >= 0 else 2**63 - 1
                    offsets = sorted(
                        {max(o, part.log_start_offset) for o, ms in candidates if ms <= before},
                        reverse=True,
                    )
                partitions.append(
                    {
                        "partition_index": p.partition_index,
                        "error_code": ErrorCode.none,
                        "old_style_offsets": offsets[: max(int(p.max_num_offsets), 0)],
                    }
                )
            topics.append({"name": t.name, "partitions": partitions})
        return R(topics=topics)

    async def offset_for_leader_epoch(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        topics = []
        for t in req.topics:
            partitions = []
            describable = self.topic_allowed(ctx, R, t.topic)
            for p in t.partitions:
                part = self._partition(t.topic, p.partition)
                if part is None or not describable:
                    partitions.append(
                        {
                            "error_code": self._absent(t.topic, p.partition)
                            if describable
                            else ErrorCode.topic_authorization_failed,
                            "partition": p.partition,
                        }
                    )
                else:
                    partitions.append(
                        {
                            "error_code": ErrorCode.none,
                            "partition": p.partition,
                            "leader_epoch": self.ownership.leader_epoch(t.topic, p.partition),
                            "end_offset": part.high_watermark,
                        }
                    )
            topics.append({"topic": t.topic, "partitions": partitions})
        return R(topics=topics)

    async def init_producer_id(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        producer_id = field(req, "producer_id", -1)
        epoch = field(req, "producer_epoch", -1)
        if (refusal := self._init_producer_id_refusal(ctx, req.transactional_id)) is not None:
            return R.error(*refusal)
        if req.transactional_id is not None:
            error, pid, new_epoch = await self.transactions.init_producer_id(
                req.transactional_id, ms(req.transaction_timeout), producer_id, epoch
            )
            return R(
                error_code=fenced_for(22, R.version, error),
                producer_id=pid,
                producer_epoch=new_epoch,
            )
        if producer_id >= 0 and 0 <= epoch < 32767:
            return R(error_code=ErrorCode.none, producer_id=producer_id, producer_epoch=epoch + 1)
        producer_id = await asyncio.to_thread(self.cluster.metadata.next_producer_id)
        return R(error_code=ErrorCode.none, producer_id=producer_id, producer_epoch=0)

    def _init_producer_id_refusal(
        self, ctx: ConnectionContext, transactional_id: str | None
    ) -> tuple[int, str] | None:
        """As Kafka: a transactional producer needs WRITE on its transactional id; an
        idempotent one IDEMPOTENT_WRITE on the cluster, or WRITE on some topic (Kafka 3.0+,
        KIP-679: authorizeByResourceType)."""
        if transactional_id is not None:
            if self.allowed(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
                return None
            return (
                ErrorCode.transactional_id_authorization_failed,
                denied_message(ResourceType.TRANSACTIONAL_ID, transactional_id),
            )
        a = self.authorizer
        if (
            a is None
            or self.allowed(ctx, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME)
            or a.authorize_any(ctx.principal, client_ip(ctx), Operation.WRITE, ResourceType.TOPIC)
        ):
            return None
        return ErrorCode.cluster_authorization_failed, denied_message(
            ResourceType.CLUSTER, CLUSTER_NAME
        )

    # ------------------------------------------------------------ topics and configs

    async def create_topics(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        """CREATE on the cluster, or on each topic (TOPIC_AUTHORIZATION_FAILED for one refused);
        the created topic's configs only for who may DESCRIBE_CONFIGS it, as Kafka."""
        results = []
        may_create_any = self.allowed(ctx, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
        for t in req.topics:
            configs = {c.name: c.value for c in t.configs}
            result: dict[str, Any] = {
                "name": t.name,
                "topic_id": None,
                "error_code": ErrorCode.none,
                "error_message": None,
                "num_partitions": -1,
                "replication_factor": -1,
                "configs": None,
            }
            try:
                if not may_create_any and not self.topic_allowed(ctx, R, t.name):
                    raise TopicError(
                        ErrorCode.topic_authorization_failed,
                        denied_message(ResourceType.TOPIC, t.name),
                    )
                partitions = t.num_partitions
                placement: dict[int, int] = {}
                if t.assignments:
                    partitions = len(t.assignments)
                    placement = self._placement(t.assignments)
                if req.validate_only:
                    self.cluster.validate_new_topic(t.name, partitions, configs)
                    topic_partitions = (
                        partitions if partitions > 0 else self.config.default_partitions
                    )
                    result.update(num_partitions=topic_partitions, replication_factor=1)
                else:
                    topic = await self.cluster.create_topic(t.name, partitions, configs)
                    await self._place(t.name, placement)
                    result.update(
                        topic_id=topic.topic_id,
                        num_partitions=topic.partitions,
                        replication_factor=1,
                        configs=[
                            {
                                "name": k,
                                "value": v,
                                "read_only": False,
                                "config_source": SOURCE_DYNAMIC_TOPIC,
                                "is_sensitive": False,
                            }
                            for k, v in sorted(topic.configs.items())
                        ],
                    )
                    if not self.allowed(
                        ctx, Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, topic.name
                    ):
                        result.update(
                            configs=None,
                            topic_config_error_code=ErrorCode.topic_authorization_failed,
                        )
            except TopicError as exc:
                result.update(error_code=exc.code, error_message=exc.message)
            if result["topic_id"] is None:
                import uuid

                result["topic_id"] = uuid.UUID(int=0)
            results.append(result)
        return R(topics=results)

    def _placement(self, assignments: Any) -> dict[int, int]:
        """A CreateTopics replica assignment as {partition: its leader}, or ``TopicError``. One
        replica a partition (the object store keeps the copies): one broker each, partitions
        0..n-1. One broker: itself only; in a cluster any live broker, which then leads the
        partition (as an AlterPartitionReassignments to it would: ``mover``)."""
        placement: dict[int, int] = {}
        live = {m.node_id for m in self.ownership.live()} | {self.config.node_id}
        for a in assignments:
            if len(a.broker_ids) != 1:
                raise TopicError(
                    ErrorCode.invalid_replica_assignment,
                    f"partition {a.partition_index}: replicas {list(a.broker_ids)}: a partition "
                    "has one replica here (the object store keeps its copies); name one broker",
                )
            [node] = a.broker_ids
            if node not in live or (self.mover is None and node != self.config.node_id):
                names = ", ".join(str(n) for n in sorted(live))
                raise TopicError(
                    ErrorCode.invalid_replica_assignment,
                    f"partition {a.partition_index}: broker {node} is not live (live brokers: {names})",
                )
            placement[int(a.partition_index)] = int(node)
        if sorted(placement) != list(range(len(assignments))):
            raise TopicError(
                ErrorCode.invalid_replica_assignment,
                f"the assignment's partitions must be 0..{len(assignments) - 1}, got {sorted(placement)}",
            )
        return placement

    async def _place(self, topic: str, placement: dict[int, int]) -> None:
        """Hand each partition of a new topic to the broker its assignment names (cluster mode)."""
        if self.mover is None:
            return
        for partition, node in sorted(placement.items()):
            if (problem := await self.mover(topic, partition, node)) is not None:
                log.warning("%s-%d not placed on broker %d: %s", topic, partition, node, problem)

    async def delete_topics(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        import uuid

        wanted: list[tuple[str | None, Any]] = []
        if field(req, "topics") is not None:
            for t in req.topics:
                name = t.name
                if name is None and t.topic_id is not None:
                    found = self.cluster.topics_by_id.get(t.topic_id)
                    name = found.name if found else None
                wanted.append((name, t.topic_id))
        else:
            wanted = [(name, None) for name in req.topic_names]
        responses = []
        for name, topic_id in wanted:
            entry: dict[str, Any] = {
                "name": name,
                "topic_id": topic_id or uuid.UUID(int=0),
                "error_code": ErrorCode.none,
                "error_message": None,
            }
            try:
                if name is None:
                    raise TopicError(
                        ErrorCode.unknown_topic_id, f"Topic id {topic_id} does not exist."
                    )
                if not self.topic_allowed(ctx, R, name):
                    raise TopicError(
                        ErrorCode.topic_authorization_failed,
                        denied_message(ResourceType.TOPIC, name),
                    )
                internal = self.internal_write_refusal(ctx, name, "delete")
                if internal is not None:
                    raise TopicError(ErrorCode.invalid_topic_exception, internal)
                topic = await self.cluster.delete_topic(name)
                entry["topic_id"] = topic.topic_id
            except TopicError as exc:
                entry.update(error_code=exc.code, error_message=exc.message)
            responses.append(entry)
        return R(responses=responses)

    async def create_partitions(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        results = []
        for t in req.topics:
            entry: dict[str, Any] = {
                "name": t.name,
                "error_code": ErrorCode.none,
                "error_message": None,
            }
            try:
                if not self.topic_allowed(ctx, R, t.name):
                    raise TopicError(
                        ErrorCode.topic_authorization_failed,
                        denied_message(ResourceType.TOPIC, t.name),
                    )
                await self.cluster.add_partitions(t.name, t.count, req.validate_only)
            except TopicError as exc:
                entry.update(error_code=exc.code, error_message=exc.message)
            results.append(entry)
        return R(results=results)

    async def describe_configs(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        synonyms = field(req, "include_synonyms", False)
        documentation = field(req, "include_documentation", False)
        results = []
        for res in req.resources:
            entry: dict[str, Any] = {
                "error_code": ErrorCode.none,
                "error_message": None,
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
                "configs": [],
            }
            keys = res.configuration_keys
            if (refusal := self._config_refusal(ctx, res, Operation.DESCRIBE_CONFIGS)) is not None:
                entry.update(error_code=refusal[0], error_message=refusal[1])
            elif res.resource_type == RESOURCE_TOPIC:
                topic = self.cluster.topics.get(res.resource_name)
                if topic is None:
                    entry.update(
                        error_code=ErrorCode.unknown_topic_or_partition,
                        error_message=f"Topic '{res.resource_name}' does not exist.",
                    )
                else:
                    for name, key in topic_configs.KEYS.items():
                        if keys is not None and name not in keys:
                            continue
                        dynamic = name in topic.configs
                        value = topic.configs.get(name, key.default)
                        source = SOURCE_DYNAMIC_TOPIC if dynamic else SOURCE_DEFAULT
                        default_name = topic_configs.BROKER_SYNONYMS.get(name, name)
                        syn = (
                            [{"name": name, "value": value, "source": source}] if dynamic else []
                        ) + [{"name": default_name, "value": key.default, "source": SOURCE_DEFAULT}]
                        entry["configs"].append(
                            {
                                "name": name,
                                "value": value,
                                "read_only": False,
                                "is_default": not dynamic,
                                "config_source": source,
                                "is_sensitive": False,
                                "synonyms": syn if synonyms else [],
                                "config_type": key.config_type,
                                "documentation": key.doc if documentation else None,
                            }
                        )
            elif res.resource_type == RESOURCE_BROKER:
                if (problem := self._broker_resource_problem(res.resource_name)) is not None:
                    entry.update(error_code=ErrorCode.invalid_request, error_message=problem)
                else:
                    entry["configs"] = [
                        c
                        for c in self._broker_config_entries(res.resource_name, synonyms)
                        if keys is None or c["name"] in keys
                    ]
            else:
                entry.update(
                    error_code=ErrorCode.invalid_request,
                    error_message=f"resource type {res.resource_type} is not supported",
                )
            results.append(entry)
        return R(results=results)

    def _config_refusal(
        self, ctx: ConnectionContext, res: Any, operation: Operation
    ) -> tuple[int, str] | None:
        """DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic, or on the cluster for a broker's
        configs (Kafka's rule; this is what guards the table-topic configs)."""
        if res.resource_type == RESOURCE_TOPIC:
            kind, name = ResourceType.TOPIC, res.resource_name
        elif res.resource_type == RESOURCE_BROKER:
            kind, name = ResourceType.CLUSTER, CLUSTER_NAME
        else:
            return None  # refused below as not supported
        if self.allowed(ctx, operation, kind, name):
            return None
        return DENIED_CODE[kind], denied_message(kind, name)

    def _broker_resource_problem(self, name: str) -> str | None:
        """A BROKER resource is this broker (its node id) or the cluster default (``""``); in a
        cluster another live broker's configs are its own to answer (Kafka's admin client sends
        a BROKER resource to that broker), as Kafka refuses an unexpected broker id. A broker
        silent for less than ``membership.LISTED_LEASES`` leases is still one DescribeCluster
        lists, so it is named as one, not as unknown."""
        if name in ("", str(self.config.node_id)):
            return None
        listed = [m.node_id for m in self.ownership.in_metadata()] or [self.config.node_id]
        if name in {str(n) for n in listed}:
            return (
                f"Unexpected broker id, expected {self.config.node_id} or empty string, but "
                f"received {name}: ask broker {name} for its own configs"
            )
        brokers = ", ".join(str(n) for n in listed)
        return f"broker {name!r} does not exist: the brokers are {brokers}"

    def _broker_config_entries(self, resource_name: str, synonyms: bool) -> list[dict[str, Any]]:
        """As Kafka describes a BROKER resource. The cluster default (``""``): the dynamic
        configs set there. This broker: its static configs (read-only), then each dynamic one
        from where it is set, this broker (DYNAMIC_BROKER_CONFIG), the cluster default
        (DYNAMIC_DEFAULT_BROKER_CONFIG) or Kafka's default, with those below as synonyms."""
        defaults = self.cluster.broker_configs.get("", {})
        if resource_name == "":
            return [
                _config_entry(
                    n, v, SOURCE_DYNAMIC_DEFAULT_BROKER, read_only=False, synonyms=synonyms, type_=5
                )
                for n, v in sorted(defaults.items())
            ]
        own = self.cluster.broker_configs.get(resource_name, {})
        entries = [
            _config_entry(name, value, SOURCE_STATIC_BROKER, read_only=True, synonyms=synonyms)
            for name, value in _broker_configs(self.config).items()
        ]
        # Kafka's PASSWORD-typed configs: named, never shown (value null, is_sensitive)
        entries += [
            _config_entry(name, None, SOURCE_STATIC_BROKER, read_only=True, synonyms=synonyms)
            for name in _sensitive_broker_configs(self.config)
        ]
        for name, key in broker_configs.KEYS.items():
            layers = [
                (own.get(name), SOURCE_DYNAMIC_BROKER),
                (defaults.get(name), SOURCE_DYNAMIC_DEFAULT_BROKER),
                (key.default, SOURCE_DEFAULT),
            ]
            present = [(v, src) for v, src in layers if v is not None]
            value, source = present[0]
            entry = _config_entry(name, value, source, read_only=False, synonyms=False, type_=5)
            if synonyms:
                entry["synonyms"] = [
                    {"name": name, "value": v, "source": src} for v, src in present
                ]
            entries.append(entry)
        return entries

    async def alter_configs(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        responses = []
        for res in req.resources:
            replacement: dict[str, Any] = {c.name: c.value for c in res.configs}
            responses.append(
                await self._apply_configs(
                    ctx, res, functools.partial(_replace_all, replacement), req.validate_only
                )
            )
        return R(responses=responses)

    async def incremental_alter_configs(
        self, ctx: ConnectionContext, req: Any, R: Responder
    ) -> Any:
        responses = []
        for res in req.resources:

            def change(old: dict[str, str], res: Any = res) -> dict[str, str | None]:
                new: dict[str, str | None] = dict(old)
                broker = res.resource_type == RESOURCE_BROKER
                for c in res.configs:
                    known = (broker_configs.KEYS if broker else topic_configs.KEYS).get(c.name)
                    current = new.get(c.name, known.default if known else "") or ""
                    items = [i for i in current.split(",") if i]
                    if c.config_operation == 0:  # SET
                        new[c.name] = c.value
                    elif c.config_operation == 1:  # DELETE
                        new.pop(c.name, None)
                        if broker:
                            broker_configs.validate_all({c.name: None})
                        else:
                            topic_configs.validate(c.name, None)
                    elif c.config_operation == 2:  # APPEND
                        add = [i for i in (c.value or "").split(",") if i and i not in items]
                        new[c.name] = ",".join(items + add)
                    elif c.config_operation == 3:  # SUBTRACT
                        remove = set((c.value or "").split(","))
                        new[c.name] = ",".join(i for i in items if i not in remove)
                    else:
                        raise topic_configs.InvalidConfigError(
                            f"unknown config operation {c.config_operation}"
                        )
                return new

            responses.append(await self._apply_configs(ctx, res, change, req.validate_only))
        return R(responses=responses)

    async def _apply_configs(
        self,
        ctx: ConnectionContext,
        res: Any,
        change: Callable[[dict[str, str]], dict[str, Any]],
        validate_only: bool,
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "resource_type": res.resource_type,
            "resource_name": res.resource_name,
        }
        if (refusal := self._config_refusal(ctx, res, Operation.ALTER_CONFIGS)) is not None:
            entry.update(error_code=refusal[0], error_message=refusal[1])
            return entry
        if res.resource_type == RESOURCE_BROKER:
            if (problem := self._broker_resource_problem(res.resource_name)) is not None:
                entry.update(error_code=ErrorCode.invalid_request, error_message=problem)
                return entry
            try:
                scope = res.resource_name
                new_configs = change(dict(self.cluster.broker_configs.get(scope, {})))
                await self.cluster.set_broker_configs(scope, new_configs, validate_only)
            except topic_configs.InvalidConfigError as exc:
                entry.update(error_code=ErrorCode.invalid_config, error_message=str(exc))
            except TopicError as exc:
                entry.update(error_code=exc.code, error_message=exc.message)
            return entry
        if res.resource_type != RESOURCE_TOPIC:
            entry.update(
                error_code=ErrorCode.invalid_request,
                error_message="only topic and broker configs can be altered",
            )
            return entry
        topic = self.cluster.topics.get(res.resource_name)
        if topic is None:
            entry.update(
                error_code=ErrorCode.unknown_topic_or_partition,
                error_message=f"Topic '{res.resource_name}' does not exist.",
            )
            return entry
        try:
            new = change(dict(topic.configs))
            await self.cluster.set_configs(
                topic.name, {k: v for k, v in new.items() if v is not None}, validate_only
            )
        except topic_configs.InvalidConfigError as exc:
            entry.update(error_code=ErrorCode.invalid_config, error_message=str(exc))
        except TopicError as exc:
            entry.update(error_code=exc.code, error_message=exc.message)
        return entry

    # ------------------------------------------------------------ groups

    async def find_coordinator(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        key_type = field(req, "key_type", 0)
        error, message = (
            (ErrorCode.none, None)
            if key_type in (0, 1)  # a group, a transactional id: this broker coordinates both
            else (ErrorCode.invalid_request, f"unknown coordinator key type {key_type}")
        )
        here = self._broker(ctx)

        def answer(key: str) -> dict[str, Any]:
            code, text = error, message
            node: dict[str, Any] | None = here
            if code == ErrorCode.none:  # DESCRIBE on the group or the transactional id
                kind = ResourceType.GROUP if key_type == 0 else ResourceType.TRANSACTIONAL_ID
                if not self.allowed(ctx, Operation.DESCRIBE, kind, key):
                    code, text = DENIED_CODE[kind], denied_message(kind, key)
                elif self.ownership.clustered:  # the leader of the key's coordinator slot
                    node = self._coordinator_node(ctx, key_type, key)
                    if node is None:
                        code = ErrorCode.coordinator_not_available
                        text = "no live broker holds the coordinator slot yet"
            found = code == ErrorCode.none and node is not None
            return {
                "key": key,
                "node_id": node["node_id"] if node and found else -1,
                "host": node["host"] if node and found else "",
                "port": node["port"] if node and found else -1,
                "error_code": code,
                "error_message": text,
            }

        if R.version >= 4:
            return R(coordinators=[answer(key) for key in req.coordinator_keys])
        single = answer(req.key)
        del single["key"]
        return R(**single)

    def _coordinator_node(
        self, ctx: ConnectionContext, key_type: int, key: str
    ) -> dict[str, Any] | None:
        """The coordinator of a group (0) or transactional id (1) on the request's listener."""
        member = self.ownership.coordinator(KEY_GROUP if key_type == 0 else KEY_TRANSACTION, key)
        if member is None:
            return None
        if member.node_id == self.config.node_id:
            return self._broker(ctx)
        address = member.address(ctx.listener)
        if address is None:
            return None
        return {"node_id": member.node_id, "host": address[0], "port": address[1]}

    async def join_group(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        session_ms = ms(req.session_timeout)
        if not self.consumer_groups.take_over_for_classic(req.group_id):
            # a consumer (KIP-848) group with members: no classic member joins it here
            return R(
                error_code=ErrorCode.inconsistent_group_protocol,
                generation_id=-1,
                protocol_type=None,
                protocol_name=None if R.version >= 7 else "",
                leader="",
                skip_assignment=False,
                member_id=req.member_id,
                members=[],
            )
        result = await self.groups.join(
            req.group_id,
            req.member_id,
            field(req, "group_instance_id"),
            ctx.client_id,
            ctx.client_host,
            session_ms,
            ms(field(req, "rebalance_timeout", session_ms)),
            req.protocol_type,
            [(p.name, p.metadata) for p in req.protocols],
            require_known_member_id=R.version >= 4,
            supports_skip_assignment=R.version >= 9,
        )
        return R(
            error_code=result.error,
            generation_id=result.generation,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name if R.version >= 7 else (result.protocol_name or ""),
            leader=result.leader,
            skip_assignment=result.skip_assignment,
            member_id=result.member_id,
            members=[
                {"member_id": m, "group_instance_id": g, "metadata": md}
                for m, g, md in result.members
            ],
        )

    async def sync_group(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        error, assignment, ptype, pname = await self.groups.sync(
            req.group_id,
            req.generation_id,
            req.member_id,
            {a.member_id: a.assignment for a in req.assignments},
            field(req, "group_instance_id"),
        )
        return R(error_code=error, protocol_type=ptype, protocol_name=pname, assignment=assignment)

    async def heartbeat(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        return R(
            error_code=self.groups.heartbeat(
                req.group_id, req.generation_id, req.member_id, field(req, "group_instance_id")
            )
        )

    async def leave_group(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        if R.version < 3:
            return R(error_code=self.groups.leave(req.group_id, req.member_id, None))
        members = []
        for m in req.members:
            members.append(
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "error_code": self.groups.leave(req.group_id, m.member_id, m.group_instance_id),
                }
            )
        return R(error_code=ErrorCode.none, members=members)

    async def offset_commit(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        generation = field(req, "generation_id_or_member_epoch", field(req, "generation_id", -1))
        if self.consumer_groups.is_consumer_group(req.group_id):
            error = self.consumer_groups.validate_offset_commit(
                req.group_id, req.member_id, generation, R.version
            )
        else:
            error = self.groups.validate_member(
                req.group_id, generation, req.member_id, field(req, "group_instance_id")
            )
        if not self.group_allowed(ctx, R, req.group_id):  # as Kafka: before the member checks
            error = ErrorCode.group_authorization_failed
        topics = []
        to_store = []
        for t in req.topics:
            partitions = []
            readable = error != ErrorCode.none or self.topic_allowed(ctx, R, t.name)
            for p in t.partitions:
                code = error if readable else ErrorCode.topic_authorization_failed
                if code == ErrorCode.none and not self._exists(t.name, p.partition_index):
                    code = ErrorCode.unknown_topic_or_partition
                if code == ErrorCode.none:
                    to_store.append(
                        (
                            t.name,
                            p.partition_index,
                            p.committed_offset,
                            field(p, "committed_leader_epoch", -1),
                            p.committed_metadata,
                        )
                    )
                partitions.append({"partition_index": p.partition_index, "error_code": code})
            topics.append({"name": t.name, "partitions": partitions})
        if to_store:  # a SQLite fsync or a Postgres round trip: off the event loop (requests of one
            # connection are handled one after another, so its next OffsetFetch sees this commit)
            try:
                await asyncio.to_thread(
                    self.cluster.metadata.commit_offsets,
                    req.group_id,
                    to_store,
                    self.ownership.slot_fence(KEY_GROUP, req.group_id),
                )
            except CoordinatorFencedError:  # the group's slot moved a moment ago
                _fail_unset(topics, ErrorCode.not_coordinator)
            except Exception as exc:
                if not is_storage_failure(exc):
                    raise
                # the metadata store cannot write (a full disk): Kafka's coordinator answers a
                # failed offsets append with a retriable coordinator error, which clients retry
                self.storage_failures.refused(
                    f"offset commit of group {req.group_id}", exc, "COORDINATOR_NOT_AVAILABLE"
                )
                _fail_unset(topics, ErrorCode.coordinator_not_available)
        return R(topics=topics)

    async def offset_fetch(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        if R.version >= 8:
            groups = []
            for g in req.groups:
                error = (
                    self.consumer_groups.validate_offset_fetch(
                        g.group_id, field(g, "member_id"), field(g, "member_epoch", -1)
                    )
                    if self.group_allowed(ctx, R, g.group_id)
                    else ErrorCode.group_authorization_failed
                )
                topics = (
                    await self._fetched_offsets(
                        ctx, R, g.group_id, g.topics, "partition_indexes", req.require_stable
                    )
                    if error == ErrorCode.none
                    else []
                )
                groups.append({"group_id": g.group_id, "topics": topics, "error_code": error})
            return R(groups=groups)
        if not self.group_allowed(ctx, R, req.group_id):
            return R(topics=[], error_code=ErrorCode.group_authorization_failed)
        return R(
            topics=await self._fetched_offsets(
                ctx,
                R,
                req.group_id,
                req.topics,
                "partition_indexes",
                field(req, "require_stable", False),
            ),
            error_code=ErrorCode.none,
        )

    async def _fetched_offsets(
        self,
        ctx: ConnectionContext,
        R: Responder,
        group_id: str,
        topics: Any,
        partitions_field: str,
        require_stable: bool = False,
    ) -> list[dict[str, Any]]:
        """A group's offsets of the topics asked (all: those the principal may DESCRIBE; one
        named and not describable: TOPIC_AUTHORIZATION_FAILED per partition, as Kafka)."""
        committed = await asyncio.to_thread(self.cluster.metadata.committed_offsets, group_id)
        # KIP-447: a read_committed consumer waits for offsets of an open transaction
        unstable = (
            await asyncio.to_thread(self.transactions.pending_offsets, group_id)
            if require_stable
            else set()
        )
        wanted: dict[str, list[int]] = {}
        if topics is None:
            for t, p in committed:
                if self.topic_allowed(ctx, R, t):
                    wanted.setdefault(t, []).append(p)
        else:
            for t in topics:
                wanted[t.name] = list(getattr(t, partitions_field))
        result = []
        for name, partitions in wanted.items():
            entries = []
            if not self.topic_allowed(ctx, R, name):
                entries = [
                    {
                        "partition_index": p,
                        "committed_offset": -1,
                        "committed_leader_epoch": -1,
                        "metadata": "",
                        "error_code": ErrorCode.topic_authorization_failed,
                    }
                    for p in sorted(partitions)
                ]
                result.append({"name": name, "partitions": entries})
                continue
            for p in sorted(partitions):
                c = committed.get((name, p))
                entries.append(
                    {
                        "partition_index": p,
                        "committed_offset": c.offset if c else -1,
                        "committed_leader_epoch": c.leader_epoch if c else -1,
                        "metadata": c.metadata if c else "",
                        "error_code": ErrorCode.unstable_offset_commit
                        if (name, p) in unstable
                        else ErrorCode.none,
                    }
                )
            result.append({"name": name, "partitions": entries})
        return result

    async def describe_groups(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        known_offsets = set(await asyncio.to_thread(self.cluster.metadata.groups_with_offsets))
        with_operations = field(req, "include_authorized_operations", False)
        groups = []
        for group_id in req.groups:
            if not self.group_allowed(ctx, R, group_id):
                refused = _dead_group(group_id, R.version, "")
                refused.update(  # as Kafka's DescribeGroupsResponse.forError: no state either
                    error_code=ErrorCode.group_authorization_failed,
                    error_message=denied_message(ResourceType.GROUP, group_id),
                    group_state="",
                )
                groups.append(refused)
                continue
            if self.consumer_groups.is_consumer_group(group_id):
                groups.append(self._not_a_classic_group(group_id, R.version))
                continue
            group = self.groups.groups.get(group_id)
            if group is None and group_id not in known_offsets:
                groups.append(_dead_group(group_id, R.version, "not found"))
                continue
            state = group.state if group else "Empty"
            members = []
            if group:
                for m in group.members.values():
                    members.append(
                        {
                            "member_id": m.member_id,
                            "group_instance_id": m.group_instance_id,
                            "client_id": m.client_id,
                            "client_host": m.client_host,
                            "member_metadata": m.metadata_for(group.protocol_name or ""),
                            "member_assignment": m.assignment,
                        }
                    )
            groups.append(
                {
                    "error_code": ErrorCode.none,
                    "error_message": None,
                    "group_id": group_id,
                    "group_state": state,
                    "protocol_type": (group.protocol_type or "") if group else "consumer",
                    "protocol_data": (group.protocol_name or "") if group else "",
                    "members": members,
                    "authorized_operations": self.authorized_operations(
                        ctx, ResourceType.GROUP, group_id
                    )
                    if with_operations
                    else AUTHORIZED_OPERATIONS_OMITTED,
                }
            )
        return R(groups=groups)

    @staticmethod
    def _not_a_classic_group(group_id: str, version: int) -> dict[str, Any]:
        """DescribeGroups of a consumer (KIP-848) group, as Kafka answers it: Dead, and from v6
        GROUP_ID_NOT_FOUND (ConsumerGroupDescribe describes it)."""
        return _dead_group(group_id, version, "is not a classic group")

    async def list_groups(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        states = {s.lower() for s in field(req, "states_filter", ()) or ()}
        types = {s.lower() for s in field(req, "types_filter", ()) or ()}
        listed: dict[str, dict[str, Any]] = {}
        for group_id in await asyncio.to_thread(self.cluster.metadata.groups_with_offsets):
            listed[group_id] = {
                "group_id": group_id,
                "protocol_type": "consumer",
                "group_state": "Empty",
                "group_type": "classic",
            }
        for group in self.groups.groups.values():
            listed[group.group_id] = {
                "group_id": group.group_id,
                "protocol_type": group.protocol_type or "",
                "group_state": group.state,
                "group_type": "classic",
            }
        for consumer_group in self.consumer_groups.listed():
            listed[consumer_group["group_id"]] = consumer_group
        every = self.allowed(ctx, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
        groups = [
            g
            for g in listed.values()
            if (not states or g["group_state"].lower() in states)
            and (not types or g["group_type"] in types)
            and (every or self.group_allowed(ctx, R, g["group_id"]))
        ]
        return R(error_code=ErrorCode.none, groups=groups)

    async def delete_groups(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        """As Kafka: a group with members is NON_EMPTY_GROUP; one the broker has neither in memory
        nor in its committed offsets is GROUP_ID_NOT_FOUND."""
        results = []
        for group_id in req.groups_names:
            if not self.group_allowed(ctx, R, group_id):
                results.append(
                    {"group_id": group_id, "error_code": ErrorCode.group_authorization_failed}
                )
                continue
            known = group_id in self.groups.groups or self.consumer_groups.is_consumer_group(
                group_id
            )
            consumer_code = self.consumer_groups.delete(group_id)
            code = self.groups.delete(group_id) if consumer_code is None else consumer_code
            if code == ErrorCode.none:
                had_offsets = await asyncio.to_thread(
                    self.cluster.metadata.delete_group_offsets, group_id
                )
                if not known and not had_offsets:
                    code = ErrorCode.group_id_not_found
            results.append({"group_id": group_id, "error_code": code})
        return R(results=results)

    async def delete_records(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        """DeleteRecords (``kafka-delete-records``, ``Admin.deleteRecords``): each partition's
        log start moves up to the offset asked (-1: the high watermark); an offset past the high
        watermark is OFFSET_OUT_OF_RANGE, as Kafka answers. Consumers, ListOffsets, retention
        and the commit round (which starts no lower than the log start) all follow it."""
        topics = []
        for t in req.topics:
            partitions = []
            deletable = self.topic_allowed(ctx, R, t.name)
            internal = self.internal_write_refusal(ctx, t.name, "delete records of")
            for p in t.partitions:
                part = self._partition(t.name, p.partition_index)
                topic = self.cluster.topics.get(t.name)
                result = {"partition_index": p.partition_index, "low_watermark": -1}
                if not deletable:
                    result["error_code"] = ErrorCode.topic_authorization_failed
                    partitions.append(result)
                    continue
                if internal is not None:
                    log.info("delete records refused: %s", internal)
                    result["error_code"] = ErrorCode.invalid_topic_exception
                    partitions.append(result)
                    continue
                if part is None or topic is None:
                    result["error_code"] = self._absent(t.name, p.partition_index)
                    partitions.append(result)
                    continue
                if "delete" not in topic.config("cleanup.policy").split(","):
                    # as Kafka: a compacted topic (e.g. the registry's _schemas) keeps its records
                    result["error_code"] = ErrorCode.policy_violation
                    result["low_watermark"] = part.log_start_offset
                    partitions.append(result)
                    continue
                offset = part.high_watermark if p.offset == -1 else int(p.offset)
                if offset < 0 or offset > part.high_watermark:
                    result["error_code"] = ErrorCode.offset_out_of_range
                    result["low_watermark"] = part.log_start_offset
                    partitions.append(result)
                    continue
                try:
                    result["low_watermark"] = await self.logs.delete_records(part, offset)
                    result["error_code"] = ErrorCode.none
                except ProduceError as exc:  # cluster mode: its lease was lost meanwhile
                    result["error_code"] = exc.code
                except Exception as exc:  # noqa: BLE001 - the flush or the index write failed: retriable
                    log.warning("delete records of %s-%d: %s", t.name, p.partition_index, exc)
                    result["error_code"] = ErrorCode.kafka_storage_error
                partitions.append(result)
            topics.append({"name": t.name, "partitions": partitions})
        return R(throttle_time=0, topics=topics)

    async def offset_delete(self, ctx: ConnectionContext, req: Any, R: Responder) -> Any:
        """OffsetDelete (``kafka-consumer-groups --delete-offsets``): a group's committed offsets
        of some partitions; refused per partition (GROUP_SUBSCRIBED_TO_TOPIC) while a member of
        the group is subscribed to the topic, as Kafka does."""
        group = self.groups.groups.get(req.group_id)
        stored = await asyncio.to_thread(self.cluster.metadata.committed_offsets, req.group_id)
        consumer_group = self.consumer_groups.is_consumer_group(req.group_id)
        if group is None and not consumer_group and not stored:
            return R(error_code=ErrorCode.group_id_not_found, throttle_time=0, topics=[])
        subscribed: set[str] = self.consumer_groups.subscribed_topics(req.group_id)
        if group is not None:
            if group.members and group.protocol_type != "consumer":  # e.g. Kafka Connect's
                return R(error_code=ErrorCode.non_empty_group, throttle_time=0, topics=[])
            for member in group.members.values():
                subscribed |= member.subscribed_topics()
        topics, deleted = [], []
        for t in req.topics:
            partitions = []
            readable = self.topic_allowed(ctx, R, t.name)
            for p in t.partitions:
                code = (
                    ErrorCode.topic_authorization_failed
                    if not readable
                    else ErrorCode.group_subscribed_to_topic
                    if t.name in subscribed
                    else ErrorCode.none
                )
                if code == ErrorCode.none:
                    deleted.append((t.name, p.partition_index))
                partitions.append({"partition_index": p.partition_index, "error_code": code})
            topics.append({"name": t.name, "partitions": partitions})
        if deleted:
            await asyncio.to_thread(
                self.cluster.metadata.delete_partition_offsets, req.group_id, deleted
            )
        return R(error_code=ErrorCode.none, throttle_time=0, topics=topics)


def _produce_refused(req: Any, code: int, message: str) -> list[dict[str, Any]]:
    """Produce's responses when the whole request is refused: every partition gets the error."""
    return [
        {
            "name": td.name,
            "partition_responses": [
                _produce_error(pd.index, code, message) for pd in td.partition_data
            ],
        }
        for td in req.topic_data
    ]


def _produce_error(index: int, code: int, message: str) -> dict[str, Any]:
    return {
        "index": index,
        "error_code": code,
        "base_offset": -1,
        "log_append_time": None,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": message,
    }


def _fail_unset(topics: list[dict[str, Any]], code: int) -> None:
    """Every partition of an OffsetCommit answer not refused already gets ``code``."""
    for t in topics:
        for entry in t["partitions"]:
            if entry["error_code"] == ErrorCode.none:
                entry["error_code"] = code


def _keyless_in_compacted(cleanup_policy: str, records_bytes: bytes) -> GateRejection | None:
    """As Kafka's log validator: a compacted topic takes no record without a key (compaction
    keeps the last record per key; a keyless one could never be compacted away)."""
    if "compact" not in cleanup_policy.split(","):
        return None
    index = 0
    try:
        for header, batch in records.iter_batches(records_bytes):
            if header.is_control:
                continue
            for record in records.decode_batch(batch)[1]:
                if record.key is None:
                    return GateRejection(
                        index,
                        f"record {index} has no key, and a compacted topic "
                        "(cleanup.policy=compact) cannot accept a record without a key",
                        rule="compaction",
                    )
                index += 1
    except (records.CorruptBatchError, ValueError) as exc:
        return GateRejection(index, f"record {index} could not be read: {exc}", rule="compaction")
    return None


def _sensitive_broker_configs(config: BrokerConfig) -> list[str]:
    """The secret settings ``config`` has, by property key: described as Kafka describes its
    PASSWORD configs, with no value."""
    names = [property_key(name) for name in sorted(SECRET_FIELDS) if getattr(config, name)]
    return names + sorted(LISTENER_PREFIX + key for key in config.per_listener_secrets)


def _config_entry(
    name: str, value: str | None, source: int, *, read_only: bool, synonyms: bool, type_: int = 2
) -> dict[str, Any]:
    """One DescribeConfigs entry; ``value`` None is a sensitive one (Kafka's PASSWORD type)."""
    if value is None:
        type_ = CONFIG_TYPE_PASSWORD
    return {
        "name": name,
        "value": value,
        "read_only": read_only,
        "is_default": source == SOURCE_DEFAULT,
        "config_source": source,
        "is_sensitive": value is None,
        "synonyms": [{"name": name, "value": value, "source": source}] if synonyms else [],
        "config_type": type_,
        "documentation": None,
    }


def _dead_group(group_id: str, version: int, why: str) -> dict[str, Any]:
    """A DescribeGroups entry for a group the classic coordinator does not have: Dead, and from
    v6 GROUP_ID_NOT_FOUND with ``Group <id> <why>.``, as Kafka answers."""
    return {
        "error_code": ErrorCode.group_id_not_found if version >= 6 else ErrorCode.none,
        "error_message": f"Group {group_id} {why}." if version >= 6 else None,
        "group_id": group_id,
        "group_state": "Dead",
        "protocol_type": "",
        "protocol_data": "",
        "members": [],
        "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }


def _replace_all(replacement: dict[str, Any], _old: dict[str, str]) -> dict[str, Any]:
    """AlterConfigs semantics: the given set replaces every dynamic config."""
    return replacement


def api_versions_response(R: Responder, error: int) -> Any:
    return R(
        error_code=error,
        api_keys=[
            {"api_key": k, "min_version": lo, "max_version": hi}
            for k, (lo, hi) in sorted(ADVERTISED_VERSIONS.items())
        ],
        supported_features=[],
        finalized_features_epoch=-1,
        finalized_features=[],
        zk_migration_ready=False,
    )
