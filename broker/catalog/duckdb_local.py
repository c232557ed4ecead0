"""DuckDB with the Iceberg extension, offline: the extensions come from the
PyPI wheels ``duckdb-extension-{avro,httpfs,iceberg}`` (pinned to DuckDB's
own version) and are loaded by path, and DuckDB is told never to download.

Avro is loaded before Iceberg (Iceberg's manifests are Avro, and the iceberg
extension fails to initialise without it), httpfs before Iceberg too (the
REST catalog client speaks HTTP through it).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import duckdb

EXTENSIONS = ("avro", "httpfs", "iceberg")  # load order matters


def extension_path(name: str) -> Path:
    """The ``.duckdb_extension`` file shipped by the ``duckdb-extension-<name>`` wheel."""
    package = importlib.import_module(f"duckdb_extension_{name}")
    root = Path(package.__path__[0]) / "extensions"
    wanted = root / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if wanted.is_file():
        return wanted
    found = sorted(root.glob(f"*/{name}.duckdb_extension"))
    if not found:
        raise FileNotFoundError(
            f"duckdb-extension-{name} has no {name}.duckdb_extension under {root}"
        )
    return found[-1]


def connect(database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with avro, httpfs and iceberg loaded from the wheels."""
    con = duckdb.connect(
        database,
        config={
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
        },
    )
    for name in EXTENSIONS:
        con.execute(f"LOAD '{extension_path(name)}'")
    return con


def attach_catalog(con: duckdb.DuckDBPyConnection, uri: str, alias: str = "icefall") -> None:
    """Attach the broker's REST catalog (no authentication) as database ``alias``. With
    ``AWS_*`` credentials in the environment they become DuckDB's S3 secret first, so a
    warehouse on S3 reads too (the catalog hands DuckDB the endpoint and region)."""
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        create_s3_secret(con)
    con.execute(f"ATTACH '' AS {alias} (TYPE iceberg, ENDPOINT '{uri}', AUTHORIZATION_TYPE 'none')")


def create_s3_secret(con: duckdb.DuckDBPyConnection, name: str = "icefall_s3") -> None:
    """A DuckDB S3 secret from this process's ``AWS_*`` credentials (the user's own, as for any
    S3 reader); the endpoint, path style and region of an S3 warehouse come from the catalog."""
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        raise ValueError(
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are needed to read an S3 warehouse"
        )
    parts = [f"KEY_ID '{key}'", f"SECRET '{secret}'"]
    if token := os.environ.get("AWS_SESSION_TOKEN"):
        parts.append(f"SESSION_TOKEN '{token}'")
    con.execute(f"CREATE OR REPLACE SECRET {name} (TYPE s3, {', '.join(parts)})")
