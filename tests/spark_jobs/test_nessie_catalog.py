"""What a Nessie catalog (``automq.table.topic.catalog.type=nessie``) gives the round, checked
on Project Nessie's own server (tests/nessie_server.py) with real Spark and pyiceberg.

A round writes its data to an Iceberg branch of the table (``icefall-round-<id>``) and then
publishes it with one conditional commit that moves ``main`` and the ``icefall-checkpoint`` tag
(spark_jobs/rounds/publish.py). These tests pin down where Nessie can and cannot carry that:

- Iceberg's ``NessieCatalog`` (Spark, ``type=nessie``, ``uri=…/api/v2``) keeps the table's
  Iceberg branches and tags in the metadata files it writes;
- Nessie's Iceberg REST endpoint (``/iceberg/<ref>``, the only way pyiceberg reaches Nessie)
  serves a table as its ``main`` alone: the other refs and the older snapshots are not in the
  metadata it returns, and an append to a branch replaces ``main`` -- a round's data would be
  visible before its publish, and the rows before it would not. So the broker refuses
  ``type=nessie`` until pyiceberg talks to Nessie's own API (docs/reference/nessie.md);
- the REST endpoint does serve multi-table commits (``POST /v1/{prefix}/transactions/commit``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pydantic import ValidationError
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table.update import AssertTableUUID, SetPropertiesUpdate

from broker.config import BrokerConfig
from broker.contracts import CatalogSpec
from spark_jobs.broker_client import http_json
from spark_jobs.commit_round import use_catalog
from tests.conftest import MOTO_CREDENTIALS, MotoS3
from tests.nessie_server import NessieServer

S3_KEYS = {
    "s3.access-key-id": MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"],
    "s3.secret-access-key": MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
}


@pytest.fixture(scope="module")
def nessie(moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NessieServer]:
    bucket = f"nessie-{uuid.uuid4().hex[:12]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    server = NessieServer(tmp_path_factory.mktemp("nessie"), moto_s3, bucket)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def rest_catalog(nessie: NessieServer) -> Catalog:
    """pyiceberg on Nessie's Iceberg REST endpoint: the endpoint, path style and region come
    from Nessie's ``/v1/config``; the keys are the client's own."""
    catalog = load_catalog("nessie", type="rest", uri=nessie.iceberg_uri, **S3_KEYS)
    catalog.create_namespace_if_not_exists("default")
    return catalog


def nessie_spec(nessie: NessieServer, moto_s3: MotoS3) -> CatalogSpec:
    """What the broker's catalog keys would make of ``type=nessie`` for Spark."""
    return CatalogSpec(
        type="nessie",
        uri=nessie.api_uri,
        warehouse=nessie.warehouse,
        properties={
            "ref": "main",
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            "s3.endpoint": moto_s3.endpoint,
            "s3.path-style-access": "true",
            "client.region": MOTO_CREDENTIALS["AWS_REGION"],
            **S3_KEYS,
        },
        builtin=False,
    )


def test_spark_nessie_catalog_keeps_branches_and_tags_rest_shows_main_only(
    spark: Any, nessie: NessieServer, moto_s3: MotoS3
) -> None:
    catalog = use_catalog(spark, nessie_spec(nessie, moto_s3))
    table = f"{catalog}.default.refs_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.default")
    spark.sql(f"CREATE TABLE {table} (x BIGINT) USING iceberg")
    spark.sql(f"INSERT INTO {table} VALUES (1)")
    spark.sql(f"ALTER TABLE {table} CREATE BRANCH `icefall-round-r1`")
    spark.sql(f"INSERT INTO {table}.`branch_icefall-round-r1` VALUES (2)")
    spark.sql(f"ALTER TABLE {table} CREATE TAG `icefall-checkpoint`")

    refs = {row.name for row in spark.sql(f"SELECT name FROM {table}.refs").collect()}
    assert refs == {"main", "icefall-round-r1", "icefall-checkpoint"}
    assert spark.sql(f"SELECT count(*) AS n FROM {table}").collect()[0].n == 1

    seen = rest_catalog(nessie).load_table(table.split(".", 1)[1])
    assert set(seen.metadata.refs) == {"main"}  # the round's branch and the checkpoint tag: gone
    assert len(seen.metadata.snapshots) == 1


def test_nessie_rest_writes_a_branch_append_to_main(nessie: NessieServer) -> None:
    catalog = rest_catalog(nessie)
    table = catalog.create_table(
        f"default.branch_{uuid.uuid4().hex[:8]}", schema=pa.schema([("x", pa.int64())])
    )
    table.append(pa.table({"x": [1, 2]}))
    planned = catalog.load_table(table.name()).metadata.current_snapshot_id
    assert planned is not None
    table = catalog.load_table(table.name())
    table.manage_snapshots().create_branch(planned, "icefall-round-r1").commit()
    assert set(catalog.load_table(table.name()).metadata.refs) == {"main"}

    catalog.load_table(table.name()).append(pa.table({"x": [3]}), branch="icefall-round-r1")
    after = catalog.load_table(table.name())
    # main moved without any publish step, to the branch's snapshot -- built on no parent, since
    # the branch was not there to read: main's earlier rows are no longer in main.
    assert after.metadata.current_snapshot_id != planned
    assert after.scan().to_arrow().column("x").to_pylist() == [3]


def test_nessie_rest_serves_multi_table_commits(nessie: NessieServer) -> None:
    catalog = rest_catalog(nessie)
    schema = pa.schema([("x", pa.int64())])
    names = [f"default.txn_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    tables = [catalog.create_table(name, schema=schema) for name in names]
    changes = [
        {
            "identifier": {"namespace": ["default"], "name": name.split(".")[1]},
            "requirements": [
                AssertTableUUID(uuid=table.metadata.table_uuid).model_dump(
                    by_alias=True, mode="json"
                )
            ],
            "updates": [
                SetPropertiesUpdate(updates={"icefall.round": "r1"}).model_dump(
                    by_alias=True, mode="json"
                )
            ],
        }
        for name, table in zip(names, tables, strict=True)
    ]
    base = nessie.iceberg_uri.rsplit("/", 1)[0]
    http_json(f"{base}/v1/main/transactions/commit", "POST", {"table-changes": changes})
    for name in names:
        assert catalog.load_table(name).properties.get("icefall.round") == "r1"


def test_the_broker_refuses_nessie_and_says_why() -> None:
    with pytest.raises(ValidationError) as refused:
        BrokerConfig(
            catalog={"type": "nessie", "uri": "http://127.0.0.1:19120/api/v2"}  # type: ignore[arg-type]
        )
    message = str(refused.value)
    assert "automq.table.topic.catalog.type=nessie" in message
    assert "branches and tags" in message
