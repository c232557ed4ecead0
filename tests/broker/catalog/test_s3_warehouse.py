"""The catalog with its warehouse on S3 (moto's server): the catalog writes table
metadata there with the broker's AWS_* settings, and a pyiceberg client writes and
reads data files there."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.catalog import load_catalog

from tests.conftest import MotoS3


def test_tables_live_in_an_s3_warehouse(
    broker_factory: Any, moto_s3: MotoS3, s3_bucket: str
) -> None:
    broker = broker_factory(
        ["--warehouse", f"s3://{s3_bucket}/warehouse"], moto_s3.env(), name="s3wh"
    )
    client = load_catalog(
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
    client.create_namespace("lake")
    table = client.create_table("lake.events", pa.schema([pa.field("id", pa.int64())]))
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
