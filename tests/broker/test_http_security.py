"""Authentication and TLS on the schema registry and the Iceberg REST catalog, with real clients:
Confluent's ``SchemaRegistryClient`` (``basic.auth.user.info``), pyiceberg (``credential``) and
DuckDB (an Iceberg secret with client credentials); per-subject roles; wrong passwords, wrong
secrets, expired, malformed and foreign tokens; TLS with a CA made here; basic auth on the admin
API. And no secret in the manifest, any admin API answer or the broker's log.

One secured broker for the module (plus one on TLS); tests keep apart by subjects and namespaces.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import jwt
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import OAuthError
from pyiceberg.schema import Schema as IcebergSchema
from pyiceberg.types import LongType, NestedField, StringType

from broker.admin_client import AdminClient as BrokerAdminClient
from broker.admin_client import BrokerError
from broker.catalog import duckdb_local
from broker.http_security.client import ADMIN_USER_INFO_ENV, basic_auth_header
from tests.http_security_support import (
    ADMIN_PASSWORD,
    ADMIN_USER_INFO,
    AVRO,
    CLIENT_SECRETS,
    JAAS_SECRET,
    PASSWORDS,
    SECRETS,
    SIGNING_KEY,
    SSL_KEY_PASSWORD,
    secured_broker,
)
from tests.support import BrokerProcess, wait_for
from tests.tls_certs import make_certs

ICEBERG_SCHEMA = IcebergSchema(
    NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType())
)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = secured_broker(tmp_path_factory.mktemp("http-security"), kafka_listeners=True)
    try:
        yield broker
    finally:
        broker.stop()


def registry(broker: BrokerProcess, user: str | None, **extra: str) -> SchemaRegistryClient:
    conf = {"url": broker.registry_url, **extra}
    if user is not None:
        conf["basic.auth.user.info"] = f"{user}:{PASSWORDS.get(user, 'wrong')}"
    return SchemaRegistryClient(conf)


def raw(url: str, user_info: str | None = None, **kwargs: Any) -> tuple[int, Any, Any]:
    """(status, JSON body, headers) of a GET (``Authorization`` from ``user_info`` or ``headers``)."""
    headers = dict(kwargs.pop("headers", {}))
    if user_info:
        headers["Authorization"] = "Basic " + base64.b64encode(user_info.encode()).decode()
    request = urllib.request.Request(url, headers=headers, **kwargs)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null"), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), exc.headers


def test_registry_basic_auth_and_subject_roles(secured: BrokerProcess) -> None:
    url = secured.registry_url
    status, body, headers = raw(url + "/subjects")
    assert (status, body["error_code"]) == (401, 40101)
    assert headers["WWW-Authenticate"].startswith("Basic realm=")
    status, body, _ = raw(url + "/subjects", "alice:not-her-password")
    assert (status, body["error_code"]) == (401, 40101)
    assert "wrong user name or password" in body["message"]
    with pytest.raises(SchemaRegistryError) as anonymous:
        registry(secured, None).get_subjects()
    assert anonymous.value.http_status_code == 401

    # a writer of orders-*: registers there (and reads it), nowhere else, no admin calls
    writer = registry(secured, "writer")
    orders_id = writer.register_schema("orders-value", Schema(AVRO, "AVRO"))
    assert writer.get_latest_version("orders-value").schema_id == orders_id
    with pytest.raises(SchemaRegistryError) as elsewhere:
        writer.register_schema("payments-value", Schema(AVRO, "AVRO"))
    assert (elsewhere.value.http_status_code, elsewhere.value.error_code) == (403, 40301)
    assert "writer" in elsewhere.value.error_message
    assert "payments-value" in elsewhere.value.error_message
    with pytest.raises(SchemaRegistryError) as config_change:
        writer.set_compatibility(level="NONE")
    assert config_change.value.error_code == 40301

    # an admin may do everything; a reader (password stored MD5-hashed) reads every subject
    ops = registry(secured, "ops")
    ops.register_schema("payments-value", Schema(AVRO, "AVRO"))
    assert ops.set_compatibility("payments-value", "FORWARD")["compatibility"] == "FORWARD"  # type: ignore[index]
    alice = registry(secured, "alice")
    assert {"orders-value", "payments-value"} <= set(alice.get_subjects())
    assert json.loads(alice.get_schema(orders_id).schema_str or "") == json.loads(AVRO)
    with pytest.raises(SchemaRegistryError) as read_only:
        alice.register_schema("orders-value", Schema(AVRO, "AVRO"))
    assert read_only.value.error_code == 40301
    with pytest.raises(SchemaRegistryError) as delete:
        writer.delete_subject("orders-value")
    assert delete.value.error_code == 40301

    # a user without roles sees no subject and may not read a schema by id
    nobody = f"nobody:{PASSWORDS['nobody']}"
    assert raw(url + "/subjects", nobody)[:2] == (200, [])
    status, body, _ = raw(f"{url}/schemas/ids/{orders_id}", nobody)
    assert (status, body["error_code"]) == (403, 40301)
    status, body, _ = raw(f"{url}/subjects/orders-value/versions/latest", nobody)
    assert (status, body["error_code"]) == (403, 40301)


def token(broker: BrokerProcess, client: str, secret: str) -> tuple[int, dict[str, Any]]:
    form = f"grant_type=client_credentials&client_id={client}&client_secret={secret}&scope=catalog"
    status, body, _ = raw(
        broker.catalog_url + "/v1/oauth/tokens",
        data=form.encode(),
        method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    return status, body


def test_catalog_tokens_and_refusals(secured: BrokerProcess) -> None:
    status, answer = token(secured, "etl", CLIENT_SECRETS["etl"])
    assert status == 200
    assert answer["token_type"] == "bearer" and answer["expires_in"] == 3600
    assert answer["issued_token_type"] == "urn:ietf:params:oauth:token-type:access_token"
    bearer = {"Authorization": f"Bearer {answer['access_token']}"}
    assert raw(secured.catalog_url + "/v1/config", headers=bearer)[0] == 200

    status, answer = token(secured, "etl", "not-the-secret")
    assert (status, answer["error"]) == (401, "invalid_client")

    def refused(headers: dict[str, str]) -> str:
        status, body, response_headers = raw(
            secured.catalog_url + "/v1/namespaces", headers=headers
        )
        assert status == 401, body
        assert body["error"]["type"] == "NotAuthorizedException" and body["error"]["code"] == 401
        assert response_headers["WWW-Authenticate"].startswith("Bearer")
        message: str = body["error"]["message"]
        return message

    assert "needs a bearer token" in refused({})
    assert "invalid token" in refused({"Authorization": "Bearer not.a.jwt"})
    now = int(time.time())
    claims = {"iss": "icefall-catalog", "sub": "etl", "iat": now - 7200, "exp": now - 3600}
    expired = jwt.encode(claims, SIGNING_KEY, algorithm="HS256")
    assert "expired" in refused({"Authorization": f"Bearer {expired}"})
    foreign = jwt.encode({**claims, "exp": now + 3600}, "another-key" * 4, algorithm="HS256")
    assert "invalid token" in refused({"Authorization": f"Bearer {foreign}"})
    status, _, _ = raw(secured.catalog_url + "/v1/namespaces", method="HEAD")
    assert status == 401

    # Iceberg Java's refresh: a token exchange of the current token
    _, answer = token(secured, "etl", CLIENT_SECRETS["etl"])
    form = (
        "grant_type=urn:ietf:params:oauth:grant-type:token-exchange&scope=catalog"
        f"&subject_token={answer['access_token']}"
        "&subject_token_type=urn:ietf:params:oauth:token-type:access_token"
    )
    status, refreshed, _ = raw(
        secured.catalog_url + "/v1/oauth/tokens",
        data=form.encode(),
        method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded", **bearer},
    )
    assert status == 200 and refreshed["access_token"] != answer["access_token"]


def test_pyiceberg_and_duckdb_with_client_credentials(secured: BrokerProcess) -> None:
    tokens = {"oauth2-server-uri": secured.catalog_url + "/v1/oauth/tokens"}
    with pytest.raises(OAuthError, match="invalid_client: unknown client or wrong client secret"):
        load_catalog("bad", type="rest", uri=secured.catalog_url, credential="etl:wrong", **tokens)
    catalog = load_catalog(
        "etl",
        type="rest",
        uri=secured.catalog_url,
        credential=f"etl:{CLIENT_SECRETS['etl']}",
        **tokens,
    )
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    table = catalog.create_table(f"{namespace}.people", ICEBERG_SCHEMA)
    table.append(
        pa.Table.from_pylist(
            [{"id": i, "name": f"n{i}"} for i in range(3)], schema=ICEBERG_SCHEMA.as_arrow()
        )
    )

    con = duckdb_local.connect()
    con.execute(
        "CREATE SECRET icefall_oauth (TYPE iceberg, "
        f"CLIENT_ID 'duck', CLIENT_SECRET '{CLIENT_SECRETS['duck']}', "
        f"OAUTH2_SERVER_URI '{secured.catalog_url}/v1/oauth/tokens')"
    )
    con.execute(
        f"ATTACH '' AS lake (TYPE iceberg, SECRET icefall_oauth, ENDPOINT '{secured.catalog_url}')"
    )
    assert con.execute(f"SELECT count(*) FROM lake.{namespace}.people").fetchone() == (3,)

    with pytest.raises(duckdb.Error, match="401.*invalid_client - unknown client"):
        duckdb_local.connect().execute(
            "CREATE SECRET wrong_oauth (TYPE iceberg, CLIENT_ID 'duck', CLIENT_SECRET 'nope', "
            f"OAUTH2_SERVER_URI '{secured.catalog_url}/v1/oauth/tokens')"
        )


def test_tls_on_registry_and_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    certs = make_certs(tmp_path / "certs", SSL_KEY_PASSWORD)
    properties = tmp_path / "tls.properties"
    properties.write_text(
        f"schema.registry.ssl.keystore.location={certs.keystore}\n"
        f"schema.registry.ssl.key.password={SSL_KEY_PASSWORD}\n"
        f"catalog.ssl.keystore.location={certs.keystore}\n"
        f"catalog.ssl.key.password={SSL_KEY_PASSWORD}\n"
    )
    broker = BrokerProcess(tmp_path / "home", ["--config", str(properties)]).start()
    try:
        registry_url = broker.registry_url.replace("http:", "https:")
        catalog_url = broker.catalog_url.replace("http:", "https:")
        assert broker.admin("/v1/cluster")["registry_url"].startswith("https://")
        assert broker.admin("/v1/cluster")["catalog_url"].startswith("https://")
        client = SchemaRegistryClient({"url": registry_url, "ssl.ca.location": str(certs.ca)})
        assert client.register_schema("tls-value", Schema(AVRO, "AVRO")) >= 1
        # requests lets REQUESTS_CA_BUNDLE (set on this machine) win over pyiceberg's ssl.cabundle
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certs.ca))
        cabundle: Any = {"cabundle": str(certs.ca)}  # pyiceberg's nested "ssl" property
        catalog = load_catalog("tls", type="rest", uri=catalog_url, ssl=cabundle)
        catalog.create_namespace("over_tls")
        assert ("over_tls",) in catalog.list_namespaces()

        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(catalog_url + "/v1/config", timeout=10)  # not trusting the CA
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(broker.registry_url + "/subjects", timeout=10)  # plain HTTP
        trusting = ssl.create_default_context(cafile=str(certs.ca))
        with urllib.request.urlopen(registry_url + "/subjects", timeout=10, context=trusting) as r:
            assert json.loads(r.read()) == ["tls-value"]
        # still serving after the bad handshakes
        assert ("over_tls",) in catalog.list_namespaces()
    finally:
        broker.stop()
    assert SSL_KEY_PASSWORD not in broker.log_text()


def test_no_secret_in_the_manifest_admin_answers_or_log(secured: BrokerProcess) -> None:
    topic = f"leak_{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": secured.bootstrap})
    config = {"automq.table.topic.enable": "true"}
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=config)]).values():
        future.result(15)
    token(secured, "etl", "a-wrong-secret-is-not-logged-either")
    raw(secured.registry_url + "/subjects", "writer:" + PASSWORDS["alice"])  # a wrong password

    def answer(path: str) -> str:
        logged_in = urllib.request.Request(
            secured.admin_url + path, headers=basic_auth_header(ADMIN_USER_INFO)
        )
        try:
            with urllib.request.urlopen(logged_in, timeout=10) as response:
                return str(response.read().decode())
        except urllib.error.HTTPError as exc:  # an error answer must not show one either
            return f"HTTP {exc.code}: {exc.read().decode()}"

    answers = {
        path: answer(path)
        for path in (
            "/healthz",
            "/v1/cluster",
            "/v1/table-topics",
            "/v1/retention",
            "/metrics",
            f"/v1/topics/{topic}/offsets",
            f"/v1/topics/{topic}/plan",
            f"/v1/topics/{topic}/pending",
        )
    }
    answers["manifest"] = (secured.home / "table_topics.json").read_text()
    # DescribeConfigs of the broker names its secrets as Kafka does: no value, is_sensitive
    [described] = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "0")]).values()
    entries = described.result(15)
    sensitive = {name for name, entry in entries.items() if entry.is_sensitive}
    assert sensitive == {
        "ssl.key.password",
        "catalog.oauth2.token.signing.key",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config",
    }
    assert all(entries[name].value is None for name in sensitive)
    answers["DescribeConfigs"] = repr({n: (e.value, e.synonyms) for n, e in entries.items()})
    assert topic in answers["manifest"] and topic in answers["/v1/table-topics"]
    answers["broker log"] = secured.log_text()
    # the Kafka listeners holding a JAAS password and an encrypted key's password are up
    assert "(SASL_PLAINTEXT," in answers["broker log"] and "(SSL," in answers["broker log"]
    for where, text in answers.items():
        for secret in [*SECRETS, "a-wrong-secret-is-not-logged-either"]:
            assert secret not in text, f"{where} shows a secret"
    # the admin API reads the OAuth2-protected built-in catalog in-process: it needs no token
    pending = json.loads(answers[f"/v1/topics/{topic}/pending"])
    assert pending["partitions"][0]["records"] == 0, pending
    cluster = json.loads(answers["/v1/cluster"])
    assert cluster["catalog_url"] == secured.catalog_url
    # the refusals of this module are counted (the two above among them)
    failures = dict(
        line.rsplit(" ", 1)
        for line in answers["/metrics"].splitlines()
        if line.startswith("icefall_http_authentication_failures_total{")
    )
    assert int(failures['icefall_http_authentication_failures_total{service="catalog"}']) >= 1
    registry_failures = 'icefall_http_authentication_failures_total{service="schema-registry"}'
    assert int(failures[registry_failures]) >= 1
    assert 'icefall_http_authentication_failures_total{service="admin"}' in failures


def test_admin_api_basic_auth(secured: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every admin route but /healthz needs the admin API's user: none, a wrong password, a
    registry user or another scheme is a 401 naming why (and how to log in), the broker serves
    on, and the refusals are counted; ``broker.admin_client`` logs in from
    ``ICEFALL_ADMIN_USER_INFO``."""
    url = secured.admin_url
    status, body, _ = raw(url + "/healthz")
    assert status == 200 and body["status"] == "ok"
    for path in ("/v1/table-topics", "/v1/cluster", "/metrics", "/v1/cluster/assignment"):
        status, body, headers = raw(url + path)
        assert status == 401, (path, status, body)
        assert body["error_code"] == 401 and "ICEFALL_ADMIN_USER_INFO" in body["message"]
        assert headers["WWW-Authenticate"].startswith('Basic realm="icefall-admin"')
    refused = {
        "a wrong password": (raw(url + "/v1/table-topics", "rounds:" + PASSWORDS["alice"]), ""),
        "a registry user": (raw(url + "/v1/table-topics", f"alice:{PASSWORDS['alice']}"), ""),
        "a bearer token": (
            raw(url + "/v1/table-topics", headers={"Authorization": "Bearer x"}),
            "only Basic authentication is accepted",
        ),
    }
    # credentials sent without the scheme: refused without quoting them (answer and log)
    bare = base64.b64encode(ADMIN_USER_INFO.encode()).decode()
    for header in (ADMIN_USER_INFO, bare):
        refused[header] = (
            raw(url + "/v1/table-topics", headers={"Authorization": header}),
            "only Basic authentication is accepted",
        )
        registry_answer = raw(secured.registry_url + "/subjects", headers={"Authorization": header})
        assert registry_answer[0] == 401 and header not in json.dumps(registry_answer[1])
    for what, ((status, body, _), reason) in refused.items():
        assert status == 401, what
        assert (reason or "wrong user name or password") in body["message"], (what, body)
        assert ADMIN_PASSWORD not in body["message"] and bare not in body["message"]
    status, body, _ = raw(url + "/v1/flush", ADMIN_USER_INFO, method="POST", data=b"{}")
    assert status == 200, body
    status, body, _ = raw(url + "/v1/table-topics", ADMIN_USER_INFO)
    assert status == 200 and "table_topics" in body

    monkeypatch.delenv(ADMIN_USER_INFO_ENV, raising=False)
    with pytest.raises(BrokerError, match="HTTP 401") as info:
        BrokerAdminClient(url).cluster()
    assert info.value.status == 401
    monkeypatch.setenv(ADMIN_USER_INFO_ENV, ADMIN_USER_INFO)
    assert BrokerAdminClient(url).cluster().catalog_url == secured.catalog_url
    assert BrokerAdminClient(url, user_info="rounds:wrong").health().status == "ok"

    logged_in = urllib.request.Request(url + "/metrics", headers=basic_auth_header(ADMIN_USER_INFO))
    with urllib.request.urlopen(logged_in, timeout=10) as response:  # serving on, and counting
        [line] = [
            line
            for line in response.read().decode().splitlines()
            if line.startswith('icefall_http_authentication_failures_total{service="admin"}')
        ]
    assert float(line.rsplit(" ", 1)[1]) >= 10, line  # the 4 + 5 above and the client's
    assert ADMIN_PASSWORD not in secured.log_text() and bare not in secured.log_text()


def test_icefall_ups_demo_logs_in_to_the_registry_and_a_sasl_listener(
    secured: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``icefall up``'s demo clients (topic, serializer, producer) against a secured broker whose
    only listener they are given is SASL: the logins come from the environment."""
    from confluent_kafka import Consumer

    from broker.config import load_broker_config
    from broker.supervisor import up

    properties = Path(secured.extra_args[secured.extra_args.index("--config") + 1])
    [sasl] = [x for x in load_broker_config(properties).listener_list() if x.sasl]
    config = load_broker_config(
        properties,
        overrides={"listeners": str(sasl), "registry.port": str(secured.registry_port)},
    )
    with pytest.raises(SystemExit, match="set ICEFALL_DEMO_KAFKA_USER_INFO=user:password"):
        up.demo_kafka_config(config)
    monkeypatch.setenv("ICEFALL_DEMO_KAFKA_USER_INFO", f"kafka:{JAAS_SECRET}")
    kafka = up.demo_kafka_config(config)
    assert (kafka["security.protocol"], kafka["sasl.mechanism"]) == ("SASL_PLAINTEXT", "PLAIN")
    up._ensure_demo_topic(kafka, 60_000)
    event = {"user_id": 1, "page": "/", "ts": 0}
    with pytest.raises(SchemaRegistryError) as anonymous:  # the registry wants a login
        up._demo_serializer(up.demo_registry_config(config))(event)
    assert anonymous.value.http_status_code == 401
    monkeypatch.setenv("ICEFALL_REGISTRY_USER_INFO", f"ops:{PASSWORDS['ops']}")

    stopping = threading.Event()
    demo = up.DemoProducer(config, 200.0, stopping)
    demo.start()
    try:
        wait_for(lambda: demo.sent >= 5 or demo.error is not None, 30, what="demo records sent")
    finally:
        stopping.set()
        demo.join(30)
    assert demo.error is None and demo.sent >= 5
    consumer = Consumer(
        {
            "bootstrap.servers": secured.bootstrap,
            "group.id": "demo-check",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([up.DEMO_TOPIC])
        got = 0
        deadline = time.monotonic() + 30
        while got < demo.sent and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                got += 1
        assert got == demo.sent  # acknowledged, every one
    finally:
        consumer.close()


def test_the_token_signing_key_is_never_short_or_empty(tmp_path: Path) -> None:
    """A configured key under 32 bytes is refused at start (without echoing it); a key file left
    empty by a crash is made again rather than signing tokens with b"" (anyone could forge
    those); the file is written whole, under a temporary name first."""
    from broker.config import ConfigError, load_broker_config
    from broker.http_security.oauth import KEY_FILE, signing_key

    with pytest.raises(ConfigError) as refused:
        load_broker_config(overrides={"catalog.oauth2.token.signing.key": "short-key"})
    assert "at least 32 bytes" in str(refused.value) and "short-key" not in str(refused.value)
    unset = load_broker_config(overrides={"catalog.oauth2.token.signing.key": ""})
    assert unset.catalog_token_signing_key is None  # empty: the key kept in HOME
    with pytest.raises(ValueError, match="at least 32 bytes"):
        signing_key("", tmp_path)
    (tmp_path / KEY_FILE).write_bytes(b"")  # what a crash between create and write left
    made = signing_key(None, tmp_path)
    assert len(made) == 64 and (tmp_path / KEY_FILE).read_bytes().strip() == made
    assert signing_key(None, tmp_path) == made  # kept from now on
    assert signing_key(SIGNING_KEY, tmp_path) == SIGNING_KEY.encode()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert len(signing_key(None, fresh)) == 64
    assert [p.name for p in fresh.iterdir()] == [KEY_FILE]  # no temporary file left behind
    assert (fresh / KEY_FILE).stat().st_mode & 0o077 == 0
