"""The broker on S3 (moto's server): segment objects land under the prefix,
a restarted broker reads them back, the admin API's byte ranges are real
record batches, and an object store outage costs neither acks nor records."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from broker.kafka import records
from tests.broker.clients import (
    ContinuousProducer,
    create_topic,
    read_partitions,
    stop_all,
    verify_log,
)
from tests.conftest import MotoS3
from tests.support import BrokerProcess, free_port, present, wait_for

PREFIX = "icefall/test"


def _flush(broker: BrokerProcess) -> int:
    written = broker.admin("/v1/flush", method="POST")["bytes_written"]
    assert isinstance(written, int)
    return written


def _segment_keys(client: Any, bucket: str, prefix: str = PREFIX) -> list[str]:
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix + "/"
    ):
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    return sorted(keys)


def _partitions(broker: BrokerProcess, topic: str) -> dict[int, dict[str, Any]]:
    data = broker.admin(f"/v1/topics/{topic}/offsets")
    return {p["partition"]: p for p in data["partitions"]}


def _read_ranges(
    broker: BrokerProcess, client: Any, topic: str, partition: int, start: int, end: int
) -> list[records.Record]:
    """The records in [start, end) as a commit round would get them: byte
    ranges from the admin API, read straight from S3 with ranged GETs."""
    plan = broker.admin(f"/v1/topics/{topic}/partitions/{partition}/ranges?start={start}&end={end}")
    store = urlparse(str(plan["object_store"]))
    assert store.scheme == "s3"
    prefix = store.path.strip("/")
    out: list[records.Record] = []
    ranges: list[dict[str, Any]] = plan["ranges"]
    assert ranges, f"no ranges for {topic}-{partition} [{start}, {end})"
    assert ranges[0]["first_offset"] <= start and ranges[-1]["end_offset"] >= end
    for r in ranges:
        body = client.get_object(
            Bucket=store.netloc,
            Key=f"{prefix}/{r['object_key']}",
            Range=f"bytes={r['byte_start']}-{r['byte_end'] - 1}",
        )["Body"].read()
        assert len(body) == r["byte_end"] - r["byte_start"]
        for header, batch in records.iter_batches(body):
            _, batch_records = records.decode_batch(batch)
            assert header.base_offset >= r["first_offset"]
            assert header.base_offset + header.last_offset_delta < r["end_offset"]
            out.extend(rec for rec in batch_records if start <= rec.offset < end)
    return out


def _produce(bootstrap: str, topic: str, values: list[str]) -> dict[str, tuple[int, int]]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 50,
        }
    )
    acked: dict[str, tuple[int, int]] = {}
    errors: list[object] = []

    def report(err: Any, msg: Any) -> None:
        if err is None:
            acked[msg.value().decode()] = (msg.partition(), msg.offset())
        else:
            errors.append(err)

    for value in values:
        producer.produce(topic, key=value.encode(), value=value.encode(), on_delivery=report)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors and len(acked) == len(values)
    return acked


def test_segments_in_s3_survive_a_restart_and_ranges_decode(
    broker_factory: Callable[..., BrokerProcess], moto_s3: MotoS3, s3_bucket: str
) -> None:
    url = f"s3://{s3_bucket}/{PREFIX}"
    broker = broker_factory(
        ["--object-store", url, "--segment-flush-ms", "60000"], env=moto_s3.env()
    )
    assert broker.admin("/healthz")["object_store"] == url
    client = moto_s3.client()
    topic = "s3-topic"
    create_topic(broker.bootstrap, topic, 2)

    acked: dict[str, tuple[int, int]] = {}
    for round_ in range(3):  # three flushes: three segment objects, ranges that span them
        acked.update(_produce(broker.bootstrap, topic, [f"r{round_}-{i}" for i in range(400)]))
        if round_ == 0:
            assert _segment_keys(client, s3_bucket) == [], (
                "nothing should be flushed before the flush"
            )
            assert not (broker.home / "objects").exists()
        assert _flush(broker) > 0
    keys = _segment_keys(client, s3_bucket)
    assert len(keys) == 3 and all(
        k.startswith(f"{PREFIX}/segments/") and k.endswith(".seg") for k in keys
    ), keys
    assert _segment_keys(client, s3_bucket, "segments") == [], "objects written outside the prefix"
    assert _flush(broker) == 0

    by_partition: dict[int, list[str]] = {0: [], 1: []}
    for value, (p, offset) in sorted(acked.items(), key=lambda kv: kv[1]):
        assert offset == len(by_partition[p])
        by_partition[p].append(value)
    assert all(by_partition.values()), "the keys should spread over both partitions"

    def check_everything() -> None:
        log = read_partitions(broker.bootstrap, topic, 2)
        assert {
            p: [present(v).decode() for _, v in entries] for p, entries in log.items()
        } == by_partition
        offsets = _partitions(broker, topic)
        for p, values in by_partition.items():
            assert offsets[p]["high_watermark"] == offsets[p]["flushed_offset"] == len(values)
            got = _read_ranges(broker, client, topic, p, 0, len(values))
            assert [r.offset for r in got] == list(range(len(values)))
            assert [present(r.value).decode() for r in got] == values
            lo, hi = len(values) // 3, 2 * len(values) // 3 + 1
            again = _read_ranges(broker, client, topic, p, lo, hi)
            assert [present(r.value).decode() for r in again] == values[lo:hi]

    check_everything()
    assert broker.stop() == 0
    broker.start()  # a fresh process: nothing cached, every fetch reads S3
    assert not (broker.home / "objects").exists(), "segments must not be written locally"
    check_everything()
    assert _segment_keys(client, s3_bucket) == keys, "the restart should not need to write anything"

    # the reads really come from S3: without the objects the fetch fails
    broker.stop()
    for key in keys:
        client.delete_object(Bucket=s3_bucket, Key=key)
    broker.start()
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "after-delete",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[Any] = []

        def fetch_failed() -> bool:
            got.extend(m for m in consumer.consume(100, 0.2) if not m.error())
            return "NoSuchKey" in broker.log_text()

        wait_for(fetch_failed, 15, interval=0, what="a fetch that reads the deleted segment object")
        assert got == []
    finally:
        consumer.close()


def test_ranges_endpoint_refuses_what_is_not_flushed(
    broker_factory: Callable[..., BrokerProcess], moto_s3: MotoS3, s3_bucket: str
) -> None:
    broker = broker_factory(
        ["--object-store", f"s3://{s3_bucket}/{PREFIX}", "--segment-flush-ms", "60000"],
        env=moto_s3.env(),
    )
    create_topic(broker.bootstrap, "unflushed", 1)
    _produce(broker.bootstrap, "unflushed", [f"v{i}" for i in range(10)])
    with pytest.raises(urllib.error.HTTPError) as info:
        broker.admin("/v1/topics/unflushed/partitions/0/ranges?start=0&end=10")
    assert info.value.code == 409
    _flush(broker)
    assert [r.value for r in _read_ranges(broker, moto_s3.client(), "unflushed", 0, 0, 10)] == [
        f"v{i}".encode() for i in range(10)
    ]


# ---------------------------------------------------------------- outages


class TcpProxy:
    """A TCP forwarder in front of moto that can go away (connection refused,
    open connections cut) and come back on the same port, while moto keeps its
    objects."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target_port = target_port
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self.up()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.1)
        self._listener = listener
        self._accepting = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._accepting.start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            assert self._accepting is not None
            self._accepting.join(5)
            listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def s3_proxy(moto_s3: MotoS3) -> Iterator[TcpProxy]:
    proxy = TcpProxy(moto_s3.port)
    yield proxy
    proxy.down()


def _health(broker: BrokerProcess) -> dict[str, Any]:
    return broker.admin("/healthz")


def _all_flushed(broker: BrokerProcess, topic: str) -> bool:
    return _health(broker)["unflushed_bytes"] == 0 and all(
        o["flushed_offset"] == o["high_watermark"] > 0 for o in _partitions(broker, topic).values()
    )


def _check_s3_holds_everything(
    broker: BrokerProcess,
    client: Any,
    topic: str,
    partitions: int,
    producers: list[ContinuousProducer],
) -> None:
    log = read_partitions(broker.bootstrap, topic, partitions)
    verify_log(log, producers)
    for p, entries in log.items():
        from_s3 = _read_ranges(broker, client, topic, p, 0, len(entries))
        assert [(r.offset, r.value) for r in from_s3] == entries


@pytest.mark.parametrize("outage", ["network", "missing-bucket"])
def test_object_store_outage_keeps_acking_and_catches_up(
    broker_factory: Callable[..., BrokerProcess], moto_s3: MotoS3, s3_proxy: TcpProxy, outage: str
) -> None:
    """network: S3 stops answering (connection refused, open connections cut)
    for a while. missing-bucket: the bucket only appears after the broker has
    been taking records for a while."""
    client = moto_s3.client()
    bucket = f"outage-{uuid.uuid4().hex[:12]}"
    if outage == "network":
        client.create_bucket(Bucket=bucket)
    broker = broker_factory(
        ["--object-store", f"s3://{bucket}/{PREFIX}", "--segment-flush-ms", "200"],
        env=moto_s3.env(s3_proxy.endpoint),
    )
    topic = "outage"
    create_topic(broker.bootstrap, topic, 2)
    producers = [
        ContinuousProducer(
            broker.bootstrap, topic, "plain", {"enable.idempotence": False}, rate=2000
        ).start(),
        ContinuousProducer(
            broker.bootstrap, topic, "idem", {"enable.idempotence": True}, rate=2000
        ).start(),
    ]
    try:
        counts = [p.acked_count for p in producers]
        if outage == "network":
            wait_for(
                lambda: (
                    all(p.acked_count > 500 for p in producers)
                    and _health(broker)["segments_written"] > 0
                ),
                20,
                what="records flushed to S3 before the outage",
            )
            s3_proxy.down()
            counts = [p.acked_count for p in producers]
        failures = _health(broker)["flush_failures"]
        # the store is down: flushes fail and are retried, producers keep getting acks
        wait_for(
            lambda: (
                _health(broker)["flush_failures"] >= failures + 2
                and all(p.acked_count >= c + 2000 for p, c in zip(producers, counts, strict=True))
            ),
            30,
            what="acks and failed flush retries while the store is down",
        )
        assert "segment flush failed" in broker.log_text()
        unflushed = _partitions(broker, topic)
        assert all(o["high_watermark"] > o["flushed_offset"] for o in unflushed.values()), unflushed
        assert not any(p.failed for p in producers), "a produce failed while the store was down"
        if outage == "network":
            s3_proxy.up()
        else:
            client.create_bucket(Bucket=bucket)
        segments_before = _health(broker)["segments_written"]
        wait_for(
            lambda: _health(broker)["segments_written"] > segments_before,
            30,
            what="a flush once the store is back",
        )
    finally:
        stop_all(producers)
    wait_for(
        lambda: _all_flushed(broker, topic), 30, what="everything flushed once the store is back"
    )
    _check_s3_holds_everything(broker, client, topic, 2, producers)
    assert not any(p.failed for p in producers)


def test_kill9_during_an_outage_and_restart_while_still_down(
    broker_factory: Callable[..., BrokerProcess],
    moto_s3: MotoS3,
    s3_proxy: TcpProxy,
    s3_bucket: str,
) -> None:
    """Records acked during an outage are in the WAL only; a broker killed then
    restarts (the store is still down), serves them, and flushes them later."""
    client = moto_s3.client()
    broker = broker_factory(
        ["--object-store", f"s3://{s3_bucket}/{PREFIX}", "--segment-flush-ms", "200"],
        env=moto_s3.env(s3_proxy.endpoint),
    )
    topic = "outage-kill"
    create_topic(broker.bootstrap, topic, 2)
    producers = [
        ContinuousProducer(
            broker.bootstrap, topic, "plain", {"enable.idempotence": False, "retries": 0}, rate=2000
        ).start(),
        ContinuousProducer(
            broker.bootstrap, topic, "idem", {"enable.idempotence": True}, rate=2000
        ).start(),
    ]
    try:
        wait_for(
            lambda: (
                all(p.acked_count > 500 for p in producers)
                and _health(broker)["segments_written"] > 0
            ),
            20,
            what="records flushed to S3 before the outage",
        )
        s3_proxy.down()
        counts = [p.acked_count for p in producers]
        wait_for(
            lambda: (
                _health(broker)["flush_failures"] > 0
                and all(p.acked_count >= c + 1000 for p, c in zip(producers, counts, strict=True))
            ),
            30,
            what="acks while the store is down",
        )
        broker.kill9()
        counts = [p.acked_count for p in producers]
        broker.start()
        wait_for(
            lambda: all(p.acked_count >= c + 500 for p, c in zip(producers, counts, strict=True)),
            30,
            what="acks after the restart, store still down",
        )
        s3_proxy.up()
        segments_before = _health(broker)["segments_written"]
        wait_for(
            lambda: _health(broker)["segments_written"] > segments_before,
            30,
            what="a flush once the store is back",
        )
    finally:
        stop_all(producers)
    wait_for(
        lambda: _all_flushed(broker, topic), 30, what="everything flushed once the store is back"
    )
    _check_s3_holds_everything(broker, client, topic, 2, producers)


@pytest.mark.parametrize("setting", ["object.store", "automq.table.topic.catalog.warehouse"])
def test_a_bucket_that_does_not_exist_is_an_error_in_the_log_at_start(
    setting: str, broker_factory: Callable[..., BrokerProcess], moto_s3: MotoS3, s3_bucket: str
) -> None:
    """Checked once at start and said plainly, naming the setting; the broker still starts (the
    bucket may be created a moment later: see the missing-bucket outage above)."""
    good, missing = f"s3://{s3_bucket}/x", f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x"
    store, warehouse = (missing, good) if setting == "object.store" else (good, missing)
    broker = broker_factory(["--object-store", store, "--warehouse", warehouse], env=moto_s3.env())
    log = broker.log_text()
    assert (
        f"ERROR broker.app: {setting}={missing}: bucket '{urlparse(missing).netloc}' does not exist"
        in log
    ), log
    other = "automq.table.topic.catalog.warehouse" if setting == "object.store" else "object.store"
    assert f"{other}=" not in log  # the bucket that exists is not complained about


def test_no_credentials_or_an_endpoint_that_does_not_answer_name_the_settings(
    monkeypatch: pytest.MonkeyPatch, moto_s3: MotoS3, s3_bucket: str
) -> None:
    """What the broker logs at start (``check_s3_location``) when S3 cannot be used."""
    import logging

    from broker.storage.objectstore import check_s3_location

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    url = f"s3://{s3_bucket}/segments"
    problem = check_s3_location(url, "object.store", moto_s3.endpoint, None, None, None)
    assert problem is not None and problem[0] == logging.ERROR
    assert problem[1].startswith(f"object.store={url}: no AWS credentials"), problem

    closed = f"http://127.0.0.1:{free_port()}"
    problem = check_s3_location(url, "object.store", closed, None, "testing", "testing")
    assert problem is not None and problem[0] == logging.WARNING
    assert f"cannot reach {closed}" in problem[1] and "AWS_ENDPOINT_URL" in problem[1], problem
    assert (
        check_s3_location(url, "object.store", moto_s3.endpoint, None, "testing", "testing") is None
    )


def test_object_ages_are_by_the_servers_clock(tmp_path: Path) -> None:
    """The orphan sweep's ages (``S3ObjectStore.list_ages``): ``LastModified`` against the
    server's own time (its HTTP Date), so a server whose clock is an hour off this machine's
    still gives a fresh object an age near zero, and an object written "two hours ago" by the
    server's clock an age near two hours."""
    from broker.config import ObjectStoreConfig
    from broker.storage.objectstore import S3ObjectStore

    server = MotoS3(tmp_path / "moto.log", clock_file=tmp_path / "clock")
    try:
        server.wait_ready()
        bucket = f"ages-{uuid.uuid4().hex[:8]}"
        server.client().create_bucket(Bucket=bucket)
        env = server.env()
        store = S3ObjectStore(
            ObjectStoreConfig(
                url=f"s3://{bucket}/{PREFIX}",
                endpoint_url=env["AWS_ENDPOINT_URL"],
                access_key_id=env["AWS_ACCESS_KEY_ID"],
                secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            )
        )
        server.set_clock("-2h")
        store.put("segments/old.seg", b"x")
        server.set_clock("-1h")  # and it stays an hour behind this machine
        store.put("segments/fresh.seg", b"y")
        ages = store.list_ages("segments/")
        assert set(ages) == {"segments/old.seg", "segments/fresh.seg"}
        assert -5 < ages["segments/fresh.seg"] < 60, ages
        assert 3600 - 60 < ages["segments/old.seg"] < 3600 + 60, ages
    finally:
        server.stop()
