"""Tables in the catalog the user already runs: the broker started with AutoMQ's keys
``automq.table.topic.catalog.type=rest`` and ``automq.table.topic.catalog.uri=<URI>`` pointing
at Apache Iceberg's own REST catalog server (from its Maven Central jars; not Icefall's code).

Rounds, the DLQ (a multi-table commit through that server's ``/v1/transactions/commit``), its
reprocess, upserts and maintenance write there; the broker's retention and lag read the
checkpoint there. This module's ``round_broker`` is that broker, and its ``catalog_url`` is the
external catalog's, so the round, DLQ and maintenance tests imported below run again, unchanged,
against it (Spark, pyiceberg and DuckDB reading the tables there).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.broker_client import http_json
from tests.conftest import IcebergRestCatalog
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    new_topic,
    run_round,
    table_offsets,
)
from tests.spark_jobs.test_commit_round import (  # noqa: F401 -- collected here, on the external catalog
    clicks,
    test_a_round_writes_every_record_once_with_system_columns,
    test_a_second_round_commits_only_what_arrived_since,
    test_spark_sql_pyiceberg_and_duckdb_read_the_same_rows,
)
from tests.spark_jobs.test_maintenance import (  # noqa: F401
    test_compaction_then_expiry_keeps_rows_and_the_checkpoint,
)
from tests.spark_jobs.test_round_dlq import (  # noqa: F401
    test_invalid_data_goes_to_the_dlq_in_the_same_commit,
    test_reprocess_moves_records_whose_schema_was_registered_late,
)
from tests.spark_jobs.test_round_exactly_once import (  # noqa: F401
    test_two_rounds_at_once_commit_each_record_once,
)
from tests.spark_jobs.test_round_upsert import (  # noqa: F401
    test_cdc_field_deletes_on_d_and_upserts_on_i_and_u,
)
from tests.support import BrokerProcess, wait_for


class ExternalCatalogBroker(BrokerProcess):
    """A broker whose tables live in another catalog: ``catalog_url`` is where the tests find
    them (the broker still serves its own, empty, catalog on ``catalog_port``)."""

    def __init__(self, home: Path, extra_args: list[str], tables_url: str) -> None:
        super().__init__(home, extra_args)
        self.tables_url = tables_url

    @property
    def catalog_url(self) -> str:
        return self.tables_url

    @property
    def builtin_catalog_url(self) -> str:
        return f"http://127.0.0.1:{self.catalog_port}"


@pytest.fixture(scope="module")
def round_broker(
    iceberg_rest_catalog: IcebergRestCatalog, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    broker = ExternalCatalogBroker(
        tmp_path_factory.mktemp("external") / "home",
        [
            "--segment-flush-ms",
            "100",
            "--retention-check-interval-ms",
            "300",
            "--override",
            "automq.table.topic.catalog.type=rest",
            "--override",
            f"automq.table.topic.catalog.uri={iceberg_rest_catalog.uri}",
        ],
        iceberg_rest_catalog.uri,
    ).start()
    try:
        yield broker
    finally:
        broker.stop()


def test_the_broker_names_the_external_catalog(
    round_broker: ExternalCatalogBroker, iceberg_rest_catalog: IcebergRestCatalog
) -> None:
    cluster = http_json(round_broker.admin_url + "/v1/cluster")
    assert cluster["catalog_url"] == iceberg_rest_catalog.uri
    assert cluster["catalog"] == {
        "type": "rest",
        "uri": iceberg_rest_catalog.uri,
        "warehouse": None,
        "properties": {},
        "builtin": False,
    }


def test_tables_go_to_the_external_catalog_not_the_builtin_one(
    spark: Any, round_broker: ExternalCatalogBroker
) -> None:
    topic = new_topic(round_broker, partitions=1)
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 5))
    assert run_round(spark, round_broker, topic).status == "committed"
    listed = http_json(round_broker.catalog_url + "/v1/namespaces/default/tables")["identifiers"]
    assert {"namespace": ["default"], "name": topic} in listed
    builtin = http_json(round_broker.builtin_catalog_url + "/v1/namespaces")["namespaces"]
    assert ["default"] not in builtin


def test_retention_follows_the_checkpoint_in_the_external_catalog(
    spark: Any, round_broker: ExternalCatalogBroker
) -> None:
    topic = new_topic(
        round_broker, partitions=1, configs={"retention.ms": "0", "file.delete.delay.ms": "0"}
    )
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 20))
    round_broker.admin("/v1/flush", "POST")

    def log_start() -> int:
        answer: Any = round_broker.admin(f"/v1/topics/{topic}/offsets")
        return int(answer["partitions"][0]["log_start_offset"])

    wait_for(
        lambda: f"retention of table topic {topic}-0 is held back" in round_broker.log_text(),
        20,
        what="retention held back for the table",
    )
    assert log_start() == 0
    assert run_round(spark, round_broker, topic).status == "committed"
    wait_for(lambda: log_start() == 20, 30, what="retention past the external catalog's checkpoint")
    assert table_offsets(round_broker, topic) == sorted(producer.acked)


def test_lag_and_the_airflow_view_read_the_tables_catalog(
    spark: Any, round_broker: BrokerProcess
) -> None:
    """The broker's lag (``/pending``, the size trigger's and ``/metrics``' figure) and the
    Airflow "Table topics" view read the checkpoint in the catalog that holds the tables, and
    the view says who maintains them (S3 Tables for a table bucket, Icefall otherwise)."""
    from icefall_airflow.status import all_statuses

    from spark_jobs.maintain.s3tables import maintainer

    topic = new_topic(round_broker, partitions=1)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 12))
    assert run_round(spark, round_broker, topic).status == "committed"
    producer.send(clicks(12, 3))
    pending: Any = round_broker.admin(f"/v1/topics/{topic}/pending")
    assert (pending["committed_offsets"], pending["records"]) == ({"0": 12}, 3), pending
    cluster = http_json(round_broker.admin_url + "/v1/cluster")
    view = all_statuses(round_broker.admin_url)
    row = next(r for r in view["tables"] if r["topic"] == topic)
    assert (row["error"], row["committed_offsets"], row["rows"]) == (None, {"0": 12}, 12), row
    assert row["maintained_by"] == maintainer(cluster["catalog"]["type"])
