"""An object store outage longer than the broker can buffer: once more than
``--max-unflushed-bytes`` is acknowledged but not in the object store, the
broker holds produces (it stops acknowledging) instead of growing its memory
and WAL without end; when the store returns it catches up, and every
acknowledged record is there exactly once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.broker.clients import create_topic, read_partitions
from tests.broker.test_s3_object_store import TcpProxy
from tests.conftest import MotoS3
from tests.support import BrokerProcess, wait_for

LIMIT = 2 * 1024 * 1024
VALUE_BYTES = 1024
BATCH_BYTES = 64 * 1024
PARTITIONS = 2


@pytest.fixture
def s3_proxy(moto_s3: MotoS3) -> Iterator[TcpProxy]:
    proxy = TcpProxy(moto_s3.port)
    yield proxy
    proxy.down()


class FullSpeed:
    """An idempotent acks=all producer of 1 KiB values ``n:padding`` as fast as it can."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "batch.size": BATCH_BYTES,
                "message.timeout.ms": 120000,
                "log_level": 0,
            }
        )
        self.topic = topic
        self.acked: dict[int, tuple[int, int]] = {}
        self.failed = 0
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _done(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked[int(msg.value().split(b":")[0])] = (msg.partition(), msg.offset())
        else:
            self.failed += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            value = f"{self.sent}:".encode().ljust(VALUE_BYTES, b"x")
            try:
                self.producer.produce(
                    self.topic, value=value, key=str(self.sent).encode(), on_delivery=self._done
                )
            except BufferError:
                self.producer.poll(0.05)
                continue
            self.sent += 1
            self.producer.poll(0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert self.producer.flush(130) == 0


def test_an_outage_longer_than_the_buffer_holds_producers_and_loses_nothing(
    broker_factory: Callable[..., BrokerProcess],
    moto_s3: MotoS3,
    s3_proxy: TcpProxy,
    s3_bucket: str,
) -> None:
    broker = broker_factory(
        [
            "--object-store",
            f"s3://{s3_bucket}/held",
            "--segment-flush-ms",
            "100",
            "--max-unflushed-bytes",
            str(LIMIT),
        ],
        env=moto_s3.env(s3_proxy.endpoint),
    )
    topic = "held"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    producer = FullSpeed(broker.bootstrap, topic)
    try:
        wait_for(lambda: len(producer.acked) > 2000, 30, what="acks before the outage")
        s3_proxy.down()
        acked_at_down = len(producer.acked)
        wait_for(
            lambda: broker.admin("/healthz")["produces_held"],
            30,
            what="the broker to hold produces",
        )
        # Observe the held broker for a while: without the bound, a full-speed producer
        # would get tens of MiB acknowledged into memory in this time.
        peak_unflushed = 0
        observe_until = time.monotonic() + 3
        while time.monotonic() < observe_until:
            health = broker.admin("/healthz")
            peak_unflushed = max(peak_unflushed, int(health["unflushed_bytes"]))
            time.sleep(0.1)
        acked_during_outage = len(producer.acked) - acked_at_down
        # slack: requests that passed the check before the bound was crossed (a few per partition)
        slack = 8 * PARTITIONS * BATCH_BYTES
        print(
            {
                "limit": LIMIT,
                "peak_unflushed": peak_unflushed,
                "acked_during_outage": acked_during_outage,
                "produces_held": broker.admin("/healthz")["produces_held"],
            }
        )
        assert peak_unflushed <= LIMIT + slack, peak_unflushed
        assert acked_during_outage * VALUE_BYTES <= LIMIT + slack, acked_during_outage
        assert producer.failed == 0
        s3_proxy.up()
        wait_for(
            lambda: len(producer.acked) > acked_at_down + 4 * LIMIT // VALUE_BYTES,
            60,
            what="acks again once the store is back",
        )
    finally:
        producer.stop()
    wait_for(
        lambda: broker.admin("/healthz")["unflushed_bytes"] == 0, 30, what="everything flushed"
    )
    assert producer.failed == 0
    log = read_partitions(broker.bootstrap, topic, PARTITIONS, timeout=60)
    stored = {
        int(v.split(b":")[0]): (p, o)
        for p, entries in log.items()
        for o, v in entries
        if v is not None
    }
    assert sum(len(e) for e in log.values()) == len(stored) == producer.sent, (
        "duplicates or records never sent"
    )
    lost = [n for n, at in producer.acked.items() if stored.get(n) != at]
    assert not lost, f"{len(lost)} acknowledged records not at their offset, e.g. {lost[:5]}"
