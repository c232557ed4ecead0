"""Table maintenance (``spark_jobs/maintenance.py``): Iceberg's Spark procedures on a
table made of many small commit rounds. Compaction keeps the rows, expiry keeps the
exactly-once checkpoint, orphan removal spares young files. One broker and one Spark
session for the module (conftest); one process run as Airflow runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from broker import checkpoint
from spark_jobs import commit_round, maintenance
from spark_jobs.maintain import summary as maintenance_summary
from spark_jobs.maintain.settings import (
    MIB,
    S3_TABLES_TARGET_FILE_SIZE_BYTES,
    parse_actions,
    resolve,
)
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    catalog,
    new_topic,
    run_round,
    table,
    table_offsets,
    tables_catalog,
)
from tests.spark_jobs.test_commit_round import clicks
from tests.support import REPO, BrokerProcess

HOUR_MS = 3_600_000
DAY_S = 86_400


def maintain(
    spark: Any, broker: BrokerProcess, topic: str, *extra: str, result: Path | None = None
) -> maintenance.MaintenanceResult:
    argv = ["--admin-url", broker.admin_url, "--topic", topic, *extra]
    code, out = maintenance.run(argv + (["--result", str(result)] if result else []), spark)
    assert code == (1 if out.status == "failed" else 0)
    assert out.status != "failed", out.message
    return out


def rounds(
    spark: Any,
    broker: BrokerProcess,
    topic: str,
    producer: AvroProducer,
    n: int,
    per_round: int,
    start: int = 0,
) -> int:
    for i in range(n):
        producer.send(clicks(start + i * per_round, per_round))
        assert run_round(spark, broker, topic).status == "committed"
    return start + n * per_round


def spark_rows(spark: Any, broker: BrokerProcess, topic: str) -> list[tuple[int, int, int]]:
    name = commit_round.use_catalog(spark, tables_catalog(broker))
    return sorted(
        (r["p"], r["o"], r["id"])
        for r in spark.sql(
            f"SELECT _kafka_metadata.partition AS p, _kafka_metadata.offset AS o, id FROM {name}.default.{topic}"
        ).collect()
    )


def pyiceberg_rows(broker: BrokerProcess, topic: str) -> list[tuple[int, int, int]]:
    rows = (
        table(broker, topic).scan(selected_fields=("_kafka_metadata", "id")).to_arrow().to_pylist()
    )
    return sorted(
        (r["_kafka_metadata"]["partition"], r["_kafka_metadata"]["offset"], r["id"]) for r in rows
    )


def data_file_count(broker: BrokerProcess, topic: str) -> int:
    return len(table(broker, topic).inspect.files())


def test_compaction_then_expiry_keeps_rows_and_the_checkpoint(
    spark: Any, round_broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = new_topic(round_broker, partitions=2)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    sent = rounds(spark, round_broker, topic, producer, 6, 40)
    files_before = data_file_count(round_broker, topic)
    rows_before = pyiceberg_rows(round_broker, topic)
    assert files_before >= 6 and len(rows_before) == sent
    checkpoint_before = checkpoint.read_checkpoint(table(round_broker, topic).metadata)

    # compaction (+ manifests): fewer files, same rows for pyiceberg and Spark
    out = maintain(
        spark, round_broker, topic, "--actions", "compact,manifests", result=tmp_path / "m.json"
    )
    assert out.status == "done" and out.result is not None
    compact = out.result.actions["compact"]
    assert (
        compact["strategy"] == "binpack"
        and compact["target_file_size_bytes"] == S3_TABLES_TARGET_FILE_SIZE_BYTES
    )
    assert (
        compact["rewritten_data_files"] == files_before
        and 1 <= compact["added_data_files"] < files_before
    )
    assert compact["rewritten_bytes"] > 0
    assert out.result.actions["manifests"]["rewritten_manifests"] >= 1
    assert data_file_count(round_broker, topic) == compact["added_data_files"]
    assert out.result.data_files_before == files_before
    assert out.result.data_files_after == compact["added_data_files"]
    assert (
        pyiceberg_rows(round_broker, topic) == rows_before == spark_rows(spark, round_broker, topic)
    )
    written = json.loads((tmp_path / "m.json").read_text())
    assert written["status"] == "done" and written["snapshot_id"] == out.result.snapshot_id
    assert written["snapshot_id"] != written["snapshot_id_before"]
    assert written["per_action"]["compact"]["added_data_files"] == compact["added_data_files"]
    assert {"compact", "manifests", "total"} <= written["seconds"].keys()
    assert written["settings"]["sources"]["retain_last"].startswith("topic config")
    assert written["dlq"] is None
    tbl = table(round_broker, topic)
    assert tbl.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
    assert checkpoint.read_checkpoint(tbl.metadata) == checkpoint_before

    # expiry of everything but the newest snapshot: the tagged checkpoint survives
    now_ms = int(time.time() * 1000) + 2 * HOUR_MS  # past the topic's 1 h
    out = maintain(spark, round_broker, topic, "--actions", "expire", "--now-ms", str(now_ms))
    assert out.result is not None
    expire = out.result.actions["expire"]
    assert expire["retain_last"] == 1 and expire["older_than_ms"] == now_ms - HOUR_MS
    assert (
        expire["snapshots_expired"] >= 6
    )  # base, rounds 1-5, the compaction before rewrite_manifests
    tbl = table(round_broker, topic)
    kept = {s.snapshot_id for s in tbl.metadata.snapshots}
    assert kept == {
        tbl.current_snapshot().snapshot_id,  # type: ignore[union-attr]
        tbl.metadata.refs[checkpoint.CHECKPOINT_TAG].snapshot_id,
    }
    assert expire["deleted_data_files"] == 0  # the tagged snapshot still holds the small files
    assert checkpoint.read_checkpoint(tbl.metadata).offsets == checkpoint_before.offsets
    assert pyiceberg_rows(round_broker, topic) == rows_before

    # the next round starts where the last one stopped and commits only the new records
    producer.send(clicks(sent, 25))
    nxt = run_round(spark, round_broker, topic)
    assert (
        nxt.status == "committed"
        and nxt.rows == 25
        and nxt.offsets_before == checkpoint_before.offsets
    )
    assert table_offsets(round_broker, topic) == sorted(producer.acked)
    assert pyiceberg_rows(round_broker, topic) == spark_rows(spark, round_broker, topic)

    # once the tag has moved on, the next expiry deletes the compacted-away files
    out = maintain(
        spark, round_broker, topic, "--actions", "expire", "--now-ms", str(now_ms + 1000)
    )
    assert (
        out.result is not None
        and out.result.actions["expire"]["deleted_data_files"] == files_before
    )
    assert all(
        Path(p.removeprefix("file:")).exists() or p.startswith("s3")
        for p in table(round_broker, topic).inspect.files().column("file_path").to_pylist()
    )
    assert table_offsets(round_broker, topic) == sorted(producer.acked)


def test_orphan_files_older_than_the_threshold_are_removed_young_ones_kept(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(round_broker, partitions=1)
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 30))
    assert run_round(spark, round_broker, topic).status == "committed"
    tbl = table(round_broker, topic)
    data_dir = Path(tbl.location().removeprefix("file://").removeprefix("file:")) / "data"
    referenced = set(tbl.inspect.files().column("file_path").to_pylist())
    old, young = data_dir / "stray-old.parquet", data_dir / "stray-young.parquet"
    for stray in (old, young):
        stray.write_bytes(b"not referenced by any snapshot")
    four_days_ago = time.time() - 4 * DAY_S
    os.utime(old, (four_days_ago, four_days_ago))
    old_referenced = Path(next(iter(referenced)).removeprefix("file://").removeprefix("file:"))
    os.utime(old_referenced, (four_days_ago, four_days_ago))  # old but referenced: stays

    out = maintain(spark, round_broker, topic, "--actions", "orphans")
    assert out.result is not None
    orphans = out.result.actions["orphans"]
    assert orphans["removed"] == 1 and orphans["paths"][0].endswith("stray-old.parquet")
    assert not old.exists() and young.exists() and old_referenced.exists()
    assert (
        out.result.snapshot_id == out.result.snapshot_id_before
    )  # removing orphans commits nothing

    two_days_ago = (
        time.time() - 2 * DAY_S
    )  # the flag lowers the threshold (Iceberg refuses less than 24 h)
    os.utime(young, (two_days_ago, two_days_ago))
    out = maintain(
        spark, round_broker, topic, "--actions", "orphans", "--orphan-older-than-days", "1"
    )
    assert (
        out.result is not None
        and out.result.actions["orphans"]["removed"] == 1
        and not young.exists()
    )
    assert len(pyiceberg_rows(round_broker, topic)) == 30
    # Each run is recorded on the table for the status view (a property: no snapshot).
    recorded = maintenance_summary.from_properties(table(round_broker, topic).properties)
    assert recorded is not None and (recorded["status"], recorded["orphans_removed"]) == ("done", 1)
    assert recorded["at_ms"] == out.now_ms and recorded["actions"] == ["orphans"]
    assert table(round_broker, topic).current_snapshot().snapshot_id == out.result.snapshot_id  # type: ignore[union-attr]

    # A failed action is recorded too, with Iceberg's reason: orphans younger than a day are refused.
    code, out = maintenance.run(
        [
            "--admin-url",
            round_broker.admin_url,
            "--topic",
            topic,
            "--actions",
            "orphans",
            "--orphan-older-than-days",
            "0.5",
        ],
        spark,
    )
    assert code == 1 and out.status == "failed" and "orphans" in out.message
    recorded = maintenance_summary.from_properties(table(round_broker, topic).properties)
    assert recorded is not None and (recorded["status"], recorded["failed_actions"]) == (
        "failed",
        ["orphans"],
    )
    assert recorded["message"] == out.message[: maintenance_summary.MESSAGE_CHARS]


def test_the_job_as_a_process_maintains_the_dlq_table_too(
    spark: Any, round_broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = new_topic(
        round_broker, partitions=1, configs={"automq.table.topic.schema.validation": "false"}
    )
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    raw = Producer({"bootstrap.servers": round_broker.bootstrap})
    for i in range(3):  # three rounds, each with good rows and one record for the DLQ
        producer.send(clicks(i * 10, 10))
        raw.produce(topic, value=b"not avro")
        assert raw.flush(30) == 0
        assert run_round(spark, round_broker, topic).status == "committed"
    dlq_files = data_file_count(round_broker, f"{topic}__dlq")
    assert dlq_files == 3

    result = tmp_path / "maintenance.json"
    now_ms = int(time.time() * 1000) + 2 * HOUR_MS
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_jobs.maintenance",
            "--admin-url",
            round_broker.admin_url,
            "--topic",
            topic,
            "--master",
            "local[2]",
            "--actions",
            "compact,expire",
            "--now-ms",
            str(now_ms),
            "--target-file-size-bytes",
            str(64 * MIB),
            "--min-input-files",
            "2",
            "--result",
            str(result),
        ],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.loads(result.read_text())
    assert written["status"] == "done" and written["actions"] == ["compact", "expire"]
    assert written["per_action"]["compact"]["rewritten_data_files"] == 3
    assert written["per_action"]["compact"]["target_file_size_bytes"] == 64 * MIB
    assert written["settings"]["sources"]["target_file_size_bytes"] == "flag"
    assert written["per_action"]["compact"]["min_input_files"] == 2
    assert written["per_action"]["expire"]["snapshots_expired"] >= 1
    assert {"compact", "expire", "spark_start", "total"} <= written["seconds"].keys()
    assert written["snapshot_id"] == table(round_broker, topic).current_snapshot().snapshot_id  # type: ignore[union-attr]
    dlq = written["dlq"]
    assert dlq["table"] == f"default.{topic}__dlq" and set(dlq["actions"]) == {"compact", "expire"}
    assert dlq["actions"]["compact"]["rewritten_data_files"] == 3 and dlq["data_files_after"] == 1
    assert dlq["actions"]["expire"]["snapshots_expired"] >= 3
    assert len(table(round_broker, f"{topic}__dlq").scan().to_arrow()) == 3
    assert [o for _, o in table_offsets(round_broker, topic)] == [
        o for o in range(33) if o % 11 != 10
    ]


def test_a_topic_without_a_table_yet_is_nothing_to_do(
    round_broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = new_topic(round_broker, partitions=1)
    code, out = maintenance.run(
        [
            "--admin-url",
            round_broker.admin_url,
            "--topic",
            topic,
            "--result",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 0 and out.status == "no_table"
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "no_table"
    assert not catalog(round_broker).table_exists(("default", topic))
    code, out = maintenance.run(
        ["--admin-url", round_broker.admin_url, "--topic", "not_a_table_topic"]
    )
    assert code == 1 and "not a table topic" in out.message


def test_settings_follow_flags_then_topic_configs_then_table_properties() -> None:
    topic = {
        "automq.table.topic.expire.snapshot.older.than.hours": "6",
        "automq.table.topic.expire.snapshot.retain.last": "3",
        "automq.table.topic.expire.snapshot.enabled": "true",
    }
    settings = resolve(topic, {"write.target-file-size-bytes": str(128 * MIB)})
    assert (settings.target_file_size_bytes, settings.strategy, settings.min_input_files) == (
        128 * MIB,
        "auto",
        5,
    )
    assert (
        settings.expire_older_than_hours,
        settings.retain_last,
        settings.orphan_older_than_days,
    ) == (6, 3, 3)
    assert settings.compaction_strategy(table_sorted=True) == "sort"
    assert settings.compaction_strategy(table_sorted=False) == "binpack"
    assert (
        settings.sources["target_file_size_bytes"] == "table property write.target-file-size-bytes"
    )
    flagged = resolve(
        topic, {}, {"retain_last": 2, "strategy": "binpack", "orphan_older_than_days": 10}
    )
    assert (flagged.retain_last, flagged.orphan_older_than_days) == (2, 10)
    assert flagged.compaction_strategy(table_sorted=True) == "binpack"
    assert (
        flagged.target_file_size_bytes == 512 * MIB
        and flagged.sources["target_file_size_bytes"] == "default"
    )
    defaults = resolve({}, {})  # the broker's declared defaults: AutoMQ's 1 h, keep 1
    assert (defaults.expire_enabled, defaults.expire_older_than_hours, defaults.retain_last) == (
        True,
        1,
        1,
    )
    assert not resolve({"automq.table.topic.expire.snapshot.enabled": "false"}, {}).expire_enabled
    assert parse_actions("orphans, compact") == ["compact", "orphans"]
    for bad in ("compact,vacuum", ""):
        with pytest.raises(ValueError, match="unknown actions"):
            parse_actions(bad)
    with pytest.raises(ValueError, match="retain last"):
        resolve(topic, {}, {"retain_last": 0})
    assert maintenance.sql_timestamp(1_700_000_000_123) == "TIMESTAMP '2023-11-14 22:13:20.123000Z'"


def test_zorder_settings() -> None:
    zkey = "automq.table.topic.maintenance.compaction.zorder.columns"
    configured = resolve({zkey: "[id, geo.country]"}, {})
    assert configured.zorder_columns == ("id", "geo.country") and configured.sources[
        "zorder_columns"
    ].startswith("topic config")
    assert (
        configured.compaction_strategy(table_sorted=True) == "zorder"
    )  # auto: z-order columns win
    assert resolve(
        {}, {"icefall.maintenance.compaction.zorder-columns": "score"}
    ).zorder_columns == ("score",)
    assert (
        resolve({zkey: "[id]"}, {}, {"strategy": "binpack"}).compaction_strategy(table_sorted=False)
        == "binpack"
    )
    with pytest.raises(ValueError, match="zorder needs columns"):
        resolve({"automq.table.topic.maintenance.compaction.strategy": "zorder"}, {})


def test_delete_file_threshold_settings() -> None:
    from broker.topic_configs import InvalidConfigError, validate

    key = "automq.table.topic.maintenance.compaction.delete.file.threshold"
    assert resolve({}, {}).delete_file_threshold == 1
    assert (
        resolve(
            {key: "4"}, {"icefall.maintenance.compaction.delete-file-threshold": "9"}
        ).delete_file_threshold
        == 4
    )
    assert (
        resolve(
            {key: ""}, {"icefall.maintenance.compaction.delete-file-threshold": "9"}
        ).delete_file_threshold
        == 9
    )
    assert (
        resolve({key: "4"}, {}, {"delete_file_threshold": 2}).sources["delete_file_threshold"]
        == "flag"
    )
    with pytest.raises(ValueError, match="delete file threshold"):
        resolve({}, {}, {"delete_file_threshold": 0})
    assert validate(key, " 12 ") == "12" and validate(key, "") == ""
    for bad in ("0", "ten", str(2**31)):
        with pytest.raises(InvalidConfigError, match=key):
            validate(key, bad)


def test_position_deletes_cannot_be_read_from_tables_with_maps_or_lists() -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        ListType,
        LongType,
        MapType,
        NestedField,
        StringType,
        StructType,
    )

    nested_map = StructType(
        NestedField(2, "headers", MapType(3, StringType(), 4, BinaryType()), required=False)
    )
    assert maintenance._has_map_or_list(Schema(NestedField(1, "meta", nested_map, required=False)))
    assert maintenance._has_map_or_list(
        Schema(NestedField(1, "tags", ListType(2, StringType()), required=False))
    )
    assert not maintenance._has_map_or_list(
        Schema(NestedField(1, "id", LongType(), required=False))
    )


def test_zorder_compaction_keeps_the_rows(spark: Any, round_broker: BrokerProcess) -> None:
    """Columns from the topic config (set with a Kafka admin client at creation); Iceberg's sort
    strategy with a zorder(...) sort order rewrites the files."""
    topic = new_topic(
        round_broker,
        partitions=2,
        configs={"automq.table.topic.maintenance.compaction.zorder.columns": "[score, id]"},
    )
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    sent = rounds(spark, round_broker, topic, producer, 3, 30)
    files_before = data_file_count(round_broker, topic)
    rows_before = pyiceberg_rows(round_broker, topic)
    out = maintain(spark, round_broker, topic, "--actions", "compact", "--min-input-files", "2")
    assert out.result is not None
    compact = out.result.actions["compact"]
    assert (compact["strategy"], compact["zorder_columns"]) == ("zorder", ["score", "id"])
    assert compact["rewritten_data_files"] == files_before and compact["added_data_files"] >= 1
    assert (
        pyiceberg_rows(round_broker, topic) == rows_before == spark_rows(spark, round_broker, topic)
    )
    assert len(rows_before) == sent


def data_files_only(broker: BrokerProcess, topic: str) -> int:
    return len(table(broker, topic).inspect.data_files())


def delete_files(broker: BrokerProcess, topic: str) -> list[dict[str, Any]]:
    return list(
        table(broker, topic)
        .inspect.delete_files()
        .select(["file_path", "record_count"])
        .to_pylist()
    )


def applying_deletes(broker: BrokerProcess, topic: str) -> list[str]:
    """The live delete files that can still apply to a live data file: a position delete applies
    only to data files with a data sequence number at most its own (Iceberg's spec)."""
    entries = (
        table(broker, topic)
        .inspect.entries()
        .select(["status", "sequence_number", "data_file"])
        .to_pylist()
    )
    live = [e for e in entries if e["status"] < 2]
    oldest_data = min(
        (e["sequence_number"] for e in live if e["data_file"]["content"] == 0), default=None
    )
    return [
        e["data_file"]["file_path"]
        for e in live
        if e["data_file"]["content"] != 0
        and oldest_data is not None
        and e["sequence_number"] >= oldest_data
    ]


def upsert_rounds(
    spark: Any, broker: BrokerProcess, topic: str, producer: AvroProducer
) -> dict[int, int]:
    """Four upsert rounds with repeated keys and a tombstone; returns the expected id -> score."""
    from confluent_kafka import Producer

    def keyed(c: dict[str, Any]) -> str:
        return str(c["id"])

    producer.send(clicks(0, 30), key=keyed)
    assert run_round(spark, broker, topic).status == "committed"
    producer.send([{**c, "score": 100 + c["id"]} for c in clicks(0, 10)], key=keyed)
    assert run_round(spark, broker, topic).status == "committed"
    producer.send([{**c, "score": 200 + c["id"]} for c in clicks(5, 10)] + clicks(30, 5), key=keyed)
    assert run_round(spark, broker, topic).status == "committed"
    raw = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    raw.produce(topic, key=b"20", value=None)
    assert raw.flush(30) == 0
    producer.send([{**c, "score": 300 + c["id"]} for c in clicks(12, 2)], key=keyed)
    assert run_round(spark, broker, topic).status == "committed"
    expected = {i: i % 100 for i in range(35) if i != 20}
    expected.update({i: 100 + i for i in range(5)})
    expected.update({i: 200 + i for i in range(5, 15)})
    expected.update({12: 312, 13: 313})
    return expected


def test_compaction_of_an_upsert_table_applies_its_deletes_and_the_next_round_merges(
    spark: Any, round_broker: BrokerProcess, tmp_path: Path
) -> None:
    from tests.spark_jobs.test_round_upsert import UPSERT, three_readers

    topic = new_topic(round_broker, partitions=1, configs=UPSERT)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    expected = upsert_rounds(spark, round_broker, topic, producer)
    rows_before = three_readers(spark, round_broker, topic)
    assert {i: s for i, s, _ in rows_before} == expected
    deletes_before = delete_files(round_broker, topic)
    files_before = data_files_only(round_broker, topic)
    assert deletes_before and all(
        d["content"] == 1
        for d in table(round_broker, topic).inspect.delete_files().select(["content"]).to_pylist()
    )  # position deletes (v2)
    checkpoint_before = checkpoint.read_checkpoint(table(round_broker, topic).metadata)

    out = maintain(spark, round_broker, topic, "--actions", "compact", result=tmp_path / "m.json")
    assert out.result is not None
    compact = out.result.actions["compact"]
    assert compact["delete_file_threshold"] == 1
    assert out.result.settings["sources"]["delete_file_threshold"] == "default"
    assert compact["rewritten_data_files"] == files_before
    assert data_files_only(round_broker, topic) == compact["added_data_files"] < files_before
    # every delete is applied: none can apply to the compacted files any more (Iceberg drops the
    # older ones in the rewrite's commit; the newest round's stay listed, see README)
    assert applying_deletes(round_broker, topic) == []
    left = {d["file_path"] for d in delete_files(round_broker, topic)}
    assert left < {d["file_path"] for d in deletes_before} and out.result.delete_files_after == len(
        left
    )
    assert out.result.delete_files_before == len(deletes_before)
    assert compact["position_deletes"]["rewritten_delete_files"] == 0
    assert three_readers(spark, round_broker, topic) == rows_before
    written = json.loads((tmp_path / "m.json").read_text())
    assert (written["delete_files_before"], written["delete_files_after"]) == (
        len(deletes_before),
        len(left),
    )
    recorded = maintenance_summary.from_properties(table(round_broker, topic).properties)
    assert recorded is not None and (
        recorded["delete_files_before"],
        recorded["delete_files_after"],
    ) == (len(deletes_before), len(left))
    assert f"{len(deletes_before)} -> {len(left)} delete files" in maintenance_summary.one_line(
        recorded
    )

    # the next upsert round continues from the checkpoint and merges into the compacted files
    producer.send(
        [{**c, "score": 400 + c["id"]} for c in clicks(0, 3)] + clicks(40, 1),
        key=lambda c: str(c["id"]),
    )
    nxt = run_round(spark, round_broker, topic)
    assert (
        nxt.status == "committed"
        and nxt.offsets_before == checkpoint_before.offsets
        and nxt.rows == 4
    )
    expected.update({0: 400, 1: 401, 2: 402, 40: 40})
    assert {i: s for i, s, _ in three_readers(spark, round_broker, topic)} == expected


def test_the_delete_file_threshold_decides_which_files_compaction_rewrites_for_their_deletes(
    spark: Any, round_broker: BrokerProcess
) -> None:
    """With the threshold (a topic config) above the files' delete count and too few small data
    files to be worth compacting, ``rewrite_data_files`` leaves the upsert table alone and its
    delete files stay (``rewrite_position_delete_files`` cannot read a table topic with Iceberg
    1.10: skipped with the reason). The flag's threshold 1 then applies every delete."""
    from tests.spark_jobs.test_round_upsert import UPSERT, three_readers

    topic = new_topic(
        round_broker,
        partitions=1,
        configs={
            **UPSERT,
            "automq.table.topic.maintenance.compaction.delete.file.threshold": "1000",
        },
    )
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 30), key=lambda c: str(c["id"]))
    assert run_round(spark, round_broker, topic).status == "committed"
    for n in range(2):
        # two ids of the first file per round: under Iceberg's delete-ratio-threshold (30 % of a
        # file's rows), so only the delete file count could make compaction rewrite it
        producer.send(
            [{**c, "score": 100 * (n + 1) + c["id"]} for c in clicks(n * 2, 2)],
            key=lambda c: str(c["id"]),
        )
        assert run_round(spark, round_broker, topic).status == "committed"
    rows_before = three_readers(spark, round_broker, topic)
    deletes_before = delete_files(round_broker, topic)
    data_before = data_files_only(round_broker, topic)
    assert len(deletes_before) >= 1

    out = maintain(spark, round_broker, topic, "--actions", "compact", "--min-input-files", "100")
    assert out.result is not None
    compact = out.result.actions["compact"]
    assert compact["delete_file_threshold"] == 1000 and compact["rewritten_data_files"] == 0
    assert out.result.settings["sources"]["delete_file_threshold"].startswith("topic config")
    deletes = compact["position_deletes"]
    assert (
        deletes["position_delete_files"] == len(deletes_before)
        and deletes["rewritten_delete_files"] == 0
    )
    assert "_kafka_headers" in deletes["skipped"]
    assert len(delete_files(round_broker, topic)) == len(deletes_before)
    assert out.result.delete_files_after == out.result.delete_files_before == len(deletes_before)

    out = maintain(
        spark,
        round_broker,
        topic,
        "--actions",
        "compact",
        "--min-input-files",
        "100",
        "--delete-file-threshold",
        "1",
    )
    assert (
        out.result is not None and out.result.settings["sources"]["delete_file_threshold"] == "flag"
    )
    assert out.result.actions["compact"]["rewritten_data_files"] == data_before
    assert (
        applying_deletes(round_broker, topic) == []
    )  # all applied (the newest stays listed, see README)
    assert three_readers(spark, round_broker, topic) == rows_before


def test_rewrite_position_delete_files_runs_where_iceberg_can_and_skips_deletion_vectors(
    spark: Any, tmp_path: Path
) -> None:
    """Tables without map or list columns, on Spark's own Hadoop catalog (a table topic always
    has ``_kafka_headers``; the broker's catalog keeps v2 tables only): partition-scoped v2
    position deletes are bin-packed into one file; a v3 table's deletion vectors are left alone."""
    from pyiceberg.table import StaticTable

    spark.conf.set("spark.sql.catalog.pdtest", "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set("spark.sql.catalog.pdtest.type", "hadoop")
    spark.conf.set("spark.sql.catalog.pdtest.warehouse", f"file://{tmp_path}")
    job = object.__new__(maintenance.Maintenance)  # the step needs no broker
    settings = resolve({}, {}, {"min_input_files": 2})
    for version, granularity in (("2", "partition"), ("3", "file")):
        name = f"t{version}"
        props = {
            "format-version": version,
            "write.merge.mode": "merge-on-read",
            "write.delete.granularity": granularity,
        }
        spark.sql(
            f"CREATE TABLE pdtest.db.{name} (id BIGINT, v STRING) USING iceberg TBLPROPERTIES ("
            + ", ".join(f"'{k}'='{v}'" for k, v in props.items())
            + ")"
        )
        spark.sql(f"INSERT INTO pdtest.db.{name} SELECT id, 'a' FROM range(0, 20)")
        for n in range(3):
            spark.sql(
                f"MERGE INTO pdtest.db.{name} t USING (SELECT {n} AS id, 'b' AS v) s ON t.id = s.id "
                "WHEN MATCHED THEN UPDATE SET t.v = s.v"
            )
        rows = sorted(tuple(r) for r in spark.sql(f"SELECT id, v FROM pdtest.db.{name}").collect())
        metadata = max(
            (tmp_path / "db" / name / "metadata").glob("v*.metadata.json"),
            key=lambda p: int(p.name.split(".")[0].removeprefix("v")),
        )
        tbl = StaticTable.from_metadata(str(metadata))
        done = job._rewrite_position_deletes(
            spark, "pdtest", f"`db`.`{name}`", tbl, settings, rewrote_data=False
        )
        after = spark.sql(f"SELECT file_format FROM pdtest.db.{name}.delete_files").collect()
        if version == "2":
            assert done["position_delete_files"] == 3 and "skipped" not in done, done
            assert (done["rewritten_delete_files"], done["added_delete_files"]) == (3, 1) and len(
                after
            ) == 1
        else:
            assert done["deletion_vectors"] == done["position_delete_files"] >= 1, done
            assert (
                done["skipped"].startswith("deletion vectors only")
                and done["rewritten_delete_files"] == 0
            )
            assert {r["file_format"] for r in after} == {"PUFFIN"}
        assert (
            sorted(tuple(r) for r in spark.sql(f"SELECT id, v FROM pdtest.db.{name}").collect())
            == rows
        )
