"""Spark 3.5 with the Iceberg 1.10 runtime (from the pinned wheel) on the broker's
catalog, and pyiceberg seeing the same tables. One session for the module:
Spark takes 10-20 s to start."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table.metadata import TableMetadataV3

from spark_jobs.jars import iceberg_jars
from tests.support import BrokerProcess


@pytest.fixture(scope="module")
def spark(catalog_broker: BrokerProcess) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("icefall-catalog-test")
        .config("spark.jars", ",".join(iceberg_jars()))
        .config(
            "spark.sql.extensions",
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .config("spark.sql.catalog.icefall", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.icefall.type", "rest")
        .config("spark.sql.catalog.icefall.uri", catalog_broker.catalog_url)
        .config(
            "spark.sql.catalog.icefall.cache-enabled", "false"
        )  # see other writers' commits at once
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


def test_spark_writes_pyiceberg_reads(spark: Any, rest: Catalog, namespace: str) -> None:
    table = f"icefall.{namespace}.events"
    spark.sql(
        f"CREATE TABLE {table} (id BIGINT, ts TIMESTAMP, msg STRING) USING iceberg PARTITIONED BY (days(ts))"
    )
    spark.sql(
        f"INSERT INTO {table} VALUES (1, TIMESTAMP '2024-01-01 10:00:00', 'a'), "
        f"(2, TIMESTAMP '2024-01-02 10:00:00', 'b')"
    )
    spark.sql(f"ALTER TABLE {table} ADD COLUMN extra STRING")
    spark.sql(f"INSERT INTO {table} VALUES (3, TIMESTAMP '2024-01-03 10:00:00', 'c', 'x')")
    from_spark = {
        r["id"]: (r["msg"], r["extra"]) for r in spark.sql(f"SELECT * FROM {table}").collect()
    }

    loaded = rest.load_table(f"{namespace}.events")
    assert [f.name for f in loaded.schema().fields] == ["id", "ts", "msg", "extra"]
    assert str(loaded.spec().fields[0].transform) == "day"
    from_pyiceberg = {r["id"]: (r["msg"], r["extra"]) for r in loaded.scan().to_arrow().to_pylist()}
    assert from_pyiceberg == from_spark == {1: ("a", None), 2: ("b", None), 3: ("c", "x")}
    assert len(loaded.metadata.snapshots) == 2


def test_pyiceberg_writes_spark_reads_and_ctas(spark: Any, rest: Catalog, namespace: str) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType()),
        NestedField(3, "ts", TimestamptzType()),
    )
    table = rest.create_table(f"{namespace}.people", schema)
    ts = datetime(2024, 5, 1, tzinfo=UTC)
    table.append(
        pa.Table.from_pylist(
            [{"id": i, "name": f"p{i}", "ts": ts} for i in range(5)], schema=schema.as_arrow()
        )
    )
    rows = spark.sql(f"SELECT id, name FROM icefall.{namespace}.people ORDER BY id").collect()
    assert [(r["id"], r["name"]) for r in rows] == [(i, f"p{i}") for i in range(5)]

    # CTAS goes through stage-create and a commit with assert-create
    spark.sql(
        f"CREATE TABLE icefall.{namespace}.evens USING iceberg AS "
        f"SELECT * FROM icefall.{namespace}.people WHERE id % 2 = 0"
    )
    evens = rest.load_table(f"{namespace}.evens")
    assert sorted(evens.scan().to_arrow().column("id").to_pylist()) == [0, 2, 4]

    table.append(
        pa.Table.from_pylist([{"id": 9, "name": "late", "ts": ts}], schema=schema.as_arrow())
    )
    assert spark.sql(f"SELECT count(*) AS n FROM icefall.{namespace}.people").collect()[0]["n"] == 6


def _v3(table: Any) -> TableMetadataV3:
    """The table's metadata, which must be format v3."""
    assert isinstance(table.metadata, TableMetadataV3), table.metadata.format_version
    return table.metadata


MOR = ", ".join(f"'write.{op}.mode'='merge-on-read'" for op in ("delete", "update", "merge"))


def test_format_v3_table_deletion_vectors_read_by_every_engine(
    spark: Any, rest: Catalog, namespace: str, catalog_broker: BrokerProcess
) -> None:
    """A v3 table kept by the catalog: Spark's row-level deletes are deletion vectors (Puffin),
    the catalog advances next-row-id, and pyiceberg and DuckDB read the same rows as Spark."""
    from broker.catalog import duckdb_local

    table = f"icefall.{namespace}.v3t"
    spark.sql(
        f"CREATE TABLE {table} (id BIGINT, v STRING) USING iceberg "
        f"TBLPROPERTIES ('format-version'='3', {MOR})"
    )
    spark.sql(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    spark.sql(f"DELETE FROM {table} WHERE id = 2")
    spark.sql(f"UPDATE {table} SET v = 'x' WHERE id = 3")
    expected = {1: "a", 3: "x", 4: "d"}
    assert {r["id"]: r["v"] for r in spark.sql(f"SELECT * FROM {table}").collect()} == expected
    formats = {
        r["file_format"]
        for r in spark.sql(f"SELECT file_format FROM {table}.delete_files").collect()
    }
    assert formats == {"PUFFIN"}

    loaded = rest.load_table(f"{namespace}.v3t")
    assert _v3(loaded).next_row_id == 5  # 4 inserted + the updated row rewritten
    assert [s.first_row_id for s in loaded.metadata.snapshots] == [0, 4, 4]
    assert {r["id"]: r["v"] for r in loaded.scan().to_arrow().to_pylist()} == expected

    con = duckdb_local.connect()
    duckdb_local.attach_catalog(con, catalog_broker.catalog_url, "lake")
    assert dict(con.execute(f"SELECT id, v FROM lake.{namespace}.v3t").fetchall()) == expected


def test_format_v3_ctas_and_upgrade_from_v2(spark: Any, rest: Catalog, namespace: str) -> None:
    """CTAS stages the create and commits an upgrade-format-version to 3 with assert-create;
    ALTER TABLE ... SET TBLPROPERTIES ('format-version'='3') upgrades a v2 table in place."""
    spark.sql(f"CREATE TABLE icefall.{namespace}.src (id BIGINT) USING iceberg")
    spark.sql(f"INSERT INTO icefall.{namespace}.src VALUES (1), (2), (3)")
    spark.sql(
        f"CREATE TABLE icefall.{namespace}.copy USING iceberg TBLPROPERTIES ('format-version'='3') AS "
        f"SELECT * FROM icefall.{namespace}.src"
    )
    copy = rest.load_table(f"{namespace}.copy")
    assert _v3(copy).next_row_id == 3

    spark.sql(
        f"ALTER TABLE icefall.{namespace}.src SET TBLPROPERTIES ('format-version'='3', {MOR})"
    )
    upgraded = rest.load_table(f"{namespace}.src")
    assert _v3(upgraded).next_row_id == 0
    spark.sql(f"DELETE FROM icefall.{namespace}.src WHERE id = 1")
    spark.sql(f"INSERT INTO icefall.{namespace}.src VALUES (4)")
    assert sorted(
        r["id"] for r in spark.sql(f"SELECT id FROM icefall.{namespace}.src").collect()
    ) == [2, 3, 4]
    assert sorted(
        rest.load_table(f"{namespace}.src").scan().to_arrow().column("id").to_pylist()
    ) == [2, 3, 4]


def test_spark_views(spark: Any, rest: Catalog, namespace: str) -> None:
    """Iceberg's Java REST client through Spark SQL: CREATE VIEW (a CreateViewRequest),
    CREATE OR REPLACE VIEW (a view commit: add-schema, add-view-version,
    set-current-view-version), SHOW VIEWS, DROP VIEW; pyiceberg sees the same view."""
    table, view = f"icefall.{namespace}.base", f"icefall.{namespace}.big"
    spark.sql(f"CREATE TABLE {table} (id BIGINT, name STRING) USING iceberg")
    spark.sql(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"CREATE VIEW {view} AS SELECT id FROM {table} WHERE id > 1")
    assert [r["id"] for r in spark.sql(f"SELECT * FROM {view}").collect()] == [2]

    spark.sql(f"CREATE OR REPLACE VIEW {view} AS SELECT id, name FROM {table}")
    rows = sorted((r["id"], r["name"]) for r in spark.sql(f"SELECT * FROM {view}").collect())
    assert rows == [(1, "a"), (2, "b")]
    loaded = rest.load_view((namespace, "big"))
    assert loaded.metadata.current_version_id == 2
    assert [s.schema_id for s in loaded.metadata.schemas] == [0, 1]
    assert "name" in loaded.metadata.versions[-1].representations[0].root.sql
    assert [r["viewName"] for r in spark.sql(f"SHOW VIEWS IN icefall.{namespace}").collect()] == [
        "big"
    ]

    spark.sql(f"DROP VIEW {view}")
    assert not rest.view_exists((namespace, "big"))
    assert rest.table_exists((namespace, "base"))
