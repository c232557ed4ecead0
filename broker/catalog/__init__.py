"""The Iceberg REST catalog (DESIGN.md, "Iceberg catalog"), served by the broker
on :8181 so Spark, pyiceberg, DuckDB and Trino share one set of tables.

Backed by pyiceberg's SQL catalog: SQLite at HOME/catalog.sqlite by default,
any SQLAlchemy URL (Postgres for several brokers) with ``catalog_uri``; tables
live under ``warehouse`` (default file://HOME/warehouse).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.config import BrokerConfig, aws_io_credentials, object_store_from_env

if TYPE_CHECKING:
    from broker.catalog.api import CatalogApi
    from broker.catalog.store import CatalogStore

__all__ = ["CatalogApi", "CatalogStore", "open_catalog"]


def __getattr__(name: str) -> Any:
    """The server's classes, imported on first use: a commit round imports this package's
    client-side modules (``glue_check``), and the HTTP app with its store (aiohttp, pyiceberg's
    SQL catalog: 1.4 s of a round's 1.9 s of imports) is the broker's alone."""
    if name == "CatalogApi":
        from broker.catalog.api import CatalogApi

        return CatalogApi
    if name == "CatalogStore":
        from broker.catalog.store import CatalogStore

        return CatalogStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DEFAULT_REGION = "us-east-1"  # what S3-compatible servers (MinIO, moto) accept when none is set


def client_io_properties(config: BrokerConfig) -> dict[str, str]:
    """What a catalog client needs to reach an ``s3://`` warehouse's files, served as the REST
    catalog's ``/v1/config`` defaults and every load-table ``config``: the endpoint (MinIO, moto,
    any S3-compatible server; AWS needs none), path-style access with a custom endpoint, the
    region. ``automq.table.topic.catalog.<property>`` settings win over what the broker's own
    ``AWS_*`` environment says. Credentials are not here: see ``vended_credentials``."""
    warehouse = config.catalog_warehouse
    if not warehouse.startswith("s3"):
        return {}
    store = object_store_from_env(warehouse)
    region = store.region or DEFAULT_REGION
    found = {
        "s3.endpoint": store.endpoint_url,
        "s3.path-style-access": "true" if store.endpoint_url else None,
        "s3.region": region,
        "client.region": region,
    }
    given = {k: v for k, v in config.catalog.properties.items() if k.startswith(("s3.", "client."))}
    return {**{k: v for k, v in found.items() if v}, **given}


def vended_credentials(config: BrokerConfig) -> dict[str, str]:
    """The broker's own AWS credentials for load-table ``config``: only with
    ``catalog.vended.credentials=true`` (never by default: any client of the catalog gets them)."""
    if not config.catalog_vended_credentials or not config.catalog_warehouse.startswith("s3"):
        return {}
    return aws_io_credentials()


def open_catalog(config: BrokerConfig) -> CatalogApi:
    """The catalog's HTTP app over its store, ready for ``start(host, port)``. The store writes
    metadata files with the client settings plus this process's credentials."""
    client = client_io_properties(config)
    store_io = {**client, **aws_io_credentials()} if client else {}
    if file_io := config.catalog.properties.get("py-io-impl"):  # else Icefall's (contracts)
        store_io["py-io-impl"] = file_io
    from broker.catalog.api import CatalogApi
    from broker.catalog.store import CatalogStore

    store = CatalogStore(config.catalog_db_uri, config.catalog_warehouse, store_io)
    from broker.http_security import setup

    api = CatalogApi(
        store,
        client_config=client,
        table_config={**client, **vended_credentials(config)},
        auth=setup.catalog_auth(config),
    )
    api.ssl_context = setup.catalog_tls(config)
    return api
