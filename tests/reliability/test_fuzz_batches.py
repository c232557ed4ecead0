"""A fuzzer for record batches inside well-formed Produce requests.

tests/broker/test_malformed.py mutates whole frames (most die at the CRC check
or in the request parser). Here the request is always well formed and the
mutation lands in the record batch only, usually with the batch length and CRC
fixed up afterwards, so the broker's checks behind the CRC are what is
exercised: record counts, record framing, compressed payloads (gzip, snappy,
lz4, zstd), attributes, producer fields. Whatever the broker does with each
request, afterwards:

- it answered every request with a per-partition error code or by closing
  the connection, and no handler crashed;
- what it accepted is readable by real clients (confluent-kafka from offset 0
  to the high watermark with no consumer error, and kafka-python's batch
  reader, which decompresses and parses every record), record for record: a
  producer's bad bytes must never make a partition unreadable;
- a topic written before the fuzzing is unchanged, and a real producer and
  consumer still work.
"""

from __future__ import annotations

import os
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import cramjam
import pytest
from confluent_kafka import Consumer, TopicPartition
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from tests.broker.clients import create_topic, read_partitions
from tests.broker.test_malformed import (
    CORRUPT_MESSAGE,
    NONE,
    Conn,
    api_versions_ok,
    assert_intact,
    produce_request,
    seed_topic,
)
from tests.reliability.resources import produce_values
from tests.support import BrokerProcess

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.fixture(scope="module")
def fbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("fuzz") / "home", ["--segment-flush-ms", "200"]
    ).start()
    try:
        yield broker
    finally:
        broker.stop()


def build_batch(codec: str, count: int, producer_id: int = -1) -> bytes:
    """A valid v2 batch of ``count`` records with keys, values and headers (kafka-python's builder)."""
    builder = DefaultRecordBatchBuilder(
        2,
        CODECS[codec],
        False,
        producer_id,
        0 if producer_id >= 0 else -1,
        0 if producer_id >= 0 else -1,
        1 << 20,
    )
    now = int(time.time() * 1000)
    for i in range(count):
        builder.append(
            i, now + i, f"k{i}".encode(), f"value-{i}-".encode() * (1 + i % 3), [("h", b"x" * i)]
        )
    return bytes(builder.build())


def fix_up(batch: bytearray) -> bytes:
    """Batch length and CRC made consistent with the (mutated) bytes, as a careful attacker would."""
    if len(batch) >= 21:
        struct.pack_into(">i", batch, 8, len(batch) - 12)
        struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


@st.composite
def garbled(draw: Any) -> tuple[str, bytes]:
    codec = draw(st.sampled_from(list(CODECS)))
    batch = bytearray(build_batch(codec, draw(st.integers(1, 6))))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(["flip", "byte", "truncate", "insert", "delete", "int32", "varint"])
        )
        # mostly behind the 61-byte header, where only the framing checks look
        pos = draw(st.integers(21 if draw(st.booleans()) else 61, max(len(batch) - 1, 61)))
        pos = min(pos, len(batch))
        if kind == "flip" and pos < len(batch):
            batch[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and pos < len(batch):
            batch[pos] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
        elif kind == "truncate":
            del batch[pos:]
        elif kind == "insert":
            batch[pos:pos] = draw(st.binary(min_size=1, max_size=12))
        elif kind == "delete":
            del batch[pos : pos + draw(st.integers(1, 12))]
        elif kind == "int32":
            batch[pos : pos + 4] = struct.pack(
                ">i", draw(st.sampled_from([0, -1, 1, 0x7FFFFFFF, -(2**31), 1 << 20]))
            )
        elif kind == "varint":
            batch[pos : pos + 1] = draw(st.sampled_from([b"\xff" * 10, b"\x01", b"\x00", b"\x7f"]))
    return codec, (fix_up(batch) if draw(st.integers(0, 9)) else bytes(batch))


def client_values(batch: bytes) -> list[bytes | None]:
    """The values of a batch as kafka-python reads them (decompressed, every record parsed)."""
    out: list[bytes | None] = []
    records = MemoryRecords(batch)
    while (parsed := records.next_batch()) is not None:
        out.extend(r.value for r in parsed)
    return out


def _produce_raw(broker: BrokerProcess, topic: str, batch: bytes) -> int | None:
    """The partition's error code, or None when the broker closed the connection."""
    with Conn(broker, timeout=10) as c:
        try:
            response = c.call(produce_request(topic, {0: batch}))
        except (EOFError, ConnectionResetError):
            return None
    return int(response.responses[0].partition_responses[0].error_code)


def _consume_all(broker: BrokerProcess, topic: str) -> list[tuple[int, bytes | None]]:
    """Every record of partition 0 through confluent-kafka; any consumer error fails."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"fuzz-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "check.crcs": True,
        }
    )
    try:
        end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + 30
        while (not got or got[-1][0] < end - 1) and end > 0:
            assert time.monotonic() < deadline, (
                f"consumer stuck at {got[-1][0] if got else None} of {end}"
            )
            for msg in consumer.consume(500, 0.5):
                assert not msg.error(), f"consumer error at {msg.offset()}: {msg.error()}"
                got.append((int(msg.offset() or 0), msg.value()))
        return got
    finally:
        consumer.close()


@pytest.mark.timeout(300)
def test_garbled_batches_are_refused_or_stored_readable(fbroker: BrokerProcess) -> None:
    protected, values = seed_topic(fbroker, partitions=1, count=20)
    target = f"fuzz-batches-{uuid.uuid4().hex[:6]}"
    create_topic(fbroker.bootstrap, target, 1)
    outcomes: dict[str, int] = {"accepted": 0, "refused": 0, "closed": 0}
    accepted: list[tuple[str, bytes]] = []

    # CI: the same 300 cases every run. Exploring: ICEFALL_FUZZ_EXAMPLES=5000 ICEFALL_FUZZ_RANDOM=1.
    @settings(
        max_examples=int(os.environ.get("ICEFALL_FUZZ_EXAMPLES", "300")),
        deadline=None,
        database=None,
        derandomize=not os.environ.get("ICEFALL_FUZZ_RANDOM"),
        suppress_health_check=list(HealthCheck),
    )
    @given(case=garbled())
    def fuzz(case: tuple[str, bytes]) -> None:
        codec, batch = case
        error = _produce_raw(fbroker, target, batch)
        if error is None:
            outcomes["closed"] += 1
        elif error == NONE:
            outcomes["accepted"] += 1
            accepted.append((codec, batch))
        else:
            outcomes["refused"] += 1
        api_versions_ok(fbroker, timeout=5)

    fuzz()
    assert outcomes["refused"] > 100, outcomes
    # what was accepted is readable, by kafka-python's reader and by librdkafka, record for record
    expected: list[bytes | None] = []
    unreadable = []
    for codec, batch in accepted:
        try:
            expected.extend(client_values(batch))
        except Exception as exc:  # noqa: BLE001 - any reader error is the finding
            unreadable.append((codec, repr(exc), batch.hex()))
    assert not unreadable, (
        f"{len(unreadable)} accepted batches no client can read, e.g. {unreadable[:2]}"
    )
    try:
        got = _consume_all(fbroker, target)
    except AssertionError as exc:  # name the stored batch the consumer choked on
        offset, batches = 0, []
        for codec, batch in accepted:
            count = struct.unpack_from(">i", batch, 57)[0]
            batches.append((offset, offset + count, codec, batch.hex()))
            offset += count
        raise AssertionError(
            f"{exc}; accepted batches (first offset, end, codec, bytes): {batches}"
        ) from None
    assert [o for o, _ in got] == list(range(len(got))), "offsets not contiguous"
    assert [v for _, v in got] == expected, outcomes
    assert_intact(fbroker, protected, values)
    assert "handler failed" not in fbroker.log_text()
    create_topic(fbroker.bootstrap, "fuzz-after", 1)
    produce_values(fbroker, "fuzz-after", 1, 50)
    assert len(read_partitions(fbroker.bootstrap, "fuzz-after", 1)[0]) == 50
    print(outcomes)


def _edit_record(batch: bytes, edit: str) -> bytes:
    """An uncompressed one-record batch (key k0, value-0-, one header) edited inside its record, CRC fixed."""
    b = bytearray(batch)
    body = 61
    if edit == "header count":
        b[-(1 + 1 + 1 + 1)] = (
            0x7F  # the header count varint (before key "h" length/value length): -64
        )
    elif edit == "offset delta":
        b[body + 3] = 0x02  # length(1) attributes(1) ts(1): offset delta 1 instead of 0
    elif edit == "attributes":
        b[body + 1] = 0xFF  # unused, 0 from every producer; kafka-python reads it as a varint
    elif edit == "header key utf-8":
        b[-2] = 0xFF  # the header key "h"
    elif edit == "key length":
        b[body + 4] = 0x13  # zigzag -10
    return fix_up(b)


@pytest.mark.parametrize(
    "edit", ["header count", "offset delta", "key length", "attributes", "header key utf-8"]
)
def test_crc_valid_batch_with_bad_record_fields_is_refused(
    fbroker: BrokerProcess, edit: str
) -> None:
    """Regression: the broker only walked record length prefixes, so these were stored
    and no client could read the partition past them."""
    topic = f"fields-{uuid.uuid4().hex[:6]}"
    create_topic(fbroker.bootstrap, topic, 1)
    batch = build_batch("none", 1)
    assert client_values(batch) == [b"value-0-"]
    bad = _edit_record(batch, edit)
    if edit != "offset delta":  # that one reads, as a record at the next batch's offset
        with pytest.raises(Exception):  # noqa: B017 - whatever kafka-python's reader raises
            client_values(bad)
    assert _produce_raw(fbroker, topic, bad) == CORRUPT_MESSAGE
    assert _consume_all(fbroker, topic) == []


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_crc_valid_batch_that_does_not_decompress_is_refused(
    fbroker: BrokerProcess, codec: str
) -> None:
    topic = f"inflate-{uuid.uuid4().hex[:6]}"
    create_topic(fbroker.bootstrap, topic, 1)
    batch = bytearray(build_batch(codec, 3))
    assert _produce_raw(fbroker, topic, bytes(batch)) == NONE  # the valid one is stored
    del batch[-3:]  # a truncated compressed payload, length and CRC fixed up
    assert _produce_raw(fbroker, topic, fix_up(batch)) == CORRUPT_MESSAGE
    assert [v for _, v in _consume_all(fbroker, topic)] == client_values(build_batch(codec, 3))


def test_snappy_java_chunk_longer_than_the_data_is_refused(fbroker: BrokerProcess) -> None:
    """Regression: the chunk was sliced short and decompressed; librdkafka refuses
    such a batch (_BAD_COMPRESSION), so its consumers stopped at it."""
    topic = f"snappy-{uuid.uuid4().hex[:6]}"
    create_topic(fbroker.bootstrap, topic, 1)
    plain = build_batch("none", 3)
    chunk = bytes(cramjam.snappy.compress_raw(plain[61:]))

    def framed(claimed: int) -> bytes:
        """The records snappy-compressed in snappy-java framing, one chunk claiming ``claimed`` bytes."""
        batch = (
            bytearray(plain[:61])
            + b"\x82SNAPPY\x00"
            + struct.pack(">ii", 1, 1)
            + struct.pack(">i", claimed)
        )
        struct.pack_into(">h", batch, 21, 2)  # attributes: snappy
        return fix_up(batch + chunk)

    assert _produce_raw(fbroker, topic, framed(len(chunk))) == NONE  # the honest one is stored
    good = _consume_all(fbroker, topic)
    assert [v for _, v in good] == client_values(plain)
    assert _produce_raw(fbroker, topic, framed(len(chunk) + 100)) == CORRUPT_MESSAGE
    assert _consume_all(fbroker, topic) == good
