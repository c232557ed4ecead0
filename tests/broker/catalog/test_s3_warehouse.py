"""The catalog with its warehouse on S3 (moto's server): the catalog writes table
metadata there with the broker's AWS_* settings, and a pyiceberg client writes and
reads data files there. A commit costs the catalog one request on S3 (the new metadata
file's PUT) and a load none: it reads no metadata file it wrote."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from tests.conftest import MotoS3


def s3_catalog(broker_factory: Any, moto_s3: MotoS3, bucket: str, *extra: str) -> Catalog:
    """A pyiceberg client of a broker whose warehouse is in ``bucket`` (``extra``: its flags)."""
    args = ["--warehouse", f"s3://{bucket}/warehouse", *extra]
    broker = broker_factory(args, moto_s3.env(), name="s3wh")
    return load_catalog(
        "s3",
        type="rest",
        uri=broker.catalog_url,
        **{
            "s3.endpoint": moto_s3.endpoint,
            "s3.region": "us-east-1",
            "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing",
        },
    )


def events_table(client: Catalog) -> Table:
    client.create_namespace("lake")
    return client.create_table("lake.events", pa.schema([pa.field("id", pa.int64())]))


def test_tables_live_in_an_s3_warehouse(
    broker_factory: Any, moto_s3: MotoS3, s3_bucket: str
) -> None:
    client = s3_catalog(broker_factory, moto_s3, s3_bucket)
    table = events_table(client)
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    assert table.metadata_location.startswith(f"s3://{s3_bucket}/warehouse/")
    assert sorted(client.load_table("lake.events").scan().to_arrow().column("id").to_pylist()) == [
        1,
        2,
        3,
    ]
    keys = [o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert any(k.endswith(".metadata.json") for k in keys) and any(
        k.endswith(".parquet") for k in keys
    )


def test_a_commit_is_one_put_of_metadata_and_a_load_reads_none(
    broker_factory: Any, moto_s3: MotoS3, s3_bucket: str
) -> None:
    client = s3_catalog(broker_factory, moto_s3, s3_bucket)
    table = events_table(client)
    for i in range(3):
        table.append(pa.table({"id": pa.array([i], pa.int64())}))
    for _ in range(3):
        assert len(client.load_table("lake.events").metadata.snapshots) == 3

    on_metadata = [r for r in moto_s3.requests_seen(s3_bucket) if ".metadata.json" in r]
    # the create and three commits: a PUT each, no existence check (HEAD, LIST), no multipart
    # upload, and no read of a metadata file by the catalog that wrote it
    assert len(on_metadata) == 4, on_metadata
    assert all(r.startswith("PUT ") and "?" not in r for r in on_metadata), on_metadata


def test_a_file_io_named_in_the_settings_is_the_catalogs(
    broker_factory: Any, moto_s3: MotoS3, s3_bucket: str
) -> None:
    """pyiceberg's own FileIO, named: its multipart upload per metadata file is back."""
    own = "automq.table.topic.catalog.py-io-impl=pyiceberg.io.pyarrow.PyArrowFileIO"
    events_table(s3_catalog(broker_factory, moto_s3, s3_bucket, "--override", own))
    on_metadata = [r for r in moto_s3.requests_seen(s3_bucket) if ".metadata.json" in r]
    assert any(r.endswith("?uploads") for r in on_metadata), on_metadata
