"""Tables in AWS Glue: the broker started with ``automq.table.topic.catalog.type=glue`` (the Glue
API and the S3 warehouse both on moto's server, which the tests start), rounds writing through
Spark's ``GlueCatalog`` and pyiceberg's, and the broker's lag reading the checkpoint there.

Glue commits one table at a time: a round with DLQ rows commits the table, then the DLQ
(``spark_jobs.rounds.dlq_catchup``). The test that matters here kills a round between the two
commits and checks that the next round repairs the DLQ, once. The DLQ test and the
concurrent-writer test imported below run again, unchanged, against Glue (pyiceberg's Glue
``commit_table`` checks the round's requirements and Glue's ``VersionId``)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from icefall_airflow.status import all_statuses

from broker import checkpoint
from broker.catalog.glue_check import glue_problem
from broker.contracts import CatalogSpec
from spark_jobs import commit_round, dlq_reprocess
from spark_jobs.rounds import dlq_catchup
from tests.conftest import MotoS3, set_moto_credentials_only
from tests.spark_jobs.round_support import (
    CLICK_V1,
    AvroProducer,
    SimulatedCrash,
    catalog,
    crash_round_at,
    new_topic,
    run_round,
    table,
    table_offsets,
)
from tests.spark_jobs.test_commit_round import clicks
from tests.spark_jobs.test_external_catalog import (  # noqa: F401 -- collected here, on Glue
    test_retention_follows_the_checkpoint_in_the_external_catalog,
)
from tests.spark_jobs.test_maintenance import (  # noqa: F401 -- collected here, on Glue
    test_compaction_then_expiry_keeps_rows_and_the_checkpoint,
)
from tests.spark_jobs.test_round_dlq import (  # noqa: F401
    GATE_OFF,
    LateSchema,
    dlq_rows,
    mixed,
    test_invalid_data_goes_to_the_dlq_in_the_same_commit,
)
from tests.spark_jobs.test_round_exactly_once import (  # noqa: F401
    test_a_concurrent_writer_on_main_makes_the_round_start_over,
    test_a_round_crashing_at_each_point_then_rerun_commits_each_record_once,
)
from tests.support import BrokerProcess, present, wait_for

CATALOG = "automq.table.topic.catalog."


def glue_properties(endpoint: str) -> dict[str, str]:
    """The catalog properties a Glue broker passes through (``automq.table.topic.catalog.<key>``)."""
    return {
        "glue.endpoint": endpoint,
        "s3.endpoint": endpoint,
        "s3.path-style-access": "true",
        "client.region": "us-east-1",
    }


class GlueBroker(BrokerProcess):
    """A broker whose tables are in Glue (``tables_spec``: how the tests open them)."""

    def __init__(self, home: Path, args: list[str], env: dict[str, str], spec: CatalogSpec) -> None:
        super().__init__(home, args, env=env)
        self.tables_spec = spec


def glue_broker_args(bucket: str, properties: dict[str, str]) -> list[str]:
    args = [
        "--segment-flush-ms",
        "100",
        "--retention-check-interval-ms",
        "300",
        "--object-store",
        f"s3://{bucket}/segments",
        "--warehouse",
        f"s3://{bucket}/warehouse",
        "--override",
        CATALOG + "type=glue",
    ]
    for key, value in properties.items():
        args += ["--override", f"{CATALOG}{key}={value}"]
    return args


@pytest.fixture(scope="module")
def aws_credentials() -> Iterator[None]:
    """This process's (and its Spark JVM's) AWS credentials: moto's; the endpoints are catalog properties."""
    with pytest.MonkeyPatch.context() as mp:
        set_moto_credentials_only(mp)
        yield


@pytest.fixture(scope="module")
def round_broker(
    moto_s3: MotoS3, aws_credentials: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GlueBroker]:
    bucket = f"glue-{uuid.uuid4().hex[:8]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    properties = glue_properties(moto_s3.endpoint)
    spec = CatalogSpec(
        type="glue", warehouse=f"s3://{bucket}/warehouse", properties=properties, builtin=False
    )
    broker = GlueBroker(
        tmp_path_factory.mktemp("glue") / "home",
        glue_broker_args(bucket, properties),
        moto_s3.env(),
        spec,
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def test_rounds_write_to_glue_and_lag_reads_the_checkpoint_there(
    spark: Any, round_broker: GlueBroker, moto_s3: MotoS3
) -> None:
    topic = new_topic(round_broker, partitions=1)
    producer = AvroProducer(round_broker, topic, CLICK_V1)
    producer.send(clicks(0, 30))
    first = run_round(spark, round_broker, topic)
    assert first.status == "committed", first.message
    producer.send(clicks(30, 10))
    assert run_round(spark, round_broker, topic).status == "committed"
    assert table_offsets(round_broker, topic) == sorted(producer.acked)
    name = commit_round.use_catalog(spark, present(round_broker.tables_spec))
    assert spark.sql(f"SELECT count(*) AS n FROM {name}.default.{topic}").first()["n"] == 40

    entry = boto3.client("glue", endpoint_url=moto_s3.endpoint, region_name="us-east-1").get_table(
        DatabaseName="default", Name=topic
    )["Table"]
    assert entry["Parameters"]["table_type"].upper() == "ICEBERG"
    assert entry["Parameters"]["metadata_location"].startswith("s3://glue-")
    assert table(round_broker, topic).metadata.refs["icefall-checkpoint"].snapshot_id == (
        table(round_broker, topic).current_snapshot().snapshot_id  # type: ignore[union-attr]
    )
    pending = round_broker.admin(f"/v1/topics/{topic}/pending")  # read from Glue by the broker
    assert (pending["committed_offsets"], pending["records"]) == ({"0": 40}, 0), pending
    view = all_statuses(round_broker.admin_url)  # the Airflow "Table topics" view, through Glue
    assert view["catalog_url"].startswith("glue (s3://glue-"), view
    row = next(r for r in view["tables"] if r["topic"] == topic)
    assert (row["error"], row["committed_offsets"], row["rows"]) == (None, {"0": 40}, 40), row


@pytest.mark.parametrize("dlq_moved", [False, True], ids=["fast_forward", "dlq_main_moved"])
def test_a_round_killed_between_the_table_and_dlq_commits_is_repaired_once(
    dlq_moved: bool, spark: Any, round_broker: GlueBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dlq_main_moved``: another writer moved the DLQ's ``main`` after the crash, so the repair
    appends the round's rows on top instead of fast-forwarding."""
    topic = new_topic(round_broker, partitions=1, configs=GATE_OFF)
    _, bad = mixed(round_broker, topic)
    crash_round_at("between_commits", spark, round_broker, topic, monkeypatch)
    assert len(table_offsets(round_broker, topic)) == 15  # the table committed: the checkpoint
    assert dlq_rows(round_broker, topic) == []  # its DLQ did not
    if dlq_moved:
        dlq_table = table(round_broker, f"{topic}__dlq")
        with dlq_table.transaction() as tx, tx.update_snapshot().fast_append():
            pass

    again = run_round(spark, round_broker, topic)  # repairs the DLQ first, then finds nothing new
    assert again.status == "nothing_new", again.message
    rows = dlq_rows(round_broker, topic)
    assert [r["offset"] for r in rows] == sorted(bad)
    assert (
        dlq_catchup.catch_up(
            catalog(round_broker), table(round_broker, topic), ("default", f"{topic}__dlq")
        )
        == 0
    )
    assert run_round(spark, round_broker, topic).status == "nothing_new"
    good = [o for _, o in table_offsets(round_broker, topic)]
    assert sorted(good + [r["offset"] for r in dlq_rows(round_broker, topic)]) == list(range(19))
    assert not [r for r in table(round_broker, f"{topic}__dlq").metadata.refs if "round" in r]


def test_reprocess_without_multi_table_commits_commits_the_table_then_the_dlq(
    spark: Any, round_broker: GlueBroker
) -> None:
    topic = new_topic(round_broker, partitions=1, configs=GATE_OFF)
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 2))
    late = LateSchema(round_broker, topic)
    late.send(clicks(2, 2, campaign="y"))
    assert run_round(spark, round_broker, topic).dlq_rows == 2
    late.register()
    code, moved = dlq_reprocess.run(
        ["--admin-url", round_broker.admin_url, "--topic", topic], spark
    )
    assert (code, moved["status"], moved["moved"]) == (0, "moved", 2), moved
    assert dlq_rows(round_broker, topic) == []
    assert sorted(o for _, o in table_offsets(round_broker, topic)) == [0, 1, 2, 3]
    dlq_table = table(round_broker, f"{topic}__dlq")
    assert not [r for r in dlq_table.metadata.refs if "round" in r]
    assert present(dlq_table.current_snapshot()).summary is not None
    assert (
        checkpoint.summary_properties(present(dlq_table.current_snapshot())).get(
            dlq_catchup.REPROCESSED
        )
        == "2"
    )


@pytest.mark.parametrize(
    ("repaired_by", "dlq_moved"),
    [("reprocess", False), ("round", False), ("reprocess", True)],
    ids=["reprocess_fast_forward", "round_fast_forward", "reprocess_dlq_main_moved"],
)
def test_a_reprocess_killed_between_the_table_and_dlq_commits_is_finished_once(
    repaired_by: str,
    dlq_moved: bool,
    spark: Any,
    round_broker: GlueBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Glue commits one table at a time: the reprocess commits the table, then the DLQ's
    deletion. Killed between the two, the next reprocess or round finishes the deletion, and no
    record is in the table twice or in both tables. ``dlq_main_moved``: another writer moved the
    DLQ's ``main`` after the crash, so the rows are deleted again on top of it."""
    topic = new_topic(round_broker, partitions=1, configs=GATE_OFF)
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 4))
    late = LateSchema(round_broker, topic)
    late.send(clicks(4, 3, campaign="x"))
    first = run_round(spark, round_broker, topic)
    assert (first.rows, first.dlq_rows) == (4, 3), first.message
    late.register()

    def crash(name: str) -> None:
        if name == "between_commits":
            raise SimulatedCrash(name)

    with monkeypatch.context() as patched:
        patched.setattr(commit_round, "_kill_point", crash)
        with pytest.raises(SimulatedCrash):
            dlq_reprocess.run(["--admin-url", round_broker.admin_url, "--topic", topic], spark)
    assert sorted(o for _, o in table_offsets(round_broker, topic)) == list(range(7))
    assert [r["offset"] for r in dlq_rows(round_broker, topic)] == [4, 5, 6]  # not deleted yet
    if dlq_moved:
        dlq_table = table(round_broker, f"{topic}__dlq")
        with dlq_table.transaction() as tx, tx.update_snapshot().fast_append():
            pass

    if repaired_by == "round":
        assert run_round(spark, round_broker, topic).status == "nothing_new"
    else:
        code, again = dlq_reprocess.run(
            ["--admin-url", round_broker.admin_url, "--topic", topic], spark
        )
        assert (code, again["status"], again["dlq_rows"]) == (0, "nothing_to_move", 0), again
    assert dlq_rows(round_broker, topic) == []
    assert sorted(o for _, o in table_offsets(round_broker, topic)) == list(range(7))
    assert not [r for r in table(round_broker, f"{topic}__dlq").metadata.refs if "round" in r]
    code, last = dlq_reprocess.run(["--admin-url", round_broker.admin_url, "--topic", topic], spark)
    assert (code, last["status"]) == (0, "nothing_to_move"), last
    assert sorted(o for _, o in table_offsets(round_broker, topic)) == list(range(7))


def test_a_v3_table_on_glue_is_refused_naming_the_setting(
    spark: Any, round_broker: GlueBroker
) -> None:
    topic = new_topic(
        round_broker, partitions=1, configs={"automq.table.topic.format.version": "3"}
    )
    AvroProducer(round_broker, topic, CLICK_V1).send(clicks(0, 3))
    result = run_round(spark, round_broker, topic)
    assert (
        result.status == "failed"
        and "format.version=3 needs a REST or Nessie catalog" in result.message
    )
    assert not catalog(round_broker).table_exists(("default", topic))


def test_a_wrong_glue_endpoint_is_named_at_start_and_in_the_round(
    spark: Any, moto_s3: MotoS3, aws_credentials: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    bucket = f"glue-{uuid.uuid4().hex[:8]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    wrong = {**glue_properties(moto_s3.endpoint), "glue.endpoint": "http://127.0.0.1:9"}
    spec = CatalogSpec(type="glue", warehouse=f"s3://{bucket}/w", properties=wrong, builtin=False)
    problem = glue_problem(spec)
    assert problem is not None and problem[0] == logging.ERROR
    assert "automq.table.topic.catalog.glue.endpoint=http://127.0.0.1:9" in problem[1]
    broker = GlueBroker(
        tmp_path_factory.mktemp("badglue") / "home",
        glue_broker_args(bucket, wrong),
        moto_s3.env(),
        spec,
    ).start()
    try:
        wait_for(
            lambda: (
                "automq.table.topic.catalog.glue.endpoint=http://127.0.0.1:9" in broker.log_text()
            ),
            10,
            what="the broker's log to name the Glue endpoint",
        )
        topic = new_topic(broker, partitions=1)
        producer = AvroProducer(broker, topic, CLICK_V1)
        producer.send(clicks(0, 3))  # the broker keeps serving Kafka clients
        assert len(producer.acked) == 3
        code, result = commit_round.run(["--admin-url", broker.admin_url, "--topic", topic], spark)
        assert (code, result.status) == (1, "failed")
        assert "automq.table.topic.catalog.glue.endpoint=http://127.0.0.1:9" in result.message
    finally:
        broker.stop()


def test_without_credentials_glue_names_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    spec = CatalogSpec(
        type="glue", warehouse="s3://b/w", properties={"glue.endpoint": "http://127.0.0.1:9"}
    )
    problem = glue_problem(spec)
    assert problem is not None and "no AWS credentials" in problem[1]
    assert "AWS_ACCESS_KEY_ID" in problem[1]
