"""The cluster's assignment as the admin API serves it and ``icefall cluster`` shows and
changes it: the live brokers, each partition's leader and lease epoch, and an operator's move.

``GET /v1/cluster/assignment`` answers ``Assignment``; ``POST /v1/cluster/assignment`` takes a
``Move`` (the partition's ``preferred_node`` in ``partition_leases``): the leader hands it over
on its next heartbeat and the broker named takes it on its own (leadership only: no data is
copied, every broker reads the partition from the shared object store and Postgres index).
Models in the manner of ``broker.contracts``: both ends parse the same definition.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from broker.admin_client import AdminClient

ASSIGNMENT_PATH = "/v1/cluster/assignment"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class BrokerEntry(_Model):
    node_id: int
    rack: str | None = None
    endpoints: dict[str, Any] = Field(default_factory=dict)


class PartitionEntry(_Model):
    topic: str
    partition: int
    leader: int  # -1: no live broker holds its lease
    epoch: int  # the lease's fencing epoch (Metadata's leader epoch); -1: never leased
    preferred: int | None = None  # an operator's move, while that broker is live


class Assignment(_Model):
    node_id: int  # the broker that answered
    controller_id: int
    brokers: list[BrokerEntry]
    partitions: list[PartitionEntry]


class Move(_Model):
    topic: str
    partition: int = Field(ge=0)
    node_id: int | None = Field(
        description="the broker to lead the partition; null: no preference any more"
    )


def get_assignment(admin_url: str, timeout: float = 10.0) -> Assignment:
    """BrokerError (its message the broker's) when it answers with an error or not at all."""
    return Assignment.model_validate(AdminClient(admin_url, timeout).get(ASSIGNMENT_PATH))


def post_move(admin_url: str, move: Move, timeout: float = 10.0) -> dict[str, Any]:
    """The broker's answer to a move; BrokerError with its message when refused."""
    answer: dict[str, Any] = AdminClient(admin_url, timeout).post(
        ASSIGNMENT_PATH, move.model_dump(mode="json")
    )
    return answer


def render(assignment: Assignment) -> str:
    """``icefall cluster``'s table: the brokers, then each partition's leader and epoch."""
    lines = [f"controller {assignment.controller_id} (asked broker {assignment.node_id})", ""]
    lines.append(f"{'BROKER':>6}  {'RACK':<10} ENDPOINTS")
    for b in assignment.brokers:
        kafka = ", ".join(
            f"{name}={v[0]}:{v[1]}"
            for name, v in sorted(b.endpoints.items())
            if isinstance(v, list)
        )
        lines.append(f"{b.node_id:>6}  {b.rack or '-':<10} {kafka}")
    lines.append("")
    lines.append(f"{'TOPIC':<32} {'PARTITION':>9} {'LEADER':>6} {'EPOCH':>6}  PREFERRED")
    for p in assignment.partitions:
        lines.append(
            f"{p.topic:<32} {p.partition:>9} {p.leader:>6} {p.epoch:>6}  "
            f"{'-' if p.preferred is None else p.preferred}"
        )
    return "\n".join(lines)
