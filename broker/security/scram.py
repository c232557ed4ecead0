"""SCRAM credentials (RFC 5802/7677) as Kafka keeps them: per user and mechanism the salt, the
iteration count, the stored key and the server key, never the password. A client that
upserts one (AlterUserScramCredentials, as ``kafka-configs --add-config 'SCRAM-SHA-512=[...]'``
and confluent-kafka's admin send it) sends the salted password, computed on its side; the
broker derives the two keys from it and keeps those.

The exchange itself is the ``scramp`` package's server (a maintained implementation of the
RFC, including the username escaping and the proof check); Kafka's SCRAM has no channel
binding, which scramp's plain SCRAM-SHA-* mechanisms match.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.config import BrokerConfig

# Kafka's mechanism ids in Describe/AlterUserScramCredentials, and its iteration bounds.
MECHANISM_IDS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
IDS_BY_NAME = {name: number for number, name in MECHANISM_IDS.items()}
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
MIN_SALT_BYTES = 12  # RFC 5802 servers (scramp) refuse shorter salts


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def row(self, user: str, mechanism: str) -> tuple[str, str, bytes, bytes, bytes, int]:
        """The metadata store's upsertion for this credential of ``user`` under ``mechanism``."""
        return (user, mechanism, self.salt, self.stored_key, self.server_key, self.iterations)


def from_salted_password(
    mechanism: str, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    digest = HASHES[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    return ScramCredential(
        salt=salt,
        stored_key=hashlib.new(digest, client_key).digest(),
        server_key=hmac.new(salted_password, b"Server Key", digest).digest(),
        iterations=iterations,
    )


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i), the password as UTF-8 bytes as Kafka's ScramFormatter takes it."""
    return hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode(), salt, iterations)


def from_password(
    mechanism: str, password: str, iterations: int, salt: bytes | None = None
) -> ScramCredential:
    salt = salt if salt is not None else secrets.token_bytes(32)
    return from_salted_password(
        mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations
    )


def credential_problem(
    name: str, mechanism: str | None, iterations: int, salt: bytes
) -> str | None:
    """Why an upsertion cannot be stored (Kafka's UNACCEPTABLE_CREDENTIAL cases), or None."""
    if not name:
        return "Username must not be empty"
    if mechanism is None:
        return None
    if iterations < MIN_ITERATIONS:
        return f"Too few iterations: {iterations} (at least {MIN_ITERATIONS})"
    if iterations > MAX_ITERATIONS:
        return f"Too many iterations: {iterations} (at most {MAX_ITERATIONS})"
    if len(salt) < MIN_SALT_BYTES:
        return f"Salt of {len(salt)} bytes is too short (at least {MIN_SALT_BYTES})"
    return None


def add_user(
    config: BrokerConfig, user: str, mechanism: str, password: str, iterations: int
) -> str | None:
    """``icefall scram-add``: store a user's credential in the metadata store directly (before
    the broker starts, or beside it on SQLite); why it cannot, or None."""
    from broker.storage.metadata import MetadataStore, MetadataUnavailableError

    problem = credential_problem(user, mechanism, iterations, b"\0" * MIN_SALT_BYTES)
    if problem is None and not password:
        problem = "Password must not be empty"
    if problem is not None:
        return problem
    credential = from_password(mechanism, password, iterations)
    try:
        store = MetadataStore(config.metadata_target)
    except MetadataUnavailableError as exc:
        return f"{exc} (with the broker running, use kafka-configs --alter --entity-type users)"
    try:
        store.alter_scram_credentials([], [credential.row(user, mechanism)])
    finally:
        store.close()
    return None
