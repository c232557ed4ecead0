"""``automq.table.topic.partition.by``: the table's spec follows the config, rows land in
partitioned data files, and changing the config evolves the spec at the next round."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from spark_jobs.rounds import partitioning
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    new_topic,
    run_round,
    table,
    table_offsets,
)
from tests.spark_jobs.test_commit_round import clicks
from tests.support import BrokerProcess, wait_for

NESTED = {
    **CLICK_V1,
    "fields": [
        *CLICK_V1["fields"],
        {
            "name": "geo",
            "type": {
                "type": "record",
                "name": "Geo",
                "fields": [{"name": "country", "type": "string"}],
            },
        },
    ],
}


def test_parse_names_fields_as_spark_does() -> None:
    got = [
        (f.column, str(f.transform), f.name)
        for f in partitioning.parse("[month(at), bucket(id, 16), geo.country, truncate(page, 4)]")
    ]
    assert got == [
        ("at", "month", "at_month"),
        ("id", "bucket[16]", "id_bucket_16"),
        ("geo.country", "identity", "geo_country"),
        ("page", "truncate[4]", "page_trunc_4"),
    ]
    assert partitioning.parse("") == []
    with pytest.raises(ValueError, match="width"):
        partitioning.parse("[bucket(id)]")


def test_rows_are_written_partitioned_and_the_spec_evolves(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(
        round_broker,
        partitions=2,
        configs={"automq.table.topic.partition.by": "[day(at), bucket(id, 4), geo.country]"},
    )
    producer = AvroProducer(round_broker, topic, NESTED)
    producer.send([{**c, "geo": {"country": "fr" if c["id"] % 2 else "de"}} for c in clicks(0, 80)])
    result = run_round(spark, round_broker, topic)
    assert result.status == "committed" and result.rows == 80, result.message
    tbl = table(round_broker, topic)
    assert [f.name for f in tbl.spec().fields] == ["at_day", "id_bucket_4", "geo_country"]
    files = tbl.inspect.files().to_pylist()
    assert len(files) >= 8  # 4 buckets x 2 countries (one day)
    assert {f["partition"]["geo_country"] for f in files} == {"fr", "de"}
    assert tbl.scan(row_filter="geo.country == 'fr'").to_arrow().num_rows == 40

    admin = AdminClient({"bootstrap.servers": round_broker.bootstrap})
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry(
                "automq.table.topic.partition.by",
                "[hour(at)]",
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(15)

    def manifest_has_new_spec() -> bool:
        entry = next(
            t for t in round_broker.admin("/v1/table-topics")["table_topics"] if t["topic"] == topic
        )
        return bool(entry["configs"]["automq.table.topic.partition.by"] == "[hour(at)]")

    wait_for(manifest_has_new_spec, timeout=15, what="the config change in the manifest")
    producer.send([{**c, "geo": {"country": "it"}} for c in clicks(80, 20)])
    second = run_round(spark, round_broker, topic)
    assert second.rows == 20 and any("at_hour" in c for c in second.schema_changes), second
    tbl = table(round_broker, topic)
    assert [f.name for f in tbl.spec().fields] == ["at_hour"] and tbl.spec().spec_id > 0
    assert table_offsets(round_broker, topic) == sorted(producer.acked)
