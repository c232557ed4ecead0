"""The honest path: confluent-kafka (librdkafka) produces with all four codecs to a
real broker, the admin API gives the byte ranges, and the segment reader and the
row converter turn them back into exactly what was produced."""

from __future__ import annotations

import datetime
import io
import struct

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from fastavro import parse_schema, schemaless_writer

from broker.kafka import records
from broker.storage.objectstore import LocalObjectStore
from spark_jobs.decode import avro_schema
from spark_jobs.decode.rows import RowConverter
from spark_jobs.decode.segments import ReadStats, SegmentRange, ranges_from_admin, read_ranges
from tests.support import BrokerProcess

SCHEMA = {
    "type": "record",
    "name": "Click",
    "namespace": "icefall.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "codec", "type": "string"},
        {"name": "page", "type": ["null", "string"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
SCHEMA_ID = 42
CODECS = ("gzip", "snappy", "lz4", "zstd")
PER_CODEC = 60


def wire(value: dict[str, object]) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + struct.pack(">I", SCHEMA_ID))
    schemaless_writer(out, parse_schema(SCHEMA), value)
    return out.getvalue()


def test_all_codecs_produced_by_librdkafka_come_back_as_rows(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("clicks", 2, 1)]).values():
        future.result(10)
    produced: dict[tuple[int, int], dict[str, object]] = {}  # (partition, offset) -> value

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        produced[(msg.partition(), msg.offset())] = pending[msg.key()]  # type: ignore[attr-defined]

    pending: dict[bytes, dict[str, object]] = {}
    at = 1_700_000_000_000
    for codec in CODECS:
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "compression.type": codec,
                "linger.ms": 20,
                "batch.num.messages": 25,
            }
        )
        for i in range(PER_CODEC):
            value = {
                "id": i,
                "codec": codec,
                "page": None if i % 3 == 0 else f"/page/{i}" * 5,
                "at": at + i,
            }
            key = f"{codec}-{i}".encode()
            pending[key] = value
            producer.produce(
                "clicks",
                key=key,
                value=wire(value),
                partition=i % 2,
                on_delivery=delivered,
                headers=[("codec", codec.encode()), ("n", str(i).encode())],
            )
        assert producer.flush(15) == 0
    assert len(produced) == len(CODECS) * PER_CODEC

    broker.admin("/v1/flush", method="POST")
    store = LocalObjectStore(broker.home / "objects")
    table = avro_schema.table_schema(SCHEMA)
    converter = RowConverter(table, {SCHEMA_ID: SCHEMA}.__getitem__)
    seen_codecs: set[int] = set()
    rows: list[dict[str, object]] = []
    stats = ReadStats()
    for partition in (0, 1):
        answer = broker.admin(f"/v1/topics/clicks/partitions/{partition}/ranges?start=10&end=110")
        ranges = ranges_from_admin(answer)
        assert ranges and ranges[0].start == 10 and ranges[0].end == 110
        for rng in ranges:
            data = store.get_range(rng.object_key, rng.byte_start, rng.byte_end)
            seen_codecs |= {h.compression for h, _ in records.iter_batches(data)}
        for chunk in read_ranges(store, ranges, stats=stats):
            result = converter.convert(chunk)
            assert result.errors == []
            rows += result.batch.to_pylist()

    # librdkafka sends a batch uncompressed when compressing it would not make it
    # smaller (a lone record after linger.ms, say): NONE may appear beside the four.
    codecs = {
        records.COMPRESSION_GZIP,
        records.COMPRESSION_SNAPPY,
        records.COMPRESSION_LZ4,
        records.COMPRESSION_ZSTD,
    }
    assert codecs <= seen_codecs <= codecs | {records.COMPRESSION_NONE}
    assert stats.records == len(rows) == 200  # offsets [10, 110) of two partitions of 120
    for row in rows:
        meta = row["_kafka_metadata"]
        assert isinstance(meta, dict)
        want = produced[(meta["partition"], meta["offset"])]
        assert 10 <= meta["offset"] < 110
        assert row["_kafka_key"] == f"{want['codec']}-{want['id']}"
        assert row["_kafka_headers"] == [
            ("codec", str(want["codec"]).encode()),
            ("n", str(want["id"]).encode()),
        ]
        assert {k: row[k] for k in ("id", "codec", "page")} == {
            k: want[k] for k in ("id", "codec", "page")
        }
        assert row["at"] == datetime.datetime.fromtimestamp(
            int(str(want["at"])) / 1000, datetime.UTC
        )
        assert (
            isinstance(meta["timestamp"], datetime.datetime)
            and meta["timestamp"].tzinfo is not None
        )


def test_a_window_inside_one_batch(broker: BrokerProcess) -> None:
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "compression.type": "zstd", "linger.ms": 50}
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("one", 1, 1)]).values():
        future.result(10)
    for i in range(20):
        producer.produce("one", value=f"v{i}".encode(), partition=0)
    assert producer.flush(10) == 0
    broker.admin("/v1/flush", method="POST")
    answer = broker.admin("/v1/topics/one/partitions/0/ranges?start=7&end=9")
    store = LocalObjectStore(broker.home / "objects")
    got = [
        (o, v)
        for c in read_ranges(store, ranges_from_admin(answer))
        for o, v in zip(c.offsets, c.values, strict=True)
    ]
    assert got == [(7, b"v7"), (8, b"v8")]
    assert all(isinstance(r, SegmentRange) for r in ranges_from_admin(answer))
