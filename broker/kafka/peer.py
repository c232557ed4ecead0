"""Broker-to-broker requests (cluster mode): the transaction coordinator's WriteTxnMarkers to
the leaders of a transaction's partitions that it does not lead itself, as Kafka's coordinator
sends them.

The request is encoded and the response decoded with kio, as the broker's own codec does;
one short-lived connection per leader and call (markers are written once per transaction and
partition leader, so there is no connection to keep warm). The peer is reached on the
listener of the same name as this broker's client listener (the first PLAINTEXT one), as
Kafka's ``inter.broker.listener.name``.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import struct
import time
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v1.header import ResponseHeader
from kio.schema.write_txn_markers.v1.request import WriteTxnMarkersRequest
from kio.schema.write_txn_markers.v1.response import WriteTxnMarkersResponse
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from broker.kafka.codec import build
from broker.ownership import Ownership

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS = 27
_correlation = itertools.count(1)
# what a leader may answer that is worth asking again (it may be moving)
_RETRIABLE = {
    ErrorCode.not_leader_or_follower,
    ErrorCode.kafka_storage_error,
    ErrorCode.request_timed_out,
    ErrorCode.unknown_server_error,
}


def _encode(request: Any, correlation_id: int, client_id: str) -> bytes:
    buf = io.BytesIO()
    entity_writer(RequestHeader)(
        buf,
        RequestHeader(
            request_api_key=i16(WRITE_TXN_MARKERS),
            request_api_version=i16(1),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    entity_writer(WriteTxnMarkersRequest)(buf, request)
    payload = buf.getvalue()
    return struct.pack(">i", len(payload)) + payload


class MarkerSender:
    """``TransactionCoordinator.remote_markers`` in cluster mode: writes a transaction's
    markers into the partitions other brokers lead, asking each partition's leader (as last
    read) again until it answers or ``timeout_s`` passes (TimeoutError: the decision stays in
    Postgres, and the slot's next coordinator completes it)."""

    def __init__(
        self,
        ownership: Ownership,
        listener: str,
        partition_exists: Any,
        timeout_s: float = 30.0,
    ) -> None:
        self.ownership = ownership
        self.listener = listener
        self.partition_exists = partition_exists
        self.timeout_s = timeout_s
        self.client_id = f"icefall-broker-{ownership.node_id}"

    async def __call__(
        self, producer_id: int, producer_epoch: int, commit: bool, partitions: list[tuple[str, int]]
    ) -> None:
        pending = set(partitions)
        deadline = time.monotonic() + self.timeout_s
        last_problem = "no leader"
        while pending:
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for tp in sorted(pending):
                if not self.partition_exists(tp):  # deleted since: nothing to mark
                    pending.discard(tp)
                    continue
                found = self.ownership.leader(*tp)
                if found is not None:
                    by_leader.setdefault(found[0], []).append(tp)
            for node, tps in by_leader.items():
                member = self.ownership.members.get(node)
                address = member.address(self.listener) if member else None
                if address is None:
                    last_problem = f"broker {node} has no {self.listener} listener"
                    continue
                try:
                    codes = await self._send(address, producer_id, producer_epoch, commit, tps)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                    last_problem = f"broker {node} at {address[0]}:{address[1]}: {exc!r}"
                    continue
                for tp, code in codes.items():
                    if code == ErrorCode.none:
                        pending.discard(tp)
                    elif code not in _RETRIABLE and code != ErrorCode.unknown_topic_or_partition:
                        raise TimeoutError(f"broker {node} refused the markers of {tp}: {code!r}")
                    else:
                        last_problem = f"broker {node}: {tp[0]}-{tp[1]}: {code!r}"
            if pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"markers of producer {producer_id} not written to "
                        f"{sorted(pending)} within {self.timeout_s}s ({last_problem})"
                    )
                await asyncio.sleep(0.2)

    async def _send(
        self,
        address: tuple[str, int],
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        partitions: list[tuple[str, int]],
    ) -> dict[tuple[str, int], int]:
        topics: dict[str, list[int]] = {}
        for t, p in partitions:
            topics.setdefault(t, []).append(p)
        request = build(
            WriteTxnMarkersRequest,
            {
                "markers": [
                    {
                        "producer_id": producer_id,
                        "producer_epoch": producer_epoch,
                        "transaction_result": commit,
                        "topics": [
                            {"name": t, "partition_indexes": ps} for t, ps in topics.items()
                        ],
                        "coordinator_epoch": 0,
                    }
                ]
            },
        )
        correlation_id = next(_correlation)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), 5)
        try:
            writer.write(_encode(request, correlation_id, self.client_id))
            await writer.drain()
            (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 15))
            frame = await asyncio.wait_for(reader.readexactly(size), 15)
        finally:
            writer.close()
        header, used = entity_reader(ResponseHeader)(frame, 0)
        if header.correlation_id != correlation_id:
            raise OSError(f"correlation id {header.correlation_id}, expected {correlation_id}")
        response, _ = entity_reader(WriteTxnMarkersResponse)(frame, used)
        return {
            (t.name, int(p.partition_index)): int(p.error_code)
            for m in response.markers
            for t in m.topics
            for p in t.partitions
        }
