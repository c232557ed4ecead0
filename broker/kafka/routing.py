"""NOT_COORDINATOR for group and transaction requests sent to a broker that does not
coordinate their key (cluster mode), as Kafka answers them: the client asks FindCoordinator
again and goes to the right broker.

One table says which key each API names (a group id or a transactional id) and how its
response carries the refusal: a top-level error code (``Responder.error``), per partition
(OffsetCommit, TxnOffsetCommit, AddPartitionsToTxn before v4), or per entry for the APIs that
name several keys (DescribeGroups, DeleteGroups, OffsetFetch v8+, ConsumerGroupDescribe,
DescribeTransactions). Those several-key requests are answered by the handler when this broker
coordinates every key named and refused entry by entry when it coordinates none; a request
mixing both (clients group keys by coordinator, so only a stale admin client sends one) is
refused for the keys not coordinated here and served for the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from kio.schema.errors import ErrorCode

from broker.kafka.codec import Responder, _entity_type, error_response, field
from broker.ownership import KEY_GROUP, KEY_TRANSACTION, Ownership

Handler = Callable[[Any, Any, Responder], Awaitable[Any]]


def _group(req: Any, version: int) -> str | None:
    return str(req.group_id)


def _txn(req: Any, version: int) -> str | None:
    tid = field(req, "transactional_id")
    return None if tid is None else str(tid)


# api key -> (key type, the one key a request names; None: nothing to route)
SINGLE_KEY: dict[int, tuple[int, Callable[[Any, int], str | None]]] = {
    8: (KEY_GROUP, _group),  # OffsetCommit
    9: (KEY_GROUP, lambda r, v: None if v >= 8 else str(r.group_id)),  # OffsetFetch < v8
    11: (KEY_GROUP, _group),  # JoinGroup
    12: (KEY_GROUP, _group),  # Heartbeat
    13: (KEY_GROUP, _group),  # LeaveGroup
    14: (KEY_GROUP, _group),  # SyncGroup
    22: (KEY_TRANSACTION, _txn),  # InitProducerId (a transactional producer's)
    24: (  # AddPartitionsToTxn: a client's (v4+ batches are a broker's: not routed)
        KEY_TRANSACTION,
        lambda r, v: None if v >= 4 else str(r.v3_and_below_transactional_id),
    ),
    25: (KEY_TRANSACTION, _txn),  # AddOffsetsToTxn
    26: (KEY_TRANSACTION, _txn),  # EndTxn
    28: (KEY_GROUP, _group),  # TxnOffsetCommit: at the group's coordinator, as in Kafka
    47: (KEY_GROUP, _group),  # OffsetDelete
    68: (KEY_GROUP, _group),  # ConsumerGroupHeartbeat
}

# api key -> (key type, list field of the request, response list field, its key field)
MANY_KEYS: dict[int, tuple[int, Callable[[Any, int], list[str] | None], str, str]] = {
    9: (
        KEY_GROUP,
        lambda r, v: [g.group_id for g in r.groups] if v >= 8 else None,
        "groups",
        "group_id",
    ),
    15: (KEY_GROUP, lambda r, v: list(r.groups), "groups", "group_id"),
    42: (KEY_GROUP, lambda r, v: list(r.groups_names), "results", "group_id"),
    65: (
        KEY_TRANSACTION,
        lambda r, v: list(r.transactional_ids),
        "transaction_states",
        "transactional_id",
    ),
    69: (KEY_GROUP, lambda r, v: list(r.group_ids), "groups", "group_id"),
}


def _per_partition(api_key: int, req: Any, R: Responder, code: int) -> Any:
    """The refusal of an API without a top-level error code: every partition named gets it."""
    if api_key == 24:
        return R(
            results_by_topic_v3_and_below=[
                {
                    "name": t.name,
                    "results_by_partition": [
                        {"partition_index": p, "partition_error_code": code} for p in t.partitions
                    ],
                }
                for t in req.v3_and_below_topics
            ]
        )
    return R(  # OffsetCommit, TxnOffsetCommit
        topics=[
            {
                "name": t.name,
                "partitions": [
                    {"partition_index": p.partition_index, "error_code": code} for p in t.partitions
                ],
            }
            for t in req.topics
        ]
    )


def _refused_entries(R: Responder, list_field: str, key_field: str, keys: list[str]) -> list[Any]:
    """One response entry per key, every error code NOT_COORDINATOR (Kafka's forError)."""
    fields: tuple[dataclasses.Field[Any], ...] = dataclasses.fields(R.schema)
    entity: Any = next(_entity_type(f)[1] for f in fields if f.name == list_field)
    message = "This broker is not the coordinator; ask FindCoordinator"
    return [
        dataclasses.replace(
            error_response(entity, ErrorCode.not_coordinator, message), **{key_field: key}
        )
        for key in keys
    ]


def route(ownership: Ownership, api_key: int, handler: Handler) -> Handler:
    """``handler`` behind the coordinator check of its API (unchanged for other APIs)."""
    single = SINGLE_KEY.get(api_key)
    many = MANY_KEYS.get(api_key)
    if single is None and many is None:
        return handler

    async def routed(ctx: Any, req: Any, R: Responder) -> Any:
        if not ownership.clustered:
            return await handler(ctx, req, R)
        if single is not None:
            key_type, key_of = single
            key = key_of(req, R.version)
            if key is not None and not ownership.coordinates(key_type, key):
                if api_key in (8, 28) or api_key == 24:
                    return _per_partition(api_key, req, R, ErrorCode.not_coordinator)
                return R.error(ErrorCode.not_coordinator, "not the coordinator of " + key)
        if many is not None:
            key_type, keys_of, list_field, key_field = many
            keys = keys_of(req, R.version)
            if keys is not None:
                foreign = [k for k in keys if not ownership.coordinates(key_type, k)]
                if foreign:
                    refused = _refused_entries(R, list_field, key_field, foreign)
                    if len(foreign) == len(keys):
                        return R(**{list_field: refused})
                    answer = await handler(ctx, req, R)
                    own = [
                        e
                        for e in getattr(answer, list_field)
                        if getattr(e, key_field) not in foreign
                    ]
                    return dataclasses.replace(answer, **{list_field: tuple(own + refused)})
        return await handler(ctx, req, R)

    return routed
