"""Apache Kafka's own command-line tools and Java client, run with ``java`` from their Maven
Central jars (tests/jvm/kafka, copied by ``make test``): the class each ``kafka-*.sh`` script
runs, so a test reads exactly what a Kafka user would type and see."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

KAFKA_JARS = Path(sys.prefix) / "share" / "icefall" / "test-jars" / "kafka"

# kafka-*.sh -> the main class it runs (Kafka 4.1's bin/ scripts)
TOOLS = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
    "kafka-configs": "kafka.admin.ConfigCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-broker-api-versions": "kafka.admin.BrokerApiVersionsCommand",
    "kafka-reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "kafka-leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
}


# The other tools run a second or two: C1 only and the serial collector take a third off their
# CPU (the JIT's and G1's threads), which the other test worker wants; what they do and print is
# the same. The perf tools keep the JVM as their scripts start it: bench/vs_kafka.py measures them.
SHORT_RUN_JVM_OPTS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
PERF_TOOLS = frozenset({"kafka-producer-perf-test", "kafka-consumer-perf-test"})


def kafka_jars() -> Path:
    if not (KAFKA_JARS / ".pinned").exists():
        raise RuntimeError(f"Kafka's jars are not in {KAFKA_JARS}: run `make test`")
    return KAFKA_JARS


def kafka_tool(
    tool: str,
    *args: str,
    stdin: str | None = None,
    timeout: float = 120,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``tool ARGS`` (e.g. ``kafka-topics --bootstrap-server … --list``) as its script runs it;
    its log at WARN so stdout holds what the tool prints. ``check``: fail naming both streams."""
    command = [
        "java",
        *([] if tool in PERF_TOOLS else SHORT_RUN_JVM_OPTS),
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        f"{kafka_jars()}/*",
        TOOLS[tool],
        *args,
    ]
    done = subprocess.run(
        command,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "KAFKA_HEAP_OPTS": "-Xmx256m"},
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"{tool} {' '.join(args)} exited {done.returncode}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
    return done
