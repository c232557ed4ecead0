"""The listener and security settings refused at load time with the key named (no broker
started): unknown protocols, names missing from the protocol map, shared ports, TLS
listeners without a certificate, unknown SASL mechanisms and JAAS text Kafka would refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.config import ConfigError, load_broker_config, to_overrides
from broker.security import settings, tls
from broker.security.listeners import ListenerError
from tests.tls_certs import make_pki


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"listeners": "PLAINTEXT:/127.0.0.1:9092"},
            "listeners: 'PLAINTEXT:/127.0.0.1:9092' is not NAME://host:port",
        ),
        (
            {"listeners": "EXTERNAL://:9093"},
            "listeners: listener name EXTERNAL is not in listener.security.protocol.map",
        ),
        (
            {"listeners": "A://:9093", "listener.security.protocol.map": "A:TLS"},
            "listener.security.protocol.map: unknown security protocol 'TLS' for A",
        ),
        ({"listeners": "PLAINTEXT://:9092,SASL_PLAINTEXT://:9092"}, "both use port 9092"),
        (
            {"listeners": "PLAINTEXT://:9092,PLAINTEXT://:9093"},
            "listener name PLAINTEXT appears twice",
        ),
        ({"advertised.listeners": "PLAINTEXT://h:1"}, "advertised.listeners: needs listeners"),
        (
            {"listeners": "PLAINTEXT://:9092", "advertised.listeners": "SSL://h:1"},
            "advertised.listeners: SSL is not one of the listeners",
        ),
        (
            {"listeners": "SSL://:9093"},
            "ssl.keystore.location: listener SSL (SSL) needs a certificate",
        ),
        (
            {"listeners": "SASL_PLAINTEXT://:9093", "sasl.enabled.mechanisms": "GSSAPI,PLAIN"},
            "sasl.enabled.mechanisms: GSSAPI not supported on listener SASL_PLAINTEXT",
        ),
        (
            {"listeners": "PLAINTEXT://:9092", "listener.name.other.ssl.client.auth": "required"},
            "no listener named OTHER",
        ),
        (
            {"listeners": "PLAINTEXT://:9092", "listener.name.plaintext.num.partitions": "3"},
            "cannot be set per listener",
        ),
        ({"ssl.client.auth": "always"}, "ssl.client.auth"),
        (
            {"listeners": "SSL://:9093", "ssl.keystore.location": "/x", "ssl.keystore.type": "JKS"},
            "Icefall reads PEM files only",
        ),
        ({"sasl.jaas.config": "x"}, "needs Kafka's listener prefix"),
        (
            {
                "listeners": "SASL_SSL://:9093",
                "ssl.keystore.location": "/x",
                "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
            },
            "PLAIN takes org.apache.kafka.common.security.plain.PlainLoginModule",
        ),
        (
            {
                "listeners": "SASL_SSL://:9093",
                "ssl.keystore.location": "/x",
                "listener.name.sasl_ssl.plain.sasl.jaas.config": "PlainLoginModule required user_a",
            },
            "expected LoginModule",
        ),
    ],
)
def test_bad_listener_settings_name_their_key(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_broker_config(overrides=overrides)
    assert message in str(refused.value)


def test_unreadable_jaas_text_is_reported_by_position_not_quoted() -> None:
    """The text after the unreadable point is typically a password: never echoed."""
    with pytest.raises(ConfigError) as refused:
        load_broker_config(
            overrides={
                "listeners": "SASL_PLAINTEXT://:9093",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                    'PlainLoginModule required user_a="s3cret-pw;'
                ),
            }
        )
    assert "cannot read the JAAS text at character 34" in str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_listeners_advertised_and_per_listener_settings() -> None:
    config = load_broker_config(
        overrides={
            "listeners": "INTERNAL://127.0.0.1:9092,EXTERNAL://0.0.0.0:9093",
            "advertised.listeners": "EXTERNAL://kafka.example.com:19093",
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_PLAINTEXT",
            "listener.name.external.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.external.connections.max.reauth.ms": "60000",
            "listener.name.external.plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required\n"
                '  username="admin" password="x" user_alice="a;b \\"c\\"" user_bob=bob-pw;'
            ),
        }
    )
    internal, external = config.listener_list()
    assert (internal.protocol, internal.advertised_host, internal.advertised_port) == (
        "PLAINTEXT",
        "127.0.0.1",
        9092,
    )
    assert (external.protocol, external.advertised_host, external.advertised_port) == (
        "SASL_PLAINTEXT",
        "kafka.example.com",
        19093,
    )
    assert settings.mechanisms(config, external) == ["PLAIN"]
    assert settings.mechanisms(config, internal) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    assert settings.plain_users(config, external) == {"alice": 'a;b "c"', "bob": "bob-pw"}
    assert (settings.reauth_ms(config, external), settings.reauth_ms(config, internal)) == (
        60000,
        0,
    )
    assert config.bootstrap == "127.0.0.1:9092"
    # unset listeners: the one plaintext listener on host and kafka.port, as always
    [default] = load_broker_config(flags={"kafka_port": 9999}).listener_list()
    assert (default.name, default.protocol, default.port) == ("PLAINTEXT", "PLAINTEXT", 9999)


def test_tls_contexts_from_pem_files_and_text(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    text = load_broker_config(
        overrides={
            "listeners": "SSL://127.0.0.1:9093",
            "ssl.keystore.certificate.chain": pki.server_chain.read_text(),
            "ssl.keystore.key": pki.server_key_encrypted.read_text(),
            "ssl.key.password": pki.server_key_password,
            "ssl.truststore.certificates": pki.ca.read_text(),
            "ssl.client.auth": "required",
        }
    )
    assert "server-key-secret" not in repr(text)
    [listener] = text.listener_list()
    assert tls.server_context(text, listener).verify_mode.name == "CERT_REQUIRED"
    wrong = text.model_copy(update={"ssl_key_password": "not-it"})
    with pytest.raises(ListenerError, match="ssl.keystore.certificate.chain of listener SSL"):
        tls.server_context(wrong, listener)
    missing = load_broker_config(
        overrides={"listeners": "SSL://:9093", "ssl.keystore.location": str(tmp_path / "nope.pem")}
    )
    with pytest.raises(ListenerError, match="ssl.keystore.location of listener SSL: No such file"):
        tls.server_context(missing, missing.listener_list()[0])
    no_trust = load_broker_config(
        overrides={
            "listeners": "SSL://:9093",
            "ssl.keystore.location": str(pki.server),
            "ssl.client.auth": "required",
        }
    )
    with pytest.raises(ListenerError, match="needs ssl.truststore.location"):
        tls.server_context(no_trust, no_trust.listener_list()[0])
    # SASL_SSL honours only the prefixed ssl.client.auth (KIP-684), SSL the broker-wide one too
    both = {
        "listeners": "SSL://127.0.0.1:9093,SASL_SSL://127.0.0.1:9094",
        "ssl.keystore.location": str(pki.server),
        "ssl.truststore.location": str(pki.ca),
        "ssl.client.auth": "required",
    }
    config = load_broker_config(overrides=both)
    modes = [tls.server_context(config, x).verify_mode.name for x in config.listener_list()]
    assert modes == ["CERT_REQUIRED", "CERT_NONE"]
    config = load_broker_config(
        overrides={**both, "listener.name.sasl_ssl.ssl.client.auth": "requested"}
    )
    assert tls.server_context(config, config.listener_list()[1]).verify_mode.name == "CERT_OPTIONAL"


PASSWORD = "ann-has-a-long-password"


def test_scram_add_stores_keys_not_the_password(tmp_path: Path) -> None:
    from broker import cli
    from broker.security import scram
    from broker.storage.metadata import MetadataStore

    home = ["--home", str(tmp_path)]
    assert (
        cli.main(
            [
                "scram-add",
                *home,
                "--user",
                "ann",
                "--mechanism",
                "SCRAM-SHA-256",
                "--password",
                PASSWORD,
                "--iterations",
                "8192",
            ]
        )
        == 0
    )
    assert (
        cli.main(
            ["scram-add", *home, "--user", "ann", "--password", PASSWORD, "--iterations", "100"]
        )
        == 2
    )
    store = MetadataStore(tmp_path / "metadata.sqlite")
    try:
        found = store.scram_credential("ann", "SCRAM-SHA-256")
        assert found is not None and store.scram_users() == {"ann": {"SCRAM-SHA-256": 8192}}
    finally:
        store.close()
    salt, stored_key, server_key, iterations = found
    assert scram.from_password(
        "SCRAM-SHA-256", PASSWORD, iterations, salt
    ) == scram.ScramCredential(salt, stored_key, server_key, 8192)
    assert PASSWORD.encode() not in (tmp_path / "metadata.sqlite").read_bytes()


def test_listener_secrets_are_kept_apart_however_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """A JAAS text or key password given per listener is a secret whether it comes from a file,
    ``--override`` or ``ICEFALL_PER_LISTENER``: never in ``to_overrides`` (argv) or a repr."""
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="pw-1f3c";'
    monkeypatch.setenv(
        "ICEFALL_PER_LISTENER",
        json.dumps(
            {
                "sasl_plaintext.plain.sasl.jaas.config": jaas,
                "sasl_plaintext.ssl.client.auth": "none",
            }
        ),
    )
    config = load_broker_config(
        overrides={
            "listeners": "SASL_PLAINTEXT://127.0.0.1:9094",
            "listener.name.sasl_plaintext.ssl.key.password": "pw-8e2d",
        }
    )
    assert set(config.per_listener_secrets) == {
        "sasl_plaintext.plain.sasl.jaas.config",
        "sasl_plaintext.ssl.key.password",
    }
    assert config.per_listener == {"sasl_plaintext.ssl.client.auth": "none"}
    [listener] = config.listener_list()
    assert settings.plain_users(config, listener) == {"a": "pw-1f3c"}
    shown = repr(config) + json.dumps(to_overrides(config)) + str(config.model_dump())
    assert "pw-1f3c" not in shown and "pw-8e2d" not in shown


def test_scram_credential_is_read_off_the_event_loop() -> None:
    """SaslAuthenticate reads the SCRAM credential in a worker thread (a metadata store on
    Postgres would otherwise stall every connection), once, for the user the client-first
    message names (RFC 5802 escapes undone), and the exchange completes with it."""
    import asyncio
    import threading

    import scramp

    from broker.security import scram
    from broker.security.sasl import SaslSession
    from broker.security.stats import AuthStats

    user = "ann,=x"
    credential = scram.from_password("SCRAM-SHA-256", PASSWORD, 4096)
    lookups: list[tuple[str, bool]] = []

    def lookup(name: str, mechanism: str) -> scram.ScramCredential | None:
        lookups.append((name, threading.current_thread() is threading.main_thread()))
        return credential if (name, mechanism) == (user, "SCRAM-SHA-256") else None

    def respond(**fields: object) -> dict[str, object]:
        return fields

    session = SaslSession("L", "/h", ["SCRAM-SHA-256"], {}, lookup, 0, AuthStats())

    async def exchange() -> None:
        assert session.handshake("SCRAM-SHA-256", respond) is not None
        client = scramp.ScramClient(["SCRAM-SHA-256"], user, PASSWORD)
        for message in (client.get_client_first, client.get_client_final):
            token = message().encode()
            await session.look_up_credential(token)
            outcome = session.authenticate(token, respond)
            assert outcome is not None
            answer, close = outcome
            assert not close, answer
            if session.state != "complete":
                client.set_server_first(bytes(answer["auth_bytes"]).decode())

    asyncio.run(exchange())
    assert session.principal == f"User:{user}"
    assert lookups == [(user, False)]


def test_the_inter_broker_listener_and_its_credentials_are_checked() -> None:
    """How a cluster broker reaches its peers (``broker.kafka.peer.peer_security``): the named
    listener, its mechanism, the broker's own username/password from its JAAS config; what
    cannot give them is refused naming the key, without the secrets."""
    from broker.kafka.peer import peer_security

    plain = "org.apache.kafka.common.security.plain.PlainLoginModule required"
    base = {
        "listeners": "PLAINTEXT://:9092,INTERNAL://:9094",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_PLAINTEXT",
        "listener.name.internal.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.internal.plain.sasl.jaas.config": (
            f'{plain} username="broker" password="b-secret" user_broker="b-secret";'
        ),
    }
    assert peer_security(load_broker_config(overrides=base)).listener == "PLAINTEXT"
    chosen = peer_security(
        load_broker_config(overrides={**base, "inter.broker.listener.name": "INTERNAL"})
    )
    assert (chosen.listener, chosen.mechanism, chosen.username, chosen.password) == (
        "INTERNAL",
        "PLAIN",
        "broker",
        "b-secret",
    )
    assert chosen.tls is None
    for overrides, message in (
        ({"inter.broker.listener.name": "NOPE"}, "inter.broker.listener.name: NOPE is none"),
        (
            {
                "inter.broker.listener.name": "INTERNAL",
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
            },
            "sasl.mechanism.inter.broker.protocol: SCRAM-SHA-256 is not enabled",
        ),
        (
            {
                "inter.broker.listener.name": "INTERNAL",
                "listener.name.internal.plain.sasl.jaas.config": f'{plain} user_a="a-secret";',
            },
            "listener.name.internal.plain.sasl.jaas.config: the broker's own username",
        ),
    ):
        with pytest.raises(ListenerError) as refused:
            peer_security(load_broker_config(overrides={**base, **overrides}))
        assert message in str(refused.value) and "secret" not in str(refused.value)
