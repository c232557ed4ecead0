"""Spark's own Kafka source (``spark-sql-kafka-0-10``, from Maven Central: tests/jvm/spark-kafka)
reads an Icefall topic: a batch read and a Structured Streaming query (``availableNow``) see
every record with its key, partition and offset, as they would from Apache Kafka.

Spark runs in a process of its own: the source's jars must be on the driver's classpath when
its JVM starts, and this process's JVM is the other Spark tests' (their jars only)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spark_jobs.jars import iceberg_jars
from tests.support import REPO, BrokerProcess, python_json

SPARK_KAFKA_JARS = Path(sys.prefix) / "share" / "icefall" / "test-jars" / "spark-kafka"

READER = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession

    bootstrap, topic, checkpoint, jars = sys.argv[1:5]
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", jars)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    source = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"}
    batch = spark.read.format("kafka").options(**source).load()
    rows = batch.selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "partition", "offset").collect()
    seen = []
    def keep(frame, _batch_id):
        seen.extend(frame.selectExpr("CAST(key AS STRING) AS k").collect())
    query = (
        spark.readStream.format("kafka").options(**source).load()
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    print(json.dumps({
        "batch": [[r.k, r.v, r.partition, r.offset] for r in rows],
        "streamed": sorted(r.k for r in seen),
    }))
    spark.stop()
    """
)


def test_spark_kafka_source_reads_a_topic_batch_and_streaming(
    round_broker: BrokerProcess, tmp_path: Path
) -> None:
    assert (SPARK_KAFKA_JARS / ".pinned").exists(), (
        f"no jars in {SPARK_KAFKA_JARS}: run `make test`"
    )
    topic = "spark-kafka-source"
    admin = AdminClient({"bootstrap.servers": round_broker.bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(10)
    producer = Producer({"bootstrap.servers": round_broker.bootstrap, "linger.ms": 5})
    for i in range(120):
        producer.produce(topic, key=f"k{i}", value=f"v{i}")
    assert producer.flush(30) == 0

    jars = ",".join([*iceberg_jars(), *map(str, sorted(SPARK_KAFKA_JARS.glob("*.jar")))])
    result = python_json(
        ["-c", READER, round_broker.bootstrap, topic, str(tmp_path / "checkpoint"), jars],
        {**os.environ, "PYSPARK_PYTHON": sys.executable},
        cwd=REPO,
        timeout=600,
    )
    batch = result["batch"]
    assert sorted(k for k, _, _, _ in batch) == sorted(f"k{i}" for i in range(120))
    assert all(v == "v" + k[1:] for k, v, _, _ in batch)
    by_partition: dict[int, list[int]] = {}
    for _, _, partition, offset in batch:
        by_partition.setdefault(partition, []).append(offset)
    assert sorted(by_partition) == [0, 1, 2]
    assert all(sorted(o) == list(range(len(o))) for o in by_partition.values())
    assert result["streamed"] == sorted(f"k{i}" for i in range(120))
