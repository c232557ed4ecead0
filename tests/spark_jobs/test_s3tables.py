"""Tables in AWS S3 Tables (``automq.table.topic.catalog.type=tablebucket``), on moto's server.

moto's server serves the S3 Tables API (table buckets, namespaces, tables, the metadata
location and its version token) and the S3 storage S3 Tables gives each table. The broker
is started with AutoMQ's keys naming a table bucket by its ARN; the commit round creates the
table through Icefall's pyiceberg S3 Tables catalog (``broker/external_catalogs/s3tables.py``),
Spark writes the round's data through AWS's own S3 Tables catalog jar, and the round
publishes with one conditional ``UpdateTableMetadataLocation``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.update import AssertRefSnapshotId, SetPropertiesUpdate

from broker.config import ConfigError, load_broker_config
from broker.contracts import CatalogSpec
from broker.external_catalogs import tablebucket
from spark_jobs import commit_round
from spark_jobs.broker_client import http_json
from spark_jobs.rounds.table_setup import catalog_for
from tests.conftest import MOTO_CREDENTIALS, MotoS3
from tests.spark_jobs.round_support import CLICK_V1, AvroProducer, new_topic, run_round
from tests.spark_jobs.test_commit_round import clicks
from tests.spark_jobs.test_external_catalog import (  # noqa: F401 -- collected here, on S3 Tables
    test_lag_and_the_airflow_view_read_the_tables_catalog,
)
from tests.spark_jobs.test_glue_catalog import (  # noqa: F401 -- collected here, on S3 Tables
    test_reprocess_without_multi_table_commits_commits_the_table_then_the_dlq,
)
from tests.spark_jobs.test_round_dlq import (  # noqa: F401 -- collected here, on S3 Tables
    test_invalid_data_goes_to_the_dlq_in_the_same_commit,
)
from tests.support import BrokerProcess, free_port, wait_for


@pytest.fixture(scope="module")
def aws_env() -> Iterator[None]:
    """moto's credentials in this process (boto3, and the JVM that Spark starts)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in MOTO_CREDENTIALS.items():
            mp.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def bucket_arn(moto_s3: MotoS3, aws_env: None) -> str:
    client = boto3.client("s3tables", endpoint_url=moto_s3.endpoint, region_name="us-east-1")
    return str(client.create_table_bucket(name=f"lake-{uuid.uuid4().hex[:8]}")["arn"])


def catalog_properties(moto_s3: MotoS3) -> dict[str, str]:
    return {
        "s3tables.endpoint": moto_s3.endpoint,
        "s3.endpoint": moto_s3.endpoint,
        "s3.path-style-access": "true",
    }


@pytest.fixture(scope="module")
def spec(moto_s3: MotoS3, bucket_arn: str) -> CatalogSpec:
    return CatalogSpec(
        type="tablebucket",
        uri="",
        warehouse=bucket_arn,
        properties=catalog_properties(moto_s3),
        builtin=False,
    )


@pytest.fixture(scope="module")
def spark(aws_env: None) -> Iterator[Any]:
    session = commit_round.spark_session("icefall-s3tables-tests", "local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    # AWS's S3 Tables client takes credentials from the JVM's default chain; the JVM may have
    # started (another test module) before this module put moto's in the environment.
    system = session.sparkContext._jvm.java.lang.System
    system.setProperty("aws.accessKeyId", MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"])
    system.setProperty("aws.secretAccessKey", MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def round_broker(
    moto_s3: MotoS3, bucket_arn: str, spec: CatalogSpec, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    overrides = {
        "automq.table.topic.catalog.type": "tablebucket",
        "automq.table.topic.catalog.warehouse": bucket_arn,
        **{f"automq.table.topic.catalog.{k}": v for k, v in catalog_properties(moto_s3).items()},
    }
    args = ["--segment-flush-ms", "100"]
    for key, value in overrides.items():
        args += ["--override", f"{key}={value}"]
    broker = BrokerProcess(
        tmp_path_factory.mktemp("s3tables") / "home", args, env=MOTO_CREDENTIALS
    ).start()
    broker.tables_spec = spec
    try:
        yield broker
    finally:
        broker.stop()


def test_a_round_appends_into_the_table_bucket(
    spark: Any, round_broker: BrokerProcess, spec: CatalogSpec, moto_s3: MotoS3
) -> None:
    cluster = http_json(round_broker.admin_url + "/v1/cluster")
    assert cluster["catalog"]["type"] == "tablebucket"
    assert cluster["catalog"]["warehouse"] == spec.warehouse
    topic = new_topic(round_broker, partitions=1)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 6))
    result = run_round(spark, round_broker, topic)
    assert result.status == "committed", result
    # pyiceberg through Icefall's S3 Tables catalog: every record once, with its offset
    table = catalog_for(spec).load_table(("default", topic))
    rows = table.scan(selected_fields=("_kafka_metadata",)).to_arrow()
    offsets = sorted((m["partition"], m["offset"]) for m in rows["_kafka_metadata"].to_pylist())
    assert offsets == sorted(producer.acked)
    # the table lives where S3 Tables put it, and S3 Tables points at the metadata published
    api = boto3.client("s3tables", endpoint_url=moto_s3.endpoint, region_name="us-east-1")
    described = api.get_table(tableBucketARN=spec.warehouse, namespace="default", name=topic)
    assert table.location() == described["warehouseLocation"].rstrip("/")
    pointer = api.get_table_metadata_location(
        tableBucketARN=spec.warehouse, namespace="default", name=topic
    )
    assert pointer["metadataLocation"] == table.metadata_location
    # Spark SQL reads it through AWS's S3 Tables catalog
    name = commit_round.use_catalog(spark, spec)
    assert spark.sql(f"SELECT count(*) AS n FROM {name}.default.{topic}").first()["n"] == 6
    # a second round commits only what arrived since
    producer.send(clicks(6, 3))
    assert run_round(spark, round_broker, topic).status == "committed"
    rows = catalog_for(spec).load_table(("default", topic)).scan().to_arrow()
    offsets = sorted((m["partition"], m["offset"]) for m in rows["_kafka_metadata"].to_pylist())
    assert offsets == sorted(producer.acked) and len(offsets) == 9


def test_a_conditional_commit_loses_the_race(spec: CatalogSpec) -> None:
    import pyarrow as pa

    catalog = catalog_for(spec)
    catalog.create_namespace_if_not_exists("race")
    name = f"t_{uuid.uuid4().hex[:8]}"
    catalog.create_table(("race", name), pa.schema([("a", pa.int64())]))
    ours = catalog.load_table(("race", name))
    theirs = catalog.load_table(("race", name))
    theirs.append(pa.table({"a": [1]}))  # another writer moves main after we read
    # the requirement catches it (main is no longer what we read) ...
    with pytest.raises(CommitFailedException):
        catalog.commit_table(
            ours,
            (AssertRefSnapshotId.model_validate({"ref": "main", "snapshot-id": None}),),
            (SetPropertiesUpdate(updates={"x": "1"}),),
        )
    # ... and S3 Tables' version token catches a writer that comes in between our read of the
    # pointer and our swap, whatever the requirements say
    location, token = catalog._pointer("race", name)  # type: ignore[attr-defined]
    catalog.load_table(("race", name)).append(pa.table({"a": [2]}))
    with pytest.raises(CommitFailedException, match="changed since it was read"):
        catalog._swap("race", name, str(location), token)  # type: ignore[attr-defined]
    final = catalog.load_table(("race", name))
    assert sorted(final.scan().to_arrow()["a"].to_pylist()) == [1, 2]


def test_a_bad_arn_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="automq.table.topic.catalog.warehouse='s3://lake'"):
        load_broker_config(
            overrides={
                "automq.table.topic.catalog.type": "tablebucket",
                "automq.table.topic.catalog.warehouse": "s3://lake",
            },
            flags={"home": tmp_path},
        )


def test_a_missing_bucket_or_a_bad_endpoint_names_the_setting(
    moto_s3: MotoS3, aws_env: None
) -> None:
    missing = "arn:aws:s3tables:us-east-1:123456789012:bucket/no-such-bucket"
    problem = tablebucket.check(missing, catalog_properties(moto_s3))
    assert problem is not None
    assert (
        "automq.table.topic.catalog.warehouse" in problem[1]
        and "no such table bucket" in problem[1]
    )
    closed = f"http://127.0.0.1:{free_port()}"
    problem = tablebucket.check(missing, {"s3tables.endpoint": closed})
    assert problem is not None
    assert "automq.table.topic.catalog.s3tables.endpoint" in problem[1] and closed in problem[1]
    bad = CatalogSpec(
        type="tablebucket", uri="", warehouse=missing, properties={"s3tables.endpoint": closed}
    )
    with pytest.raises(ConnectionError, match="s3tables.endpoint"):
        catalog_for(bad).create_namespace("default")
    with pytest.MonkeyPatch.context() as mp:  # no credentials anywhere boto3 looks
        for name in (
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
        ):
            mp.delenv(name, raising=False)
        for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
            mp.setenv(name, "/nonexistent")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        problem = tablebucket.check(missing, catalog_properties(moto_s3))
    assert problem is not None and "no AWS credentials" in problem[1]
    assert "automq.table.topic.catalog.client.access-key-id" in problem[1]


def test_maintenance_writes_the_topic_settings_to_s3_tables_and_rewrites_manifests(
    spark: Any,
    round_broker: BrokerProcess,
    spec: CatalogSpec,
    moto_s3: MotoS3,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S3 Tables compacts, expires and removes orphans itself: the job writes the topic's keys
    to its maintenance configuration and runs only ``rewrite_manifests`` (through AWS's jar).
    moto does not serve PutTableMaintenanceConfiguration: botocore's Stubber checks the requests
    against the API's model (and answers them); everything else is moto's server."""
    from botocore.stub import Stubber

    from spark_jobs import maintenance
    from spark_jobs.maintain import s3tables as s3tables_maintenance

    topic = new_topic(
        round_broker,
        partitions=1,
        configs={
            "automq.table.topic.maintenance.target.file.size.bytes": str(128 * 1024 * 1024),
            "automq.table.topic.maintenance.compaction.strategy": "binpack",
            "automq.table.topic.expire.snapshot.older.than.hours": "5",
            "automq.table.topic.expire.snapshot.retain.last": "2",
        },
    )
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    for start in (0, 3):  # two rounds: two manifests to rewrite
        producer.send(clicks(start, 3))
        assert run_round(spark, round_broker, topic).status == "committed"

    client = boto3.client("s3tables", endpoint_url=moto_s3.endpoint, region_name="us-east-1")
    stubber = Stubber(client)
    table = {"tableBucketARN": spec.warehouse, "namespace": "default", "name": topic}
    compaction = {"targetFileSizeMB": 128, "strategy": "binpack"}
    snapshots = {"minSnapshotsToKeep": 2, "maxSnapshotAgeHours": 5}
    for kind, settings in (
        ("icebergCompaction", compaction),
        ("icebergSnapshotManagement", snapshots),
    ):
        stubber.add_response(
            "put_table_maintenance_configuration",
            {},
            {**table, "type": kind, "value": {"status": "enabled", "settings": {kind: settings}}},
        )
    monkeypatch.setattr(s3tables_maintenance, "client_for", lambda catalog: client)
    with stubber:
        code, out = maintenance.run(
            ["--admin-url", round_broker.admin_url, "--topic", topic], spark
        )
        stubber.assert_no_pending_responses()
    assert code == 0 and out.status == "done", out.message
    done = out.to_json()["per_action"]
    assert set(done) == {"s3tables", "manifests"}  # compact, expire, orphans: S3 Tables'
    assert done["s3tables"]["maintained_by"] == "S3 Tables"
    assert done["manifests"]["rewritten_manifests"] >= 2
    rows = catalog_for(spec).load_table(("default", topic)).scan().to_arrow()
    assert rows.num_rows == 6


def test_the_requests_fit_the_api_model() -> None:
    """botocore validates types and required members before sending, not enums: every strategy
    and status the job may send is one the model lists, and a wrong shape is refused."""
    import botocore.session
    from botocore.exceptions import ParamValidationError
    from botocore.stub import Stubber

    from spark_jobs.maintain import s3tables as s3tables_maintenance
    from spark_jobs.maintain.settings import resolve

    model = botocore.session.get_session().get_service_model("s3tables")
    strategies = model.shape_for("IcebergCompactionStrategy").enum
    assert set(s3tables_maintenance.STRATEGY.values()) <= set(strategies)
    assert set(model.shape_for("MaintenanceStatus").enum) == {"enabled", "disabled"}
    settings = resolve({"automq.table.topic.expire.snapshot.enabled": "false"}, {})
    arn = "arn:aws:s3tables:us-east-1:123456789012:bucket/lake"
    requests = s3tables_maintenance.requests(arn, "default", "t", settings, {})
    assert [r["value"]["status"] for r in requests] == ["enabled", "disabled"]
    assert requests[0]["value"]["settings"]["icebergCompaction"]["targetFileSizeMB"] == 512
    client = boto3.client(
        "s3tables", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    with Stubber(client) as stubber:
        for request in requests:
            stubber.add_response("put_table_maintenance_configuration", {}, request)
            client.put_table_maintenance_configuration(**request)
        wrong = {
            **requests[0],
            "value": {
                "status": "enabled",
                "settings": {"icebergCompaction": {"targetFileSizeMB": "128"}},
            },
        }
        stubber.add_response("put_table_maintenance_configuration", {}, None)
        with pytest.raises(ParamValidationError):
            client.put_table_maintenance_configuration(**wrong)
    with pytest.raises(ValueError, match="maintenance.target.file.size.bytes"):
        s3tables_maintenance.requests(
            arn,
            "default",
            "t",
            resolve({"automq.table.topic.maintenance.target.file.size.bytes": "1048576"}, {}),
            {},
        )


def test_the_broker_logs_a_missing_table_bucket_at_start_and_keeps_serving(
    moto_s3: MotoS3, tmp_path: Path
) -> None:
    missing = "arn:aws:s3tables:us-east-1:123456789012:bucket/not-there"
    args = [
        "--override",
        "automq.table.topic.catalog.type=tablebucket",
        "--override",
        f"automq.table.topic.catalog.warehouse={missing}",
        "--override",
        f"automq.table.topic.catalog.s3tables.endpoint={moto_s3.endpoint}",
    ]
    broker = BrokerProcess(tmp_path / "home", args, env=MOTO_CREDENTIALS).start()
    try:
        wait_for(
            lambda: "no such table bucket" in broker.log_text(),
            20,
            what="the missing table bucket in the broker's log",
        )
        line = next(x for x in broker.log_text().splitlines() if "no such table bucket" in x)
        assert f"automq.table.topic.catalog.warehouse={missing}" in line
        assert http_json(broker.admin_url + "/v1/cluster")["catalog"]["type"] == "tablebucket"
    finally:
        broker.stop()
