"""Bad records and ``errors.tolerance``: a mixed batch of good and bad records,
counted in the table and the DLQ table (``<table>__dlq``, same commit). The gate
is off on these topics so the broker accepts what the round must sort out."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from spark_jobs.broker_client import http_json
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    catalog,
    new_topic,
    run_round,
    table,
    table_offsets,
)
from tests.spark_jobs.test_commit_round import clicks
from tests.support import BrokerProcess, present, wait_for

GATE_OFF = {"automq.table.topic.schema.validation": "false"}


def mixed(broker: BrokerProcess, topic: str) -> tuple[AvroProducer, dict[int, bytes | None]]:
    """10 good records, then garbage, a wrong magic byte, an unknown schema id, a tombstone, 5 more good.
    Returns the producer and the bad records by offset (one partition)."""
    good = AvroProducer(broker, topic, CLICK_V1)
    good.send(clicks(0, 10))
    bad_values: list[bytes | None] = [
        b"not avro at all",
        b"\x01\x00\x00\x00\x01abc",
        b"\x00\x7f\xff\xff\xf0xx",
        None,
    ]
    raw = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for value in bad_values:
        raw.produce(topic, value=value, key=b"bad")
    assert raw.flush(30) == 0
    good.send(clicks(10, 5))
    return good, {10 + i: v for i, v in enumerate(bad_values)}


def dlq_rows(broker: BrokerProcess, topic: str) -> list[dict[str, Any]]:
    return sorted(
        table(broker, f"{topic}__dlq").scan().to_arrow().to_pylist(), key=lambda r: r["offset"]
    )


def test_invalid_data_goes_to_the_dlq_in_the_same_commit(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(round_broker, partitions=1, configs=GATE_OFF)
    _, bad = mixed(round_broker, topic)
    result = run_round(spark, round_broker, topic)
    assert result.status == "committed", result.message
    assert (result.rows, result.dlq_rows, result.records) == (15, 4, 19)
    rows = dlq_rows(round_broker, topic)
    assert [r["offset"] for r in rows] == sorted(bad)
    assert [r["value"] for r in rows] == [bad[o] for o in sorted(bad)]
    assert [r["error_class"] for r in rows] == [
        "MissingWireHeader",
        "MissingWireHeader",
        "UnknownSchema",
        "NullInRequiredColumn",
    ]
    assert all(
        r["round_id"] == result.round_id and r["topic"] == topic and r["key"] == b"bad"
        for r in rows
    )
    assert "tombstone" in rows[-1]["error_message"]
    good_offsets = [o for _, o in table_offsets(round_broker, topic)]
    assert sorted(good_offsets + [r["offset"] for r in rows]) == list(
        range(19)
    )  # table + DLQ = the range
    dlq_table = table(round_broker, f"{topic}__dlq")
    main_table = table(round_broker, topic)
    assert main_table.current_snapshot() is not None
    assert (
        present(present(dlq_table.current_snapshot()).summary)["icefall.round-id"]
        == result.round_id
    )
    assert run_round(spark, round_broker, topic).status == "nothing_new"
    assert len(dlq_rows(round_broker, topic)) == 4


def test_tolerance_none_fails_naming_the_first_bad_record(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(
        round_broker,
        partitions=1,
        configs={**GATE_OFF, "automq.table.topic.errors.tolerance": "none"},
    )
    mixed(round_broker, topic)
    result = run_round(spark, round_broker, topic)
    assert result.status == "failed"
    assert (
        "partition 0 offset 10: MissingWireHeader" in result.message
        and "errors.tolerance=none" in result.message
    )
    assert table_offsets(round_broker, topic) == []
    assert not catalog(round_broker).table_exists(("default", f"{topic}__dlq"))


def test_only_bad_records_still_move_the_offsets(spark: Any, round_broker: BrokerProcess) -> None:
    topic = new_topic(
        round_broker,
        partitions=1,
        configs={**GATE_OFF, "automq.table.topic.convert.value.type": "string"},
    )
    raw = Producer({"bootstrap.servers": round_broker.bootstrap})
    for _ in range(3):
        raw.produce(topic, value=b"\xff\xfe not utf-8")
    assert raw.flush(30) == 0
    result = run_round(spark, round_broker, topic)
    assert (result.status, result.rows, result.dlq_rows) == ("committed", 0, 3), result.message
    assert result.offsets_after == {0: 3}
    assert run_round(spark, round_broker, topic).status == "nothing_new"
    assert [r["error_class"] for r in dlq_rows(round_broker, topic)] == ["InvalidUtf8"] * 3


@pytest.mark.parametrize("tolerance", ["invalid_data", "all"])
def test_records_that_do_not_fit_the_table_need_tolerance_all(
    tolerance: str, spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(
        round_broker,
        partitions=1,
        configs={**GATE_OFF, "automq.table.topic.errors.tolerance": tolerance},
    )
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 4))
    http_json(f"{round_broker.registry_url}/config/{topic}-value", "PUT", {"compatibility": "NONE"})
    incompatible = json.loads(json.dumps(CLICK_V1))
    incompatible["fields"][1] = {"name": "page", "type": "long"}
    AvroProducer(round_broker, topic, incompatible).send([{**c, "page": 1} for c in clicks(4, 2)])
    result = run_round(spark, round_broker, topic)
    if tolerance == "invalid_data":
        assert result.status == "failed" and "IncompatibleSchema" in result.message
        assert (
            not catalog(round_broker).table_exists(("default", topic))
            or table_offsets(round_broker, topic) == []
        )
    else:
        assert (result.status, result.rows, result.dlq_rows) == ("committed", 4, 2), result.message
        assert [r["offset"] for r in dlq_rows(round_broker, topic)] == [4, 5]


class LateSchema:
    """Records written with the schema id the registry will give the next new schema, before it is
    registered: undecodable (they go to the DLQ) until ``register`` makes them decode. ``base``
    (default ``CLICK_V1``) plus an optional ``campaign``."""

    def __init__(self, broker: BrokerProcess, topic: str, base: dict[str, Any] = CLICK_V1) -> None:
        self.broker, self.topic = broker, topic
        self.schema = json.loads(json.dumps(base))
        self.schema["fields"].append(
            {"name": "campaign", "type": ["null", "string"], "default": None}
        )
        self.schema["namespace"] = (
            f"icefall.test.{topic}"  # the registry gives the same text the same id
        )
        probe = http_json(
            f"{broker.registry_url}/subjects/{topic}-probe-value/versions",
            "POST",
            {"schema": json.dumps({"type": "record", "name": f"Probe{topic}", "fields": []})},
        )
        self.schema_id = probe["id"] + 1  # ids are global: the next new schema gets this one

    def send(self, values: list[dict[str, Any]], key: Any = None) -> None:
        import io
        import struct

        from fastavro import parse_schema, schemaless_writer

        raw = Producer({"bootstrap.servers": self.broker.bootstrap, "enable.idempotence": True})
        for value in values:
            body = io.BytesIO()
            body.write(b"\x00" + struct.pack(">I", self.schema_id))
            schemaless_writer(
                body,
                parse_schema(self.schema),
                {**value, "at": int(value["at"].timestamp() * 1000)},
            )
            raw.produce(self.topic, value=body.getvalue(), key=key(value) if callable(key) else key)
        assert raw.flush(30) == 0

    def register(self) -> None:
        registered = http_json(
            f"{self.broker.registry_url}/subjects/{self.topic}-value/versions",
            "POST",
            {"schema": json.dumps(self.schema)},
        )
        assert registered["id"] == self.schema_id


@pytest.mark.parametrize("version", ["2", "3"])
def test_reprocess_moves_records_whose_schema_was_registered_late(
    version: str, spark: Any, round_broker: BrokerProcess
) -> None:
    """Format v2: a pyiceberg append in the driver; v3: the rows staged and appended by Spark."""
    from spark_jobs import dlq_reprocess

    topic = new_topic(
        round_broker,
        partitions=1,
        configs={**GATE_OFF, "automq.table.topic.format.version": version},
    )
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 5))
    late = LateSchema(round_broker, topic)
    late.send(clicks(5, 3, campaign="x"))
    raw = Producer({"bootstrap.servers": round_broker.bootstrap})
    raw.produce(
        topic, value=None, key=b"tombstone"
    )  # offset 8: no row in a table with required columns
    assert raw.flush(30) == 0
    first = run_round(spark, round_broker, topic)
    assert (first.rows, first.dlq_rows) == (5, 4), first.message
    code, nothing = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic], spark
    )
    assert code == 0 and nothing["status"] == "nothing_to_move" and nothing["dlq_rows"] == 4, (
        nothing
    )

    late.register()
    code, moved = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic], spark
    )
    assert (
        code == 0 and moved["status"] == "moved" and (moved["moved"], moved["still_bad"]) == (3, 1)
    ), moved
    assert any("campaign" in change for change in moved["schema_changes"])
    assert [r["offset"] for r in dlq_rows(round_broker, topic)] == [8]
    assert table_offsets(round_broker, topic) == [(0, o) for o in range(8)]
    t = table(round_broker, topic)
    assert t.metadata.format_version == int(version)
    campaigns = t.scan(selected_fields=("id", "campaign")).to_arrow().to_pylist()
    assert sorted((r["id"], r["campaign"]) for r in campaigns) == [(i, None) for i in range(5)] + [
        (i, "x") for i in range(5, 8)
    ]
    code, again = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic], spark
    )
    assert again["status"] == "nothing_to_move" and len(table_offsets(round_broker, topic)) == 8
    producer.send(clicks(9, 2))
    assert run_round(spark, round_broker, topic).offsets_before == {
        0: 9
    }  # the checkpoint is untouched


@pytest.mark.parametrize(("version", "upsert_table"), [("2", False), ("3", False), ("2", True)])
def test_reprocess_after_retention_deleted_the_segments(
    version: str, upsert_table: bool, spark: Any, broker_factory: Callable[..., BrokerProcess]
) -> None:
    """The DLQ's own copy of the records is all that is left: an append table takes them from it;
    an upsert table keeps them in the DLQ (no later records left to tell whether they were replaced)."""
    from spark_jobs import dlq_reprocess

    broker = broker_factory(["--segment-flush-ms", "100", "--retention-check-interval-ms", "200"])
    configs = {
        **GATE_OFF,
        "automq.table.topic.format.version": version,
        "retention.ms": "0",
        "file.delete.delay.ms": "0",
    }
    if upsert_table:
        configs |= {
            "automq.table.topic.upsert.enable": "true",
            "automq.table.topic.id.columns": "[id]",
        }
    topic = new_topic(broker, partitions=1, configs=configs)
    AvroProducer(broker, topic, CLICK_V1).send(clicks(0, 5), key=lambda c: str(c["id"]))
    late = LateSchema(broker, topic)
    late.send(clicks(5, 3, campaign="x"), key=lambda c: str(c["id"]))
    first = run_round(spark, broker, topic)
    assert (first.rows, first.dlq_rows) == (5, 3), first.message
    wait_for(
        lambda: broker.admin(f"/v1/topics/{topic}/plan")["partitions"][0]["log_start_offset"] == 8,
        30,
        what="retention to delete the committed segments",
    )
    late.register()
    code, result = dlq_reprocess.run(["--admin-url", broker.admin_url, "--topic", topic], spark)
    assert code == 0 and result["only_in_dlq"] == 3, result
    if upsert_table:
        assert (result["status"], result["moved"], result["unavailable"]) == (
            "nothing_to_move",
            0,
            3,
        ), result
        assert "retention deleted their segments" in result["message"]
        assert [r["offset"] for r in dlq_rows(broker, topic)] == [5, 6, 7]
        return
    assert (result["status"], result["moved"], result["still_bad"]) == ("moved", 3, 0), result
    assert dlq_rows(broker, topic) == []
    rows = table(broker, topic).scan().to_arrow().to_pylist()
    assert sorted(
        (r["_kafka_metadata"]["offset"], r["id"], r["campaign"], r["_kafka_key"]) for r in rows
    ) == [(i, i, "x" if i >= 5 else None, str(i)) for i in range(8)]


def test_reprocess_refuses_when_more_records_fail_than_it_keeps(
    spark: Any, round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failures past the kept maximum are only counted: they must not pass for records that decode."""
    from spark_jobs import dlq_reprocess
    from spark_jobs.rounds import tasks as round_tasks

    topic = new_topic(
        round_broker, partitions=1, configs={**GATE_OFF, "automq.table.topic.format.version": "3"}
    )
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 2))
    LateSchema(round_broker, topic).send(clicks(2, 3))  # never registered: they keep failing
    assert run_round(spark, round_broker, topic).dlq_rows == 3
    monkeypatch.setattr(round_tasks, "MAX_ERRORS_KEPT", 1)
    code, result = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic], spark
    )
    assert code == 1 and "still fail; nothing moved" in result["message"], result
    assert [r["offset"] for r in dlq_rows(round_broker, topic)] == [2, 3, 4]
