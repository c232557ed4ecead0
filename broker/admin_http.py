"""The admin HTTP API (JSON) the commit coordinator uses.

Offsets per table topic and partition, "the last offset appended before T",
and the segment byte ranges covering an offset range: everything a commit
round needs to plan its work without speaking Kafka.

Every answer is a model of ``broker.contracts`` dumped to JSON, the models
``broker.admin_client`` parses them with: the two ends cannot disagree on a
field name.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from broker import contracts, manifest, names, topic_configs
from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.http_security.admin_auth import AdminAuth
from broker.http_service import HttpService
from broker.security.stats import AuthStats
from broker.storage import index_view
from broker.storage.logstore import LogStore, PartitionLog

if TYPE_CHECKING:
    from broker.membership import Membership
    from broker.metrics import CatalogReader


class LiveBrokers(Protocol):
    """What ``GET /v1/cluster`` needs of ``broker.storage.leases.Leases`` (cluster mode)."""

    def live_brokers(self) -> list[Any]: ...


def _answer(model: contracts.Contract, status: int = 200) -> web.Response:
    return web.json_response(model.to_json(), status=status)


def _error(status: int, message: str) -> web.Response:
    return _answer(contracts.ErrorAnswer(error_code=status, message=message), status=status)


def end_offset_before(part: PartitionLog, append_ms: int) -> tuple[int, bool]:
    """(first offset whose append time is >= append_ms, whether every batch
    appended before append_ms is already in a segment object)."""
    end = part.log_start_offset
    for chunk in part.chunks:
        if chunk.min_append_ms >= append_ms:
            return end, True
        for ref in chunk.batches():
            if ref.append_ms >= append_ms:
                return ref.base_offset, True
        end = chunk.end_offset
    flushed = True
    for batch in part.tail:
        if batch.append_ms >= append_ms:
            break
        end, flushed = batch.end_offset, False
    return end, flushed


def ranges_for(part: PartitionLog, start: int, end: int) -> list[contracts.ObjectRange]:
    """Object byte ranges covering [start, end): whole batches, so the first
    range may begin before ``start`` and readers skip the extra records."""
    out: list[contracts.ObjectRange] = []
    if start >= end:
        return out
    i = max(bisect.bisect_right(part.chunk_bases, start) - 1, 0)
    for chunk in part.chunks[i:]:
        if chunk.base_offset >= end:
            break
        if chunk.end_offset <= start:
            continue
        refs = chunk.refs
        first = max(bisect.bisect_right(chunk.ref_bases, start) - 1, 0)
        last = bisect.bisect_left(chunk.ref_bases, end)
        selected = refs[first:last]
        out.append(
            contracts.ObjectRange(
                object_key=chunk.object_key,
                byte_start=chunk.byte_start + selected[0].position,
                byte_end=chunk.byte_start + selected[-1].position + selected[-1].size,
                first_offset=selected[0].base_offset,
                end_offset=min(
                    chunk.end_offset,
                    refs[last].base_offset if last < len(refs) else chunk.end_offset,
                ),
                max_append_ms=max(r.append_ms for r in selected),
            )
        )
    return out


parse_offsets = contracts.PendingRequest.parse_offsets
CLUSTER_FLUSH_NOTE = (
    "cluster mode: nothing to flush, every acknowledged batch is already in a segment object "
    "and the index"
)


class AdminApi(HttpService):
    # the broker's reader of the tables' catalog (Broker.tables); unset: one through pyiceberg
    tables: CatalogReader | None = None
    # cluster mode: the live brokers, from the leases' table (Broker sets it)
    members: LiveBrokers | None = None
    # cluster mode: the membership loop (the assignment routes); None: one broker alone
    membership: Membership | None = None

    def __init__(
        self,
        config: BrokerConfig,
        cluster: Cluster,
        logs: LogStore,
        auth: AuthStats | None = None,
        login: AdminAuth | None = None,
    ) -> None:
        """``auth``: the Kafka listeners' authentication figures (for /metrics); ``login``: the
        admin API's own basic auth (``admin.authentication.method=BASIC``), None when open."""
        # the HTTP services that require credentials, by name: their failed logins on /metrics
        self.http_auth: dict[str, Any] = {} if login is None else {"admin": login}
        self.config = config
        self.cluster = cluster
        self.logs = logs
        self.auth = auth
        self.app = web.Application(middlewares=[] if login is None else [login.middleware])
        self.app.add_routes(
            [
                web.get("/healthz", self.health),
                web.get("/v1/cluster", self.cluster_info),
                web.get("/v1/table-topics", self.table_topics),
                web.get("/v1/topics/{topic}/offsets", self.offsets),
                web.get("/v1/topics/{topic}/plan", self.plan),
                web.get("/v1/topics/{topic}/partitions/{partition}/ranges", self.ranges),
                web.get("/v1/topics/{topic}/pending", self.pending),
                web.post("/v1/flush", self.flush),
                web.get("/metrics", self.metrics),
                web.get("/v1/retention", self.retention),
                web.get("/v1/cluster/assignment", self.assignment),
                web.post("/v1/cluster/assignment", self.move),
            ]
        )

    async def health(self, request: web.Request) -> web.Response:
        failure = self.logs.wal.failure
        # 503 while the WAL cannot write (a full disk): produces are refused meanwhile and
        # accepted again once it has written what it queued (broker/storage/wal.py); the rest
        # of the broker serves on, so a restart would not help.
        return _answer(
            contracts.Health(
                status="ok" if failure is None else f"wal failed: {failure}",
                object_store=self.logs.store.describe(),
                segments_written=self.logs.segments_written,
                flush_failures=self.logs.flush_failures,
                unflushed_bytes=self.logs.unflushed_bytes,
                max_unflushed_bytes=self.logs.max_unflushed_bytes,
                produces_held=self.logs.produces_held,
            ),
            status=200 if failure is None else 503,
        )

    async def retention(self, request: web.Request) -> web.Response:
        """Segment retention since the broker started: what it deleted, and the table topic
        partitions whose uncommitted records hold it back (the warning's figures)."""
        return _answer(self.logs.retention.answer())

    async def cluster_info(self, request: web.Request) -> web.Response:
        """Where the other services are: a commit round needs only the admin URL to find them.
        Object store credentials are never served: jobs take them from their own environment."""
        return _answer(
            contracts.ClusterInfo(
                cluster_id=self.config.cluster_id,
                bootstrap=self.config.bootstrap,
                registry_url=self.config.registry_url,
                catalog_url=self.config.tables_catalog.uri,
                object_store=self.config.store.url,
                object_store_endpoint=self.config.store.endpoint_url,
                warehouse=self.config.catalog_warehouse
                if self.config.catalog.builtin
                else self.config.warehouse,
                catalog=self.config.tables_catalog.without_secrets(),
                node_id=self.config.node_id,
                brokers=await self._members(),
            )
        )

    async def _members(self) -> list[contracts.ClusterMember]:
        """The live brokers, from Postgres (cluster mode; one broker: none)."""
        if self.members is None:
            return []
        live = await asyncio.to_thread(self.members.live_brokers)
        return sorted(
            (
                contracts.ClusterMember(
                    node_id=b.node_id,
                    endpoints=json.loads(b.endpoints)
                    if isinstance(b.endpoints, str)
                    else dict(b.endpoints),
                    rack=b.rack,
                )
                for b in live
            ),
            key=lambda m: m.node_id,
        )

    async def assignment(self, request: web.Request) -> web.Response:
        """The live brokers and each partition's leader and lease epoch (cluster mode)."""
        if self.membership is None:
            return _error(404, "not a cluster: this broker keeps its metadata in SQLite, alone")
        return web.json_response(self.membership.assignment().model_dump(mode="json"))

    async def move(self, request: web.Request) -> web.Response:
        """Move a partition to a broker (``assignment.Move``): its preferred node is set; the
        leader hands it over on its next heartbeat and the broker named takes it."""
        from pydantic import ValidationError

        from broker.assignment import Move

        if self.membership is None:
            return _error(404, "not a cluster: this broker keeps its metadata in SQLite, alone")
        try:
            move = Move.model_validate_json(await request.read())
        except ValidationError as exc:
            return _error(400, f"a move is {{topic, partition, node_id}}: {exc}")
        problem = await self.membership.move(move.topic, move.partition, move.node_id)
        if problem is not None:
            return _error(400, problem)
        return web.json_response(
            {"topic": move.topic, "partition": move.partition, "preferred": move.node_id}
        )

    async def table_topics(self, request: web.Request) -> web.Response:
        """The manifest file (``broker.manifest``), as written: ``exclude_unset`` keeps the keys it has."""
        answer = contracts.Manifest.model_validate(manifest.read(self.config.manifest_path))
        return web.json_response(answer.model_dump(mode="json", exclude_unset=True))

    def _topic(self, request: web.Request) -> Any:
        topic = self.cluster.topics.get(request.match_info["topic"])
        if topic is None:
            missing = contracts.ErrorAnswer(
                error_code=404, message=f"topic {request.match_info['topic']} does not exist"
            )
            raise web.HTTPNotFound(
                text=json.dumps(missing.to_json()), content_type="application/json"
            )
        return topic

    @property
    def clustered(self) -> bool:
        """Cluster mode (metadata in Postgres): this broker's log holds only what it leads."""
        return self.config.metadata_uri is not None

    async def _partitions(self, topic: Any) -> dict[int, PartitionLog]:
        """Every partition of ``topic``: this broker's log of those it leads, the segment
        index's view (``broker.storage.index_view``) of the others in cluster mode, where
        the index holds every acknowledged batch. One broker: its log (a partition being
        created is left out)."""
        found = {
            p: part
            for p in range(topic.partitions)
            if (part := self.logs.partitions.get((topic.name, p))) is not None
        }
        missing = [p for p in range(topic.partitions) if p not in found]
        if missing and self.clustered:
            found.update(await asyncio.to_thread(self._views, topic.name, missing))
        return dict(sorted(found.items()))

    def _view_between(
        self, topic: str, partition: int, start: int, end: int
    ) -> tuple[PartitionLog, int]:
        """The index's view with only the chunks holding [start, end), and the indexed end."""
        view = index_view.partition_view(self.logs.metadata, topic, partition, (start, end))
        return view, index_view.end_offset(self.logs.metadata, topic, partition)

    def _views(self, topic: str, partitions: list[int]) -> dict[int, PartitionLog]:
        return {p: index_view.partition_view(self.logs.metadata, topic, p) for p in partitions}

    async def offsets(self, request: web.Request) -> web.Response:
        topic = self._topic(request)
        partitions = []
        for p, part in (await self._partitions(topic)).items():
            partitions.append(
                contracts.PartitionOffsets(
                    partition=p,
                    log_start_offset=part.log_start_offset,
                    high_watermark=part.high_watermark,
                    flushed_offset=part.flushed_offset,
                    last_append_ms=(
                        part.tail[-1].append_ms
                        if part.tail
                        else part.chunks[-1].max_append_ms
                        if part.chunks
                        else None
                    ),
                    last_stable_offset=part.last_stable_offset,
                )
            )
        return _answer(
            contracts.TopicOffsets(
                topic=topic.name,
                topic_id=str(topic.topic_id),
                table_topic=topic_configs.is_table_topic(topic.configs),
                partitions=partitions,
            )
        )

    async def plan(self, request: web.Request) -> web.Response:
        """Per partition: the end offset for ``until_append_ms`` (exclusive) or
        the current flushed end, never past the last stable offset, and whether the
        broker has flushed that far. Asked for a time its clock has not reached (a
        commit run started ahead of its interval's end, or a clock ahead of the
        broker's), it reports no partition flushed: a batch appended before that time
        may still come, so the end offsets are not final."""
        now_ms = int(time.time() * 1000)
        topic = self._topic(request)
        until = request.query.get("until_append_ms")
        try:
            asked = contracts.PlanRequest(until_append_ms=int(until) if until is not None else None)
        except ValueError:
            return _error(400, f"until_append_ms must be an integer, got {until!r}")
        partitions = []
        for p, part in (await self._partitions(topic)).items():
            # never past an open transaction: what is below the LSO is decided for good
            lso = part.last_stable_offset
            if asked.until_append_ms is None:
                end, flushed = min(part.flushed_offset, lso), part.flushed_offset >= lso
            else:
                end, flushed = end_offset_before(part, asked.until_append_ms)
                end = min(end, lso)
                flushed = (flushed or part.flushed_offset >= end) and (
                    asked.until_append_ms <= now_ms
                )
            partitions.append(
                contracts.PartitionPlan(
                    partition=p,
                    log_start_offset=part.log_start_offset,
                    end_offset=end,
                    flushed=flushed,
                    high_watermark=part.high_watermark,
                    last_stable_offset=lso,
                )
            )
        return _answer(
            contracts.TopicPlan(
                topic=topic.name,
                until_append_ms=asked.until_append_ms,
                partitions=partitions,
                broker_time_ms=now_ms,
            )
        )

    async def ranges(self, request: web.Request) -> web.Response:
        topic = self._topic(request)
        try:
            asked = contracts.RangesRequest(
                partition=int(request.match_info["partition"]),
                start=int(request.query["start"]),
                end=int(request.query["end"]),
            )
        except (KeyError, ValueError):
            return _error(400, "need integer partition, start and end")
        partition, start, end = asked.partition, asked.start, asked.end
        if not 0 <= partition < topic.partitions:
            return _error(404, f"partition {partition} of {topic.name} does not exist")
        part = self.logs.partitions.get((topic.name, partition))
        flushed = part.flushed_offset if part is not None else 0
        if part is None and self.clustered:  # only the chunks holding [start, end)
            part, flushed = await asyncio.to_thread(
                self._view_between, topic.name, partition, start, end
            )
        if part is None:
            return _error(404, f"partition {partition} of {topic.name} does not exist")
        if start < part.log_start_offset:
            return _error(416, f"offset {start} is before the log start {part.log_start_offset}")
        if end > flushed:
            return _error(
                409,
                f"offsets up to {end} are not all in segment objects yet (flushed to {flushed})",
            )
        return _answer(
            contracts.TopicRanges(
                topic=topic.name,
                partition=partition,
                start=start,
                end=end,
                object_store=self.config.store.url,
                ranges=ranges_for(part, start, end),
                aborted_transactions=[
                    contracts.AbortedTransaction(
                        producer_id=pid, first_offset=first, last_offset=last
                    )
                    for pid, first, last in part.aborted_between(start, end)
                ],
            )
        )

    async def pending(self, request: web.Request) -> web.Response:
        """What waits for a table topic's next commit round: per partition, records and bytes from
        the table's committed offset (``from``, a JSON object of offsets, moves the start further:
        a size trigger that already fired up to them) to the end of the log."""
        from broker import metrics
        from broker.checkpoint import NO_CHECKPOINT
        from broker.storage import retention

        topic = self._topic(request)
        try:
            since = parse_offsets(request.query.get("from", "{}"))
        except (ValueError, TypeError):
            return _error(400, 'from must be a JSON object of offsets, e.g. {"0": 120, "1": 98}')
        checkpoint = NO_CHECKPOINT
        if topic_configs.is_table_topic(topic.configs):
            namespace = topic_configs.TableSettings(topic.configs).namespace
            try:
                checkpoint = await asyncio.to_thread(
                    self.reader().checkpoint,
                    namespace,
                    names.table_name(topic.name),
                )
            except Exception as exc:  # noqa: BLE001 -- any catalog failure: the caller asks again later
                return _error(
                    503,
                    f"the catalog cannot say what {topic.name}'s table holds: "
                    f"{type(exc).__name__}: {exc}",
                )
        committed = retention.committed_offsets(checkpoint, str(topic.topic_id))
        partitions = []
        for p, part in (await self._partitions(topic)).items():
            start = max(
                contracts.lag_start(committed.get(p), part.log_start_offset), since.get(p, 0)
            )
            records, size = metrics.pending_in(part, start)
            partitions.append(
                contracts.PartitionPending(
                    partition=p,
                    start_offset=start,
                    end_offset=part.high_watermark,
                    records=records,
                    bytes=size,
                )
            )
        return _answer(
            contracts.Pending(
                topic=topic.name,
                committed_offsets=committed,
                records=sum(p.records for p in partitions),
                bytes=sum(p.bytes for p in partitions),
                partitions=partitions,
            )
        )

    async def flush(self, request: web.Request) -> web.Response:
        if self.clustered:
            # acks wait for the segment object and the index: nothing acknowledged is unflushed
            return _answer(contracts.FlushAnswer(bytes_written=0, note=CLUSTER_FLUSH_NOTE))
        written = await self.logs.flush()
        return _answer(contracts.FlushAnswer(bytes_written=written))

    def reader(self) -> CatalogReader:
        from broker import metrics

        return self.tables or metrics.catalog_reader(self.config.tables_catalog)

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text format: the log per partition, and lag per table topic (broker.metrics)."""
        from broker import metrics

        text = await metrics.scrape(self.config, self.cluster, self.logs, self.auth, self.reader())
        text += metrics.authentication_failures(
            {service: auth.failures for service, auth in self.http_auth.items()},
            self.config.node_id if self.clustered else None,
        )
        return web.Response(text=text, headers={"Content-Type": metrics.CONTENT_TYPE})
