"""Upsert and CDC rounds (``spark_jobs.rounds.upsert``): each round MERGEs on the id columns,
merge-on-read. Records come from the Confluent Avro serializer; the upserted state is
read back with Spark SQL, pyiceberg and DuckDB."""

from __future__ import annotations

from typing import Any

import pytest

from broker import checkpoint
from broker.catalog import duckdb_local
from spark_jobs import commit_round
from spark_jobs.rounds import upsert
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    crash_round_at,
    new_topic,
    run_round,
    table,
)
from tests.spark_jobs.test_commit_round import clicks
from tests.support import BrokerProcess

UPSERT = {"automq.table.topic.upsert.enable": "true", "automq.table.topic.id.columns": "[id]"}


def by_id(broker: BrokerProcess, topic: str) -> dict[int, tuple[int, str | None]]:
    """id -> (score, page) as pyiceberg reads the table."""
    rows = table(broker, topic).scan(selected_fields=("id", "score", "page")).to_arrow().to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"duplicate ids: {sorted(ids)}"
    return {r["id"]: (r["score"], r["page"]) for r in rows}


def three_readers(
    spark: Any, broker: BrokerProcess, topic: str
) -> list[tuple[int, int, str | None]]:
    """(id, score, page) sorted, asserting Spark SQL, pyiceberg and DuckDB agree."""
    name = commit_round.use_catalog(spark, broker.catalog_url)
    from_spark = sorted(
        (r["id"], r["score"], r["page"])
        for r in spark.sql(f"SELECT id, score, page FROM {name}.default.{topic}").collect()
    )
    from_pyiceberg = sorted((i, s, p) for i, (s, p) in by_id(broker, topic).items())
    con = duckdb_local.connect()
    duckdb_local.attach_catalog(con, broker.catalog_url, "lake")
    from_duckdb = sorted(
        con.execute(f"SELECT id, score, page FROM lake.default.{topic}").fetchall()
    )
    assert from_spark == from_pyiceberg == from_duckdb
    return from_spark


def test_upsert_keeps_the_last_record_per_id_within_and_across_rounds(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(round_broker, partitions=1, configs=UPSERT)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    first = clicks(0, 20)
    repeats = [
        {**c, "score": 500 + c["id"], "page": "/again"} for c in clicks(0, 5)
    ]  # ids 0-4 again, later
    producer.send(first + repeats)
    r1 = run_round(spark, round_broker, topic)
    assert (r1.status, r1.rows, r1.records) == ("committed", 25, 25), r1.message
    assert "20 rows written, 0 rows replaced or deleted" in r1.message
    state = by_id(round_broker, topic)
    assert sorted(state) == list(range(20))
    assert all(state[i] == (500 + i, "/again") for i in range(5))

    producer.send(
        [{**c, "score": 900 + c["id"]} for c in clicks(3, 4)] + clicks(20, 2)
    )  # 3-6 updated, 20-21 new
    r2 = run_round(spark, round_broker, topic)
    assert (
        r2.status == "committed" and r2.offsets_before == {0: 25} and r2.offsets_after == {0: 31}
    ), r2.message
    rows = three_readers(spark, round_broker, topic)
    assert [r[0] for r in rows] == list(range(22))
    expected = {i: (900 + i if 3 <= i <= 6 else 500 + i if i < 5 else i % 100) for i in range(22)}
    assert {i: s for i, s, _ in rows} == expected
    snapshot = table(round_broker, topic).current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    summary = snapshot.summary.additional_properties
    assert summary["icefall.round-id"] == r2.round_id and summary["added-position-deletes"] == "4"
    assert run_round(spark, round_broker, topic).status == "nothing_new"


CDC_V1: dict[str, Any] = {
    **CLICK_V1,
    "name": "ClickChange",
    "fields": [*CLICK_V1["fields"], {"name": "op", "type": "string"}],
}


def test_cdc_field_deletes_on_d_and_upserts_on_i_and_u(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(
        round_broker,
        partitions=1,
        configs={"automq.table.topic.cdc.field": "op", "automq.table.topic.id.columns": "[id]"},
    )
    producer = AvroProducer(round_broker, topic, CDC_V1)
    producer.send(
        [{**c, "op": "I"} for c in clicks(0, 10)]
        + [{**c, "op": "update", "score": 77} for c in clicks(2, 1)]  # U by its first letter
        + [{**c, "op": "D"} for c in clicks(3, 1)]
        + [{**c, "op": "i"} for c in clicks(10, 1)]
        + [{**c, "op": "d"} for c in clicks(10, 1)]
    )
    r1 = run_round(spark, round_broker, topic)
    assert r1.status == "committed" and r1.rows == 14, r1.message
    state = by_id(round_broker, topic)
    assert sorted(state) == [0, 1, 2, 4, 5, 6, 7, 8, 9] and state[2][0] == 77

    producer.send(
        [{**c, "op": "D"} for c in clicks(4, 2)]
        + [{**c, "op": "I", "score": 5} for c in clicks(3, 1)]
    )
    assert run_round(spark, round_broker, topic).status == "committed"
    assert [r[:2] for r in three_readers(spark, round_broker, topic)] == [
        (0, 0),
        (1, 1),
        (2, 77),
        (3, 5),
        (6, 6),
        (7, 7),
        (8, 8),
        (9, 9),
    ]
    ops = {
        r["id"]: r["op"]
        for r in table(round_broker, topic)
        .scan(selected_fields=("id", "op"))
        .to_arrow()
        .to_pylist()
    }
    assert ops[3] == "I" and ops[2] == "update"  # the CDC column is kept as a column


def test_an_unknown_cdc_op_fails_the_round_naming_it_and_commits_nothing(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(
        round_broker,
        partitions=1,
        configs={"automq.table.topic.cdc.field": "op", "automq.table.topic.id.columns": "[id]"},
    )
    producer = AvroProducer(round_broker, topic, CDC_V1)
    producer.send(
        [{**c, "op": "I"} for c in clicks(0, 3)] + [{**c, "op": "Z"} for c in clicks(3, 1)]
    )
    result = run_round(spark, round_broker, topic)
    assert result.status == "failed"
    assert (
        "partition 0 offset 3: UnknownCdcOperation" in result.message
        and "nothing committed" in result.message
    )
    t = table(round_broker, topic)
    assert t.scan().to_arrow().num_rows == 0
    assert [r for r in t.metadata.refs if r.startswith("icefall-round-")] == []
    staging = t.location().removeprefix("file://") + "/icefall-staging"
    import os

    assert not any(files for _, _, files in os.walk(staging)), "staged files must be removed"


def test_tombstones_delete_the_id_named_by_the_key(spark: Any, round_broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    topic = new_topic(round_broker, partitions=1, configs=UPSERT)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 8), key=lambda c: str(c["id"]))
    raw = Producer({"bootstrap.servers": round_broker.bootstrap, "enable.idempotence": True})
    raw.produce(topic, key=b"3", value=None)
    assert raw.flush(30) == 0
    producer.send(clicks(8, 1), key=b"8")
    raw.produce(topic, key=b" 8 ", value=None)  # an id inserted and deleted in the same round
    assert raw.flush(30) == 0
    r1 = run_round(spark, round_broker, topic)
    assert (r1.status, r1.rows, r1.dlq_rows) == ("committed", 11, 0), r1.message
    assert sorted(by_id(round_broker, topic)) == [0, 1, 2, 4, 5, 6, 7]
    raw.produce(topic, key=b"0", value=None)
    raw.produce(topic, key=b"42", value=None)  # deleting an id the table never had: no change
    assert raw.flush(30) == 0
    assert run_round(spark, round_broker, topic).status == "committed"
    assert [r[0] for r in three_readers(spark, round_broker, topic)] == [1, 2, 4, 5, 6, 7]
    raw.produce(
        topic, key=b"42", value=None
    )  # a merge that changes nothing still moves the offsets
    assert raw.flush(30) == 0
    nothing = run_round(spark, round_broker, topic)
    assert nothing.status == "committed" and nothing.offsets_after == {0: 14}, nothing.message

    raw.produce(topic, key=b"not a number", value=None)
    assert raw.flush(30) == 0
    failed = run_round(spark, round_broker, topic)
    assert failed.status == "failed" and "offset 14: MissingIdColumn" in failed.message, (
        failed.message
    )


def test_bad_records_in_an_upsert_round_go_to_the_dlq(
    spark: Any, round_broker: BrokerProcess
) -> None:
    from confluent_kafka import Producer

    from tests.spark_jobs.test_round_dlq import dlq_rows

    topic = new_topic(
        round_broker,
        partitions=1,
        configs={**UPSERT, "automq.table.topic.schema.validation": "false"},
    )
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 6))
    raw = Producer({"bootstrap.servers": round_broker.bootstrap, "enable.idempotence": True})
    for value in (b"garbage", b"\x00\x7f\xff\xff\xf0xx"):
        raw.produce(topic, value=value, key=b"1")
    assert raw.flush(30) == 0
    producer.send([{**c, "score": 60} for c in clicks(0, 2)])
    result = run_round(spark, round_broker, topic)
    assert (result.status, result.rows, result.dlq_rows, result.records) == (
        "committed",
        8,
        2,
        10,
    ), result.message
    assert [r["offset"] for r in dlq_rows(round_broker, topic)] == [6, 7]
    assert {i: s for i, (s, _) in by_id(round_broker, topic).items()} == {
        0: 60,
        1: 60,
        2: 2,
        3: 3,
        4: 4,
        5: 5,
    }
    from spark_jobs import dlq_reprocess

    code, nothing = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic], spark
    )
    assert code == 0 and (nothing["status"], nothing["still_bad"]) == ("nothing_to_move", 2), (
        nothing
    )
    assert len(dlq_rows(round_broker, topic)) == 2


@pytest.mark.parametrize("version", ["2", "3"])
def test_reprocess_of_an_upsert_table_never_puts_an_old_record_over_a_newer_one(
    version: str, spark: Any, round_broker: BrokerProcess
) -> None:
    """Records of ids 1 and 2 in the DLQ (their schema was registered late); id 2 was written again
    since. Reprocess merges id 1's record and only takes id 2's out of the DLQ."""
    from spark_jobs import dlq_reprocess
    from tests.spark_jobs.test_round_dlq import LateSchema, dlq_rows

    topic = new_topic(
        round_broker,
        partitions=1,
        configs={
            **UPSERT,
            "automq.table.topic.schema.validation": "false",
            "automq.table.topic.format.version": version,
        },
    )
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 4), key=lambda c: str(c["id"]))
    late = LateSchema(round_broker, topic)
    late.send(
        [{**c, "score": 100 + c["id"]} for c in clicks(1, 2, campaign="late")],
        key=lambda c: str(c["id"]),
    )
    r1 = run_round(spark, round_broker, topic)
    assert (r1.status, r1.rows, r1.dlq_rows) == ("committed", 4, 2), r1.message
    producer.send(
        [{**c, "score": 77} for c in clicks(2, 1)], key=b"2"
    )  # offset 6: id 2 again, decodes
    assert run_round(spark, round_broker, topic).status == "committed"

    late.register()
    tasks = (
        ["--in-driver-max-bytes", "0"] if version == "3" else []
    )  # v3: the replay decoded by Spark tasks
    code, moved = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic, *tasks], spark
    )
    assert code == 0 and moved["status"] == "moved", moved
    assert (moved["moved"], moved["superseded"], moved["still_bad"]) == (2, 1, 0), moved
    assert moved["moved_offsets"] == {
        "0": [4]
    }  # the rows written: id 1's record; id 2's was replaced
    assert dlq_rows(round_broker, topic) == []
    rows = three_readers(spark, round_broker, topic)
    assert {i: s for i, s, _ in rows} == {0: 0, 1: 101, 2: 77, 3: 3}
    campaigns = (
        table(round_broker, topic).scan(selected_fields=("id", "campaign")).to_arrow().to_pylist()
    )
    assert {r["id"]: r["campaign"] for r in campaigns} == {0: None, 1: "late", 2: None, 3: None}
    assert checkpoint.read_checkpoint(table(round_broker, topic).metadata).offsets == {0: 7}
    code, again = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic], spark
    )
    assert (code, again["status"], again["dlq_rows"]) == (0, "nothing_to_move", 0), again


V3 = {"automq.table.topic.format.version": "3"}


def _delete_file_formats(spark: Any, broker: BrokerProcess, topic: str) -> set[str]:
    name = commit_round.use_catalog(spark, broker.catalog_url)
    return {
        r["file_format"]
        for r in spark.sql(f"SELECT file_format FROM {name}.default.{topic}.delete_files").collect()
    }


def test_upsert_rounds_on_a_v3_table_write_deletion_vectors(
    spark: Any, round_broker: BrokerProcess
) -> None:
    """format.version=3: the broker's catalog keeps the v3 table, the round's MERGE writes deletion
    vectors (Puffin) instead of position deletes, and Spark, pyiceberg and DuckDB read the upserted state."""
    topic = new_topic(round_broker, partitions=2, configs={**UPSERT, **V3})
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(
        clicks(0, 20) + [{**c, "score": 500 + c["id"]} for c in clicks(0, 5)],
        key=lambda c: str(c["id"]),
    )
    r1 = run_round(
        spark, round_broker, topic, "--in-driver-max-bytes", str(64 << 20)
    )  # decoded in the driver
    assert (r1.status, r1.rows, r1.executor) == ("committed", 25, "driver"), r1.message
    t = table(round_broker, topic)
    assert t.metadata.format_version == 3

    producer.send(
        [{**c, "score": 900 + c["id"]} for c in clicks(3, 4)] + clicks(20, 2),
        key=lambda c: str(c["id"]),
    )
    r2 = run_round(spark, round_broker, topic)
    assert r2.status == "committed" and sum(r2.offsets_after.values()) == 31, r2.message
    rows = three_readers(spark, round_broker, topic)
    assert {i: s for i, s, _ in rows} == {
        i: (900 + i if 3 <= i <= 6 else 500 + i if i < 5 else i % 100) for i in range(22)
    }
    assert _delete_file_formats(spark, round_broker, topic) == {"PUFFIN"}
    snapshot = table(round_broker, topic).current_snapshot()
    assert (
        snapshot is not None and snapshot.summary is not None and snapshot.first_row_id is not None
    )
    summary = snapshot.summary.additional_properties
    assert summary["icefall.round-id"] == r2.round_id and summary["added-position-deletes"] == "4"
    assert int(summary.get("added-dvs", "0")) >= 1 and "added-position-delete-files" not in summary
    assert run_round(spark, round_broker, topic).status == "nothing_new"


def test_append_rounds_on_a_v3_table_with_dlq_records(
    spark: Any, round_broker: BrokerProcess
) -> None:
    """An append round on a v3 table is written by Spark (pyiceberg 0.12 writes no v3 manifests);
    a round whose records all go to the DLQ still commits its (empty) snapshot."""
    from confluent_kafka import Producer

    topic = new_topic(
        round_broker,
        partitions=1,
        configs={
            **V3,
            "automq.table.topic.schema.validation": "false",
            "automq.table.topic.partition.by": "[bucket(id, 4)]",
        },
    )
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 12))
    r1 = run_round(
        spark, round_broker, topic, "--in-driver-max-bytes", str(64 << 20)
    )  # decoded in the driver
    assert (r1.status, r1.rows, r1.executor) == ("committed", 12, "driver"), r1.message
    raw = Producer({"bootstrap.servers": round_broker.bootstrap})
    raw.produce(topic, value=b"not avro at all")
    assert raw.flush(30) == 0
    r2 = run_round(spark, round_broker, topic)
    assert (r2.status, r2.rows, r2.dlq_rows) == ("committed", 0, 1), r2.message
    t = table(round_broker, topic)
    assert t.metadata.format_version == 3
    assert sorted(t.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()) == list(
        range(12)
    )
    assert str(t.spec().fields[0].transform) == "bucket[4]"
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import LongType

    bucket = BucketTransform(4).transform(LongType())
    assert r1.data_files == len(
        {bucket(i) for i in range(12)}
    )  # one file per bucket: Spark partitioned the rows
    assert checkpoint.read_checkpoint(t.metadata).offsets == {0: 13}
    from spark_jobs import dlq_reprocess
    from tests.spark_jobs.test_round_dlq import dlq_rows

    code, nothing = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic], spark
    )
    assert code == 0 and (nothing["status"], nothing["still_bad"]) == ("nothing_to_move", 1), (
        nothing
    )
    assert len(dlq_rows(round_broker, topic)) == 1


@pytest.mark.parametrize(
    ("point", "version"),
    [
        ("after_write", "2"),
        ("before_publish", "2"),
        ("after_publish", "2"),
        ("before_publish", "3"),
    ],
)
def test_an_upsert_round_crashing_then_rerun_merges_each_record_once(
    point: str,
    version: str,
    spark: Any,
    round_broker: BrokerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.spark_jobs.test_round_exactly_once import round_branches

    topic = new_topic(
        round_broker, partitions=2, configs={**UPSERT, "automq.table.topic.format.version": version}
    )
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 30), key=lambda c: str(c["id"]))
    run_round(spark, round_broker, topic)
    producer.send(
        [{**c, "score": 1000 + c["id"]} for c in clicks(20, 20)], key=lambda c: str(c["id"])
    )
    before = by_id(round_broker, topic)

    crash_round_at(point, spark, round_broker, topic, monkeypatch)
    if point != "after_publish":
        assert by_id(round_broker, topic) == before and round_branches(round_broker, topic)
    rerun = run_round(spark, round_broker, topic)
    assert rerun.status == ("nothing_new" if point == "after_publish" else "committed"), (
        rerun.message
    )
    state = by_id(round_broker, topic)
    assert {i: s for i, (s, _) in state.items()} == {
        i: (1000 + i if i >= 20 else i) for i in range(40)
    }
    t = table(round_broker, topic)
    offsets = checkpoint.read_checkpoint(t.metadata).offsets
    assert sum(offsets.values()) == 50
    assert len(round_branches(round_broker, topic)) == (
        0 if point == "after_publish" else 1
    )  # the crashed one's


def test_a_concurrent_writer_makes_an_upsert_round_merge_again_on_the_new_main(
    spark: Any, round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = new_topic(round_broker, partitions=1, configs=UPSERT)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 10))
    run_round(spark, round_broker, topic)
    producer.send([{**c, "score": 50} for c in clicks(5, 10)])
    real_publish = commit_round.publish
    calls: list[int] = []

    def publish_after_someone_else(catalog: Any, heads: Any, *args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # e.g. compaction commits to main between our merge and our publish
            with table(round_broker, topic).transaction() as tx, tx.update_snapshot().fast_append():
                pass
        return real_publish(catalog, heads, *args)

    monkeypatch.setattr(commit_round, "publish", publish_after_someone_else)
    result = run_round(spark, round_broker, topic)
    assert result.status == "committed" and result.attempts == 2, result
    assert {i: s for i, (s, _) in by_id(round_broker, topic).items()} == {
        i: (50 if i >= 5 else i) for i in range(15)
    }


ROW: dict[str, Any] = {
    "type": "record",
    "name": "Value",
    "namespace": "dbserver1.inventory.customers",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "email", "type": ["null", "string"], "default": None},
    ],
}
ENVELOPE: dict[str, Any] = {  # the shape Debezium's Avro converter registers for a table
    "type": "record",
    "name": "Envelope",
    "namespace": "dbserver1.inventory.customers",
    "fields": [
        {"name": "before", "type": ["null", ROW], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "namespace": "io.debezium.connector.mysql",
                "fields": [
                    {"name": "connector", "type": "string"},
                    {"name": "db", "type": "string"},
                    {"name": "table", "type": ["null", "string"], "default": None},
                ],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}


def change(
    op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, ts: int
) -> dict[str, Any]:
    source = {"connector": "mysql", "db": "inventory", "table": "customers"}
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": ts}


def test_debezium_envelopes_flatten_to_rows_with_cdc_metadata(
    spark: Any, round_broker: BrokerProcess
) -> None:
    from confluent_kafka import Producer

    topic = new_topic(
        round_broker,
        partitions=1,
        configs={
            "automq.table.topic.transform.value.type": "flatten_debezium",
            "automq.table.topic.id.columns": "[id]",
            "automq.table.topic.schema.validation": "false",
        },
    )
    producer = AvroProducer(round_broker, topic, ENVELOPE)

    def row(i: int, email: str | None = None) -> dict[str, Any]:
        return {"id": i, "email": email or f"u{i}@example.com"}

    producer.send(
        [
            change("r", None, row(1), 1000),
            change("c", None, row(2), 1001),
            change("c", None, row(3), 1002),
            change("u", row(2), row(2, "new@example.com"), 1003),
            change("d", row(3), None, 1004),
        ],
        key=lambda v: str((v["after"] or v["before"])["id"]),
    )
    raw = Producer({"bootstrap.servers": round_broker.bootstrap})
    raw.produce(topic, key=b"3", value=None)  # Debezium's tombstone after a delete
    raw.produce(
        topic, key=b"9", value=b"not an envelope"
    )  # undecodable: the DLQ, in the same commit
    assert raw.flush(30) == 0
    result = run_round(spark, round_broker, topic)
    assert (result.status, result.rows, result.dlq_rows, result.records) == (
        "committed",
        6,
        1,
        7,
    ), result.message
    t = table(round_broker, topic)
    assert [f.name for f in t.schema().fields][3:] == ["id", "email", "_cdc"]
    rows = sorted(
        t.scan(selected_fields=("id", "email", "_cdc")).to_arrow().to_pylist(),
        key=lambda r: r["id"],
    )
    assert [(r["id"], r["email"], r["_cdc"]["op"], r["_cdc"]["offset"]) for r in rows] == [
        (1, "u1@example.com", "r", 0),
        (2, "new@example.com", "u", 3),
    ]
    assert rows[1]["_cdc"]["ts"].timestamp() == 1.003
    assert '"db":"inventory"' in rows[1]["_cdc"]["source"]

    producer.send(
        [change("d", row(1), None, 2000), change("c", None, row(4), 2001)],
        key=lambda v: str((v["after"] or v["before"])["id"]),
    )
    assert run_round(spark, round_broker, topic).status == "committed"
    name = commit_round.use_catalog(spark, round_broker.catalog_url)
    got = sorted(
        (r["id"], r["op"])
        for r in spark.sql(f"SELECT id, _cdc.op AS op FROM {name}.default.{topic}").collect()
    )
    assert got == [(2, "u"), (4, "c")]


def test_a_merge_snapshot_without_the_offsets_is_never_published(
    spark: Any, round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If Iceberg's CommitMetadata did not reach the MERGE's commit (another JVM thread), the
    checkpoint would stay behind and the next round would merge the records again: refuse."""
    topic = new_topic(round_broker, partitions=1, configs=UPSERT)
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 5))
    monkeypatch.setattr(
        upsert, "with_commit_properties", lambda spark, properties, action: action()
    )
    result = run_round(spark, round_broker, topic)
    assert result.status == "failed" and "does not carry its offsets" in result.message, (
        result.message
    )
    t = table(round_broker, topic)
    assert (
        t.scan().to_arrow().num_rows == 0 and checkpoint.read_checkpoint(t.metadata).offsets == {}
    )
    monkeypatch.undo()
    assert run_round(spark, round_broker, topic).status == "committed"
    assert sorted(by_id(round_broker, topic)) == list(range(5))


def test_reprocess_of_a_cdc_table_leaves_a_record_without_an_operation_in_the_dlq(
    spark: Any, round_broker: BrokerProcess
) -> None:
    """A DLQ record that decodes now but has no I/U/D op stays in the DLQ; it does not block the others."""
    from spark_jobs import dlq_reprocess
    from tests.spark_jobs.test_round_dlq import LateSchema, dlq_rows

    topic = new_topic(
        round_broker,
        partitions=1,
        configs={
            "automq.table.topic.cdc.field": "op",
            "automq.table.topic.id.columns": "[id]",
            "automq.table.topic.schema.validation": "false",
        },
    )
    AvroProducer(round_broker, topic, CDC_V1).send([{**c, "op": "I"} for c in clicks(0, 3)])
    late = LateSchema(round_broker, topic, CDC_V1)
    late.send(
        [{**c, "op": "U", "score": 50} for c in clicks(1, 1)]
        + [{**c, "op": "?"} for c in clicks(2, 1)]
    )
    assert run_round(spark, round_broker, topic).dlq_rows == 2
    late.register()
    code, result = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic], spark
    )
    assert code == 0 and (result["moved"], result["still_bad"], result["moved_offsets"]) == (
        1,
        1,
        {"0": [3]},
    ), result
    assert [r["offset"] for r in dlq_rows(round_broker, topic)] == [4]
    assert {i: s for i, (s, _) in by_id(round_broker, topic).items()} == {0: 0, 1: 50, 2: 2}
