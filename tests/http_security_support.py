"""A broker with the registry's basic auth (roles) and the catalog's OAuth2 on, and the secrets
it was given: shared by the HTTP security tests (tests/broker/test_http_security.py) and the
commit round's (tests/spark_jobs/test_round_credentials.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.support import BrokerProcess

SIGNING_KEY = "signing-key-0f7c2d9e4b-5a61c3e8d2f4b7a9"
PASSWORDS = {"alice": "alice-pw-71c3", "writer": "writer-pw-8d2a", "ops": "ops-pw-55e1"}
PASSWORDS.update(nobody="nobody-pw-3b9f", producer="producer-pw-6e0c")
CLIENT_SECRETS = {"etl": "etl-secret-a41f9", "duck": "duck-secret-c7e02"}
AWS_SECRET = "aws-secret-key-e93b1f"
SSL_KEY_PASSWORD = "tls-key-pw-2a8d"
JAAS_SECRET = "jaas-plain-pw-94d0"  # a SASL PLAIN user's password in a listener's JAAS text
ADMIN_PASSWORD = "admin-api-pw-d61b"  # the admin API's user "rounds"
ADMIN_USER_INFO = f"rounds:{ADMIN_PASSWORD}"
# Every secret a secured broker is given: none may leave it. Extend when a setting holds a new one.
SECRETS = [
    SIGNING_KEY,
    AWS_SECRET,
    SSL_KEY_PASSWORD,
    JAAS_SECRET,
    ADMIN_PASSWORD,
    *PASSWORDS.values(),
    *CLIENT_SECRETS.values(),
]

AVRO = json.dumps({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]})


def md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def write_security_files(directory: Path) -> Path:
    """Users (one password stored MD5-hashed, as Jetty takes it), the admin API's user, clients
    and the properties."""
    directory.mkdir(parents=True, exist_ok=True)
    users = directory / "registry-users.properties"
    users.write_text(
        "# user: password,role...\n"
        f"alice: MD5:{md5(PASSWORDS['alice'])},readers\n"
        f"writer: {PASSWORDS['writer']},orders_writers\n"
        f"ops: {PASSWORDS['ops']},admins\n"
        f"producer: {PASSWORDS['producer']},round_writers\n"
        f"nobody: {PASSWORDS['nobody']}\n"
    )
    admin_users = directory / "admin-users.properties"
    admin_users.write_text(f"rounds: MD5:{md5(ADMIN_PASSWORD)}\n")
    clients = directory / "catalog-clients.properties"
    clients.write_text(f"etl: MD5:{md5(CLIENT_SECRETS['etl'])}\nduck: {CLIENT_SECRETS['duck']}\n")
    properties = directory / "server.properties"
    properties.write_text(
        "schema.registry.authentication.method=BASIC\n"
        f"schema.registry.authentication.users.file={users}\n"
        "schema.registry.authorization.role.readers=read:*\n"
        "schema.registry.authorization.role.round_writers=write:sec_*\n"
        "schema.registry.authorization.role.orders_writers=write:orders-*\n"
        "schema.registry.authorization.role.admins=admin\n"
        "admin.authentication.method=BASIC\n"
        f"admin.authentication.users.file={admin_users}\n"
        "catalog.authentication.method=OAUTH2\n"
        f"catalog.oauth2.clients.file={clients}\n"
        f"catalog.oauth2.token.signing.key={SIGNING_KEY}\n"
    )
    return properties


def secured_broker(root: Path, kafka_listeners: bool = False) -> BrokerProcess:
    """Started; the caller stops it. ``AWS_*`` credentials in its environment (never shown).
    ``kafka_listeners``: also a SASL_PLAINTEXT listener (a PLAIN password in its JAAS text) and
    an SSL one (an encrypted key and its password) beside the PLAINTEXT one."""
    args, env = secured_args(root)
    broker = BrokerProcess(root / "home", [*args, "--segment-flush-ms", "100"], env)
    broker.admin_user_info = ADMIN_USER_INFO
    if kafka_listeners:
        from tests.support import free_port
        from tests.tls_certs import make_certs

        certs = make_certs(root / "certs", SSL_KEY_PASSWORD)
        with open(args[1], "a") as properties:
            properties.write(
                f"listeners=PLAINTEXT://127.0.0.1:{broker.kafka_port},"
                f"SASL_PLAINTEXT://127.0.0.1:{free_port()},SSL://127.0.0.1:{free_port()}\n"
                f"ssl.keystore.location={certs.keystore}\n"
                f"ssl.key.password={SSL_KEY_PASSWORD}\n"
                "listener.name.sasl_plaintext.plain.sasl.jaas.config="
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'user_kafka="{JAAS_SECRET}";\n'
            )
    return broker.start()


def secured_args(root: Path) -> tuple[list[str], dict[str, str]]:
    """The broker flags and environment of a secured broker whose files are under ``root``."""
    properties = write_security_files(root / "conf")
    env = {"AWS_ACCESS_KEY_ID": "AKIATESTKEY", "AWS_SECRET_ACCESS_KEY": AWS_SECRET}
    return ["--config", str(properties)], env


def airflow_connections() -> dict[str, str]:
    """``AIRFLOW_CONN_*`` variables defining the connections the Icefall operators read:
    ``icefall_registry`` (a reader), ``icefall_catalog`` (client ``etl``) and ``icefall_admin``
    (the admin API's user)."""
    registry = {"conn_type": "http", "login": "alice", "password": PASSWORDS["alice"]}
    catalog = {"conn_type": "http", "login": "etl", "password": CLIENT_SECRETS["etl"]}
    admin = {"conn_type": "http", "login": "rounds", "password": ADMIN_PASSWORD}
    return {
        "AIRFLOW_CONN_ICEFALL_REGISTRY": json.dumps(registry),
        "AIRFLOW_CONN_ICEFALL_CATALOG": json.dumps(catalog),
        "AIRFLOW_CONN_ICEFALL_ADMIN": json.dumps(admin),
    }
