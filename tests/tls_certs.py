"""Certificates for TLS tests, made with the ``cryptography`` package: a CA, a server
certificate for 127.0.0.1/localhost signed by it, and client certificates (one signed by the
CA, one self-signed, which the CA does not vouch for)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate (a truststore)
    server: Path  # the server's key and certificate chain in one PEM file (a keystore)
    server_key_encrypted: Path  # the same key, encrypted with server_key_password
    server_chain: Path
    server_key_password: str
    client_cert: Path
    client_key: Path
    client_subject: str  # RFC 2253, as Kafka's principal names it
    stranger_cert: Path  # self-signed: the CA does not know it
    stranger_key: Path


def _name(common_name: str, org: str = "Icefall Tests") -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "NL"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _certificate(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    ca: bool,
    names: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("Icefall Test CA")
    ca = _certificate(ca_name, ca_key, ca_name, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate(
        _name("localhost"),
        server_key,
        ca_name,
        ca_key,
        ca=False,
        names=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate(_name("client-app"), client_key, ca_name, ca_key, ca=False)
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger_name = _name("stranger", "Nobody")
    stranger = _certificate(stranger_name, stranger_key, stranger_name, stranger_key, ca=False)
    password = "server-key-secret"
    files = {
        "ca.pem": _pem(ca),
        "server.pem": _key_pem(server_key) + _pem(server) + _pem(ca),
        "server-key-encrypted.pem": _key_pem(server_key, password),
        "server-chain.pem": _pem(server) + _pem(ca),
        "client.pem": _pem(client),
        "client.key": _key_pem(client_key),
        "stranger.pem": _pem(stranger),
        "stranger.key": _key_pem(stranger_key),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return Pki(
        ca=folder / "ca.pem",
        server=folder / "server.pem",
        server_key_encrypted=folder / "server-key-encrypted.pem",
        server_chain=folder / "server-chain.pem",
        server_key_password=password,
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        client_subject="CN=client-app,O=Icefall Tests,C=NL",
        stranger_cert=folder / "stranger.pem",
        stranger_key=folder / "stranger.key",
    )


@dataclass(frozen=True)
class CertFiles:
    """What the HTTP services' TLS tests use (tests/broker/test_http_security.py)."""

    ca: Path  # the CA certificate (clients trust it)
    keystore: Path  # the server's private key, encrypted with key_password, and its chain
    key_password: str


def make_certs(folder: Path, key_password: str) -> CertFiles:
    """``make_pki``'s CA and server certificate, the key encrypted with ``key_password`` in one
    PEM file with the chain (a ``...ssl.keystore.location`` with ``...ssl.key.password``)."""
    pki = make_pki(folder)
    key = serialization.load_pem_private_key(
        pki.server_key_encrypted.read_bytes(), pki.server_key_password.encode()
    )
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(key_password.encode()),
    )
    keystore = folder / "server-keystore-encrypted.pem"
    keystore.write_bytes(encrypted + pki.server_chain.read_bytes())
    return CertFiles(pki.ca, keystore, key_password)


def pkcs12_truststore(ca: Path, path: Path, password: str) -> Path:
    """A PKCS12 truststore holding ``ca``, made with the JDK's ``keytool`` (what a JVM's
    ``javax.net.ssl.trustStore`` takes)."""
    import subprocess

    subprocess.run(
        [
            "keytool",
            "-importcert",
            "-noprompt",
            "-alias",
            "icefall-test-ca",
            "-file",
            str(ca),
            "-keystore",
            str(path),
            "-storetype",
            "PKCS12",
            "-storepass",
            password,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return path
