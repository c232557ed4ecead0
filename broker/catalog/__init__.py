"""The Iceberg REST catalog (DESIGN.md, "Iceberg catalog"), served by the broker
on :8181 so Spark, pyiceberg, DuckDB and Trino share one set of tables.

Backed by pyiceberg's SQL catalog: SQLite at HOME/catalog.sqlite by default,
any SQLAlchemy URL (Postgres for several brokers) with ``catalog_uri``; tables
live under ``warehouse`` (default file://HOME/warehouse).
"""

from __future__ import annotations

from broker.catalog.api import CatalogApi
from broker.catalog.store import CatalogStore
from broker.config import BrokerConfig, object_store_from_env

__all__ = ["CatalogApi", "CatalogStore", "open_catalog"]


def s3_io_properties(warehouse: str) -> dict[str, str]:
    """pyiceberg FileIO settings for an ``s3://`` warehouse from the usual AWS variables:
    pyiceberg does not read ``AWS_ENDPOINT_URL`` itself, so MinIO/moto need it passed."""
    if not warehouse.startswith("s3"):
        return {}
    store = object_store_from_env(warehouse)
    pairs = (("s3.endpoint", store.endpoint_url), ("s3.region", store.region),
             ("s3.access-key-id", store.access_key_id), ("s3.secret-access-key", store.secret_access_key))
    return {key: value for key, value in pairs if value}


def open_catalog(config: BrokerConfig) -> CatalogApi:
    """The catalog's HTTP app over its store, ready for ``start(host, port)``."""
    warehouse = config.catalog_warehouse
    return CatalogApi(CatalogStore(config.catalog_db_uri, warehouse, s3_io_properties(warehouse)))
