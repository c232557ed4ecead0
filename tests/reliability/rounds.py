"""Commit-round helpers shared by tests/reliability and bench/reliability.py:
garbage values for a table topic, a producer that remembers the delivery report
of every record, the table and its DLQ read back as (partition, offset) lists,
and a round process killed at a random moment."""

from __future__ import annotations

import io
import os
import random
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer

from tests.spark_jobs.round_support import CLICK_V1, round_args, table, table_offsets
from tests.spark_jobs.test_commit_round import clicks
from tests.support import REPO, BrokerProcess

_CLICK = parse_schema(CLICK_V1)


def avro_body(click: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, _CLICK, {**click, "at": int(click["at"].timestamp() * 1000)})
    return out.getvalue()


def garbage_value(rng: random.Random, schema_id: int, n: int) -> tuple[str, bytes | None]:
    """(kind, value): one of the ways a producer gets a table topic's value wrong."""
    good = b"\x00" + struct.pack(">I", schema_id) + avro_body(clicks(n, 1)[0])
    kind = rng.choice(
        [
            "random",
            "empty",
            "wrong-magic",
            "unknown-id",
            "truncated",
            "flipped",
            "trailing",
            "tombstone",
            "huge-length",
        ]
    )
    if kind == "random":
        return kind, rng.randbytes(rng.randrange(1, 40))
    if kind == "empty":
        return kind, b""
    if kind == "wrong-magic":
        return kind, b"\x01" + good[1:]
    if kind == "unknown-id":
        return kind, b"\x00" + struct.pack(">I", 0x7FFFFF00 + rng.randrange(200)) + good[5:]
    if kind == "truncated":
        return kind, good[: rng.randrange(5, len(good))]
    if kind == "flipped":
        data = bytearray(good)
        pos = rng.randrange(5, len(data))
        data[pos] ^= 1 << rng.randrange(8)
        return kind, bytes(data)
    if kind == "trailing":
        return kind, good + rng.randbytes(rng.randrange(1, 8))
    if kind == "huge-length":  # a string length far past the end of the value
        return kind, good[:5] + b"\x02" + b"\xfe\xff\xff\xff\x0f" + good[6:]
    return kind, None


class Recorder:
    """A librdkafka producer (acks=all, no retries) that keeps each record's delivery report."""

    def __init__(self, broker: BrokerProcess, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "acks": "all",
                "retries": 0,
                "enable.idempotence": False,
                "linger.ms": 5,
                "log_level": 0,
            }
        )
        self.acked: list[tuple[int, int]] = []
        self.refused: list[str] = []

    def send(self, values: Iterable[bytes | None], partition: int | None = None) -> None:
        def done(err: Any, msg: Any) -> None:
            if err is None:
                self.acked.append((msg.partition(), msg.offset()))
            else:
                self.refused.append(err.name())

        for value in values:
            if partition is None:
                self.producer.produce(self.topic, value=value, on_delivery=done)
            else:
                self.producer.produce(
                    self.topic, value=value, partition=partition, on_delivery=done
                )
            self.producer.poll(0)
        assert self.producer.flush(60) == 0


def dlq_offsets(broker: BrokerProcess, topic: str) -> list[tuple[int, int]]:
    rows = (
        table(broker, f"{topic}__dlq")
        .scan(selected_fields=("partition", "offset"))
        .to_arrow()
        .to_pylist()
    )
    return sorted((r["partition"], r["offset"]) for r in rows)


def table_and_dlq(
    broker: BrokerProcess, topic: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        dlq = dlq_offsets(broker, topic)
    except NoSuchTableError:
        dlq = []
    return table_offsets(broker, topic), dlq


def round_process(broker: BrokerProcess, topic: str, result: Path) -> subprocess.Popen[bytes]:
    """The job as Airflow runs it (its own Python, Spark local[2]) in its own process group."""
    log = open(result.with_suffix(".log"), "wb")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spark_jobs.commit_round",
                *round_args(broker, topic, result, "--master", "local[2]"),
            ],
            cwd=REPO,
            env=dict(os.environ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()


def kill_round_at_random(
    broker: BrokerProcess, topic: str, work: Path, rng: random.Random, max_delay_s: float
) -> tuple[float, int | None]:
    """Start a round, SIGKILL its whole process group (driver and JVM) after a random
    0..``max_delay_s`` seconds unless it finished first. Returns (delay, exit code if it
    finished before the kill, else None)."""
    delay = rng.uniform(0, max_delay_s)
    proc = round_process(broker, topic, work / f"killed-{time.monotonic_ns()}.json")
    try:
        return delay, proc.wait(delay)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        return delay, None


def complete_round(
    broker: BrokerProcess, topic: str, work: Path, timeout: float = 300
) -> dict[str, Any]:
    import json

    result = work / f"round-{time.monotonic_ns()}.json"
    proc = round_process(broker, topic, result)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        raise
    assert code == 0, result.with_suffix(".log").read_text()[-3000:]
    out: dict[str, Any] = json.loads(result.read_text())
    return out
