from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from broker import manifest, topic_configs
from broker.storage.metadata import TopicRecord
from tests.support import BrokerProcess


@pytest.mark.parametrize(
    "key, value, normalized",
    [
        ("automq.table.topic.enable", "TRUE", "true"),
        ("automq.table.topic.commit.interval.ms", " 30000 ", "30000"),
        (
            "automq.table.topic.partition.by",
            "[month(ts),bucket(id, 16)]",
            "[month(ts), bucket(id, 16)]",
        ),
        ("automq.table.topic.partition.by", "[a.b, truncate(name, 4)]", "[a.b, truncate(name, 4)]"),
        ("automq.table.topic.id.columns", "[id, region]", "[id, region]"),
        ("cleanup.policy", "compact,delete", "compact,delete"),
        ("message.timestamp.type", "LogAppendTime", "LogAppendTime"),
        ("automq.table.topic.errors.tolerance", "ALL", "all"),
    ],
)
def test_valid_values_are_normalized(key: str, value: str, normalized: str) -> None:
    assert topic_configs.validate(key, value) == normalized


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("no.such.key", "1", "Unknown topic config name: no.such.key"),
        ("automq.table.topic.enable", "yes", "expected true or false"),
        ("automq.table.topic.commit.interval.ms", "10", "outside"),
        ("automq.table.topic.convert.value.type", "xml", "expected one of"),
        ("automq.table.topic.partition.by", "[week(ts)]", "bad partition transform"),
        ("automq.table.topic.namespace", "bad-name", "identifier"),
        ("retention.ms", "forever", "expected an integer"),
    ],
)
def test_bad_values_name_the_key(key: str, value: str, fragment: str) -> None:
    with pytest.raises(topic_configs.InvalidConfigError) as info:
        topic_configs.validate(key, value)
    assert fragment in str(info.value)
    if key != "no.such.key":
        assert key in str(info.value)


@pytest.mark.parametrize(
    "config",
    [
        {"automq.table.topic.upsert.enable": "true"},
        {"automq.table.topic.cdc.field": "op"},
        {"automq.table.topic.transform.value.type": "flatten_debezium"},
    ],
)
def test_upsert_cdc_and_debezium_need_id_columns(config: dict[str, str]) -> None:
    with pytest.raises(topic_configs.InvalidConfigError, match="id.columns"):
        topic_configs.validate_all(config)
    assert topic_configs.validate_all({**config, "automq.table.topic.id.columns": "[id]"})


def test_cdc_field_is_a_column_name() -> None:
    assert topic_configs.validate("automq.table.topic.cdc.field", " op ") == "op"
    with pytest.raises(topic_configs.InvalidConfigError, match="column name"):
        topic_configs.validate("automq.table.topic.cdc.field", "op; drop table")


def test_manifest_lists_table_topics_and_disabled_ones_and_is_replaced_atomically(
    tmp_path: Path,
) -> None:
    import uuid

    path = tmp_path / "table_topics.json"
    topics = [
        TopicRecord("orders.v1", uuid.uuid4(), 3, {"automq.table.topic.enable": "true"}),
        TopicRecord("plain", uuid.uuid4(), 1, {}),
        TopicRecord("off", uuid.uuid4(), 1, {"automq.table.topic.enable": "false"}),
    ]
    content = manifest.render(topics, "http://127.0.0.1:8090")
    manifest.write_atomically(path, content)
    data = manifest.read(path)
    tables = data["table_topics"]
    assert isinstance(tables, list) and [t["topic"] for t in tables] == ["orders.v1"]
    disabled = data["disabled_table_topics"]
    assert isinstance(disabled, list) and [t["topic"] for t in disabled] == ["off"]
    assert disabled[0]["configs"]["automq.table.topic.enable"] == "false"
    assert tables[0]["table"] == "orders_v1"
    assert tables[0]["commit_interval_ms"] == 60000

    # a reader racing many rewrites never sees a partial file
    stop = threading.Event()
    errors: list[Exception] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                json.loads(path.read_text())
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(200):
        topics[0].configs["automq.table.topic.commit.interval.ms"] = str(1000 + i)
        manifest.write_atomically(path, manifest.render(topics, "x"))
    stop.set()
    thread.join()
    assert errors == []
    assert not list(tmp_path.glob("*.tmp"))


def test_the_manifest_is_rewritten_only_when_the_table_topics_change(tmp_path: Path) -> None:
    """Airflow re-parses, and ``icefall up`` re-syncs, on a new manifest: a change that leaves
    the table topics as they were (a plain topic added) must leave the file untouched."""
    import uuid

    path = tmp_path / "table_topics.json"
    table = TopicRecord("orders", uuid.uuid4(), 2, {"automq.table.topic.enable": "true"})
    assert manifest.write_if_changed(path, manifest.render([table], "x"))
    before = path.stat().st_mtime_ns
    plain = TopicRecord("__consumer_offsets", uuid.uuid4(), 50, {})
    assert not manifest.write_if_changed(path, manifest.render([table, plain], "x"))
    assert path.stat().st_mtime_ns == before
    table.configs["automq.table.topic.commit.interval.ms"] = "5000"
    assert manifest.write_if_changed(path, manifest.render([table, plain], "x"))
    written = manifest.read(path)["table_topics"]
    assert isinstance(written, list) and written[0]["commit_interval_ms"] == 5000


MAINTENANCE = "automq.table.topic.maintenance."


@pytest.mark.parametrize(
    "key, value, normalized",
    [
        (MAINTENANCE + "enable", "False", "false"),
        (MAINTENANCE + "interval.ms", " 600000 ", "600000"),
        (MAINTENANCE + "target.file.size.bytes", "134217728", "134217728"),
        (MAINTENANCE + "target.file.size.bytes", "", ""),  # unset: the table property applies
        (MAINTENANCE + "compaction.strategy", "BinPack", "binpack"),
        (MAINTENANCE + "compaction.strategy", "zorder", "zorder"),
        (
            MAINTENANCE + "compaction.zorder.columns",
            "user_id,geo.country",
            "[user_id, geo.country]",
        ),
        (MAINTENANCE + "unreferenced.days", "10", "10"),
        ("automq.table.topic.expire.snapshot.older.than.hours", "120", "120"),
    ],
)
def test_maintenance_values_are_normalized(key: str, value: str, normalized: str) -> None:
    assert topic_configs.validate(key, value) == normalized


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        (
            MAINTENANCE + "interval.ms",
            "1000",
            "outside",
        ),  # a Spark start per second is not maintenance
        (MAINTENANCE + "interval.ms", "hourly", "expected an integer"),
        (MAINTENANCE + "target.file.size.bytes", "0", "outside"),
        (MAINTENANCE + "compaction.strategy", "hilbert", "expected one of"),
        (MAINTENANCE + "compaction.zorder.columns", "[user-id]", "bad id column"),
        (MAINTENANCE + "unreferenced.days", "0.5", "outside"),  # Iceberg refuses less than a day
        (MAINTENANCE + "enable", "sometimes", "expected true or false"),
        ("automq.table.topic.expire.snapshot.retain.last", "0", "outside"),
    ],
)
def test_bad_maintenance_values_name_the_key(key: str, value: str, fragment: str) -> None:
    with pytest.raises(topic_configs.InvalidConfigError) as info:
        topic_configs.validate(key, value)
    assert fragment in str(info.value) and key in str(info.value)


def test_every_topic_key_the_maintenance_job_reads_is_declared() -> None:
    """The job reads topic configs by these names; the broker refuses undeclared keys, so a
    name that drifted apart would silently never apply."""
    from spark_jobs.maintain import settings as ms

    for key in (
        ms.EXPIRE_ENABLED,
        ms.EXPIRE_OLDER_THAN_HOURS,
        ms.EXPIRE_RETAIN_LAST,
        ms.TOPIC_TARGET_FILE_SIZE,
        ms.TOPIC_STRATEGY,
        ms.TOPIC_ORPHAN_DAYS,
        ms.TOPIC_ZORDER_COLUMNS,
        ms.TOPIC_DELETE_FILE_THRESHOLD,
    ):
        assert key in topic_configs.KEYS, key


def test_unset_maintenance_keys_leave_the_table_property_in_charge() -> None:
    """The manifest carries every key with its default; an empty default must not hide the table's
    own ``write.target-file-size-bytes`` (or S3 Tables' defaults)."""
    from spark_jobs.maintain import settings as ms

    configs = topic_configs.effective({"automq.table.topic.enable": "true"})
    settings = ms.resolve(configs, {"write.target-file-size-bytes": "1048576"})
    assert settings.target_file_size_bytes == 1048576
    assert (
        settings.sources["target_file_size_bytes"] == "table property write.target-file-size-bytes"
    )
    assert (settings.strategy, settings.orphan_older_than_days) == (
        "auto",
        ms.S3_TABLES_UNREFERENCED_DAYS,
    )

    configs = topic_configs.effective(
        {
            MAINTENANCE + "target.file.size.bytes": "2097152",
            MAINTENANCE + "compaction.strategy": "sort",
            MAINTENANCE + "unreferenced.days": "10",
        }
    )
    settings = ms.resolve(configs, {"write.target-file-size-bytes": "1048576"})
    assert (
        settings.target_file_size_bytes,
        settings.strategy,
        settings.orphan_older_than_days,
    ) == (2097152, "sort", 10.0)
    assert (
        settings.sources["target_file_size_bytes"]
        == f"topic config {MAINTENANCE}target.file.size.bytes"
    )


def test_maintenance_configs_through_a_kafka_admin_client(broker: BrokerProcess) -> None:
    """Set, described and refused (INVALID_CONFIG naming the key) through confluent-kafka, and
    carried into the manifest the maintenance DAG factory reads."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
    )

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "automq.table.topic.enable": "true",
        MAINTENANCE + "interval.ms": "900000",
        MAINTENANCE + "compaction.strategy": "binpack",
    }
    for future in admin.create_topics([NewTopic("maint", 1, 1, config=config)]).values():
        future.result(10)
    resource = ConfigResource("topic", "maint")
    described = admin.describe_configs([resource])[resource].result(10)
    assert described[MAINTENANCE + "interval.ms"].value == "900000"
    assert described[MAINTENANCE + "enable"].value == "true"
    assert described[MAINTENANCE + "target.file.size.bytes"].value == ""

    for bad in (
        {MAINTENANCE + "interval.ms": "5"},
        {MAINTENANCE + "unreferenced.days": "soon"},
        {MAINTENANCE + "compaction.strategy": "hilbert"},
    ):
        [(key, value)] = bad.items()
        res = ConfigResource(
            "topic",
            "maint",
            incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
            ],
        )
        with pytest.raises(KafkaException) as info:
            admin.incremental_alter_configs([res])[res].result(10)
        assert info.value.args[0].code() == 40  # INVALID_CONFIG
        assert key in info.value.args[0].str()
    described = admin.describe_configs([resource])[resource].result(10)
    assert (
        described[MAINTENANCE + "interval.ms"].value == "900000"
    )  # a refused change changes nothing

    entries = manifest.read(broker.home / "table_topics.json")["table_topics"]
    assert isinstance(entries, list)
    [entry] = entries
    assert entry["configs"][MAINTENANCE + "interval.ms"] == "900000"
    assert entry["configs"][MAINTENANCE + "compaction.strategy"] == "binpack"


@pytest.mark.parametrize(
    ("config", "spark"),
    [
        ({}, False),
        ({"automq.table.topic.convert.value.type": "raw"}, False),
        ({"automq.table.topic.partition.by": "[hour(_kafka_metadata.timestamp)]"}, False),
        (
            {"automq.table.topic.upsert.enable": "true", "automq.table.topic.id.columns": "[id]"},
            True,
        ),
        ({"automq.table.topic.cdc.field": "op", "automq.table.topic.id.columns": "[id]"}, True),
        (
            {
                "automq.table.topic.transform.value.type": "flatten_debezium",
                "automq.table.topic.id.columns": "[id]",
            },
            True,
        ),
        ({"automq.table.topic.convert.value.type": "json"}, True),
        ({"automq.table.topic.format.version": "3"}, True),
    ],
)
def test_rounds_need_spark_as_the_round_decides(config: dict[str, str], spark: bool) -> None:
    """What the commit task reads to spark-submit at once agrees with the round's own reasons
    (``commit_round._spark_needed``: upsert options, JSON values, format v3)."""
    from types import SimpleNamespace

    from spark_jobs.rounds import table_setup, upsert

    settings = topic_configs.TableSettings(
        topic_configs.effective(topic_configs.validate_all(config))
    )
    assert settings.rounds_need_spark is spark
    options = table_setup.TableOptions.of_settings(settings)
    topic = SimpleNamespace(topic="t", settings=settings)
    by_round = (
        upsert.UpsertOptions.of(topic) is not None  # type: ignore[arg-type]
        or options.value_type == "json"
        or options.format_version >= 3
    )
    assert by_round is spark
