"""One schema registry writer in a cluster; every other broker forwards writes to it.

Confluent's registry elects one leader through Kafka (its group protocol) and every other
instance forwards the writes it gets (register, delete, config, mode) to the leader's URL,
the caller's Authorization header kept, and answers with what the leader answered. Here
the election is the lease on ``_schemas`` partition 0 (``broker.storage.leases``): the
broker leading that partition is the only one that appends to the topic, so ids and
versions are chosen by one writer knowing every record before them. When the lease
moves (a broker stops or dies), the new leader loads the partition from the index,
where every acknowledged record is, and the store catches up with it before its first
write (``SchemaStore._writing``): nothing is lost and no id is used twice.

Reads are answered by every broker from its own store, which tails ``_schemas`` from the
index (``broker.kafka.internal_topics``). After forwarding a write, a broker catches up
before it answers, so a client reading from the broker it wrote through sees its write.

A write finds no writer while the lease is between owners (at most a lease, ``broker.lease.ms``),
or a writer that does not take connections (killed: its lease has not lapsed yet): it looks
again until a lease and a bit have passed, then gets Confluent's 50004 (unknown leader) or
50003 (forwarding failed). A request the writer got but did not answer is not sent again
(it may have been applied): 50003 at once. A forwarded request never travels on: a broker that
is no longer the writer answers 50004 and the forwarding broker looks again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from broker.kafka.internal_topics import InternalTopic
from broker.registry.api_errors import RegistryError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
FORWARDED_HEADER = "X-Icefall-Forwarded-By"  # the node id that forwarded the request
# what a forwarded request carries on (the body's type, what the caller accepts, its credentials)
KEPT_HEADERS = ("Content-Type", "Accept", "Authorization")
UNKNOWN_LEADER = 50004
FORWARDING_FAILED = 50003
RETRY_S = 0.1


class Leadership(Protocol):
    """What the forwarder needs of ``broker.storage.leases.Leases``."""

    def live_brokers(self) -> list[Any]: ...

    def leases(self) -> list[Any]: ...


def is_write(request: web.Request) -> bool:
    """The requests Confluent's registry forwards to its leader: those that change state.
    ``POST /subjects/S`` (is this schema registered?) and ``POST /compatibility/...`` only read."""
    if request.method in ("PUT", "DELETE"):
        return True
    path = request.path
    return request.method == "POST" and path.startswith("/subjects/") and path.endswith("/versions")


def writer_url(leadership: Leadership, topic: str) -> tuple[int, str] | None:
    """(node id, registry URL) of the live broker holding the lease on ``topic``-0 (blocking)."""
    holder = next(
        (
            lease.node_id
            for lease in leadership.leases()
            if (lease.topic, lease.partition) == (topic, 0) and lease.held
        ),
        None,
    )
    if holder is None:
        return None
    for broker in leadership.live_brokers():
        if broker.node_id == holder:
            endpoints = broker.endpoints
            if isinstance(endpoints, str):
                endpoints = json.loads(endpoints)
            url = endpoints.get("registry")
            return (holder, str(url).rstrip("/")) if url else None
    return None


class Forwarder:
    """The registry's middleware that sends writes to the writer (cluster mode only).

    ``sync``: catch the local store up with the log (after a forwarded write)."""

    def __init__(
        self,
        topic: InternalTopic,
        leadership: Leadership,
        node_id: int,
        sync: Callable[[], Awaitable[None]],
        wait_s: float,
        timeout_s: float = 30.0,
    ) -> None:
        self.topic = topic
        self.leadership = leadership
        self.node_id = node_id
        self.sync = sync
        self.wait_s = wait_s
        self.timeout_s = timeout_s
        self.forwarded = 0  # writes sent on to another broker

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.match_info.http_exception is not None or not is_write(request):
            return await handler(request)
        forwarded_by = request.headers.get(FORWARDED_HEADER)
        deadline = time.monotonic() + self.wait_s
        body = await request.read()
        problem = "no broker holds the registry's lease (on _schemas-0) yet"
        while True:
            if self.topic.leads():
                return await handler(request)
            if forwarded_by is not None:  # never forwarded twice: the sender looks again
                raise RegistryError(
                    500, UNKNOWN_LEADER, f"broker {self.node_id} is not the registry's writer"
                )
            writer = await asyncio.to_thread(writer_url, self.leadership, self.topic.name)
            if writer is not None and writer[0] != self.node_id:
                unreachable: aiohttp.ClientConnectorError | None = None
                try:
                    answer = await self._forward(request, body, *writer)
                except aiohttp.ClientConnectorError as exc:
                    # it never got the request: a writer just killed, whose lease lapses soon
                    answer, unreachable = None, exc
                if answer is not None:
                    return answer
                problem = f"broker {writer[0]} ({writer[1]}) is no longer the writer"
                if unreachable is not None:
                    problem = f"broker {writer[0]} ({writer[1]}) does not answer: {unreachable}"
                    if time.monotonic() >= deadline:
                        raise RegistryError(
                            500,
                            FORWARDING_FAILED,
                            f"Error while forwarding the request to the leader: {problem}",
                        )
            if time.monotonic() >= deadline:
                raise RegistryError(500, UNKNOWN_LEADER, f"Unknown leader: {problem}")
            await asyncio.sleep(RETRY_S)  # the lease is between owners: look again

    async def _forward(
        self, request: web.Request, body: bytes, node_id: int, url: str
    ) -> web.StreamResponse | None:
        """The writer's answer, as it is; None when it says it is not the writer (any more)."""
        headers = {k: request.headers[k] for k in KEPT_HEADERS if k in request.headers}
        headers[FORWARDED_HEADER] = str(self.node_id)
        target = url + request.rel_url.path_qs
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.request(request.method, target, data=body, headers=headers) as response,
            ):
                raw = await response.read()
                status, content_type = response.status, response.content_type
        except aiohttp.ClientConnectorError:
            raise  # not sent: the caller looks for the writer again
        except (aiohttp.ClientError, TimeoutError) as exc:  # sent, maybe applied: not again
            raise RegistryError(
                500,
                FORWARDING_FAILED,
                f"Error while forwarding the request to the leader (broker {node_id}, {url}): {exc}",
            ) from None
        if status == 500 and _error_code(raw) == UNKNOWN_LEADER:
            return None
        self.forwarded += 1
        if status < 300:
            try:
                await self.sync()  # read-your-writes through this broker
            except Exception:  # the write is done; the tail catches up later
                log.exception("schema registry: catching up after a forwarded write")
        return web.Response(body=raw, status=status, content_type=content_type)


def _error_code(raw: bytes) -> int | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body.get("error_code") if isinstance(body, dict) else None
