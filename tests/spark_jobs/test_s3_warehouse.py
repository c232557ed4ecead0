"""Tables on S3: the object store and the warehouse in a bucket of moto's S3 server
(path-style, custom endpoint, as MinIO), and the same table read by Spark SQL, pyiceberg and
DuckDB with nothing set but credentials: the catalog hands its clients the endpoint, path
style and region (``/v1/config`` and the load-table ``config``).

This module's ``round_broker`` is that S3 broker, so the round, DLQ and maintenance tests
imported below run here again, unchanged, on S3: every write path (pyiceberg appends, Spark
appends, MERGE with position deletes and deletion vectors, JSON inference, DLQ reprocess,
compaction, expiry, manifests) against the same assertions as on local files."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker.catalog import duckdb_local
from spark_jobs import commit_round
from spark_jobs.broker_client import http_json
from tests.conftest import MotoS3, set_moto_credentials_only, start_s3_broker
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    new_topic,
    run_round,
    table,
    table_offsets,
)
from tests.spark_jobs.test_commit_round import clicks
from tests.spark_jobs.test_maintenance import (  # noqa: F401 -- collected here, on S3
    test_compaction_then_expiry_keeps_rows_and_the_checkpoint,
)
from tests.spark_jobs.test_round_dlq import (  # noqa: F401
    test_invalid_data_goes_to_the_dlq_in_the_same_commit,
    test_reprocess_moves_records_whose_schema_was_registered_late,
)
from tests.spark_jobs.test_round_json import (  # noqa: F401
    test_json_columns_are_inferred_then_evolved_and_bad_values_go_to_the_dlq,
)
from tests.spark_jobs.test_round_upsert import (  # noqa: F401
    test_cdc_field_deletes_on_d_and_upserts_on_i_and_u,
    test_upsert_rounds_on_a_v3_table_write_deletion_vectors,
)
from tests.support import BrokerProcess, wait_for

HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def s3_credentials() -> Iterator[None]:
    """Only the credentials in this process's environment (no endpoint): the rest comes from the catalog."""
    with pytest.MonkeyPatch.context() as mp:
        set_moto_credentials_only(mp)
        yield


@pytest.fixture(scope="module")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    """This module's own moto server, with a clock the orphan test can set back."""
    folder = tmp_path_factory.mktemp("moto-clock")
    server = MotoS3(folder / "moto.log", clock_file=folder / "clock")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3_broker(
    moto_s3: MotoS3, s3_credentials: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BrokerProcess, str]]:
    broker, bucket = start_s3_broker(
        moto_s3,
        tmp_path_factory.mktemp("s3rounds") / "home",
        ["--segment-flush-ms", "100", "--retention-check-interval-ms", "300"],
    )
    try:
        yield broker, bucket
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def round_broker(s3_broker: tuple[BrokerProcess, str]) -> BrokerProcess:
    """The imported tests' broker: the one with its segments and tables on S3."""
    return s3_broker[0]


def put_days_ago(moto_s3: MotoS3, bucket: str, key: str, days: int) -> None:
    """An object whose LastModified is ``days`` ago (the server's clock is set back, then restored)."""
    moto_s3.set_clock(f"-{days}d")
    try:
        moto_s3.client().put_object(Bucket=bucket, Key=key, Body=b"not referenced by any snapshot")
    finally:
        moto_s3.set_clock("+0")
    age = datetime.now(UTC) - moto_s3.client().head_object(Bucket=bucket, Key=key)["LastModified"]
    assert abs(age - timedelta(days=days)) < timedelta(minutes=5), age


def s3_keys(moto_s3: MotoS3, bucket: str, prefix: str) -> list[str]:
    pages = moto_s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_the_catalog_tells_clients_how_to_reach_s3(
    s3_broker: tuple[BrokerProcess, str], moto_s3: MotoS3
) -> None:
    broker, _ = s3_broker
    defaults = http_json(broker.catalog_url + "/v1/config")["defaults"]
    assert defaults["s3.endpoint"] == moto_s3.endpoint
    assert defaults["s3.path-style-access"] == "true"
    assert defaults["s3.region"] == defaults["client.region"] == "us-east-1"
    assert "s3.secret-access-key" not in defaults and "s3.access-key-id" not in defaults


def test_rounds_on_s3_read_by_spark_pyiceberg_and_duckdb(
    spark: Any, s3_broker: tuple[BrokerProcess, str], moto_s3: MotoS3
) -> None:
    broker, bucket = s3_broker
    topic = new_topic(broker, partitions=2)
    producer = AvroProducer(broker, topic, CLICK_V1)
    producer.send(clicks(0, 120))
    assert run_round(spark, broker, topic).status == "committed"
    producer.send(clicks(120, 30))
    assert (
        run_round(spark, broker, topic, "--in-driver-max-bytes", str(64 << 20)).status
        == "committed"
    )
    assert table_offsets(broker, topic) == sorted(producer.acked)

    loaded = table(broker, topic)
    assert loaded.metadata_location.startswith(f"s3://{bucket}/warehouse/")
    data_keys = [k for k in s3_keys(moto_s3, bucket, "warehouse/") if k.endswith(".parquet")]
    assert data_keys, "the round wrote no data file to S3"
    # every file of these small rounds (data, manifests, metadata) went up in one PUT, and the
    # catalog never read back a metadata file it wrote (broker.iceberg_fileio, metadata_cache)
    table_path = f"/{loaded.location().removeprefix('s3://')}/"
    on_table = [r for r in moto_s3.requests_seen(bucket) if table_path in r]
    assert on_table
    assert not [r for r in on_table if "?uploads" in r or "uploadId=" in r], on_table
    assert all(r.startswith("PUT ") for r in on_table if ".metadata.json" in r), on_table

    name = commit_round.use_catalog(spark, broker.catalog_url)
    from_spark = sorted(
        r["id"] for r in spark.sql(f"SELECT id FROM {name}.default.{topic}").collect()
    )
    from_pyiceberg = sorted(
        r["id"] for r in loaded.scan(selected_fields=("id",)).to_arrow().to_pylist()
    )
    con = duckdb_local.connect()
    duckdb_local.create_s3_secret(con)
    duckdb_local.attach_catalog(con, broker.catalog_url, "lake")
    from_duckdb = sorted(r[0] for r in con.sql(f"SELECT id FROM lake.default.{topic}").fetchall())
    assert from_spark == from_pyiceberg == from_duckdb == list(range(150))


def test_expiry_and_orphan_removal_delete_objects_from_s3(
    spark: Any, s3_broker: tuple[BrokerProcess, str], moto_s3: MotoS3
) -> None:
    """What expiry and orphan removal delete is gone from the bucket; what a snapshot still
    references, and strays younger than the threshold, stay."""
    from spark_jobs import maintenance

    broker, bucket = s3_broker
    topic = new_topic(broker, partitions=1)
    producer = AvroProducer(broker, topic, CLICK_V1)
    for i in range(3):
        producer.send(clicks(i * 10, 10))
        assert run_round(spark, broker, topic).status == "committed"
    prefix = table(broker, topic).location().removeprefix(f"s3://{bucket}/") + "/data/"
    small_files = set(s3_keys(moto_s3, bucket, prefix))
    assert len(small_files) == 3

    def maintain(*extra: str) -> Any:
        code, out = maintenance.run(
            ["--admin-url", broker.admin_url, "--topic", topic, *extra], spark
        )
        assert code == 0 and out.result is not None, out.message
        return out.result

    assert (
        maintain("--actions", "compact", "--min-input-files", "2").actions["compact"][
            "rewritten_data_files"
        ]
        == 3
    )
    producer.send(clicks(30, 5))  # the checkpoint tag moves past the compacted-away files
    assert run_round(spark, broker, topic).status == "committed"
    future_ms = int(time.time() * 1000) + 2 * HOUR_MS
    expired = maintain("--actions", "expire", "--now-ms", str(future_ms)).actions["expire"]
    assert expired["deleted_data_files"] == 3, expired
    left = set(s3_keys(moto_s3, bucket, prefix))
    assert not small_files & left, "expiry left the compacted-away data files in the bucket"
    referenced = {
        p.removeprefix(f"s3://{bucket}/")
        for p in table(broker, topic).inspect.files().column("file_path").to_pylist()
    }
    assert referenced <= left

    old, young = prefix + "stray-old.parquet", prefix + "stray-young.parquet"
    put_days_ago(moto_s3, bucket, old, 4)
    moto_s3.client().put_object(Bucket=bucket, Key=young, Body=b"not referenced, written just now")
    orphans = maintain("--actions", "orphans").actions[
        "orphans"
    ]  # S3 Tables' default: older than 3 days
    assert orphans["removed"] == 1 and orphans["paths"][0].endswith("stray-old.parquet"), orphans
    after = set(s3_keys(moto_s3, bucket, prefix))
    assert old not in after and young in after and referenced <= after
    assert len(table(broker, topic).scan().to_arrow()) == 35


def test_retention_deletes_committed_segments_from_s3(
    spark: Any, s3_broker: tuple[BrokerProcess, str], moto_s3: MotoS3
) -> None:
    """Segment objects on S3 go once the table has committed their offsets, not before."""
    broker, bucket = s3_broker
    topic = new_topic(
        broker, partitions=1, configs={"retention.ms": "0", "file.delete.delay.ms": "0"}
    )
    # the schema's _schemas record first, in a segment of its own: the topic's segments then hold only the topic
    http_json(
        f"{broker.registry_url}/subjects/{topic}-value/versions",
        "POST",
        {"schema": json.dumps(CLICK_V1)},
    )
    broker.admin("/v1/flush", "POST")
    before = set(s3_keys(moto_s3, bucket, "segments/"))
    producer = AvroProducer(broker, topic, CLICK_V1)
    producer.send(clicks(0, 20))
    broker.admin("/v1/flush", "POST")
    written = set(s3_keys(moto_s3, bucket, "segments/")) - before
    assert written, "no segment object in the bucket"

    def log_start() -> int:
        return int(broker.admin(f"/v1/topics/{topic}/offsets")["partitions"][0]["log_start_offset"])

    assert log_start() == 0 and written <= set(
        s3_keys(moto_s3, bucket, "segments/")
    )  # nothing committed yet
    assert run_round(spark, broker, topic).status == "committed"
    wait_for(
        lambda: log_start() == 20,
        30,
        what="retention to move the log start past the committed offsets",
    )
    wait_for(
        lambda: not written & set(s3_keys(moto_s3, bucket, "segments/")),
        30,
        what="the committed segment objects to be deleted from the bucket",
    )
    assert table_offsets(broker, topic) == sorted(producer.acked)


def test_credentials_are_vended_only_when_the_broker_says_so(
    s3_broker: tuple[BrokerProcess, str], moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory
) -> None:
    broker, bucket = s3_broker
    topic = f"vend_{uuid.uuid4().hex[:8]}"
    path = f"/v1/namespaces/default/tables/{topic}"
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog = load_catalog("vend", type="rest", uri=broker.catalog_url)
    catalog.create_namespace_if_not_exists("default")
    catalog.create_table(
        ("default", topic), Schema(NestedField(1, "id", LongType(), required=False))
    )
    config = http_json(broker.catalog_url + path)["config"]
    assert config["s3.endpoint"] == moto_s3.endpoint and "s3.secret-access-key" not in config

    vending = BrokerProcess(
        tmp_path_factory.mktemp("vend") / "home",
        [
            "--object-store",
            f"s3://{bucket}/segments-vend",
            "--warehouse",
            f"s3://{bucket}/warehouse-vend",
            "--override",
            "catalog.vended.credentials=true",
        ],
        env=moto_s3.env(),
    ).start()
    try:
        other = load_catalog("vend2", type="rest", uri=vending.catalog_url)
        other.create_namespace_if_not_exists("default")
        other.create_table(
            ("default", "vended"), Schema(NestedField(1, "id", LongType(), required=False))
        )
        config = http_json(vending.catalog_url + "/v1/namespaces/default/tables/vended")["config"]
        assert (config["s3.access-key-id"], config["s3.secret-access-key"]) == (
            "testing",
            "testing",
        )
        assert (
            "s3.secret-access-key" not in http_json(vending.catalog_url + "/v1/config")["defaults"]
        )
    finally:
        vending.stop()
