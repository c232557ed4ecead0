"""Airflow drives commit rounds for real: ``dag.test()`` runs the commit task (it plans,
runs ``spark_jobs/commit_round.py``, as a Python process or, for a round that needs Spark,
with spark-submit, and publishes) against a real broker, through two rounds; a re-run of
round 1 is a no-op; dropping and recreating the table and re-running both intervals (what a
backfill does) rebuilds it from the segments.

The table is partitioned by the hour of the record timestamp, and the records carry
timestamps in three hours (10:00, 11:00, 12:00 UTC), one hour per round: an hour is
announced once, by a partitioned event on ``.../closed-partitions``, when a later round's
rows pass it, and Airflow queues the example hourly DAG for that partition key.

The broker's admin API and registry require basic auth and its catalog OAuth2: the rounds,
the plugin and the status view take their credentials from the Airflow connections
``icefall_admin``, ``icefall_registry`` and ``icefall_catalog``, and no secret reaches an
asset event.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.dags import airflow_env

airflow_env.configure()

from broker.http_security.client import (
    ADMIN_USER_INFO_ENV,
    CATALOG_CREDENTIAL_ENV,
    REGISTRY_USER_INFO_ENV,
    basic_auth_header,
)
from tests.http_security_support import (
    ADMIN_USER_INFO,
    PASSWORDS,
    SECRETS,
    airflow_connections,
    secured_args,
)
from tests.support import BrokerProcess, free_port, wait_for

TOPIC = "orders"
SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "icefall.test",
        "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
    }
)
ASSET = "icefall/shop/orders"
CLOSED = "icefall/shop/orders/closed-partitions"
HOURLY_DAG = "icefall_example_hourly__orders"
TEN = int(datetime(2026, 1, 1, 10, tzinfo=UTC).timestamp() * 1000)


def record_time(i: int) -> int:
    """Record i's timestamp: records 0-49 in hour 10, 50-79 in hour 11, from 80 in hour 12."""
    hour = 0 if i < 50 else 1 if i < 80 else 2
    return TEN + hour * 3_600_000 + i * 1000


@pytest.fixture
def broker(broker_factory: Any, tmp_path: Path) -> BrokerProcess:
    """A broker whose registry and catalog require credentials."""
    args, env = secured_args(tmp_path / "security")
    started: BrokerProcess = broker_factory([*args, "--segment-flush-ms", "200"], env)
    started.admin_user_info = ADMIN_USER_INFO
    return started


def produce(broker: BrokerProcess, first: int, count: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    registry = SchemaRegistryClient(
        {"url": broker.registry_url, "basic.auth.user.info": f"writer:{PASSWORDS['writer']}"}
    )
    serialize = AvroSerializer(registry, SCHEMA)
    context = SerializationContext(TOPIC, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(first, first + count):
        producer.produce(
            TOPIC,
            key=str(i).encode(),
            value=serialize({"id": i, "item": f"item-{i}"}, context),
            partition=i % 2,
            timestamp=record_time(i),
        )
    assert producer.flush(10) == 0


def cut_after_now() -> datetime:
    """A data interval end strictly after every record produced so far (append times are in ms)."""
    cut_ms = int(time.time() * 1000) + 2
    wait_for(lambda: int(time.time() * 1000) > cut_ms, 5, what="the clock to pass the cut")
    return datetime.fromtimestamp(cut_ms / 1000, UTC)


def asset_events(after_id: int = 0) -> list[dict[str, Any]]:
    return [extra for extra, _ in events_of(ASSET, after_id)]


def last_event_id() -> int:
    """The newest asset event's id: a test counts only the events after it, since the session's
    Airflow database keeps those of earlier test files (test_airflow_warm_driver's, of the same
    topic and asset)."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return int(session.scalar(select(func.max(AssetEvent.id))) or 0)


def events_of(asset: str, after_id: int = 0) -> list[tuple[dict[str, Any], str | None]]:
    """(extra, partition key) of the asset's events after event ``after_id``, oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetEvent.extra, AssetEvent.partition_key)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.name == asset, AssetEvent.id > after_id)
            .order_by(AssetEvent.id)
        ).all()
        return [(dict(extra), key) for extra, key in rows]


def closed_keys(after_id: int = 0) -> list[str | None]:
    return [key for _, key in events_of(CLOSED, after_id)]


def scheduled_partition_runs(dag_id: str) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """The scheduler's step that turns queued partitions into DAG runs (no scheduler process
    here): the runs of ``dag_id`` it made, as (partition key, extras of the events they consume)."""
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    runner = SchedulerJobRunner(job=Job())
    with create_session() as session:
        runner._create_dagruns_for_partitioned_asset_dags(session)
    with create_session() as session:
        runs = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)).all()
        return [(r.partition_key, [dict(e.extra) for e in r.consumed_asset_events]) for r in runs]


def unpause(dag_id: str) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=False))


def queued_partitions(dag_id: str) -> list[str]:
    """The partition keys Airflow queued runs of ``dag_id`` for (its AssetPartitionDagRun rows)."""
    from airflow.models.asset import AssetPartitionDagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return list(
            session.scalars(
                select(AssetPartitionDagRun.partition_key)
                .where(AssetPartitionDagRun.target_dag_id == dag_id)
                .order_by(AssetPartitionDagRun.id)
            )
        )


def table_ids(catalog: Any) -> list[int]:
    table = catalog.load_table(("shop", "orders"))
    return sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def run_round(
    dag: Any, logical_date: datetime, executor: str | None = None, prestaged: int | None = None
) -> dict[str, str]:
    """The run's task states; ``executor``: where its commit task's round must have run
    (its result's ``executor``: ``driver``, a Python process; ``spark``, spark-submit);
    ``prestaged``: how many of its records the warm driver must have written ahead."""
    run = dag.test(logical_date=logical_date)
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert str(run.state) == "success", states
    if executor is not None or prestaged is not None:
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        with create_session() as session:
            [row] = (
                session.execute(
                    XComModel.get_many(
                        run_id=run.run_id, dag_ids=dag.dag_id, task_ids="commit", key="return_value"
                    )
                )
                .scalars()
                .all()
            )
            result = XComModel.deserialize_value(row)
        assert executor is None or result["executor"] == executor, result
        assert prestaged is None or result["prestaged_records"] == prestaged, result
    return states


def create_table_topic(broker: BrokerProcess, extra: dict[str, str] | None = None) -> None:
    """TOPIC with two partitions as a table topic in namespace ``shop``, its commit interval
    long enough that only the rounds the test runs commit (``extra``: more topic configs)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "automq.table.topic.enable": "true",
        "automq.table.topic.namespace": "shop",
        "automq.table.topic.commit.interval.ms": "30000",
        **(extra or {}),
    }
    for future in admin.create_topics([NewTopic(TOPIC, 2, 1, config=config)]).values():
        future.result(10)


def set_task_env(broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment an Airflow task runs in: the broker's home and admin URL, and its
    credentials only through the Airflow connections. The credential variables are unset (now
    and, through monkeypatch, after the test), so nothing can take them from the environment:
    not the task, nor a driver started with this environment."""
    monkeypatch.setenv("ICEFALL_HOME", str(broker.home))
    monkeypatch.setenv("ICEFALL_ADMIN_URL", broker.admin_url)
    for name, value in airflow_connections().items():
        monkeypatch.setenv(name, value)
    for name in (REGISTRY_USER_INFO_ENV, CATALOG_CREDENTIAL_ENV, ADMIN_USER_INFO_ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


@pytest.mark.timeout(900)
def test_two_rounds_rerun_and_rebuild(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    airflow_env.migrate_db()
    since = last_event_id()  # this test's events only
    from icefall_airflow.tables import open_catalog

    create_table_topic(
        broker, {"automq.table.topic.partition.by": "[hour(_kafka_metadata.timestamp)]"}
    )
    set_task_env(broker, monkeypatch)
    monkeypatch.setenv("ICEFALL_EXAMPLE_TABLE", "shop.orders")  # the example DAGs on this table

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(airflow_env.REPO) / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags[f"icefall_commit__{TOPIC}"]
    catalog = open_catalog(broker.catalog_url)

    produce(broker, 0, 50)
    cut1 = cut_after_now()
    produce(broker, 50, 30)  # after cut 1: round 1 must not take these
    cut2 = cut_after_now()
    produce(broker, 80, 5)  # after cut 2: left for a later round

    # Round 1 is small: a Python process commits it, no spark-submit (``commit_operator``).
    # Round 2 is above the driver's limit (1 byte): the Python process says it needs Spark and
    # writes nothing, then the task spark-submits it.
    from icefall_airflow.commit_operator import CommitRoundOperator

    ran: list[str] = []  # dag.test() runs the tasks in this process
    spark_submit, in_python = CommitRoundOperator.run_job, CommitRoundOperator.run_without_spark

    def submitted(self: Any, context: Any, admin_url: str, args: list[str], label: str) -> Any:
        ran.append("spark-submit")
        return spark_submit(self, context, admin_url, args, label)

    def python(self: Any, admin_url: str, args: list[str], label: str) -> Any:
        result = in_python(self, admin_url, args, label)
        ran.append(f"python: {result['status']}")
        return result

    monkeypatch.setattr(CommitRoundOperator, "run_job", submitted)
    monkeypatch.setattr(CommitRoundOperator, "run_without_spark", python)
    states = run_round(dag, cut1, executor="driver")
    assert ran == ["python: committed"]
    assert (states["commit"], states["announce"]) == ("success", "skipped")  # hour 10 is open
    assert table_ids(catalog) == list(range(50))
    events = asset_events(since)
    assert len(events) == 1 and events[0]["rows"] == 50
    assert events[0]["offsets_after"] == {"0": 25, "1": 25}
    assert events[0]["offset_ranges"] == {
        "0": {"start": 0, "end": 25},
        "1": {"start": 0, "end": 25},
    }
    assert events[0]["event_time_column"] == "_kafka_metadata.timestamp"
    assert (events[0]["event_time_min_ms"], events[0]["event_time_max_ms"]) == (
        record_time(0),
        record_time(49),
    )
    assert events[0]["closed_partitions"] == [] and closed_keys(since) == []
    assert (
        events[0]["snapshot_id"]
        == catalog.load_table(("shop", "orders")).current_snapshot().snapshot_id
    )
    assert events[0]["lag_records"] == 35  # 30 + 5 produced after the cut

    unpause(HOURLY_DAG)  # Airflow queues runs of unpaused DAGs only
    with monkeypatch.context() as spark_only:
        spark_only.setenv("ICEFALL_ROUND_IN_DRIVER_MAX_BYTES", "1")
        states = run_round(dag, cut2, executor="spark")
    assert ran[1:] == ["python: spark_needed", "spark-submit"]
    assert (states["commit"], states["announce"]) == ("success", "success")
    assert table_ids(catalog) == list(range(80))
    events = asset_events(since)
    assert len(events) == 2 and events[1]["rows"] == 30
    # both partitions' rows are past 11:00: hour 10 closed, once; hour 11 stays open
    assert events[1]["closed_partitions"] == ["2026-01-01T10:00:00"]
    assert closed_keys(since) == ["2026-01-01T10:00:00"]
    [(announced, _)] = events_of(CLOSED, since)
    assert announced["snapshot_id"] == events[1]["snapshot_id"]
    assert queued_partitions(HOURLY_DAG) == ["2026-01-01T10:00:00"]
    assert scheduled_partition_runs(HOURLY_DAG) == [("2026-01-01T10:00:00", [announced])]
    from tests.support import REPO

    example = load_example(REPO / "dags" / "example_downstream.py")
    hour = example.partition_rows(
        catalog.load_table(("shop", "orders")), "2026-01-01T10:00:00", announced, ("id",)
    )
    assert sorted(hour.column("id").to_pylist()) == list(range(50))
    assert events[1]["offsets_before"] == {"0": 25, "1": 25} and events[1]["offsets_after"] == {
        "0": 40,
        "1": 40,
    }
    snapshot_after_two = catalog.load_table(("shop", "orders")).current_snapshot().snapshot_id

    # Re-running round 1: nothing new, no asset event, the table unchanged. (The round finds its
    # own commit, as a retry would, and the event that commit already has.)
    states = run_round(dag, cut1)
    assert (states["commit"], states["announce"]) == ("skipped", "skipped")
    assert len(asset_events(since)) == 2 and len(closed_keys(since)) == 1
    assert (
        catalog.load_table(("shop", "orders")).current_snapshot().snapshot_id == snapshot_after_two
    )
    assert table_ids(catalog) == list(range(80))

    # The status view agrees: 5 records behind.
    from fastapi.testclient import TestClient
    from icefall_airflow.view import app

    client = TestClient(app, headers=airflow_env.auth_headers())
    [row] = client.get("/api/tables").json()["tables"]
    assert (row["lag_records"], row["rows"], row["snapshot_id"]) == (5, 80, snapshot_after_two)
    # Its charts: the two commits' sizes, and the lag before and after each (85 produced), and now.
    found = client.get(f"/api/tables/{TOPIC}/history").json()
    assert [
        (c["added_records"], c["offsets_before"], c["offsets_after"]) for c in found["commits"]
    ] == [
        (50, {}, {"0": 25, "1": 25}),
        (30, {"0": 25, "1": 25}, {"0": 40, "1": 40}),
    ]
    assert [c["snapshot_id"] for c in found["commits"]] == [
        events[0]["snapshot_id"],
        snapshot_after_two,
    ]
    assert all(c["added_files"] > 0 and c["added_bytes"] > 0 for c in found["commits"])
    assert [p["records"] for p in found["lag"]] == [85, 35, 35, 5, 5]
    assert found["lag"][1]["seconds"] > 0 and found["lag"][-1]["seconds"] > 0
    page = client.get("/").text
    assert page.count('data-chart="commit-rows"') == 1 and page.count("<rect") == 2 * 2
    assert f'href="tables/shop.orders/snapshots/{snapshot_after_two}"' in page
    commits = client.get("/tables/shop.orders").text
    assert f'href="shop.orders/snapshots/{snapshot_after_two}"' in commits
    snapshot = client.get(f"/tables/shop.orders/snapshots/{snapshot_after_two}").text
    assert "p0: 25 → 40 (+15)" in snapshot and "p1: 25 → 40 (+15)" in snapshot
    assert f"{TOPIC}@{int(cut2.timestamp() * 1000)}" in snapshot  # the round id, of interval cut2
    assert "<th>rows added</th><td>30</td>" in snapshot
    assert client.get("/tables/shop.orders/snapshots/1").status_code == 404
    logged_in = urllib.request.Request(
        broker.admin_url + "/metrics", headers=basic_auth_header(ADMIN_USER_INFO)
    )
    with urllib.request.urlopen(logged_in, timeout=10) as response:
        metrics = response.read().decode()
    labels = '{topic="orders",namespace="shop",table="orders"}'
    assert f"icefall_table_lag_records{labels} 5\n" in metrics
    assert f"icefall_table_rows{labels} 80\n" in metrics
    assert f'icefall_table_committed_offset{labels[:-1]},partition="1"}} 40\n' in metrics
    events_text = json.dumps(asset_events(since))
    assert all(secret not in events_text for secret in SECRETS)

    # Drop and recreate the table, re-run both intervals: rebuilt from the retained segments.
    catalog.drop_table(("shop", "orders"))
    run_round(dag, cut1)
    assert table_ids(catalog) == list(range(50))
    run_round(dag, cut2)
    assert table_ids(catalog) == list(range(80))
    assert len(asset_events(since)) == 4

    # A manual run without a logical date commits up to the broker's current end. Its first
    # try dies right after its catalog commit (the round's process exits as if killed): the
    # retry finds the commit its own and emits the commit's event, once.
    from spark_jobs.commit_round import KILL_POINT_ENV

    before_manual = len(asset_events(since))
    monkeypatch.setenv(KILL_POINT_ENV, "after_publish")
    run = dag.test(logical_date=None)
    monkeypatch.delenv(KILL_POINT_ENV)
    assert str(run.state) == "success" and run.logical_date is None
    [commit_ti] = [ti for ti in run.get_task_instances() if ti.task_id == "commit"]
    assert commit_ti.try_number == 2, "the first try did not die after its commit"
    assert table_ids(catalog) == list(range(85))
    manual = asset_events(since)[before_manual:]
    assert len(manual) == 1 and manual[0]["offsets_after"] == {"0": 43, "1": 42}
    assert (manual[0]["rows"], manual[0]["offsets_before"]) == (5, {"0": 40, "1": 40})
    assert (
        manual[0]["snapshot_id"]
        == catalog.load_table(("shop", "orders")).current_snapshot().snapshot_id
    )
    # the rebuilt table announced hour 10 again; the rows of hour 12 close hour 11 (both
    # partitions are caught up: the watermark is their largest)
    assert closed_keys(since) == ["2026-01-01T10:00:00"] * 2 + ["2026-01-01T11:00:00"]

    # OpenLineage: a round run by `airflow dags test` with the provider's HTTP transport reports
    # the topic in and the table out, with the rows and the snapshot, to a local receiver.
    produce(broker, 85, 4)
    with LineageReceiver() as receiver:
        env = {
            **os.environ,
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "http", "url": receiver.url}),
        }
        subprocess.run(
            [str(Path(sys.executable).parent / "airflow"), "dags", "test", dag.dag_id],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=300,
        )
        complete = wait_for(
            lambda: receiver.complete(f"{dag.dag_id}.commit"), 30, what="the COMPLETE event"
        )
    snapshot = catalog.load_table(("shop", "orders")).current_snapshot().snapshot_id
    assert asset_events(since)[-1]["snapshot_id"] == snapshot and table_ids(catalog) == list(
        range(89)
    )
    [topic] = complete["inputs"]
    assert (topic["namespace"], topic["name"]) == (f"kafka://{broker.bootstrap}", TOPIC)
    [output] = complete["outputs"]
    assert output["facets"]["version"]["datasetVersion"] == str(snapshot)
    assert output["outputFacets"]["outputStatistics"]["rowCount"] == 4
    [link] = output["facets"]["symlinks"]["identifiers"]
    assert (link["name"], link["type"]) == ("shop.orders", "TABLE")
    assert output["name"].endswith("orders")  # by location: file:/.../shop/orders...


class LineageReceiver:
    """A local OpenLineage HTTP endpoint: records every event POSTed to it."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.events: list[dict[str, Any]] = []
        events = self.events

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                events.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LineageReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def complete(self, job: str) -> dict[str, Any] | None:
        return next(
            (
                e
                for e in self.events
                if e.get("eventType") == "COMPLETE" and e.get("job", {}).get("name") == job
            ),
            None,
        )


def load_example(path: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_downstream", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
