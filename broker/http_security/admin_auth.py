"""HTTP basic auth on the broker's admin API (``admin.authentication.method=BASIC``).

The admin API plans commit rounds, forces flushes, moves partitions between brokers and
describes every topic's offsets and segment objects: where Airflow or Spark reach it from
other hosts (``admin.host=0.0.0.0``), it needs a login as the registry has one. The same
users file format (Jetty's ``user: password[,role...]``, the password plain, ``MD5:`` or
``CRYPT:``); every user may use every route (roles are the registry's only). ``/healthz``
stays open: load balancers and ``icefall up`` probe it, and it tells nothing about the data.

The clients present ``ICEFALL_ADMIN_USER_INFO=user:password`` (``broker.http_security.client``),
which the Airflow plugin fills from the ``icefall_admin`` connection."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from broker import contracts
from broker.http_security.users import User, basic_login
from broker.repeated_log import RepeatedLog

log = logging.getLogger(__name__)

REALM = "icefall-admin"
OPEN_PATHS = frozenset({"/healthz"})


class AdminAuth:
    """The admin API's middleware: every request but ``OPEN_PATHS`` authenticated."""

    def __init__(self, users: Mapping[str, User]) -> None:
        self.users = dict(users)
        self.failures = 0  # failed logins since start (icefall_http_authentication_failures_total)
        self.refusals = RepeatedLog(log)  # a client retrying with a wrong password: a line in 10 s

    def refusal(self, header: str | None) -> str | None:
        """Why an ``Authorization`` header does not log in (never quoting it), or None."""
        found = basic_login(
            self.users,
            header,
            "ICEFALL_ADMIN_USER_INFO=user:password, or Airflow's icefall_admin connection",
        )
        return found if isinstance(found, str) else None

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        refused = self.refusal(request.headers.get("Authorization"))
        if refused is None:
            return await handler(request)
        self.failures += 1
        self.refusals.log(
            refused, "admin API: %s %s refused: %s", request.method, request.path, refused
        )
        return web.json_response(
            contracts.ErrorAnswer(error_code=401, message=refused).to_json(),
            status=401,
            headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
        )
