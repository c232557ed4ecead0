"""The size trigger against a real broker: it fires when the bytes waiting for a table reach
its threshold, and only for bytes that arrived after it last fired."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support import BrokerProcess

THRESHOLD = 20_000


def produce(broker: BrokerProcess, topic: str, count: int, size: int = 1_000) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, value=bytes([i % 256]) * size)
    assert producer.flush(10) == 0


def test_fires_at_the_threshold_and_not_again_for_the_same_bytes(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    from icefall_airflow import broker_client
    from icefall_airflow.pending_trigger import PendingBytesTrigger

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "automq.table.topic.enable": "true",
        "automq.table.topic.convert.value.type": "raw",
        "automq.table.topic.commit.trigger.bytes": str(THRESHOLD),
    }
    for f in admin.create_topics([NewTopic("bursts", 1, 1, config=config)]).values():
        f.result(10)
    answers: list[Any] = []  # contracts.Pending
    real = broker_client.BrokerClient.pending
    producing = threading.Lock()  # a poll sees a burst whole, never half of it

    def observed(self: Any, topic: str, since: dict[int, int] | None = None) -> Any:
        with producing:
            answer = real(self, topic, since)
        answers.append(answer)
        return answer

    def burst() -> None:
        with producing:
            produce(broker, "bursts", 12)  # about 12 KB

    monkeypatch.setattr(broker_client.BrokerClient, "pending", observed)
    trigger = PendingBytesTrigger("bursts", THRESHOLD, broker.admin_url, poll_interval_s=0.05)

    async def scenario() -> list[dict[str, Any]]:
        events = trigger.run()
        assert inspect.isasyncgen(events)  # so it has aclose()
        waiting: asyncio.Task[Any] = asyncio.ensure_future(events.__anext__())

        async def polls_below_threshold(n: int) -> None:
            """n more answers of the broker, none reaching the threshold, and no event."""
            seen = len(answers)
            deadline = time.monotonic() + 20
            while len(answers) < seen + n:
                assert time.monotonic() < deadline, "the trigger stopped polling"
                await asyncio.sleep(0.01)
            assert not waiting.done() and all(a["bytes"] < THRESHOLD for a in answers[seen:])

        async def next_event() -> dict[str, Any]:
            nonlocal waiting
            event = await asyncio.wait_for(waiting, 20)
            waiting = asyncio.ensure_future(events.__anext__())
            return dict(event.payload)

        await polls_below_threshold(3)  # nothing produced yet
        burst()  # below the threshold
        await polls_below_threshold(3)
        burst()  # past it
        first = await next_event()
        burst()  # only these count now
        await polls_below_threshold(3)
        burst()
        second = await next_event()
        waiting.cancel()
        await events.aclose()
        return [first, second]

    first, second = asyncio.run(scenario())
    assert first["topic"] == "bursts" and first["end_offsets"] == {"0": 24}
    assert first["pending_records"] == 24 and first["pending_bytes"] >= THRESHOLD
    assert second["end_offsets"] == {"0": 48} and second["pending_records"] == 24
    assert (
        THRESHOLD <= second["pending_bytes"] < 2 * THRESHOLD
    )  # not the 48 KB waiting since offset 0
    assert trigger.serialize() == (
        "icefall_airflow.pending_trigger.PendingBytesTrigger",
        {
            "topic": "bursts",
            "threshold_bytes": THRESHOLD,
            "admin_url": broker.admin_url,
            "poll_interval_s": 0.05,
        },
    )
