"""DuckDB with the Iceberg extension, offline: the extensions come from the
PyPI wheels ``duckdb-extension-{avro,httpfs,iceberg}`` (pinned to DuckDB's
own version) and are loaded by path, and DuckDB is told never to download.

Avro is loaded before Iceberg (Iceberg's manifests are Avro, and the iceberg
extension fails to initialise without it), httpfs before Iceberg too (the
REST catalog client speaks HTTP through it).
"""

from __future__ import annotations

import importlib
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
        raise FileNotFoundError(f"duckdb-extension-{name} has no {name}.duckdb_extension under {root}")
    return found[-1]


def connect(database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with avro, httpfs and iceberg loaded from the wheels."""
    con = duckdb.connect(database, config={
        "autoinstall_known_extensions": "false",
        "autoload_known_extensions": "false",
    })
    for name in EXTENSIONS:
        con.execute(f"LOAD '{extension_path(name)}'")
    return con


def attach_catalog(con: duckdb.DuckDBPyConnection, uri: str, alias: str = "icefall") -> None:
    """Attach the broker's REST catalog (no authentication) as database ``alias``."""
    con.execute(
        f"ATTACH '' AS {alias} (TYPE iceberg, ENDPOINT '{uri}', AUTHORIZATION_TYPE 'none')"
    )
