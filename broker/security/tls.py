"""TLS for SSL and SASL_SSL listeners, from PEM as Kafka's ``ssl.keystore.type=PEM`` takes it:
a keystore file holding the private key and the certificate chain
(``ssl.keystore.location``), or both as text (``ssl.keystore.certificate.chain`` and
``ssl.keystore.key``), the key possibly encrypted (``ssl.key.password``); a truststore of
CA certificates (``ssl.truststore.location`` or ``ssl.truststore.certificates``) against
which client certificates are checked when ``ssl.client.auth`` asks for one (on SASL_SSL only
its ``listener.name.<l>.`` form: see ``client_auth``).

The principal of a TLS client is Kafka's default: ``User:`` and the subject of its
certificate in RFC 2253 form (``User:CN=alice,O=Example``), or ``User:ANONYMOUS`` without one.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.security.listeners import Listener, ListenerError

if TYPE_CHECKING:
    from broker.config import BrokerConfig

ANONYMOUS = "User:ANONYMOUS"
_CLIENT_AUTH = {
    "required": ssl.CERT_REQUIRED,
    "requested": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE,
}


def new_server_context() -> ssl.SSLContext:
    """A server context, TLS 1.2 or newer: the one place the Kafka listeners and the HTTP
    services (broker/http_security/tls.py) get theirs, so their TLS floor cannot drift apart."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def server_context(
    config: BrokerConfig,
    listener: Listener,
    on_failure: Callable[[Listener, BaseException], None] | None = None,
) -> ssl.SSLContext:
    """The listener's TLS context; ``ListenerError`` naming the key whose file or text is bad.
    ``on_failure`` hears of every handshake that fails (the loop's TLS layer only closes the
    connection): the context's ``sslobject_class`` reports it."""

    def setting(key: str) -> str | None:
        return config.listener_setting(listener, key)

    context = new_server_context()
    password = setting("ssl.key.password")
    location = setting("ssl.keystore.location")
    try:
        if location:
            key = "ssl.keystore.location"
            context.load_cert_chain(location, password=password)
        else:
            key = "ssl.keystore.certificate.chain"
            _load_pem_text(
                context,
                setting("ssl.keystore.certificate.chain") or "",
                setting("ssl.keystore.key") or "",
                password,
            )
        truststore = setting("ssl.truststore.location")
        certificates = setting("ssl.truststore.certificates")
        if truststore:
            key = "ssl.truststore.location"
            context.load_verify_locations(cafile=truststore)
        elif certificates:
            key = "ssl.truststore.certificates"
            context.load_verify_locations(cadata=certificates)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ListenerError(f"{key} of listener {listener.name}: {_why(exc)}") from exc
    auth = client_auth(config, listener)
    if auth != "none" and not (truststore or certificates):
        raise ListenerError(
            f"ssl.client.auth={auth} on listener {listener.name} needs ssl.truststore.location "
            "or ssl.truststore.certificates (the CAs client certificates are checked against)"
        )
    context.verify_mode = _CLIENT_AUTH[auth]
    if on_failure is not None:
        context.sslobject_class = _reporting(listener, on_failure)
    return context


def client_auth(config: BrokerConfig, listener: Listener) -> str:
    """The listener's ``ssl.client.auth``. On SASL_SSL only the prefixed
    ``listener.name.<l>.ssl.client.auth`` counts, as in Kafka (KIP-684): the broker-wide key,
    meant for SSL listeners, would otherwise demand certificates of SASL clients too."""
    if listener.protocol == "SASL_SSL":
        value = config.per_listener.get(f"{listener.name.lower()}.ssl.client.auth")
    else:
        value = config.listener_setting(listener, "ssl.client.auth")
    return value or "none"


def _reporting(
    listener: Listener, on_failure: Callable[[Listener, BaseException], None]
) -> type[ssl.SSLObject]:
    class ReportingSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise
            except ssl.SSLError as exc:
                on_failure(listener, exc)
                raise

    return ReportingSSLObject


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, ssl.SSLError):
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc)


def _load_pem_text(context: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    """``load_cert_chain`` reads files only: the PEM text goes through a private temporary
    file, removed at once."""
    fd, path = tempfile.mkstemp(prefix="icefall-keystore-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(key.strip() + "\n" + chain.strip() + "\n")
        context.load_cert_chain(path, password=password)
    finally:
        os.unlink(path)


def principal_of(ssl_object: Any) -> str:
    """Kafka's default principal of a TLS connection (see the module docstring)."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return ANONYMOUS
    from cryptography import x509

    return "User:" + x509.load_der_x509_certificate(der).subject.rfc4514_string()
