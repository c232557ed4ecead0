"""``automq.table.topic.partition.by``: the table's spec follows the config, rows land in
partitioned data files, and changing the config evolves the spec at the next round."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from broker import checkpoint
from broker.topic_configs import PARTITION_BY
from spark_jobs.rounds import event_time, partitioning, tasks
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


def _hour(h: int, minute: int = 0) -> datetime:
    return datetime(2026, 1, 1, h, minute, tzinfo=UTC)


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def test_event_time_range_watermark_and_closed_hours(
    spark: Any, round_broker: BrokerProcess
) -> None:
    """Partitioned by ``hour(at)``: each round reports its rows' range of ``at``, and an hour closes
    once, in the round whose rows move every partition's watermark past its end; a late row is
    written and reported, its hour not closed again; the state rides in the snapshot summary."""
    topic = new_topic(round_broker, partitions=2, configs={PARTITION_BY: "[hour(at)]"})
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    in_driver = ("--in-driver-max-bytes", str(1 << 20))

    def send(partition: int, *times: datetime) -> None:
        producer.send([{**clicks(0, 1)[0], "at": at} for at in times], partition=partition)

    send(0, _hour(10, 5), _hour(11, 10))
    send(1, _hour(10, 20))
    first = run_round(spark, round_broker, topic, *in_driver)
    assert first.status == "committed" and first.rows == 3, first.message
    assert (first.event_time_column, first.event_time_granularity) == ("at", "hour")
    assert (first.event_time_min_ms, first.event_time_max_ms) == (
        _ms(_hour(10, 5)),
        _ms(_hour(11, 10)),
    )
    assert first.watermarks == {0: _ms(_hour(11, 10)), 1: _ms(_hour(10, 20))}
    # both partitions are caught up (idle): the watermark is the largest
    assert (first.watermark_before_ms, first.watermark_ms) == (None, _ms(_hour(11, 10)))
    assert first.closed_windows == [_ms(_hour(10))] and first.late_windows == []
    summary = checkpoint.summary_properties(table(round_broker, topic).current_snapshot())
    assert summary[event_time.CLOSED] == f"[{_ms(_hour(10))}]"
    assert summary[event_time.OPEN] == f"[{_ms(_hour(11))}]"

    assert run_round(spark, round_broker, topic, *in_driver).status == "nothing_new"

    send(1, _hour(11, 30))
    send(0, _hour(10, 40))  # late: hour 10 is closed
    second = run_round(spark, round_broker, topic, *in_driver)
    assert second.watermark_ms == _ms(_hour(11, 30)) and second.closed_windows == []
    assert second.late_windows == [_ms(_hour(10))]

    send(0, _hour(12, 1))
    third = run_round(spark, round_broker, topic, *in_driver)
    assert third.closed_windows == [_ms(_hour(11))], third
    assert third.watermark_before_ms == _ms(_hour(11, 30))
    assert table(round_broker, topic).scan().to_arrow().num_rows == 6


def test_day_windows_of_a_date_column(spark: Any, round_broker: BrokerProcess) -> None:
    """Partitioned by ``day(on)`` of an Avro ``date`` (Arrow date32): the round reports the days'
    range in ms and closes the day its rows moved past (date32 has no cast to int64 in Arrow:
    this round failed before ``observe`` widened it by way of int32)."""
    schema = {
        **CLICK_V1,
        "fields": [
            *CLICK_V1["fields"],
            {"name": "on", "type": {"type": "int", "logicalType": "date"}},
        ],
    }
    topic = new_topic(round_broker, partitions=1, configs={PARTITION_BY: "[day(on)]"})
    producer = AvroProducer(round_broker, topic, schema)
    days = [date(1969, 12, 31), date(2026, 1, 2)]
    producer.send([{**clicks(i, 1)[0], "on": day} for i, day in enumerate(days)])
    done = run_round(spark, round_broker, topic, "--in-driver-max-bytes", str(1 << 20))
    assert done.status == "committed" and done.rows == 2, done.message
    assert (done.event_time_column, done.event_time_granularity) == ("on", "day")
    day_ms = [_ms(datetime(d.year, d.month, d.day, tzinfo=UTC)) for d in days]
    assert (done.event_time_min_ms, done.event_time_max_ms) == (day_ms[0], day_ms[1])
    assert done.closed_windows == [day_ms[0]]


def test_an_in_driver_round_writes_a_partitioned_table_in_slices(
    round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partitioned table's rows reach pyiceberg a bounded slice at a time (not the whole round
    in memory): with slices of one decoded chunk (one Kafka partition's records here), the round
    writes a file per hour per slice, 3 where one table of the round would give 2, every row once
    and all in one snapshot."""
    monkeypatch.setattr(tasks, "PARTITIONED_SLICE_BYTES", 1)
    topic = new_topic(round_broker, partitions=2, configs={PARTITION_BY: "[hour(at)]"})
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    hours = {
        0: [_hour(10, m) for m in range(0, 60, 6)] + [_hour(11, 5)] * 7,
        1: [_hour(10, 30)] * 5,
    }
    for partition, times in hours.items():
        producer.send([{**clicks(0, 1)[0], "at": at} for at in times], partition=partition)
    result = run_round(None, round_broker, topic, "--in-driver-max-bytes", str(1 << 20))
    assert (result.status, result.executor, result.rows) == ("committed", "driver", 22), result
    assert result.data_files >= 3, result
    tbl = table(round_broker, topic)
    files = tbl.inspect.files().to_pylist()
    assert len(files) == result.data_files == len({f["file_path"] for f in files})
    per_hour: dict[int, int] = {}
    for f in files:
        hour = f["partition"]["at_hour"]
        per_hour[hour] = per_hour.get(hour, 0) + f["record_count"]
    hour_10 = int(_hour(10).timestamp()) // 3600
    assert per_hour == {hour_10: 15, hour_10 + 1: 7}
    assert len(tbl.snapshots()) == 2  # the table's first (empty) snapshot, then the round's one
    assert table_offsets(round_broker, topic) == sorted(producer.acked)


def test_the_watermark_waits_for_partitions_that_are_behind() -> None:
    spec = event_time.EventTimeSpec("at", "hour")
    seen = event_time.Observed({0: (_ms(_hour(10)), _ms(_hour(11, 5)))}, {_ms(_hour(10))})
    # partition 1 is behind (not idle) and has committed nothing: no watermark yet
    step = event_time.advance(event_time.State(), spec, seen, [0, 1], idle={0})
    assert step.after.watermark is None and step.closed == []
    assert step.after.open_windows == (_ms(_hour(10)),)
    later = event_time.Observed({1: (_ms(_hour(10, 30)), _ms(_hour(10, 30)))}, {_ms(_hour(10))})
    step = event_time.advance(step.after, spec, later, [0, 1], idle=set())
    assert step.after.watermark == _ms(_hour(10, 30)) and step.closed == []
    assert event_time.State.from_summary(step.summary(spec)) == step.after
    caught_up = event_time.advance(step.after, spec, event_time.Observed(), [0, 1], idle={1})
    assert caught_up.after.watermark == _ms(_hour(11, 5)) and caught_up.closed == [_ms(_hour(10))]
