"""The commit round end to end: real broker, Avro from the Confluent serializer,
real Spark (local[2]) with the Iceberg runtime, rows read back with Spark SQL,
pyiceberg and DuckDB. One broker and one Spark session for the module (Spark
takes 10-20 s to start); tests keep apart by their topics."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from broker import checkpoint
from broker.catalog import duckdb_local
from broker.contracts import CatalogSpec
from broker.http_security.client import (
    ADMIN_USER_INFO_ENV,
    CATALOG_CREDENTIAL_ENV,
    REGISTRY_USER_INFO_ENV,
)
from spark_jobs import commit_round
from spark_jobs.broker_client import http_json
from tests.http_security_support import (
    ADMIN_USER_INFO,
    CLIENT_SECRETS,
    PASSWORDS,
    SECRETS,
    secured_args,
    secured_broker,
)
from tests.spark_jobs.conftest import stop_spark_jvm
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    catalog,
    new_topic,
    round_args,
    run_round,
    run_round_process,
    table,
    table_offsets,
)
from tests.support import BrokerProcess, present
from tests.tls_certs import CertFiles, make_certs, pkcs12_truststore

AT = 1_700_000_000_000
TRUST_PASSWORD = "trust-pw"


@pytest.fixture(scope="module")
def tls_certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[CertFiles, Path]:
    """A CA and server certificate, and a PKCS12 truststore of the CA made with keytool."""
    root = tmp_path_factory.mktemp("tls")
    certs = make_certs(root, "key-pw")
    return certs, pkcs12_truststore(certs.ca, root / "trust.p12", TRUST_PASSWORD)


@pytest.fixture(scope="module")
def spark(tls_certs: tuple[CertFiles, Path]) -> Iterator[Any]:
    """This module's session trusts the test CA, as a job's driver does with
    ``-Djavax.net.ssl.trustStore`` in ``SPARK_SUBMIT_OPTS``."""
    store = tls_certs[1]
    options = (
        f"-Djavax.net.ssl.trustStore={store} -Djavax.net.ssl.trustStorePassword={TRUST_PASSWORD} "
        "-Djavax.net.ssl.trustStoreType=PKCS12"
    )
    # JVM options take effect only in a JVM started with them: a driver JVM an earlier module of
    # this process started (with the default truststore) goes first.
    stop_spark_jvm()
    session = commit_round.spark_session(
        "icefall-round-tests", "local[2]", {"spark.driver.extraJavaOptions": options}
    )
    session.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        yield session
    finally:
        session.stop()


def clicks(start: int, n: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "page": None if i % 4 == 0 else f"/p/{i}",
            "score": i % 100,
            "at": datetime.fromtimestamp((AT + i) / 1000, UTC),
            **extra,
        }
        for i in range(start, start + n)
    ]


def test_a_round_writes_every_record_once_with_system_columns(
    spark: Any, round_broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = new_topic(round_broker, partitions=2)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 300), key=lambda v: f"k{v['id']}".encode(), headers=[("trace", b"abc")])
    result_path = tmp_path / "round.json"
    code, result = commit_round.run(round_args(round_broker, topic, result_path), spark)
    assert code == 0, result.message
    assert result.status == "committed" and result.rows == 300 and result.records == 300
    written = json.loads(result_path.read_text())
    assert written["snapshot_id"] == result.snapshot_id
    assert sum(written["offsets_after"].values()) == 300 and set(
        written["offsets_before"].values()
    ) == {0}
    assert written["bytes_read"] > 0 and written["data_files"] >= 1
    assert {"plan", "read_write", "commit", "total"} <= written["seconds"].keys()

    assert table_offsets(round_broker, topic) == sorted(producer.acked)
    rows = {r["id"]: r for r in table(round_broker, topic).scan().to_arrow().to_pylist()}
    assert set(rows) == set(range(300))
    row = rows[5]
    assert row["page"] == "/p/5" and row["score"] == 5 and row["_kafka_key"] == "k5"
    assert row["at"] == datetime.fromtimestamp((AT + 5) / 1000, UTC)
    assert dict(row["_kafka_headers"]) == {"trace": b"abc"}
    assert rows[4]["page"] is None
    assert row["_kafka_metadata"]["timestamp"].tzinfo is not None

    summary = checkpoint.read_checkpoint(table(round_broker, topic).metadata)
    assert summary.snapshot_id == result.snapshot_id and sum(summary.offsets.values()) == 300


def test_spark_sql_pyiceberg_and_duckdb_read_the_same_rows(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(round_broker, partitions=1)
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 50))
    assert run_round(spark, round_broker, topic).status == "committed"

    name = commit_round.use_catalog(spark, round_broker.catalog_url)
    from_spark = sorted(
        (r["id"], r["page"], r["offset"])
        for r in spark.sql(
            f"SELECT id, page, _kafka_metadata.offset AS offset FROM {name}.default.{topic}"
        ).collect()
    )
    from_pyiceberg = sorted(
        (r["id"], r["page"], r["_kafka_metadata"]["offset"])
        for r in table(round_broker, topic).scan().to_arrow().to_pylist()
    )
    con = duckdb_local.connect()
    duckdb_local.attach_catalog(con, round_broker.catalog_url, "lake")
    from_duckdb = sorted(
        con.execute(f"SELECT id, page, _kafka_metadata.offset FROM lake.default.{topic}").fetchall()
    )
    assert from_spark == from_pyiceberg == from_duckdb
    assert [r[0] for r in from_spark] == list(range(50))


def test_a_second_round_commits_only_what_arrived_since(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(round_broker)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 100))
    first = run_round(spark, round_broker, topic)
    again = run_round(spark, round_broker, topic)
    assert again.status == "nothing_new" and again.snapshot_id == first.snapshot_id
    assert len(table(round_broker, topic).metadata.snapshots) == 2  # base + first round

    producer.send(clicks(100, 40))
    second = run_round(spark, round_broker, topic)
    assert second.status == "committed" and second.rows == 40
    assert second.offsets_before == first.offsets_after
    assert table_offsets(round_broker, topic) == sorted(producer.acked)
    tbl = table(round_broker, topic)
    assert tbl.metadata.refs[checkpoint.CHECKPOINT_TAG].snapshot_id == second.snapshot_id
    assert not [r for r in tbl.metadata.refs if r.startswith(checkpoint.ROUND_BRANCH_PREFIX)]


def test_a_round_starts_at_the_log_start_deleterecords_moved(
    spark: Any, round_broker: BrokerProcess
) -> None:
    """DeleteRecords past the table's checkpoint: those records are gone, as for a Kafka
    consumer; the round commits from the new log start and says where it started."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = new_topic(round_broker, partitions=1)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 10))
    assert run_round(spark, round_broker, topic).offsets_after == {0: 10}
    producer.send(clicks(10, 20))
    admin = AdminClient({"bootstrap.servers": round_broker.bootstrap})
    [deleted] = admin.delete_records([TopicPartition(topic, 0, 25)]).values()
    assert deleted.result(10).low_watermark == 25
    second = run_round(spark, round_broker, topic)
    assert (second.status, second.rows, second.offsets_after) == ("committed", 5, {0: 30})
    assert [o for _, o in table_offsets(round_broker, topic)] == [*range(10), *range(25, 30)]


def test_until_append_time_cuts_by_broker_append_time(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(round_broker, partitions=1)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 30))
    cut = int(time.time() * 1000) + 5
    while int(time.time() * 1000) <= cut:  # the next appends must get a later append time
        time.sleep(0.002)
    producer.send(clicks(30, 20))
    first = run_round(spark, round_broker, topic, "--until-append-time", str(cut))
    assert first.rows == 30 and first.offsets_after == {0: 30} and first.until_append_ms == cut
    assert (
        run_round(spark, round_broker, topic, "--until-append-time", str(cut)).status
        == "nothing_new"
    )
    rest = run_round(spark, round_broker, topic)
    assert rest.rows == 20 and rest.offsets_before == {0: 30}
    assert table_offsets(round_broker, topic) == [(0, o) for o in range(50)]


def test_until_offsets_and_max_records(spark: Any, round_broker: BrokerProcess) -> None:
    topic = new_topic(round_broker, partitions=1)
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 60))
    assert run_round(spark, round_broker, topic, "--until-offsets", '{"0": 25}').offsets_after == {
        0: 25
    }
    assert run_round(spark, round_broker, topic, "--max-records", "10").offsets_after == {0: 35}
    assert run_round(spark, round_broker, topic).offsets_after == {0: 60}
    assert table_offsets(round_broker, topic) == [(0, o) for o in range(60)]


def test_the_schema_evolves_with_the_registry(spark: Any, round_broker: BrokerProcess) -> None:
    topic = new_topic(round_broker, partitions=1)
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 10))
    run_round(spark, round_broker, topic)
    v2 = json.loads(json.dumps(CLICK_V1))
    v2["fields"][2]["type"] = "long"  # int -> long
    v2["fields"].append(
        {
            "name": "referrer",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Ref",
                    "fields": [{"name": "host", "type": "string"}, {"name": "port", "type": "int"}],
                },
            ],
            "default": None,
        }
    )
    AvroProducer(round_broker, topic, v2).send(
        [
            {**c, "score": 2**40 + c["id"], "referrer": {"host": "h", "port": c["id"]}}
            for c in clicks(10, 10)
        ]
    )
    result = run_round(spark, round_broker, topic)
    assert result.status == "committed" and result.rows == 10, result.message
    assert any("referrer" in change for change in result.schema_changes)
    schema = table(round_broker, topic).schema()
    assert str(schema.find_field("score").field_type) == "long"
    assert schema.find_field("referrer.port") is not None
    rows = {r["id"]: r for r in table(round_broker, topic).scan().to_arrow().to_pylist()}
    assert rows[3]["referrer"] is None and rows[3]["score"] == 3
    assert rows[12]["referrer"] == {"host": "h", "port": 12} and rows[12]["score"] == 2**40 + 12


def test_an_incompatible_schema_fails_that_round_only(
    spark: Any, round_broker: BrokerProcess
) -> None:
    # the registry's table check off: the round's own refusal is what is tested here
    # (tests/broker/registry/test_table_check.py: the check refuses the schema up front)
    topic = new_topic(
        round_broker,
        partitions=1,
        configs={
            "automq.table.topic.schema.validation": "false",
            "automq.table.topic.schema.evolution.check": "false",
        },
    )
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 5))
    run_round(spark, round_broker, topic)
    http_json(f"{round_broker.registry_url}/config/{topic}-value", "PUT", {"compatibility": "NONE"})
    bad = json.loads(json.dumps(CLICK_V1))
    bad["fields"][1] = {"name": "page", "type": "long"}  # string -> long is no Iceberg promotion
    AvroProducer(round_broker, topic, bad).send([{**c, "page": 7} for c in clicks(5, 3)])
    failed = run_round(spark, round_broker, topic)
    assert failed.status == "failed"
    assert "page" in failed.message and "offset 5" in failed.message, failed.message
    assert table_offsets(round_broker, topic) == [
        (0, o) for o in range(5)
    ]  # nothing of the failed round

    other = new_topic(round_broker, partitions=1)
    AvroProducer(round_broker, other, CLICK_V1).send(clicks(0, 5))
    assert run_round(spark, round_broker, other).status == "committed"


def test_raw_and_string_values(spark: Any, round_broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    for kind, expect in (("raw", b"\x00\xffbytes"), ("string", "héllo")):
        topic = new_topic(
            round_broker, partitions=1, configs={"automq.table.topic.convert.value.type": kind}
        )
        producer = Producer({"bootstrap.servers": round_broker.bootstrap})
        payload = expect if isinstance(expect, bytes) else expect.encode()
        for _ in range(3):
            producer.produce(topic, value=payload)
        producer.produce(topic, value=None)
        assert producer.flush(30) == 0
        result = run_round(spark, round_broker, topic)
        assert result.rows == 4, result.message
        values = table(round_broker, topic).scan().to_arrow().column("_kafka_value").to_pylist()
        assert sorted(values, key=lambda v: v is None) == [expect, expect, expect, None]


def test_a_round_after_compaction_starts_from_the_round_before(
    spark: Any, round_broker: BrokerProcess
) -> None:
    topic = new_topic(round_broker, partitions=1)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    for i in range(3):
        producer.send(clicks(i * 10, 10))
        run_round(spark, round_broker, topic)
    name = commit_round.use_catalog(spark, round_broker.catalog_url)
    spark.sql(
        f"CALL {name}.system.rewrite_data_files(table => 'default.{topic}', "
        "options => map('min-input-files', '2'))"
    ).collect()
    tbl = table(round_broker, topic)
    assert present(present(tbl.current_snapshot()).summary).operation.value == "replace"
    producer.send(clicks(30, 10))
    result = run_round(spark, round_broker, topic)
    assert result.offsets_before == {0: 30} and result.rows == 10
    assert table_offsets(round_broker, topic) == [(0, o) for o in range(40)]


def test_an_unknown_topic_fails_clearly(spark: Any, round_broker: BrokerProcess) -> None:
    code, result = commit_round.run(round_args(round_broker, "no_such_topic"), spark)
    assert code == 1 and result.status == "failed" and "not a table topic" in result.message


def test_catalog_sees_no_table_until_the_first_round(round_broker: BrokerProcess) -> None:
    topic = new_topic(round_broker, partitions=1)
    assert not catalog(round_broker).table_exists(("default", topic))


def test_a_small_round_runs_in_the_driver_and_writes_what_spark_writes(
    spark: Any, round_broker: BrokerProcess, tmp_path: Path
) -> None:
    """The same records through both executors: the same rows, offsets and checkpoint; the driver path
    never starts a SparkContext (the process below has none to reuse)."""
    topics = {}
    for executor in ("driver", "spark"):
        topics[executor] = topic = new_topic(round_broker, partitions=2)
        AvroProducer(round_broker, topic, CLICK_V1).send(
            clicks(0, 200), key=lambda v: f"k{v['id']}".encode()
        )
    result_path = tmp_path / "driver.json"
    done = run_round_process(
        round_broker, topics["driver"], result_path, "--in-driver-max-bytes", str(64 << 20)
    )
    assert done.returncode == 0, done.stderr
    in_driver = json.loads(result_path.read_text())
    on_spark = run_round(spark, round_broker, topics["spark"], "--in-driver-max-bytes", "1")
    assert in_driver["executor"] == "driver" and on_spark.executor == "spark"
    assert "spark_start" not in in_driver["seconds"]
    assert (
        in_driver["rows"] == on_spark.rows == 200 and in_driver["bytes_read"] == on_spark.bytes_read
    )

    def rows(topic: str) -> list[tuple[Any, ...]]:
        return sorted(
            (
                r["id"],
                r["page"],
                r["score"],
                r["at"],
                r["_kafka_key"],
                r["_kafka_metadata"]["partition"],
                r["_kafka_metadata"]["offset"],
            )
            for r in table(round_broker, topic).scan().to_arrow().to_pylist()
        )

    assert rows(topics["driver"]) == rows(topics["spark"])
    assert len(rows(topics["driver"])) == 200
    assert checkpoint.read_checkpoint(table(round_broker, topics["driver"]).metadata).offsets == {
        int(p): o for p, o in in_driver["offsets_after"].items()
    }


def test_in_driver_max_bytes_must_not_be_negative(round_broker: BrokerProcess) -> None:
    import pytest

    with pytest.raises(SystemExit):
        commit_round.parse_args(["--topic", "t", "--in-driver-max-bytes", "-1"])


def test_a_round_authenticates_with_the_credentials_in_its_environment(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admin API and registry basic auth and catalog OAuth2 on: the round takes all three from
    its environment (what the Airflow operator fills from the connections), Spark SQL reads the
    table with the client credentials, and neither the result JSON nor the broker's log shows a
    secret."""
    broker = secured_broker(tmp_path / "secured")
    try:
        topic = new_topic(broker, partitions=2, prefix="sec")
        producer = AvroProducer(broker, topic, CLICK_V1, f"producer:{PASSWORDS['producer']}")
        producer.send(clicks(0, 40))

        monkeypatch.delenv(ADMIN_USER_INFO_ENV, raising=False)
        code, unplanned = commit_round.run(round_args(broker, topic), spark)
        assert code != 0 and unplanned.status == "failed"
        assert "HTTP 401" in (unplanned.message or "")
        assert ADMIN_USER_INFO_ENV in (unplanned.message or "")

        monkeypatch.setenv(ADMIN_USER_INFO_ENV, ADMIN_USER_INFO)
        code, refused = commit_round.run(round_args(broker, topic), spark)
        assert code != 0 and refused.status == "failed"
        assert "NotAuthorizedException" in (refused.message or "")
        assert "needs a bearer token" in (refused.message or "")

        monkeypatch.setenv(REGISTRY_USER_INFO_ENV, f"alice:{PASSWORDS['alice']}")
        monkeypatch.setenv(CATALOG_CREDENTIAL_ENV, f"etl:{CLIENT_SECRETS['etl']}")
        result_path = tmp_path / "round.json"
        code, result = commit_round.run(round_args(broker, topic, result_path), spark)
        assert code == 0, result.message
        assert result.status == "committed" and result.rows == 40

        name = commit_round.use_catalog(spark, CatalogSpec.rest(broker.catalog_url))
        rows = spark.sql(f"SELECT id FROM {name}.default.{topic}").collect()
        assert sorted(r["id"] for r in rows) == list(range(40))

        written = result_path.read_text()
        for secret in SECRETS:
            assert secret not in written and secret not in (refused.message or "")
            assert secret not in (unplanned.message or "")
    finally:
        broker.stop()
    for secret in SECRETS:
        assert secret not in broker.log_text()


def test_spark_reaches_a_tls_catalog_through_a_truststore(
    spark: Any,
    tls_certs: tuple[CertFiles, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The catalog on TLS (a CA made here) with OAuth2: Spark's JVM trusts it through the PKCS12
    truststore of this module's session, pyiceberg through the CA file, and Spark SQL reads what
    pyiceberg wrote."""
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    from spark_jobs.rounds.table_setup import catalog_for

    certs = tls_certs[0]
    args, env = secured_args(tmp_path / "tls")
    with open(args[1], "a") as properties:
        properties.write(
            f"catalog.ssl.keystore.location={certs.keystore}\ncatalog.ssl.key.password=key-pw\n"
        )
    broker = BrokerProcess(tmp_path / "tls" / "home", args, env).start()
    try:
        url = broker.catalog_url.replace("http:", "https:")
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certs.ca))
        monkeypatch.setenv(CATALOG_CREDENTIAL_ENV, f"etl:{CLIENT_SECRETS['etl']}")
        written = catalog_for(CatalogSpec.rest(url))
        written.create_namespace("tls_ns")
        schema = Schema(NestedField(1, "id", LongType(), required=True))
        created = written.create_table("tls_ns.t", schema)
        created.append(pa.Table.from_pylist([{"id": 1}, {"id": 2}], schema=schema.as_arrow()))

        name = commit_round.use_catalog(spark, CatalogSpec.rest(url))
        assert spark.sql(f"SELECT count(*) AS n FROM {name}.tls_ns.t").first()["n"] == 2
    finally:
        broker.stop()


def test_without_spark_a_round_needing_spark_writes_nothing_and_a_small_one_commits(
    round_broker: BrokerProcess, tmp_path: Path
) -> None:
    """``--without-spark`` as the commit task runs it first: a round above the driver's limit,
    or on a format v3 table, ends ``spark_needed`` with nothing written; a small one commits from
    Python alone (no Spark start in its seconds), and the next finds nothing new."""
    topic = new_topic(round_broker, partitions=2)
    v3 = new_topic(round_broker, partitions=1, configs={"automq.table.topic.format.version": "3"})
    producers = {name: AvroProducer(round_broker, name, CLICK_V1) for name in (topic, v3)}
    for producer in producers.values():
        producer.send(clicks(0, 50))

    def without_spark(name: str, *extra: str) -> dict[str, Any]:
        result_path = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}.json"
        done = run_round_process(round_broker, name, result_path, "--without-spark", *extra)
        assert done.returncode == 0, done.stderr
        answer: dict[str, Any] = json.loads(result_path.read_text())
        return answer

    big = without_spark(topic)  # round_args: --in-driver-max-bytes 0
    assert big["status"] == "spark_needed" and big["records"] == 50, big
    assert "above --in-driver-max-bytes 0" in big["message"]
    assert sum(big["offsets_after"].values()) == 50 and not catalog(round_broker).table_exists(
        ("default", topic)
    )
    newer = without_spark(v3, "--in-driver-max-bytes", str(64 << 20))
    assert newer["status"] == "spark_needed" and "format v3" in newer["message"], newer
    assert not catalog(round_broker).table_exists(("default", v3))

    small = without_spark(topic, "--in-driver-max-bytes", str(64 << 20))
    assert small["status"] == "committed" and small["rows"] == 50, small
    assert small["executor"] == "driver" and "spark_start" not in small["seconds"]
    assert table_offsets(round_broker, topic) == sorted(producers[topic].acked)
    again = without_spark(topic, "--in-driver-max-bytes", str(64 << 20))
    assert again["status"] == "nothing_new" and again["offsets_after"] == small["offsets_after"]


def test_without_spark_a_step_asking_for_spark_drops_the_branch_and_commits_nothing(
    round_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The safety net behind ``_spark_needed``: should a step it does not foresee ask for Spark
    (here its decision is bypassed and the round is sent to Spark tasks), the round ends
    ``spark_needed`` with its branch dropped and the checkpoint where it was."""
    topic = new_topic(round_broker, partitions=1)
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 20))
    monkeypatch.setattr(commit_round.CommitRound, "_spark_needed", lambda self, plan: None)
    code, result = commit_round.run(round_args(round_broker, topic, None, "--without-spark"))
    assert (code, result.status) == (0, "spark_needed"), result
    assert "needs Spark" in result.message
    made = table(round_broker, topic)  # the table was created before the tasks' step
    assert set(made.metadata.refs) <= {"main"}
    assert checkpoint.read_checkpoint(made.metadata).offsets == {}
    assert made.scan().to_arrow().num_rows == 0
