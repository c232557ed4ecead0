"""The Kafka listener: frames requests, dispatches them, writes responses in order.

Requests on one connection are handled one after another (as Kafka does), but
a produce waiting for its fsync does not block reading the next request: the
writer task awaits deferred responses in arrival order. Anything malformed
closes that connection only.

One server per listener (``listeners``): on SSL and SASL_SSL listeners the loop's TLS layer
runs the handshake; a failed one (plaintext bytes on a TLS port, an unknown client
certificate) is counted and logged once with the listener named (broker/security/tls.py
hooks the handshake) and ends only that connection. On SASL listeners each connection has
a ``SaslSession`` that admits only the SASL requests until the client is authenticated
(broker/security/sasl.py).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import logging
import ssl
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map

from broker.kafka import codec
from broker.kafka.handlers import (
    SUPPORTED_VERSIONS,
    CloseConnection,
    ConnectionContext,
    KafkaHandlers,
    api_versions_response,
)
from broker.kafka.security_apis import CloseAfterResponse
from broker.kafka.storage_refusals import per_item_refusal
from broker.security import settings as security_settings
from broker.security import tls
from broker.security.listeners import Listener
from broker.security.sasl import SaslSession
from broker.security.stats import AuthStats
from broker.storage.failures import StorageFailureLog, is_storage_failure

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
API_VERSIONS = 18
FETCH = 1
# SaslHandshake, SaslAuthenticate, DescribeUserScramCredentials, AlterUserScramCredentials:
# their bodies may carry a password or a salted password, never dumped into the log
CREDENTIAL_APIS = frozenset({17, 36, 50, 51})


class KafkaServer:
    def __init__(
        self,
        handlers: KafkaHandlers,
        max_request_bytes: int,
        stats: AuthStats | None = None,
    ) -> None:
        self.handlers = handlers
        self.max_request_bytes = max_request_bytes
        self.connections: set[asyncio.Task[None]] = set()
        self.servers: list[asyncio.Server] = []
        self.malformed_requests = 0
        self.stats = stats or AuthStats()
        self.tls_contexts: dict[str, ssl.SSLContext] = {}
        self.storage_failures = StorageFailureLog(log)

    async def start(self, listeners: list[Listener]) -> None:
        """Listen on every listener; TLS contexts are built first, so a bad keystore fails
        the start (``ListenerError`` naming the key) before any port is open."""
        for listener in listeners:
            if listener.tls:
                self.tls_contexts[listener.name] = tls.server_context(
                    self.handlers.config, listener, self._tls_failed
                )
        loop = asyncio.get_running_loop()
        for listener in listeners:
            server = await loop.create_server(
                lambda listener=listener: _KafkaProtocol(
                    self._serve, self.max_request_bytes, listener
                ),
                listener.host or None,
                listener.port,
                backlog=1024,
                ssl=self.tls_contexts.get(listener.name),
                ssl_handshake_timeout=30 if listener.tls else None,
            )
            self.servers.append(server)

    @property
    def server(self) -> asyncio.Server | None:
        return self.servers[0] if self.servers else None

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for task in list(self.connections):
            task.cancel()
        if self.connections:
            await asyncio.gather(*self.connections, return_exceptions=True)
        for server in self.servers:
            await server.wait_closed()

    def _tls_failed(self, listener: Listener, error: BaseException) -> None:
        """A TLS handshake failed (plaintext bytes on a TLS port, a client certificate the
        truststore does not vouch for, ...): counted and logged once; only that connection ends."""
        self.stats.tls_failures[listener.name] += 1
        log.warning(
            "TLS handshake failed on listener %s (%s): %s; closing that connection",
            listener.name,
            listener.protocol,
            error,
        )

    def _bad_size(self, listener: Listener, host: str, size: int) -> None:
        """A size prefix out of bounds: a TLS handshake on a plaintext listener (counted with
        the failed handshakes), or a malformed frame."""
        self.malformed_requests += 1
        if not listener.tls and (size >> 16) in _TLS_RECORD_STARTS:
            self.stats.tls_failures[listener.name] += 1
            log.warning(
                "%s: a TLS handshake on listener %s, which is %s; closing",
                host,
                listener.name,
                listener.protocol,
            )
            return
        log.warning(
            "%s: request size %d outside [8, %d]; closing", host, size, self.max_request_bytes
        )

    def _sasl_session(self, listener: Listener, host: str) -> SaslSession:
        config = self.handlers.config
        store = self.handlers._metadata_store()

        def scram(user: str, mechanism: str) -> Any:
            found = store.scram_credential(user, mechanism)
            if found is None:
                return None
            from broker.security.scram import ScramCredential

            return ScramCredential(*found)

        return SaslSession(
            listener.name,
            host,
            security_settings.mechanisms(config, listener),
            security_settings.plain_users(config, listener),
            scram,
            security_settings.reauth_ms(config, listener),
            self.stats,
        )

    async def _serve(self, reader: _KafkaProtocol, writer: _KafkaProtocol) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        peer = writer.get_extra_info("peername")
        host = f"/{peer[0]}" if peer else "/unknown"
        listener = reader.listener
        ctx = ConnectionContext(client_id="", client_host=host, listener=listener.name)
        try:
            if listener.tls:  # the handshake is done (the loop's TLS layer ran it)
                ctx.principal = tls.principal_of(writer.get_extra_info("ssl_object"))
            if listener.sasl:
                ctx.sasl = self._sasl_session(listener, host)
        except Exception:
            log.exception(
                "%s: cannot set up the connection on listener %s; closing", host, listener
            )
            writer.close()
            self.connections.discard(task)
            return
        outbox: asyncio.Queue[Any] = asyncio.Queue(MAX_IN_FLIGHT)
        sender = asyncio.create_task(self._send(outbox, writer, host))
        try:
            while not sender.done():
                frame = await reader.read_frame()
                if isinstance(frame, int):
                    self._bad_size(listener, host, frame)
                    break
                item = await self._dispatch(ctx, frame, host)
                if item is None:
                    break
                last = isinstance(item, _Last)
                if last:
                    item = item.response
                if item is not _NO_RESPONSE and not await _put(outbox, sender, item):
                    _discard(item)
                    break
                if last:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            # broker shutdown: end quietly (asyncio's stream callback would log a
            # re-raised CancelledError as an error)
            sender.cancel()
        finally:
            # Whatever goes wrong here, the socket is closed and the connection forgotten.
            try:
                if await _put(outbox, sender, None):
                    await asyncio.wait(
                        {sender}, timeout=30
                    )  # not wait_for: its cancellation can hang on 3.11
                    if not sender.done():
                        sender.cancel()
            except BaseException:  # noqa: BLE001 - timeout, cancellation, or the sender's own failure
                sender.cancel()
            finally:
                writer.close()
                self.connections.discard(task)

    async def _dispatch(self, ctx: ConnectionContext, frame: bytes | bytearray, host: str) -> Any:
        """The response (bytes, its buffers, or an awaitable of bytes), _NO_RESPONSE, or None
        to close."""
        api_key, api_version, correlation_id = codec.peek_header(frame)
        versions = SUPPORTED_VERSIONS.get(api_key)
        if versions is None:
            self.malformed_requests += 1
            log.warning("%s: unknown API key %d; closing", host, api_key)
            return None
        if ctx.sasl is not None:
            refusal = ctx.sasl.gate(api_key, api_key_map[api_key])
            if refusal is not None:
                log.warning("%s: %s on listener %s; closing", host, refusal, ctx.listener)
                return None
        if not versions[0] <= api_version <= versions[1]:
            if api_key == API_VERSIONS:
                # Kafka's rule: answer in v0 with ErrorCode.unsupported_version and the versions we do speak.
                return codec.encode_response(
                    correlation_id,
                    api_versions_response(
                        codec.Responder(API_VERSIONS, 0), ErrorCode.unsupported_version
                    ),
                )
            self.malformed_requests += 1
            log.warning(
                "%s: %s v%d is not supported (%d..%d); closing",
                host,
                api_key_map[api_key],
                api_version,
                *versions,
            )
            return None
        try:
            header, request = codec.parse_request(frame)
        except Exception as exc:  # noqa: BLE001 -- whatever fails to parse is the client's malformed frame
            self.malformed_requests += 1
            log.warning(
                "%s: malformed %s v%d request: %s; closing (first bytes %s)",
                host,
                api_key_map[api_key],
                api_version,
                exc,
                # a credential API's body may hold a password or salted password: its fixed
                # header (key, version, correlation id) only
                frame[:8].hex() if api_key in CREDENTIAL_APIS else frame[:64].hex(),
            )
            return None
        if header.client_id:
            ctx.client_id = header.client_id
        if api_key == API_VERSIONS and ctx.sasl is not None:
            ctx.sasl.answered_api_versions()
        responder = codec.Responder(api_key, api_version)
        try:
            result = await self.handlers.by_key[api_key](ctx, request, responder)
        except CloseConnection as exc:
            log.info("%s: %s; closing", host, exc)
            return None
        except CloseAfterResponse as last:
            return _Last(codec.encode_response(correlation_id, last.response))
        except Exception as exc:  # noqa: BLE001 -- answered or logged by _handler_failed
            return self._handler_failed(exc, responder, request, host, correlation_id)
        if result is None:
            return _NO_RESPONSE
        if inspect.isawaitable(result):
            return _deferred(
                correlation_id,
                result,
                lambda exc: self._storage_refusal(responder, request, exc, host),
            )
        try:
            return _encode(api_key, correlation_id, result)
        except Exception:
            log.exception(
                "%s: %s v%d response could not be encoded; closing",
                host,
                api_key_map[api_key],
                api_version,
            )
            return None

    def _handler_failed(
        self,
        exc: Exception,
        responder: codec.Responder,
        request: Any,
        host: str,
        correlation_id: int,
    ) -> bytes | None:
        """The answer to a request whose handler raised, or None to close the connection."""
        if is_storage_failure(exc):
            refusal = self._storage_refusal(responder, request, exc, host)
            return None if refusal is None else codec.encode_response(correlation_id, refusal)
        log.error(
            "%s: %s v%d handler failed; closing",
            host,
            api_key_map[responder.api_key],
            responder.version,
            exc_info=exc,
        )
        return None

    def _storage_refusal(
        self, responder: codec.Responder, request: Any, exc: BaseException, host: str
    ) -> Any:
        """A handler that failed because the broker's storage cannot write (a full disk under
        the metadata database, say: ``broker/storage/failures.py``): the request's answer is
        KAFKA_STORAGE_ERROR with the reason, the connection stays open, and the log gets one
        line a minute, not a traceback per retry. APIs whose response has a top-level error
        code (InitProducerId, JoinGroup, ...) get it there; the others (DeleteTopics,
        TxnOffsetCommit, ...) on each of their items (``storage_refusals``). An API known to
        neither: its connection is closed, still with the one line, since an empty answer
        would read as success."""
        if not is_storage_failure(exc):
            return None
        what = f"{host}: {api_key_map[responder.api_key]}"
        self.storage_failures.refused(what, exc)
        message = f"broker storage: {exc}"
        if any(f.name == "error_code" for f in dataclasses.fields(responder.schema)):
            return responder.error(ErrorCode.kafka_storage_error, message)
        items = per_item_refusal(responder.api_key, request, message)
        return None if items is None else responder(**items)

    @staticmethod
    async def _send(outbox: asyncio.Queue[Any], writer: _KafkaProtocol, host: str) -> None:
        """Writes responses in order until None. If one cannot be produced or written,
        the connection is closed (so the reader stops) and the rest are discarded."""
        failed = False
        while True:
            item = await outbox.get()
            if item is None:
                return
            if failed:
                _discard(item)
                continue
            try:
                if inspect.isawaitable(item):
                    item = await item
                writer.write(item)
                await writer.drain()
            except ConnectionError:
                failed = True
                writer.close()
            except Exception:
                log.exception("%s: a response could not be sent; closing", host)
                failed = True
                writer.close()


_NO_RESPONSE = object()
# The first two bytes of a TLS record carrying a handshake (0x16, then major version 3),
# read as the high half of a Kafka size prefix.
_TLS_RECORD_STARTS = frozenset({0x1603})


class _Last:
    """The last response of a connection: sent, then the connection is closed."""

    def __init__(self, response: bytes) -> None:
        self.response = response


_SCRATCH_BYTES = 64 * 1024
_MAX_QUEUED_FRAMES = 8


class _KafkaProtocol(asyncio.BufferedProtocol):
    """Frames Kafka requests straight out of the socket: a large request is
    received into its own buffer (one copy, kernel to frame), small ones are cut
    from a scratch buffer. Also the connection's writer (write/drain/close)."""

    def __init__(self, serve: Any, max_request_bytes: int, listener: Listener) -> None:
        self._serve = serve
        self.listener = listener
        self._max = max_request_bytes
        self._scratch = bytearray(_SCRATCH_BYTES)
        self._scratch_len = 0
        self._frame: bytearray | None = None
        self._frame_pos = 0
        self._frames: collections.deque[bytes | bytearray | int] = collections.deque()
        self._frame_waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None

    # ---- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not an asyncio.Transport subclass
        self.task = asyncio.get_running_loop().create_task(self._serve(self, self))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_pos :]
        return memoryview(self._scratch)[self._scratch_len :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._frame_pos += nbytes
            if self._frame_pos == len(self._frame):
                self._push(self._frame)
                self._frame = None
            return
        self._scratch_len += nbytes
        self._cut_scratch()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        # half-close: answer what was sent before the EOF, then close (TLS cannot half-close)
        return not self.listener.tls

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake_reader()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("connection lost"))
        self._drain_waiters.clear()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    # ---- framing

    def _cut_scratch(self) -> None:
        view = memoryview(self._scratch)
        pos = 0
        end = self._scratch_len
        while end - pos >= 4:
            size = int.from_bytes(view[pos : pos + 4], "big", signed=True)
            if size < 8 or size > self._max:
                self._push(size)  # the reader reports it and closes
                pos = end
                self._pause_reading()
                break
            available = end - pos - 4
            if available >= size:
                self._push(bytes(view[pos + 4 : pos + 4 + size]))
                pos += 4 + size
                continue
            frame = bytearray(size)
            frame[:available] = view[pos + 4 : end]
            self._frame, self._frame_pos = frame, available
            pos = end
        remaining = end - pos
        if remaining and pos:
            self._scratch[:remaining] = bytes(view[pos:end])  # overlapping: copy first
        self._scratch_len = remaining
        view.release()

    def _push(self, frame: bytes | bytearray | int) -> None:
        self._frames.append(frame)
        if len(self._frames) >= _MAX_QUEUED_FRAMES:
            self._pause_reading()
        self._wake_reader()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _wake_reader(self) -> None:
        if self._frame_waiter is not None and not self._frame_waiter.done():
            self._frame_waiter.set_result(None)

    async def read_frame(self) -> bytes | bytearray | int:
        """The next request (without its size prefix), or the bad size prefix as an int."""
        while not self._frames:
            if self._eof:
                raise asyncio.IncompleteReadError(b"", None)
            self._frame_waiter = asyncio.get_running_loop().create_future()
            await self._frame_waiter
        frame = self._frames.popleft()
        if (
            self._reading_paused
            and len(self._frames) < _MAX_QUEUED_FRAMES // 2
            and not isinstance(frame, int)
        ):
            self._reading_paused = False
            if self.transport is not None:
                self.transport.resume_reading()
        return frame

    # ---- writer side

    def write(self, data: bytes | list[codec.Buffer]) -> None:
        """One response frame, whole or as its buffers (written one by one: the transport
        sends each at once while the socket takes it, and copies only what it cannot)."""
        if self.transport is not None and not self.transport.is_closing():
            if isinstance(data, list):
                for piece in data:
                    self.transport.write(piece)
            else:
                self.transport.write(data)

    async def drain(self) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("connection closed")
        if self._writing_paused:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def get_extra_info(self, name: str) -> Any:
        return self.transport.get_extra_info(name) if self.transport is not None else None


async def _put(outbox: asyncio.Queue[Any], sender: asyncio.Task[None], item: Any) -> bool:
    """Queue ``item`` for the sender; False if the sender has stopped (it would never be taken)."""
    if sender.done():
        return False
    try:
        outbox.put_nowait(item)
    except asyncio.QueueFull:
        pass
    else:
        return True
    put = asyncio.ensure_future(outbox.put(item))
    try:
        await asyncio.wait({put, sender}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not put.done():
            put.cancel()
    return put.done() and not put.cancelled()


def _discard(item: Any) -> None:
    """Drop a response that will not be sent without leaving a never-awaited coroutine."""
    if inspect.iscoroutine(item):
        item.close()
    elif isinstance(item, asyncio.Future):
        item.cancel()


def _encode(api_key: int, correlation_id: int, response: Any) -> bytes | list[codec.Buffer]:
    """A Fetch response as its buffers (its records by reference, uncopied), others whole."""
    if api_key == FETCH:
        return codec.encode_response_parts(correlation_id, response)
    return codec.encode_response(correlation_id, response)


async def _deferred(
    correlation_id: int, pending: Any, on_error: Callable[[BaseException], Any]
) -> bytes:
    """The response of a handler that answers later; ``on_error`` may turn its failure into
    a response (else it propagates: the connection is closed)."""
    try:
        response = await pending
    except Exception as exc:
        response = on_error(exc)
        if response is None:
            raise
    return codec.encode_response(correlation_id, response)
