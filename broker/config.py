"""The one configuration model of a broker process, and where its values come from.

Values come from (lowest to highest precedence) the model's defaults, a
Kafka-style ``server.properties`` file (``icefall broker --config FILE``), the
``ICEFALL_*`` environment, and the command line (``--override key=value``, as
``kafka-server-start.sh`` takes it, and one flag per setting, generated from
the model). A DAG or a Spark job started by Airflow builds the same model from
the same environment, and ``icefall up`` hands the broker it starts every
setting as ``--override`` (``to_overrides``), so nothing given to it is lost.

Each setting has one property key: Kafka's own name where Kafka has the
setting (``node.id``, ``num.partitions``, ``auto.create.topics.enable``,
``log.retention.check.interval.ms``, ...), AutoMQ's for the table catalog
(``automq.table.topic.catalog.*``), and the field's name with dots otherwise
(``segment.flush.ms``, ``object.store``). A key nobody knows is refused with
its name, like a bad value: a typo must not silently mean the default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict

from broker.contracts import CatalogSpec
from broker.external_catalogs import catalog_properties, tablebucket
from broker.security import listeners as listener_settings

CATALOG_PREFIX = "automq.table.topic.catalog."
REGISTRY_ROLE_PREFIX = "schema.registry.authorization.role."
LISTENER_PREFIX = "listener.name."
CatalogType = Literal["rest", "glue", "tablebucket", "nessie"]
NESSIE_NEEDS_URI = (
    f"{CATALOG_PREFIX}type=nessie needs {CATALOG_PREFIX}uri: Nessie's API, "
    "e.g. http://nessie:19120/api/v2"
)


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the key (or flag) and why."""


class ObjectStoreConfig(BaseModel):
    """Where segment objects live: a local directory or ``s3://bucket/prefix``."""

    model_config = ConfigDict(frozen=True)

    url: str
    endpoint_url: str | None = None
    region: str | None = None
    # From the AWS_* environment of each process; never written out (to_overrides, logs).
    access_key_id: str | None = Field(default=None, exclude=True, repr=False)
    secret_access_key: str | None = Field(default=None, exclude=True, repr=False)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = urlparse(value).scheme
        if scheme not in ("", "file", "s3"):
            raise ValueError(
                f"object store must be a directory, file:// or s3:// URL, got {value!r}"
            )
        if scheme == "s3" and not urlparse(value).netloc:
            raise ValueError(f"s3 object store URL needs a bucket: {value!r}")
        return value

    @property
    def is_s3(self) -> bool:
        return urlparse(self.url).scheme == "s3"


class CatalogConfig(BaseModel):
    """Which Iceberg catalog holds the tables, with AutoMQ's keys
    (``automq.table.topic.catalog.type|uri|warehouse``); every other
    ``automq.table.topic.catalog.<property>`` is an Iceberg catalog property passed
    through as it is (``s3.endpoint``, ``glue.endpoint``, ``client.region``, ...)."""

    model_config = ConfigDict(frozen=True)

    type: CatalogType = Field(
        default="rest",
        description=(
            "rest (the built-in catalog, or any Iceberg REST catalog at uri), glue, tablebucket (S3 Tables), nessie"
        ),
    )
    uri: str | None = Field(
        default=None, description="the catalog's URI; for rest, unset means the built-in one"
    )
    properties: dict[str, str] = Field(
        default_factory=dict, description="Iceberg catalog properties"
    )

    @field_validator("properties")
    @classmethod
    def _known_properties(cls, value: dict[str, str]) -> dict[str, str]:
        """A misspelt property would be ignored by pyiceberg and Spark alike: refused here."""
        problem = catalog_properties.unknown_property_problem(value, CATALOG_PREFIX)
        if problem:
            raise ValueError(problem)
        return value

    @property
    def builtin(self) -> bool:
        return self.type == "rest" and self.uri is None


# A TCP port, as a listener's (``broker.security.listeners``): uvloop binds 99999 as 34463
# (the low 16 bits) without a word, so a typo would serve on a port nobody asked for.
Port = Annotated[int, Field(ge=0, le=65535)]


class BrokerConfig(BaseSettings):
    """Settings of one broker process (Kafka listener, registry, catalog, admin API)."""

    model_config = SettingsConfigDict(frozen=True, env_prefix="ICEFALL_", extra="forbid")

    home: Path = Field(
        default=Path(".icefall"), description="state directory: WAL, metadata, manifest"
    )
    host: str = Field(default="127.0.0.1", description="listen address")
    advertised_host: str | None = Field(
        default=None, description="host name given to clients in Metadata"
    )
    kafka_port: Port = Field(default=9092, description="Kafka listener")
    registry_port: Port = Field(default=8081, description="schema registry")
    catalog_port: Port = Field(default=8181, description="Iceberg REST catalog")
    admin_port: Port = Field(default=8090, description="admin HTTP API and Prometheus /metrics")
    admin_host: str = Field(
        default="127.0.0.1",
        description=(
            "listen address of the admin HTTP API: loopback unless its network is trusted "
            "(0.0.0.0 where Airflow or Spark run on other hosts; it has no TLS, and a login "
            "only with admin.authentication.method)"
        ),
    )
    node_id: int = Field(
        default=0, ge=0, lt=2**31, description="this broker's id in Metadata (an INT32)"
    )
    broker_rack: str | None = Field(
        default=None, description="this broker's rack in Metadata (cluster mode)"
    )
    broker_lease_ms: int = Field(
        default=6000,
        gt=0,
        description=(
            "cluster mode (Postgres metadata): how long a broker's partition leases and "
            "membership last without a heartbeat; a broker that could not renew stops accepting "
            "produce this long after its last renewal began, and another broker takes over"
        ),
    )
    broker_heartbeat_interval_ms: int = Field(
        default=1000,
        gt=0,
        description="cluster mode: how often a broker renews its membership and leases",
    )
    cluster_id: str = Field(
        default="icefall-local-cluster", description="the cluster id clients see"
    )
    object_store: Annotated[ObjectStoreConfig | None, NoDecode] = Field(
        default=None,
        description=(
            "s3://bucket/prefix (endpoint and credentials from AWS_* variables); default: HOME/objects"
        ),
    )
    segment_flush_ms: int = Field(
        default=1000, ge=1, description="flush segments at least this often"
    )
    segment_flush_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="flush segments at this size"
    )
    # Cluster mode: every flush writes a small segment object; the leader of a partition
    # merges runs of its small chunks into bigger objects (broker/storage/compaction.py).
    segment_compaction_enable: bool = Field(
        default=True, description="cluster mode: merge small segment objects in the background"
    )
    segment_compaction_interval_ms: int = Field(
        default=10_000, ge=1, description="cluster mode: run a compaction pass this often"
    )
    segment_compaction_target_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="cluster mode: the largest compacted chunk run and compacted object",
    )
    segment_compaction_min_age_ms: int = Field(
        default=5_000,
        ge=0,
        description="cluster mode: compact only chunks whose batches were all appended this long ago",
    )
    wal_fsync: bool = Field(default=True, description="fdatasync the WAL before acknowledging")
    # Acknowledged bytes not yet in the object store (held in memory and the WAL) above
    # which produces wait for a flush, then fail with KAFKA_STORAGE_ERROR (retriable):
    # an object store outage slows producers instead of growing memory without end.
    max_unflushed_bytes: int | None = Field(
        default=None,
        ge=1024,
        description=(
            "hold produces while more than this is not yet in the object store (default max(256 MiB, 8 x flush bytes))"
        ),
    )
    max_request_bytes: int = Field(
        default=100 * 1024 * 1024, ge=1024, description="largest request accepted"
    )
    default_partitions: int = Field(
        default=1, ge=1, description="partitions of auto-created topics"
    )
    auto_create_topics: bool = Field(
        default=False, description="create unknown topics on first use"
    )
    group_initial_rebalance_delay_ms: int = Field(
        default=300, ge=0, description="wait for more members this long"
    )
    group_consumer_heartbeat_interval_ms: int = Field(
        default=5000,
        ge=1,
        description="how often consumer-protocol (KIP-848) members heartbeat",
    )
    group_consumer_session_timeout_ms: int = Field(
        default=45_000,
        ge=1,
        description="remove a consumer-protocol (KIP-848) member silent this long",
    )
    transaction_max_timeout_ms: int = Field(
        default=900_000,
        ge=1,
        description="the largest transaction.timeout.ms a transactional producer may ask for",
    )
    transaction_cleanup_interval_ms: int = Field(
        default=10_000,
        ge=1,
        description="look for transactions past their timeout (and abort them) this often",
    )
    retention_check_interval_ms: int = Field(
        default=300_000,
        ge=1,
        description=("run segment retention this often (Kafka's log.retention.check.interval.ms)"),
    )
    catalog_uri: str | None = Field(
        default=None,
        description=(
            "the built-in catalog's database, a SQLAlchemy URL (default sqlite:///HOME/catalog.sqlite)"
        ),
    )
    metadata_uri: str | None = Field(
        default=None,
        description=(
            "the broker's metadata in Postgres, postgresql://user:password@host:port/database "
            "(default SQLite in HOME/metadata.sqlite, one broker); with Postgres, brokers "
            "sharing the database and the object store form a cluster"
        ),
    )
    warehouse: str | None = Field(
        default=None,
        description=(
            "where tables live: a directory, file:// or s3://bucket/prefix (default file://HOME/warehouse); "
            "for a tablebucket catalog, the table bucket's ARN"
        ),
    )
    catalog_vended_credentials: bool = Field(
        default=False,
        description=(
            "hand this broker's AWS credentials to catalog clients in the load-table config "
            "(off: clients use their own)"
        ),
    )
    catalog: CatalogConfig = Field(
        default_factory=CatalogConfig, description="the Iceberg catalog of the tables"
    )
    # Security of the Kafka listeners (broker/security), with Kafka's key names.
    listeners: str | None = Field(
        default=None,
        description=(
            "Kafka listeners NAME://host:port,... e.g. PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093 "
            "(default: one PLAINTEXT listener on host and kafka.port)"
        ),
    )
    advertised_listeners: str | None = Field(
        default=None,
        description="what clients are told to connect to, per listener name (default: listeners)",
    )
    listener_security_protocol_map: str = Field(
        default=listener_settings.DEFAULT_PROTOCOL_MAP,
        description="listener name to PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    )
    ssl_keystore_type: str | None = Field(
        default=None, description="PEM, the only type Icefall reads (unset: PEM)"
    )
    ssl_keystore_location: str | None = Field(
        default=None, description="a PEM file with the private key and the certificate chain"
    )
    ssl_keystore_certificate_chain: str | None = Field(
        default=None, description="the certificate chain as PEM text (with ssl.keystore.key)"
    )
    ssl_keystore_key: SecretStr | None = Field(
        default=None, description="the private key as PEM text"
    )
    ssl_key_password: SecretStr | None = Field(
        default=None, description="the password of an encrypted private key"
    )
    ssl_truststore_type: str | None = Field(
        default=None, description="PEM, the only type Icefall reads (unset: PEM)"
    )
    ssl_truststore_location: str | None = Field(
        default=None,
        description="a PEM file of the CA certificates client certificates are checked against",
    )
    ssl_truststore_certificates: str | None = Field(
        default=None, description="the CA certificates as PEM text"
    )
    ssl_client_auth: Literal["required", "requested", "none"] = Field(
        default="none", description="ask TLS clients for a certificate: required, requested or none"
    )
    sasl_enabled_mechanisms: str = Field(
        default="PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        description="SASL mechanisms offered on SASL listeners (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)",
    )
    connections_max_reauth_ms: int = Field(
        default=0,
        ge=0,
        description="SASL sessions expire after this long unless re-authenticated (KIP-368; 0: never)",
    )
    per_listener: dict[str, str] = Field(
        default_factory=dict,
        description="listener.name.<listener>.<key> settings, keyed without listener.name.",
    )
    per_listener_secrets: dict[str, SecretStr] = Field(
        default_factory=dict,
        description=(
            "the secret listener.name.<listener>.<key> settings (JAAS texts, keys and their "
            "passwords), keyed without listener.name."
        ),
    )
    authorizer_class_name: str = Field(
        default="",
        description=(
            "ACLs enforced on the Kafka listener when set to "
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer (empty: everything allowed)"
        ),
    )
    inter_broker_listener_name: str | None = Field(
        default=None,
        description="the listener brokers reach each other on, secured as it is (cluster mode: "
        "transaction markers; default the first PLAINTEXT listener, else the first)",
    )
    sasl_mechanism_inter_broker_protocol: str | None = Field(
        default=None,
        description="the SASL mechanism brokers authenticate to each other with on a SASL "
        "inter-broker listener, as its JAAS config's username/password (default: the "
        "listener's first enabled mechanism)",
    )
    super_users: str = Field(
        default="",
        description="principals the authorizer allows everything, ';'-separated (User:admin)",
    )
    allow_everyone_if_no_acl_found: bool = Field(
        default=False,
        description="with the authorizer on, allow actions on resources that have no ACL at all",
    )
    # ------------------------------------------- HTTP security (docs/security-http.md)
    registry_authentication_method: Literal["NONE", "BASIC"] = Field(
        default="NONE",
        description="NONE, or BASIC: HTTP basic auth on the schema registry (users file)",
    )
    registry_users_file: Path | None = Field(
        default=None,
        description=(
            "the registry's users, Jetty PropertyFileLoginModule lines 'user: password,role,...' "
            "(password plain, MD5:<hex> or CRYPT:<crypt>)"
        ),
    )
    registry_roles: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "role -> permissions, e.g. 'read:*,write:orders-*' or 'admin' "
            "(none: every authenticated user may do everything)"
        ),
    )
    registry_ssl_keystore_location: Path | None = Field(
        default=None,
        description="TLS on the registry: a PEM file with the private key and certificate chain",
    )
    registry_ssl_key_password: SecretStr | None = Field(
        default=None, description="the password of the registry's PEM private key, if encrypted"
    )
    admin_authentication_method: Literal["NONE", "BASIC"] = Field(
        default="NONE",
        description=(
            "NONE, or BASIC: HTTP basic auth on the admin API (every route but /healthz; "
            "clients: ICEFALL_ADMIN_USER_INFO or Airflow's icefall_admin connection)"
        ),
    )
    admin_users_file: Path | None = Field(
        default=None,
        description="the admin API's users, lines 'user: password' (as the registry's users file)",
    )
    catalog_authentication_method: Literal["NONE", "OAUTH2"] = Field(
        default="NONE",
        description="NONE, or OAUTH2: client credentials at /v1/oauth/tokens, bearer tokens",
    )
    catalog_clients_file: Path | None = Field(
        default=None,
        description="the catalog's OAuth2 clients, lines 'client_id: secret' (as the users file)",
    )
    catalog_token_signing_key: SecretStr | None = Field(
        default=None,
        description=(
            "HMAC key signing the catalog's tokens (default: made once, kept in HOME/catalog-token.key; "
            "brokers sharing a catalog database need the same one)"
        ),
    )
    catalog_token_lifetime_ms: int = Field(
        default=3_600_000, ge=1000, description="how long a catalog access token is valid"
    )
    catalog_ssl_keystore_location: Path | None = Field(
        default=None,
        description="TLS on the catalog: a PEM file with the private key and certificate chain",
    )
    catalog_ssl_key_password: SecretStr | None = Field(
        default=None, description="the password of the catalog's PEM private key, if encrypted"
    )

    @model_validator(mode="before")
    @classmethod
    def _listener_secrets_apart(cls, data: Any) -> Any:
        """Secret listener settings given as ``per_listener`` (``ICEFALL_PER_LISTENER``, code)
        are kept with the secrets all the same."""
        given = data.get("per_listener") if isinstance(data, dict) else None
        if isinstance(given, dict) and any(is_secret_listener_key(k) for k in given):
            secrets = {k: v for k, v in given.items() if is_secret_listener_key(k)}
            data = {
                **data,
                "per_listener": {k: v for k, v in given.items() if k not in secrets},
                "per_listener_secrets": {**data.get("per_listener_secrets", {}), **secrets},
            }
        return data

    @field_validator("object_store", mode="before")
    @classmethod
    def _object_store_url(cls, value: Any) -> Any:
        return object_store_from_env(value) if isinstance(value, str) else value

    @field_validator("authorizer_class_name")
    @classmethod
    def _known_authorizer(cls, value: str) -> str:
        from broker.kafka.authorizer import AUTHORIZER_CLASSES

        value = value.strip()
        if value and value not in AUTHORIZER_CLASSES:
            raise ValueError(
                f"unknown authorizer {value!r}: empty (no authorizer) or one of "
                f"{', '.join(AUTHORIZER_CLASSES)} (Icefall's built-in ACL authorizer)"
            )
        return value

    @field_validator("super_users")
    @classmethod
    def _principals(cls, value: str) -> str:
        from broker.kafka.authorizer import parse_super_users

        parse_super_users(value)
        return value.strip()

    @field_validator("catalog_token_signing_key")
    @classmethod
    def _long_signing_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None  # empty: unset (the key kept in HOME)
        # imported only for a key: it brings aiohttp.web and jwt (0.13 CPU-s), and every Airflow
        # task process and DAG parse builds a BrokerConfig
        from broker.http_security.oauth import MIN_KEY_BYTES

        if len(value.get_secret_value().encode()) < MIN_KEY_BYTES:
            raise ValueError(
                f"catalog.oauth2.token.signing.key must be at least {MIN_KEY_BYTES} bytes "
                f"(an HMAC-SHA256 key), got {len(value.get_secret_value().encode())}"
            )
        return value

    @field_validator("metadata_uri")
    @classmethod
    def _postgres_uri(cls, value: str | None) -> str | None:
        if value is not None and value.split(":", 1)[0] not in ("postgresql", "postgres"):
            raise ValueError(
                f"metadata URI must be postgresql://user:password@host:port/database, got {value!r} "
                "(leave it unset for SQLite in HOME/metadata.sqlite)"
            )
        return value

    @model_validator(mode="after")
    def _catalog_fits(self) -> BrokerConfig:
        """Each catalog type checked for the keys it needs, so a bad setting fails at start
        rather than in every round."""
        if self.catalog.type == "nessie" and not self.catalog.uri:
            raise ValueError(NESSIE_NEEDS_URI)
        if self.registry_authentication_method == "BASIC" and self.registry_users_file is None:
            raise ValueError(
                "schema.registry.authentication.method=BASIC needs "
                "schema.registry.authentication.users.file"
            )
        if self.admin_authentication_method == "BASIC" and self.admin_users_file is None:
            raise ValueError(
                "admin.authentication.method=BASIC needs admin.authentication.users.file"
            )
        if self.catalog_authentication_method == "OAUTH2" and self.catalog_clients_file is None:
            raise ValueError(
                "catalog.authentication.method=OAUTH2 needs catalog.oauth2.clients.file"
            )
        if self.catalog.type == "tablebucket":  # AWS S3 Tables: the warehouse is the bucket's ARN
            tablebucket.region_of(self.warehouse)
        if self.catalog.type == "glue" and not (self.warehouse or "").startswith("s3"):
            raise ValueError(
                f"{CATALOG_PREFIX}type=glue needs {CATALOG_PREFIX}warehouse=s3://bucket/path "
                f"(where the tables' files go), got {self.warehouse!r}"
            )
        from broker.security.settings import check_security

        check_security(self)
        return self

    def listener_list(self) -> list[listener_settings.Listener]:
        """The Kafka listeners (``listeners``, or the one on host and kafka.port)."""
        return listener_settings.parse_listeners(
            self.listeners,
            self.advertised_listeners,
            self.listener_security_protocol_map,
            self.host,
            self.kafka_port,
            self.advertised_host,
        )

    def listener_setting(self, listener: listener_settings.Listener, key: str) -> str | None:
        """``key`` for ``listener``: its ``listener.name.<name>.key`` if set, else ``key``
        (a secret one in clear: for the code that uses it, never to be logged)."""
        prefixed = self.prefixed_settings().get(f"{listener.name.lower()}.{key}")
        if prefixed is not None:
            return prefixed
        field = FIELD_BY_KEY.get(key)
        value = getattr(self, field) if field else None
        if isinstance(value, SecretStr):
            return value.get_secret_value()
        return None if value is None else str(value)

    def prefixed_settings(self) -> dict[str, str]:
        """Every ``listener.name.*`` setting, secret ones in clear, keyed without the prefix."""
        secrets = {k: v.get_secret_value() for k, v in self.per_listener_secrets.items()}
        return {**self.per_listener, **secrets}

    @property
    def client_listener(self) -> listener_settings.Listener:
        """The listener of the broker's own clients (the demo producer, /v1/cluster): the first
        PLAINTEXT listener, else the first listener."""
        listeners = self.listener_list()
        return next((x for x in listeners if x.protocol == "PLAINTEXT"), listeners[0])

    @property
    def bootstrap(self) -> str:
        """host:port of ``client_listener``."""
        chosen = self.client_listener
        return f"{chosen.advertised_host}:{chosen.advertised_port}"

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host

    @property
    def store(self) -> ObjectStoreConfig:
        return self.object_store or ObjectStoreConfig(url=str((self.home / "objects").resolve()))

    @property
    def metadata_db(self) -> Path:
        return self.home / "metadata.sqlite"

    @property
    def metadata_target(self) -> Path | str:
        """Where the metadata store lives: the Postgres URI, else the SQLite file."""
        return self.metadata_uri or self.metadata_db

    @property
    def clustered(self) -> bool:
        """Cluster mode: the metadata is in Postgres, so brokers sharing it (and the object
        store) form one cluster (broker/membership.py)."""
        return self.metadata_uri is not None

    @property
    def wal_dir(self) -> Path:
        return self.home / "wal"

    @property
    def manifest_path(self) -> Path:
        return self.home / "table_topics.json"

    @property
    def admin_url(self) -> str:
        """Where this host's Airflow and jobs reach the admin API: on loopback when it listens
        there only, the advertised host when it listens on every address, else its own address."""
        if self.admin_host in ("0.0.0.0", "::", ""):
            host = self.advertised
        elif _loopback(self.admin_host):
            host = "127.0.0.1"
        else:
            host = self.admin_host
        return f"http://{host}:{self.admin_port}"

    @property
    def catalog_db_uri(self) -> str:
        return self.catalog_uri or f"sqlite:///{(self.home / 'catalog.sqlite').resolve()}"

    @property
    def catalog_warehouse(self) -> str:
        tables_elsewhere = self.catalog.type == "tablebucket"  # the warehouse names the bucket
        warehouse = (not tables_elsewhere and self.warehouse) or str(self.home / "warehouse")
        if not urlparse(warehouse).scheme:  # a plain directory
            warehouse = Path(warehouse).resolve().as_uri()
        return warehouse.rstrip("/")

    @property
    def catalog_url(self) -> str:
        """The broker's own REST catalog (served whatever catalog holds the tables)."""
        scheme = "https" if self.catalog_ssl_keystore_location else "http"
        return f"{scheme}://{self.advertised}:{self.catalog_port}"

    @property
    def tables_catalog(self) -> CatalogSpec:
        """The catalog that holds the tables: the built-in one, or the one the catalog keys name."""
        if self.catalog.builtin:
            return CatalogSpec.rest(self.catalog_url)
        assert self.catalog.uri is not None or self.catalog.type in ("glue", "tablebucket")
        return CatalogSpec(
            type=self.catalog.type,
            uri=self.catalog.uri or "",  # glue, tablebucket: no URI (endpoints are properties)
            # Nessie's clients write the metadata files themselves: they need a warehouse.
            warehouse=self.catalog_warehouse if self.catalog.type == "nessie" else self.warehouse,
            properties=dict(self.catalog.properties),
            builtin=False,
        )

    @property
    def registry_url(self) -> str:
        scheme = "https" if self.registry_ssl_keystore_location else "http"
        return f"{scheme}://{self.advertised}:{self.registry_port}"


def object_store_from_env(
    url: str, default_endpoint_url: str | None = None, region: str | None = None
) -> ObjectStoreConfig:
    """Build the object store settings from a URL plus the usual AWS variables (the endpoint
    variables win over ``default_endpoint_url``, e.g. the one the broker's /v1/cluster names)."""
    return ObjectStoreConfig(
        url=url,
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or default_endpoint_url,
        region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or region,
        access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
    )


def aws_io_credentials() -> dict[str, str]:
    """This process's ``AWS_*`` credentials as Iceberg FileIO properties (empty without them):
    what a writer hands the FileIO it configures (a Spark catalog, a round's tasks) so the
    JVM or the executors need not have them in their own environment."""
    pairs = (
        ("s3.access-key-id", "AWS_ACCESS_KEY_ID"),
        ("s3.secret-access-key", "AWS_SECRET_ACCESS_KEY"),
        ("s3.session-token", "AWS_SESSION_TOKEN"),
    )
    return {key: os.environ[var] for key, var in pairs if os.environ.get(var)}


# ---------------------------------------------------------------- property keys

# Kafka's own names for the settings Kafka has; the rest are the field name with dots.
KAFKA_NAMES = {
    "node_id": "node.id",
    "cluster_id": "cluster.id",
    "max_request_bytes": "socket.request.max.bytes",
    "default_partitions": "num.partitions",
    "auto_create_topics": "auto.create.topics.enable",
    "group_initial_rebalance_delay_ms": "group.initial.rebalance.delay.ms",
    "group_consumer_heartbeat_interval_ms": "group.consumer.heartbeat.interval.ms",
    "group_consumer_session_timeout_ms": "group.consumer.session.timeout.ms",
    "retention_check_interval_ms": "log.retention.check.interval.ms",
    "transaction_max_timeout_ms": "transaction.max.timeout.ms",
    "transaction_cleanup_interval_ms": "transaction.abort.timed.out.transaction.cleanup.interval.ms",
    "warehouse": CATALOG_PREFIX + "warehouse",
    # the HTTP services' security, in the spirit of Confluent's registry keys
    "registry_authentication_method": "schema.registry.authentication.method",
    "registry_users_file": "schema.registry.authentication.users.file",
    "registry_ssl_keystore_location": "schema.registry.ssl.keystore.location",
    "registry_ssl_key_password": "schema.registry.ssl.key.password",
    "admin_authentication_method": "admin.authentication.method",
    "admin_users_file": "admin.authentication.users.file",
    "catalog_clients_file": "catalog.oauth2.clients.file",
    "catalog_token_signing_key": "catalog.oauth2.token.signing.key",
    "catalog_token_lifetime_ms": "catalog.oauth2.token.lifetime.ms",
}
# Settings never put on a command line (argv shows in ps): the config file or ICEFALL_* only.
SECRET_FIELDS = frozenset(
    name for name, f in BrokerConfig.model_fields.items() if f.annotation == SecretStr | None
)
OBJECT_STORE_KEYS = {
    "object.store": "url",
    "object.store.endpoint": "endpoint_url",
    "object.store.region": "region",
}
SCALAR_FIELDS = [
    name
    for name in BrokerConfig.model_fields
    if name
    not in ("object_store", "catalog", "registry_roles", "per_listener", "per_listener_secrets")
]
# Listener settings that Kafka types PASSWORD (secret): listener.name.<l>.<key> with these keys.
SECRET_LISTENER_KEYS = ("ssl.key.password", "ssl.keystore.key", "sasl.jaas.config")


def is_secret_listener_key(key: str) -> bool:
    """``key`` (``<listener>.<key>``, without ``listener.name.``) holds a secret."""
    return key.endswith(SECRET_LISTENER_KEYS)


def property_key(field: str) -> str:
    return KAFKA_NAMES.get(field, field.replace("_", "."))


FIELD_BY_KEY = {property_key(name): name for name in SCALAR_FIELDS}
# Also accepted: the dotted field name of a setting that has a Kafka name (warehouse=...).
FIELD_ALIASES = {name.replace("_", "."): name for name in KAFKA_NAMES}


def known_keys() -> list[str]:
    return sorted(
        [
            *FIELD_BY_KEY,
            *OBJECT_STORE_KEYS,
            CATALOG_PREFIX + "type",
            CATALOG_PREFIX + "uri",
            CATALOG_PREFIX + "<iceberg catalog property>",
            REGISTRY_ROLE_PREFIX + "<role>",
            LISTENER_PREFIX + "<listener>.<key>",
        ]
    )


def fields_from_properties(properties: Mapping[str, str], origin: str) -> dict[str, Any]:
    """Model field values from property keys; an unknown key is a ``ConfigError`` naming it."""
    values: dict[str, Any] = {}
    store: dict[str, str] = {}
    catalog: dict[str, Any] = {}
    for key, raw in properties.items():
        value = raw.strip()
        if key in OBJECT_STORE_KEYS:
            store[OBJECT_STORE_KEYS[key]] = value
        elif key in FIELD_BY_KEY or key in FIELD_ALIASES:
            values[FIELD_BY_KEY.get(key) or FIELD_ALIASES[key]] = value
        elif key in (CATALOG_PREFIX + "type", CATALOG_PREFIX + "uri"):
            catalog[key.removeprefix(CATALOG_PREFIX)] = value
        elif key.startswith(CATALOG_PREFIX) and key != CATALOG_PREFIX:
            catalog.setdefault("properties", {})[key.removeprefix(CATALOG_PREFIX)] = value
        elif key.startswith(REGISTRY_ROLE_PREFIX) and key != REGISTRY_ROLE_PREFIX:
            values.setdefault("registry_roles", {})[key.removeprefix(REGISTRY_ROLE_PREFIX)] = value
        elif key.startswith(LISTENER_PREFIX) and key.count(".") >= 3:
            short = key.removeprefix(LISTENER_PREFIX)
            field = "per_listener_secrets" if is_secret_listener_key(short) else "per_listener"
            values.setdefault(field, {})[short] = value
        elif key == "sasl.jaas.config" or key.endswith(".sasl.jaas.config"):
            raise ConfigError(
                f"{origin}: {key} needs Kafka's listener prefix on a broker: "
                f"{LISTENER_PREFIX}<listener>.<mechanism>.sasl.jaas.config, e.g. "
                f"{LISTENER_PREFIX}sasl_ssl.plain.sasl.jaas.config"
            )
        else:
            raise ConfigError(
                f"{origin}: unknown setting {key!r}; known: {', '.join(known_keys())}"
            )
    if store:
        if "url" not in store:
            raise ConfigError(
                f"{origin}: object.store.endpoint/region need object.store=s3://bucket/prefix"
            )
        env = object_store_from_env(store["url"], store.get("endpoint_url"), store.get("region"))
        # a setting given here wins over the environment's
        values["object_store"] = env.model_copy(update={k: v for k, v in store.items() if v})
    if catalog:
        values["catalog"] = catalog
    return values


def read_properties(path: Path) -> dict[str, str]:
    """A Java ``.properties`` file as Kafka reads ``server.properties`` (comments, ``:``/``=``,
    continuation lines, escapes), with the ``javaproperties`` package."""
    import javaproperties

    try:
        with open(path, encoding="utf-8") as fp:
            loaded: dict[str, str] = javaproperties.load(fp)
            return loaded
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from exc


def parse_overrides(items: Iterable[str], origin: str = "--override") -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{origin} takes key=value, got {item!r}")
        out[key.strip()] = value
    return out


def load_broker_config(
    config_file: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> BrokerConfig:
    """The model from its sources: defaults < ``config_file`` < ``ICEFALL_*`` environment <
    ``overrides`` (property keys) and ``flags`` (field names). Raises ``ConfigError``."""
    layers: dict[str, Any] = {}
    if config_file is not None:
        layers.update(fields_from_properties(read_properties(config_file), str(config_file)))
    try:
        layers.update(EnvSettingsSource(BrokerConfig)())
    except Exception as exc:
        raise ConfigError(f"environment: {exc}") from exc
    if overrides:
        over = fields_from_properties(overrides, "--override")
        for merged_by_key in ("per_listener", "per_listener_secrets", "registry_roles"):
            if merged_by_key in over and merged_by_key in layers:
                over[merged_by_key] = {**layers[merged_by_key], **over[merged_by_key]}
        if "catalog" in over and "catalog" in layers:  # catalog keys merge key by key
            merged = {**layers["catalog"], **over["catalog"]}
            merged["properties"] = {
                **layers["catalog"].get("properties", {}),
                **over["catalog"].get("properties", {}),
            }
            over["catalog"] = merged
        layers.update(over)
    layers.update({k: v for k, v in (flags or {}).items() if v is not None})
    try:
        return BrokerConfig(**layers)
    except ValidationError as exc:
        raise ConfigError(_explain(exc)) from exc


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _secret_field(field: str) -> bool:
    info = BrokerConfig.model_fields.get(field)
    return info is not None and "SecretStr" in str(info.annotation)


def _explain(exc: ValidationError) -> str:
    """pydantic's errors with each field named by its property key."""
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        field = loc[0] if loc else ""
        if field == "catalog" and len(loc) > 1:
            key = CATALOG_PREFIX + ".".join(loc[1:])
        elif field == "object_store":
            key = "object.store"
        elif field == "registry_roles" and len(loc) > 1:
            key = REGISTRY_ROLE_PREFIX + loc[1]
        elif field in BrokerConfig.model_fields:
            key = property_key(field)
        else:
            key = "settings"
        if not field:
            lines.append(f"{error['msg']}")
        elif _secret_field(field):  # a secret is named, never echoed (it reaches logs and CI)
            lines.append(f"{key}: {error['msg']}")
        else:
            lines.append(f"{key}: {error['msg']} (got {error.get('input')!r})")
    return "bad configuration:\n  " + "\n  ".join(lines)


# Database URLs that may carry a password (postgresql://user:password@host/db): with one, they
# travel as secrets do.
URL_FIELDS = ("catalog_uri", "metadata_uri")


def _url_with_password(value: object) -> bool:
    return isinstance(value, str) and bool(urlparse(value).password)


def secret_env(config: BrokerConfig) -> dict[str, str]:
    """The secret settings of ``config`` as ``ICEFALL_*`` variables: how another process
    (``icefall up``'s broker) gets them without a command line showing them (the secret
    listener settings as one JSON object, as pydantic-settings reads a dict field)."""
    out: dict[str, str] = {}
    for name in sorted(SECRET_FIELDS):
        value = getattr(config, name)
        if value is not None:
            out[f"ICEFALL_{name.upper()}"] = value.get_secret_value()
    for name in URL_FIELDS:
        if _url_with_password(value := getattr(config, name)):
            out[f"ICEFALL_{name.upper()}"] = value
    if config.per_listener_secrets:
        secrets = {k: v.get_secret_value() for k, v in config.per_listener_secrets.items()}
        out["ICEFALL_PER_LISTENER_SECRETS"] = json.dumps(secrets)
    return out


def to_overrides(config: BrokerConfig) -> dict[str, str]:
    """Every setting of ``config`` as property keys (credentials stay in the environment, and
    secret settings, database URLs with a password among them, in the config file or
    ``ICEFALL_*`` (``secret_env``): never on a command line), so another
    process (``icefall up``'s broker) gets exactly this model."""
    out: dict[str, str] = {}
    for name in SCALAR_FIELDS:
        value = getattr(config, name)
        if name in SECRET_FIELDS or (name in URL_FIELDS and _url_with_password(value)):
            continue
        if value is not None:
            out[property_key(name)] = str(value).lower() if isinstance(value, bool) else str(value)
    if config.object_store is not None:
        for key, attr in OBJECT_STORE_KEYS.items():
            if (value := getattr(config.object_store, attr)) is not None:
                out[key] = value
    out[CATALOG_PREFIX + "type"] = config.catalog.type
    if config.catalog.uri is not None:
        out[CATALOG_PREFIX + "uri"] = config.catalog.uri
    for key, value in config.catalog.properties.items():
        out[CATALOG_PREFIX + key] = value
    for role, permissions in config.registry_roles.items():
        out[REGISTRY_ROLE_PREFIX + role] = permissions
    for key, value in config.per_listener.items():
        out[LISTENER_PREFIX + key] = value
    return out
