"""A cluster of three (then four) ``icefall broker`` processes sharing a real Postgres and one
object-store directory (issue 16): Metadata and DescribeCluster from every broker, routing
(NOT_LEADER_OR_FOLLOWER from a broker that does not lead), Kafka's own ``kafka-topics``,
``kill -9`` of a broker under acks=all idempotent producers and a consumer group (nothing
acknowledged lost, nothing twice, order kept), a broker coming back and a fourth joining
(leadership moves, no data copied), a clean SIGTERM hand-over, ``icefall cluster`` and its
move, the same node id refused.

One module-scoped cluster, the tests in order (each leaves it as the next expects): starting
brokers is the expensive part.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from kio.schema.errors import ErrorCode

from broker.kafka import records
from broker.membership import LISTED_LEASES
from tests.broker.clients import (
    ContinuousProducer,
    GroupReader,
    TimedProducer,
    create_topic,
    read_partitions,
    verify_log,
)
from tests.broker.rawkafka import _round_trip, produce_raw
from tests.kafka_tools import kafka_tool
from tests.postgres import PostgresServer
from tests.support import (
    CLUSTER_HEARTBEAT_MS,
    CLUSTER_LEASE_MS,
    ClusterBrokerProcess,
    icefall_cli,
    wait_for,
)
from tests.tls_certs import make_pki

log = logging.getLogger(__name__)

TOPIC = "orders"
PARTITIONS = 6
NOT_LEADER_OR_FOLLOWER = 6
# what a produce may get while Postgres is unreachable: NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT,
# KAFKA_STORAGE_ERROR (all retriable: a producer retries them)
RETRIABLE = {NOT_LEADER_OR_FOLLOWER, 7, 56}


class Cluster:
    def __init__(self, root: Path, postgres: PostgresServer) -> None:
        self.root = root
        self.postgres = postgres
        self.uri = ""
        self.objects = root / "objects"
        self.objects.mkdir()
        self.brokers: dict[int, ClusterBrokerProcess] = {}
        self.producers: list[ContinuousProducer] = []  # every one that wrote to TOPIC

    def broker(self, node_id: int) -> ClusterBrokerProcess:
        if node_id not in self.brokers:
            self.brokers[node_id] = ClusterBrokerProcess(
                self.root / f"node{node_id}",
                node_id,
                self.uri,
                str(self.objects),
                # small segment objects compacted all along: every read below goes through it
                extra_args=[
                    "--segment-compaction-interval-ms",
                    "1000",
                    "--segment-compaction-min-age-ms",
                    "1000",
                ],
            )
        return self.brokers[node_id]

    def live(self) -> list[ClusterBrokerProcess]:
        return [b for _, b in sorted(self.brokers.items()) if b.running]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.live())

    def stop(self) -> None:
        for b in self.brokers.values():
            try:
                b.stop()
            except Exception:  # the next one is stopped still
                log.exception("stopping broker %d", b.node_id)


def broker_configs_raw(bootstrap: str, broker_id: str) -> Any:
    """DescribeConfigs v4 of the BROKER resource ``broker_id``, sent to ``bootstrap`` whatever
    the id (an admin client would send it to that broker)."""
    from kio.schema.describe_configs.v4.request import (
        DescribeConfigsRequest,
        DescribeConfigsResource,
    )
    from kio.schema.describe_configs.v4.response import DescribeConfigsResponse
    from kio.static.primitive import i8

    request = DescribeConfigsRequest(
        resources=(
            DescribeConfigsResource(
                resource_type=i8(4), resource_name=broker_id, configuration_keys=None
            ),
        ),
        include_synonyms=False,
        include_documentation=False,
    )
    return _round_trip(bootstrap, 32, 4, request, DescribeConfigsResponse)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    postgres = PostgresServer().start()
    started = Cluster(tmp_path_factory.mktemp("cluster"), postgres)
    try:
        started.uri = postgres.create_database("cluster")
        for node_id in (1, 2, 3):
            started.broker(node_id).start()
        yield started
    finally:
        started.stop()
        postgres.stop()


def leaders(bootstrap: str, topic: str = TOPIC) -> tuple[set[int], dict[int, int]]:
    """(broker ids, partition -> leader) from one broker's Metadata."""
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    found = md.topics[topic]
    assert found.error is None, found.error
    return set(md.brokers), {p: found.partitions[p].leader for p in found.partitions}


def settled_topic(cluster: Cluster, topic: str, expected: set[int]) -> dict[int, int] | None:
    """partition -> leader of ``topic`` when the first live broker sees every one led."""
    ids, by_partition = leaders(cluster.live()[0].bootstrap, topic)
    if ids != expected or not set(by_partition.values()) <= expected:
        return None
    return by_partition


def settled(
    cluster: Cluster, expected: set[int], leading: frozenset[int] = frozenset()
) -> dict[int, int] | None:
    """partition -> leader when every live broker answers the same: ``expected`` brokers,
    every partition led by one of them (and some by each broker of ``leading``)."""
    seen = []
    for b in cluster.live():
        ids, by_partition = leaders(b.bootstrap)
        if ids != expected or len(by_partition) != PARTITIONS:
            return None
        if not set(by_partition.values()) <= expected:
            return None
        seen.append(by_partition)
    if not all(s == seen[0] for s in seen) or not leading <= set(seen[0].values()):
        return None
    return seen[0]


def spread_evenly(cluster: Cluster) -> dict[int, int] | None:
    """partition -> leader once brokers 1, 2 and 3 lead their fair share (2 each) of TOPIC."""
    found = settled(cluster, {1, 2, 3})
    return found if found and sorted(found.values()) == [1, 1, 2, 2, 3, 3] else None


def move_leadership(cluster: Cluster, partition: int, to: int) -> subprocess.CompletedProcess[str]:
    """``icefall cluster move`` of TOPIC's ``partition`` to broker ``to``, asked of broker 1."""
    return icefall_cli(
        "cluster",
        "--admin-url",
        cluster.brokers[1].admin_url,
        "move",
        "--topic",
        TOPIC,
        "--partition",
        str(partition),
        "--to",
        str(to),
    )


def test_every_broker_tells_the_same_truth_and_routes_by_leader(cluster: Cluster) -> None:
    create_topic(cluster.brokers[1].bootstrap, TOPIC, PARTITIONS)

    by_partition = wait_for(
        lambda: spread_evenly(cluster), 30, 0.2, "three brokers leading two partitions each"
    )

    # a produce sent to a broker that does not lead the partition: NOT_LEADER_OR_FOLLOWER
    create_topic(cluster.brokers[1].bootstrap, "raw", 1)
    leader = wait_for(
        lambda: next(
            (n for n in [leaders(cluster.brokers[1].bootstrap, "raw")[1][0]] if n > 0), None
        ),
        30,
        0.2,
        "raw-0's leader",
    )
    batch = records.encode_batch([(b"k", b"v")], int(time.time() * 1000))
    other = next(b for b in cluster.live() if b.node_id != leader)
    # (the other broker learns of the new topic within a heartbeat: until then it is unknown)
    refused = wait_for(
        lambda: next(
            (c for c in [produce_raw(other.bootstrap, "raw", 0, batch)[0]] if c != 3), None
        ),
        10,
        0.1,
        "the other broker knowing raw",
    )
    assert refused == NOT_LEADER_OR_FOLLOWER
    assert produce_raw(cluster.brokers[leader].bootstrap, "raw", 0, batch) == (0, 0)

    # DescribeCluster through Kafka's own tools: three brokers, the lowest id the controller
    described = kafka_tool(
        "kafka-topics", "--bootstrap-server", other.bootstrap, "--describe", "--topic", TOPIC
    ).stdout
    for p, node in by_partition.items():
        assert f"Partition: {p}\tLeader: {node}\t" in described, described

    # DescribeCluster from every broker: the live brokers, the lowest id the controller
    for b in cluster.live():
        admin = AdminClient({"bootstrap.servers": b.bootstrap})  # kept: the future needs it
        described_cluster = admin.describe_cluster().result(10)
        assert sorted(n.id for n in described_cluster.nodes) == [1, 2, 3]
        assert described_cluster.controller.id == 1

    # a topic config changed through one broker is seen through another within a heartbeat
    resource = ConfigResource(ConfigResource.Type.TOPIC, TOPIC)
    change = ConfigEntry("retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET)
    resource.add_incremental_config(change)
    admin2 = AdminClient({"bootstrap.servers": cluster.brokers[2].bootstrap})
    admin2.incremental_alter_configs([resource])[resource].result(10)
    admin3 = AdminClient({"bootstrap.servers": cluster.brokers[3].bootstrap})

    def seen_on_3() -> bool:
        asked = ConfigResource(ConfigResource.Type.TOPIC, TOPIC)
        configs = admin3.describe_configs([asked])[asked].result(10)
        return configs["retention.ms"].value == "86400000"

    wait_for(seen_on_3, 10, 0.1, "broker 3 to see the config set through broker 2")
    # a BROKER resource is that broker's to describe: broker 3 refuses broker 2's, and a
    # broker that does not exist, each with a message naming why
    for name, reason in (("2", "ask broker 2"), ("99", "the brokers are 1, 2, 3")):
        [result] = broker_configs_raw(cluster.brokers[3].bootstrap, name).results
        assert result.error_code == ErrorCode.invalid_request, result
        assert result.error_message is not None and reason in result.error_message

    # CreateTopics with a replica assignment: each partition is led by the broker it names
    placed = {0: 3, 1: 3, 2: 2}
    admin1 = AdminClient({"bootstrap.servers": cluster.brokers[1].bootstrap})
    assigned = NewTopic(
        "assigned", len(placed), replica_assignment=[[placed[p]] for p in sorted(placed)]
    )
    admin1.create_topics([assigned])["assigned"].result(10)
    wait_for(
        lambda: settled_topic(cluster, "assigned", {1, 2, 3}) == placed,
        30,
        0.2,
        "each partition of 'assigned' led by the broker its assignment names",
    )
    for bad, reason in (([[2, 3]], "one replica"), ([[9]], "broker 9 is not live")):
        bad_topic = NewTopic("refused", len(bad), replica_assignment=bad)
        with pytest.raises(KafkaException, match=reason):
            admin1.create_topics([bad_topic])["refused"].result(10)

    # icefall cluster: the brokers and each partition's leader and epoch, from any broker
    shown = icefall_cli("cluster", "--admin-url", other.admin_url)
    assert shown.returncode == 0, shown.stderr
    assert "controller 1" in shown.stdout
    for p, node in by_partition.items():
        assert any(
            line.split()[:3] == [TOPIC, str(p), str(node)] for line in shown.stdout.splitlines()
        ), shown.stdout


def test_the_same_node_id_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    twin = ClusterBrokerProcess(tmp_path / "twin", 2, cluster.uri, str(cluster.objects))
    with pytest.raises(RuntimeError) as refused:
        twin.start()
    assert twin.proc is not None and twin.proc.returncode == 2
    assert "node id 2 is in use" in str(refused.value)


def read_committed(client: dict[str, Any], topic: str, partitions: int) -> dict[int, list[str]]:
    """Every partition of ``topic`` from offset 0 to its end as a read_committed consumer
    (``client``: how it connects) sees it: the values of committed transactions, per partition."""
    consumer = Consumer(
        {
            **client,
            "group.id": f"txn-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[int, list[str]] = {p: [] for p in range(partitions)}
    ended: set[int] = set()

    def all_read() -> bool:
        for msg in consumer.consume(100, 0.2):
            error, partition, value = msg.error(), msg.partition(), msg.value()
            assert partition is not None
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                ended.add(partition)
                continue
            assert value is not None
            got[partition].append(value.decode())
        return ended == set(range(partitions))

    try:
        wait_for(all_read, 60, 0, f"every {topic} partition read to its end")
    finally:
        consumer.close()
    return got


def test_a_transaction_over_partitions_of_every_broker_commits_and_aborts(
    cluster: Cluster,
) -> None:
    """The coordinator (the leader of the transactional id's slot) writes the markers into
    the partitions it leads and sends WriteTxnMarkers to the leaders of the others."""
    create_topic(cluster.brokers[1].bootstrap, "txn", PARTITIONS)
    by_partition = wait_for(
        lambda: settled_topic(cluster, "txn", {1, 2, 3}), 30, 0.2, "txn's leaders"
    )
    assert set(by_partition.values()) == {1, 2, 3}
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "transactional.id": f"tx-{uuid.uuid4().hex[:6]}",
            "transaction.timeout.ms": 60000,
        }
    )
    producer.init_transactions(30)
    for outcome in ("commit", "abort", "commit"):
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.produce("txn", value=f"{outcome}-{p}".encode(), partition=p)
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    got = read_committed({"bootstrap.servers": cluster.bootstrap}, "txn", PARTITIONS)
    assert got == {p: [f"commit-{p}", f"commit-{p}"] for p in range(PARTITIONS)}, got


def test_a_stalled_broker_stays_listed_while_its_partitions_move(cluster: Cluster) -> None:
    """SIGSTOP of broker 3 for longer than a lease (what a starved machine does to it): the
    others take its partitions, and their Metadata still lists broker 3. librdkafka drops a
    broker missing from Metadata and counts every produce it had in flight there as never
    written ("Broker handle destroyed", re-sent even with ``retries=0``); broker 3 may have
    written some before it stalled, so dropping it would duplicate them. Continued, broker 3
    answers what it had, loses its leases and takes its share back."""
    before = wait_for(lambda: settled(cluster, {1, 2, 3}), 30, 0.2, "a settled cluster")
    stalled = cluster.brokers[3]
    theirs = sorted(p for p, node in before.items() if node == 3)
    assert theirs and stalled.proc is not None
    stalled.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:

        def moved() -> tuple[set[int], dict[int, int]] | None:
            ids, by_partition = leaders(cluster.brokers[1].bootstrap)
            return (ids, by_partition) if all(by_partition[p] in (1, 2) for p in theirs) else None

        ids, _ = wait_for(moved, 30, 0.2, "broker 3's partitions led by brokers 1 and 2")
        moved_s = time.monotonic() - stopped
        # listed until LISTED_LEASES leases after its last heartbeat (at most a heartbeat
        # before the stop); the partitions move about a lease in
        listed_s = (LISTED_LEASES * CLUSTER_LEASE_MS - CLUSTER_HEARTBEAT_MS) / 1000
        assert moved_s < listed_s, f"the move took {moved_s:.1f}s: too slow to tell"
        assert ids == {1, 2, 3}, f"broker 3 left Metadata {moved_s:.1f}s into its stall: {ids}"
        # still listed, so still a broker whose configs are its own to describe
        [result] = broker_configs_raw(cluster.brokers[1].bootstrap, "3").results
        assert result.error_message is not None and "ask broker 3" in result.error_message
    finally:
        stalled.proc.send_signal(signal.SIGCONT)
    # as the kill test expects to start
    wait_for(lambda: spread_evenly(cluster), 30, 0.2, "broker 3 leading two partitions again")


def test_kill_9_under_load_loses_nothing_and_moves_leaders(cluster: Cluster) -> None:
    """kill -9 of broker 2: its partitions move, and once it has been silent for
    ``LISTED_LEASES`` leases it leaves Metadata too (``settled`` asks both)."""
    before = wait_for(lambda: settled(cluster, {1, 2, 3}), 30, 0.2, "a settled cluster")
    producer = TimedProducer(
        cluster.bootstrap, TOPIC, "kill", conf={"enable.idempotence": True}, rate=500
    )
    producer.start()
    group = GroupReader(cluster.bootstrap, TOPIC, f"g-{uuid.uuid4().hex[:6]}")
    try:
        wait_for(lambda: producer.acked_count >= 500, 60, 0.1, "500 acknowledged records")
        victim = cluster.brokers[2]
        moved = sorted(p for p, node in before.items() if node == victim.node_id)
        producer.mark(time.monotonic())
        victim.kill9()
        after = wait_for(lambda: settled(cluster, {1, 3}), 30, 0.2, "leaders after the kill")
        assert all(after[p] in (1, 3) for p in moved)
        wait_for(
            lambda: all(p in producer.first_after for p in moved),
            60,
            0.1,
            "a successful produce on every moved partition",
        )
        log.warning(
            "kill -9 of broker 2 to the first acknowledged record produced after it, per moved partition: %s",
            {p: f"{producer.first_after[p]:.2f}s" for p in moved},
        )
        acked_after_kill = producer.acked_count
        wait_for(
            lambda: producer.acked_count >= acked_after_kill + 300, 60, 0.1, "producing goes on"
        )
    finally:
        cluster.producers.append(producer)
        producer.stop()
    assert producer.failed == [], producer.failed[:5]  # the idempotent producer retried them all
    # the leaders compacted the small objects of the load (check_log reads them back)
    wait_for(lambda: sum(compacted_chunks(b) for b in cluster.live()) > 0, 30, 0.2, "a compaction")
    check_log(cluster)
    # the consumer group goes on: it gets every acknowledged record (at least once)
    try:
        wait_for(
            lambda: set(producer.acked) <= group.values,
            60,
            0.2,
            "the group consumed every acknowledged record",
        )
        group.halt()
        # its offsets were committed at the group's coordinator, whichever broker leads each
        committed = group.consumer.committed(
            [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10
        )
        assert all(tp.offset > 0 for tp in committed), committed
    finally:
        group.stop()


def compacted_chunks(broker: ClusterBrokerProcess) -> int:
    """``icefall_compaction_chunks_total`` on the broker's /metrics."""
    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("icefall_compaction_chunks_total")
    )


def check_log(cluster: Cluster) -> None:
    """Read back from the cluster: every acknowledged record at its offset, 0 lost, 0 twice,
    offsets contiguous, each producer's records in order in every partition."""
    live = {b.node_id for b in cluster.live()}
    wait_for(lambda: settled(cluster, live), 30, 0.2, "every partition led before reading")
    got = read_partitions(cluster.bootstrap, TOPIC, PARTITIONS, timeout=60)
    verify_log(got, cluster.producers)
    for p, entries in got.items():
        by_producer: dict[str, list[int]] = {}
        for _, v in entries:
            assert v is not None
            name, _, n = v.decode().rpartition("-")
            by_producer.setdefault(name, []).append(int(n))
        for name, ns in by_producer.items():
            assert ns == sorted(ns), f"partition {p}: {name}'s records out of order"


def brokers_1_and_3_only(cluster: Cluster) -> None:
    """The state the next test starts from, whatever ran before it (or nothing did): brokers 1
    and 3 up, 2 down (as after the kill test), no 4, and the topic there."""
    for node_id in (1, 3):
        if not cluster.broker(node_id).running:
            cluster.broker(node_id).start()
    for node_id in (2, 4):
        if node_id in cluster.brokers and cluster.brokers[node_id].running:
            cluster.brokers[node_id].stop()
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10)
    if TOPIC not in md.topics:
        create_topic(cluster.brokers[1].bootstrap, TOPIC, PARTITIONS)
    wait_for(lambda: settled(cluster, {1, 3}), 30, 0.2, "brokers 1 and 3 leading everything")


def test_a_broker_back_and_a_new_one_take_partitions_and_sigterm_hands_over(
    cluster: Cluster,
) -> None:
    brokers_1_and_3_only(cluster)
    cluster.brokers[2].start()
    cluster.broker(4).start()
    by_partition = wait_for(
        lambda: settled(cluster, {1, 2, 3, 4}, leading=frozenset({2, 4})),
        60,
        0.2,
        "brokers 2 (back) and 4 (new) leading partitions",
    )
    assert max(list(by_partition.values()).count(n) for n in (1, 2, 3, 4)) <= 2

    producer = TimedProducer(
        cluster.bootstrap, TOPIC, "term", conf={"enable.idempotence": True}, rate=500
    )
    producer.start()
    try:
        wait_for(lambda: producer.acked_count >= 300, 60, 0.1, "300 acknowledged records")
        assert cluster.brokers[4].stop() == 0
        wait_for(lambda: settled(cluster, {1, 2, 3}), 30, 0.2, "broker 4's partitions taken over")
        acked = producer.acked_count
        wait_for(lambda: producer.acked_count >= acked + 300, 60, 0.1, "producing goes on")
    finally:
        cluster.producers.append(producer)
        producer.stop()
    assert producer.failed == [], producer.failed[:5]  # retriable errors only: all retried
    check_log(cluster)

    # icefall cluster move: leadership of partition 0 to broker 3 (no data copied)
    moved = move_leadership(cluster, 0, 3)
    assert moved.returncode == 0, moved.stderr
    wait_for(
        lambda: (s := settled(cluster, {1, 2, 3})) and s[0] == 3,
        30,
        0.2,
        "partition 0 led by broker 3",
    )
    refused = move_leadership(cluster, 0, 9)
    assert refused.returncode == 2 and "broker 9 is not live" in refused.stderr

    # Kafka's own kafka-reassign-partitions: one replica, on broker 1, moves the leadership
    plan = cluster.root / "reassign.json"
    plan.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": TOPIC, "partition": 1, "replicas": [1]}]}
        )
    )
    kafka_tool(
        "kafka-reassign-partitions",
        "--bootstrap-server",
        cluster.brokers[2].bootstrap,
        "--reassignment-json-file",
        str(plan),
        "--execute",
    )
    wait_for(
        lambda: (s := settled(cluster, {1, 2, 3})) is not None and s[1] == 1,
        30,
        0.2,
        "partition 1 led by broker 1",
    )


def _raw_leader(cluster: Cluster) -> ClusterBrokerProcess | None:
    """The broker leading raw-0, as the first live broker's Metadata says."""
    node = leaders(cluster.live()[0].bootstrap, "raw")[1][0]
    return cluster.brokers.get(node) if node > 0 else None


def _raw_produce(cluster: Cluster) -> int:
    """The error code of one record produced to raw-0 at its leader (-1: no leader)."""
    leader = _raw_leader(cluster)
    if leader is None:
        return -1
    batch = records.encode_batch([(b"k", b"v")], int(time.time() * 1000))
    return produce_raw(leader.bootstrap, "raw", 0, batch)[0]


def test_postgres_unreachable_refuses_writes_retriably_and_they_resume(cluster: Cluster) -> None:
    wait_for(lambda: settled(cluster, {1, 2, 3}), 30, 0.2, "a settled cluster")
    assert _raw_produce(cluster) == 0
    producer = TimedProducer(
        cluster.bootstrap,
        TOPIC,
        "pg",
        conf={"enable.idempotence": True, "message.timeout.ms": 120000},
        rate=300,
    )
    producer.start()
    try:
        wait_for(lambda: producer.acked_count >= 200, 60, 0.1, "200 acknowledged records")
        cluster.postgres.pause()
        try:
            refused = wait_for(
                lambda: next((c for c in [_raw_produce(cluster)] if c in RETRIABLE), None),
                30,
                0.2,
                "a retriable refusal while Postgres is down",
            )
            log.warning("produce while Postgres is down: error code %d", refused)
        finally:
            cluster.postgres.resume()
        wait_for(lambda: _raw_produce(cluster) == 0, 60, 0.3, "produce accepted again")
        acked = producer.acked_count
        wait_for(lambda: producer.acked_count >= acked + 200, 60, 0.1, "producing goes on")
    finally:
        cluster.producers.append(producer)
        producer.stop()
    assert producer.failed == [], producer.failed[:5]
    check_log(cluster)


def test_a_transaction_spans_brokers_that_only_have_sasl_ssl_listeners(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Brokers whose only listener is SASL_SSL (an authorizer on, the brokers' user a super
    user): the coordinator's WriteTxnMarkers reach the other broker over TLS, authenticated
    with SCRAM as the broker's own user (``inter.broker.listener.name``,
    ``sasl.mechanism.inter.broker.protocol``, the listener's JAAS username/password), so a
    transaction over partitions of both commits. Its own database: two brokers beside the
    module's cluster."""
    pki = make_pki(tmp_path / "pki")
    uri = cluster.postgres.create_database("secured")
    secured: list[ClusterBrokerProcess] = []
    for node_id in (1, 2):
        broker = ClusterBrokerProcess(
            tmp_path / f"node{node_id}", node_id, uri, str(tmp_path / "objects")
        )
        props = tmp_path / f"node{node_id}.properties"
        props.write_text(
            f"listeners=SECURE://127.0.0.1:{broker.kafka_port}\n"
            "listener.security.protocol.map=SECURE:SASL_SSL\n"
            "inter.broker.listener.name=SECURE\n"
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512\n"
            f"ssl.keystore.location={pki.server}\n"
            f"ssl.truststore.location={pki.ca}\n"
            "listener.name.secure.sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN\n"
            "listener.name.secure.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            'username="broker" password="broker-secret";\n'
            "listener.name.secure.plain.sasl.jaas.config="
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            'user_app="app-secret";\n'
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n"
            "allow.everyone.if.no.acl.found=true\n"
            "super.users=User:broker\n"
        )
        broker.extra_args += ["--config", str(props)]
        secured.append(broker)
    added = icefall_cli(
        "scram-add",
        "--config",
        str(tmp_path / "node1.properties"),
        "--metadata-uri",
        uri,
        "--mechanism",
        "SCRAM-SHA-512",
        "--password",
        "broker-secret",
        "--user",
        "broker",
    )
    assert added.returncode == 0, added.stderr
    client: dict[str, str | int | float | bool] = {
        "bootstrap.servers": ",".join(b.bootstrap for b in secured),
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca),
        "sasl.mechanism": "PLAIN",
        "sasl.username": "app",
        "sasl.password": "app-secret",
    }
    try:
        for broker in secured:
            broker.start()
        admin = AdminClient(client)
        for future in admin.create_topics([NewTopic("sectxn", 4, 1)]).values():
            future.result(10)

        def both_lead() -> bool:
            md = AdminClient(client).list_topics("sectxn", timeout=10)
            found = {p.leader for p in md.topics["sectxn"].partitions.values()}
            return found == {1, 2} and len(md.brokers) == 2

        wait_for(both_lead, 30, 0.2, "both secured brokers leading sectxn")
        producer = Producer({**client, "transactional.id": f"sec-{uuid.uuid4().hex[:6]}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for p in range(4):
            producer.produce("sectxn", value=f"v{p}".encode(), partition=p)
        producer.commit_transaction(30)
        got = read_committed(client, "sectxn", 4)
        assert got == {p: [f"v{p}"] for p in range(4)}, got
    finally:
        for broker in secured:
            broker.stop()
