"""The users (or OAuth2 clients) of an HTTP service, from a file in the format of Jetty's
``PropertyFileLoginModule``, which Confluent's Schema Registry reads through JAAS::

    # user: password[,role ...]
    alice: MD5:5f4dcc3b5aa765d61d8327deb882cf99,readers
    ci: plain-password,writers

So a registry's existing password file works as it is. Passwords may be stored hashed, as Jetty
takes them: ``MD5:<hex md5>`` or ``CRYPT:<unix crypt>``; anything else is the password itself.
(Jetty's ``OBF:`` is an obfuscation, not a hash, and is refused.) Comparisons are constant-time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass, field
from pathlib import Path

NOT_BASIC = "only Basic authentication is accepted"
NO_CREDENTIALS = "HTTP basic authentication is needed"


class UsersFileError(ValueError):
    """The file cannot be used; the message names it, the line and why (never a password)."""


@dataclass(frozen=True)
class User:
    name: str
    credential: str = field(repr=False)  # as stored: plain, MD5:..., CRYPT:...
    roles: tuple[str, ...] = ()

    def check(self, password: str) -> bool:
        stored = self.credential
        if stored.startswith("MD5:"):
            given = hashlib.md5(password.encode(), usedforsecurity=False).hexdigest()
            return hmac.compare_digest(given, stored[4:].strip().lower())
        if stored.startswith("CRYPT:"):
            import crypt  # Python 3.11 has it; only for files that use CRYPT:

            hashed = stored[6:].strip()
            return hmac.compare_digest(crypt.crypt(password, hashed), hashed)
        return hmac.compare_digest(password.encode(), stored.encode())


def load_users(path: Path) -> dict[str, User]:
    """Every user of the file by name. ``UsersFileError`` for an unreadable file or bad line."""
    import javaproperties

    try:
        with open(path, encoding="utf-8") as fp:
            entries: dict[str, str] = javaproperties.load(fp)
    except OSError as exc:
        raise UsersFileError(f"cannot read the users file {path}: {exc.strerror or exc}") from exc
    users: dict[str, User] = {}
    for name, value in entries.items():
        credential, *roles = (part.strip() for part in value.split(","))
        if not name.strip() or not credential:
            raise UsersFileError(f"{path}: user {name!r} has no password")
        if credential.startswith("OBF:"):
            raise UsersFileError(
                f"{path}: user {name!r}: OBF: is an obfuscation, not a hash; "
                "store the password as MD5:<hex> or CRYPT:<crypt>"
            )
        users[name.strip()] = User(name.strip(), credential, tuple(r for r in roles if r))
    return users


def authenticate(users: dict[str, User], name: str, password: str) -> User | None:
    """The user when the password is theirs, else None (an unknown user costs the same work)."""
    user = users.get(name)
    if user is None:
        hmac.compare_digest(password.encode(), b"\0" * len(password.encode()))
        return None
    return user if user.check(password) else None


def basic_credentials(header: str | None) -> tuple[str, str] | str:
    """(user, password) of an ``Authorization: Basic <base64 of user:password>`` header (the
    registry's login, the token endpoint's client authentication), or why it holds none. The
    reason never quotes the header: a client that sent ``user:password`` or its base64 without
    the scheme would find its password in the answer and the broker's log."""
    scheme, _, encoded = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return NOT_BASIC
    try:
        user, sep, password = (
            base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        )
    except (binascii.Error, UnicodeDecodeError):
        sep = ""
    if not sep:
        return "the Basic credentials are not base64 of user:password"
    return user, password


def basic_login(users: dict[str, User], header: str | None, how: str) -> User | str:
    """The user an ``Authorization`` header logs in, or why it does not: a missing header (with
    ``how``, where a client puts the credentials), not Basic, not base64 of user:password, or a
    wrong password; never quoting the header. The registry's and the admin API's login."""
    if not header:
        return f"Unauthorized: {NO_CREDENTIALS} ({how})"
    credentials = basic_credentials(header)
    if isinstance(credentials, str):
        return f"Unauthorized: {credentials}"
    user = authenticate(users, *credentials)
    return "Unauthorized: wrong user name or password" if user is None else user
