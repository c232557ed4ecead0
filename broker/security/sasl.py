"""SASL on a SASL_PLAINTEXT or SASL_SSL connection, as Kafka's broker runs it
(SaslServerAuthenticator and KIP-368 re-authentication):

- before authentication a connection may send ApiVersions (once, first) and SaslHandshake;
  any other request closes it without an answer (Kafka's "Unexpected Kafka request of type
  ... during SASL handshake");
- SaslHandshake names a mechanism: one of ``sasl.enabled.mechanisms``, else the answer is
  UNSUPPORTED_SASL_MECHANISM with the enabled ones, and the connection is closed. Only v1
  (tokens in SaslAuthenticate requests) is served: Kafka 4 dropped v0 (KIP-896) and every
  maintained client sends v1;
- after the handshake only SaslAuthenticate may follow until the exchange is complete; a
  failed exchange is answered SASL_AUTHENTICATION_FAILED with Kafka's message, and closed;
- with ``connections.max.reauth.ms`` > 0 the session expires that long after it began
  (SaslAuthenticate v1+ tells the client, which re-authenticates on the same connection
  with SaslHandshake + SaslAuthenticate: same mechanism, same principal); a request after
  the expiry closes the connection. Without it a second SaslHandshake is answered
  ILLEGAL_SASL_STATE, as a PLAINTEXT listener answers any.

The exchanges: PLAIN checks the listener's JAAS users (``user_<name>="<password>"``);
SCRAM-SHA-256/512 run scramp's server over the credentials in the metadata store.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

import scramp
from kio.schema.errors import ErrorCode

from broker.security.listeners import MECHANISMS
from broker.security.scram import ScramCredential
from broker.security.stats import AuthStats

log = logging.getLogger(__name__)

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
MIN_REAUTH_INTERVAL_S = 1.0  # Kafka ignores a re-authentication begun within 1 s of the last

ScramLookup = Callable[[str, str], ScramCredential | None]


class AuthFailed(Exception):
    """The exchange failed; ``str(exc)`` is what the client is told, ``detail`` what is logged."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def _invalid_credentials(mechanism: str, reauth: bool) -> str:
    # Kafka's words: the client is not told whether the user exists.
    what = "re-authentication" if reauth else "authentication"
    return f"Authentication failed during {what} due to invalid credentials with SASL mechanism {mechanism}"


class _Plain:
    def __init__(self, users: dict[str, str], reauth: bool) -> None:
        self.users = users
        self.reauth = reauth
        self.user = ""

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthFailed(
                _invalid_credentials("PLAIN", self.reauth),
                f"expected 3 NUL-separated tokens, got {len(parts)}",
            )
        authzid, user_b, password_b = (p.decode("utf-8", "replace") for p in parts)
        self.user = user_b
        if not user_b:
            raise AuthFailed("Authentication failed: username not specified", "no username")
        if not password_b:
            raise AuthFailed("Authentication failed: password not specified", "no password")
        if authzid and authzid != user_b:
            message = (
                "Authentication failed: Client requested an authorization id that is "
                "different from username"
            )
            raise AuthFailed(message, f"authorization id {authzid!r}")
        expected = self.users.get(user_b)
        if expected is None or not hmac.compare_digest(expected.encode(), password_b.encode()):
            raise AuthFailed(
                "Authentication failed: Invalid username or password",
                "unknown user" if expected is None else "wrong password",
            )
        return b"", f"User:{user_b}"


class _Scram:
    def __init__(self, mechanism: str, lookup: ScramLookup, reauth: bool) -> None:
        self.mechanism = mechanism
        self.reauth = reauth
        self.user = ""
        self.found = False
        # (user, credential) read off the event loop before the first step (look_up_credential)
        self.prefetched: tuple[str, ScramCredential | None] | None = None

        def auth_info(user: str) -> tuple[bytes, bytes, bytes, int] | None:
            self.user = user
            if self.prefetched is not None and self.prefetched[0] == user:
                credential = self.prefetched[1]
            else:  # a name read otherwise than scramp reads it: looked up here, on the loop
                credential = lookup(user, mechanism)
            self.found = credential is not None
            if credential is None:
                return None
            return (
                credential.salt,
                credential.stored_key,
                credential.server_key,
                credential.iterations,
            )

        self.server = scramp.ScramMechanism(mechanism).make_server(auth_info)
        self.first = True

    def user_named(self, token: bytes) -> str | None:
        """The user a client-first message names (``gs2-header,n=user,r=nonce``, RFC 5802's
        ``=2C``/``=3D`` escapes undone), None for any other message or none readable."""
        if not self.first:
            return None
        try:
            parts = token.decode("utf-8").split(",")
        except UnicodeDecodeError:
            return None
        if len(parts) < 4 or not parts[2].startswith("n="):
            return None
        return parts[2][2:].replace("=2C", ",").replace("=3D", "=")

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        try:
            message = token.decode("utf-8")
            if self.first:
                self.first = False
                if "tokenauth=true" in message.split(","):
                    raise AuthFailed(
                        _invalid_credentials(self.mechanism, self.reauth),
                        "delegation tokens are not supported",
                    )
                self.server.set_client_first(message)
                return self.server.get_server_first().encode(), None
            self.server.set_client_final(message)
            return self.server.get_server_final().encode(), f"User:{self.user}"
        except AuthFailed:
            raise
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            detail = "unknown user" if self.user and not self.found else str(exc)
            raise AuthFailed(_invalid_credentials(self.mechanism, self.reauth), detail) from exc


class SaslSession:
    """One connection's SASL state (see the module docstring)."""

    def __init__(
        self,
        listener: str,
        host: str,
        mechanisms: list[str],
        plain_users: dict[str, str],
        scram: ScramLookup,
        reauth_ms: int,
        stats: AuthStats,
    ) -> None:
        self.listener = listener
        self.host = host
        self.mechanisms = mechanisms
        self.plain_users = plain_users
        self.scram = scram
        self.reauth_ms = reauth_ms
        self.stats = stats
        self.state = "initial"  # -> versions -> authenticate -> complete (-> authenticate ...)
        self.mechanism: str | None = None
        self.principal: str | None = None
        self.expires_at: float | None = None
        self.last_reauth_start: float | None = None  # the first re-authentication may start at once
        self.reauthenticating = False
        self.bad_reauth_mechanism: str | None = None
        self._exchange: _Plain | _Scram | None = None

    def gate(self, api_key: int, api_name: str, now: float | None = None) -> str | None:
        """None if a request of ``api_key`` may be handled now, else why the connection closes."""
        now = time.monotonic() if now is None else now
        if self.state == "complete":
            if self.expires_at is not None and now >= self.expires_at and api_key != SASL_HANDSHAKE:
                self.stats.expired_sessions[self.listener] += 1
                return (
                    f"{api_name} request after the SASL session of {self.principal} expired "
                    "without re-authentication (connections.max.reauth.ms)"
                )
            return None
        if self.state == "authenticate":
            if api_key == SASL_AUTHENTICATE:
                return None
            return f"unexpected {api_name} request during SASL authentication"
        if api_key == SASL_HANDSHAKE or (api_key == API_VERSIONS and self.state == "initial"):
            return None
        return (
            f"unexpected {api_name} request during the SASL handshake: the client is not "
            "authenticated (is it configured for this listener's security protocol?)"
        )

    def answered_api_versions(self) -> None:
        """ApiVersions was answered at a version the broker serves: no second one (an answer
        of UNSUPPORTED_VERSION leaves the client its retry, as Kafka does)."""
        if self.state == "initial":
            self.state = "versions"

    def handshake(self, mechanism: str, respond: Any) -> tuple[Any, bool] | None:
        """(response, close after it), or None when this handshake is no (re-)authentication:
        the caller answers ILLEGAL_SASL_STATE."""
        now = time.monotonic()
        if self.state == "complete":
            if self.expires_at is None or (
                self.last_reauth_start is not None
                and now - self.last_reauth_start < MIN_REAUTH_INTERVAL_S
            ):
                return None
            self.reauthenticating = True
            self.last_reauth_start = now
        if mechanism not in self.mechanisms:
            # the client names the mechanism: a name Kafka does not define is counted as
            # "other", so unauthenticated clients cannot grow /metrics' label set
            self.stats.failure(self.listener, mechanism if mechanism in MECHANISMS else "other")
            log.info(
                "%s: SASL mechanism %r is not enabled on listener %s (enabled: %s); closing",
                self.host,
                mechanism,
                self.listener,
                ", ".join(self.mechanisms),
            )
            return respond(
                error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=self.mechanisms
            ), True
        if self.reauthenticating and mechanism != self.mechanism:
            self.bad_reauth_mechanism = (
                f"SASL mechanism '{mechanism}' requested by client is not supported for "
                f"re-authentication of mechanism '{self.mechanism}'"
            )
        else:
            self.mechanism = mechanism
        self._exchange = (
            _Plain(self.plain_users, self.reauthenticating)
            if mechanism == "PLAIN"
            else _Scram(mechanism, self.scram, self.reauthenticating)
        )
        self.state = "authenticate"
        return respond(error_code=ErrorCode.none, mechanisms=self.mechanisms), False

    async def look_up_credential(self, token: bytes) -> None:
        """Before ``authenticate`` with a SCRAM client-first message: read the named user's
        credential in a worker thread (with the metadata store on Postgres a lookup is a network
        round trip, which on the event loop would stall every connection) and hand it to the
        exchange. Anything else: nothing to do."""
        exchange = self._exchange
        if self.state != "authenticate" or not isinstance(exchange, _Scram):
            return
        user = exchange.user_named(token)
        if user is not None:
            credential = await asyncio.to_thread(self.scram, user, exchange.mechanism)
            exchange.prefetched = (user, credential)

    def authenticate(self, token: bytes, respond: Any) -> tuple[Any, bool] | None:
        """(response, close after it), or None outside an exchange (ILLEGAL_SASL_STATE)."""
        if self.state != "authenticate" or self._exchange is None:
            return None
        mechanism = self.mechanism or ""
        try:
            if self.bad_reauth_mechanism is not None:
                raise AuthFailed(self.bad_reauth_mechanism, "mechanism changed")
            out, principal = self._exchange.step(token)
            if principal is not None and self.reauthenticating and principal != self.principal:
                raise AuthFailed(
                    "Cannot change principals during re-authentication from "
                    f"{self.principal}: {principal}",
                    "principal changed",
                )
        except AuthFailed as exc:
            self.stats.failure(self.listener, mechanism)
            log.info(
                "%s: SASL/%s %s failed on listener %s for user %r: %s; closing",
                self.host,
                mechanism,
                "re-authentication" if self.reauthenticating else "authentication",
                self.listener,
                self._exchange.user,
                exc.detail,
            )
            return respond(
                error_code=ErrorCode.sasl_authentication_failed,
                error_message=str(exc),
                auth_bytes=b"",
                session_lifetime=0,
            ), True
        lifetime = 0
        if principal is not None:
            self.stats.success(self.listener, mechanism, self.reauthenticating)
            self.principal = principal
            self.state = "complete"
            self._exchange = None
            self.reauthenticating = False
            lifetime = self.reauth_ms
            self.expires_at = time.monotonic() + lifetime / 1000 if lifetime else None
        return respond(
            error_code=ErrorCode.none, error_message=None, auth_bytes=out, session_lifetime=lifetime
        ), False
