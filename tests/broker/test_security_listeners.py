"""TLS and SASL on the Kafka listeners, with real clients: one broker for the module with
PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL listeners at once (plus an SSL listener that
requires client certificates and a SASL_PLAINTEXT one whose sessions expire), certificates
made by the test (tests/tls_certs.py), SCRAM users created with Kafka's own kafka-configs.

Every test keeps apart by topic; the bad-input tests check that only the offending
connection is closed while a good client goes on working."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.api_versions.v3.response import ApiVersionsResponse
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse

from tests.broker import rawkafka
from tests.kafka_tools import kafka_tool
from tests.support import BrokerProcess, free_port, wait_for
from tests.tls_certs import Pki, make_pki

LISTENERS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL", "MTLS", "REAUTH")
REAUTH_MS = 1500
PLAIN_JAAS = "org.apache.kafka.common.security.plain.PlainLoginModule required"


@dataclass
class SecuredBroker:
    process: BrokerProcess
    ports: dict[str, int]
    pki: Pki
    folder: Path

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.process.admin_url + "/metrics", timeout=10) as resp:
            text: str = resp.read().decode()
            return text

    def metric(self, name: str, **labels: str) -> float:
        """A sample of ``/metrics`` (0 when absent: a counter not yet counted)."""
        wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
        for line in self.metrics().splitlines():
            if line.startswith(f"{name}{{{wanted}}} "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    folder = tmp_path_factory.mktemp("security")
    pki = make_pki(folder / "pki")
    ports = {name: free_port() for name in LISTENERS}
    listeners = ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items())
    props = folder / "server.properties"
    props.write_text(
        f"listeners={listeners}\n"
        # clients of the SSL listener are told "localhost" (its certificate names both)
        f"advertised.listeners=SSL://localhost:{ports['SSL']}\n"
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
        "SASL_SSL:SASL_SSL,MTLS:SSL,REAUTH:SASL_PLAINTEXT\n"
        "ssl.keystore.type=PEM\n"
        f"ssl.keystore.location={pki.server}\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={pki.ca}\n"
        "listener.name.mtls.ssl.client.auth=required\n"
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN\n"
        f'listener.name.sasl_plaintext.plain.sasl.jaas.config={PLAIN_JAAS} user_alice="alice-plain" \\\n'
        '    user_bob="bob-secret";\n'
        "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN\n"
        f'listener.name.sasl_ssl.plain.sasl.jaas.config={PLAIN_JAAS} user_erin="erin-secret";\n'
        "listener.name.reauth.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512\n"
        f'listener.name.reauth.plain.sasl.jaas.config={PLAIN_JAAS} user_carol="carol-secret";\n'
        f"listener.name.reauth.connections.max.reauth.ms={REAUTH_MS}\n"
        "auto.create.topics.enable=true\n"
        # ACLs bind only where a test sets one (test_acls_bind_authenticated_principals); the
        # plaintext admin (User:ANONYMOUS) creates them
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n"
        "allow.everyone.if.no.acl.found=true\n"
        "super.users=User:ANONYMOUS\n"
    )
    process = BrokerProcess(folder / "home", ["--config", str(props), "--segment-flush-ms", "200"])
    process.start()
    try:
        broker = SecuredBroker(process, ports, pki, folder)
        # The first SCRAM user, made over the loopback PLAINTEXT listener with Kafka's tool.
        kafka_tool(
            "kafka-configs",
            "--bootstrap-server",
            broker.address("PLAINTEXT"),
            "--alter",
            "--add-config",
            "SCRAM-SHA-256=[iterations=8192,password=alice-secret],"
            "SCRAM-SHA-512=[password=alice-secret]",
            "--entity-type",
            "users",
            "--entity-name",
            "alice",
        )
        yield broker
    finally:
        process.stop()


def _tls(pki: Pki) -> dict[str, str]:
    return {"ssl.ca.location": str(pki.ca)}


def _scram(user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    return {"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}


def _scram_exchange(
    raw: rawkafka.Connection, user: str, password: str, repeat_client_nonce: bool
) -> Any:
    """A raw SCRAM-SHA-512 login (RFC 5802); the answer to the client-final message. With
    ``repeat_client_nonce`` that message is librdkafka's before 2.6.1: ``r=`` is the client
    nonce followed by the whole server nonce (which already begins with it), the proof right
    for the message as sent."""
    handshake = raw.request(
        17, 1, SaslHandshakeRequest(mechanism="SCRAM-SHA-512"), SaslHandshakeResponse
    )
    assert handshake.error_code == 0
    client_nonce = secrets.token_urlsafe(24)
    first_bare = f"n={user},r={client_nonce}"
    server_first = raw.request(
        36,
        2,
        SaslAuthenticateRequest(auth_bytes=f"n,,{first_bare}".encode()),
        SaslAuthenticateResponse,
    )
    assert server_first.error_code == 0, server_first.error_message
    server_text = server_first.auth_bytes.decode()
    attrs = dict(part.split("=", 1) for part in server_text.split(","))
    assert attrs["r"].startswith(client_nonce) and len(attrs["r"]) > len(client_nonce)
    nonce = client_nonce + attrs["r"] if repeat_client_nonce else attrs["r"]
    without_proof = f"c=biws,r={nonce}"
    salted = hashlib.pbkdf2_hmac(
        "sha512", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    auth_message = f"{first_bare},{server_text},{without_proof}".encode()
    signature = hmac.new(hashlib.sha512(client_key).digest(), auth_message, "sha512").digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    return raw.request(
        36,
        2,
        SaslAuthenticateRequest(auth_bytes=f"{without_proof},p={proof.decode()}".encode()),
        SaslAuthenticateResponse,
    )


def round_trip(address: str, conf: dict[str, Any], topic: str, n: int = 5) -> list[str]:
    """Produce n records with confluent-kafka, then consume them back; the values read."""
    base = {"bootstrap.servers": address, **conf}
    producer = Producer({**base, "acks": "all", "message.timeout.ms": 20000})
    for i in range(n):
        producer.produce(topic, f"{topic}-{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {**base, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    got: list[str] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append((msg.value() or b"").decode())
    finally:
        consumer.close()
    return got


def expected(topic: str, n: int = 5) -> list[str]:
    return [f"{topic}-{i}" for i in range(n)]


def test_tls_listeners_with_and_without_client_certificates(secured: SecuredBroker) -> None:
    pki = secured.pki
    assert round_trip(
        secured.address("SSL"), {"security.protocol": "SSL", **_tls(pki)}, "tls-a"
    ) == expected("tls-a")
    # Metadata over the SSL listener names that listener's advertised address, not PLAINTEXT's.
    admin = AdminClient(
        {"bootstrap.servers": secured.address("SSL"), "security.protocol": "SSL", **_tls(pki)}
    )
    brokers = admin.list_topics(timeout=10).brokers
    assert [(b.host, b.port) for b in brokers.values()] == [("localhost", secured.ports["SSL"])]
    plain = AdminClient({"bootstrap.servers": secured.address("PLAINTEXT")}).list_topics(timeout=10)
    assert [(b.host, b.port) for b in plain.brokers.values()] == [
        ("127.0.0.1", secured.ports["PLAINTEXT"])
    ]

    mtls = {
        "security.protocol": "SSL",
        **_tls(pki),
        "ssl.certificate.location": str(pki.client_cert),
        "ssl.key.location": str(pki.client_key),
    }
    assert round_trip(secured.address("MTLS"), mtls, "tls-b") == expected("tls-b")
    before = secured.metric("icefall_tls_handshake_failures_total", listener="MTLS")
    # Without a certificate, or with one the CA did not sign: the handshake fails.
    for conf in (
        {"security.protocol": "SSL", **_tls(pki)},
        {
            **mtls,
            "ssl.certificate.location": str(pki.stranger_cert),
            "ssl.key.location": str(pki.stranger_key),
        },
    ):
        refused = AdminClient({"bootstrap.servers": secured.address("MTLS"), **conf})
        with pytest.raises(KafkaException):
            refused.list_topics(timeout=4)
    wait_for(
        lambda: (
            secured.metric("icefall_tls_handshake_failures_total", listener="MTLS") >= before + 2
        ),
        10,
        what="the failed handshakes counted",
    )


def test_acls_bind_authenticated_principals(secured: SecuredBroker) -> None:
    """The principal a SASL login or a client certificate gives is what ACLs name: User:alice
    may write her topic and User:bob may not; the certificate's User:CN=... may write its
    topic and nobody else. (allow.everyone.if.no.acl.found is on: the ACL on each topic is
    what keeps the others out.)"""
    pki = secured.pki
    admin = AdminClient({"bootstrap.servers": secured.address("PLAINTEXT")})
    for future in admin.create_topics([NewTopic("acl-sasl", 1), NewTopic("acl-mtls", 1)]).values():
        future.result(10)
    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation.WRITE,
            AclPermissionType.ALLOW,
        )  # fmt: skip
        for topic, principal in (
            ("acl-sasl", "User:alice"),
            ("acl-mtls", f"User:{pki.client_subject}"),
        )
    ]
    for future in admin.create_acls(bindings).values():
        future.result(10)

    def produce(address: str, conf: dict[str, Any], topic: str) -> int | None:
        reports: list[Any] = []
        producer = Producer({"bootstrap.servers": address, "message.timeout.ms": 10000, **conf})
        try:
            producer.produce(topic, b"v", callback=lambda err, _msg: reports.append(err))
        except KafkaException as exc:
            # librdkafka refuses at once when its metadata already names the topic
            # unauthorized (its first, all-topics metadata answer can come first)
            return int(exc.args[0].code())
        producer.flush(15)
        assert len(reports) == 1, "no delivery report"
        return None if reports[0] is None else int(reports[0].code())

    plain = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}
    alice = {**plain, "sasl.username": "alice", "sasl.password": "alice-plain"}
    bob = {**plain, "sasl.username": "bob", "sasl.password": "bob-secret"}
    mtls = {
        "security.protocol": "SSL",
        **_tls(pki),
        "ssl.certificate.location": str(pki.client_cert),
        "ssl.key.location": str(pki.client_key),
    }
    refused = KafkaError.TOPIC_AUTHORIZATION_FAILED
    sasl_address = secured.address("SASL_PLAINTEXT")
    assert produce(sasl_address, alice, "acl-sasl") is None
    assert produce(sasl_address, bob, "acl-sasl") == refused
    assert produce(secured.address("MTLS"), mtls, "acl-mtls") is None
    assert produce(sasl_address, alice, "acl-mtls") == refused


def test_scram_over_sasl_ssl_with_every_client(secured: SecuredBroker) -> None:
    pki = secured.pki
    address = secured.address("SASL_SSL")
    sasl_ssl = {"security.protocol": "SASL_SSL", **_tls(pki)}
    # confluent-kafka, SCRAM-SHA-512 (alice was added by kafka-configs in the fixture)
    assert round_trip(
        address, {**sasl_ssl, **_scram("alice", "alice-secret")}, "scram-a"
    ) == expected("scram-a")

    # kafka-python, SCRAM-SHA-256
    from kafka import KafkaConsumer, KafkaProducer

    context = ssl.create_default_context(cafile=str(pki.ca))
    common: dict[str, Any] = {
        "bootstrap_servers": address,
        "security_protocol": "SASL_SSL",
        "ssl_context": context,
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "alice-secret",
    }
    producer = KafkaProducer(**common, acks="all")
    for i in range(3):
        producer.send("scram-kp", f"kp-{i}".encode()).get(timeout=20)
    producer.close()
    consumer = KafkaConsumer(
        "scram-kp", **common, auto_offset_reset="earliest", consumer_timeout_ms=10000
    )
    read = []
    for message in consumer:  # ends after consumer_timeout_ms without a message
        read.append(message.value.decode())
        if len(read) == 3:
            break
    assert read == ["kp-0", "kp-1", "kp-2"]
    consumer.close()

    # librdkafka before 2.6.1 (Debian's kcat 1.7.1 has 2.0.2) sends its own nonce twice in the
    # final SCRAM message; Apache Kafka 4.1.1 refuses that, and so does Icefall (docs/security.md).
    # The same exchange with a correct proof, once with the nonce repeated, once without:
    for repeat in (False, True):
        with rawkafka.Connection(address, tls=context) as raw:
            answer = _scram_exchange(raw, "alice", "alice-secret", repeat_client_nonce=repeat)
            if not repeat:
                assert answer.error_code == 0 and answer.auth_bytes.startswith(b"v="), answer
                continue
            assert answer.error_code == 58  # SASL_AUTHENTICATION_FAILED, Kafka's message:
            assert answer.error_message == (
                "Authentication failed during authentication due to invalid credentials with "
                "SASL mechanism SCRAM-SHA-512"
            )
            wait_for(raw.closed_by_peer, 10, what="the connection closed after the failure")
    # so kcat logs in with PLAIN here
    kcat = shutil.which("kcat")
    if kcat is not None:
        kcat_conf = [
            "-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={pki.ca}",
            "-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=erin", "-X", "sasl.password=erin-secret",
        ]  # fmt: skip
        wrote = subprocess.run(
            [kcat, "-b", address, *kcat_conf, "-P", "-t", "sasl-ssl-kcat"],
            input="k1\nk2\n", text=True, timeout=60, capture_output=True,
        )  # fmt: skip
        assert wrote.returncode == 0, wrote.stderr
        kcat_read = subprocess.run(
            [kcat, "-b", address, *kcat_conf, "-C", "-e", "-q", "-t", "sasl-ssl-kcat"],
            text=True, timeout=60, capture_output=True,
        )  # fmt: skip
        assert kcat_read.returncode == 0, kcat_read.stderr
        assert kcat_read.stdout.split() == ["k1", "k2"]

    # Kafka's Java console producer and consumer with a client properties file
    client = secured.folder / "alice-scram.properties"
    client.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="alice-secret";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={pki.ca}\n"
    )
    b = ["--bootstrap-server", address]
    kafka_tool(
        "kafka-console-producer", *b, "--topic", "scram-java", "--producer.config", str(client),
        stdin="j1\nj2\nj3\n",
    )  # fmt: skip
    consumed = kafka_tool(
        "kafka-console-consumer", *b, "--topic", "scram-java", "--from-beginning",
        "--max-messages", "3", "--consumer.config", str(client),
    ).stdout.split()  # fmt: skip
    assert consumed == ["j1", "j2", "j3"]


def test_scram_credentials_managed_by_admin_clients(secured: SecuredBroker) -> None:
    admin = AdminClient({"bootstrap.servers": secured.address("PLAINTEXT")})
    described_all: Any = admin.describe_user_scram_credentials(["alice"])
    described = described_all["alice"].result(10)
    assert sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos) == [
        (ScramMechanism.SCRAM_SHA_256, 8192),
        (ScramMechanism.SCRAM_SHA_512, 4096),
    ]
    upsert = UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 10000), b"dave-secret"
    )
    admin.alter_user_scram_credentials([upsert])["dave"].result(10)
    sasl_ssl = {"security.protocol": "SASL_SSL", **_tls(secured.pki)}
    assert round_trip(
        secured.address("SASL_SSL"), {**sasl_ssl, **_scram("dave", "dave-secret")}, "scram-dave"
    ) == expected("scram-dave")
    # icefall scram-add writes a user into the metadata store (the first user of a cluster
    # without a PLAINTEXT listener); the running broker reads it at the next login
    from broker import cli

    home = str(secured.process.home)
    assert cli.main(["scram-add", "--home", home, "--user", "frank", "--password", "frank-pw"]) == 0
    assert round_trip(
        secured.address("SASL_SSL"), {**sasl_ssl, **_scram("frank", "frank-pw")}, "scram-frank"
    ) == expected("scram-frank")
    # a user without credentials is RESOURCE_NOT_FOUND for the admin client
    with pytest.raises(KafkaException) as missing:
        missing_all: Any = admin.describe_user_scram_credentials(["nobody"])
        missing_all["nobody"].result(10)
    assert missing.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
    # the stored credential holds no password
    store = (secured.process.home / "metadata.sqlite").read_bytes()
    assert b"dave-secret" not in store


def test_plain_over_sasl_plaintext_and_wrong_passwords(secured: SecuredBroker) -> None:
    address = secured.address("SASL_PLAINTEXT")
    plain = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}
    good = {**plain, "sasl.username": "bob", "sasl.password": "bob-secret"}
    assert round_trip(address, good, "plain-a") == expected("plain-a")

    failed = secured.metric(
        "icefall_failed_authentications_total", listener="SASL_SSL", mechanism="SCRAM-SHA-512"
    )
    assert (
        secured.metric(
            "icefall_successful_authentications_total", listener="SASL_PLAINTEXT", mechanism="PLAIN"
        )
        >= 1
    )
    wrong = {
        "security.protocol": "SASL_SSL",
        **_tls(secured.pki),
        **_scram("alice", "not-her-password"),
    }
    errors: list[KafkaError] = []
    wrong_conf: dict[str, Any] = {"bootstrap.servers": secured.address("SASL_SSL"), **wrong}
    wrong_conf["error_cb"] = errors.append
    admin = AdminClient(wrong_conf)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)

    def reported() -> bool:
        admin.poll(0.1)  # serves error_cb
        return any(e.code() == KafkaError._AUTHENTICATION for e in errors)

    wait_for(reported, 10, what="confluent-kafka reporting the authentication error")
    assert any(
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-512" in e.str()
        for e in errors
    ), errors
    wait_for(
        lambda: (
            secured.metric(
                "icefall_failed_authentications_total",
                listener="SASL_SSL",
                mechanism="SCRAM-SHA-512",
            )
            > failed
        ),
        10,
        what="the failed login counted",
    )
    # PLAIN with a wrong password: Kafka's PLAIN message, through a raw exchange
    with rawkafka.Connection(address) as raw:
        handshake = raw.request(
            17, 1, SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse
        )
        assert handshake.error_code == 0 and list(handshake.mechanisms) == ["PLAIN"]
        answer = raw.request(
            36, 2, SaslAuthenticateRequest(auth_bytes=b"\0bob\0nope"), SaslAuthenticateResponse
        )
        assert answer.error_code == 58  # SASL_AUTHENTICATION_FAILED
        assert answer.error_message == "Authentication failed: Invalid username or password"
        wait_for(raw.closed_by_peer, 10, what="the connection closed after the failure")
        # a mechanism the listener does not offer
    # (a name Kafka does not define is counted as "other": clients choose it, /metrics' labels
    # stay bounded)
    other = secured.metric(
        "icefall_failed_authentications_total", listener="SASL_PLAINTEXT", mechanism="other"
    )
    made_up = f"X-{uuid.uuid4().hex}"
    for mechanism in ("GSSAPI", made_up):
        with rawkafka.Connection(address) as raw:
            refused = raw.request(
                17, 1, SaslHandshakeRequest(mechanism=mechanism), SaslHandshakeResponse
            )
            assert refused.error_code == 33 and list(refused.mechanisms) == ["PLAIN"]
            wait_for(
                raw.closed_by_peer,
                10,
                what="the connection closed after UNSUPPORTED_SASL_MECHANISM",
            )
    assert (
        secured.metric(
            "icefall_failed_authentications_total", listener="SASL_PLAINTEXT", mechanism="other"
        )
        == other + 2
    )
    assert made_up not in secured.metrics()
    # the good client still works after all that
    assert round_trip(address, good, "plain-b") == expected("plain-b")


def test_bad_bytes_close_only_their_connection(secured: SecuredBroker) -> None:
    pki = secured.pki
    tls_before = secured.metric("icefall_tls_handshake_failures_total", listener="PLAINTEXT")
    ssl_before = secured.metric("icefall_tls_handshake_failures_total", listener="SSL")
    # A TLS ClientHello on the plaintext port
    context = ssl.create_default_context(cafile=str(pki.ca))
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        rawkafka.Connection(secured.address("PLAINTEXT"), timeout=5, tls=context)

    def closed_unanswered(
        listener: str, request: Any, response: type[Any], closed: type[OSError] = ConnectionError
    ) -> None:
        """The broker closes a raw connection to ``listener`` instead of answering ``request``."""
        with rawkafka.Connection(secured.address(listener)) as raw, pytest.raises(closed):
            raw.request(request.__api_key__, request.__version__, request, response)

    # Plaintext Kafka bytes on the TLS port
    closed_unanswered(
        "SSL",
        ApiVersionsRequest(client_software_name="raw", client_software_version="1"),
        ApiVersionsResponse,
        closed=OSError,
    )
    # A request other than ApiVersions/SaslHandshake before authenticating: closed unanswered
    closed_unanswered(
        "SASL_PLAINTEXT",
        MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        ),
        MetadataResponse,
    )
    # SaslAuthenticate before SaslHandshake: closed too
    closed_unanswered(
        "SASL_PLAINTEXT",
        SaslAuthenticateRequest(auth_bytes=b"\0bob\0bob-secret"),
        SaslAuthenticateResponse,
    )
    # ApiVersions at a version not served is answered in v0, and the client may retry it
    # before the handshake (a second ApiVersions after a served one closes the connection)
    from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0

    versions = ApiVersionsRequest(client_software_name="raw", client_software_version="1")
    with rawkafka.Connection(secured.address("SASL_PLAINTEXT")) as raw:
        assert raw.request(18, 99, versions, ApiVersionsResponseV0).error_code == 35
        assert raw.request(18, 3, versions, ApiVersionsResponse).error_code == 0
        _login(raw, "bob", "bob-secret")
        assert _metadata(raw).brokers[0].port == secured.ports["SASL_PLAINTEXT"]
    with rawkafka.Connection(secured.address("SASL_PLAINTEXT")) as raw:
        assert raw.request(18, 3, versions, ApiVersionsResponse).error_code == 0
        with pytest.raises(ConnectionError):
            raw.request(18, 3, versions, ApiVersionsResponse)
    wait_for(
        lambda: (
            secured.metric("icefall_tls_handshake_failures_total", listener="PLAINTEXT")
            > tls_before
            and secured.metric("icefall_tls_handshake_failures_total", listener="SSL") > ssl_before
        ),
        10,
        what="both TLS mix-ups counted",
    )
    assert round_trip(
        secured.address("SSL"), {"security.protocol": "SSL", **_tls(pki)}, "still-tls"
    ) == expected("still-tls")
    assert round_trip(secured.address("PLAINTEXT"), {}, "still-plain") == expected("still-plain")
    log = secured.process.log_text()
    assert "a TLS handshake on listener PLAINTEXT" in log
    assert re.search(r"TLS handshake failed on listener SSL", log)
    assert "unexpected metadata request during the SASL handshake" in log


def _login(raw: rawkafka.Connection, user: str, password: str) -> int:
    """A raw PLAIN login; the session lifetime the broker grants."""
    handshake = raw.request(17, 1, SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse)
    assert handshake.error_code == 0
    answer = raw.request(
        36,
        2,
        SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{password}".encode()),
        SaslAuthenticateResponse,
    )
    assert answer.error_code == 0, answer.error_message
    return int(answer.session_lifetime.total_seconds() * 1000)


def _metadata(raw: rawkafka.Connection) -> Any:
    return raw.request(
        3,
        12,
        MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        ),
        MetadataResponse,
    )


def test_reauthentication(secured: SecuredBroker) -> None:
    address = secured.address("REAUTH")
    # A raw client that never re-authenticates is disconnected once its session has expired.
    expired_before = secured.metric("icefall_expired_sessions_total", listener="REAUTH")
    with rawkafka.Connection(address) as raw:
        started = time.monotonic()
        assert _login(raw, "carol", "carol-secret") == REAUTH_MS
        assert _metadata(raw).brokers[0].port == secured.ports["REAUTH"]

        def refused() -> bool:
            try:
                _metadata(raw)
            except ConnectionError:
                return True
            return False

        wait_for(refused, 15, interval=0.2, what="the expired session's connection closed")
        assert time.monotonic() - started >= REAUTH_MS / 1000
    assert secured.metric("icefall_expired_sessions_total", listener="REAUTH") > expired_before

    # One that re-authenticates on the same connection goes on.
    with rawkafka.Connection(address) as raw:
        _login(raw, "carol", "carol-secret")
        # the first re-authentication may begin at once (Kafka's interval of a second is
        # between re-authentications)
        assert _login(raw, "carol", "carol-secret") == REAUTH_MS
        assert _metadata(raw).brokers
    # The Java client re-authenticates on its own (KIP-368): a consumer polling for longer than
    # several session lifetimes keeps its connection and reads everything.
    reauth_before = secured.metric(
        "icefall_successful_reauthentications_total", listener="REAUTH", mechanism="PLAIN"
    )
    client = secured.folder / "carol-plain.properties"
    client.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        f'sasl.jaas.config={PLAIN_JAAS} username="carol" password="carol-secret";\n'
    )
    b = ["--bootstrap-server", address]
    kafka_tool(
        "kafka-console-producer",
        *b,
        "--topic",
        "reauth-java",
        "--producer.config",
        str(client),
        stdin="r1\nr2\n",
    )
    done = kafka_tool(
        "kafka-console-consumer", *b, "--topic", "reauth-java", "--from-beginning",
        "--consumer.config", str(client), "--timeout-ms", str(REAUTH_MS * 4), check=False,
    )  # fmt: skip
    assert done.stdout.split() == ["r1", "r2"], done.stderr
    assert (
        secured.metric(
            "icefall_successful_reauthentications_total", listener="REAUTH", mechanism="PLAIN"
        )
        > reauth_before
    )
    assert "expired without re-authentication" not in done.stderr
