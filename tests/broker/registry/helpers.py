"""Helpers for the schema registry tests: raw HTTP calls, topics, consuming."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support import wait_for

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def http(
    base: str, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, Any]:
    """(status, decoded JSON body) of one request; ``raw`` sends bytes as they are."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": CONTENT_TYPE}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, text, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        status, text, ctype = err.code, err.read(), err.headers.get("Content-Type", "")
    assert ctype.startswith(CONTENT_TYPE), f"{method} {path}: content type {ctype!r}"
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text.decode()


def error(
    base: str, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, int, str]:
    """(status, error_code, message) of a request that must fail."""
    status, answer = http(base, method, path, body, raw)
    assert status >= 400, f"{method} {path} succeeded: {answer}"
    assert isinstance(answer, dict) and set(answer) == {"error_code", "message"}, answer
    return status, answer["error_code"], answer["message"]


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(10)


def consume(bootstrap: str, topic: str, count: int, partitions: int = 1) -> list[Message]:
    """The first ``count`` records of ``topic``, read from the beginning (no group rebalance)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got: list[Message] = []
    try:

        def poll() -> bool:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert not msg.error(), msg.error()
                got.append(msg)
            return len(got) >= count

        wait_for(poll, 30, interval=0, what=f"{count} records from {topic}")
    finally:
        consumer.close()
    return got


def end_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4()}"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        return int(high)
    finally:
        consumer.close()
