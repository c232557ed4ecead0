"""Helpers for commit-round tests: table topics with Avro values produced by the
Confluent serializer, rounds run in-process on a shared Spark session or as a
separate ``python -m spark_jobs.commit_round`` process, and the table read back."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from broker.contracts import CatalogSpec
from spark_jobs import commit_round
from spark_jobs.commit_round import RoundResult
from tests.support import REPO, BrokerProcess

CLICK_V1: dict[str, Any] = {
    "type": "record",
    "name": "Click",
    "namespace": "icefall.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "page", "type": ["null", "string"], "default": None},
        {"name": "score", "type": "int"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def new_topic(
    broker: BrokerProcess,
    partitions: int = 2,
    configs: Mapping[str, str] | None = None,
    prefix: str = "t",
) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {"automq.table.topic.enable": "true", **(configs or {})}
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=config)]).values():
        future.result(15)
    return name


class AvroProducer:
    """The Confluent serializer (registers the schema under ``<topic>-value``) and a librdkafka producer."""

    def __init__(
        self,
        broker: BrokerProcess,
        topic: str,
        schema: Mapping[str, Any],
        user_info: str | None = None,
    ) -> None:
        """``user_info``: ``user:password`` for a registry that requires basic auth."""
        self.topic = topic
        auth = {"basic.auth.user.info": user_info} if user_info else {}
        self.serializer = AvroSerializer(
            SchemaRegistryClient({"url": broker.registry_url, **auth}), json.dumps(schema)
        )
        self.producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        self.acked: list[tuple[int, int]] = []

    def send(
        self,
        values: Iterable[Mapping[str, Any]],
        *,
        key: Any = None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        partition: int | None = None,
    ) -> None:
        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            self.acked.append((msg.partition(), msg.offset()))

        ctx = SerializationContext(self.topic, MessageField.VALUE)
        where: dict[str, Any] = {} if partition is None else {"partition": partition}
        for value in values:
            k = key(value) if callable(key) else key
            self.producer.produce(
                self.topic,
                value=self.serializer(dict(value), ctx),
                key=k,
                headers=headers,
                on_delivery=delivered,
                **where,
            )
        assert self.producer.flush(30) == 0


def round_args(
    broker: BrokerProcess, topic: str, result: Path | None = None, *extra: str
) -> list[str]:
    """Rounds in tests take the Spark path unless ``extra`` says otherwise (argparse keeps the last
    ``--in-driver-max-bytes``): their rounds are small, and Spark's task path is what they test."""
    args = ["--admin-url", broker.admin_url, "--topic", topic, "--in-driver-max-bytes", "0", *extra]
    return args + (["--result", str(result)] if result is not None else [])


def run_round(spark: Any, broker: BrokerProcess, topic: str, *extra: str) -> RoundResult:
    code, result = commit_round.run(round_args(broker, topic, None, *extra), spark)
    assert (code == 0) == (result.status != "failed"), result
    return result


class SimulatedCrash(BaseException):
    """Not an ``Exception``: the round's error handling (branch cleanup) never sees it, as after kill -9."""


def crash_round_at(
    point: str,
    spark: Any,
    broker: BrokerProcess,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
    *extra: str,
) -> None:
    """Run a round in this process (``extra``: more arguments) that stops dead at the kill
    point ``point``."""

    def crash(name: str) -> None:
        if name == point:
            raise SimulatedCrash(name)

    monkeypatch.setattr(commit_round, "_kill_point", crash)
    with pytest.raises(SimulatedCrash):
        commit_round.run(round_args(broker, topic, None, *extra), spark)
    monkeypatch.undo()


def run_round_process(
    broker: BrokerProcess,
    topic: str,
    result: Path,
    *extra: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """The job as Airflow runs it: its own process and Spark (``local[2]``)."""
    import os

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_jobs.commit_round",
            *round_args(broker, topic, result, "--master", "local[2]", *extra),
        ],
        check=False,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def tables_catalog(broker: BrokerProcess) -> str | CatalogSpec:
    """What ``commit_round.use_catalog`` takes for the broker's tables (see ``catalog``)."""
    return broker.tables_spec if broker.tables_spec is not None else broker.catalog_url


def catalog(broker: BrokerProcess) -> Catalog:
    """The broker's tables' catalog: REST at ``catalog_url``, unless the broker names another
    (``tables_spec``, a ``CatalogSpec``: a Nessie one, say)."""
    if broker.tables_spec is not None:
        return load_catalog("test", **broker.tables_spec.pyiceberg_properties())
    return load_catalog("test", type="rest", uri=broker.catalog_url)


def table(broker: BrokerProcess, topic: str, namespace: str = "default") -> Table:
    return catalog(broker).load_table((namespace, topic.replace(".", "_").replace("-", "_")))


def table_offsets(broker: BrokerProcess, topic: str) -> list[tuple[int, int]]:
    """(partition, offset) of every row, sorted, duplicates kept: the exactly-once check."""
    rows = table(broker, topic).scan(selected_fields=("_kafka_metadata",)).to_arrow()
    return sorted((m["partition"], m["offset"]) for m in rows.column("_kafka_metadata").to_pylist())
