"""The answer to a request whose handler failed because the broker's storage cannot write
(``broker/storage/failures.py``), for APIs whose response has no top-level error code.

Kafka answers such a failure per item: each topic, partition, resource or group of the
request gets the error, so the client retries it, and the connection stays open. An empty
response would read as success, so each API here names how its request's items map to its
response's. The code is KAFKA_STORAGE_ERROR where the API's error list has it; group and
offset writes get COORDINATOR_NOT_AVAILABLE instead, the retriable code Kafka's group
coordinator answers when its offsets append fails (as OffsetCommit here already does)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from broker.kafka.codec import field

STORAGE = ErrorCode.kafka_storage_error
COORDINATOR = ErrorCode.coordinator_not_available


def _delete_topics(req: Any, message: str) -> dict[str, Any]:
    if field(req, "topics") is not None:
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    return {
        "responses": [
            {
                "name": name,
                "topic_id": topic_id or uuid.UUID(int=0),
                "error_code": STORAGE,
                "error_message": message,
            }
            for name, topic_id in wanted
        ]
    }


def _create_partitions(req: Any, message: str) -> dict[str, Any]:
    return {
        "results": [
            {"name": t.name, "error_code": STORAGE, "error_message": message} for t in req.topics
        ]
    }


def _configs(req: Any, message: str) -> dict[str, Any]:
    return {
        "responses": [
            {
                "error_code": STORAGE,
                "error_message": message,
                "resource_type": r.resource_type,
                "resource_name": r.resource_name,
            }
            for r in req.resources
        ]
    }


def _partitions(code: int, **extra: Any) -> Callable[[Any, str], dict[str, Any]]:
    """Every partition of the request's ``topics`` refused with ``code``."""

    def refusal(req: Any, message: str) -> dict[str, Any]:
        return {
            "topics": [
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p.partition_index, "error_code": code, **extra}
                        for p in t.partitions
                    ],
                }
                for t in req.topics
            ]
        }

    return refusal


def _delete_groups(req: Any, message: str) -> dict[str, Any]:
    return {"results": [{"group_id": g, "error_code": COORDINATOR} for g in req.groups_names]}


# API key -> the response fields refusing each of the request's items
BY_API: dict[int, Callable[[Any, str], dict[str, Any]]] = {
    20: _delete_topics,  # DeleteTopics
    21: _partitions(STORAGE, low_watermark=-1),  # DeleteRecords
    28: _partitions(COORDINATOR),  # TxnOffsetCommit
    33: _configs,  # AlterConfigs
    37: _create_partitions,  # CreatePartitions
    42: _delete_groups,  # DeleteGroups
    44: _configs,  # IncrementalAlterConfigs
}


def per_item_refusal(api_key: int, request: Any, message: str) -> dict[str, Any] | None:
    """The response fields refusing each item of ``request``, or None when this module does
    not know the API (its connection is closed: an empty answer would read as success)."""
    build = BY_API.get(api_key)
    return None if build is None or request is None else build(request, message)
