"""The replica-placement APIs, answered as a single-node Apache Kafka cluster answers them:
ListPartitionReassignments, AlterPartitionReassignments, ElectLeaders, DescribeLogDirs.

Icefall keeps one copy of each partition (durability comes from the WAL and the object store),
on this broker. So there is never a reassignment in progress, the one replica is always the
preferred leader, and the one "log dir" is the broker's WAL directory. Admin tools
(``kafka-reassign-partitions``, ``kafka-leader-election``, ``kafka-log-dirs``) and clients
that call these APIs get the answers Kafka would give them instead of a closed connection.

In a cluster (Postgres metadata) a partition still has one replica, its leader, and
AlterPartitionReassignments to one live broker moves the leadership there (``mover``: the
membership's move, as ``icefall cluster move``); no data is copied.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from broker.config import BrokerConfig
from broker.kafka.codec import Responder
from broker.storage.logstore import LogStore, PartitionLog

PREFERRED, UNCLEAN = 0, 1  # ElectLeaders' election types


def _partition_bytes(part: PartitionLog) -> int:
    """The partition's bytes: its indexed chunks and the batches still in the WAL."""
    return sum(c.byte_end - c.byte_start for c in part.chunks) + sum(len(b.data) for b in part.tail)


def _wal_and_usage(config: BrokerConfig) -> tuple[Path, Any]:
    """The WAL directory and its disk's usage (file system calls: run off the event loop)."""
    wal = Path(config.wal_dir).resolve()
    return wal, shutil.disk_usage(wal if wal.exists() else config.home)


class ReplicaApis:
    config: BrokerConfig
    logs: LogStore
    # cluster mode (broker/membership.py's move): a partition's leadership to a live broker;
    # None when done, else why not
    mover: Callable[[str, int, int | None], Awaitable[str | None]] | None = None

    def _topic_partitions(self, topic: str) -> list[int]:
        known = getattr(self, "cluster", None)
        if self.mover is not None and known is not None and topic in known.topics:
            return list(range(known.topics[topic].partitions))  # cluster mode: led anywhere
        return sorted(p for (t, p) in self.logs.partitions if t == topic)

    async def list_partition_reassignments(self, ctx: Any, req: Any, R: Responder) -> Any:
        """Nothing is ever being reassigned."""
        return R(throttle_time=0, error_code=ErrorCode.none, error_message=None, topics=[])

    async def alter_partition_reassignments(self, ctx: Any, req: Any, R: Responder) -> Any:
        """A reassignment to this broker alone is already complete; one naming another broker
        names a broker that does not exist; a cancellation finds nothing to cancel."""
        responses = []
        for topic in req.topics:
            known = set(self._topic_partitions(topic.name))
            partitions = []
            for p in topic.partitions:
                code, message = ErrorCode.none, None
                if p.partition_index not in known:
                    code = ErrorCode.unknown_topic_or_partition
                    message = f"{topic.name}-{p.partition_index} does not exist"
                elif p.replicas is None:
                    code = ErrorCode.no_reassignment_in_progress
                    message = "there is no reassignment in progress to cancel"
                elif self.mover is not None and len(p.replicas) == 1:
                    # cluster mode: one replica, the leader; moving it moves leadership only
                    problem = await self.mover(topic.name, p.partition_index, int(p.replicas[0]))
                    if problem is not None:
                        code, message = ErrorCode.invalid_replica_assignment, problem
                elif list(p.replicas) != [self.config.node_id]:
                    code = ErrorCode.invalid_replica_assignment
                    message = (
                        f"replicas {list(p.replicas)}: this cluster has one broker, "
                        f"{self.config.node_id}, and one replica per partition"
                    )
                partitions.append(
                    {
                        "partition_index": p.partition_index,
                        "error_code": code,
                        "error_message": message,
                    }
                )
            responses.append({"name": topic.name, "partitions": partitions})
        return R(
            throttle_time=0, error_code=ErrorCode.none, error_message=None, responses=responses
        )

    async def elect_leaders(self, ctx: Any, req: Any, R: Responder) -> Any:
        """Every partition's one replica leads already: ELECTION_NOT_NEEDED for each partition
        named; for all partitions (null), nothing was elected, so nothing is listed (as Kafka)."""
        results = []
        for tp in req.topic_partitions or ():
            known = set(self._topic_partitions(tp.topic))
            results.append(
                {
                    "topic": tp.topic,
                    "partition_result": [
                        {
                            "partition_id": p,
                            "error_code": ErrorCode.election_not_needed
                            if p in known
                            else ErrorCode.unknown_topic_or_partition,
                            "error_message": None
                            if p in known
                            else f"{tp.topic}-{p} does not exist",
                        }
                        for p in tp.partitions
                    ],
                }
            )
        return R(throttle_time=0, error_code=ErrorCode.none, replica_election_results=results)

    async def describe_log_dirs(self, ctx: Any, req: Any, R: Responder) -> Any:
        """One log dir, the WAL's, with each partition's bytes (chunks in the object store plus
        its WAL tail) and the disk's total and usable bytes."""
        wanted: dict[str, set[int]] | None = (
            None if req.topics is None else {t.topic: set(t.partitions) for t in req.topics}
        )
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), part in sorted(self.logs.partitions.items()):
            if wanted is not None and partition not in wanted.get(topic, ()):
                continue
            by_topic.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "partition_size": _partition_bytes(part),
                    "offset_lag": 0,
                    "is_future_key": False,
                }
            )
        wal, usage = await asyncio.to_thread(_wal_and_usage, self.config)
        return R(
            throttle_time=0,
            error_code=ErrorCode.none,
            results=[
                {
                    "error_code": ErrorCode.none,
                    "log_dir": str(wal),
                    "topics": [
                        {"name": name, "partitions": parts} for name, parts in by_topic.items()
                    ],
                    "total_bytes": usage.total,
                    "usable_bytes": usage.free,
                }
            ],
        )
