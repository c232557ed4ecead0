"""The one configuration model shared by the broker, the DAGs and the Spark jobs.

Values come from (lowest to highest precedence) defaults, ``ICEFALL_*``
environment variables and command-line flags, so a DAG or a Spark job started
by Airflow sees the same settings as the broker that ``icefall up`` started.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ObjectStoreConfig(BaseModel):
    """Where segment objects live: a local directory or ``s3://bucket/prefix``."""

    model_config = ConfigDict(frozen=True)

    url: str
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        scheme = urlparse(value).scheme
        if scheme not in ("", "file", "s3"):
            raise ValueError(f"object store must be a directory, file:// or s3:// URL, got {value!r}")
        if scheme == "s3" and not urlparse(value).netloc:
            raise ValueError(f"s3 object store URL needs a bucket: {value!r}")
        return value

    @property
    def is_s3(self) -> bool:
        return urlparse(self.url).scheme == "s3"


class BrokerConfig(BaseModel):
    """Settings of one broker process (Kafka listener, registry, catalog, admin API)."""

    model_config = ConfigDict(frozen=True)

    home: Path = Field(default_factory=lambda: Path(os.environ.get("ICEFALL_HOME", ".icefall")))
    host: str = "127.0.0.1"
    advertised_host: str | None = None
    kafka_port: int = 9092
    registry_port: int = 8081
    catalog_port: int = 8181
    admin_port: int = 8090
    node_id: int = 0
    cluster_id: str = "icefall-local-cluster"
    object_store: ObjectStoreConfig | None = None
    segment_flush_ms: int = Field(default=1000, ge=1)
    segment_flush_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    wal_fsync: bool = True
    # Acknowledged bytes not yet in the object store (held in memory and the WAL) above
    # which produces wait for a flush, then fail with KAFKA_STORAGE_ERROR (retriable):
    # an object store outage slows producers instead of growing memory without end.
    # Default: max(256 MiB, 8 x segment_flush_bytes).
    max_unflushed_bytes: int | None = Field(default=None, ge=1024)
    max_request_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    default_partitions: int = Field(default=1, ge=1)
    auto_create_topics: bool = False
    group_initial_rebalance_delay_ms: int = Field(default=300, ge=0)
    # how often segment retention runs (Kafka's log.retention.check.interval.ms, same default)
    retention_check_interval_ms: int = Field(default=300_000, ge=1)
    catalog_uri: str | None = None  # SQLAlchemy URL of the catalog database; default SQLite HOME/catalog.sqlite
    # The broker's own metadata (topics, segment index, group offsets): postgresql://user:pw@host/db,
    # default SQLite HOME/metadata.sqlite. One broker per database (broker/metadata.py).
    metadata_uri: str | None = None

    @field_validator("metadata_uri")
    @classmethod
    def _postgres_uri(cls, value: str | None) -> str | None:
        if value is not None and value.split(":", 1)[0] not in ("postgresql", "postgres"):
            raise ValueError(f"metadata URI must be postgresql://user:password@host:port/database, got {value!r} "
                             "(leave it unset for SQLite in HOME/metadata.sqlite)")
        return value
    warehouse: str | None = None  # where table data and metadata live; default file://HOME/warehouse

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
    def wal_dir(self) -> Path:
        return self.home / "wal"

    @property
    def manifest_path(self) -> Path:
        return self.home / "table_topics.json"

    @property
    def admin_url(self) -> str:
        return f"http://{self.advertised}:{self.admin_port}"

    @property
    def catalog_db_uri(self) -> str:
        return self.catalog_uri or f"sqlite:///{(self.home / 'catalog.sqlite').resolve()}"

    @property
    def catalog_warehouse(self) -> str:
        warehouse = self.warehouse or str(self.home / "warehouse")
        if not urlparse(warehouse).scheme:  # a plain directory
            warehouse = Path(warehouse).resolve().as_uri()
        return warehouse.rstrip("/")

    @property
    def catalog_url(self) -> str:
        return f"http://{self.advertised}:{self.catalog_port}"

    @property
    def registry_url(self) -> str:
        return f"http://{self.advertised}:{self.registry_port}"


def object_store_from_env(url: str, default_endpoint_url: str | None = None) -> ObjectStoreConfig:
    """Build the object store settings from a URL plus the usual AWS variables (the endpoint
    variables win over ``default_endpoint_url``, e.g. the one the broker's /v1/cluster names)."""
    return ObjectStoreConfig(
        url=url,
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        or default_endpoint_url,
        region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
        access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
    )
