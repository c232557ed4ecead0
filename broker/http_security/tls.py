"""TLS for an HTTP service from PEM files, as Kafka's listeners take them with
``ssl.keystore.type=PEM``: one ``...ssl.keystore.location`` file holding the private key and the
certificate chain, with ``...ssl.key.password`` when the key is encrypted."""

from __future__ import annotations

import ssl
from pathlib import Path

from pydantic import SecretStr

from broker.security.tls import new_server_context


class TlsConfigError(ValueError):
    """The PEM file cannot be used; the message names the key and file."""


def server_context(keystore: Path, password: SecretStr | None, key: str) -> ssl.SSLContext:
    """A server context (TLS 1.2 or newer) on the key and chain in ``keystore``."""
    context = new_server_context()
    try:
        context.load_cert_chain(
            str(keystore), password=password.get_secret_value() if password else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(
            f"{key}={keystore}: cannot load a private key and certificate chain from it "
            f"({getattr(exc, 'strerror', None) or exc}); it must be PEM with both"
        ) from None
    return context
