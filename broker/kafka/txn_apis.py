"""The transaction APIs of the Kafka listener: AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit, EndTxn (InitProducerId and FindCoordinator live with the others).

Error codes as Kafka returns them per version: clients older than PRODUCER_FENCED (KIP-588)
get INVALID_PRODUCER_EPOCH instead.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from kio.schema.errors import ErrorCode

from broker.kafka.acl_apis import AclApis, denied_message
from broker.kafka.authorizer import CLUSTER_NAME, Operation, ResourceType
from broker.kafka.codec import Responder, field
from broker.kafka.consumer_groups import ConsumerGroupCoordinator
from broker.kafka.groups import GroupCoordinator
from broker.kafka.transactions import TransactionCoordinator
from broker.ownership import KEY_GROUP, Ownership

KNOWN_STATES = {
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
}

# The first version of each API that may answer PRODUCER_FENCED.
FENCED_FROM = {22: 4, 24: 2, 25: 2, 26: 2, 28: 3}


def fenced_for(api_key: int, version: int, error: int) -> int:
    if error == ErrorCode.producer_fenced and version < FENCED_FROM.get(api_key, 0):
        return ErrorCode.invalid_producer_epoch
    return error


class TransactionApis(AclApis):
    ownership: Ownership
    transactions: TransactionCoordinator
    groups: GroupCoordinator
    consumer_groups: ConsumerGroupCoordinator

    async def add_partitions_to_txn(self, ctx: Any, req: Any, R: Responder) -> Any:
        """v4+ is the brokers' (verify-only) form: CLUSTER_ACTION on the cluster, as Kafka.
        Before: WRITE on the transactional id and on each topic; a topic refused fails the
        request, its partitions TOPIC_AUTHORIZATION_FAILED and the others
        OPERATION_NOT_ATTEMPTED, as Kafka answers."""
        if R.version >= 4:
            if not self.allowed(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
                return R.error(
                    ErrorCode.cluster_authorization_failed,
                    denied_message(ResourceType.CLUSTER, CLUSTER_NAME),
                )
            results = []
            for txn in req.transactions:
                by_topic = await self._add_partitions(
                    R,
                    txn.transactional_id,
                    txn.producer_id,
                    txn.producer_epoch,
                    txn.topics,
                    bool(txn.verify_only),
                )
                results.append(
                    {"transactional_id": txn.transactional_id, "topic_results": by_topic}
                )
            return R(error_code=ErrorCode.none, results_by_transaction=results)
        refused = self._add_partitions_refusal(ctx, R, req)
        if refused is not None:
            return R(results_by_topic_v3_and_below=refused)
        by_topic = await self._add_partitions(
            R,
            req.v3_and_below_transactional_id,
            req.v3_and_below_producer_id,
            req.v3_and_below_producer_epoch,
            req.v3_and_below_topics,
            False,
        )
        return R(results_by_topic_v3_and_below=by_topic)

    def _add_partitions_refusal(
        self, ctx: Any, R: Responder, req: Any
    ) -> list[dict[str, Any]] | None:
        tid = req.v3_and_below_transactional_id
        topics = req.v3_and_below_topics
        if not self.allowed(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            codes = {t.name: ErrorCode.transactional_id_authorization_failed for t in topics}
        else:
            codes = {
                t.name: ErrorCode.topic_authorization_failed
                for t in topics
                if not self.topic_allowed(ctx, R, t.name)
            }
            if not codes:
                return None
        return [
            {
                "name": t.name,
                "results_by_partition": [
                    {
                        "partition_index": p,
                        "partition_error_code": codes.get(
                            t.name, ErrorCode.operation_not_attempted
                        ),
                    }
                    for p in t.partitions
                ],
            }
            for t in topics
        ]

    async def _add_partitions(
        self,
        R: Responder,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        topics: Any,
        verify_only: bool,
    ) -> list[dict[str, Any]]:
        wanted = [(t.name, p) for t in topics for p in t.partitions]
        errors = await self.transactions.add_partitions(
            transactional_id, producer_id, epoch, wanted, verify_only
        )
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, p), error in errors.items():
            by_topic.setdefault(topic, []).append(
                {"partition_index": p, "partition_error_code": fenced_for(24, R.version, error)}
            )
        return [{"name": t, "results_by_partition": parts} for t, parts in by_topic.items()]

    async def add_offsets_to_txn(self, ctx: Any, req: Any, R: Responder) -> Any:
        error = await self.transactions.add_offsets(
            req.transactional_id, req.producer_id, req.producer_epoch, req.group_id
        )
        return R(error_code=fenced_for(25, R.version, error))

    async def txn_offset_commit(self, ctx: Any, req: Any, R: Responder) -> Any:
        """WRITE on the transactional id, READ on the group (each refusal for every partition)
        and READ on each topic (TOPIC_AUTHORIZATION_FAILED for its partitions), as Kafka."""
        await self.transactions.refresh_foreign(req.transactional_id)  # cluster mode
        refusal = None
        if not self.allowed(
            ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id
        ):
            refusal = ErrorCode.transactional_id_authorization_failed
        elif not self.group_allowed(ctx, R, req.group_id):
            refusal = ErrorCode.group_authorization_failed
        unreadable = {t.name for t in req.topics if not self.topic_allowed(ctx, R, t.name)}
        if refusal is not None or unreadable:
            return R(
                topics=[
                    {
                        "name": t.name,
                        "partitions": [
                            {
                                "partition_index": p.partition_index,
                                "error_code": refusal
                                or (
                                    ErrorCode.topic_authorization_failed
                                    if t.name in unreadable
                                    else ErrorCode.operation_not_attempted
                                ),
                            }
                            for p in t.partitions
                        ],
                    }
                    for t in req.topics
                ]
            )
        generation = field(req, "generation_id", -1)
        member_id = field(req, "member_id", "")
        if self.consumer_groups.is_consumer_group(req.group_id):  # a KIP-848 member's epoch
            error = self.consumer_groups.validate_offset_commit(
                req.group_id, member_id, generation, R.version, transactional=True
            )
        else:
            error = self.groups.validate_member(
                req.group_id,
                generation,
                member_id,
                field(req, "group_instance_id"),
                transactional=True,
            )
        offsets = [
            (
                t.name,
                p.partition_index,
                p.committed_offset,
                field(p, "committed_leader_epoch", -1),
                p.committed_metadata,
            )
            for t in req.topics
            for p in t.partitions
        ]
        if error == ErrorCode.none:
            error = await self.transactions.txn_offset_commit(
                req.transactional_id,
                req.producer_id,
                req.producer_epoch,
                req.group_id,
                offsets,
                self.ownership.slot_fence(KEY_GROUP, req.group_id),
            )
        error = fenced_for(28, R.version, error)
        return R(
            topics=[
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p.partition_index, "error_code": error}
                        for p in t.partitions
                    ],
                }
                for t in req.topics
            ]
        )

    async def end_txn(self, ctx: Any, req: Any, R: Responder) -> Any:
        error = await self.transactions.end_txn(
            req.transactional_id, req.producer_id, req.producer_epoch, bool(req.committed)
        )
        return R(error_code=fenced_for(26, R.version, error), producer_id=-1, producer_epoch=-1)

    # ------------------------------------------------------------ admin (kafka-transactions.sh)

    async def describe_transactions(self, ctx: Any, req: Any, R: Responder) -> Any:
        states = []
        for tid, record in zip(
            req.transactional_ids,
            self.transactions.describe(req.transactional_ids),
            strict=True,
        ):
            describable = self.allowed(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid)
            if record is None or not describable:
                states.append(
                    {
                        "error_code": ErrorCode.transactional_id_not_found
                        if describable
                        else ErrorCode.transactional_id_authorization_failed,
                        "transactional_id": tid,
                        "transaction_state": "",
                        "transaction_timeout": 0,
                        "transaction_start_time": _time(-1),
                        "producer_id": -1,
                        "producer_epoch": -1,
                        "topics": [],
                    }
                )
                continue
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(record.partitions):
                by_topic.setdefault(topic, []).append(partition)
            states.append(
                {
                    "error_code": ErrorCode.none,
                    "transactional_id": tid,
                    "transaction_state": record.state,
                    "transaction_timeout": record.timeout_ms,
                    "transaction_start_time": _time(record.start_ms),
                    "producer_id": record.producer_id,
                    "producer_epoch": record.producer_epoch,
                    "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
                }
            )
        return R(transaction_states=states)

    async def list_transactions(self, ctx: Any, req: Any, R: Responder) -> Any:
        wanted_states = set(req.state_filters)
        pids = set(req.producer_id_filters)
        longer_than = field(req, "duration_filter", -1)
        now = int(time.time() * 1000)
        listed = [
            {
                "transactional_id": r.transactional_id,
                "producer_id": r.producer_id,
                "transaction_state": r.state,
            }
            for r in self.transactions.txns.values()
            if self.allowed(
                ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, r.transactional_id
            )
            and (not wanted_states or r.state in wanted_states)
            and (not pids or r.producer_id in pids)
            and (longer_than < 0 or (r.start_ms >= 0 and now - r.start_ms > longer_than))
        ]
        return R(
            error_code=ErrorCode.none,
            unknown_state_filters=sorted(wanted_states - KNOWN_STATES),
            transaction_states=listed,
        )


def _time(ms: int) -> datetime.datetime:
    """A Kafka timestamp as kio writes it (no start yet: the epoch, as it has no -1)."""
    return datetime.datetime.fromtimestamp(max(ms, 0) / 1000, datetime.UTC)
