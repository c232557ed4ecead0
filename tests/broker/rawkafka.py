"""A one-request Kafka client (built on kio, as the broker is) for what clients hide.

Consumers decompress transparently and producers retry on their own, so a test
cannot tell from them whether a producer really sent a compressed batch, which
producer id and sequence a batch carries, or what the broker does with a
replayed batch. These helpers fetch a partition's raw record batches, read
their headers, and produce raw batches.
"""

from __future__ import annotations

import io
import itertools
import socket
import struct
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v4.response import FetchResponse
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v3.response import ProduceResponse
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records, i16, i32, i32Timedelta, i64

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
# v2 record batch header: base offset, length, leader epoch, magic, crc, attributes, last offset delta,
# base timestamp, max timestamp, producer id, producer epoch, base sequence, record count
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_correlation = itertools.count(1)


@dataclass(frozen=True)
class Batch:
    base_offset: int
    record_count: int
    codec: str
    producer_id: int
    producer_epoch: int
    base_sequence: int
    data: bytes


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


def _round_trip(
    bootstrap: str, api_key: int, api_version: int, request: Any, response_type: type[Any]
) -> Any:
    host, port = bootstrap.rsplit(":", 1)
    correlation_id = next(_correlation)
    buf = io.BytesIO()
    entity_writer(RequestHeader)(
        buf,
        RequestHeader(
            request_api_key=i16(api_key),
            request_api_version=i16(api_version),
            correlation_id=i32(correlation_id),
            client_id="rawkafka",
        ),
    )
    entity_writer(type(request))(buf, request)
    payload = buf.getvalue()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        frame = _recv_exactly(sock, size)
    header, used = entity_reader(ResponseHeader)(frame, 0)
    assert header.correlation_id == correlation_id
    response, _ = entity_reader(response_type)(frame, used)
    return response


def fetch_raw(
    bootstrap: str, topic: str, partition: int, offset: int = 0, max_bytes: int = 50 * 2**20
) -> bytes:
    """The record-batch bytes a Fetch v4 returns for one partition from ``offset``."""
    request = FetchRequest(
        max_wait=i32Timedelta.parse(timedelta(milliseconds=0)),
        min_bytes=i32(0),
        max_bytes=i32(max_bytes),
        topics=(
            FetchTopic(
                topic=TopicName(topic),
                partitions=(
                    FetchPartition(
                        partition=i32(partition),
                        fetch_offset=i64(offset),
                        partition_max_bytes=i32(max_bytes),
                    ),
                ),
            ),
        ),
    )
    response = _round_trip(bootstrap, 1, 4, request, FetchResponse)
    (part,) = response.responses[0].partitions
    assert int(part.error_code) == 0, f"fetch {topic}-{partition}@{offset}: error {part.error_code}"
    return bytes(part.records or b"")


def fetch_partitions(
    bootstrap: str, topic: str, partitions: list[int], max_bytes: int, partition_max_bytes: int
) -> dict[int, bytes]:
    """One Fetch v4 of several partitions from offset 0 with a request-level ``max_bytes``
    (KIP-74): the record bytes each partition got."""
    request = FetchRequest(
        max_wait=i32Timedelta.parse(timedelta(milliseconds=0)),
        min_bytes=i32(0),
        max_bytes=i32(max_bytes),
        topics=(
            FetchTopic(
                topic=TopicName(topic),
                partitions=tuple(
                    FetchPartition(
                        partition=i32(p),
                        fetch_offset=i64(0),
                        partition_max_bytes=i32(partition_max_bytes),
                    )
                    for p in partitions
                ),
            ),
        ),
    )
    response = _round_trip(bootstrap, 1, 4, request, FetchResponse)
    return {
        int(p.partition_index): bytes(p.records or b"") for p in response.responses[0].partitions
    }


def produce_raw(
    bootstrap: str, topic: str, partition: int, records: bytes, acks: int = -1
) -> tuple[int, int]:
    """Produce record-batch bytes as they are; (error code, base offset) of the answer."""
    request = ProduceRequest(
        transactional_id=None,
        acks=i16(acks),
        timeout=i32Timedelta.parse(timedelta(seconds=10)),
        topic_data=(
            TopicProduceData(
                name=TopicName(topic),
                partition_data=(
                    PartitionProduceData(index=i32(partition), records=Records.parse(records)),
                ),
            ),
        ),
    )
    response = _round_trip(bootstrap, 0, 3, request, ProduceResponse)
    (part,) = response.responses[0].partition_responses
    return int(part.error_code), int(part.base_offset)


def batches(bootstrap: str, topic: str, partition: int) -> list[Batch]:
    """Every stored record batch of a partition, in order, with its header fields."""
    data = fetch_raw(bootstrap, topic, partition)
    found = []
    pos = 0
    while pos + _BATCH_HEADER.size <= len(data):
        (
            base,
            length,
            _epoch,
            magic,
            _crc,
            attributes,
            _delta,
            _t0,
            _t1,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        ) = _BATCH_HEADER.unpack_from(data, pos)
        if pos + 12 + length > len(data):
            break  # a trailing partial batch (the fetch hit max_bytes)
        assert magic == 2, f"unexpected record batch magic {magic}"
        codec = CODECS.get(attributes & 0x7, f"unknown({attributes & 0x7})")
        found.append(
            Batch(
                base,
                count,
                codec,
                producer_id,
                producer_epoch,
                base_sequence,
                data[pos : pos + 12 + length],
            )
        )
        pos += 12 + length
    return found


def batch_codecs(bootstrap: str, topic: str, partition: int) -> list[str]:
    """The compression codec of every stored batch of a partition, in order."""
    return [b.codec for b in batches(bootstrap, topic, partition)]


def with_sequence(batch: bytes, base_sequence: int) -> bytes:
    """A stored batch with another base sequence (and its CRC made right again)."""
    import crc32c

    data = bytearray(batch)
    struct.pack_into(">i", data, 53, base_sequence)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)
