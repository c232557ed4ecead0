"""The coordinator's admin API: offsets, the plan for an append-time cut, byte ranges."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from broker import records
from broker.objectstore import LocalObjectStore
from tests.support import BrokerProcess, wait_for


def test_plan_and_ranges_cover_exactly_the_records_before_the_cut(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {"automq.table.topic.enable": "true", "automq.table.topic.convert.value.type": "raw"}
    for f in admin.create_topics([NewTopic("planned", 2, 1, config=config)]).values():
        f.result(10)
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
    ends = {p["partition"]: p for p in plan["partitions"]}  # type: ignore[index, union-attr]
    assert {p: e["end_offset"] for p, e in ends.items()} == {0: 20, 1: 20}
    assert all(e["flushed"] for e in ends.values())
    assert {p: e["high_watermark"] for p, e in ends.items()} == {0: 25, 1: 25}

    store = LocalObjectStore(broker.home / "objects")
    for partition in (0, 1):
        answer = broker.admin(f"/v1/topics/planned/partitions/{partition}/ranges?start=5&end=20")
        values = []
        for r in answer["ranges"]:  # type: ignore[union-attr]
            data = store.get_range(r["object_key"], r["byte_start"], r["byte_end"])
            for batch_header, batch in records.iter_batches(data):
                _, recs = records.decode_batch(batch)
                values += [(rec.offset, rec.value) for rec in recs if 5 <= rec.offset < 20]
        assert [o for o, _ in values] == list(range(5, 20))
        assert all(v.startswith(b"early-") for _, v in values)

    offsets = broker.admin("/v1/topics/planned/offsets")
    assert offsets["table_topic"] is True
    assert [p["high_watermark"] for p in offsets["partitions"]] == [25, 25]  # type: ignore[index, union-attr]


def test_admin_errors_are_json_with_status(broker: BrokerProcess) -> None:
    for path, status in [("/v1/topics/missing/offsets", 404), ("/v1/topics/missing/plan", 404)]:
        try:
            urllib.request.urlopen(broker.admin_url + path, timeout=10)
        except urllib.error.HTTPError as exc:
            assert exc.code == status
            assert "missing" in json.loads(exc.read())["message"]
        else:
            raise AssertionError(f"{path} should fail")
