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

from spark_jobs.jars import iceberg_jars
from tests.support import BrokerProcess


@pytest.fixture(scope="module")
def spark(catalog_broker: BrokerProcess) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]").appName("icefall-catalog-test")
        .config("spark.jars", ",".join(iceberg_jars()))
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.catalog.icefall", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.icefall.type", "rest")
        .config("spark.sql.catalog.icefall.uri", catalog_broker.catalog_url)
        .config("spark.sql.catalog.icefall.cache-enabled", "false")  # see other writers' commits at once
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
    spark.sql(f"CREATE TABLE {table} (id BIGINT, ts TIMESTAMP, msg STRING) USING iceberg PARTITIONED BY (days(ts))")
    spark.sql(f"INSERT INTO {table} VALUES (1, TIMESTAMP '2024-01-01 10:00:00', 'a'), "
              f"(2, TIMESTAMP '2024-01-02 10:00:00', 'b')")
    spark.sql(f"ALTER TABLE {table} ADD COLUMN extra STRING")
    spark.sql(f"INSERT INTO {table} VALUES (3, TIMESTAMP '2024-01-03 10:00:00', 'c', 'x')")
    from_spark = {r["id"]: (r["msg"], r["extra"]) for r in spark.sql(f"SELECT * FROM {table}").collect()}

    loaded = rest.load_table(f"{namespace}.events")
    assert [f.name for f in loaded.schema().fields] == ["id", "ts", "msg", "extra"]
    assert str(loaded.spec().fields[0].transform) == "day"
    from_pyiceberg = {r["id"]: (r["msg"], r["extra"]) for r in loaded.scan().to_arrow().to_pylist()}
    assert from_pyiceberg == from_spark == {1: ("a", None), 2: ("b", None), 3: ("c", "x")}
    assert len(loaded.metadata.snapshots) == 2


def test_pyiceberg_writes_spark_reads_and_ctas(spark: Any, rest: Catalog, namespace: str) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()),
                    NestedField(3, "ts", TimestamptzType()))
    table = rest.create_table(f"{namespace}.people", schema)
    ts = datetime(2024, 5, 1, tzinfo=UTC)
    table.append(pa.Table.from_pylist([{"id": i, "name": f"p{i}", "ts": ts} for i in range(5)],
                                      schema=schema.as_arrow()))
    rows = spark.sql(f"SELECT id, name FROM icefall.{namespace}.people ORDER BY id").collect()
    assert [(r["id"], r["name"]) for r in rows] == [(i, f"p{i}") for i in range(5)]

    # CTAS goes through stage-create and a commit with assert-create
    spark.sql(f"CREATE TABLE icefall.{namespace}.evens USING iceberg AS "
              f"SELECT * FROM icefall.{namespace}.people WHERE id % 2 = 0")
    evens = rest.load_table(f"{namespace}.evens")
    assert sorted(evens.scan().to_arrow().column("id").to_pylist()) == [0, 2, 4]

    table.append(pa.Table.from_pylist([{"id": 9, "name": "late", "ts": ts}], schema=schema.as_arrow()))
    assert spark.sql(f"SELECT count(*) AS n FROM icefall.{namespace}.people").collect()[0]["n"] == 6
