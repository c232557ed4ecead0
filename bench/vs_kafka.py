"""The Icefall broker beside Apache Kafka, in one run on this machine, with two clients for
both: Kafka's own perf tools, then confluent-kafka (issue 17, part 1).

Apache Kafka 4.1 runs in KRaft mode (one node, broker and controller, a temporary log dir)
from its Maven Central jars (tests/jvm/kafka, copied by ``make test`` or ``make bench-vs-kafka``),
twice: once with ``log.flush.interval.messages=1`` (an fsync before the ack, as Icefall's WAL
does for acks=all) and once with its defaults (the page cache only). The Icefall broker runs
with its defaults. The three run side by side for the whole benchmark, but only one is
working at a time: the produce runs go one broker after the other, and the consumer runs
take turns (``--consume-runs`` rounds of one run per client per broker). On a quiet machine
the consume figures moved by up to 1.8 x from one run to the next on the same broker (a
JVM's warm-up, the cores' state), as much as between brokers; taking turns spreads that
drift over all of them, so the medians compare the brokers rather than the moments.

For each broker, two clients, one after the other, each on a topic of its own (same
partitions), both producing with ``PRODUCER_SETTINGS`` (acks=all, ``linger.ms`` 5,
``batch.size`` 256 KiB, no throughput cap), the records round the partitions so that every
broker's topics have the same layout (``JAVA_PARTITIONER``):

- Kafka's perf tools: ``kafka-producer-perf-test`` sends the records, then
  ``kafka-consumer-perf-test --print-metrics`` reads them back (``--consume-runs N``: N times,
  each a new group from the start; the median). Recorded: MiB/s and records/s, produce
  latency p50/p99 (as the tool reports them) and the consumer's ``fetch-latency-avg``. On a
  quiet machine every broker consumed 2,000,000 records at the same ~480 MiB/s with this
  consumer: its decoding, not the broker, bounds that figure. ``fetch-latency-avg`` is the
  broker's part (request sent to response read), so a reader sees which of the two it was.
- confluent-kafka (librdkafka, bench/_common.py's ``confluent_produce`` and
  ``confluent_consume``): the same number of records of the same size, handed over by
  ``produce_batch`` from one pre-built value (close to no Python work per record, so the
  producer's figure is the broker's fsync and librdkafka's), then read back ``--consume-runs``
  times by a consumer of a new group assigned every partition from the start (the Java
  consumer's fetch sizes), timed from ``assign`` to the last record. The consumer makes one
  Python message object per record: at 512 B records that, and the two cores the broker
  shares, bound its figure; the client's own CPU s/GiB is printed beside it to tell.

For both: the broker's CPU seconds per GiB (from /proc) and its peak RSS (VmHWM, after every
run of both clients). The last line prints
the ratios Icefall / Kafka-with-fsync for both clients.

    .venv/bin/python bench/vs_kafka.py            # 1,000,000 records of 512 B, 4 partitions
    .venv/bin/python bench/vs_kafka.py --quick    # 100,000 records: about a minute
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path

from _common import (
    MIB,
    BrokerProcess,
    ClientRun,
    confluent_consume,
    confluent_produce,
    machine,
    pid_cpu_seconds,
)

from tests.kafka_tools import kafka_jars, kafka_tool
from tests.support import free_port, wait_for

GIB = 1024 * MIB

# The producer settings of both clients: acks=all, batches of up to 256 KiB after at most 5 ms.
PRODUCER_SETTINGS: dict[str, str] = {"acks": "all", "linger.ms": "5", "batch.size": "262144"}
# The records go round the partitions, one each, with both clients (the Java producer's
# RoundRobinPartitioner; confluent_produce's ``partitions``): every broker gets the same layout.
# Left to the clients' sticky partitioners, keyless records landed 138 k / 256 k / 345 k /
# 260 k on the four partitions in one run and otherwise in the next, and a consumer fetching
# 1 MiB a partition makes as many fetches as the fullest partition needs, so the consume
# figures followed that draw more than the broker (up to 1.2 x between two runs).
JAVA_PARTITIONER = "partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner"

# confluent-kafka's fetch sizes: the Java perf consumer's (50 MiB a request, 1 MiB a partition,
# its --fetch-size default), which are librdkafka's defaults too. Larger ones (16 MiB a
# partition) were no faster against either broker and cost more client CPU and broker memory.
CONSUMER_SETTINGS: dict[str, int] = {"fetch.max.bytes": 50 * MIB, "max.partition.fetch.bytes": MIB}

# kafka-consumer-perf-test --print-metrics: "consumer-fetch-manager-metrics:fetch-latency-avg:
# {client-id=...}   : 5.123"
FETCH_LATENCY = r"consumer-fetch-manager-metrics:fetch-latency-avg:\{[^}]*\}\s*:\s*([\d.]+)"


@dataclass
class Side:
    """One broker's figures with Kafka's perf tools as the client."""

    name: str
    produce_mib_s: float
    produce_records_s: float
    p50_ms: float
    p99_ms: float
    consume_mib_s: float
    consume_records_s: float
    fetch_latency_ms: float  # the Java consumer's fetch-latency-avg (median over the runs)
    produce_cpu_s_per_gib: float
    consume_cpu_s_per_gib: float
    peak_rss_mib: float  # the broker's VmHWM after every run (both clients')
    records_per_partition: list[int]  # the layout every broker got


@dataclass
class ClientSide:
    """One broker's figures with confluent-kafka (librdkafka) as the client."""

    name: str
    produce_mib_s: float
    produce_records_s: float
    consume_mib_s: float
    consume_records_s: float
    produce_cpu_s_per_gib: float  # the broker's
    consume_cpu_s_per_gib: float
    client_produce_cpu_s_per_gib: float  # this process's (librdkafka's threads included)
    client_consume_cpu_s_per_gib: float
    peak_rss_mib: float  # the broker's VmHWM after every run (both clients')
    records_per_partition: list[int]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def apache_kafka(folder: Path, fsync: bool) -> Iterator[tuple[str, int]]:
    """A one-node KRaft Kafka on free ports; yields (bootstrap, pid)."""
    port, controller = free_port(), free_port()
    logs = folder / "logs"
    props = folder / "server.properties"
    lines = [
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={logs}",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
    ]
    if fsync:
        lines.append("log.flush.interval.messages=1")
    props.write_text("\n".join(lines) + "\n")
    classpath = f"{kafka_jars()}/*"
    quiet = "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"
    cluster_id = subprocess.run(
        ["java", quiet, "-cp", classpath, "kafka.tools.StorageTool", "random-uuid"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    subprocess.run(
        ["java", quiet, "-cp", classpath, "kafka.tools.StorageTool", "format"]
        + ["-t", cluster_id, "-c", str(props)],
        capture_output=True,
        check=True,
    )
    log_file = open(folder / "kafka.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        ["java", "-Xmx1g", "-Xms1g", quiet, "-cp", classpath, "kafka.Kafka", str(props)],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    bootstrap = f"127.0.0.1:{port}"
    try:
        wait_for(
            lambda: (
                kafka_tool(
                    "kafka-topics", "--bootstrap-server", bootstrap, "--list", check=False
                ).returncode
                == 0
            ),
            90,
            interval=1,
            what="Apache Kafka to serve",
        )
        yield bootstrap, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log_file.close()


@contextlib.contextmanager
def icefall_broker(folder: Path) -> Iterator[tuple[str, int]]:
    broker = BrokerProcess(folder / "home").start()
    try:
        assert broker.proc is not None
        yield broker.bootstrap, broker.proc.pid
    finally:
        broker.stop()


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    if not found:
        raise RuntimeError(f"no {pattern!r} in the tool's output:\n{text}")
    return float(found.group(1))


def consume_run(bootstrap: str, topic: str, records: int) -> tuple[float, float]:
    """One ``kafka-consumer-perf-test --print-metrics`` run: its fetch.time.ms in seconds (the
    read itself, without the group join) and the client's fetch-latency-avg in ms (the mean
    time from a fetch request sent to its response read: the broker's part of each round trip
    plus the network, not the client's decoding between fetches)."""
    out = kafka_tool(
        "kafka-consumer-perf-test",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--messages",
        str(records),
        "--timeout",
        "120000",
        "--print-metrics",
        timeout=1800,
    ).stdout
    lines = out.splitlines()
    # the figures are the line after the header; the metrics follow them
    header = next(i for i, line in enumerate(lines) if line.startswith("start.time"))
    fetch_ms = float(lines[header + 1].split(", ")[7])
    return fetch_ms / 1000, _number(FETCH_LATENCY, out)


@dataclass
class Running:
    """One running broker, its two topics (one per client) and what was measured on it."""

    name: str
    bootstrap: str
    pid: int
    perf_topic: str = ""
    ck_topic: str = ""
    perf_produced: str = ""  # kafka-producer-perf-test's summary line
    ck_produced: ClientRun | None = None
    produce_cpu: tuple[float, float] = (0.0, 0.0)  # broker CPU s: perf tools, confluent-kafka
    perf_runs: list[tuple[float, float]] = field(default_factory=list)  # (seconds, fetch ms)
    ck_runs: list[ClientRun] = field(default_factory=list)
    perf_layout: list[int] = field(default_factory=list)  # records per partition
    ck_layout: list[int] = field(default_factory=list)
    consume_cpu: list[float] = field(default_factory=lambda: [0.0, 0.0])  # as produce_cpu


def create_topic(bootstrap: str, prefix: str, partitions: int) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kafka_tool(
        "kafka-topics",
        "--bootstrap-server",
        bootstrap,
        "--create",
        "--topic",
        topic,
        "--partitions",
        str(partitions),
    )
    return topic


def records_per_partition(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """Each partition's high watermark (the records in it: the topic is new)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"layout-{uuid.uuid4().hex}"})
    try:
        return [
            int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1])
            for p in range(partitions)
        ]
    finally:
        consumer.close()


def produce(broker: Running, records: int, size: int, partitions: int) -> None:
    """Both clients' produce runs on ``broker`` (the other brokers idle meanwhile)."""
    broker.perf_topic = create_topic(broker.bootstrap, "perf", partitions)
    broker.ck_topic = create_topic(broker.bootstrap, "ck", partitions)
    cpu0 = pid_cpu_seconds(broker.pid)
    broker.perf_produced = (
        kafka_tool(
            "kafka-producer-perf-test",
            "--topic",
            broker.perf_topic,
            "--num-records",
            str(records),
            "--record-size",
            str(size),
            "--throughput",
            "-1",
            "--producer-props",
            f"bootstrap.servers={broker.bootstrap}",
            *(f"{key}={value}" for key, value in PRODUCER_SETTINGS.items()),
            JAVA_PARTITIONER,
            timeout=1800,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    cpu1 = pid_cpu_seconds(broker.pid)
    broker.ck_produced = confluent_produce(
        broker.bootstrap, broker.ck_topic, records, size, PRODUCER_SETTINGS, partitions
    )
    broker.produce_cpu = (cpu1 - cpu0, pid_cpu_seconds(broker.pid) - cpu1)
    broker.perf_layout = records_per_partition(broker.bootstrap, broker.perf_topic, partitions)
    broker.ck_layout = records_per_partition(broker.bootstrap, broker.ck_topic, partitions)


def consume_round(brokers: list[Running], records: int, size: int) -> None:
    """One consumer run of each client on each broker, the brokers taking turns: a drift of
    the machine or a JVM's warm-up over the runs touches every broker alike."""
    for broker in brokers:
        cpu0 = pid_cpu_seconds(broker.pid)
        broker.perf_runs.append(consume_run(broker.bootstrap, broker.perf_topic, records))
        broker.consume_cpu[0] += pid_cpu_seconds(broker.pid) - cpu0
    for broker in brokers:
        cpu0 = pid_cpu_seconds(broker.pid)
        run = confluent_consume(broker.bootstrap, broker.ck_topic, records, CONSUMER_SETTINGS)
        broker.consume_cpu[1] += pid_cpu_seconds(broker.pid) - cpu0
        if run.value_bytes != records * size:
            raise RuntimeError(f"read {run.value_bytes} B of {records * size} B")
        broker.ck_runs.append(run)


def perf_side(broker: Running, records: int, size: int) -> Side:
    gib, runs, produced = records * size / GIB, broker.perf_runs, broker.perf_produced
    fetch_seconds = statistics.median(seconds for seconds, _ in runs)
    return Side(
        name=broker.name,
        produce_mib_s=round(_number(r"\(([\d.]+) MB/sec\)", produced) * 1e6 / MIB, 1),
        produce_records_s=round(_number(r"([\d.]+) records/sec", produced)),
        p50_ms=_number(r"([\d.]+) ms 50th", produced),
        p99_ms=_number(r"([\d.]+) ms 99th", produced),
        consume_mib_s=round(records * size / MIB / fetch_seconds, 1),
        consume_records_s=round(records / fetch_seconds),
        fetch_latency_ms=round(statistics.median(latency for _, latency in runs), 1),
        produce_cpu_s_per_gib=round(broker.produce_cpu[0] / gib, 1),
        consume_cpu_s_per_gib=round(broker.consume_cpu[0] / gib / len(runs), 1),
        peak_rss_mib=round(peak_rss_mib(broker.pid)),
        records_per_partition=broker.perf_layout,
    )


def confluent_side(broker: Running, records: int, size: int) -> ClientSide:
    gib, runs, produced = records * size / GIB, broker.ck_runs, broker.ck_produced
    assert produced is not None
    seconds = statistics.median(run.seconds for run in runs)
    return ClientSide(
        name=broker.name,
        produce_mib_s=round(produced.mib_s, 1),
        produce_records_s=round(produced.records_s),
        consume_mib_s=round(records * size / MIB / seconds, 1),
        consume_records_s=round(records / seconds),
        produce_cpu_s_per_gib=round(broker.produce_cpu[1] / gib, 1),
        consume_cpu_s_per_gib=round(broker.consume_cpu[1] / gib / len(runs), 1),
        client_produce_cpu_s_per_gib=round(produced.client_cpu_s / gib, 1),
        client_consume_cpu_s_per_gib=round(
            sum(run.client_cpu_s for run in runs) / gib / len(runs), 1
        ),
        peak_rss_mib=round(peak_rss_mib(broker.pid)),
        records_per_partition=broker.ck_layout,
    )


def markdown(sides: list[Side], clients: list[ClientSide]) -> str:
    perf_tools = (
        "| broker | produce MiB/s | records/s | p50 ms | p99 ms | consume MiB/s | "
        "fetch latency avg ms | produce CPU s/GiB | consume CPU s/GiB | peak RSS MiB |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [
        f"| {s.name} | {s.produce_mib_s} | {s.produce_records_s} | {s.p50_ms:g} | {s.p99_ms:g} | "
        f"{s.consume_mib_s} | {s.fetch_latency_ms:g} | {s.produce_cpu_s_per_gib} | "
        f"{s.consume_cpu_s_per_gib} | {s.peak_rss_mib} |"
        for s in sides
    ]
    confluent = (
        "| broker (confluent-kafka) | produce MiB/s | records/s | consume MiB/s | records/s | "
        "produce CPU s/GiB | consume CPU s/GiB | client CPU s/GiB produce, consume | "
        "peak RSS MiB |\n|---|---|---|---|---|---|---|---|---|"
    )
    client_rows = [
        f"| {c.name} | {c.produce_mib_s} | {c.produce_records_s} | {c.consume_mib_s} | "
        f"{c.consume_records_s} | {c.produce_cpu_s_per_gib} | {c.consume_cpu_s_per_gib} | "
        f"{c.client_produce_cpu_s_per_gib}, {c.client_consume_cpu_s_per_gib} | "
        f"{c.peak_rss_mib} |"
        for c in clients
    ]
    return "\n".join([perf_tools, *rows, "", confluent, *client_rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=512)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="100,000 records (about a minute)")
    parser.add_argument(
        "--consume-runs",
        type=int,
        default=3,
        help="rounds of consumer runs (one per client per broker, the brokers taking turns); "
        "consume MiB/s is the median of a broker's runs (--quick: 1)",
    )
    args = parser.parse_args()
    if args.quick:
        args.records = 100_000
        args.consume_runs = 1
    starts = (
        ("Apache Kafka 4.1, fsync per message", lambda f: apache_kafka(f, fsync=True)),
        ("Apache Kafka 4.1, defaults", lambda f: apache_kafka(f, fsync=False)),
        ("Icefall", icefall_broker),
    )
    shape = (args.records, args.record_size)
    with tempfile.TemporaryDirectory(prefix="vs-kafka-") as tmp, contextlib.ExitStack() as stack:
        brokers: list[Running] = []
        for name, start in starts:
            where = Path(tmp) / name.split(",")[0].replace(" ", "-") / str(len(brokers))
            where.mkdir(parents=True)
            bootstrap, pid = stack.enter_context(start(where))
            brokers.append(Running(name, bootstrap, pid))
        for broker in brokers:
            produce(broker, *shape, args.partitions)
        for _ in range(args.consume_runs):
            consume_round(brokers, *shape)
        sides = [perf_side(broker, *shape) for broker in brokers]
        clients = [confluent_side(broker, *shape) for broker in brokers]
    print(json.dumps({"date": str(date.today()), "machine": machine(), "args": vars(args)}))
    for side in sides:
        print(json.dumps({"client": "perf tools", **asdict(side)}))
    for client in clients:
        print(json.dumps({"client": "confluent-kafka", **asdict(client)}))
    print(markdown(sides, clients))
    fsync, icefall = sides[0], sides[-1]
    ck_fsync, ck_icefall = clients[0], clients[-1]
    print(
        "ratio Icefall / Kafka (fsync): "
        f"perf tools produce {icefall.produce_mib_s / fsync.produce_mib_s:.2f}, "
        f"consume {icefall.consume_mib_s / fsync.consume_mib_s:.2f}; "
        f"confluent-kafka produce {ck_icefall.produce_mib_s / ck_fsync.produce_mib_s:.2f}, "
        f"consume {ck_icefall.consume_mib_s / ck_fsync.consume_mib_s:.2f}"
    )


if __name__ == "__main__":
    main()
