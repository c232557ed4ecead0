"""A one-request Kafka client (built on kio, as the broker is) for what clients hide.

Consumers decompress transparently and producers retry on their own, so a test
cannot tell from them whether a producer really sent a compressed batch, which
producer id and sequence a batch carries, or what the broker does with a
replayed batch. These helpers fetch a partition's raw record batches, read
their headers, and produce raw batches.

Consumers also hide the group protocol's answers (a client retries, rejoins or
gives up on its own): the group helpers send one JoinGroup, SyncGroup,
Heartbeat, OffsetCommit or LeaveGroup as a given member and return the error
code, so a test can put a group in a given state and see what Kafka's rules
answer there.
"""

from __future__ import annotations

import datetime
import io
import itertools
import socket
import ssl
import struct
import typing
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kio.schema.add_offsets_to_txn.v1.request import AddOffsetsToTxnRequest
from kio.schema.add_offsets_to_txn.v1.response import AddOffsetsToTxnResponse
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.describe_acls.v3.response import DescribeAclsResponse
from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v4.response import FetchResponse
from kio.schema.heartbeat.v3.request import HeartbeatRequest
from kio.schema.heartbeat.v3.response import HeartbeatResponse
from kio.schema.init_producer_id.v1.request import InitProducerIdRequest
from kio.schema.init_producer_id.v1.response import InitProducerIdResponse
from kio.schema.join_group.v5 import request as join_v5
from kio.schema.join_group.v5.response import JoinGroupResponse as JoinGroupResponseV5
from kio.schema.join_group.v9 import request as join_v9
from kio.schema.join_group.v9.response import JoinGroupResponse as JoinGroupResponseV9
from kio.schema.leave_group.v3.request import LeaveGroupRequest, MemberIdentity
from kio.schema.leave_group.v3.response import LeaveGroupResponse
from kio.schema.metadata.v1.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v1.response import MetadataResponse
from kio.schema.offset_commit.v7.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_commit.v7.response import OffsetCommitResponse
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v3.response import ProduceResponse
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.request_header.v2.header import RequestHeader as FlexibleRequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.response_header.v1.header import ResponseHeader as FlexibleResponseHeader
from kio.schema.sync_group.v3.request import SyncGroupRequest, SyncGroupRequestAssignment
from kio.schema.sync_group.v3.response import SyncGroupResponse
from kio.schema.txn_offset_commit.v2.request import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)
from kio.schema.txn_offset_commit.v2.response import TxnOffsetCommitResponse
from kio.schema.types import GroupId, TopicName, TransactionalId
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records, i8, i16, i32, i32Timedelta, i64

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


def _encode(api_key: int, api_version: int, request: Any, correlation_id: int) -> bytes:
    buf = io.BytesIO()
    # a flexible version (tagged fields) has the flexible headers around it
    flexible = request.__flexible__
    header_type = FlexibleRequestHeader if flexible else RequestHeader
    entity_writer(header_type)(
        buf,
        header_type(
            request_api_key=i16(api_key),
            request_api_version=i16(api_version),
            correlation_id=i32(correlation_id),
            client_id="rawkafka",
        ),
    )
    entity_writer(type(request))(buf, request)
    payload = buf.getvalue()
    return struct.pack(">i", len(payload)) + payload


def _decode(frame: bytes, request: Any, response_type: type[Any], correlation_id: int) -> Any:
    # ApiVersions answers with the v0 response header whatever its version (KIP-511)
    flexible = request.__flexible__ and request.__api_key__ != 18
    response_header: type[ResponseHeader | FlexibleResponseHeader] = (
        FlexibleResponseHeader if flexible else ResponseHeader
    )
    header, used = entity_reader(response_header)(frame, 0)
    assert header.correlation_id == correlation_id
    response, _ = entity_reader(response_type)(frame, used)
    return response


def _round_trip(
    bootstrap: str, api_key: int, api_version: int, request: Any, response_type: type[Any]
) -> Any:
    with Connection(bootstrap) as connection:
        return connection.request(api_key, api_version, request, response_type)


class Connection:
    """One connection for several requests in turn (a SASL exchange, a session that expires),
    optionally over TLS."""

    def __init__(
        self, bootstrap: str, timeout: float = 10, tls: ssl.SSLContext | None = None
    ) -> None:
        host, port = bootstrap.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock = tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock

    def __enter__(self) -> typing.Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        """Exactly ``n`` bytes; ConnectionError if the broker closes before."""
        return _recv_exactly(self.sock, n)

    def request(
        self, api_key: int, api_version: int, request: Any, response_type: type[Any]
    ) -> Any:
        """Send one request and read its response; ConnectionError if the broker closed."""
        correlation_id = next(_correlation)
        self.sock.sendall(_encode(api_key, api_version, request, correlation_id))
        (size,) = struct.unpack(">i", self.recv_exact(4))
        frame = self.recv_exact(size)
        return _decode(frame, request, response_type, correlation_id)

    def closed_by_peer(self) -> bool:
        """True once the broker has closed the connection (reads EOF or a reset)."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionError, ssl.SSLError):
            return True


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


def fetch_error(bootstrap: str, topic: str, partition: int = 0) -> int:
    """The error code a Fetch v4 of one partition from offset 0 answers (0: none)."""
    try:
        fetch_raw(bootstrap, topic, partition, max_bytes=1024)
    except AssertionError as refused:
        return int(str(refused).rsplit(" ", 1)[1])
    return 0


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


# ---------------------------------------------------------------- the group protocol


def subscription(*topics: str) -> bytes:
    """A consumer's JoinGroup metadata (``ConsumerProtocolSubscription`` v0, no user data)."""
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


@dataclass(frozen=True)
class Joined:
    """A JoinGroup answer: ``members`` are the member ids the leader is given."""

    error: int
    generation: int
    member_id: str
    leader: str
    members: list[str]
    skip_assignment: bool


def join_group(
    bootstrap: str,
    group: str,
    topics: tuple[str, ...],
    member_id: str = "",
    instance_id: str | None = None,
    version: int = 5,
    session_ms: int = 20_000,
    rebalance_ms: int = 20_000,
) -> Joined:
    """JoinGroup v5 (or v9) as a ``range`` consumer of ``topics``, waiting for the rebalance to
    complete; a dynamic member's MEMBER_ID_REQUIRED is answered by joining with that id."""
    schema = join_v9 if version >= 9 else join_v5
    response_type = JoinGroupResponseV9 if version >= 9 else JoinGroupResponseV5
    while True:
        request = schema.JoinGroupRequest(
            group_id=GroupId(group),
            session_timeout=i32Timedelta.parse(timedelta(milliseconds=session_ms)),
            rebalance_timeout=i32Timedelta.parse(timedelta(milliseconds=rebalance_ms)),
            member_id=member_id,
            group_instance_id=instance_id,
            protocol_type="consumer",
            protocols=(
                schema.JoinGroupRequestProtocol(name="range", metadata=subscription(*topics)),
            ),
        )
        response = _round_trip(bootstrap, 11, version, request, response_type)
        if int(response.error_code) == 79 and not member_id:  # MEMBER_ID_REQUIRED
            member_id = response.member_id
            continue
        return Joined(
            int(response.error_code),
            int(response.generation_id),
            response.member_id,
            response.leader,
            [m.member_id for m in response.members],
            bool(getattr(response, "skip_assignment", False)),
        )


def sync_group(
    bootstrap: str,
    group: str,
    generation: int,
    member_id: str,
    instance_id: str | None = None,
    assignments: dict[str, bytes] | None = None,
) -> tuple[int, bytes]:
    """SyncGroup v3: (error code, this member's assignment)."""
    request = SyncGroupRequest(
        group_id=GroupId(group),
        generation_id=i32(generation),
        member_id=member_id,
        group_instance_id=instance_id,
        assignments=tuple(
            SyncGroupRequestAssignment(member_id=m, assignment=a)
            for m, a in (assignments or {}).items()
        ),
    )
    response = _round_trip(bootstrap, 14, 3, request, SyncGroupResponse)
    return int(response.error_code), bytes(response.assignment)


def heartbeat(
    bootstrap: str, group: str, generation: int, member_id: str, instance_id: str | None = None
) -> int:
    """Heartbeat v3's error code."""
    request = HeartbeatRequest(
        group_id=GroupId(group),
        generation_id=i32(generation),
        member_id=member_id,
        group_instance_id=instance_id,
    )
    return int(_round_trip(bootstrap, 12, 3, request, HeartbeatResponse).error_code)


def commit_offset(
    bootstrap: str,
    group: str,
    generation: int,
    member_id: str,
    topic: str,
    offset: int,
    instance_id: str | None = None,
) -> int:
    """OffsetCommit v7 of one offset for partition 0 of ``topic``: its error code."""
    request = OffsetCommitRequest(
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(generation),
        member_id=member_id,
        group_instance_id=instance_id,
        topics=(
            OffsetCommitRequestTopic(
                name=TopicName(topic),
                partitions=(
                    OffsetCommitRequestPartition(
                        partition_index=i32(0),
                        committed_offset=i64(offset),
                        committed_leader_epoch=i32(-1),
                        committed_metadata=None,
                    ),
                ),
            ),
        ),
    )
    response = _round_trip(bootstrap, 8, 7, request, OffsetCommitResponse)
    (part,) = response.topics[0].partitions
    return int(part.error_code)


def leave_group(bootstrap: str, group: str, members: list[tuple[str, str | None]]) -> list[int]:
    """LeaveGroup v3 of (member id, instance id) pairs: each member's error code."""
    request = LeaveGroupRequest(
        group_id=GroupId(group),
        members=tuple(MemberIdentity(member_id=m, group_instance_id=i) for m, i in members),
    )
    response = _round_trip(bootstrap, 13, 3, request, LeaveGroupResponse)
    assert int(response.error_code) == 0, f"LeaveGroup: error {response.error_code}"
    return [int(m.error_code) for m in response.members]


def describe_acls_error(bootstrap: str) -> tuple[int, str | None]:
    """DescribeAcls v3 of every ACL: the answer's error code and message (librdkafka drops
    them: an error reads as an empty list)."""
    request = DescribeAclsRequest(
        resource_type_filter=i8(1),  # ANY
        resource_name_filter=None,
        pattern_type_filter=i8(1),  # ANY
        principal_filter=None,
        host_filter=None,
        operation=i8(1),  # ANY
        permission_type=i8(1),  # ANY
    )
    response = _round_trip(bootstrap, 29, 3, request, DescribeAclsResponse)
    return int(response.error_code), response.error_message


class TxnOffsets:
    """A transaction that commits a group's offsets (TxnOffsetCommit v2), on one connection:
    InitProducerId and AddOffsetsToTxn when opened, then any number of commits, each
    checked by a Metadata request on the same connection (it stayed open)."""

    def __init__(self, bootstrap: str, transactional_id: str, group: str) -> None:
        self.connection = Connection(bootstrap)
        self.transactional_id, self.group = transactional_id, group
        init = self.connection.request(
            22,
            1,
            InitProducerIdRequest(
                transactional_id=TransactionalId(transactional_id),
                transaction_timeout=i32Timedelta.parse(datetime.timedelta(minutes=5)),
            ),
            InitProducerIdResponse,
        )
        assert init.error_code == 0, init
        self.producer_id, self.epoch = init.producer_id, init.producer_epoch
        added = self.connection.request(
            25,
            1,
            AddOffsetsToTxnRequest(
                transactional_id=TransactionalId(transactional_id),
                producer_id=self.producer_id,
                producer_epoch=self.epoch,
                group_id=GroupId(group),
            ),
            AddOffsetsToTxnResponse,
        )
        assert added.error_code == 0, added

    def commit(self, topic: str, offset: int) -> int:
        """Partition 0's offset of ``topic`` in the transaction: its error code, after a
        Metadata request on the same connection answered."""
        request = TxnOffsetCommitRequest(
            transactional_id=TransactionalId(self.transactional_id),
            group_id=GroupId(self.group),
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            topics=(
                TxnOffsetCommitRequestTopic(
                    name=TopicName(topic),
                    partitions=(
                        TxnOffsetCommitRequestPartition(
                            partition_index=i32(0),
                            committed_offset=i64(offset),
                            committed_metadata=None,
                        ),
                    ),
                ),
            ),
        )
        response = self.connection.request(28, 2, request, TxnOffsetCommitResponse)
        (part,) = response.topics[0].partitions
        metadata = self.connection.request(
            3,
            1,
            MetadataRequest(topics=(MetadataRequestTopic(name=TopicName(topic)),)),
            MetadataResponse,
        )
        assert [t.error_code for t in metadata.topics] == [0], metadata
        return int(part.error_code)

    def close(self) -> None:
        self.connection.close()
