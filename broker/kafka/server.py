"""The Kafka listener: frames requests, dispatches them, writes responses in order.

Requests on one connection are handled one after another (as Kafka does), but
a produce waiting for its fsync does not block reading the next request: the
writer task awaits deferred responses in arrival order. Anything malformed
closes that connection only.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import struct
from typing import Any

from kio.schema.index import api_key_map

from broker.kafka import codec
from broker.kafka.handlers import SUPPORTED_VERSIONS, CloseConnection, ConnectionContext, KafkaHandlers, api_versions_response

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
API_VERSIONS = 18
UNSUPPORTED_VERSION = 35


class KafkaServer:
    def __init__(self, handlers: KafkaHandlers, max_request_bytes: int) -> None:
        self.handlers = handlers
        self.max_request_bytes = max_request_bytes
        self.connections: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None
        self.malformed_requests = 0

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port, limit=2**20, backlog=1024)

    async def close(self) -> None:
        if self.server:
            self.server.close()
        for task in list(self.connections):
            task.cancel()
        if self.connections:
            await asyncio.gather(*self.connections, return_exceptions=True)
        if self.server:
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        peer = writer.get_extra_info("peername")
        host = f"/{peer[0]}" if peer else "/unknown"
        outbox: asyncio.Queue[Any] = asyncio.Queue(MAX_IN_FLIGHT)
        sender = asyncio.create_task(self._send(outbox, writer, host))
        ctx = ConnectionContext(client_id="", client_host=host)
        try:
            while not sender.done():
                size_bytes = await reader.readexactly(4)
                (size,) = struct.unpack(">i", size_bytes)
                if size < 8 or size > self.max_request_bytes:
                    self.malformed_requests += 1
                    log.warning("%s: request size %d outside [8, %d]; closing", host, size, self.max_request_bytes)
                    break
                frame = await reader.readexactly(size)
                item = await self._dispatch(ctx, frame, host)
                if item is None:
                    break
                if item is not _NO_RESPONSE and not await _put(outbox, sender, item):
                    _discard(item)
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
                    await asyncio.wait_for(sender, 30)
            except BaseException:  # noqa: BLE001 - timeout, cancellation, or the sender's own failure
                sender.cancel()
            finally:
                writer.close()
                self.connections.discard(task)

    async def _dispatch(self, ctx: ConnectionContext, frame: bytes, host: str) -> Any:
        """The response (bytes or an awaitable of bytes), _NO_RESPONSE, or None to close."""
        api_key, api_version, correlation_id = codec.peek_header(frame)
        versions = SUPPORTED_VERSIONS.get(api_key)
        if versions is None:
            self.malformed_requests += 1
            log.warning("%s: unknown API key %d; closing", host, api_key)
            return None
        if not versions[0] <= api_version <= versions[1]:
            if api_key == API_VERSIONS:
                # Kafka's rule: answer in v0 with UNSUPPORTED_VERSION and the versions we do speak.
                return codec.encode_response(correlation_id, api_versions_response(codec.Responder(API_VERSIONS, 0), UNSUPPORTED_VERSION))
            self.malformed_requests += 1
            log.warning("%s: %s v%d is not supported (%d..%d); closing", host, api_key_map[api_key], api_version, *versions)
            return None
        try:
            header, request = codec.parse_request(frame)
        except Exception as exc:
            self.malformed_requests += 1
            log.warning("%s: malformed %s v%d request: %s; closing (first bytes %s)", host, api_key_map[api_key],
                        api_version, exc, frame[:64].hex())
            return None
        if header.client_id:
            ctx.client_id = header.client_id
        responder = codec.Responder(api_key, api_version)
        try:
            result = await self.handlers.by_key[api_key](ctx, request, responder)
        except CloseConnection as exc:
            log.info("%s: %s; closing", host, exc)
            return None
        except Exception:
            log.exception("%s: %s v%d handler failed; closing", host, api_key_map[api_key], api_version)
            return None
        if result is None:
            return _NO_RESPONSE
        if inspect.isawaitable(result):
            return _deferred(correlation_id, result)
        try:
            return codec.encode_response(correlation_id, result)
        except Exception:
            log.exception("%s: %s v%d response could not be encoded; closing", host, api_key_map[api_key], api_version)
            return None

    @staticmethod
    async def _send(outbox: asyncio.Queue[Any], writer: asyncio.StreamWriter, host: str) -> None:
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


async def _put(outbox: asyncio.Queue[Any], sender: asyncio.Task[None], item: Any) -> bool:
    """Queue ``item`` for the sender; False if the sender has stopped (it would never be taken)."""
    if sender.done():
        return False
    try:
        outbox.put_nowait(item)
        return True
    except asyncio.QueueFull:
        pass
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


async def _deferred(correlation_id: int, pending: Any) -> bytes:
    return codec.encode_response(correlation_id, await pending)
