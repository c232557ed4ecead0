"""docker-compose.yml, checked without a Docker engine (none runs here).

The file is parsed as Compose would read it (YAML merge keys, ``${VAR:-default}``
with the defaults a fresh checkout gets) and checked for what makes a stack
fail at ``up`` or, worse, half-work: services the design needs, dependencies
and their conditions, healthchecks, port collisions, volumes, every URL in the
environment naming a service that listens there, databases that exist, a broker
command the real CLI accepts, and Spark pulling the Iceberg build that matches
the installed PySpark.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from broker import cli
from broker.config import BrokerConfig
from broker.kafka.peer import peer_security

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")
_URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://([^\s'\",]+)")
LOCAL = {"localhost", "127.0.0.1", "0.0.0.0"}

REQUIRED = {
    "postgres",
    "minio",
    "certs-init",
    "kafka-users-init",
    "broker",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "spark-master",
    "spark-worker",
}
AIRFLOW_COMMANDS = {
    "airflow-init": ["db", "migrate"],
    "airflow-apiserver": ["api-server"],
    "airflow-scheduler": ["scheduler"],
    "airflow-dag-processor": ["dag-processor"],
    "airflow-triggerer": ["triggerer"],
}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def _interpolate(value: Any) -> Any:
    """Compose's variable substitution with the defaults (no .env: what a fresh checkout runs)."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: m.group(2) or "", value).replace("$$", "$")
    if isinstance(value, list):
        return [_interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(raw, dict)
    data: dict[str, Any] = _interpolate(raw)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def _one_shot(service: dict[str, Any]) -> bool:
    return service.get("restart", "no") == "no"


def _published(service: dict[str, Any]) -> list[tuple[int, int]]:
    """(host port, container port) of every ``ports`` entry."""
    out = []
    for entry in service.get("ports") or []:
        parts = str(entry).split("/")[0].split(":")
        assert len(parts) in (2, 3), f"publish ports as [ip:]host:container, got {entry!r}"
        out.append((int(parts[-2]), int(parts[-1])))
    return out


def _listens(service: dict[str, Any]) -> set[int]:
    """Container ports a service declares (published or exposed)."""
    return {c for _, c in _published(service)} | {
        int(str(p).split("/")[0]) for p in service.get("expose") or []
    }


def _hostnames(services: dict[str, dict[str, Any]]) -> dict[str, str]:
    names = {name: name for name in services}
    names.update({s["hostname"]: name for name, s in services.items() if "hostname" in s})
    return names


def _config_text(compose: dict[str, Any], name: str) -> str:
    text: str = compose["configs"][name]["content"]
    return text


def _spark_defaults(compose: dict[str, Any]) -> dict[str, str]:
    pairs = (
        line.split(None, 1)
        for line in _config_text(compose, "spark-defaults").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    return {p[0]: p[1].strip() for p in pairs}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


def _constraint(name: str) -> str:
    match = re.search(
        rf"^{re.escape(name)}==(\S+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE
    )
    assert match, f"{name} is not pinned in constraints.txt"
    return match.group(1)


def _broker_args(services: dict[str, dict[str, Any]], name: str = "broker") -> argparse.Namespace:
    command = _command(services[name])
    assert command[:2] == ["icefall", "broker"], command
    parser = argparse.ArgumentParser(prog="icefall broker", exit_on_error=False)
    cli._add_broker_flags(parser)
    args, unknown = parser.parse_known_args(command[2:])
    assert not unknown, f"flags broker/cli.py does not have: {unknown}"
    return args


def _config_targets(service: dict[str, Any]) -> dict[str, str]:
    """Where each compose config is mounted in ``service``: target path -> config name."""
    return {c["target"]: c["source"] for c in service.get("configs") or []}


def _load_config(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], name: str, directory: Path
) -> BrokerConfig:
    """A broker's configuration as the real loader reads it in its container: its command,
    its server.properties (a compose config, written here where the command names it), its
    environment."""
    args = _broker_args(services, name)
    mounted = _config_targets(services[name])
    assert args.config in mounted, f"{name}'s --config {args.config} is no mounted config"
    properties = directory / "server.properties"
    properties.write_text(_config_text(compose, mounted[args.config]))
    args.config = str(properties)
    with pytest.MonkeyPatch.context() as env:
        for key in [k for k in os.environ if k.startswith(("ICEFALL_", "AWS_"))]:
            env.delenv(key)
        for key, value in _env(services[name]).items():
            env.setenv(key, value)
        return cli._broker_config(args)


def _brokers(services: dict[str, dict[str, Any]]) -> list[str]:
    """The services that run ``icefall broker``."""
    return sorted(n for n, s in services.items() if _command(s)[:2] == ["icefall", "broker"])


@pytest.fixture(scope="module")
def broker_config(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], tmp_path_factory: Any
) -> BrokerConfig:
    """Broker 1's configuration (``broker``: the one Airflow asks)."""
    return _load_config(compose, services, "broker", tmp_path_factory.mktemp("broker"))


# ---------------------------------------------------------------- services and dependencies


def test_the_stack_has_every_service_of_the_design(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) >= REQUIRED, f"missing: {REQUIRED - set(services)}"
    for name, args in AIRFLOW_COMMANDS.items():
        command = _command(services[name])
        assert command[0] == "airflow" and command[1 : 1 + len(args)] == args, name


def test_dependencies_exist_and_their_conditions_can_be_met(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        for target, condition in _depends_on(service).items():
            assert target in services, f"{name} depends on unknown service {target}"
            assert target != name
            assert condition in CONDITIONS, f"{name} -> {target}: unknown condition {condition}"
            if condition == "service_healthy":
                assert "healthcheck" in services[target], (
                    f"{name} waits for {target} to be healthy; it has no check"
                )
            if condition == "service_completed_successfully":
                assert _one_shot(services[target]), (
                    f"{name} waits for {target} to exit, but it restarts"
                )
    # no cycles: Compose could not order the start
    done: set[str] = set()
    remaining = dict(services)
    while remaining:
        ready = [n for n, s in remaining.items() if set(_depends_on(s)) <= done]
        assert ready, f"dependency cycle among {sorted(remaining)}"
        for n in ready:
            done.add(n)
            del remaining[n]


def test_every_long_running_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if not _one_shot(service):
            check = service.get("healthcheck")
            assert check and check.get("test"), f"{name} has no healthcheck"
            assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_the_broker_waits_for_its_stores_and_airflow_for_its_database(
    services: dict[str, dict[str, Any]],
) -> None:
    broker = _depends_on(services["broker"])
    assert broker["postgres"] == "service_healthy"
    assert broker["minio-init"] == "service_completed_successfully"
    assert _depends_on(services["minio-init"])["minio"] == "service_healthy"
    for name in AIRFLOW_COMMANDS:
        deps = _depends_on(services[name])
        assert deps["postgres"] == "service_healthy", name
        if name != "airflow-init":
            assert deps["airflow-init"] == "service_completed_successfully", name
    scheduler = _depends_on(services["airflow-scheduler"])
    assert scheduler["broker"] == scheduler["spark-master"] == "service_healthy"
    assert _depends_on(services["spark-worker"])["spark-master"] == "service_healthy"


# ---------------------------------------------------------------- ports and volumes


def test_host_ports_do_not_collide_and_the_readme_lists_them(
    services: dict[str, dict[str, Any]],
) -> None:
    owners: dict[int, str] = {}
    for name, service in services.items():
        for host, _ in _published(service):
            assert host not in owners, f"host port {host} published by {owners[host]} and {name}"
            owners[host] = name
    assert {p: owners.get(p) for p in (9093, 8090, 8081, 8181)} == dict.fromkeys(
        (9093, 8090, 8081, 8181), "broker"
    )
    assert owners.get(8080) == "airflow-apiserver" and owners.get(9000) == "minio"
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Production-shaped stack (docker-compose)", 1)
    assert len(section) == 2, "README has no 'Production-shaped stack (docker-compose)' section"
    for port in owners:
        assert f"{port}" in section[1].split("\n## ", 1)[0], (
            f"README's compose section does not mention port {port}"
        )


def test_broker_ports_match_its_configuration(
    services: dict[str, dict[str, Any]], broker_config: BrokerConfig
) -> None:
    published = {c: h for h, c in _published(services["broker"])}
    for port in (broker_config.admin_port, broker_config.registry_port, broker_config.catalog_port):
        assert published.get(port) == port, f"broker port {port} is not published as itself"
    for listener in broker_config.listener_list():
        if listener.advertised_host == "broker":  # the compose network's listener
            assert listener.port in _listens(services["broker"]), listener
        else:  # for clients outside: published as itself
            assert published.get(listener.port) == listener.advertised_port, listener
    # the admin API has no login: reachable from the host's loopback only
    admin = [str(p) for p in services["broker"]["ports"] if str(p).endswith(":8090")]
    assert admin == ["127.0.0.1:8090:8090"]


def test_named_volumes_are_declared_used_and_shared_where_needed(
    compose: dict[str, Any],
    services: dict[str, dict[str, Any]],
    broker_config: BrokerConfig,
) -> None:
    declared = set(compose.get("volumes") or {})
    used: set[str] = set()
    mounts: dict[str, dict[str, str]] = {}
    for name, service in services.items():
        for entry in service.get("volumes") or []:
            source, target, *mode = str(entry).split(":")
            if source.startswith((".", "/")):
                assert (REPO / source).exists(), f"{name} bind-mounts missing {source}"
                continue
            assert source in declared, f"{name} mounts undeclared volume {source}"
            used.add(source)
            mounts.setdefault(name, {})[source] = target + (":" + mode[0] if mode else "")
    assert declared == used, f"declared but unused volumes: {declared - used}"

    broker_home = str(broker_config.home)
    assert mounts["broker"]["broker-home"] == broker_home, (
        "the broker's --home must be on its volume"
    )
    assert mounts["minio"]["minio-data"] == "/data" and "postgres-data" in mounts["postgres"]
    for name in (
        "airflow-scheduler",
        "airflow-dag-processor",
    ):  # they read the table-topic manifest
        assert mounts[name]["broker-home"] == f"{_env(services[name])['ICEFALL_HOME']}:ro", name


# ---------------------------------------------------------------- environment and URLs


def test_every_url_names_a_service_listening_on_that_port(
    compose: dict[str, Any],
    services: dict[str, dict[str, Any]],
) -> None:
    hosts = _hostnames(services)
    found = 0
    texts = [
        *(t for s in services.values() for t in _strings([s.get("environment"), s.get("command")])),
        *(c["content"] for c in compose.get("configs", {}).values()),
    ]
    for text in texts:
        if text.startswith("{"):
            continue  # an Airflow connection as JSON: checked below
        for scheme, rest in _URL.findall(text):
            if scheme in ("s3", "s3a", "file"):
                continue
            parsed = urlparse(f"{scheme}://{rest}")
            assert parsed.hostname, text
            if parsed.hostname in LOCAL:
                continue
            assert parsed.hostname in hosts, (
                f"{text!r} names {parsed.hostname}, which is no service"
            )
            assert parsed.port, f"{text!r}: give the port explicitly"
            assert parsed.port in _listens(services[hosts[parsed.hostname]]), (
                f"{text!r}: {parsed.hostname} does not listen on {parsed.port}"
            )
            found += 1
    assert found >= 10

    spark = json.loads(_env(services["airflow-scheduler"])["AIRFLOW_CONN_SPARK_DEFAULT"])
    master = urlparse(spark["host"])
    assert master.scheme == "spark" and master.hostname in hosts
    assert int(spark["port"]) in _listens(services[hosts[master.hostname]])


def test_databases_and_credentials_in_connection_strings_exist(
    compose: dict[str, Any],
    services: dict[str, dict[str, Any]],
) -> None:
    postgres = _env(services["postgres"])
    databases = {postgres["POSTGRES_DB"]}
    databases |= set(
        re.findall(r"CREATE DATABASE (\w+)", _config_text(compose, "postgres-databases"))
    )
    mounted = {c["source"]: c["target"] for c in services["postgres"].get("configs", [])}
    assert mounted["postgres-databases"].startswith("/docker-entrypoint-initdb.d/")
    seen = set()
    for text in (
        t for s in services.values() for t in _strings([s.get("environment"), s.get("command")])
    ):
        for match in re.finditer(r"postgresql(?:\+\w+)?://[^\s'\"]+", text):
            url = urlparse(match.group(0))
            assert (
                url.username == postgres["POSTGRES_USER"]
                and url.password == postgres["POSTGRES_PASSWORD"]
            )
            database = url.path.lstrip("/")
            assert database in databases, f"{match.group(0)}: database {database} is never created"
            seen.add(database)
    assert {"airflow", "iceberg_catalog", "icefall"} <= seen  # icefall: the broker's metadata


def test_s3_settings_agree_between_minio_the_broker_and_spark(
    compose: dict[str, Any],
    services: dict[str, dict[str, Any]],
    broker_config: BrokerConfig,
) -> None:
    minio = _env(services["minio"])
    for name in ("broker", "minio-init", "spark-worker", "airflow-scheduler"):
        env = _env(services[name])
        assert env["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"], name
        assert env["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"], name
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000", name
    assert len(minio["MINIO_ROOT_PASSWORD"]) >= 8  # MinIO refuses shorter ones
    bucket = _env(services["minio-init"])["ICEFALL_BUCKET"]
    assert urlparse(broker_config.store.url).netloc == bucket
    assert urlparse(broker_config.catalog_warehouse).netloc == bucket
    defaults = _spark_defaults(compose)
    for catalog in ("icefall", "icefall_round"):
        assert defaults[f"spark.sql.catalog.{catalog}.s3.endpoint"] == "http://minio:9000"
        assert defaults[f"spark.sql.catalog.{catalog}.s3.path-style-access"] == "true"
        assert (
            defaults[f"spark.sql.catalog.{catalog}.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
        )


def test_airflow_components_share_one_configuration(services: dict[str, dict[str, Any]]) -> None:
    envs = {name: _env(services[name]) for name in AIRFLOW_COMMANDS}
    first = envs["airflow-scheduler"]
    for name, env in envs.items():
        assert env == first, f"{name}'s Airflow settings differ from the scheduler's"
    assert first["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert (
        urlparse(first["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]).hostname == "airflow-apiserver"
    )
    assert first["AIRFLOW__API_AUTH__JWT_SECRET"] and first["AIRFLOW__API__SECRET_KEY"]
    assert (
        first["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "true"
    )  # the scheduler's healthcheck needs it
    folder = Path(first["AIRFLOW__CORE__DAGS_FOLDER"])
    assert folder.parent == Path("/opt/icefall") and (REPO / folder.name).is_dir()
    # the plugin comes by its entry point (icefall_airflow is installed): a plugins folder holding
    # it too would register it twice
    assert "AIRFLOW__CORE__PLUGINS_FOLDER" not in first
    # the admin APIs of the brokers, the first one's first (AdminClient asks the next when one
    # does not answer)
    admin = [urlparse(u) for u in first["ICEFALL_ADMIN_URL"].split(",")]
    assert [u.hostname for u in admin] == ["broker", "broker-2", "broker-3"]


# ---------------------------------------------------------------- the broker command


def test_the_broker_command_is_one_the_cli_accepts(broker_config: BrokerConfig) -> None:
    config = broker_config
    assert config.host == "0.0.0.0" and config.advertised == "broker"
    assert config.store.is_s3 and config.store.endpoint_url == "http://minio:9000"
    assert config.catalog_db_uri.startswith("postgresql+psycopg2://")
    # the broker's metadata in Postgres (the `icefall` database), not in SQLite on the volume
    assert config.metadata_uri is not None and urlparse(config.metadata_uri).path == "/icefall"
    assert config.metadata_target == config.metadata_uri
    assert config.catalog_warehouse.startswith("s3://")
    assert config.retention_check_interval_ms > 0


def test_three_brokers_form_one_cluster(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], tmp_path_factory: Any
) -> None:
    """Three brokers, node ids 1..3, one metadata database (cluster mode: Postgres), one object
    store and one catalog; each advertises its own name and publishes its own host ports."""
    names = _brokers(services)
    assert names == ["broker", "broker-2", "broker-3"]
    configs = {n: _load_config(compose, services, n, tmp_path_factory.mktemp(n)) for n in names}
    assert sorted(c.node_id for c in configs.values()) == [1, 2, 3]
    first = configs["broker"]
    assert first.metadata_uri is not None and first.metadata_uri.startswith("postgresql://")
    hosts = _hostnames(services)
    homes: set[str] = set()
    for name, config in configs.items():
        service = services[name]
        # shared: the metadata (so they are one cluster), the segments, the catalog and its key
        assert config.metadata_uri == first.metadata_uri, name
        assert config.store.url == first.store.url and config.store.is_s3, name
        assert config.store.endpoint_url == first.store.endpoint_url, name
        assert config.catalog_db_uri == first.catalog_db_uri, name
        assert config.catalog_warehouse == first.catalog_warehouse, name
        key = config.catalog_token_signing_key
        assert key is not None and first.catalog_token_signing_key is not None
        assert key.get_secret_value() == first.catalog_token_signing_key.get_secret_value(), name
        # its own: the name others reach it by, and the ports the host reaches it on
        assert hosts[config.advertised] == name, f"{name} advertises {config.advertised}"
        published = {c: h for h, c in _published(service)}
        for listener in config.listener_list():
            if listener.advertised_host == config.advertised:
                assert listener.port in _listens(service), (name, listener)
            else:
                assert published.get(listener.port) == listener.advertised_port, (name, listener)
        for port in (config.admin_port, config.registry_port, config.catalog_port):
            assert port in published, f"{name}: port {port} is not published"
        volume = next(
            str(v).split(":")[0] for v in service["volumes"] if ":/var/lib/icefall" in str(v)
        )
        homes.add(volume)
        assert _depends_on(service) == _depends_on(services["broker"]), name
        assert "healthcheck" in service, name
        # its peers reach it on INTERNAL, logged in as admin (a super user: CLUSTER_ACTION)
        peer = peer_security(config)
        assert (peer.listener, peer.mechanism, peer.username) == (
            "INTERNAL",
            "SCRAM-SHA-512",
            "admin",
        ), name
        assert peer.password and "User:admin" in config.super_users, name
    assert len(homes) == 3, "each broker has a home of its own"


# ---------------------------------------------------------------- Spark and the image


def test_spark_pulls_the_iceberg_build_of_the_installed_pyspark(
    compose: dict[str, Any],
    services: dict[str, dict[str, Any]],
) -> None:
    from spark_jobs.jars import scala_version

    spark_minor = ".".join(_constraint("pyspark").split(".")[:2])
    packages = _spark_defaults(compose)["spark.jars.packages"].split(",")
    pinned = (
        (REPO / "spark_jobs" / "jvm" / "pom.xml")
        .read_text()
        .split("<iceberg.version>")[1]
        .split("<")[0]
    )
    assert (
        f"org.apache.iceberg:iceberg-spark-runtime-{spark_minor}_{scala_version()}:{pinned}"
        in packages
    )
    assert f"org.apache.iceberg:iceberg-aws-bundle:{pinned}" in packages
    image = services["spark-master"]["image"]
    assert image.startswith(f"apache/spark:{spark_minor}."), (
        f"{image}: the master must run Spark {spark_minor}"
    )
    # the worker runs executors for the Airflow-side driver: same image, same Python and packages
    assert services["spark-worker"]["image"] == services["airflow-scheduler"]["image"]
    for name in ("spark-worker", "airflow-scheduler"):
        conf_dir = _env(services[name])["SPARK_CONF_DIR"]
        targets = {c["source"]: c["target"] for c in services[name]["configs"]}
        assert targets["spark-defaults"] == f"{conf_dir}/spark-defaults.conf", name


def test_the_commit_rounds_catalog_gets_the_s3_settings(compose: dict[str, Any]) -> None:
    from spark_jobs.commit_round import SPARK_CATALOG

    assert f"spark.sql.catalog.{SPARK_CATALOG}.io-impl" in _spark_defaults(compose)


def test_the_image_is_built_from_this_repository_with_the_pinned_constraints(
    services: dict[str, dict[str, Any]],
) -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-", dockerfile, re.MULTILINE), (
        "the image must run Python 3.11"
    )
    assert re.search(r"pip install .*-c constraints\.txt \.", dockerfile)
    # the jars Spark sessions get come from the same pom and checksums as `make setup`'s
    assert "spark_jobs/jvm/pom.xml" in dockerfile and "jars.sha256" in dockerfile
    assert (
        "COPY --from=jars /jars /opt/icefall/jars" in dockerfile
        and "ICEFALL_JARS_DIR=/opt/icefall/jars" in dockerfile
    )
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for match in re.finditer(r"^COPY (?!--from)(?:--\S+ )*(.+) \S+$", dockerfile, re.MULTILINE):
        for source in match.group(1).split():
            assert (REPO / source).exists(), f"Dockerfile copies missing {source}"
            assert source not in ignored, (
                f"Dockerfile copies {source}, which .dockerignore leaves out"
            )
    built = [n for n, s in services.items() if "build" in s]
    assert built and all(services[n]["build"]["context"] == "." for n in built)
    images = {services[n]["image"] for n in built}
    assert len(images) == 1, f"one Icefall image, got {images}"
    for name in ["broker", "spark-worker", "minio-init", *AIRFLOW_COMMANDS]:
        assert services[name]["image"] in images, f"{name} must run the Icefall image"


# ---------------------------------------------------------------- security


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> None:
    """A TLS handshake between the two contexts in memory (the client checks ``host``)."""
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    server_side = server.wrap_bio(pipes[0], pipes[1], server_side=True)
    client_side = client.wrap_bio(pipes[2], pipes[3], server_hostname=host)
    for _ in range(10):
        done = 0
        for side, out, into in (
            (client_side, pipes[3], pipes[0]),
            (server_side, pipes[1], pipes[2]),
        ):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
            into.write(out.read())
        if done == 2:
            return
    raise AssertionError(f"the TLS handshake for {host} did not finish")


def test_the_stack_runs_secured(
    compose: dict[str, Any],
    services: dict[str, dict[str, Any]],
    broker_config: BrokerConfig,
    tmp_path: Path,
) -> None:
    from broker.http_security.registry_auth import parse_role
    from broker.http_security.users import authenticate, load_users
    from broker.kafka.authorizer import parse_super_users
    from broker.security import dev_certs, settings, tls

    config = broker_config
    broker = services["broker"]
    # Airflow and Spark reach the admin API at http://broker:8090: it listens beyond loopback
    # inside the network, and the host publishes it on its own loopback only.
    assert config.admin_host == "0.0.0.0"
    assert f"127.0.0.1:{config.admin_port}:{config.admin_port}" in broker["ports"]
    # Kafka: every listener authenticates (SCRAM); the one for clients outside is SASL_SSL
    listeners = config.listener_list()
    assert {x.protocol for x in listeners} == {"SASL_PLAINTEXT", "SASL_SSL"}
    [outside] = [x for x in listeners if x.advertised_host != "broker"]
    assert outside.protocol == "SASL_SSL"
    for listener in listeners:
        assert settings.mechanisms(config, listener) == ["SCRAM-SHA-512"]
    # ACLs on, nothing allowed that no ACL allows, and a super user to grant them
    assert config.authorizer_class_name and not config.allow_everyone_if_no_acl_found
    supers = parse_super_users(config.super_users)
    assert "User:admin" in supers

    # the first SCRAM user: the super user, stored before the broker starts, password on stdin
    deps = _depends_on(broker)
    assert deps["certs-init"] == deps["kafka-users-init"] == "service_completed_successfully"
    users_init = services["kafka-users-init"]
    assert _config_targets(users_init) == _config_targets(broker)
    assert _env(users_init)["ICEFALL_METADATA_URI"] == config.metadata_uri
    script = _command(users_init)[-1] if users_init["command"][0] == "sh" else ""
    scram = shlex.split(script.split("|", 1)[1].split(";")[0])
    assert scram[:4] == ["icefall", "scram-add", "--config", _broker_args(services).config]
    assert f"User:{scram[scram.index('--user') + 1]}" in supers
    assert scram[scram.index("--mechanism") + 1] == "SCRAM-SHA-512"
    assert "--password" not in scram and '"$KAFKA_ADMIN_PASSWORD"' in script.split("|")[0]
    assert _env(users_init)["KAFKA_ADMIN_PASSWORD"]

    # TLS: certs-init makes the keystore the broker reads, into the volume both mount
    keystore = Path(str(config.ssl_keystore_location))
    mounts = {
        name: {
            str(v).split(":")[0]: str(v).split(":")[1] for v in services[name].get("volumes", [])
        }
        for name in ("certs-init", "broker")
    }
    [volume] = [v for v, target in mounts["broker"].items() if target == str(keystore.parent)]
    made = _command(services["certs-init"])
    assert made[:3] == ["python", "-m", "broker.security.dev_certs"]
    assert made[3] == mounts["certs-init"][volume] == str(keystore.parent)
    assert keystore.name == dev_certs.KEYSTORE_FILE
    # run it here, and shake hands with the certificate as a client trusting its CA would
    assert dev_certs.main([str(tmp_path), *made[4:]]) == 0
    here = config.model_copy(update={"ssl_keystore_location": str(tmp_path / keystore.name)})
    server = tls.server_context(here, outside)
    client = ssl.create_default_context(cafile=str(tmp_path / dev_certs.CA_FILE))
    for listener in listeners:
        _handshake(server, client, listener.advertised_host)

    # the registry (basic auth, roles) and the catalog (OAuth2): their files are mounted configs
    mounted = _config_targets(broker)
    assert config.registry_authentication_method == "BASIC"
    assert config.catalog_authentication_method == "OAUTH2"
    assert config.admin_authentication_method == "BASIC"
    files: dict[str, Any] = {}
    for what, path in (
        ("registry", config.registry_users_file),
        ("catalog", config.catalog_clients_file),
        ("admin API", config.admin_users_file),
    ):
        assert str(path) in mounted, f"the {what}'s file {path} is not mounted in the broker"
        local = tmp_path / f"{what}.properties"
        local.write_text(_config_text(compose, mounted[str(path)]))
        files[what] = load_users(local)
    roles = {
        role: parse_role(role, text, "schema.registry.authorization.role.")
        for role, text in config.registry_roles.items()
    }
    for user in files["registry"].values():
        assert user.roles and set(user.roles) <= set(roles), user.name

    # Airflow: the connections the rounds log in with are users of those files; a login
    for name in AIRFLOW_COMMANDS:
        env = _env(services[name])
        assert env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "false") != "true"
        assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]
        for conn, what in (
            ("ICEFALL_REGISTRY", "registry"),
            ("ICEFALL_CATALOG", "catalog"),
            ("ICEFALL_ADMIN", "admin API"),
        ):
            connection = json.loads(env[f"AIRFLOW_CONN_{conn}"])
            user = authenticate(files[what], connection["login"], connection["password"])
            assert user is not None, f"{name}: {conn} does not log in to the {what}"
    rounds = files["registry"][json.loads(env["AIRFLOW_CONN_ICEFALL_REGISTRY"])["login"]]
    assert any(g for role in rounds.roles for g in roles[role]), "the rounds' user reads nothing"

    # no secret on any command line (ps shows it): every password of the stack's environments
    secrets = {
        v
        for s in services.values()
        for k, v in _env(s).items()
        if re.search(r"PASSWORD|SECRET|_URI$", k) and v
    }
    secrets |= {urlparse(u).password or "" for u in secrets if "://" in u}
    # not Postgres's development default, "icefall": every image name has it
    secrets = {s for s in secrets if len(s) >= 8}
    assert len(secrets) >= 6
    for name, service in services.items():
        argv = " ".join(_command(service))
        assert not [s for s in secrets if s in argv], f"{name}'s command shows a secret"
