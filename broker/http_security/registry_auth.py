"""HTTP basic auth on the schema registry, with per-subject roles.

Clients authenticate as with Confluent's registry: ``basic.auth.credentials.source=USER_INFO``
and ``basic.auth.user.info=user:password`` send ``Authorization: Basic``. Users and their roles
come from a Jetty-style users file (``users``); what a role may do comes from
``schema.registry.authorization.role.<role>`` settings, a comma list of

* ``read:<subjects>``: read schemas, versions, config and mode of those subjects, test
  compatibility against them, look a schema up under them;
* ``write:<subjects>``: register under them (and read them);
* ``admin``: everything, including global and subject config and mode changes and deletes,

where ``<subjects>`` is ``*``, a prefix ending in ``*`` (``orders-*``) or one subject. With no
role settings at all, every authenticated user may do everything (Confluent's registry with
authentication and no authorizer). Lists (``/subjects``, ``/schemas``, the subjects of an id)
show only what the user may read; a schema id is readable when a subject holding it is.

Answers in the registry's error body: 401 ``{"error_code": 40101}`` without or with wrong
credentials (with ``WWW-Authenticate``), 403 ``{"error_code": 40301}`` for a valid user lacking
the permission. The broker's own reads (the produce-time gate) are in-process: no HTTP, no auth.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from broker.http_security.users import User, basic_login
from broker.registry.store import SchemaStore
from broker.repeated_log import RepeatedLog

log = logging.getLogger(__name__)

Action = Literal["read", "write", "admin"]
PRINCIPAL = "icefall.registry.principal"  # set on each request by the middleware
REALM = "SchemaRegistry"


class RoleError(ValueError):
    """A role's permissions cannot be parsed; the message names the key."""


@dataclass(frozen=True)
class Grant:
    action: Action
    pattern: str  # "*", "prefix*" or a subject

    def covers(self, action: Action, subject: str | None) -> bool:
        if self.action == "admin":
            return True
        if action == "admin" or (action == "write" and self.action == "read"):
            return False
        if subject is None:
            return False
        if self.pattern.endswith("*"):
            return subject.startswith(self.pattern[:-1])
        return subject == self.pattern


def parse_role(role: str, text: str, key_prefix: str) -> tuple[Grant, ...]:
    grants = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item == "admin":
            grants.append(Grant("admin", "*"))
            continue
        action, sep, pattern = item.partition(":")
        if not sep or action not in ("read", "write") or not pattern.strip():
            raise RoleError(
                f"{key_prefix}{role}: {item!r} is not read:<subjects>, write:<subjects> or admin"
            )
        grants.append(Grant(action, pattern.strip()))  # type: ignore[arg-type]
    return tuple(grants)


@dataclass(frozen=True)
class Principal:
    """An authenticated user and what their roles grant (``everything``: no roles configured)."""

    name: str
    grants: tuple[Grant, ...]
    everything: bool = False

    def may(self, action: Action, subject: str | None = None) -> bool:
        return self.everything or any(g.covers(action, subject) for g in self.grants)


def unauthorized(message: str) -> web.Response:
    from broker.registry.api import reply

    response = reply({"error_code": 40101, "message": message}, 401)
    response.headers["WWW-Authenticate"] = f'Basic realm="{REALM}", charset="UTF-8"'
    return response


def forbidden(principal: Principal, action: Action, subject: str | None) -> web.Response:
    what = f"Subject: {subject}" if subject is not None else "the registry's global settings"
    return refuse(principal, action, what)


def refuse(principal: Principal, action: Action, what: str) -> web.Response:
    from broker.registry.api import reply

    return reply(
        {
            "error_code": 40301,
            "message": f"User {principal.name} is denied operation {action.capitalize()} on {what}",
        },
        403,
    )


def required(method: str, canonical: str, subject: str | None) -> tuple[Action, str | None] | None:
    """What a route needs: (action, subject), or None when any authenticated user may call it
    (the lists and the id lookups filter or check in their handlers)."""
    if canonical.startswith(("/subjects/", "/compatibility/")):
        if method == "DELETE":
            return ("admin", subject)
        if method == "POST" and canonical.endswith("/versions") and canonical.startswith("/subj"):
            return ("write", subject)
        return ("read", subject)
    if canonical.startswith(("/config", "/mode")):
        if method in ("PUT", "DELETE", "POST"):
            return ("admin", subject)
        return ("read", subject) if subject is not None else None
    return None


class RegistryAuth:
    """The middleware: authenticate every request, check the route's permission."""

    def __init__(
        self,
        users: Mapping[str, User],
        roles: Mapping[str, str],
        key_prefix: str,
        store: SchemaStore,
    ) -> None:
        self.users = dict(users)
        self.store = store
        self.roles = {role: parse_role(role, text, key_prefix) for role, text in roles.items()}
        self.failures = 0  # failed logins since start
        self.refusals = RepeatedLog(log)  # a client retrying a wrong password: a line in 10 s

    def principal(self, user: User) -> Principal:
        if not self.roles:
            return Principal(user.name, (), everything=True)
        grants = tuple(g for role in user.roles for g in self.roles.get(role, ()))
        return Principal(user.name, grants)

    def login(self, header: str | None) -> Principal | str:
        """The principal of an ``Authorization`` header, or why there is none."""
        user = basic_login(self.users, header, "basic.auth.user.info")
        return user if isinstance(user, str) else self.principal(user)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        found = self.login(request.headers.get("Authorization"))
        if isinstance(found, str):
            self.failures += 1
            self.refusals.log(
                found, "schema registry: %s %s refused: %s", request.method, request.path, found
            )
            return unauthorized(found)
        request[PRINCIPAL] = found
        route = request.match_info.route.resource
        if route is not None and request.match_info.http_exception is None:
            subject = request.match_info.get("subject")
            need = required(request.method, route.canonical, subject)
            if need is not None and not found.may(*need):
                return forbidden(found, *need)
            if "id" in request.match_info and not self._may_read_id(request, found):
                return refuse(found, "read", f"Schema id {request.match_info['id']}")
        return await handler(request)

    def _may_read_id(self, request: web.Request, principal: Principal) -> bool:
        """A schema id is readable through any subject holding it (an unknown id: the handler's 404)."""
        if principal.everything:
            return True
        try:
            versions = self.store.versions_of_id(int(request.match_info["id"]), True, None)
        except Exception:  # noqa: BLE001 -- not a number or no such id: the handler answers
            return True
        return any(principal.may("read", sv.subject) for sv in versions)


def readable(request: web.Request, subjects: Iterable[str]) -> list[str]:
    """The subjects the request's user may read (all of them without authentication)."""
    principal = request.get(PRINCIPAL)
    if not isinstance(principal, Principal):
        return list(subjects)
    return [s for s in subjects if principal.may("read", s)]
