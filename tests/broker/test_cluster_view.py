"""The whole cluster seen from any broker (issue 16): three ``icefall broker`` processes on one
real Postgres (metadata and the REST catalog's tables), one object store directory.

- the admin API the commit rounds and Airflow use answers on every broker for every partition,
  the ones it does not lead from the Postgres index, and the same as the leader answers;
  ``/v1/cluster`` lists the live brokers, ``/metrics`` carries the node id;
- the schema registry on every broker: a real confluent-kafka Avro serializer registers through
  a broker that is not the writer (the write is forwarded), every broker then serves the id;
  the writer moving (clean stop, then kill -9) loses nothing and never reuses an id;
- the REST catalog on every broker: two brokers' commits race, one wins, the other gets 409.
"""

from __future__ import annotations

import json
import struct
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient as KafkaAdmin
from confluent_kafka.admin import NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from broker.admin_client import AdminClient
from broker.storage import index_view
from broker.storage.logstore import ProducerState
from broker.storage.metadata import BatchRef, Chunk, MetadataStore, pack_batch_index
from tests.broker.catalog.helpers import SCHEMA, Http
from tests.postgres import PostgresServer
from tests.postgres import postgres as postgres  # one server for the module
from tests.support import BrokerProcess, ClusterBrokerProcess, free_port, wait_for

LEASE_MS = 3000
NODES = (1, 2, 3)
PARTITIONS = 3
RECORDS = 40  # per partition


class Cluster:
    def __init__(self, brokers: dict[int, ClusterBrokerProcess]) -> None:
        self.brokers = brokers

    def live(self) -> dict[int, BrokerProcess]:
        return {n: b for n, b in self.brokers.items() if b.proc and b.proc.poll() is None}

    def any(self) -> BrokerProcess:
        return next(iter(self.live().values()))

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.live().values())

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> leader node id, as the assignment says (-1: none yet)."""
        answer = self.any().admin("/v1/cluster/assignment")
        return {p["partition"]: p["leader"] for p in answer["partitions"] if p["topic"] == topic}

    def settled(self, topic: str, partitions: int) -> dict[int, int] | None:
        leaders = self.leaders(topic)
        live = set(self.live())
        ok = len(leaders) == partitions and all(n in live for n in leaders.values())
        return leaders if ok else None


@pytest.fixture(scope="module")
def cluster(
    postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    brokers: dict[int, ClusterBrokerProcess] = {}
    try:
        metadata = postgres.create_database("icefall")
        catalog = postgres.create_database("catalog").replace(
            "postgresql://", "postgresql+psycopg://"
        )
        shared = ["--catalog-uri", catalog, "--warehouse", str(root / "warehouse")]
        brokers = {
            n: ClusterBrokerProcess(
                root / f"b{n}",
                n,
                metadata,
                str(root / "objects"),
                lease_ms=LEASE_MS,
                heartbeat_ms=200,
                extra_args=shared,
            )
            for n in NODES
        }
        with ThreadPoolExecutor(len(NODES)) as pool:  # together: they race to create _schemas
            list(pool.map(lambda b: b.start(60), brokers.values()))
        view = Cluster(brokers)
        wait_for(
            lambda: all(
                len(b.admin("/v1/cluster")["brokers"]) == len(NODES) for b in brokers.values()
            ),
            30,
            what="every broker lists three live brokers",
        )
        wait_for(lambda: view.settled("_schemas", 1), 30, what="a registry writer")
        yield view
    finally:
        for b in brokers.values():
            b.stop()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _status(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_index_view_of_a_partition_is_what_its_leader_indexed(
    postgres: PostgresServer,
) -> None:
    """The seam, in-process: chunks, log start, aborted and open transactions, as committed."""
    metadata = MetadataStore(postgres.create_database("view"))
    try:
        metadata.create_topic("t", 2, {})
        refs = [BatchRef(10, 0, 100, 1_000, 900), BatchRef(15, 100, 50, 1_005, 950)]
        chunks = [
            Chunk("t", 1, 10, 20, "segments/a.seg", 0, 150, 1_000, 1_005, pack_batch_index(refs)),
            Chunk(
                "t",
                1,
                20,
                30,
                "segments/b.seg",
                64,
                96,
                1_010,
                1_010,
                pack_batch_index([BatchRef(20, 0, 32, 1_010, 990)]),
            ),
        ]
        open_txn = ProducerState(3, [(0, 4, 20)], txn_first_offset=20)
        metadata.add_chunks(
            chunks,
            {
                ("t", 1, 7): open_txn.to_json(),
                ("t", 1, 8): ProducerState(1, [(0, 9, 10)]).to_json(),
            },
            [("t", 1, 9, 12, 14)],
        )
        metadata.drop_chunks_before("t", 1, 5)  # nothing below 5: only the log start moves
        view = index_view.partition_view(metadata, "t", 1)
        assert view.chunks == chunks and view.log_start_offset == 5
        assert view.high_watermark == view.flushed_offset == view.next_offset == 30
        assert view.last_stable_offset == 20  # producer 7's transaction is still open
        assert view.aborted_between(0, 30) == [(9, 12, 14)]
        assert view.producers[8].last_sequence == 9 and not view.tail
        assert index_view.end_offset(metadata, "t", 1) == 30
        assert index_view.partition_view(metadata, "t", 1, (20, 25)).chunks == chunks[1:]
        assert index_view.partition_view(metadata, "t", 1, (12, 21)).chunks == chunks
        empty = index_view.partition_view(metadata, "t", 0)
        assert empty.high_watermark == empty.log_start_offset == 0 and not empty.chunks
        assert index_view.end_offset(metadata, "t", 0) == 0
    finally:
        metadata.close()


def test_the_admin_api_answers_for_every_partition_on_every_broker(cluster: Cluster) -> None:
    topic = "whole-view"
    admin = KafkaAdmin({"bootstrap.servers": cluster.bootstrap})  # kept: its futures need it
    admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result(30)
    leaders = wait_for(lambda: cluster.settled(topic, PARTITIONS), 30, what="leaders")
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        for p in range(PARTITIONS):
            producer.produce(topic, value=f"{p}:{i}".encode(), partition=p)
    assert producer.flush(60) == 0
    leaders = cluster.settled(topic, PARTITIONS) or leaders
    brokers = cluster.live()

    # every broker lists the live brokers, says who it is, and tags its metrics with it
    for node, broker in brokers.items():
        info = AdminClient(broker.admin_url).cluster()
        assert info.node_id == node
        assert [m.node_id for m in info.brokers] == sorted(brokers)
        assert {m.endpoints["registry"] for m in info.brokers} == {
            f"http://127.0.0.1:{b.registry_port}" for b in brokers.values()
        }
        with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert f'node_id="{node}"' in metrics
        flushed = AdminClient(broker.admin_url).flush()  # cluster mode: acks already waited
        assert flushed.bytes_written == 0 and flushed.note and "cluster mode" in flushed.note

    # what the leader of each partition answers, every other broker answers too (from the index)
    for p, leader in leaders.items():
        own = AdminClient(brokers[leader].admin_url)
        plan = own.flushed_plan(topic, None)
        mine = next(x for x in plan.partitions if x.partition == p)
        assert mine.end_offset == mine.high_watermark == RECORDS and mine.flushed
        ranges = own.ranges(topic, p, 0, RECORDS)
        offsets = next(x for x in own.offsets(topic).partitions if x.partition == p)
        pending = next(x for x in own.pending(topic).partitions if x.partition == p)
        for node in brokers:
            if node == leader:
                continue
            other = AdminClient(brokers[node].admin_url)
            assert (
                next(x for x in other.flushed_plan(topic, None).partitions if x.partition == p)
                == mine
            ), (node, p)
            later = other.plan(topic, 2**62)  # until far ahead: every appended batch
            assert next(x for x in later.partitions if x.partition == p).end_offset == RECORDS
            assert other.ranges(topic, p, 0, RECORDS) == ranges, (node, p)
            for start, end in ((RECORDS // 3, RECORDS // 2), (RECORDS, RECORDS)):  # a part, none
                assert other.ranges(topic, p, start, end) == own.ranges(topic, p, start, end)
            assert next(x for x in other.offsets(topic).partitions if x.partition == p) == offsets
            assert next(x for x in other.pending(topic).partitions if x.partition == p) == pending
    # a client given every broker's admin API goes on when the first one does not answer
    down = f"http://127.0.0.1:{free_port()}"
    several = AdminClient(",".join([down, *(b.admin_url for b in brokers.values())]))
    assert several.cluster().node_id in brokers and several.url != down
    # the ranges name the segment objects every broker (and a round's executors) reads
    assert all(r.object_key for r in ranges.ranges) and ranges.ranges[0].first_offset == 0
    assert len(set(leaders.values())) > 1, f"one broker leads everything: {leaders}"


AVRO = json.dumps(
    {
        "type": "record",
        "name": "Click",
        "namespace": "icefall.cluster",
        "fields": [{"name": "user", "type": "string"}, {"name": "n", "type": "long"}],
    }
)


def _writer(cluster: Cluster) -> int:
    leaders = wait_for(lambda: cluster.settled("_schemas", 1), 30, what="a registry writer")
    return leaders[0]


def _schema_everywhere(cluster: Cluster, schema_id: int) -> None:
    for broker in cluster.live().values():
        wait_for(
            lambda b=broker: _get(f"{b.registry_url}/schemas/ids/{schema_id}"),  # type: ignore[misc]
            10,
            what=f"schema id {schema_id} on broker {broker.registry_url}",
        )


def test_the_registry_answers_on_every_broker_with_one_writer(cluster: Cluster) -> None:
    writer = _writer(cluster)
    follower = next(n for n in cluster.live() if n != writer)
    other = next(n for n in cluster.live() if n not in (writer, follower))
    brokers = cluster.live()
    topic = "clicks-avro"
    # a real serializer against a broker that is not the writer: the registration is forwarded
    client = SchemaRegistryClient({"url": brokers[follower].registry_url})
    serialize = AvroSerializer(client, AVRO)
    values = [{"user": f"u{i}", "n": i} for i in range(10)]
    encoded = [serialize(v, SerializationContext(topic, MessageField.VALUE)) for v in values]
    first = encoded[0]
    assert first is not None and first[0] == 0
    schema_id = struct.unpack(">I", first[1:5])[0]
    # the broker it went through has it at once; the others within a moment
    assert _get(f"{brokers[follower].registry_url}/schemas/ids/{schema_id}")["schema"]
    _schema_everywhere(cluster, schema_id)
    versions = _get(f"{brokers[writer].registry_url}/subjects/{topic}-value/versions")
    assert versions == [1]

    admin = KafkaAdmin({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1)])[topic].result(30)
    wait_for(lambda: cluster.settled(topic, 1), 30, what=f"a leader of {topic}")
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    failed: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(error)

    for data in encoded:
        producer.produce(topic, value=data, on_delivery=delivered)
    assert producer.flush(30) == 0 and not failed, failed
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[bytes] = []
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": brokers[other].registry_url}))

    def read() -> bool:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got.append(message.value())  # type: ignore[arg-type]
        return len(got) == len(values)

    try:
        wait_for(read, 60, interval=0, what="the Avro records back")
    finally:
        consumer.close()
    context = SerializationContext(topic, MessageField.VALUE)
    assert [deserialize(m, context) for m in got] == values

    # a config write through a follower lands on the writer; an incompatible schema is refused
    # by the writer, and the follower passes its answer on as it is
    status, body = _status(
        f"{brokers[other].registry_url}/config/{topic}-value", "PUT", {"compatibility": "FULL"}
    )
    assert status == 200 and body == {"compatibility": "FULL"}
    wait_for(
        lambda: (
            _get(f"{brokers[writer].registry_url}/config/{topic}-value").get("compatibilityLevel")
            == "FULL"
        ),
        10,
        what="the config on the writer",
    )
    incompatible = json.dumps(
        {"type": "record", "name": "Click", "fields": [{"name": "x", "type": "int"}]}
    )
    status, body = _status(
        f"{brokers[follower].registry_url}/subjects/{topic}-value/versions",
        "POST",
        {"schema": incompatible},
    )
    assert status == 409 and body["error_code"] == 409, body


def _race(https: list[Http], schema_id: int) -> list[int]:
    """One commit per catalog, all based on ``schema_id`` and released together: statuses."""
    fields: list[Any] = [*SCHEMA["fields"]]  # type: ignore[misc]
    fields += [
        {"id": i, "name": f"c{i}", "type": "string", "required": False}
        for i in range(3, 4 + schema_id)
    ]
    requirements = [{"type": "assert-current-schema-id", "current-schema-id": schema_id}]
    updates = [
        {
            "action": "add-schema",
            "schema": {"type": "struct", "schema-id": schema_id + 1, "fields": fields},
        },
        {"action": "set-current-schema", "schema-id": -1},
    ]
    barrier = threading.Barrier(len(https))
    statuses: list[int] = []

    def commit(http: Http) -> None:
        barrier.wait()
        statuses.append(http.commit("clustered", "t", requirements, updates)[0])

    threads = [threading.Thread(target=commit, args=(h,)) for h in https]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return statuses


def test_the_catalog_answers_on_every_broker_and_commits_race_safely(cluster: Cluster) -> None:
    first, second = list(cluster.live().values())[:2]
    a, b = Http(first.catalog_url), Http(second.catalog_url)
    assert a.post("/v1/namespaces", {"namespace": ["clustered"]})[0] == 200
    a.create_table("clustered", "t")
    assert b.head("/v1/namespaces/clustered/tables/t") == 204
    for schema_id in range(2):
        assert sorted(_race([a, b], schema_id)) == [200, 409]
    assert b.load("clustered", "t")["metadata"]["current-schema-id"] == 2


def _register(url: str, subject: str, n: int) -> int:
    schema = json.dumps(
        {"type": "record", "name": f"R{n}", "fields": [{"name": "f", "type": "long"}]}
    )
    status, body = _status(f"{url}/subjects/{subject}/versions", "POST", {"schema": schema})
    assert status == 200, body
    return int(body["id"])


def test_the_registry_writer_moves_and_loses_nothing(cluster: Cluster) -> None:
    """Last (it stops brokers): the writer stops cleanly, then the next one is killed; each
    time another broker takes the lease, every id is still there and none is used twice."""
    ids: dict[str, int] = {}
    for i in range(3):
        ids[f"before-{i}"] = _register(cluster.any().registry_url, f"before-{i}", i)
    for step in ("stop", "kill"):
        writer = _writer(cluster)
        leaving = cluster.brokers[writer]
        leaving.stop() if step == "stop" else leaving.kill9()
        remaining = cluster.live()
        # the first write may wait for the lease to move (a killed writer's lapses first)
        url = next(iter(remaining.values())).registry_url
        ids[f"after-{step}"] = _register(url, f"after-{step}", len(ids))
        assert _writer(cluster) in remaining
        assert len(set(ids.values())) == len(ids), f"an id was used twice: {ids}"
        for broker in remaining.values():
            for subject, schema_id in ids.items():
                found = wait_for(
                    lambda b=broker, s=subject: _get(f"{b.registry_url}/subjects/{s}/versions/1"),  # type: ignore[misc]
                    10,
                    what=f"{subject} on {broker.registry_url}",
                )
                assert found["id"] == schema_id, (subject, found)
