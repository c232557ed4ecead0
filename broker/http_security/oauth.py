"""OAuth2 on the Iceberg REST catalog: the client-credentials flow at ``/v1/oauth/tokens`` and
signed bearer tokens checked on every other route.

What pyiceberg (``credential=client:secret``), Spark's Iceberg REST catalog
(``spark.sql.catalog.<name>.credential``, ``oauth2-server-uri`` defaulting to
``<uri>/v1/oauth/tokens``) and DuckDB (``CREATE SECRET (TYPE iceberg, CLIENT_ID, CLIENT_SECRET,
OAUTH2_SERVER_URI)``) send: a form ``grant_type=client_credentials&client_id&client_secret&scope``
(or the client in an HTTP Basic header, RFC 6749 2.3.1). Iceberg Java refreshes a token before it
expires with a token exchange (RFC 8693) of the current token; that is answered too.

Tokens are JWTs signed with HMAC-SHA256 (PyJWT) under ``catalog.oauth2.token.signing.key``,
by default a random key made once and kept in HOME (so a restart keeps clients' tokens valid;
brokers sharing a catalog need the same key). A token names its client (``sub``); a client
removed from the clients file loses its tokens at once. No external issuer (JWKS) is accepted:
the catalog is its own authorization server (docs/security-http.md).

A missing, malformed, wrongly signed or expired token is a 401 in the Iceberg error model
(``NotAuthorizedException``): the spec prefers 401 over its optional 419 on expiry, and the
clients then fetch a new token. Token endpoint errors are the spec's ``OAuthError`` body.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import jwt
from aiohttp import web

from broker.http_security.users import User, authenticate, basic_credentials

log = logging.getLogger(__name__)

ALGORITHM = "HS256"
ISSUER = "icefall-catalog"
TOKEN_PATH = "/v1/oauth/tokens"
CLIENT_CREDENTIALS = "client_credentials"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
KEY_FILE = "catalog-token.key"


MIN_KEY_BYTES = 32  # HS256's key should be at least as long as its hash (RFC 7518 3.2)


def signing_key(configured: str | None, home: Path) -> bytes:
    """The configured key, else the one kept in ``HOME/catalog-token.key`` (made on first use,
    readable by the broker's user only).

    The file appears whole or not at all (written to a temporary name, then linked into place):
    a crash mid-write must never leave an empty key, under which anyone could sign tokens. A
    file too short to be one of ours (a crash of an older broker, a hand edit) is made again."""
    if configured is not None:
        key = configured.encode()
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(
                f"catalog.oauth2.token.signing.key must be at least {MIN_KEY_BYTES} bytes, "
                f"got {len(key)}"
            )
        return key
    path = home / KEY_FILE
    try:
        key = path.read_bytes().strip()
    except FileNotFoundError:
        key = b""
    if len(key) >= MIN_KEY_BYTES:
        return key
    tmp = home / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32))
        fh.flush()
        os.fsync(fh.fileno())
    try:
        if path.exists():
            os.replace(tmp, path)  # the short one is no key: replace it
        else:
            with contextlib.suppress(FileExistsError):  # another broker sharing HOME won
                os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_bytes().strip()


def oauth_error(error: str, description: str, status: int) -> web.Response:
    """The spec's ``OAuthError`` answer (and ``WWW-Authenticate`` on a 401)."""
    headers = {"WWW-Authenticate": 'Basic realm="icefall-catalog"'} if status == 401 else None
    return web.json_response(
        {"error": error, "error_description": description}, status=status, headers=headers
    )


def not_authorized(request: web.Request, message: str) -> web.Response:
    from broker.catalog.errors import error_response, head_error

    response = (
        head_error(401)
        if request.method == "HEAD"
        else error_response(401, "NotAuthorizedException", message)
    )
    response.headers["WWW-Authenticate"] = 'Bearer realm="icefall-catalog"'
    return response


class CatalogAuth:
    """Issues tokens to the clients of the clients file and checks them on every request."""

    def __init__(self, clients: Mapping[str, User], key: bytes, lifetime_s: int) -> None:
        self.clients = dict(clients)
        self.key = key
        self.lifetime_s = lifetime_s
        self.failures = 0  # refused tokens and logins since start

    def issue(self, client_id: str, scope: str) -> dict[str, object]:
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": client_id,
            "iat": now,
            "exp": now + self.lifetime_s,
            "scope": scope,
            "jti": secrets.token_hex(8),
        }
        return {
            "access_token": jwt.encode(claims, self.key, algorithm=ALGORITHM),
            "token_type": "bearer",
            "expires_in": self.lifetime_s,
            "issued_token_type": ACCESS_TOKEN_TYPE,
            "scope": scope,
        }

    def verify(self, token: str) -> str:
        """The client a token was issued to; ``jwt.InvalidTokenError`` (with why) otherwise."""
        claims = jwt.decode(
            token,
            self.key,
            algorithms=[ALGORITHM],
            issuer=ISSUER,
            options={"require": ["exp", "iat", "sub", "iss"]},
        )
        client = str(claims["sub"])
        if client not in self.clients:
            raise jwt.InvalidTokenError(f"client {client!r} is no longer allowed")
        return client

    async def token_endpoint(self, request: web.Request) -> web.Response:
        """``POST /v1/oauth/tokens``: client credentials, or a token exchange of a valid token."""
        if request.content_type != "application/x-www-form-urlencoded":
            return oauth_error(
                "invalid_request", "the body must be application/x-www-form-urlencoded", 400
            )
        form = await request.post()
        grant = str(form.get("grant_type", ""))
        scope = str(form.get("scope") or "catalog")
        if grant == CLIENT_CREDENTIALS:
            client_id, secret = str(form.get("client_id", "")), str(form.get("client_secret", ""))
            basic = basic_credentials(request.headers.get("Authorization"))
            if not isinstance(basic, str) and not client_id:
                client_id, secret = basic
            if not client_id or not secret:
                self.failures += 1
                return oauth_error(
                    "invalid_client", "client_id and client_secret are required", 401
                )
            if authenticate(self.clients, client_id, secret) is None:
                self.failures += 1
                log.info("iceberg catalog: token refused to client %r: wrong secret", client_id)
                return oauth_error("invalid_client", "unknown client or wrong client secret", 401)
            return web.json_response(self.issue(client_id, scope))
        if grant == TOKEN_EXCHANGE:
            try:
                client_id = self.verify(str(form.get("subject_token", "")))
            except jwt.InvalidTokenError as exc:
                self.failures += 1
                return oauth_error("invalid_grant", f"subject_token: {exc}", 400)
            return web.json_response(self.issue(client_id, scope))
        return oauth_error(
            "unsupported_grant_type",
            f"grant_type {grant!r}: use client_credentials (or a token exchange to refresh)",
            400,
        )

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path == TOKEN_PATH:
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        # pyiceberg sends "Bearer None" when it has neither a credential nor a token
        if scheme.lower() != "bearer" or token.strip() in ("", "None", "null"):
            self.failures += 1
            return not_authorized(
                request,
                "Not authorized: this catalog needs a bearer token from "
                f"{TOKEN_PATH} (configure the client's credential, client_id:client_secret)",
            )
        try:
            self.verify(token.strip())
        except jwt.ExpiredSignatureError:
            self.failures += 1
            return not_authorized(request, "Not authorized: the token has expired; get a new one")
        except jwt.InvalidTokenError as exc:
            self.failures += 1
            return not_authorized(request, f"Not authorized: invalid token ({exc})")
        return await handler(request)
