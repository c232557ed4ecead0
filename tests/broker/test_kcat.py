"""kcat (Debian's build, its own librdkafka) against the broker: codecs, offsets, metadata, groups."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker.rawkafka import batch_codecs
from tests.support import BrokerProcess

KCAT = shutil.which("kcat")
pytestmark = pytest.mark.skipif(
    KCAT is None,
    reason="kcat is not on PATH: install it with `make system-deps` (Debian package kcat)",
)

FIELDS = "%p\t%o\t%T\t%k\t%s\t%h\n"


def kcat(*args: str, stdin: str | None = None, timeout: float = 30.0) -> str:
    """Run kcat; fail with its stderr unless it exits 0; its stdout."""
    assert KCAT is not None
    proc = subprocess.run(
        [KCAT, *args], check=False, input=stdin, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"kcat {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def consume(broker: BrokerProcess, *args: str) -> list[tuple[int, int, int, str, str, str]]:
    """(partition, offset, timestamp, key, value, headers) of every message kcat -C prints."""
    out = kcat("-b", broker.bootstrap, "-C", "-e", "-q", "-f", FIELDS, *args)
    rows = []
    for line in out.splitlines():
        p, o, t, k, v, h = line.split("\t")
        rows.append((int(p), int(o), int(t), k, v, h))
    return rows


def create(broker: BrokerProcess, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(10)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_with_each_codec(broker: BrokerProcess, codec: str) -> None:
    topic = f"kcat-{codec}"
    create(broker, topic, 2)
    sent = {f"key-{i}": f"value-{i}-{codec}-" + "z" * 300 for i in range(300)}
    lines = "".join(f"{k}:{v}\n" for k, v in sent.items())
    args = [
        "-b",
        broker.bootstrap,
        "-t",
        topic,
        "-P",
        "-K:",
        "-H",
        f"codec={codec}",
        "-X",
        "linger.ms=50",
    ]
    if codec != "none":
        args += ["-z", codec]
    kcat(*args, stdin=lines)

    rows = consume(broker, "-t", topic, "-o", "beginning")
    assert len(rows) == len(sent)
    assert {k: v for _, _, _, k, v, _ in rows} == sent
    assert {h for *_, h in rows} == {f"codec={codec}"}
    used = sorted({p for p, *_ in rows})
    assert used == [0, 1]  # the keys spread over both partitions
    for partition in used:
        offsets = [o for p, o, *_ in rows if p == partition]
        assert offsets == list(range(len(offsets)))
        # kcat really compressed, and the broker kept each batch as sent
        assert set(batch_codecs(broker.bootstrap, topic, partition)) == {codec}


def test_consume_from_beginning_offset_and_timestamp(broker: BrokerProcess) -> None:
    topic = "kcat-positions"
    create(broker, topic, 1)
    base = 1_710_000_000_000
    stamps = [base + i * 1000 for i in range(50)]
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i, ts in enumerate(stamps):
        producer.produce(topic, key=f"k{i}", value=f"v{i}", timestamp=ts)
        producer.flush(10)  # a batch per record: the broker must find times inside its log
    assert len(producer) == 0

    everything = consume(broker, "-t", topic, "-o", "beginning")
    assert [(o, t, v) for _, o, t, _, v, _ in everything] == [
        (i, ts, f"v{i}") for i, ts in enumerate(stamps)
    ]

    from_offset = consume(broker, "-t", topic, "-p", "0", "-o", "37")
    assert [o for _, o, *_ in from_offset] == list(range(37, 50))
    assert [v for _, _, _, _, v, _ in from_offset] == [f"v{i}" for i in range(37, 50)]

    from_end = consume(broker, "-t", topic, "-p", "0", "-o", "-4")
    assert [o for _, o, *_ in from_end] == list(range(46, 50))

    for query in (base - 1, base + 12_500, stamps[-1]):
        first = next(i for i, ts in enumerate(stamps) if ts >= query)
        rows = consume(broker, "-t", topic, "-p", "0", "-o", f"s@{query}")
        assert [o for _, o, *_ in rows] == list(range(first, 50)), query
        answer = json.loads(kcat("-b", broker.bootstrap, "-Q", "-J", "-t", f"{topic}:0:{query}"))
        assert answer[topic]["0"]["offset"] == first
    # start and stop by time: [s@, e@)
    window = consume(
        broker, "-t", topic, "-p", "0", "-o", f"s@{stamps[10]}", "-o", f"e@{stamps[15]}"
    )
    assert [o for _, o, *_ in window] == list(range(10, 15))


def test_metadata_listing(broker: BrokerProcess) -> None:
    create(broker, "kcat-meta-a", 3)
    create(broker, "kcat-meta-b", 1)
    listing = json.loads(kcat("-b", broker.bootstrap, "-L", "-J"))
    assert [(b["id"], b["name"]) for b in listing["brokers"]] == [(0, broker.bootstrap)]
    topics = {t["topic"]: t for t in listing["topics"]}
    assert {"kcat-meta-a", "kcat-meta-b"} <= set(topics)
    for name, count in (("kcat-meta-a", 3), ("kcat-meta-b", 1)):
        partitions = topics[name]["partitions"]
        assert sorted(p["partition"] for p in partitions) == list(range(count))
        assert all(p["leader"] == 0 and [r["id"] for r in p["isrs"]] == [0] for p in partitions)
        assert "error" not in topics[name]

    one = json.loads(kcat("-b", broker.bootstrap, "-L", "-J", "-t", "kcat-meta-a"))
    assert [t["topic"] for t in one["topics"]] == ["kcat-meta-a"]
    missing = json.loads(kcat("-b", broker.bootstrap, "-L", "-J", "-t", "kcat-no-such-topic"))
    assert [t["topic"] for t in missing["topics"]] == ["kcat-no-such-topic"]
    assert missing["topics"][0]["partitions"] == [] and missing["topics"][0].get("error")


def test_consumer_group_mode(broker: BrokerProcess) -> None:
    topic = "kcat-group"
    create(broker, topic, 2)
    first = "".join(f"k{i}:first-{i}\n" for i in range(120))
    kcat("-b", broker.bootstrap, "-t", topic, "-P", "-K:", stdin=first)

    def group_consume() -> list[tuple[int, int, str]]:
        out = kcat(
            "-b",
            broker.bootstrap,
            "-G",
            "kcat-group-1",
            "-X",
            "auto.offset.reset=earliest",
            "-e",
            "-q",
            "-f",
            "%p\t%o\t%s\n",
            topic,
        )
        return [(int(p), int(o), v) for p, o, v in (line.split("\t") for line in out.splitlines())]

    got = group_consume()
    assert sorted(v for _, _, v in got) == sorted(f"first-{i}" for i in range(120))

    # kcat committed what it consumed: the group's offsets are the partitions' ends
    checker = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kcat-group-1"})
    try:
        ends = {
            p: checker.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in (0, 1)
        }
        assert sum(ends.values()) == 120
        committed = checker.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=10)
        assert {tp.partition: tp.offset for tp in committed if tp.offset >= 0} == {
            p: end for p, end in ends.items() if end > 0
        }
    finally:
        checker.close()

    second = "".join(f"k{i}:second-{i}\n" for i in range(30))
    kcat("-b", broker.bootstrap, "-t", topic, "-P", "-K:", stdin=second)
    again = group_consume()  # the group resumes where it left off: only the new messages
    assert sorted(v for _, _, v in again) == sorted(f"second-{i}" for i in range(30))
    assert all(o >= ends[p] for p, o, _ in again)
