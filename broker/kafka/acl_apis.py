"""The ACL APIs (CreateAcls, DescribeAcls, DeleteAcls) and where every other API asks the
authorizer, as Kafka's brokers do.

With ``authorizer.class.name`` empty there is no authorizer: everything is allowed (the
broker's behaviour before ACLs) and the ACL APIs answer SECURITY_DISABLED, as Kafka does.

What each API needs is in tables here, Kafka's "Operations and Resources on Protocols":

* ``REQUEST_CHECKS``: APIs refused as a whole (a group, a transactional id, the cluster named
  once in the request): checked in one place, before the handler runs, and answered with the
  API's error response (``Responder.error``).
* ``TOPIC_OPERATION`` / ``GROUP_OPERATION``: the operation an API needs on each topic or group
  it names; the handler asks ``topic_allowed``/``group_allowed`` per entry, so one refused topic
  gets TOPIC_AUTHORIZATION_FAILED in its own entry and the others are served.

The rest (Metadata's filtering and auto-creation, CreateTopics' cluster-or-topic CREATE,
InitProducerId's idempotent-write rule, configs by resource type) is in the handlers, each
saying which Kafka rule it follows.

The broker's own work never comes through here: the commit round's admin HTTP API, retention
and the registry's ``_schemas`` writes call the log store directly.

``_schemas`` is the schema registry's state: a record appended there is served by the registry,
so over the Kafka listener it would bypass the registry's authentication, roles and checks.
Produce, DeleteRecords and DeleteTopics on it are refused (INVALID_TOPIC_EXCEPTION, as Kafka
refuses appends to its internal topics) unless the principal is a super user of the authorizer
(restoring a backup is an administrator's work); with an authorizer, reading it (Fetch) takes a
super user or an ALLOW on the literal name ``_schemas`` (a ``*`` or prefixed ACL is not enough).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from broker.config import BrokerConfig
from broker.kafka.authorizer import (
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    AclBinding,
    AclError,
    AclFilter,
    Authorizer,
    Operation,
    ResourceType,
    parse_super_users,
)
from broker.kafka.codec import Responder
from broker.storage.metadata import MetadataStore

log = logging.getLogger(__name__)

Op = Operation
RT = ResourceType
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
SCHEMAS_TOPIC = "_schemas"  # broker/registry/store.py's TOPIC

DENIED_CODE = {
    RT.TOPIC: ErrorCode.topic_authorization_failed,
    RT.GROUP: ErrorCode.group_authorization_failed,
    RT.CLUSTER: ErrorCode.cluster_authorization_failed,
    RT.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
}
_NOUN = {
    RT.TOPIC: "topic",
    RT.GROUP: "group",
    RT.CLUSTER: "cluster",
    RT.TRANSACTIONAL_ID: "transactional id",
}


def denied_message(resource_type: ResourceType, name: str) -> str:
    """Kafka's wording (``Not authorized to access topics: [t]``, ...)."""
    if resource_type == RT.CLUSTER:
        return "Cluster authorization failed."
    if resource_type == RT.TRANSACTIONAL_ID:
        return f"Transactional Id authorization failed: {name}"
    return f"Not authorized to access {_NOUN[resource_type]}: {name}"


@dataclass(frozen=True)
class Check:
    """An operation on the one resource a request names (``name`` reads it from the request)."""

    operation: Operation
    resource_type: ResourceType
    name: Callable[[Any], str]


def _cluster(_: Any) -> str:
    return CLUSTER_NAME


def _group(req: Any) -> str:
    return str(req.group_id)


def _txn(req: Any) -> str:
    return str(req.transactional_id)


# API key -> what the whole request needs (in order: the first refused answers).
REQUEST_CHECKS: dict[int, tuple[Check, ...]] = {
    11: (Check(Op.READ, RT.GROUP, _group),),  # JoinGroup
    12: (Check(Op.READ, RT.GROUP, _group),),  # Heartbeat
    13: (Check(Op.READ, RT.GROUP, _group),),  # LeaveGroup
    14: (Check(Op.READ, RT.GROUP, _group),),  # SyncGroup
    25: (Check(Op.WRITE, RT.TRANSACTIONAL_ID, _txn), Check(Op.READ, RT.GROUP, _group)),
    26: (Check(Op.WRITE, RT.TRANSACTIONAL_ID, _txn),),  # EndTxn
    27: (Check(Op.CLUSTER_ACTION, RT.CLUSTER, _cluster),),  # WriteTxnMarkers (brokers')
    29: (Check(Op.DESCRIBE, RT.CLUSTER, _cluster),),  # DescribeAcls
    35: (Check(Op.DESCRIBE, RT.CLUSTER, _cluster),),  # DescribeLogDirs
    43: (Check(Op.ALTER, RT.CLUSTER, _cluster),),  # ElectLeaders
    45: (Check(Op.ALTER, RT.CLUSTER, _cluster),),  # AlterPartitionReassignments
    46: (Check(Op.DESCRIBE, RT.CLUSTER, _cluster),),  # ListPartitionReassignments
    47: (Check(Op.DELETE, RT.GROUP, _group),),  # OffsetDelete (and READ on each topic)
    # DescribeUserScramCredentials / AlterUserScramCredentials (SASL/SCRAM, served once the
    # SASL work is merged): DESCRIBE / ALTER on the cluster, as Kafka.
    50: (Check(Op.DESCRIBE, RT.CLUSTER, _cluster),),
    51: (Check(Op.ALTER, RT.CLUSTER, _cluster),),
    68: (Check(Op.READ, RT.GROUP, _group),),  # ConsumerGroupHeartbeat (and DESCRIBE on topics)
}

# API key -> the operation needed on each topic the request names.
TOPIC_OPERATION: dict[int, Operation] = {
    0: Op.WRITE,  # Produce
    1: Op.READ,  # Fetch
    2: Op.DESCRIBE,  # ListOffsets
    3: Op.DESCRIBE,  # Metadata (auto-creation: CREATE, see metadata())
    8: Op.READ,  # OffsetCommit
    9: Op.DESCRIBE,  # OffsetFetch
    19: Op.CREATE,  # CreateTopics (unless CREATE on the cluster)
    20: Op.DELETE,  # DeleteTopics
    21: Op.DELETE,  # DeleteRecords
    23: Op.DESCRIBE,  # OffsetForLeaderEpoch
    24: Op.WRITE,  # AddPartitionsToTxn
    28: Op.READ,  # TxnOffsetCommit
    37: Op.ALTER,  # CreatePartitions
    47: Op.READ,  # OffsetDelete
    68: Op.DESCRIBE,  # ConsumerGroupHeartbeat's subscribed topics
}

# API key -> the operation needed on each group (or transactional id) the request names.
GROUP_OPERATION: dict[int, Operation] = {
    8: Op.READ,  # OffsetCommit
    9: Op.DESCRIBE,  # OffsetFetch
    10: Op.DESCRIBE,  # FindCoordinator (a transactional id's: DESCRIBE on it)
    15: Op.DESCRIBE,  # DescribeGroups
    16: Op.DESCRIBE,  # ListGroups (unless DESCRIBE on the cluster): the others are left out
    28: Op.READ,  # TxnOffsetCommit
    42: Op.DELETE,  # DeleteGroups
    69: Op.DESCRIBE,  # ConsumerGroupDescribe
}


def open_authorizer(config: BrokerConfig, metadata: MetadataStore) -> Authorizer | None:
    """The authorizer ``authorizer.class.name`` asks for, with the stored ACLs (None: off)."""
    if not config.authorizer_class_name:
        return None
    acls = [AclBinding.of(*row) for row in metadata.acls()]
    log.info(
        "authorizer %s: %d ACLs, super users %s, allow.everyone.if.no.acl.found=%s",
        config.authorizer_class_name,
        len(acls),
        config.super_users or "(none)",
        str(config.allow_everyone_if_no_acl_found).lower(),
    )
    return Authorizer(
        parse_super_users(config.super_users), config.allow_everyone_if_no_acl_found, acls
    )


def client_ip(ctx: Any) -> str:
    """The connection's address as ACLs name it (``ctx.client_host`` is ``/1.2.3.4``)."""
    return str(ctx.client_host).removeprefix("/")


def _row(acl: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    return (
        int(acl.resource_type),
        acl.resource_name,
        int(acl.pattern_type),
        acl.principal,
        acl.host,
        int(acl.operation),
        int(acl.permission),
    )


def _wire_filter(wire: Any) -> AclFilter:
    """The filter of a DescribeAcls request or of one DeleteAcls filter (the same fields)."""
    return AclFilter.of(
        wire.resource_type_filter,
        wire.resource_name_filter,
        wire.pattern_type_filter,
        wire.principal_filter,
        wire.host_filter,
        wire.operation,
        wire.permission_type,
    )


class AclApis:
    """Mixed into KafkaHandlers: the authorizer seam and the three ACL APIs."""

    authorizer: Authorizer | None
    cluster: Any

    # ---- asking

    def allowed(
        self, ctx: Any, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        a = self.authorizer
        return a is None or a.authorize(
            ctx.principal, client_ip(ctx), operation, resource_type, name
        )

    def topic_allowed(self, ctx: Any, R: Responder, topic: str) -> bool:
        operation = TOPIC_OPERATION[R.api_key]
        a = self.authorizer
        if topic == SCHEMAS_TOPIC and operation == Op.READ and a is not None:
            return a.authorize_literal(ctx.principal, client_ip(ctx), operation, RT.TOPIC, topic)
        return self.allowed(ctx, operation, RT.TOPIC, topic)

    def internal_write_refusal(self, ctx: Any, topic: str, what: str) -> str | None:
        """Why a write to ``topic`` (Produce, DeleteRecords, DeleteTopics: ``what``) over the
        Kafka listener is refused with INVALID_TOPIC_EXCEPTION (None: it is not); see the
        module docstring."""
        if topic != SCHEMAS_TOPIC:
            return None
        a = self.authorizer
        if a is not None and ctx.principal in a.super_users:
            return None
        return (
            f"Cannot {what} internal topic {topic}: it holds the schema registry's state, "
            "written through the registry's HTTP API (or by a super user)"
        )

    def group_allowed(self, ctx: Any, R: Responder, group: str) -> bool:
        return self.allowed(ctx, GROUP_OPERATION[R.api_key], RT.GROUP, group)

    def authorized_operations(self, ctx: Any, resource_type: ResourceType, name: str) -> int:
        """KIP-430's bitfield; with no authorizer every operation of the type, as Kafka."""
        a = self.authorizer
        if a is None:
            return sum(1 << op for op in SUPPORTED_OPERATIONS[resource_type])
        return a.authorized_operations(ctx.principal, client_ip(ctx), resource_type, name)

    def guarded(
        self, api_key: int, handler: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        """``handler`` behind the request-level checks of its API (REQUEST_CHECKS)."""
        checks = REQUEST_CHECKS.get(api_key)
        if self.authorizer is None or not checks:
            return handler

        async def checked(ctx: Any, req: Any, R: Responder) -> Any:
            for check in checks:
                name = check.name(req)
                if not self.allowed(ctx, check.operation, check.resource_type, name):
                    return R.error(
                        DENIED_CODE[check.resource_type], denied_message(check.resource_type, name)
                    )
            return await handler(ctx, req, R)

        return checked

    # ---- the ACL APIs

    async def create_acls(self, ctx: Any, req: Any, R: Responder) -> Any:
        """Each creation stored (one already there is no error), or refused with Kafka's
        INVALID_REQUEST reason; CLUSTER_AUTHORIZATION_FAILED without ALTER on the cluster."""
        refusal = self._acl_api_refusal(ctx, Op.ALTER)
        if refusal is not None:
            return R(
                results=[
                    {"error_code": refusal[0], "error_message": refusal[1]} for _ in req.creations
                ]
            )
        assert self.authorizer is not None
        results: list[dict[str, Any]] = []
        valid: list[AclBinding] = []
        for c in req.creations:
            try:
                acl = AclBinding.of(
                    c.resource_type,
                    c.resource_name,
                    c.resource_pattern_type,
                    c.principal,
                    c.host,
                    c.operation,
                    c.permission_type,
                )
                acl.validate()
            except AclError as exc:
                results.append({"error_code": ErrorCode.invalid_request, "error_message": str(exc)})
                continue
            valid.append(acl)
            results.append({"error_code": ErrorCode.none, "error_message": None})
        if valid:
            try:
                await asyncio.to_thread(self.cluster.metadata.add_acls, [_row(a) for a in valid])
            except Exception as exc:  # noqa: BLE001 - the metadata store failed: nothing was created
                log.warning("create ACLs: %s", exc)
                return R(
                    results=[
                        r
                        if r["error_code"] != ErrorCode.none
                        else {
                            "error_code": ErrorCode.unknown_server_error,
                            "error_message": str(exc),
                        }
                        for r in results
                    ]
                )
            for acl in valid:
                if self.authorizer.add(acl):
                    log.info("ACL created by %s: %s", ctx.principal, acl)
        return R(results=results)

    async def describe_acls(self, ctx: Any, req: Any, R: Responder) -> Any:
        if self.authorizer is None:
            return R.error(ErrorCode.security_disabled, "No Authorizer is configured on the broker")
        try:
            where = _wire_filter(req)
        except AclError as exc:
            return R.error(ErrorCode.invalid_request, str(exc))
        by_resource: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
        for acl in sorted(self.authorizer.acls(where), key=_row):
            by_resource.setdefault(
                (acl.resource_type, acl.resource_name, acl.pattern_type), []
            ).append(
                {
                    "principal": acl.principal,
                    "host": acl.host,
                    "operation": int(acl.operation),
                    "permission_type": int(acl.permission),
                }
            )
        return R(
            error_code=ErrorCode.none,
            error_message=None,
            resources=[
                {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
                for (t, n, p), acls in by_resource.items()
            ],
        )

    async def delete_acls(self, ctx: Any, req: Any, R: Responder) -> Any:
        """Per filter, the bindings it matched (and deleted); a filter Kafka would refuse gets
        INVALID_REQUEST and deletes nothing."""
        refusal = self._acl_api_refusal(ctx, Op.ALTER)
        if refusal is not None:
            return R(
                filter_results=[
                    {"error_code": refusal[0], "error_message": refusal[1], "matching_acls": []}
                    for _ in req.filters
                ]
            )
        assert self.authorizer is not None
        results: list[dict[str, Any]] = []
        doomed: dict[AclBinding, None] = {}
        for f in req.filters:
            try:
                where = _wire_filter(f)
            except AclError as exc:
                results.append(
                    {
                        "error_code": ErrorCode.invalid_request,
                        "error_message": str(exc),
                        "matching_acls": [],
                    }
                )
                continue
            matched = sorted(self.authorizer.acls(where), key=_row)
            doomed.update(dict.fromkeys(matched))
            results.append(
                {
                    "error_code": ErrorCode.none,
                    "error_message": None,
                    "matching_acls": [
                        {
                            "error_code": ErrorCode.none,
                            "error_message": None,
                            "resource_type": int(a.resource_type),
                            "resource_name": a.resource_name,
                            "pattern_type": int(a.pattern_type),
                            "principal": a.principal,
                            "host": a.host,
                            "operation": int(a.operation),
                            "permission_type": int(a.permission),
                        }
                        for a in matched
                    ],
                }
            )
        if doomed:
            try:
                await asyncio.to_thread(
                    self.cluster.metadata.delete_acls, [_row(a) for a in doomed]
                )
            except Exception as exc:  # noqa: BLE001 - the metadata store failed: nothing was deleted
                log.warning("delete ACLs: %s", exc)
                return R(
                    filter_results=[
                        {
                            "error_code": ErrorCode.unknown_server_error,
                            "error_message": str(exc),
                            "matching_acls": [],
                        }
                        for _ in req.filters
                    ]
                )
            for acl in doomed:
                self.authorizer.remove(acl)
                log.info("ACL deleted by %s: %s", ctx.principal, acl)
        return R(filter_results=results)

    def _acl_api_refusal(self, ctx: Any, operation: Operation) -> tuple[int, str] | None:
        if self.authorizer is None:
            return ErrorCode.security_disabled, "No Authorizer is configured on the broker"
        if not self.allowed(ctx, operation, RT.CLUSTER, CLUSTER_NAME):
            return ErrorCode.cluster_authorization_failed, denied_message(RT.CLUSTER, CLUSTER_NAME)
        return None
