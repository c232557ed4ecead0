"""The Iceberg REST catalog (DESIGN.md, "Iceberg catalog"), served by the broker
on :8181 so Spark, pyiceberg, DuckDB and Trino share one set of tables.

Backed by pyiceberg's SQL catalog: SQLite at HOME/catalog.sqlite by default,
any SQLAlchemy URL (Postgres for several brokers) with ``catalog_uri``; tables
live under ``warehouse`` (default file://HOME/warehouse).
"""

from __future__ import annotations

from broker.catalog.api import CatalogApi
from broker.catalog.store import CatalogStore
from broker.config import BrokerConfig

__all__ = ["CatalogApi", "CatalogStore", "open_catalog"]


def open_catalog(config: BrokerConfig) -> CatalogApi:
    """The catalog's HTTP app over its store, ready for ``start(host, port)``."""
    return CatalogApi(CatalogStore(config.catalog_db_uri, config.catalog_warehouse))
