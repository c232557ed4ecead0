"""The broker's one configuration model: defaults < server.properties < ICEFALL_* environment
< --override and flags; unknown keys and bad values refused by name; and ``icefall up`` hands
the broker it starts every setting it was given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker import cli, config
from broker.config import BrokerConfig, ConfigError, load_broker_config, to_overrides
from broker.supervisor.up import broker_command
from tests.support import icefall_cli


def parse(argv: list[str]) -> BrokerConfig:
    """What ``icefall broker ARGV`` would run on (the CLI's own parser and loader)."""
    parser = cli.argparse.ArgumentParser()
    cli._add_broker_flags(parser)
    return cli._broker_config(parser.parse_args(argv))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "ICEFALL_HOME",
        "ICEFALL_METADATA_URI",
        "ICEFALL_SEGMENT_FLUSH_MS",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
    ):
        monkeypatch.delenv(name, raising=False)


def test_properties_file_then_environment_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    props = tmp_path / "server.properties"
    props.write_text(
        "# a Kafka-style file\n"
        "node.id=3\n"
        "segment.flush.ms = 250\n"
        "segment.flush.bytes: 65536\n"
        "auto.create.topics.enable=true\n"
        "num.partitions=4\n"
        "log.retention.check.interval.ms=1000\n"
        "automq.table.topic.catalog.warehouse=s3://lake/warehouse\n"
        "automq.table.topic.catalog.s3.path-style-access=true\n"
        "object.store=s3://lake/segments\n"
        "object.store.endpoint=http://127.0.0.1:9000\n"
    )
    got = parse(["--config", str(props)])
    assert (got.node_id, got.segment_flush_ms, got.segment_flush_bytes) == (3, 250, 65536)
    assert (
        got.auto_create_topics
        and got.default_partitions == 4
        and got.retention_check_interval_ms == 1000
    )
    assert got.warehouse == "s3://lake/warehouse" and got.catalog.builtin
    assert got.catalog.properties == {"s3.path-style-access": "true"}
    assert (
        got.store.url == "s3://lake/segments" and got.store.endpoint_url == "http://127.0.0.1:9000"
    )

    monkeypatch.setenv("ICEFALL_SEGMENT_FLUSH_MS", "500")  # the environment beats the file
    assert parse(["--config", str(props)]).segment_flush_ms == 500
    # --override and flags beat both
    assert (
        parse(["--config", str(props), "--override", "segment.flush.ms=700"]).segment_flush_ms
        == 700
    )
    assert parse(["--config", str(props), "--segment-flush-ms", "900"]).segment_flush_ms == 900
    assert parse(["--config", str(props), "--no-auto-create-topics"]).auto_create_topics is False


def test_unknown_keys_and_bad_values_name_the_setting(tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    props.write_text("segment.flush.msx=100\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'segment.flush.msx'"):
        parse(["--config", str(props)])
    with pytest.raises(ConfigError, match=r"segment.flush.ms: .*greater than or equal to 1"):
        parse(["--override", "segment.flush.ms=0"])
    with pytest.raises(
        ConfigError, match=r"automq.table.topic.catalog.type: .*'rest', 'glue', 'tablebucket'"
    ):
        parse(["--override", "automq.table.topic.catalog.type=hive"])
    with pytest.raises(ConfigError, match=r"type=glue needs automq.table.topic.catalog.warehouse"):
        parse(["--override", "automq.table.topic.catalog.type=glue"])
    with pytest.raises(
        ConfigError, match="admin.authentication.method=BASIC needs admin.authentication.users.file"
    ):
        parse(["--override", "admin.authentication.method=BASIC"])
    missing = tmp_path / "no-such-users-file"
    admin_login = parse(
        ["--override", "admin.authentication.method=BASIC", "--admin-users-file", str(missing)]
    )
    from broker.http_security import setup as http_setup

    with pytest.raises(ConfigError, match="admin.authentication.users.file: .*no-such-users-file"):
        http_setup.admin_auth(admin_login)
    glue = parse(["--override", "automq.table.topic.catalog.type=glue", "--warehouse", "s3://b/w"])
    assert (
        glue.tables_catalog.type == "glue" and "uri" not in glue.tables_catalog.spark_properties()
    )
    # a port out of range is refused (uvloop would bind 99999 as 34463 without a word)
    with pytest.raises(ConfigError, match=r"kafka.port: .*less than or equal to 65535"):
        parse(["--kafka-port", "99999"])
    with pytest.raises(ConfigError, match=r"admin.port: .*greater than or equal to 0"):
        parse(["--override", "admin.port=-1"])
    assert parse(["--override", "catalog.port=65535"]).catalog_port == 65535
    with pytest.raises(ConfigError, match=r"node.id: .*greater than or equal to 0"):
        parse(["--node-id", "-1"])
    with pytest.raises(ConfigError, match="cannot read the config file"):
        parse(["--config", str(tmp_path / "missing.properties")])
    with pytest.raises(ConfigError, match="key=value"):
        parse(["--override", "no-equals-sign"])


def test_an_unknown_catalog_property_is_refused_naming_the_nearest_one() -> None:
    """pyiceberg and Spark ignore a property they do not read; the broker refuses it at start."""
    glue = ["--override", "automq.table.topic.catalog.type=glue", "--warehouse", "s3://b/w"]
    with pytest.raises(
        ConfigError,
        match=r"automq.table.topic.catalog.glue.endpiont \(did you mean "
        r"automq.table.topic.catalog.glue.endpoint\?\)",
    ):
        parse([*glue, "--override", "automq.table.topic.catalog.glue.endpiont=http://x"])
    with pytest.raises(ConfigError, match=r"automq.table.topic.catalog.s3.path-style-acess"):
        parse([*glue, "--override", "automq.table.topic.catalog.s3.path-style-acess=true"])
    accepted = parse(
        [
            *glue,
            "--override",
            "automq.table.topic.catalog.glue.endpoint=http://127.0.0.1:5000",
            "--override",
            "automq.table.topic.catalog.s3.path-style-access=true",
            "--override",
            "automq.table.topic.catalog.header.X-Iceberg-Access-Delegation=vended-credentials",
            "--override",
            "automq.table.topic.catalog.table-default.write.format.default=parquet",
        ]
    )
    assert accepted.catalog.properties["glue.endpoint"] == "http://127.0.0.1:5000"
    assert "header.X-Iceberg-Access-Delegation" in accepted.catalog.properties


def test_the_cli_reports_a_bad_config_and_exits_2(tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    props.write_text("automq.table.topic.catalog.type=hive\n")
    done = icefall_cli("broker", "--config", str(props), "--home", str(tmp_path / "home"))
    assert done.returncode == 2
    assert "automq.table.topic.catalog.type" in done.stderr and "hive" in done.stderr


def test_icefall_up_hands_the_broker_every_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every field of the model set away from its default on ``icefall up``'s command line
    comes out the same in the broker's own parse of the command ``icefall up`` runs."""
    flags = [
        "--home",
        str(tmp_path / "h"),
        "--host",
        "127.0.0.2",
        "--advertised-host",
        "broker.example",
        "--kafka-port",
        "19092",
        "--registry-port",
        "18081",
        "--catalog-port",
        "18181",
        "--admin-port",
        "18090",
        "--admin-host",
        "0.0.0.0",
        "--node-id",
        "7",
        "--broker-rack",
        "rack-a",
        "--broker-lease-ms",
        "9000",
        "--broker-heartbeat-interval-ms",
        "1500",
        "--cluster-id",
        "c-1",
        "--segment-flush-ms",
        "123",
        "--segment-flush-bytes",
        "4096",
        "--no-segment-compaction-enable",
        "--segment-compaction-interval-ms",
        "2000",
        "--segment-compaction-target-bytes",
        "8192",
        "--segment-compaction-min-age-ms",
        "0",
        "--no-wal-fsync",
        "--max-unflushed-bytes",
        "8192",
        "--max-request-bytes",
        "2048",
        "--default-partitions",
        "5",
        "--auto-create-topics",
        "--group-initial-rebalance-delay-ms",
        "9",
        "--group-consumer-heartbeat-interval-ms",
        "700",
        "--group-consumer-session-timeout-ms",
        "7000",
        "--retention-check-interval-ms",
        "4321",
        "--transaction-max-timeout-ms",
        "60000",
        "--transaction-cleanup-interval-ms",
        "250",
        "--catalog-uri",
        "sqlite:////tmp/c.sqlite",
        "--metadata-uri",
        "postgresql://u:p@h:5432/d",
        "--warehouse",
        "s3://lake/wh",
        "--catalog-vended-credentials",
        "--authorizer-class-name",
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--super-users",
        "User:admin;User:ops",
        "--allow-everyone-if-no-acl-found",
        "--object-store",
        "s3://lake/seg",
        "--override",
        "automq.table.topic.catalog.s3.path-style-access=true",
        "--registry-authentication-method",
        "BASIC",
        "--registry-users-file",
        "/etc/icefall/users",
        "--registry-ssl-keystore-location",
        "/etc/icefall/registry.pem",
        "--admin-authentication-method",
        "BASIC",
        "--admin-users-file",
        "/etc/icefall/admin-users",
        "--catalog-authentication-method",
        "OAUTH2",
        "--catalog-clients-file",
        "/etc/icefall/clients",
        "--catalog-token-lifetime-ms",
        "60000",
        "--catalog-ssl-keystore-location",
        "/etc/icefall/catalog.pem",
        "--override",
        "schema.registry.authorization.role.readers=read:*",
        "--listeners",
        "PLAINTEXT://127.0.0.1:9300,SASL_PLAINTEXT://127.0.0.1:9301",
        "--advertised-listeners",
        "SASL_PLAINTEXT://broker.example:9301",
        "--listener-security-protocol-map",
        "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "--ssl-keystore-type",
        "PEM",
        "--ssl-keystore-location",
        "/etc/icefall/broker.pem",
        "--ssl-keystore-certificate-chain",
        "-----BEGIN CERTIFICATE-----",
        "--ssl-truststore-type",
        "PEM",
        "--ssl-truststore-location",
        "/etc/icefall/ca.pem",
        "--ssl-truststore-certificates",
        "-----BEGIN CERTIFICATE-----",
        "--ssl-client-auth",
        "requested",
        "--sasl-enabled-mechanisms",
        "SCRAM-SHA-512",
        "--connections-max-reauth-ms",
        "60000",
        "--inter-broker-listener-name",
        "SASL_PLAINTEXT",
        "--sasl-mechanism-inter-broker-protocol",
        "SCRAM-SHA-512",
        "--override",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512",
        # the user's own command line may carry a listener secret: the broker's must not
        "--override",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config="
        'org.apache.kafka.common.security.plain.PlainLoginModule required user_kafka="jaas-pw";',
    ]
    # secrets have no flag and never go on the broker's command line: its environment has them
    secrets = {name: f"secret-{name}" for name in config.SECRET_FIELDS}
    assert {"ssl_key_password", "ssl_keystore_key"} <= set(secrets)
    for name, value in secrets.items():
        monkeypatch.setenv(f"ICEFALL_{name.upper()}", value)
    secrets["listener"] = "jaas-pw"
    listener_secret = {"sasl_plaintext.ssl.key.password": "lkp"}  # listener.name.<this>
    monkeypatch.setenv("ICEFALL_PER_LISTENER_SECRETS", json.dumps(listener_secret))
    secrets["listener key password"] = "lkp"
    secrets["metadata database password"] = "u:p@"  # of --metadata-uri
    given = parse(flags)
    defaults = BrokerConfig.model_construct()  # the model's defaults, not the environment's
    changed = {
        name
        for name in BrokerConfig.model_fields
        if getattr(given, name) != getattr(defaults, name)
    }
    assert changed == set(BrokerConfig.model_fields), set(BrokerConfig.model_fields) - changed

    argv = broker_command(given, given.home, tmp_path / "ready")
    assert argv[1:4] == ["-m", "broker.cli", "broker"]
    assert not any(secret in arg for secret in secrets.values() for arg in argv), argv
    assert set(given.per_listener_secrets) == {
        "sasl_plaintext.plain.sasl.jaas.config",
        "sasl_plaintext.ssl.key.password",
    }
    for name in [*config.SECRET_FIELDS, "per_listener_secrets"]:  # as _start_broker gives it
        monkeypatch.delenv(f"ICEFALL_{name.upper()}")
    assert "ICEFALL_METADATA_URI" in config.secret_env(given)
    for name, value in config.secret_env(given).items():
        monkeypatch.setenv(name, value)
    started = parse(argv[6:])  # after --ready-file FILE
    assert started.model_dump() == given.model_dump()
    assert to_overrides(started) == to_overrides(given)


def test_credentials_stay_out_of_what_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-TEST")
    got = load_broker_config(flags={"object_store": "s3://lake/seg"})
    assert got.store.secret_access_key == "very-secret"  # the process itself has them
    written = " ".join(f"{k}={v}" for k, v in to_overrides(got).items())
    assert (
        "very-secret" not in written
        and "AKIA-TEST" not in written
        and "very-secret" not in repr(got)
    )


def test_known_keys_cover_every_setting() -> None:
    keys = config.known_keys()
    for name in config.SCALAR_FIELDS:
        assert config.property_key(name) in keys
