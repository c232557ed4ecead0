"""Broker-to-broker requests (cluster mode): the transaction coordinator's WriteTxnMarkers to
the leaders of a transaction's partitions that it does not lead itself, as Kafka's coordinator
sends them.

The request is encoded and the response decoded with kio, as the broker's own codec does;
one short-lived connection per leader and call (markers are written once per transaction and
partition leader, so there is no connection to keep warm). The peer is reached on the
inter-broker listener (``inter.broker.listener.name``; default the first PLAINTEXT listener,
else the first one), secured as that listener is, as Kafka's brokers do it: TLS with the
broker's own truststore (and keystore, for a listener that asks for client certificates) on
SSL/SASL_SSL, and SASL with ``sasl.mechanism.inter.broker.protocol`` (default the listener's
first enabled mechanism) as the ``username``/``password`` of that listener's JAAS config for the
mechanism (``listener.name.<l>.<mechanism>.sasl.jaas.config``). The brokers' principal needs
CLUSTER_ACTION on the cluster (or to be among ``super.users``), as in Kafka.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import io
import itertools
import logging
import secrets
import ssl
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as PlainRequestHeader
from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader as PlainResponseHeader
from kio.schema.response_header.v1.header import ResponseHeader
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
from kio.schema.write_txn_markers.v1.request import WriteTxnMarkersRequest
from kio.schema.write_txn_markers.v1.response import WriteTxnMarkersResponse
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from broker.kafka.codec import build
from broker.ownership import Ownership
from broker.security.listeners import ListenerError

if TYPE_CHECKING:
    from broker.config import BrokerConfig

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS = 27
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
_correlation = itertools.count(1)
# what a leader may answer that is worth asking again (it may be moving)
_RETRIABLE = {
    ErrorCode.not_leader_or_follower,
    ErrorCode.kafka_storage_error,
    ErrorCode.request_timed_out,
    ErrorCode.unknown_server_error,
}


def _encode(request: Any, api_key: int, correlation_id: int, client_id: str) -> bytes:
    buf = io.BytesIO()
    header_type = RequestHeader if request.__flexible__ else PlainRequestHeader
    entity_writer(header_type)(
        buf,
        header_type(
            request_api_key=i16(api_key),
            request_api_version=i16(request.__version__),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    entity_writer(type(request))(buf, request)
    payload = buf.getvalue()
    return struct.pack(">i", len(payload)) + payload


@dataclass(frozen=True)
class PeerSecurity:
    """How this broker reaches its peers: the inter-broker listener's name, its TLS context
    (SSL, SASL_SSL) and its SASL mechanism and credentials (SASL_*)."""

    listener: str
    tls: ssl.SSLContext | None = None
    mechanism: str | None = None
    username: str = ""
    password: str = ""


def peer_security(config: BrokerConfig) -> PeerSecurity:
    """The inter-broker listener and its client side, from the broker's own settings;
    ``ListenerError`` naming the key when they cannot give it (checked at start)."""
    from broker.security import settings

    listeners = config.listener_list()
    name = config.inter_broker_listener_name
    if name is None:
        listener = config.client_listener
    else:
        found = [x for x in listeners if x.name == name.upper()]
        if not found:
            raise ListenerError(
                f"inter.broker.listener.name: {name} is none of the listeners "
                f"({', '.join(x.name for x in listeners)})"
            )
        listener = found[0]
    tls = None
    if listener.tls:
        tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        key = "ssl.truststore.location"
        try:
            if truststore := config.listener_setting(listener, "ssl.truststore.location"):
                tls.load_verify_locations(cafile=truststore)
            elif pem := config.listener_setting(listener, "ssl.truststore.certificates"):
                key = "ssl.truststore.certificates"
                tls.load_verify_locations(cadata=pem)
            if location := config.listener_setting(listener, "ssl.keystore.location"):
                key = "ssl.keystore.location"  # presented if the peer asks (ssl.client.auth)
                tls.load_cert_chain(
                    location, password=config.listener_setting(listener, "ssl.key.password")
                )
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ListenerError(
                f"{key} of the inter-broker listener {listener.name}: {exc}"
            ) from exc
    if not listener.sasl:
        return PeerSecurity(listener.name, tls)
    enabled = settings.mechanisms(config, listener)
    mechanism = (config.sasl_mechanism_inter_broker_protocol or enabled[0]).upper()
    if mechanism not in enabled:
        raise ListenerError(
            f"sasl.mechanism.inter.broker.protocol: {mechanism} is not enabled on the "
            f"inter-broker listener {listener.name} ({', '.join(enabled)})"
        )
    jaas = settings.jaas(config, listener, mechanism)
    options = jaas.options if jaas is not None else {}
    if not options.get("username") or "password" not in options:
        raise ListenerError(
            f"listener.name.{listener.name.lower()}.{mechanism.lower()}.sasl.jaas.config: the "
            f"broker's own username and password (username=... password=...) are needed: "
            f"brokers authenticate to each other on the inter-broker listener {listener.name}"
        )
    return PeerSecurity(listener.name, tls, mechanism, options["username"], options["password"])


class _ScramClient:
    """The client side of SCRAM-SHA-256/512 (RFC 5802/7677, as Kafka's ScramSaslClient)."""

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        self.hash = hashlib.sha256 if mechanism == "SCRAM-SHA-256" else hashlib.sha512
        self.name = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
        self.password = password.encode()
        self.nonce = base64.b64encode(secrets.token_bytes(24)).decode()
        user = username.replace("=", "=3D").replace(",", "=2C")
        self.first_bare = f"n={user},r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        fields = dict(part.split("=", 1) for part in text.split(","))
        nonce, salt, iterations = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
        if not nonce.startswith(self.nonce):
            raise OSError("SCRAM: the server's nonce does not extend this broker's")
        salted = hashlib.pbkdf2_hmac(self.name, self.password, salt, iterations)
        client_key = hmac.new(salted, b"Client Key", self.hash).digest()
        stored_key = self.hash(client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        message = f"{self.first_bare},{text},{without_proof}".encode()
        signature = hmac.new(stored_key, message, self.hash).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", self.hash).digest()
        self.server_signature = hmac.new(server_key, message, self.hash).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        fields = dict(part.split("=", 1) for part in server_final.decode().split(","))
        if base64.b64decode(fields.get("v", "")) != self.server_signature:
            raise OSError("SCRAM: the server's signature does not verify")


class MarkerSender:
    """``TransactionCoordinator.remote_markers`` in cluster mode: writes a transaction's
    markers into the partitions other brokers lead, asking each partition's leader (as last
    read) again until it answers or ``timeout_s`` passes (TimeoutError: the decision stays in
    Postgres, and the slot's next coordinator completes it)."""

    def __init__(
        self,
        ownership: Ownership,
        security: PeerSecurity,
        partition_exists: Any,
        timeout_s: float = 30.0,
    ) -> None:
        self.ownership = ownership
        self.security = security
        self.listener = security.listener
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
        host, port = address
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host,
                port,
                ssl=self.security.tls,
                server_hostname=host if self.security.tls else None,
            ),
            5,
        )
        try:
            if self.security.mechanism is not None:
                await self._authenticate(reader, writer)
            response = await self._call(reader, writer, request, WRITE_TXN_MARKERS)
        finally:
            writer.close()
        assert isinstance(response, WriteTxnMarkersResponse)
        return {
            (t.name, int(p.partition_index)): int(p.error_code)
            for m in response.markers
            for t in m.topics
            for p in t.partitions
        }

    async def _call(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: Any, api_key: int
    ) -> Any:
        correlation_id = next(_correlation)
        writer.write(_encode(request, api_key, correlation_id, self.client_id))
        await writer.drain()
        (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 15))
        frame = await asyncio.wait_for(reader.readexactly(size), 15)
        header_type: Any = ResponseHeader if request.__flexible__ else PlainResponseHeader
        header: Any
        header, used = entity_reader(header_type)(frame, 0)
        if header.correlation_id != correlation_id:
            raise OSError(f"correlation id {header.correlation_id}, expected {correlation_id}")
        response_type: Any = {
            WRITE_TXN_MARKERS: WriteTxnMarkersResponse,
            SASL_HANDSHAKE: SaslHandshakeResponse,
            SASL_AUTHENTICATE: SaslAuthenticateResponse,
        }[api_key]
        response: Any
        response, _ = entity_reader(response_type)(frame, used)
        return response

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """SaslHandshake and SaslAuthenticate as this broker's user (OSError: refused)."""
        security = self.security
        mechanism = security.mechanism or ""
        shake = await self._call(
            reader, writer, SaslHandshakeRequest(mechanism=mechanism), SASL_HANDSHAKE
        )
        if shake.error_code != ErrorCode.none:
            raise OSError(f"SASL handshake for {mechanism}: {shake.error_code!r}")

        async def step(token: bytes) -> bytes:
            answer = await self._call(
                reader, writer, SaslAuthenticateRequest(auth_bytes=token), SASL_AUTHENTICATE
            )
            if answer.error_code != ErrorCode.none:
                raise OSError(
                    f"SASL {mechanism} as {security.username}: {answer.error_code!r} "
                    f"({answer.error_message})"
                )
            return bytes(answer.auth_bytes)

        if mechanism == "PLAIN":
            await step(f"\0{security.username}\0{security.password}".encode())
            return
        scram = _ScramClient(mechanism, security.username, security.password)
        server_first = await step(scram.first())
        scram.verify(await step(scram.final(server_first)))
