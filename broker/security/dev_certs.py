"""Development certificates: a CA and one server certificate signed by it, as PEM files a
broker reads (``ssl.keystore.location``: key and chain in one file; clients trust ``ca.pem``).

What docker-compose.yml's one-shot ``certs-init`` service runs, so the stack's TLS listener
needs no certificate from elsewhere; for anything shared, use certificates from your own CA
instead. Made once: files already there are kept (a restarted stack keeps the CA its clients
trust)::

    python -m broker.security.dev_certs DIR --host broker --host localhost --host 127.0.0.1
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CA_FILE = "ca.pem"
KEYSTORE_FILE = "broker.pem"
VALID_DAYS = 825  # the longest lifetime clients (Apple's, browsers) accept for a server certificate


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Icefall development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make(directory: Path, hosts: list[str]) -> tuple[Path, Path]:
    """(the CA certificate, the server keystore) in ``directory``; kept if both exist."""
    ca_path, keystore_path = directory / CA_FILE, directory / KEYSTORE_FILE
    if ca_path.exists() and keystore_path.exists():
        return ca_path, keystore_path
    if not hosts:
        raise ValueError("name at least one host the certificate is for")
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("Icefall development CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # the key readable by owner and group only (the broker runs in the owner's group)
    fd = os.open(keystore_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "wb") as out:
        out.write(key_pem + server.public_bytes(pem) + ca.public_bytes(pem))
    ca_path.write_bytes(ca.public_bytes(pem))
    return ca_path, keystore_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m broker.security.dev_certs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument(
        "--host", action="append", default=[], help="a DNS name or IP address (repeat)"
    )
    args = parser.parse_args(argv)
    ca, keystore = make(args.directory, args.host)
    print(f"CA {ca}, keystore {keystore}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
