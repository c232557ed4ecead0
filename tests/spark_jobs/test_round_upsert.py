"""Upsert and CDC rounds (``spark_jobs.upsert``): each round MERGEs on the id columns,
merge-on-read. Records come from the Confluent Avro serializer; the upserted state is
read back with Spark SQL, pyiceberg and DuckDB."""

from __future__ import annotations

from typing import Any

from broker.catalog import duckdb_local
from spark_jobs import commit_round
from tests.spark_jobs.round_support import CLICK_V1, AvroProducer, new_topic, run_round, table
from tests.spark_jobs.test_commit_round import clicks
from tests.support import BrokerProcess

UPSERT = {"automq.table.topic.upsert.enable": "true", "automq.table.topic.id.columns": "[id]"}


def by_id(broker: BrokerProcess, topic: str) -> dict[int, tuple[int, str | None]]:
    """id -> (score, page) as pyiceberg reads the table."""
    rows = table(broker, topic).scan(selected_fields=("id", "score", "page")).to_arrow().to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"duplicate ids: {sorted(ids)}"
    return {r["id"]: (r["score"], r["page"]) for r in rows}


def three_readers(spark: Any, broker: BrokerProcess, topic: str) -> list[tuple[int, int, str | None]]:
    """(id, score, page) sorted, asserting Spark SQL, pyiceberg and DuckDB agree."""
    name = commit_round.use_catalog(spark, broker.catalog_url)
    from_spark = sorted((r["id"], r["score"], r["page"])
                        for r in spark.sql(f"SELECT id, score, page FROM {name}.default.{topic}").collect())
    from_pyiceberg = sorted((i, s, p) for i, (s, p) in by_id(broker, topic).items())
    con = duckdb_local.connect()
    duckdb_local.attach_catalog(con, broker.catalog_url, "lake")
    from_duckdb = sorted(con.execute(f"SELECT id, score, page FROM lake.default.{topic}").fetchall())
    assert from_spark == from_pyiceberg == from_duckdb
    return from_spark


def test_upsert_keeps_the_last_record_per_id_within_and_across_rounds(spark: Any,
                                                                       round_broker: BrokerProcess) -> None:
    topic = new_topic(round_broker, partitions=1, configs=UPSERT)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    first = clicks(0, 20)
    repeats = [{**c, "score": 500 + c["id"], "page": "/again"} for c in clicks(0, 5)]  # ids 0-4 again, later
    producer.send(first + repeats)
    r1 = run_round(spark, round_broker, topic)
    assert (r1.status, r1.rows, r1.records) == ("committed", 25, 25), r1.message
    assert "20 upserts, 0 deletes" in r1.message
    state = by_id(round_broker, topic)
    assert sorted(state) == list(range(20))
    assert all(state[i] == (500 + i, "/again") for i in range(5))

    producer.send([{**c, "score": 900 + c["id"]} for c in clicks(3, 4)] + clicks(20, 2))  # 3-6 updated, 20-21 new
    r2 = run_round(spark, round_broker, topic)
    assert r2.status == "committed" and r2.offsets_before == {0: 25} and r2.offsets_after == {0: 31}, r2.message
    rows = three_readers(spark, round_broker, topic)
    assert [r[0] for r in rows] == list(range(22))
    expected = {i: (900 + i if 3 <= i <= 6 else 500 + i if i < 5 else i % 100) for i in range(22)}
    assert {i: s for i, s, _ in rows} == expected
    snapshot = table(round_broker, topic).current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    summary = snapshot.summary.additional_properties
    assert summary["icefall.round-id"] == r2.round_id and summary["added-position-deletes"] == "4"
    assert run_round(spark, round_broker, topic).status == "nothing_new"
