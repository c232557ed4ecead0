"""Wires one broker process together: metadata, object store, logs, Kafka
listener, group coordinator, the admin API, the schema registry and the Iceberg
REST catalog."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pyiceberg.table import Table

from broker import metrics
from broker.admin_http import AdminApi
from broker.catalog import open_catalog
from broker.checkpoint import Checkpoint
from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.gate import DataQualityGate
from broker.http_security import setup as http_setup
from broker.kafka.consumer_groups import ConsumerGroupCoordinator
from broker.kafka.groups import GroupCoordinator
from broker.kafka.handlers import KafkaHandlers
from broker.kafka.internal_topics import InternalTopic
from broker.kafka.peer import MarkerSender, peer_security
from broker.kafka.server import KafkaServer
from broker.kafka.transactions import TransactionCoordinator
from broker.membership import Membership
from broker.ownership import (
    GROUP_SLOTS_TOPIC,
    KEY_TRANSACTION,
    Ownership,
    coordinator_slot,
    local_member,
)
from broker.registry import store as registry_store
from broker.registry.api import RegistryApi
from broker.registry.forward import Forwarder
from broker.registry.table_check import TableCheck
from broker.security.stats import AuthStats
from broker.storage.compaction import Compactor
from broker.storage.leases import Leases
from broker.storage.logstore import LogStore
from broker.storage.metadata import MetadataStore
from broker.storage.objectstore import open_object_store
from broker.storage.retention import Retention

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        config.home.mkdir(parents=True, exist_ok=True)
        # cluster mode: how this broker reaches its peers, checked before it registers
        self._peer = peer_security(config) if config.metadata_uri is not None else None
        self.metadata = MetadataStore(config.metadata_target)
        # Cluster mode (Postgres metadata): this broker's membership, refused at once when a
        # live broker already has its node id.
        self.leases: Leases | None = None
        if self.metadata.db.postgres:
            self.leases = Leases(self.metadata, config.node_id, config.broker_lease_ms)
            try:
                self.leases.register(uuid.uuid4().hex, endpoints(config), config.broker_rack)
            except BaseException:
                self.metadata.close()
                raise
        try:
            self._build(config)
        except BaseException:
            self._leave_after_failed_start()
            raise

    def _build(self, config: BrokerConfig) -> None:
        self.membership: Membership | None = None
        self.store = open_object_store(config.store)
        # cluster mode: no local WAL, only the partitions this broker leads (broker/membership.py)
        self.logs = LogStore(
            config,
            self.metadata,
            self.store,
            node_id=config.node_id if self.leases is not None else None,
        )
        self.cluster = Cluster(config, self.metadata, self.logs)
        self.groups = GroupCoordinator(config.group_initial_rebalance_delay_ms)
        self.consumer_groups = ConsumerGroupCoordinator(
            self.cluster,
            self.groups,
            config.group_consumer_heartbeat_interval_ms,
            config.group_consumer_session_timeout_ms,
        )
        self.transactions = TransactionCoordinator(
            self.metadata,
            self.logs,
            config.transaction_max_timeout_ms,
            config.transaction_cleanup_interval_ms,
        )
        self.ownership = Ownership(local_member(config), clustered=config.clustered)
        self.handlers = KafkaHandlers(
            config,
            self.cluster,
            self.logs,
            self.groups,
            self.transactions,
            self.consumer_groups,
            self.ownership,
        )
        # cluster mode (Postgres metadata): leases, heartbeats, who leads what
        if self.leases is not None:
            self.membership = Membership(
                config,
                self.metadata,
                self.logs,
                self.cluster,
                self.ownership,
                self.leases,
                on_refresh=self.handlers.reload_acls,
                on_slot=self._coordinator_slot,
            )
            # transactions across brokers: coordinated by the slot's leader, markers to leaders
            self.transactions.coordinates = lambda tid: self.ownership.coordinates(
                KEY_TRANSACTION, tid
            )
            self.transactions.slot_fence = lambda tid: self.ownership.slot_fence(
                KEY_TRANSACTION, tid
            )
            self.transactions.partition_exists = self._partition_exists
            self.transactions.remote_markers = MarkerSender(
                self.ownership, self._peer or peer_security(config), self._partition_exists
            )
            self.cluster.changed = self.membership.nudge
            self.handlers.mover = self.membership.move  # AlterPartitionReassignments
        self.auth_stats = AuthStats()
        self.kafka = KafkaServer(self.handlers, config.max_request_bytes, self.auth_stats)
        self.admin = AdminApi(
            config, self.cluster, self.logs, self.auth_stats, http_setup.admin_auth(config)
        )
        self.admin.membership = self.membership
        self.admin.members = self.leases  # GET /v1/cluster lists the live brokers
        self.schemas_topic = InternalTopic(
            self.cluster, self.logs, registry_store.TOPIC, registry_store.TOPIC_CONFIGS
        )
        self.schemas = registry_store.SchemaStore(self.schemas_topic)
        registry_auth = http_setup.registry_auth(config, self.schemas)
        self.handlers.gate = DataQualityGate(self.schemas)
        if self.leases is not None:  # an id registered through another broker: catch up first
            self.handlers.gate.refresh = self.schemas.sync
        self.catalog = open_catalog(config)
        spec = config.tables_catalog
        # One reader of the tables' catalog for the registry's table check, retention, the
        # admin API's pending offsets and /metrics: the built-in catalog read in-process (no
        # HTTP, so no token when it requires OAuth2), an external one through pyiceberg.
        self.tables = (
            metrics.CatalogReader(spec, self.catalog.store)
            if config.catalog.builtin
            else metrics.catalog_reader(spec)
        )
        self.registry = RegistryApi(
            self.schemas,
            TableCheck(
                self.cluster,
                self.schemas,
                self.load_table,
                f"built-in REST catalog ({spec.uri})"
                if spec.builtin
                else f"{spec.type} {spec.uri or spec.warehouse or ''}".strip(),
            ),
            auth=registry_auth,
            # cluster mode: one writer, the leader of _schemas-0; the others forward writes
            forward=Forwarder(
                self.schemas_topic,
                self.leases,
                config.node_id,
                self.schemas.sync,
                wait_s=config.broker_lease_ms / 1000 + 2,
            )
            if self.leases is not None
            else None,
        )
        self.registry.ssl_context = http_setup.registry_tls(config)
        self.admin.tables = self.tables
        self.admin.http_auth.update(
            (name, auth)
            for name, auth in (("schema-registry", registry_auth), ("catalog", self.catalog.auth))
            if auth is not None
        )
        self.retention = Retention(
            self.cluster, self.logs, self.table_checkpoint, config.retention_check_interval_ms
        )
        # cluster mode: the leader merges its partitions' small segment objects
        self.compactor: Compactor | None = None
        if self.leases is not None and config.segment_compaction_enable:
            self.compactor = Compactor(config, self.cluster, self.logs, self.retention)

    def _partition_exists(self, tp: tuple[str, int]) -> bool:
        topic = self.cluster.topics.get(tp[0])
        return topic is not None and 0 <= tp[1] < topic.partitions

    async def _coordinator_slot(self, topic: str, slot: int, taken: bool) -> None:
        """Cluster mode: a ``__transaction_state`` slot taken (its transactional ids read fresh
        from Postgres, its decided transactions completed) or given up. A group slot given up
        drops its groups here (they rebuild themselves as their members rejoin at the new
        coordinator; their committed offsets are in Postgres)."""
        if topic == GROUP_SLOTS_TOPIC:
            if not taken:
                for group_id in [g for g in self.groups.groups if coordinator_slot(g) == slot]:
                    self.groups.unload(group_id)
                for group_id in [
                    g for g in self.consumer_groups.groups if coordinator_slot(g) == slot
                ]:
                    self.consumer_groups.groups.pop(group_id, None)
            return
        if taken:
            await self.transactions.take_slot(slot)
        else:
            self.transactions.drop_slot(slot)

    def load_table(self, namespace: str, table: str) -> Table | None:
        """A table topic's table (pyiceberg), None when it does not exist yet (blocking: the
        registry's table check calls it from a thread)."""
        loaded: Table | None = self.tables.table(namespace, table)
        return loaded

    def table_checkpoint(self, namespace: str, table: str) -> Checkpoint:
        """The offsets a table topic's table holds (blocking: retention calls it from a thread).
        No table yet: nothing committed."""
        return self.tables.checkpoint(namespace, table)

    def _leave_after_failed_start(self) -> None:
        """A start that failed after ``register``: the node id is freed at once (else the
        next start would be refused as "in use" until the row ages out) and the database
        connection closed. Leases it took lapse (it wrote nothing visible: no flush ran)."""
        if self.leases is not None and self.leases.incarnation is not None:
            try:
                held = [tp for tp, _ in self.leases.heartbeat().items()]
                self.leases.release(held)
                self.leases.deregister()
            except Exception as exc:  # noqa: BLE001 - the row ages out by itself
                log.warning("could not deregister after the failed start: %s", exc)
        self.metadata.close()

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            if self.membership is not None:
                log.error("the broker failed to start; leaving the cluster")
                with contextlib.suppress(Exception):
                    await self.membership.handover()
            for _name, close in self._closers():  # what did start is stopped again
                with contextlib.suppress(Exception):
                    await close()
            await asyncio.to_thread(self._leave_after_failed_start)
            raise

    async def _start(self) -> None:
        await self.logs.open(
            {name: t.partitions for name, t in self.cluster.topics.items()}, self.leases
        )
        self.cluster.write_manifest()
        if self.membership is not None:  # lead this broker's share before serving
            # the registry's topic exists from the start: its partition's lease elects the writer
            await self.schemas_topic.ensure_in_cluster()
            await self.membership.start()
        await self.schemas.load()  # before the listener: the produce gate needs every schema id
        self.schemas.start_tailing()  # records other writers append to _schemas
        self.groups.start()
        self.consumer_groups.start()
        if self.membership is None:  # cluster mode: per slot, as the membership takes them
            await self.transactions.recover()  # before the listener: no transaction half-done
        self.transactions.start()
        await self.kafka.start(self.config.listener_list())
        await self.admin.start(self.config.admin_host, self.config.admin_port)
        await self.registry.start(self.config.host, self.config.registry_port)
        await self.catalog.start(self.config.host, self.config.catalog_port)
        self.retention.start()
        if self.compactor is not None:
            self.compactor.start()
        log.info(
            "icefall broker up: kafka %s, admin http://%s:%d (authentication %s), "
            "schema registry %s (authentication %s), object store %s, home %s",
            ", ".join(
                f"{x} ({x.protocol}, advertised {x.advertised_host}:{x.advertised_port})"
                for x in self.config.listener_list()
            ),
            self.config.admin_host,
            self.config.admin_port,
            self.config.admin_authentication_method,
            self.config.registry_url,
            self.config.registry_authentication_method,
            self.store.describe(),
            self.config.home,
        )
        log.info(
            "iceberg REST catalog %s (authentication %s), warehouse %s",
            self.config.catalog_url,
            self.config.catalog_authentication_method,
            self.config.catalog_warehouse,
        )

    async def stop(self) -> None:
        if self.compactor is not None:  # its pass in progress ends first: nothing to hand over
            await self.compactor.close()
        if self.membership is not None:
            # hand the partitions over while the listener still answers (NOT_LEADER_OR_FOLLOWER:
            # clients ask Metadata again and go to the new leaders), then leave the cluster
            await self.membership.handover()
        for name, close in self._closers():
            log.debug("stopping the %s", name)
            await close()
        if self.membership is not None:
            await self.membership.deregister()
        self.metadata.close()
        log.info("icefall broker stopped")

    def _closers(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        return [
            ("segment retention", self.retention.close),
            ("catalog", self.catalog.close),
            ("registry", self.registry.close),
            ("registry store", self.schemas.close),
            ("admin API", self.admin.close),
            ("kafka listener", self.kafka.close),
            ("group coordinator", self.groups.close),
            ("consumer group coordinator", self.consumer_groups.close),
            ("transaction coordinator", self.transactions.close),
            ("logs", self.logs.close),
        ]


def endpoints(config: BrokerConfig) -> dict[str, Any]:
    """What this broker tells the cluster about itself: each listener's advertised
    [host, port] by listener name, and the URLs of its HTTP services."""
    out: dict[str, Any] = {
        x.name: [x.advertised_host, x.advertised_port] for x in config.listener_list()
    }
    out.update(admin=config.admin_url, registry=config.registry_url, catalog=config.catalog_url)
    return out


def _log_tasks() -> None:
    """SIGUSR1: log where every task is waiting (for a broker that seems stuck)."""
    import io

    for task in asyncio.all_tasks():
        out = io.StringIO()
        task.print_stack(limit=12, file=out)
        log.warning("task %s:\n%s", task.get_name(), out.getvalue())


def check_locations(config: BrokerConfig) -> None:
    """The S3 object store and warehouse checked once before anything starts; what is wrong is
    logged with the setting named (``objectstore.check_s3_location``)."""
    from broker.config import object_store_from_env
    from broker.storage.objectstore import check_s3_location

    places = []
    if config.store.is_s3:
        places.append((config.store, "object.store"))
    if (config.catalog.builtin or config.catalog.type == "glue") and (
        config.catalog_warehouse.startswith("s3")
    ):
        places.append(
            (
                object_store_from_env(config.catalog_warehouse),
                "automq.table.topic.catalog.warehouse",
            )
        )
    if config.catalog.type == "tablebucket":
        from broker.external_catalogs import tablebucket

        spec = config.tables_catalog
        if (problem := tablebucket.check(spec.warehouse or "", spec.properties)) is not None:
            log.log(*problem)
    for place, setting in places:
        problem = check_s3_location(
            place.url,
            setting,
            place.endpoint_url,
            place.region,
            place.access_key_id,
            place.secret_access_key,
        )
        if problem is not None:
            log.log(*problem)
    if config.catalog.type == "glue":
        from broker.catalog.glue_check import glue_problem

        if (problem := glue_problem(config.tables_catalog)) is not None:
            log.log(*problem)


async def serve(config: BrokerConfig, ready_file: str | None = None) -> None:
    check_locations(config)
    broker = Broker(config)
    await broker.start()
    if ready_file:
        with open(ready_file, "w") as fh:  # noqa: ASYNC230 -- once, before serving: nothing to block
            fh.write(str(os.getpid()))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _log_tasks)
    await stop.wait()
    await broker.stop()
