"""Broken bytes on the Kafka listener.

Raw sockets send malformed frames, unknown APIs, unsupported versions,
truncated and garbage bodies, corrupt record batches, half frames and stalled
clients. Every case checks the broker's answer (a closed connection or the
right error code), that other clients are still served, and that data stored
before is untouched. A hypothesis fuzz test mutates valid frames at random.
The last section runs the listener in-process over stub handlers that fail on
purpose, to check a failing handler closes only its own connection.

Requests are built with kio's generated schemas and writers, responses parsed
with its readers; the broker's own codec is not used to build or read them.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import itertools
import logging
import random
import socket
import struct
import sys
import time
import types
import typing
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.records.readers import read_batch
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_batch
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from tests.broker import rawkafka
from tests.support import BrokerProcess, present, wait_for

MAX_REQUEST_BYTES = 100 * 1024 * 1024  # the broker's default socket.request.max.bytes
IO_TIMEOUT = 10.0

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS = 0, 1, 2, 3, 18
NONE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, MESSAGE_TOO_LARGE = 0, 2, 3, 10
UNSUPPORTED_VERSION, INVALID_RECORD = 35, 87

_correlation = itertools.count(1)


# ---------------------------------------------------------------- protocol helpers


def _module(cls: type[Any]) -> Any:
    return sys.modules[cls.__module__]


def make(cls: type[Any], **fields: Any) -> Any:
    """An entity of any version: keyword arguments the version does not have are dropped."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in names})


def encode(request: Any, correlation_id: int, client_id: str | None = "malformed-test") -> bytes:
    """Request header + body of a kio request entity (no size prefix)."""
    cls = type(request)
    header_cls = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(
        buf,
        header_cls(
            request_api_key=cls.__api_key__,
            request_api_version=cls.__version__,
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    entity_writer(cls)(buf, request)
    return buf.getvalue()


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def header_only(
    api_key: int, api_version: int, correlation_id: int, client_id: bytes = b"malformed-test"
) -> bytes:
    """A request header v1 written by hand (any key and version, known or not)."""
    return struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id)) + client_id


def decode(api_key: int, api_version: int, payload: bytes) -> tuple[int, Any]:
    """(correlation id, response) of a response frame's payload; the whole payload must be consumed."""
    schema = load_response_schema(api_key, api_version)
    header, header_size = entity_reader(schema.__header_schema__)(payload, 0)
    body, body_size = entity_reader(schema)(payload, header_size)
    assert header_size + body_size == len(payload), (
        f"{len(payload) - header_size - body_size} trailing response bytes"
    )
    return header.correlation_id, body


def header_length(request_payload: bytes) -> int:
    api_key, api_version = struct.unpack_from(">hh", request_payload)
    schema = load_request_schema(api_key, api_version)
    return int(entity_reader(schema.__header_schema__)(request_payload, 0)[1])


def _nulls_allowed(entity: Any) -> bool:
    """No field the schema declares non-nullable holds None (kio reads a -1 array length as None)."""
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        args = typing.get_args(f.type)
        optional = (
            typing.get_origin(f.type) in (typing.Union, types.UnionType) and type(None) in args
        )
        if value is None and not optional:
            return False
        items = value if isinstance(value, tuple) else (value,)
        if not all(_nulls_allowed(v) for v in items if dataclasses.is_dataclass(v)):
            return False
    return True


def parses(request_payload: bytes) -> bool:
    """Whether these request bytes are a valid request by kio's schema (used to check a test's premise)."""
    api_key, api_version = struct.unpack_from(">hh", request_payload)
    schema = load_request_schema(api_key, api_version)
    try:
        _, n = entity_reader(schema.__header_schema__)(request_payload, 0)
        request, _ = entity_reader(schema)(request_payload, n)
    except Exception:  # noqa: BLE001 - kio raises several kinds of errors on bad bytes
        return False
    return _nulls_allowed(request)


class Conn(rawkafka.Connection):
    """One raw TCP connection to the Kafka listener (rawkafka's, without Nagle's delay)."""

    def __init__(self, broker: BrokerProcess, timeout: float = IO_TIMEOUT) -> None:
        super().__init__(f"127.0.0.1:{broker.kafka_port}", timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def recv_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self.recv_exact(4))
        assert 4 <= size < MAX_REQUEST_BYTES, f"response size {size}"
        return self.recv_exact(size)

    def recv_response(self, api_key: int, api_version: int, correlation_id: int) -> Any:
        got, response = decode(api_key, api_version, self.recv_frame())
        assert got == correlation_id
        return response

    def call(self, request: Any, client_id: str | None = "malformed-test") -> Any:
        cid = next(_correlation)
        self.send(frame(encode(request, cid, client_id)))
        return self.recv_response(type(request).__api_key__, type(request).__version__, cid)

    def expect_closed(self, timeout: float = IO_TIMEOUT) -> None:
        """The broker closes this connection without answering anything."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except ConnectionResetError:
            return  # closed with our unread bytes still in its buffer: an RST instead of a FIN
        except TimeoutError:
            pytest.fail(f"connection still open {timeout}s after a malformed request")
        assert data == b"", (
            f"expected the connection to be closed, got an answer: {data[:64].hex()}"
        )


# ---------------------------------------------------------------- requests


def api_versions_request(version: int = 3) -> Any:
    cls: type[Any] = load_request_schema(API_VERSIONS, version)
    if version >= 3:
        return cls(client_software_name="icefall-tests", client_software_version="1.0")
    return cls()


def produce_request(
    topic: str, partitions: dict[int, bytes | None], version: int = 9, acks: int = -1
) -> Any:
    cls: type[Any] = load_request_schema(PRODUCE, version)
    m = _module(cls)
    return cls(
        acks=i16(acks),
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            m.TopicProduceData(
                name=topic,
                partition_data=tuple(
                    m.PartitionProduceData(index=i32(p), records=records)
                    for p, records in partitions.items()
                ),
            ),
        ),
    )


def fetch_request(
    topic: str, partition: int, offset: int, version: int = 12, max_wait_ms: int = 0
) -> Any:
    cls = load_request_schema(FETCH, version)
    m = _module(cls)
    return make(
        cls,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=i32(0),
        topics=(
            m.FetchTopic(
                topic=topic,
                partitions=(
                    make(
                        m.FetchPartition,
                        partition=i32(partition),
                        fetch_offset=i64(offset),
                        partition_max_bytes=i32(1 << 20),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


def list_offsets_request(topic: str, partition: int, timestamp: int, version: int = 7) -> Any:
    cls = load_request_schema(LIST_OFFSETS, version)
    m = _module(cls)
    return make(
        cls,
        replica_id=i32(-1),
        isolation_level=i8(0),
        topics=(
            m.ListOffsetsTopic(
                name=topic,
                partitions=(
                    make(
                        m.ListOffsetsPartition,
                        partition_index=i32(partition),
                        timestamp=i64(timestamp),
                    ),
                ),
            ),
        ),
    )


def metadata_request(topics: list[str] | None, version: int = 12) -> Any:
    cls = load_request_schema(METADATA, version)
    m = _module(cls)
    if topics is not None:
        if version >= 10:
            entries = tuple(m.MetadataRequestTopic(topic_id=None, name=t) for t in topics)
        else:
            entries = tuple(m.MetadataRequestTopic(name=t) for t in topics)
    else:
        entries = None
    return make(
        cls,
        topics=entries,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def make_batch(values: list[bytes], producer_id: int = -1, base_sequence: int = -1) -> bytes:
    """A valid, uncompressed v2 record batch."""
    now = TZAwareMicros.parse(datetime.datetime.now(datetime.UTC))
    records = tuple(
        Record(attributes=i8(0), timestamp=now, offset=i64(i), key=None, value=v, headers=())
        for i, v in enumerate(values)
    )
    buf = io.BytesIO()
    write_batch(
        buf,
        NewRecordBatch(
            producer_id=i64(producer_id),
            producer_epoch=i16(0 if producer_id >= 0 else -1),
            base_sequence=i32(base_sequence),
            records=records,
            attributes=i16(0),
        ),
    )
    return buf.getvalue()


def with_crc(batch: bytes) -> bytes:
    """The batch with its CRC recomputed (for batches edited after the CRC field)."""
    from crc32c import crc32c

    return batch[:17] + struct.pack(">I", crc32c(batch[21:])) + batch[21:]


# ---------------------------------------------------------------- broker-level checks


def produce(
    broker: BrokerProcess, topic: str, partitions: dict[int, bytes | None], version: int = 9
) -> dict[int, Any]:
    """Partition responses by index."""
    with Conn(broker) as c:
        response = c.call(produce_request(topic, partitions, version))
    assert [t.name for t in response.responses] == [topic]
    return {p.index: p for p in response.responses[0].partition_responses}


def offsets(broker: BrokerProcess, topic: str, partition: int = 0) -> tuple[int, int]:
    """(earliest, latest) offsets from ListOffsets."""
    found = []
    with Conn(broker) as c:
        for timestamp in (-2, -1):
            response = c.call(list_offsets_request(topic, partition, timestamp))
            p = response.topics[0].partitions[0]
            assert p.error_code == NONE, p
            found.append(int(p.offset))
    return found[0], found[1]


def fetch_values(
    broker: BrokerProcess, topic: str, partition: int = 0
) -> list[tuple[int, bytes | None]]:
    """Every (offset, value) from the log start to the high watermark, via raw Fetch."""
    start, end = offsets(broker, topic, partition)
    out: list[tuple[int, bytes | None]] = []
    offset = start
    deadline = time.monotonic() + IO_TIMEOUT
    with Conn(broker) as c:
        while offset < end:
            assert time.monotonic() < deadline, (
                f"fetch made no progress at offset {offset} of {end}"
            )
            data = c.call(fetch_request(topic, partition, offset)).responses[0].partitions[0]
            assert data.error_code == NONE, data
            records = bytes(data.records or b"")
            pos = 0
            while pos + 12 <= len(records):
                batch, size = read_batch(records, pos)
                pos += size
                for r in batch.records:
                    if r.offset >= offset:
                        out.append((int(r.offset), r.value))
                offset = max(offset, batch.base_offset + batch.last_offset_delta + 1)
    return out


def api_versions_ok(
    broker: BrokerProcess, timeout: float = IO_TIMEOUT
) -> dict[int, tuple[int, int]]:
    """A fresh connection gets a correct ApiVersions v3 answer; returns the advertised versions."""
    assert broker.proc is not None and broker.proc.poll() is None, "broker process died"
    with Conn(broker, timeout) as c:
        response = c.call(api_versions_request(3))
    assert response.error_code == NONE
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


class Bystander:
    """A well-behaved client connected before the trouble starts; it must keep being served."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.conn = Conn(broker)
        self.check()

    def check(self) -> None:
        response = self.conn.call(api_versions_request(3))
        assert response.error_code == NONE and response.api_keys
        md = self.conn.call(metadata_request(None))
        assert md.brokers and md.brokers[0].port == self.broker.kafka_port

    def close(self) -> None:
        self.conn.close()


def create_topic(
    broker: BrokerProcess, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics(
        [NewTopic(name, partitions, 1, config=config or {})]
    ).values():
        future.result(10)


def seed_topic(
    broker: BrokerProcess, partitions: int = 1, count: int = 10
) -> tuple[str, dict[int, list[bytes]]]:
    """A new topic with ``count`` records in each partition (two batches each)."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    create_topic(broker, topic, partitions)
    values = {p: [f"{topic}-{p}-{i}".encode() for i in range(count)] for p in range(partitions)}
    half = count // 2
    for chunk in (slice(0, half), slice(half, count)):
        result = produce(broker, topic, {p: make_batch(v[chunk]) for p, v in values.items()})
        assert all(r.error_code == NONE for r in result.values()), result
    return topic, values


def assert_intact(broker: BrokerProcess, topic: str, values: dict[int, list[bytes]]) -> None:
    for p, expected in values.items():
        assert offsets(broker, topic, p) == (0, len(expected))
        assert fetch_values(broker, topic, p) == list(enumerate(expected))


@pytest.fixture(scope="module")
def kbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module (each test uses its own topics)."""
    broker = BrokerProcess(
        tmp_path_factory.mktemp("malformed") / "home", ["--segment-flush-ms", "200"]
    ).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def stored(kbroker: BrokerProcess) -> tuple[str, dict[int, list[bytes]]]:
    """Data written before any malformed traffic; tests check it is still intact afterwards."""
    return seed_topic(kbroker, partitions=2)


@pytest.fixture
def bystander(kbroker: BrokerProcess) -> Iterator[Bystander]:
    b = Bystander(kbroker)
    yield b
    b.close()


def after_trouble(
    broker: BrokerProcess, bystander: Bystander, stored: tuple[str, dict[int, list[bytes]]]
) -> None:
    bystander.check()
    api_versions_ok(broker)
    assert_intact(broker, *stored)


# ---------------------------------------------------------------- framing


@pytest.mark.parametrize(
    "size", [-1, -(2**31), 0, 1, 4, 7, MAX_REQUEST_BYTES + 1, 2**31 - 1], ids=lambda s: f"size={s}"
)
def test_bad_size_prefix_closes_connection(
    kbroker: BrokerProcess, bystander: Bystander, stored: Any, size: int
) -> None:
    with Conn(kbroker) as c:
        # A well-formed ApiVersions request after the bad prefix: the broker must not read on.
        c.send(struct.pack(">i", size) + frame(encode(api_versions_request(0), 1)))
        c.expect_closed()
    after_trouble(kbroker, bystander, stored)


def test_bad_size_prefix_other_librdkafka_client_still_works(
    kbroker: BrokerProcess, stored: Any
) -> None:
    topic, _ = stored
    bad = []
    for size in (-1, 0, 5, MAX_REQUEST_BYTES + 1):
        c = Conn(kbroker)
        c.send(struct.pack(">i", size))
        bad.append(c)
    try:
        for c in bad:
            c.expect_closed()
        admin = AdminClient({"bootstrap.servers": kbroker.bootstrap})
        assert topic in admin.list_topics(timeout=10).topics
        consumer = Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": "malformed-wm"})
        try:
            assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 10)
        finally:
            consumer.close()
    finally:
        for c in bad:
            c.close()


def test_request_at_max_size_is_read_not_refused(kbroker: BrokerProcess) -> None:
    """The limit is inclusive: a frame of exactly max bytes is read (and, being an
    ApiVersions v0 with trailing padding, answered)."""
    with Conn(kbroker, timeout=60) as c:
        payload = header_only(API_VERSIONS, 0, 4242)
        c.send(struct.pack(">i", MAX_REQUEST_BYTES) + payload)
        padding = bytes(1 << 20)
        remaining = MAX_REQUEST_BYTES - len(payload)
        while remaining:
            n = min(remaining, len(padding))
            c.send(padding[:n])
            remaining -= n
        response = c.recv_response(API_VERSIONS, 0, 4242)
        assert response.error_code == NONE


# ---------------------------------------------------------------- unknown APIs and versions


@pytest.mark.parametrize("api_key", [9999, 38, -1, 40, 1000], ids=lambda k: f"key={k}")
def test_unknown_api_key_closes_connection(
    kbroker: BrokerProcess, bystander: Bystander, stored: Any, api_key: int
) -> None:
    with Conn(kbroker) as c:
        c.send(frame(header_only(api_key, 0, 7) + b"\0" * 16))
        c.expect_closed()
    after_trouble(kbroker, bystander, stored)


@pytest.mark.parametrize(
    ("api_key", "version"),
    [
        (PRODUCE, 99),
        (PRODUCE, 2),
        (PRODUCE, -1),
        (FETCH, 3),
        (FETCH, 13),
        (METADATA, 13),
        (LIST_OFFSETS, 0),
    ],
    ids=lambda v: str(v),
)
def test_unsupported_version_closes_connection(
    kbroker: BrokerProcess, bystander: Bystander, stored: Any, api_key: int, version: int
) -> None:
    topic, _ = stored
    # The body of a valid request of the nearest served version, so only the version is wrong.
    body = encode(produce_request(topic, {0: make_batch([b"must-not-land"])}), 1)[
        len(header_only(0, 9, 1)) + 1 :
    ]
    with Conn(kbroker) as c:
        c.send(frame(header_only(api_key, version, 8) + body))
        c.expect_closed()
    after_trouble(kbroker, bystander, stored)


@pytest.mark.parametrize("version", [99, 5, -1, 32767])
def test_api_versions_unsupported_version_answers_v0_error(
    kbroker: BrokerProcess, version: int
) -> None:
    with Conn(kbroker) as c:
        # Kafka's rule: whatever the body, answer in v0 with UNSUPPORTED_VERSION and the supported APIs.
        c.send(frame(header_only(API_VERSIONS, version, 99) + b"\x01\xff\xfe garbage"))
        response = c.recv_response(API_VERSIONS, 0, 99)
        assert response.error_code == UNSUPPORTED_VERSION
        listed = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert listed[API_VERSIONS] == (0, 4)
        assert listed[PRODUCE][0] <= 9 <= listed[PRODUCE][1]
        assert 38 not in listed  # CreateDelegationToken: not served
        # The connection stays open: the client retries with a version it now knows.
        retry = c.call(api_versions_request(3))
        assert retry.error_code == NONE
        assert {k.api_key: (k.min_version, k.max_version) for k in retry.api_keys} == listed


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_api_versions_every_served_version_answers(kbroker: BrokerProcess, version: int) -> None:
    from broker.kafka.handlers import SUPPORTED_VERSIONS

    with Conn(kbroker) as c:
        cid = next(_correlation)
        c.send(frame(encode(api_versions_request(version), cid)))
        response = c.recv_response(
            API_VERSIONS, version, cid
        )  # response header v0 even for flexible versions
    assert response.error_code == NONE
    listed = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    # Every served API is listed up to the newest version served, and nothing else is.
    # (A listed minimum may be lower than the served one: Produce is listed from v0 for old librdkafka.)
    assert set(listed) == set(SUPPORTED_VERSIONS)
    for key, (low, high) in SUPPORTED_VERSIONS.items():
        assert listed[key][1] == high and listed[key][0] <= low, key
    assert listed[FETCH] == (4, 12) and listed[API_VERSIONS] == (0, 4) and listed[PRODUCE][1] == 12
    assert 38 not in listed
    if version >= 1:
        assert response.throttle_time == datetime.timedelta(0)


def test_valid_edge_cases_are_answered(kbroker: BrokerProcess) -> None:
    """Things that look odd but are valid Kafka: null/empty client id, a request sent
    one byte at a time, and ten requests pipelined in one write."""
    with Conn(kbroker) as c:
        for client_id in (None, "", "ünïcode-client"):
            assert c.call(api_versions_request(3), client_id=client_id).error_code == NONE
        cid = next(_correlation)
        for byte in frame(encode(metadata_request(None), cid)):
            c.send(bytes([byte]))
        assert c.recv_response(METADATA, 12, cid).brokers
        cids = [next(_correlation) for _ in range(10)]
        c.send(
            b"".join(
                frame(encode(api_versions_request(3 if i % 2 else 0), cid))
                for i, cid in enumerate(cids)
            )
        )
        for i, cid in enumerate(cids):
            assert c.recv_response(API_VERSIONS, 3 if i % 2 else 0, cid).error_code == NONE


# ---------------------------------------------------------------- truncated and garbage bodies


def _valid_payloads(topic: str) -> dict[str, bytes]:
    return {
        "produce-v9": encode(produce_request(topic, {0: make_batch([b"must-not-land"])}), 1),
        "produce-v3": encode(
            produce_request(topic, {0: make_batch([b"must-not-land"])}, version=3), 1
        ),
        "fetch-v12": encode(fetch_request(topic, 0, 0), 1),
        "fetch-v4": encode(fetch_request(topic, 0, 0, version=4), 1),
        "metadata-v12": encode(metadata_request([topic]), 1),
        "metadata-v1": encode(metadata_request([topic], version=1), 1),
    }


PAYLOAD_NAMES = ["produce-v9", "produce-v3", "fetch-v12", "fetch-v4", "metadata-v12", "metadata-v1"]


@pytest.mark.parametrize("name", PAYLOAD_NAMES)
def test_truncated_body_closes_connection(
    kbroker: BrokerProcess, bystander: Bystander, stored: Any, name: str
) -> None:
    topic, _ = stored
    payload = _valid_payloads(topic)[name]
    assert parses(payload)
    header_len = header_length(payload)
    cuts = sorted(
        {
            8,
            10,
            header_len,
            header_len + 1,
            header_len + 3,
            len(payload) // 2,
            len(payload) - 2,
            len(payload) - 1,
        }
    )
    conns = []
    for cut in cuts:
        truncated = payload[:cut]
        assert not parses(truncated), cut
        c = Conn(kbroker)
        c.send(frame(truncated))
        conns.append((cut, c))
    for cut, c in conns:
        try:
            c.expect_closed()
        except BaseException as exc:
            raise AssertionError(f"{name} truncated to {cut} of {len(payload)} bytes") from exc
        finally:
            c.close()
    after_trouble(kbroker, bystander, stored)


@pytest.mark.parametrize("name", PAYLOAD_NAMES)
def test_garbage_body_closes_connection(
    kbroker: BrokerProcess, bystander: Bystander, stored: Any, name: str
) -> None:
    topic, _ = stored
    valid = _valid_payloads(topic)[name]
    header_len = header_length(valid)
    rng = random.Random(name)
    # Null arrays that may not be null, huge lengths, overlong varints, then random bytes.
    candidates = [
        b"\xff" * 64,
        b"\x7f\xff\xff\xff" * 8,
        b"\x80" * 40,
        b"\x00\x00\xff\xff" * 4,
        b"\x01",
    ]
    bodies = [b for b in candidates if not parses(valid[:header_len] + b)]
    assert len(bodies) >= 3, name
    while len(bodies) < 10:
        body = rng.randbytes(rng.randrange(1, 200))
        if not parses(valid[:header_len] + body):
            bodies.append(body)
    for body in bodies:
        with Conn(kbroker) as c:
            c.send(frame(valid[:header_len] + body))
            try:
                c.expect_closed()
            except BaseException as exc:
                raise AssertionError(f"{name} with garbage body {body[:32].hex()}") from exc
    after_trouble(kbroker, bystander, stored)
    assert offsets(kbroker, topic, 0) == (0, 10)


def test_answers_before_a_malformed_request_are_still_delivered(
    kbroker: BrokerProcess, stored: Any
) -> None:
    topic, _ = stored
    with Conn(kbroker) as c:
        good = [next(_correlation) for _ in range(3)]
        c.send(
            frame(encode(api_versions_request(3), good[0]))
            + frame(encode(metadata_request([topic]), good[1]))
            + frame(encode(list_offsets_request(topic, 0, -1), good[2]))
            + frame(header_only(PRODUCE, 9, 666) + b"\xff" * 32)
            + frame(encode(api_versions_request(3), 777))
        )
        assert c.recv_response(API_VERSIONS, 3, good[0]).error_code == NONE
        assert c.recv_response(METADATA, 12, good[1]).topics[0].name == topic
        assert c.recv_response(LIST_OFFSETS, 7, good[2]).topics[0].partitions[0].offset == 10
        c.expect_closed()


# ---------------------------------------------------------------- record batches


def _corrupt_batches() -> dict[str, bytes]:
    good = make_batch([b"corrupt-1", b"corrupt-2", b"corrupt-3"])
    flipped_value = bytearray(good)
    flipped_value[-3] ^= 0x01
    bad_crc_field = bytearray(good)
    bad_crc_field[18] ^= 0xFF
    return {
        "bad-crc-payload": bytes(flipped_value),
        "bad-crc-field": bytes(bad_crc_field),
        "truncated-batch": good[:-5],
        "truncated-header": good[:40],
        "only-offset-and-length": good[:12],
        "magic-1": good[:16] + b"\x01" + good[17:],
        "magic-0": good[:16] + b"\x00" + good[17:],
        "magic-3": good[:16] + b"\x03" + good[17:],
        "length-too-long": good[:8] + struct.pack(">i", len(good) - 12 + 100) + good[12:],
        "length-too-short": good[:8] + struct.pack(">i", 20) + good[12:],
        "length-negative": good[:8] + struct.pack(">i", -1) + good[12:],
        "good-then-garbage": good + b"\x00" * 7,
        "good-then-corrupt": good + bytes(flipped_value),
        "garbage": random.Random(1).randbytes(200),
    }


@pytest.mark.parametrize("version", [9, 3])
@pytest.mark.parametrize("case", list(_corrupt_batches()))
def test_corrupt_record_batch_is_refused_and_nothing_moves(
    kbroker: BrokerProcess, case: str, version: int
) -> None:
    topic, values = seed_topic(kbroker, partitions=2, count=4)
    result = produce(
        kbroker, topic, {0: _corrupt_batches()[case], 1: make_batch([b"p1-ok"])}, version=version
    )
    assert result[0].error_code == CORRUPT_MESSAGE, result[0]
    assert result[0].base_offset == -1
    # Another partition of the same request is unaffected.
    assert result[1].error_code == NONE and result[1].base_offset == 4
    values[1].append(b"p1-ok")
    assert_intact(kbroker, topic, values)
    # The partition's next offset did not move either: the next good batch lands right after the old data.
    assert produce(kbroker, topic, {0: make_batch([b"after"])})[0].base_offset == 4


def test_produce_to_missing_topic_or_partition(kbroker: BrokerProcess) -> None:
    topic, values = seed_topic(kbroker, partitions=2, count=4)
    batch = make_batch([b"nowhere"])
    missing_name = f"missing-{uuid.uuid4().hex[:8]}"
    missing = produce(kbroker, missing_name, {0: batch})
    assert missing[0].error_code == UNKNOWN_TOPIC_OR_PARTITION and missing[0].base_offset == -1
    # A partition the topic does not have, and a negative one.
    result = produce(kbroker, topic, {2: batch, -1: batch, 1: make_batch([b"fine"])})
    assert result[2].error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert result[-1].error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert result[1].error_code == NONE and result[1].base_offset == 4
    values[1].append(b"fine")
    assert_intact(kbroker, topic, values)
    # The missing topic was not auto-created by the produce.
    with Conn(kbroker) as c:
        md = c.call(metadata_request([missing_name]))
    assert md.topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION


def test_batch_larger_than_max_message_bytes(kbroker: BrokerProcess) -> None:
    topic = f"small-{uuid.uuid4().hex[:8]}"
    create_topic(kbroker, topic, config={"max.message.bytes": "2000"})
    small = make_batch([b"x" * 100])
    big = make_batch([b"x" * 2100])
    several = make_batch([b"y" * 500] * 5)  # each record fits, the batch does not
    assert len(small) < 2000 < min(len(big), len(several))
    assert produce(kbroker, topic, {0: small})[0].error_code == NONE
    for batch in (big, several, small + big):
        r = produce(kbroker, topic, {0: batch})[0]
        assert r.error_code == MESSAGE_TOO_LARGE, r
        assert r.base_offset == -1
    assert offsets(kbroker, topic) == (0, 1)
    assert fetch_values(kbroker, topic) == [(0, b"x" * 100)]


def test_empty_or_null_records_are_refused(kbroker: BrokerProcess) -> None:
    topic, values = seed_topic(kbroker, count=2)
    for records in (b"", None):
        r = produce(kbroker, topic, {0: records})[0]
        assert r.error_code in (CORRUPT_MESSAGE, INVALID_RECORD), r
    assert_intact(kbroker, topic, values)


@pytest.mark.parametrize("case", ["zero-records", "delta-beyond-count"])
def test_batch_with_inconsistent_record_count_is_refused(kbroker: BrokerProcess, case: str) -> None:
    topic, values = seed_topic(kbroker, count=2)
    good = make_batch([b"a"])
    if case == "zero-records":  # record count 0 (offset 57)
        bad = with_crc(good[:57] + struct.pack(">i", 0) + good[61:])
    else:  # last offset delta (offset 23) claims a million records
        bad = with_crc(good[:23] + struct.pack(">i", 1_000_000) + good[27:])
    r = produce(kbroker, topic, {0: bad})[0]
    assert r.error_code in (CORRUPT_MESSAGE, INVALID_RECORD), r
    assert_intact(kbroker, topic, values)


def test_batch_with_undecodable_records_is_refused(kbroker: BrokerProcess) -> None:
    topic, values = seed_topic(kbroker, count=2)
    good = make_batch([b"value-one", b"value-two"])
    bad = with_crc(
        good[:61] + b"\xff" * (len(good) - 61)
    )  # valid header and CRC, records are garbage
    r = produce(kbroker, topic, {0: bad})[0]
    assert r.error_code in (CORRUPT_MESSAGE, INVALID_RECORD), r
    assert_intact(kbroker, topic, values)


def test_acks_0_corrupt_batch_is_not_stored(kbroker: BrokerProcess) -> None:
    topic, values = seed_topic(kbroker, count=2)
    for batch in _corrupt_batches().values():
        # Nothing answers an acks=0 produce; a refused one closes the connection (as Kafka does).
        with Conn(kbroker) as c:
            c.send(frame(encode(produce_request(topic, {0: batch}, acks=0), next(_correlation))))
            c.expect_closed()
    assert_intact(kbroker, topic, values)
    assert produce(kbroker, topic, {0: make_batch([b"next"])})[0].base_offset == 2


def test_acks_0_refused_produce_closes_connection(kbroker: BrokerProcess) -> None:
    topic, _ = seed_topic(kbroker, count=2)
    with Conn(kbroker) as c:
        c.send(
            frame(
                encode(
                    produce_request(topic, {0: _corrupt_batches()["bad-crc-payload"]}, acks=0), 1
                )
            )
            + frame(encode(api_versions_request(3), 2))
        )
        c.expect_closed()


@pytest.mark.parametrize("acks", [2, 5, -2])
def test_invalid_acks_is_refused(kbroker: BrokerProcess, acks: int) -> None:
    topic, values = seed_topic(kbroker, count=2)
    with Conn(kbroker) as c:
        response = c.call(produce_request(topic, {0: make_batch([b"bad-acks"])}, acks=acks))
    assert response.responses[0].partition_responses[0].error_code == 21
    assert_intact(kbroker, topic, values)


# ---------------------------------------------------------------- half frames and stalled clients


def test_half_frame_then_disconnect(
    kbroker: BrokerProcess, bystander: Bystander, stored: Any
) -> None:
    topic, _ = stored
    full = frame(encode(produce_request(topic, {0: make_batch([b"half-sent"])}), 5))
    for cut in (1, 2, 3, 4, 5, 12, len(full) // 2, len(full) - 1):
        with Conn(kbroker) as c:
            c.send(full[:cut])
        bystander.check()
    # Abort with a reset rather than a FIN, too.
    c = Conn(kbroker)
    c.send(full[: len(full) // 2])
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    after_trouble(kbroker, bystander, stored)


def test_stalled_clients_do_not_block_others(
    kbroker: BrokerProcess, bystander: Bystander, stored: Any
) -> None:
    topic, values = stored
    stalled: list[Conn] = []
    try:
        for i in range(30):
            c = Conn(kbroker)
            if i % 3 == 0:
                c.send(b"\x00\x00")  # half a size prefix
            elif i % 3 == 1:
                c.send(
                    struct.pack(">i", 1000) + header_only(PRODUCE, 9, i)
                )  # a size, then part of the frame
            else:
                c.send(
                    struct.pack(">i", MAX_REQUEST_BYTES)
                )  # the largest allowed size, then nothing
            stalled.append(c)
        bystander.check()
        api_versions_ok(kbroker)
        # A librdkafka producer and consumer work meanwhile.
        t = f"stall-{uuid.uuid4().hex[:8]}"
        create_topic(kbroker, t)
        producer = Producer({"bootstrap.servers": kbroker.bootstrap, "linger.ms": 5})
        for i in range(50):
            producer.produce(t, value=str(i).encode())
        assert producer.flush(20) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": kbroker.bootstrap,
                "group.id": f"g-{uuid.uuid4()}",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(t, 0, 0)])
        got: list[int] = []
        try:

            def poll() -> bool:
                msg = consumer.poll(0.5)
                if msg is not None and not msg.error():
                    got.append(int(present(msg.value())))
                return len(got) >= 50

            wait_for(poll, 20, interval=0, what="50 records while clients stall")
        finally:
            consumer.close()
        assert got == list(range(50))
        assert_intact(kbroker, topic, values)
        # The stalled connections are still open (the broker waits for the rest of their frames).
        for c in stalled:
            c.sock.settimeout(0.01)
            with pytest.raises(TimeoutError):
                c.sock.recv(1)
    finally:
        for c in stalled:
            c.close()
    after_trouble(kbroker, bystander, stored)


# ---------------------------------------------------------------- restart: nothing bad reached the disk


def test_corrupt_traffic_leaves_nothing_on_disk(broker_factory: Any) -> None:
    broker: BrokerProcess = broker_factory(["--segment-flush-ms", "200"], name="restart")
    topic, values = seed_topic(broker, partitions=2, count=6)
    for name, batch in _corrupt_batches().items():
        assert produce(broker, topic, {0: batch, 1: batch})[0].error_code == CORRUPT_MESSAGE, name
    for payload in _valid_payloads(topic).values():
        with Conn(broker) as c:
            c.send(frame(payload[: len(payload) // 2]))
            c.expect_closed()
    assert broker.stop() == 0
    broker.start()
    assert_intact(broker, topic, values)


# ---------------------------------------------------------------- fuzzing


_INTERESTING_16 = [0, 1, -1, 0x7FFF, -0x8000, 18, 9, 12]
_INTERESTING_32 = [0, 1, -1, 0x7FFFFFFF, -(2**31), 8, 1 << 20, MAX_REQUEST_BYTES]


@st.composite
def _mutation(draw: Any, payload: bytes) -> bytes:
    data = bytearray(payload)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        kind = draw(
            st.sampled_from(
                ["flip", "byte", "set16", "set32", "truncate", "insert", "delete", "dup"]
            )
        )
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and data:
            data[pos] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
        elif kind == "set16":
            data[pos : pos + 2] = struct.pack(">h", draw(st.sampled_from(_INTERESTING_16)))
        elif kind == "set32":
            data[pos : pos + 4] = struct.pack(">i", draw(st.sampled_from(_INTERESTING_32)))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif kind == "dup":
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 32))]
    return bytes(data)


def _read_until_closed(c: Conn, deadline: float) -> bytes:
    out = bytearray()
    while True:
        c.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            chunk = c.sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return bytes(out)
        if not chunk:
            return bytes(out)
        out += chunk


def test_fuzz_mutated_frames(kbroker: BrokerProcess) -> None:
    protected, values = seed_topic(kbroker, partitions=1, count=20)
    target = f"fuzz-target-{uuid.uuid4().hex[:6]}"
    create_topic(kbroker, target)
    seeds = [
        encode(api_versions_request(3), 11),
        encode(api_versions_request(0), 12),
        encode(produce_request(target, {0: make_batch([b"fuzz-1", b"fuzz-2"])}), 13),
        encode(produce_request(target, {0: make_batch([b"fuzz-3"])}, version=3), 14),
        encode(fetch_request(protected, 0, 0), 15),
        encode(fetch_request(protected, 0, 5, version=4), 16),
        encode(metadata_request([protected, target]), 17),
        encode(metadata_request(None, version=1), 18),
        encode(list_offsets_request(protected, 0, -1), 19),
        encode(list_offsets_request(protected, 0, -2, version=1), 20),
    ]
    log_before = kbroker.log_text().count("handler failed")
    stats = {"answered": 0, "closed": 0}

    @settings(
        max_examples=200,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def fuzz(data: Any) -> None:
        payload = data.draw(st.sampled_from(seeds), label="seed")
        mutated = data.draw(_mutation(payload), label="mutated")
        size = len(mutated)
        if data.draw(st.integers(0, 9), label="size-mode") == 0:
            size = data.draw(
                st.sampled_from([-1, 0, 3, size - 1, size + 1, size + 100, MAX_REQUEST_BYTES + 1]),
                label="size",
            )
        with Conn(kbroker, timeout=5) as c:
            c.send(struct.pack(">i", size) + mutated)
            c.sock.shutdown(
                socket.SHUT_WR
            )  # no more requests: the broker answers what it can, then closes
            answer = _read_until_closed(c, time.monotonic() + 2)
        # Whatever came back is a sequence of whole, well-framed responses.
        pos = 0
        while pos < len(answer):
            assert len(answer) - pos >= 8, f"partial response frame: {answer[pos:].hex()}"
            (n,) = struct.unpack_from(">i", answer, pos)
            assert 4 <= n <= len(answer) - pos - 4, f"bad response size {n}"
            pos += 4 + n
        stats["answered" if answer else "closed"] += 1
        api_versions_ok(kbroker, timeout=5)

    fuzz()
    assert sum(stats.values()) >= 100 and stats["closed"] > 0 and stats["answered"] > 0, stats
    assert_intact(kbroker, protected, values)
    failed = kbroker.log_text().count("handler failed") - log_before
    assert failed == 0, f"{failed} handler crashes on fuzzed input; see {kbroker.log_path}"


# ---------------------------------------------------------------- the listener itself, with failing handlers


class _StubHandlers:
    """Handlers that fail in the ways a bug would: raising, or returning a response
    that cannot be encoded, right away or deferred (as a produce awaiting its fsync is)."""

    def __init__(self) -> None:
        from broker.kafka.handlers import api_versions_response

        async def api_versions(ctx: Any, req: Any, R: Any) -> Any:
            return api_versions_response(R, NONE)

        async def raises(ctx: Any, req: Any, R: Any) -> Any:
            raise RuntimeError("handler bug")

        async def unencodable(ctx: Any, req: Any, R: Any) -> Any:
            return R(topics=[{"name": 12345, "partitions": []}])  # an int where a string belongs

        async def deferred_unencodable(ctx: Any, req: Any, R: Any) -> Any:
            async def later() -> Any:
                return R(responses=[{"name": 12345, "partition_responses": []}])

            return later()

        async def deferred_raises(ctx: Any, req: Any, R: Any) -> Any:
            async def later() -> Any:
                raise OSError("fsync failed in a way nobody handled")

            return later()

        self.by_key = {
            API_VERSIONS: api_versions,
            METADATA: raises,
            LIST_OFFSETS: unencodable,
            PRODUCE: deferred_unencodable,
            FETCH: deferred_raises,
        }


class _InProcessListener:
    def __init__(self, server: Any, port: int, messages: list[str]) -> None:
        self.server = server
        self.kafka_port = port
        self.messages = messages


@pytest.fixture
def stub_listener() -> Iterator[_InProcessListener]:
    """broker.kafka.server.KafkaServer over stub handlers, on an event loop in a thread."""
    import asyncio
    import threading

    from broker.kafka.server import KafkaServer

    # The listener logs tracebacks from its thread. Python 3.11 formats them with ast.parse,
    # whose recursion-depth state is shared between threads (CPython gh-106905), so one
    # racing pytest's own formatting of a failure can crash pytest (INTERNALERROR). Keep
    # the messages only, without formatting tracebacks.
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    server_log = logging.getLogger("broker.kafka.server")
    saved = server_log.handlers[:], server_log.propagate
    server_log.handlers[:] = [Collect()]
    server_log.propagate = False
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, context: messages.append(str(context.get("message"))))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = KafkaServer(_StubHandlers(), MAX_REQUEST_BYTES)  # type: ignore[arg-type]

    async def start() -> int:
        from broker.security.listeners import Listener

        await server.start([Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 0, "127.0.0.1", 0)])
        assert server.server is not None
        return int(server.server.sockets[0].getsockname()[1])

    port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield _InProcessListener(server, port, messages)
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        server_log.handlers[:], server_log.propagate = saved


@pytest.mark.parametrize(
    ("what", "request_"),
    [
        ("handler raises", metadata_request(None)),
        ("response cannot be encoded", list_offsets_request("t", 0, -1)),
        ("deferred response cannot be encoded", produce_request("t", {0: b""})),
        ("deferred response raises", fetch_request("t", 0, 0)),
    ],
)
def test_failing_handler_closes_only_its_connection(
    stub_listener: _InProcessListener, what: str, request_: Any
) -> None:
    listener: Any = stub_listener
    with Conn(listener) as bystander:
        assert bystander.call(api_versions_request(3)).error_code == NONE
        with Conn(listener, timeout=5) as c:
            first = next(_correlation)
            # An answered request, the failing one, and one after it that must not be answered.
            c.send(
                frame(encode(api_versions_request(3), first))
                + frame(encode(request_, 2))
                + frame(encode(api_versions_request(3), 3))
            )
            assert c.recv_response(API_VERSIONS, 3, first).error_code == NONE
            c.expect_closed(timeout=5)
        assert bystander.call(api_versions_request(3)).error_code == NONE
        # The failed connection is closed and forgotten; only the bystander's remains.
        wait_for(
            lambda: len(listener.server.connections) == 1,
            5,
            what=f"the listener to drop the connection ({what})",
        )
    wait_for(
        lambda: not listener.server.connections, 5, what="the listener to drop every connection"
    )
    # The failure was logged by the listener, not left to asyncio as an unhandled exception.
    assert any("closing" in m for m in listener.messages), listener.messages
    assert not any("Unhandled exception" in m for m in listener.messages), listener.messages


@pytest.mark.parametrize(
    "case", ["produce-v3-null-topics", "produce-v9-null-partitions", "fetch-v4-null-topics"]
)
def test_null_for_a_non_nullable_array_is_a_malformed_request(
    kbroker: BrokerProcess, bystander: Bystander, stored: Any, case: str
) -> None:
    """kio reads a -1 (or compact 0) array length as None even where the schema forbids null;
    Kafka's parser refuses that, so the listener must treat it as malformed, not hand it on."""
    topic, _ = stored
    marker = uuid.uuid4().hex[:12]
    if case == "produce-v3-null-topics":
        payload = header_only(PRODUCE, 3, 1, marker.encode()) + struct.pack(
            ">hhii", -1, -1, 1000, -1
        )
    elif case == "produce-v9-null-partitions":
        good = encode(produce_request(topic, {0: make_batch([b"x"])}), 1, client_id=marker)
        name = topic.encode()
        at = good.index(bytes([len(name) + 1]) + name) + 1 + len(name)
        payload = (
            good[:at] + b"\x00" + b"\x00" * 2
        )  # partition_data: compact null; tags of topic and request
    else:
        payload = header_only(FETCH, 4, 1, marker.encode()) + struct.pack(
            ">iiiiBi", -1, 0, 0, 1 << 20, 0, -1
        )
    assert not parses(payload)
    with Conn(kbroker) as c:
        c.send(frame(payload))
        c.expect_closed()
    after_trouble(kbroker, bystander, stored)
    # Refused by the parser (its log line quotes the frame, client id included), not by a crashing handler.
    wait_for(
        lambda: any(
            "malformed" in line and marker.encode().hex() in line
            for line in kbroker.log_text().splitlines()
        ),
        5,
        what="the request to be logged as malformed",
    )


def test_malformed_credential_request_is_logged_without_its_body(kbroker: BrokerProcess) -> None:
    """A SaslAuthenticate that fails to parse is logged with its header only: its body may be
    a PLAIN password (also AlterUserScramCredentials' salted password)."""
    secret = uuid.uuid4().hex.encode()
    correlation_id = random.randrange(1 << 30)
    # v1: auth_bytes claims 1000 bytes, 32 follow
    payload = header_only(36, 1, correlation_id) + struct.pack(">i", 1000) + secret
    assert not parses(payload)
    with Conn(kbroker) as c:
        c.send(frame(payload))
        c.expect_closed()
    header = struct.pack(">hhi", 36, 1, correlation_id).hex()
    wait_for(
        lambda: any(
            "malformed sasl_authenticate v1" in line and header in line
            for line in kbroker.log_text().splitlines()
        ),
        5,
        what="the request to be logged as malformed",
    )
    assert secret.hex() not in kbroker.log_text()
