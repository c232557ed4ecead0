from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from broker import manifest, topic_configs
from broker.metadata import TopicRecord


@pytest.mark.parametrize(
    "key, value, normalized",
    [
        ("automq.table.topic.enable", "TRUE", "true"),
        ("automq.table.topic.commit.interval.ms", " 30000 ", "30000"),
        ("automq.table.topic.partition.by", "[month(ts),bucket(id, 16)]", "[month(ts), bucket(id, 16)]"),
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


@pytest.mark.parametrize("config", [{"automq.table.topic.upsert.enable": "true"},
                                    {"automq.table.topic.cdc.field": "op"},
                                    {"automq.table.topic.transform.value.type": "flatten_debezium"}])
def test_upsert_cdc_and_debezium_need_id_columns(config: dict[str, str]) -> None:
    with pytest.raises(topic_configs.InvalidConfigError, match="id.columns"):
        topic_configs.validate_all(config)
    assert topic_configs.validate_all({**config, "automq.table.topic.id.columns": "[id]"})


def test_cdc_field_is_a_column_name() -> None:
    assert topic_configs.validate("automq.table.topic.cdc.field", " op ") == "op"
    with pytest.raises(topic_configs.InvalidConfigError, match="column name"):
        topic_configs.validate("automq.table.topic.cdc.field", "op; drop table")


def test_manifest_lists_table_topics_and_disabled_ones_and_is_replaced_atomically(tmp_path: Path) -> None:
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
