"""Tables in Nessie (``automq.table.topic.catalog.type=nessie``), on Project Nessie's own
server (tests/nessie_server.py) with real Spark and pyiceberg.

A round writes its data to an Iceberg branch of the table (``icefall-round-<id>``) and then
publishes it with one conditional commit that moves ``main`` and the ``icefall-checkpoint`` tag
(spark_jobs/rounds/publish.py). Spark reaches Nessie through Iceberg's ``NessieCatalog``
(``type=nessie``, ``uri=…/api/v2``), which keeps the table's branches and tags in the metadata
files it writes; pyiceberg through Icefall's catalog on Nessie's own API
(broker/external_catalogs/nessie.py), which reads and writes the same files. Nessie's Iceberg REST
endpoint is not used: it serves a table as its ``main`` alone, and an append to a branch there
replaces ``main`` (pinned below, so a Nessie release that changes it is noticed).

``round_broker`` here is a broker with ``type=nessie``: the round, DLQ, reprocess,
concurrent-writer, maintenance and retention tests imported below run again, unchanged, against
it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pydantic import ValidationError
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.update import AssertTableUUID, SetPropertiesUpdate

from broker.config import BrokerConfig
from broker.contracts import CatalogSpec
from broker.external_catalogs.nessie import NessieCatalog, NessieError
from spark_jobs.broker_client import http_json
from spark_jobs.commit_round import use_catalog
from tests.conftest import MOTO_CREDENTIALS, MotoS3
from tests.nessie_server import NessieServer
from tests.plugins.test_broker_metrics import scrape
from tests.spark_jobs.round_support import CLICK_V1, AvroProducer, new_topic, run_round, table
from tests.spark_jobs.test_commit_round import (  # noqa: F401 -- collected here, on Nessie
    clicks,
    test_a_round_writes_every_record_once_with_system_columns,
)
from tests.spark_jobs.test_external_catalog import (  # noqa: F401
    test_lag_and_the_airflow_view_read_the_tables_catalog,
    test_retention_follows_the_checkpoint_in_the_external_catalog,
)
from tests.spark_jobs.test_maintenance import (  # noqa: F401
    test_compaction_then_expiry_keeps_rows_and_the_checkpoint,
)
from tests.spark_jobs.test_round_dlq import (  # noqa: F401
    test_invalid_data_goes_to_the_dlq_in_the_same_commit,
    test_reprocess_moves_records_whose_schema_was_registered_late,
)
from tests.spark_jobs.test_round_exactly_once import (  # noqa: F401
    test_a_concurrent_writer_on_main_makes_the_round_start_over,
)
from tests.spark_jobs.test_round_upsert import CDC_V1, by_id
from tests.support import BrokerProcess, present, wait_for

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


class NessieBroker(BrokerProcess):
    """A broker whose tables live in Nessie; ``tables_spec`` is how the tests open them."""

    def __init__(self, home: Path, nessie: NessieServer) -> None:
        super().__init__(
            home,
            [
                "--segment-flush-ms",
                "100",
                "--retention-check-interval-ms",
                "300",
                "--warehouse",
                str(home.parent / "warehouse"),
                "--override",
                "automq.table.topic.catalog.type=nessie",
                "--override",
                f"automq.table.topic.catalog.uri={nessie.api_uri}",
                "--override",
                "automq.table.topic.catalog.ref=main",
            ],
        )
        self.tables_spec = CatalogSpec(
            type="nessie",
            uri=nessie.api_uri,
            warehouse=(home.parent / "warehouse").resolve().as_uri(),
            properties={"ref": "main"},
            builtin=False,
        )


@pytest.fixture(scope="module")
def round_broker(
    nessie: NessieServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    broker = NessieBroker(tmp_path_factory.mktemp("nessie-broker") / "home", nessie).start()
    try:
        yield broker
    finally:
        broker.stop()


def test_the_broker_names_the_nessie_catalog(round_broker: NessieBroker) -> None:
    cluster = http_json(round_broker.admin_url + "/v1/cluster")
    assert cluster["catalog"] == {
        **present(round_broker.tables_spec).model_dump(),
        "builtin": False,
    }


def test_spark_and_pyiceberg_see_the_round_in_nessie(
    spark: Any, round_broker: NessieBroker
) -> None:
    topic = new_topic(round_broker, partitions=1)
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 5))
    assert run_round(spark, round_broker, topic).status == "committed"
    written = table(round_broker, topic)
    assert set(written.metadata.refs) == {"main", "icefall-checkpoint"}
    catalog = use_catalog(spark, present(round_broker.tables_spec))
    rows = spark.sql(f"SELECT count(*) AS n FROM {catalog}.default.{written.name()[-1]}").collect()
    assert rows[0].n == 5
    refs = spark.sql(f"SELECT name FROM {catalog}.default.{written.name()[-1]}.refs").collect()
    assert {row.name for row in refs} == {"main", "icefall-checkpoint"}


def test_the_broker_reads_the_lag_from_the_checkpoint_in_nessie(
    spark: Any, round_broker: NessieBroker
) -> None:
    topic = new_topic(round_broker, partitions=1)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 10))
    assert run_round(spark, round_broker, topic).status == "committed"
    producer.send(clicks(10, 4))
    labels = f'{{topic="{topic}",namespace="default",table="{topic.replace("-", "_")}"}}'

    def lag() -> float | None:
        samples = scrape(round_broker)
        if samples.get(f"icefall_table_catalog_up{labels}") != 1:
            return None
        return samples.get(f"icefall_table_lag_records{labels}")

    wait_for(lambda: lag() == 4, 20, what="lag of 4 records past the checkpoint in Nessie")


def test_an_upsert_round_deletes_and_upserts_in_nessie(
    spark: Any, round_broker: NessieBroker
) -> None:
    """Upserts write equality deletes or v3 deletion vectors: v3 metadata through Nessie too."""
    topic = new_topic(
        round_broker,
        partitions=1,
        configs={"automq.table.topic.cdc.field": "op", "automq.table.topic.id.columns": "[id]"},
    )
    AvroProducer(round_broker, topic, CDC_V1).send(
        [{**c, "op": "I"} for c in clicks(0, 5)]
        + [{**c, "op": "U", "score": 77} for c in clicks(2, 1)]
        + [{**c, "op": "D"} for c in clicks(3, 1)]
    )
    assert run_round(spark, round_broker, topic).status == "committed"
    state = by_id(round_broker, topic)
    assert sorted(state) == [0, 1, 2, 4] and state[2][0] == 77
    catalog = use_catalog(spark, present(round_broker.tables_spec))
    rows = spark.sql(f"SELECT id FROM {catalog}.default.{topic.replace('-', '_')}").collect()
    assert sorted(row.id for row in rows) == [0, 1, 2, 4]


def test_a_commit_on_a_stale_nessie_hash_is_refused(round_broker: NessieBroker) -> None:
    """The conditional part of every commit: Nessie's, on the hash the table was read at."""
    catalog = load_catalog("n", **present(round_broker.tables_spec).pyiceberg_properties())
    assert isinstance(catalog, NessieCatalog)
    catalog.create_namespace_if_not_exists("default")
    created = catalog.create_table(
        f"default.stale_{uuid.uuid4().hex[:8]}", schema=pa.schema([("x", pa.int64())])
    )
    read_at = catalog._head()
    catalog.commit_table(created, (), (SetPropertiesUpdate(updates={"by": "first"}),))
    content = catalog._content(created.name(), catalog._head())
    assert content is not None
    put = catalog._put_table(
        created.name(), content["id"], created.metadata_location, created.metadata
    )
    with pytest.raises(CommitFailedException):
        catalog._commit(read_at, "a writer that read before the first", [put])
    assert catalog.load_table(created.name()).properties["by"] == "first"


def test_a_wrong_nessie_uri_names_the_setting() -> None:
    catalog = NessieCatalog("n", uri="http://127.0.0.1:9/api/v2")
    with pytest.raises(NessieError, match=r"automq\.table\.topic\.catalog\.uri"):
        catalog.load_table("default.t")


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


def test_type_nessie_needs_a_uri() -> None:
    with pytest.raises(ValidationError, match=r"automq\.table\.topic\.catalog\.uri"):
        BrokerConfig(catalog={"type": "nessie"})  # type: ignore[arg-type]
