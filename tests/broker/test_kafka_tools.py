"""Apache Kafka's own tools and Java client against the broker: what a Kafka user types
(kafka-topics, kafka-configs, the console producer and consumer, kafka-consumer-groups,
kafka-transactions, the perf tools), from Kafka 4.1's Maven Central jars (tests/kafka_tools.py).

One broker for the module: each tool is a JVM start (about a second), and the tests keep apart
by topic and group names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_tools import kafka_tool
from tests.support import BrokerProcess, wait_for


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path_factory.mktemp("kafka-tools") / "home", ["--segment-flush-ms", "200"]
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def bootstrap(broker: BrokerProcess) -> list[str]:
    return ["--bootstrap-server", broker.bootstrap]


def test_kafka_topics_creates_describes_lists_and_deletes(broker: BrokerProcess) -> None:
    b = bootstrap(broker)
    created = kafka_tool(
        "kafka-topics", *b, "--create", "--topic", "tools-topic", "--partitions", "3"
    )
    assert "Created topic tools-topic." in created.stdout
    described = kafka_tool("kafka-topics", *b, "--describe", "--topic", "tools-topic").stdout
    assert re.search(r"Topic: tools-topic\s+TopicId: \S+\s+PartitionCount: 3", described)
    assert len(re.findall(r"Partition: \d+\s+Leader: 0", described)) == 3
    again = kafka_tool(
        "kafka-topics", *b, "--create", "--topic", "tools-topic", "--partitions", "1", check=False
    )
    assert again.returncode != 0 and "already exists" in again.stdout + again.stderr
    kafka_tool("kafka-topics", *b, "--alter", "--topic", "tools-topic", "--partitions", "5")
    assert "PartitionCount: 5" in (
        kafka_tool("kafka-topics", *b, "--describe", "--topic", "tools-topic").stdout
    )
    assert "tools-topic" in kafka_tool("kafka-topics", *b, "--list").stdout.split()
    kafka_tool("kafka-topics", *b, "--delete", "--topic", "tools-topic")
    wait_for(
        lambda: "tools-topic" not in kafka_tool("kafka-topics", *b, "--list").stdout.split(),
        30,
        what="kafka-topics --list to lose the deleted topic",
    )


def test_kafka_configs_alters_topic_and_table_topic_configs(broker: BrokerProcess) -> None:
    b = bootstrap(broker)
    kafka_tool("kafka-topics", *b, "--create", "--topic", "configured", "--partitions", "1")
    topic = ["--entity-type", "topics", "--entity-name", "configured"]
    kafka_tool(
        "kafka-configs",
        *b,
        *topic,
        "--alter",
        "--add-config",
        "retention.ms=3600000,automq.table.topic.enable=true,"
        "automq.table.topic.commit.interval.ms=30000",
    )
    described = kafka_tool("kafka-configs", *b, *topic, "--describe").stdout
    assert "retention.ms=3600000" in described
    # synonyms as Kafka's: the topic's value, then the broker config it falls back to
    assert (
        "synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=3600000, "
        "DEFAULT_CONFIG:log.retention.ms=604800000}" in described
    ), described
    assert "automq.table.topic.enable=true" in described
    assert "automq.table.topic.commit.interval.ms=30000" in described
    kafka_tool("kafka-configs", *b, *topic, "--alter", "--delete-config", "retention.ms")
    described = kafka_tool("kafka-configs", *b, *topic, "--describe").stdout
    assert "retention.ms=3600000" not in described and "automq.table.topic.enable=true" in described

    bad = kafka_tool(
        "kafka-configs",
        *b,
        *topic,
        "--alter",
        "--add-config",
        "automq.table.topic.commit.interval.ms=soon",
        check=False,
    )
    assert bad.returncode != 0
    assert "automq.table.topic.commit.interval.ms" in bad.stdout + bad.stderr
    broker_configs = kafka_tool(
        "kafka-configs", *b, "--entity-type", "brokers", "--entity-name", "0", "--describe", "--all"
    ).stdout
    assert "broker.id=0" in broker_configs


def test_console_producer_consumer_and_consumer_groups(broker: BrokerProcess) -> None:
    b = bootstrap(broker)
    kafka_tool("kafka-topics", *b, "--create", "--topic", "console", "--partitions", "2")
    lines = [f"k{i}:v{i}" for i in range(10)]
    kafka_tool(
        "kafka-console-producer",
        *b,
        "--topic",
        "console",
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=:",
        stdin="\n".join(lines) + "\n",
    )
    consumed = kafka_tool(
        "kafka-console-consumer",
        *b,
        "--topic",
        "console",
        "--from-beginning",
        "--max-messages",
        "10",
        "--group",
        "console-group",
        "--property",
        "print.key=true",
        "--property",
        "key.separator=:",
    ).stdout.split()
    assert sorted(consumed) == sorted(lines)

    group = ["--group", "console-group"]
    described = kafka_tool("kafka-consumer-groups", *b, "--describe", *group).stdout
    rows = [line.split() for line in described.splitlines() if line.startswith("console-group")]
    assert len(rows) == 2 and sum(int(r[3]) for r in rows) == 10, described
    assert all(r[3] == r[4] and r[5] == "0" for r in rows), described  # no lag
    assert "console-group" in kafka_tool("kafka-consumer-groups", *b, "--list").stdout.split()

    kafka_tool(
        "kafka-consumer-groups",
        *b,
        *group,
        "--reset-offsets",
        "--to-earliest",
        "--topic",
        "console",
        "--execute",
    )
    described = kafka_tool("kafka-consumer-groups", *b, "--describe", *group).stdout
    rows = [line.split() for line in described.splitlines() if line.startswith("console-group")]
    assert [r[3] for r in rows] == ["0", "0"] and sum(int(r[5]) for r in rows) == 10, described
    kafka_tool("kafka-consumer-groups", *b, "--delete", *group)
    assert "console-group" not in kafka_tool("kafka-consumer-groups", *b, "--list").stdout.split()


def test_java_transactional_producer_and_read_committed_consumer(broker: BrokerProcess) -> None:
    """kafka-producer-perf-test with a transactional id: the Java client's InitProducerId,
    AddPartitionsToTxn and EndTxn every 100 ms; a read_committed console consumer sees every
    record, and kafka-transactions describes the finished transaction."""
    b = bootstrap(broker)
    kafka_tool("kafka-topics", *b, "--create", "--topic", "txn-tools", "--partitions", "3")
    sent = kafka_tool(
        "kafka-producer-perf-test",
        "--topic",
        "txn-tools",
        "--num-records",
        "5000",
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--transactional-id",
        "tools-txn",
        "--transaction-duration-ms",
        "100",
        "--producer-props",
        f"bootstrap.servers={broker.bootstrap}",
        "acks=all",
    ).stdout
    assert re.search(r"^5000 records sent", sent, re.M), sent
    listed = kafka_tool("kafka-transactions", *b, "list").stdout
    assert re.search(r"^tools-txn\s+0\s+\d+\s+CompleteCommit", listed, re.M), listed
    described = kafka_tool(
        "kafka-transactions", *b, "describe", "--transactional-id", "tools-txn"
    ).stdout
    assert "CompleteCommit" in described
    consumed = kafka_tool(
        "kafka-console-consumer",
        *b,
        "--topic",
        "txn-tools",
        "--from-beginning",
        "--max-messages",
        "5000",
        "--isolation-level",
        "read_committed",
        "--timeout-ms",
        "60000",
    ).stdout.splitlines()
    assert len(consumed) == 5000
    offsets = kafka_tool("kafka-get-offsets", *b, "--topic", "txn-tools").stdout
    ends = [int(line.rsplit(":", 1)[1]) for line in offsets.split()]
    assert sum(ends) > 5000  # the log also holds the commit markers, as Kafka's does


def test_perf_tools_produce_and_consume_every_record(broker: BrokerProcess, tmp_path: Path) -> None:
    b = bootstrap(broker)
    kafka_tool("kafka-topics", *b, "--create", "--topic", "perf-tools", "--partitions", "2")
    sent = kafka_tool(
        "kafka-producer-perf-test",
        "--topic",
        "perf-tools",
        "--num-records",
        "20000",
        "--record-size",
        "200",
        "--throughput",
        "-1",
        "--producer-props",
        f"bootstrap.servers={broker.bootstrap}",
        "acks=all",
        "enable.idempotence=true",
    ).stdout
    assert re.search(r"^20000 records sent", sent, re.M), sent
    consumed = kafka_tool(
        "kafka-consumer-perf-test", *b, "--topic", "perf-tools", "--messages", "20000"
    ).stdout
    row = consumed.strip().splitlines()[-1].split(", ")
    assert int(row[4]) == 20000, consumed  # data.consumed.in.nMsg
    offsets = kafka_tool("kafka-get-offsets", *b, "--topic", "perf-tools").stdout
    assert sum(int(line.rsplit(":", 1)[1]) for line in offsets.split()) == 20000


def test_kafka_delete_records_moves_the_log_start(broker: BrokerProcess, tmp_path: Path) -> None:
    """DeleteRecords: the log start moves to the offset asked; consumers from the beginning and
    ListOffsets(earliest) start there; an offset past the high watermark is refused."""
    b = bootstrap(broker)
    kafka_tool("kafka-topics", *b, "--create", "--topic", "trimmed", "--partitions", "1")
    kafka_tool(
        "kafka-console-producer",
        *b,
        "--topic",
        "trimmed",
        stdin="".join(f"m{i}\n" for i in range(100)),
    )
    plan = tmp_path / "delete.json"

    def delete_to(offset: int) -> str:
        plan.write_text(
            json.dumps(
                {
                    "version": 1,
                    "partitions": [{"topic": "trimmed", "partition": 0, "offset": offset}],
                }
            )
        )
        done = kafka_tool("kafka-delete-records", *b, "--offset-json-file", str(plan))
        return done.stdout

    assert re.search(r"partition: trimmed-0\s+low_watermark: 40", delete_to(40))
    earliest = kafka_tool("kafka-get-offsets", *b, "--topic", "trimmed", "--time", "-2").stdout
    assert earliest.split() == ["trimmed:0:40"]
    consumed = kafka_tool(
        "kafka-console-consumer",
        *b,
        "--topic",
        "trimmed",
        "--from-beginning",
        "--max-messages",
        "60",
    ).stdout.split()
    assert consumed == [f"m{i}" for i in range(40, 100)]
    assert "low_watermark: 40" in delete_to(10)  # below the log start: nothing moves back
    assert "OffsetOutOfRangeException" in delete_to(1000)
    assert re.search(r"low_watermark: 100", delete_to(-1))  # -1: up to the high watermark
    latest = kafka_tool("kafka-get-offsets", *b, "--topic", "trimmed", "--time", "-1").stdout
    assert latest.split() == ["trimmed:0:100"]

    # as Kafka: a compacted topic (the registry's _schemas is one) keeps its records
    kafka_tool(
        "kafka-topics",
        *b,
        "--create",
        "--topic",
        "compacted-kept",
        "--partitions",
        "1",
        "--config",
        "cleanup.policy=compact",
    )
    plan.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [{"topic": "compacted-kept", "partition": 0, "offset": -1}],
            }
        )
    )
    refused = kafka_tool("kafka-delete-records", *b, "--offset-json-file", str(plan)).stdout
    assert "PolicyViolationException" in refused, refused


def test_kafka_consumer_groups_delete_offsets(broker: BrokerProcess) -> None:
    b = bootstrap(broker)
    for topic in ("kept-offsets", "dropped-offsets"):
        kafka_tool("kafka-topics", *b, "--create", "--topic", topic, "--partitions", "1")
        kafka_tool("kafka-console-producer", *b, "--topic", topic, stdin="a\nb\n")
        kafka_tool(
            "kafka-console-consumer",
            *b,
            "--topic",
            topic,
            "--from-beginning",
            "--max-messages",
            "2",
            "--group",
            "offset-deleter",
        )
    group = ["--group", "offset-deleter"]
    deleted = kafka_tool(
        "kafka-consumer-groups", *b, "--delete-offsets", *group, "--topic", "dropped-offsets"
    ).stdout
    assert "dropped-offsets" in deleted and "Successful" in deleted, deleted
    described = kafka_tool("kafka-consumer-groups", *b, "--describe", *group).stdout
    assert "kept-offsets" in described and "dropped-offsets" not in described, described
    unknown = kafka_tool(
        "kafka-consumer-groups",
        *b,
        "--delete-offsets",
        "--group",
        "never-was",
        "--topic",
        "kept-offsets",
        check=False,
    )
    assert "GroupIdNotFoundException" in unknown.stdout + unknown.stderr


def test_kafka_configs_on_the_broker_resource(broker: BrokerProcess) -> None:
    """Dynamic broker configs as Kafka's: set on the cluster default or on broker 0, described
    with their source, deleted; a key that is not dynamic is refused naming it."""
    b = bootstrap(broker)
    default = ["--entity-type", "brokers", "--entity-default"]
    node = ["--entity-type", "brokers", "--entity-name", "0"]
    rate = "follower.replication.throttled.rate"
    kafka_tool("kafka-configs", *b, *default, "--alter", "--add-config", f"{rate}=1000")
    assert f"{rate}=1000" in kafka_tool("kafka-configs", *b, *default, "--describe").stdout
    kafka_tool("kafka-configs", *b, *node, "--alter", "--add-config", f"{rate}=2000")
    described = kafka_tool("kafka-configs", *b, *node, "--describe").stdout
    assert re.search(
        rf"{rate}=2000 .*DYNAMIC_BROKER_CONFIG:{rate}=2000, DYNAMIC_DEFAULT_BROKER_CONFIG:{rate}=1000",
        described,
    ), described
    everything = kafka_tool("kafka-configs", *b, *node, "--describe", "--all").stdout
    assert f"advertised.listeners=PLAINTEXT://{broker.bootstrap}" in everything
    kafka_tool("kafka-configs", *b, *node, "--alter", "--delete-config", rate)
    kafka_tool("kafka-configs", *b, *default, "--alter", "--delete-config", rate)
    assert rate not in kafka_tool("kafka-configs", *b, *default, "--describe").stdout
    refused = kafka_tool(
        "kafka-configs", *b, *node, "--alter", "--add-config", "log.cleaner.threads=2", check=False
    )
    assert refused.returncode != 0
    assert "Cannot update broker config log.cleaner.threads" in refused.stdout + refused.stderr


def test_reassignment_leader_election_and_log_dirs_as_a_single_node_kafka(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    b = bootstrap(broker)
    kafka_tool("kafka-topics", *b, "--create", "--topic", "placed", "--partitions", "2")
    kafka_tool("kafka-console-producer", *b, "--topic", "placed", stdin="x\ny\nz\n")
    assert "No partition reassignments found." in (
        kafka_tool("kafka-reassign-partitions", *b, "--list").stdout
    )
    plan = tmp_path / "reassign.json"

    def reassign(replicas: list[int], action: str) -> Any:
        plan.write_text(
            json.dumps(
                {
                    "version": 1,
                    "partitions": [{"topic": "placed", "partition": 0, "replicas": replicas}],
                }
            )
        )
        return kafka_tool(
            "kafka-reassign-partitions",
            *b,
            "--reassignment-json-file",
            str(plan),
            action,
            check=False,
        )

    started = reassign([0], "--execute")
    assert (
        started.returncode == 0 and "Successfully started partition reassignment" in started.stdout
    )
    verified = reassign([0], "--verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "Reassignment of partition placed-0 is completed." in verified.stdout
    elsewhere = reassign([7], "--execute")
    assert (
        elsewhere.returncode != 0 and "Unknown broker id 7" in elsewhere.stdout + elsewhere.stderr
    )

    elected = kafka_tool(
        "kafka-leader-election",
        *b,
        "--election-type",
        "preferred",
        "--topic",
        "placed",
        "--partition",
        "0",
    ).stdout
    assert "Valid replica already elected for partitions placed-0" in elected

    described = kafka_tool("kafka-log-dirs", *b, "--describe", "--topic-list", "placed").stdout
    answer = json.loads(described.strip().splitlines()[-1])
    [log_dir] = answer["brokers"][0]["logDirs"]
    sizes = {p["partition"]: p["size"] for p in log_dir["partitions"]}
    assert set(sizes) == {"placed-0", "placed-1"} and sum(sizes.values()) > 0
    assert log_dir["error"] is None and log_dir["logDir"].endswith("wal")
