"""The coordinator's admin API: offsets, the plan for an append-time cut, byte ranges."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from broker.admin_client import AdminClient as BrokerAdmin
from broker.kafka import records
from broker.storage.objectstore import LocalObjectStore
from tests.support import BrokerProcess, icefall_cli, wait_for


def raw_table_topic(broker: BrokerProcess, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {"automq.table.topic.enable": "true", "automq.table.topic.convert.value.type": "raw"}
    for f in admin.create_topics([NewTopic(topic, partitions, 1, config=config)]).values():
        f.result(10)


def test_plan_and_ranges_cover_exactly_the_records_before_the_cut(broker: BrokerProcess) -> None:
    raw_table_topic(broker, "planned", 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(40):
        producer.produce("planned", value=f"early-{i}".encode(), partition=i % 2)
    producer.flush(10)
    cut_ms = int(time.time() * 1000) + 1
    wait_for(lambda: int(time.time() * 1000) > cut_ms, 5, what="the clock to pass the cut")
    for i in range(10):
        producer.produce("planned", value=f"late-{i}".encode(), partition=i % 2)
    producer.flush(10)

    broker.admin("/v1/flush", method="POST")
    plan = broker.admin(f"/v1/topics/planned/plan?until_append_ms={cut_ms}")
    ends = {p["partition"]: p for p in plan["partitions"]}
    assert {p: e["end_offset"] for p, e in ends.items()} == {0: 20, 1: 20}
    assert all(e["flushed"] for e in ends.values())
    assert {p: e["high_watermark"] for p, e in ends.items()} == {0: 25, 1: 25}

    # a time the broker's clock has not reached: records may still be appended before it,
    # so no end offset is final and nothing is reported flushed
    ahead_ms = int(time.time() * 1000) + 60_000
    early = broker.admin(f"/v1/topics/planned/plan?until_append_ms={ahead_ms}")
    assert early["until_append_ms"] == ahead_ms and early["broker_time_ms"] < ahead_ms
    assert [p["end_offset"] for p in early["partitions"]] == [25, 25]
    assert not any(p["flushed"] for p in early["partitions"])
    assert plan["broker_time_ms"] >= cut_ms

    store = LocalObjectStore(broker.home / "objects")
    for partition in (0, 1):
        answer = broker.admin(f"/v1/topics/planned/partitions/{partition}/ranges?start=5&end=20")
        values = []
        for r in answer["ranges"]:
            data = store.get_range(r["object_key"], r["byte_start"], r["byte_end"])
            for _batch_header, batch in records.iter_batches(data):
                _, recs = records.decode_batch(batch)
                values += [(rec.offset, rec.value) for rec in recs if 5 <= rec.offset < 20]
        assert [o for o, _ in values] == list(range(5, 20))
        assert all(v is not None and v.startswith(b"early-") for _, v in values)

    offsets = broker.admin("/v1/topics/planned/offsets")
    assert offsets["table_topic"] is True
    assert [p["high_watermark"] for p in offsets["partitions"]] == [25, 25]


def test_a_plan_covering_given_offsets_flushes_only_when_they_are_not_written_yet(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """A round told its end offsets (the commit task's plan flushed them) asks the broker to
    flush only if a partition's flushed end is short of them; past a partition's high
    watermark it waits for that, not for the deadline."""
    broker = broker_factory(["--segment-flush-ms", "600000"])  # no flush but the ones asked for
    raw_table_topic(broker, "covered", 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})

    def produce(count: int) -> None:
        for i in range(count):
            producer.produce("covered", value=f"v{i}".encode(), partition=i % 2)
        producer.flush(10)

    client = BrokerAdmin(broker.admin_url)
    flushes: list[float] = []
    flush = client.flush

    def counted_flush() -> Any:
        flushes.append(time.monotonic())
        return flush()

    client.flush = counted_flush  # type: ignore[method-assign]

    produce(10)
    plan = client.covering_plan("covered", {0: 5, 1: 5}, deadline_s=10)
    assert len(flushes) == 1, "the offsets were not written: it must ask for a flush"
    assert {p.partition: p.end_offset for p in plan.partitions} == {0: 5, 1: 5}

    produce(4)  # appended, not flushed: the flushed ends stay at 5
    plan = client.covering_plan("covered", {0: 5, 1: 4}, deadline_s=10)
    assert len(flushes) == 1, "the offsets were written already: no flush"
    assert {p.partition: (p.end_offset, p.high_watermark) for p in plan.partitions} == {
        0: (5, 7),
        1: (5, 7),
    }

    started = time.monotonic()
    plan = client.covering_plan("covered", {0: 100}, deadline_s=30)
    assert time.monotonic() - started < 10, "it waited for offsets that do not exist"
    assert len(flushes) == 2
    assert {p.partition: p.end_offset for p in plan.partitions} == {0: 7, 1: 7}


def test_admin_errors_are_json_with_status(broker: BrokerProcess) -> None:
    for path, status in [("/v1/topics/missing/offsets", 404), ("/v1/topics/missing/plan", 404)]:
        try:
            urllib.request.urlopen(broker.admin_url + path, timeout=10)
        except urllib.error.HTTPError as exc:
            assert exc.code == status
            assert "missing" in json.loads(exc.read())["message"]
        else:
            raise AssertionError(f"{path} should fail")


def test_icefall_cluster_on_a_lone_broker_says_it_is_no_cluster(broker: BrokerProcess) -> None:
    """The broker's reason reaches the user (it used to read "cannot reach the admin API ...:
    HTTP Error 404", of an API that had answered)."""
    for extra in ([], ["move", "--topic", "t", "--partition", "0", "--to", "1"]):
        done = icefall_cli("cluster", "--admin-url", broker.admin_url, *extra)
        assert done.returncode == 2, done
        assert "/v1/cluster/assignment: HTTP 404: " in done.stderr, done.stderr
        assert "not a cluster: this broker keeps its metadata in SQLite" in done.stderr
        assert "cannot reach" not in done.stderr


def _span(broker: BrokerProcess, topic: str, partition: int, start: int, end: int) -> int:
    """Bytes of the whole batches holding [start, end), as the ranges endpoint gives them."""
    answer = broker.admin(
        f"/v1/topics/{topic}/partitions/{partition}/ranges?start={start}&end={end}"
    )
    return sum(r["byte_end"] - r["byte_start"] for r in answer["ranges"])


def test_pending_counts_what_waits_past_the_committed_offsets(broker: BrokerProcess) -> None:
    """What a size trigger asks: records and bytes from the table's checkpoint (or a later ``from``)."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    from broker import checkpoint

    raw_table_topic(broker, "waiting", 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(40):
        producer.produce("waiting", value=bytes(100 + i), partition=i % 2)
        producer.flush(10)  # a batch per record: byte counts of whole batches are then exact
    broker.admin("/v1/flush", method="POST")

    nothing_committed = broker.admin("/v1/topics/waiting/pending")
    assert nothing_committed["committed_offsets"] == {} and nothing_committed["records"] == 40
    assert nothing_committed["bytes"] == _span(broker, "waiting", 0, 0, 20) + _span(
        broker, "waiting", 1, 0, 20
    )

    catalog = load_catalog("pending", type="rest", uri=broker.catalog_url)
    catalog.create_namespace("default")
    table = catalog.create_table(
        "default.waiting", Schema(NestedField(1, "id", LongType(), required=False))
    )
    topic_id = str(broker.admin("/v1/topics/waiting/offsets")["topic_id"])
    table.append(
        pa.table({"id": pa.array(range(12), pa.int64())}),
        snapshot_properties={
            checkpoint.OFFSETS: checkpoint.encode_offsets({0: 5, 1: 7}),
            checkpoint.TOPIC_ID: topic_id,
            checkpoint.TOPIC: "waiting",
            checkpoint.ROUND_ID: "round-1",
        },
    )
    answer = broker.admin("/v1/topics/waiting/pending")
    assert answer["committed_offsets"] == {"0": 5, "1": 7}
    assert [(p["start_offset"], p["end_offset"], p["records"]) for p in answer["partitions"]] == [
        (5, 20, 15),
        (7, 20, 13),
    ]
    assert answer["bytes"] == _span(broker, "waiting", 0, 5, 20) + _span(
        broker, "waiting", 1, 7, 20
    )

    later = broker.admin(
        "/v1/topics/waiting/pending?from=" + urllib.parse.quote('{"0": 18}')
    )  # fired up to 18
    assert [p["start_offset"] for p in later["partitions"]] == [18, 7]
    assert later["bytes"] == _span(broker, "waiting", 0, 18, 20) + _span(
        broker, "waiting", 1, 7, 20
    )
    for bad in ("[1]", "nope", '{"x": 1}'):
        try:
            urllib.request.urlopen(
                broker.admin_url + "/v1/topics/waiting/pending?from=" + urllib.parse.quote(bad),
                timeout=10,
            )
        except urllib.error.HTTPError as exc:
            assert exc.code == 400 and "JSON object of offsets" in json.loads(exc.read())["message"]
        else:
            raise AssertionError(f"from={bad} should be refused")


def test_the_admin_api_listens_on_loopback_even_when_the_services_do_not(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The admin API has no authentication: with ``host=0.0.0.0`` (the registry and catalog on
    every address) it still answers on loopback only, unless ``admin.host`` says otherwise; the
    URL handed to Airflow and the jobs follows where it listens."""
    from broker.config import BrokerConfig

    assert BrokerConfig(host="0.0.0.0", advertised_host="b").admin_url.startswith(
        "http://127.0.0.1:"
    )
    assert BrokerConfig(admin_host="0.0.0.0", advertised_host="b").admin_url.startswith("http://b:")
    assert BrokerConfig(admin_host="10.1.2.3").admin_url.startswith("http://10.1.2.3:")

    def answers(host: str, port: int) -> bool:
        try:
            with socket.create_connection((host, port), timeout=5):
                return True
        except ConnectionRefusedError:
            return False

    broker = BrokerProcess(tmp_path_factory.mktemp("admin-host"), ["--host", "0.0.0.0"]).start()
    try:
        other = "127.0.0.2"  # another address of this host: reached by a bind to 0.0.0.0 only
        assert answers(other, broker.registry_port) and answers(other, broker.catalog_port)
        assert not answers(other, broker.admin_port)
        assert broker.admin("/healthz")["status"] == "ok"  # on 127.0.0.1
    finally:
        broker.stop()
