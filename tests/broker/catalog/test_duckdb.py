"""DuckDB 1.5 offline: extensions loaded from the PyPI wheels, tables read by
metadata file and through the REST catalog, and written through it too."""

from __future__ import annotations

from datetime import UTC, datetime

import duckdb
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from broker.catalog import duckdb_local
from tests.support import BrokerProcess

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "ts", TimestamptzType()),
)


def _table_with_rows(rest: Catalog, ident: str, n: int) -> str:
    table = rest.create_table(ident, SCHEMA)
    ts = datetime(2024, 1, 1, tzinfo=UTC)
    table.append(
        pa.Table.from_pylist(
            [{"id": i, "name": f"n{i}", "ts": ts} for i in range(n)], schema=SCHEMA.as_arrow()
        )
    )
    location: str = rest.load_table(ident).metadata_location
    return location


def test_extensions_load_from_the_wheels_without_downloading() -> None:
    con = duckdb_local.connect()
    loaded = dict(
        con.execute(
            "SELECT extension_name, install_path FROM duckdb_extensions() WHERE loaded"
        ).fetchall()
    )
    assert {"avro", "httpfs", "iceberg"} <= loaded.keys()
    settings = dict(
        con.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN "
            "('autoinstall_known_extensions', 'autoload_known_extensions')"
        ).fetchall()
    )
    assert settings == {
        "autoinstall_known_extensions": "false",
        "autoload_known_extensions": "false",
    }
    for name in duckdb_local.EXTENSIONS:
        assert duckdb_local.extension_path(name).is_file()


def test_iceberg_scan_reads_a_metadata_file(rest: Catalog, namespace: str) -> None:
    location = _table_with_rows(rest, f"{namespace}.scanned", 4)
    con = duckdb_local.connect()
    rows = con.execute(f"SELECT id, name FROM iceberg_scan('{location}') ORDER BY id").fetchall()
    assert rows == [(i, f"n{i}") for i in range(4)]


@pytest.fixture
def attached(catalog_broker: BrokerProcess) -> duckdb.DuckDBPyConnection:
    con = duckdb_local.connect()
    duckdb_local.attach_catalog(con, catalog_broker.catalog_url, "lake")
    return con


def test_attach_reads_and_writes_through_the_catalog(
    attached: duckdb.DuckDBPyConnection, rest: Catalog, namespace: str
) -> None:
    con = attached
    _table_with_rows(rest, f"{namespace}.people", 3)
    assert con.execute(f"SELECT count(*) FROM lake.{namespace}.people").fetchone() == (3,)

    con.execute(f"CREATE TABLE lake.{namespace}.made_by_duckdb (id INTEGER, s VARCHAR)")
    con.execute(f"INSERT INTO lake.{namespace}.made_by_duckdb VALUES (1, 'x'), (2, 'y')")
    made = rest.load_table(f"{namespace}.made_by_duckdb")
    assert sorted(made.scan().to_arrow().column("s").to_pylist()) == ["x", "y"]


def test_duckdb_transaction_over_two_tables_commits_both(
    attached: duckdb.DuckDBPyConnection, rest: Catalog, namespace: str
) -> None:
    con = attached
    for name in ("left_t", "right_t"):
        con.execute(f"CREATE TABLE lake.{namespace}.{name} (id INTEGER)")
    con.execute("BEGIN")
    con.execute(f"INSERT INTO lake.{namespace}.left_t VALUES (1)")
    con.execute(f"INSERT INTO lake.{namespace}.right_t VALUES (2), (3)")
    con.execute("COMMIT")  # DuckDB sends both tables in one POST /v1/transactions/commit
    assert len(rest.load_table(f"{namespace}.left_t").scan().to_arrow()) == 1
    assert len(rest.load_table(f"{namespace}.right_t").scan().to_arrow()) == 2
