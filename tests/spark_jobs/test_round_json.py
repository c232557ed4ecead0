"""``convert.value.type=json``: columns inferred from JSON values and evolved round by round
(``spark_jobs.decode.json_values``); values that are not JSON objects or do not fit go to the DLQ."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Producer

from tests.spark_jobs.round_support import new_topic, run_round, table
from tests.spark_jobs.test_round_dlq import dlq_rows
from tests.support import BrokerProcess

JSON = {
    "automq.table.topic.convert.value.type": "json",
    "automq.table.topic.schema.validation": "false",
}


def send(broker: BrokerProcess, topic: str, values: list[Any]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for value in values:
        data = value if isinstance(value, bytes) or value is None else json.dumps(value).encode()
        producer.produce(topic, value=data, key=b"k")
    assert producer.flush(30) == 0


def test_json_columns_are_inferred_then_evolved_and_bad_values_go_to_the_dlq(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(round_broker, partitions=1, configs=JSON)
    send(
        round_broker,
        topic,
        [
            {"id": 1, "name": "a", "score": 1.5, "ok": True},
            {"id": 2, "name": "b", "tags": ["x", "y"], "score": 2, "later": None},
            {"id": 3, "geo": {"lat": 1.25, "country": "SE"}},
            b"not json",
            b"[1, 2]",
            b"{broken",
            b"42",
        ],
    )
    r1 = run_round(spark, round_broker, topic)
    assert (r1.status, r1.rows, r1.dlq_rows, r1.records) == ("committed", 3, 4, 7), r1.message
    t = table(round_broker, topic)
    types = {f.name: str(f.field_type) for f in t.schema().fields}
    assert {k: v for k, v in types.items() if not k.startswith("_kafka")} == {
        "geo": f"struct<{t.schema().find_field('geo.country').field_id}: country: optional string, "
        f"{t.schema().find_field('geo.lat').field_id}: lat: optional double>",
        "id": "long",
        "name": "string",
        "ok": "boolean",
        "score": "double",
        "tags": types["tags"],
    }
    assert types["tags"].startswith("list<") and "later" not in types  # all-null: no column yet
    assert [(r["offset"], r["error_class"]) for r in dlq_rows(round_broker, topic)] == [
        (3, "InvalidJson"),
        (4, "InvalidJson"),
        (5, "InvalidJson"),
        (6, "InvalidJson"),
    ]
    rows = sorted(t.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["score"], r["tags"], r["geo"]) for r in rows] == [
        (1, 1.5, None, None),
        (2, 2.0, ["x", "y"], None),
        (3, None, None, {"country": "SE", "lat": 1.25}),
    ]

    send(
        round_broker,
        topic,
        [{"id": 4, "geo": {"country": "NO", "city": "Oslo"}, "later": "now", "score": 3}],
    )
    r2 = run_round(spark, round_broker, topic)
    assert r2.status == "committed" and r2.rows == 1, r2.message
    assert any("geo.city" in c for c in r2.schema_changes) and any(
        "later" in c for c in r2.schema_changes
    )
    row = next(r for r in table(round_broker, topic).scan().to_arrow().to_pylist() if r["id"] == 4)
    assert (row["geo"]["city"], row["later"], row["score"]) == ("Oslo", "now", 3.0)

    send(round_broker, topic, [{"id": "five"}, {"id": 6}])  # a string where the table has a long
    failed = run_round(spark, round_broker, topic)
    assert failed.status == "failed" and "offset 8: JsonDoesNotFit" in failed.message, (
        failed.message
    )
    assert len(table(round_broker, topic).scan().to_arrow()) == 4


def test_json_values_that_do_not_fit_go_to_the_dlq_with_tolerance_all(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(
        round_broker, partitions=1, configs={**JSON, "automq.table.topic.errors.tolerance": "all"}
    )
    send(round_broker, topic, [{"n": 1}])
    assert run_round(spark, round_broker, topic).status == "committed"
    send(
        round_broker, topic, [{"n": 1.5}, {"n": "x"}, {"n": 2}, None]
    )  # None: a tombstone, a row of nulls
    r2 = run_round(spark, round_broker, topic)
    assert (r2.status, r2.rows, r2.dlq_rows, r2.records) == ("committed", 2, 2, 4), r2.message
    assert [(r["offset"], r["error_class"], r["value"]) for r in dlq_rows(round_broker, topic)] == [
        (1, "JsonDoesNotFit", b'{"n": 1.5}'),
        (2, "JsonDoesNotFit", b'{"n": "x"}'),
    ]
    got = sorted(
        (r["_kafka_metadata"]["offset"], r["n"])
        for r in table(round_broker, topic).scan().to_arrow().to_pylist()
    )
    assert got == [(0, 1), (3, 2), (4, None)]
    send(round_broker, topic, [b"nope"])  # a round with no row to write still moves the offsets
    r3 = run_round(spark, round_broker, topic)
    assert (r3.status, r3.rows, r3.dlq_rows, r3.offsets_after) == ("committed", 0, 1, {0: 6}), (
        r3.message
    )
    assert run_round(spark, round_broker, topic).status == "nothing_new"
    from spark_jobs import dlq_reprocess

    code, refused = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic], spark
    )
    assert code == 1 and "convert.value.type=json" in refused["message"], refused
    assert len(dlq_rows(round_broker, topic)) == 3


def test_json_upsert_merges_by_id(spark: Any, round_broker: BrokerProcess) -> None:
    topic = new_topic(
        round_broker,
        partitions=1,
        configs={
            **JSON,
            "automq.table.topic.upsert.enable": "true",
            "automq.table.topic.id.columns": "[id]",
        },
    )
    send(round_broker, topic, [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 1, "v": "c"}])
    assert run_round(spark, round_broker, topic).status == "committed"
    send(round_broker, topic, [{"id": 2, "v": "d", "w": 1}])
    assert run_round(spark, round_broker, topic).status == "committed"
    got = sorted(
        (r["id"], r["v"], r["w"]) for r in table(round_broker, topic).scan().to_arrow().to_pylist()
    )
    assert got == [(1, "c", None), (2, "d", 1)]


def test_debezium_json_envelopes(spark: Any, round_broker: BrokerProcess) -> None:
    """Debezium's JsonConverter (schemas.enable=false) envelopes, hand-built."""
    topic = new_topic(
        round_broker,
        partitions=1,
        configs={
            **JSON,
            "automq.table.topic.transform.value.type": "flatten_debezium",
            "automq.table.topic.id.columns": "[id]",
        },
    )
    source = {"connector": "postgresql", "db": "shop", "table": "orders", "lsn": 123}

    def env(
        op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, ts: int
    ) -> dict[str, Any]:
        return {"before": before, "after": after, "source": source, "op": op, "ts_ms": ts}

    send(
        round_broker,
        topic,
        [
            env("r", None, {"id": 1, "total": 10.5}, 1),
            env("c", None, {"id": 2, "total": 3}, 2),
            env("u", {"id": 1, "total": 10.5}, {"id": 1, "total": 11.0, "note": "gift"}, 3),
            env("d", {"id": 2, "total": 3}, None, 4),
        ],
    )
    tombstone = Producer({"bootstrap.servers": round_broker.bootstrap})
    tombstone.produce(
        topic, key=b"2", value=None
    )  # Debezium's tombstone after the delete, keyed by the id
    assert tombstone.flush(30) == 0
    send(round_broker, topic, [b"{oops"])
    result = run_round(spark, round_broker, topic)
    assert (result.status, result.rows, result.dlq_rows) == ("committed", 5, 1), result.message
    rows = table(round_broker, topic).scan().to_arrow().to_pylist()
    assert [
        (r["id"], r["total"], r["note"], r["_cdc"]["op"], r["_cdc"]["offset"]) for r in rows
    ] == [(1, 11.0, "gift", "u", 2)]
    assert (
        json.loads(rows[0]["_cdc"]["source"]) == source
        and rows[0]["_cdc"]["ts"].timestamp() == 0.003
    )
    send(round_broker, topic, [env("d", {"id": 1, "total": 11.0, "note": "gift"}, None, 5)])
    assert run_round(spark, round_broker, topic).status == "committed"
    assert table(round_broker, topic).scan().to_arrow().num_rows == 0


def test_json_upsert_rounds_on_a_v3_table(spark: Any, round_broker: BrokerProcess) -> None:
    """JSON values, upserted by id into a format v3 table: inferred, evolved, merged by Spark."""
    topic = new_topic(
        round_broker,
        partitions=1,
        configs={
            **JSON,
            "automq.table.topic.format.version": "3",
            "automq.table.topic.upsert.enable": "true",
            "automq.table.topic.id.columns": "[id]",
        },
    )
    send(round_broker, topic, [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 1, "v": "c"}])
    r1 = run_round(spark, round_broker, topic)
    assert (r1.status, r1.rows) == ("committed", 3), r1.message
    send(round_broker, topic, [{"id": 2, "v": "d", "extra": 7}])
    r2 = run_round(spark, round_broker, topic)
    assert r2.status == "committed" and any("extra" in c for c in r2.schema_changes), r2.message
    t = table(round_broker, topic)
    assert t.metadata.format_version == 3
    rows = t.scan(selected_fields=("id", "v", "extra")).to_arrow().to_pylist()
    assert sorted((r["id"], r["v"], r["extra"]) for r in rows) == [(1, "c", None), (2, "d", 7)]
