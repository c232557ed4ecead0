"""Airflow faults while it coordinates a table topic's rounds, with its real scheduler:

1. the scheduler killed (-9, with its LocalExecutor workers and the round's running
   process) in the middle of a commit, then restarted;
2. a committed run cleared and run again;
3. a backfill over intervals already committed.

Throughout, a producer writes with acks=all; at the end the table holds every
acknowledged record exactly once (same (partition, offset) list, duplicates kept),
and steps 2-3 add no snapshot.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.supervisor import warm_driver
from broker.supervisor.up import AirflowStack
from tests.support import BrokerProcess, free_port, wait_for

TOPIC = "faults"
DAG_ID = f"icefall_commit__{TOPIC}"
INTERVAL_MS = 10_000
SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Tick",
        "namespace": "icefall.test",
        "fields": [{"name": "seq", "type": "long"}],
    }
)


class Airflow:
    def __init__(self, stack: AirflowStack, password: str) -> None:
        self.stack = stack
        self.base = f"http://127.0.0.1:{stack.port}"
        self.token = self.call("/auth/token", {"username": "admin", "password": password})[
            "access_token"
        ]

    def call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """An API call; first, as ``icefall up``'s loop does every second, a component that
        exited is started again (``AirflowStack.check``): Airflow's scheduler can crash by itself
        under these faults (an ``ObjectDeletedError`` on a run the backfill replaced), and a
        stack nobody supervises would then wait for runs that never start."""
        self.stack.check()
        headers = {"Content-Type": "application/json"}
        if getattr(self, "token", None):
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            self.base + path,
            method="POST" if body is not None else "GET",
            data=json.dumps(body).encode() if body is not None else None,
            headers=headers,
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def call_retrying(self, path: str, body: dict[str, Any]) -> Any:
        """POSTs the API answers 503 while the scheduler holds SQLite's lock: retried."""

        def attempt() -> Any:
            try:
                return self.call(path, body) or True
            except urllib.error.HTTPError as exc:
                if exc.code == 503:
                    return None
                if exc.code == 409 and path == "/api/v2/backfills":
                    # An earlier attempt's 503 came after Airflow committed the backfill row. If
                    # it made its runs too, that backfill is ours; if not, Airflow's clean-up of
                    # the half-made one can hit the lock as well, and the scheduler marks the
                    # orphan complete after two minutes (airflow#61375): try again until then.
                    runs = self.call(f"/api/v2/dags/{DAG_ID}/dagRuns?run_type=backfill")
                    return True if runs["dag_runs"] else None
                raise

        return wait_for(attempt, 240, interval=2, what=f"Airflow to accept POST {path}")

    def runs(self) -> list[dict[str, Any]]:
        return list(
            self.call(f"/api/v2/dags/{DAG_ID}/dagRuns?order_by=logical_date&limit=1000")["dag_runs"]
        )

    def task_states(self, run_id: str) -> dict[str, str]:
        tis = self.call(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti["state"] for ti in tis}


class Producer(threading.Thread):
    """Avro records at a modest rate, acks=all and idempotent; ``acked`` holds (partition, offset)."""

    def __init__(self, broker: BrokerProcess) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.stop = threading.Event()
        self.acked: list[tuple[int, int]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        from confluent_kafka import Producer as KafkaProducer
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        serialize = AvroSerializer(SchemaRegistryClient({"url": self.broker.registry_url}), SCHEMA)
        context = SerializationContext(TOPIC, MessageField.VALUE)
        producer = KafkaProducer(
            {
                "bootstrap.servers": self.broker.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 20,
            }
        )

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                self.acked.append((msg.partition(), msg.offset()))
            else:
                self.errors.append(str(err))

        seq = 0
        while not self.stop.wait(0.02):
            producer.produce(TOPIC, value=serialize({"seq": seq}, context), on_delivery=delivered)
            producer.poll(0)
            seq += 1
        assert producer.flush(30) == 0


def round_processes(home: Path, with_records: bool = False) -> list[int]:
    """PIDs of this home's running commit rounds (``python -m spark_jobs.commit_round``, or
    spark-submit's JVM and its Python driver);
    ``with_records``: only a round planned once the topic had records (its ``--until-offsets``
    past 0: with the producer writing all along, the round has records to commit)."""
    marker = f"ICEFALL_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if b"commit_round" not in b" ".join(args) or marker not in (
                entry / "environ"
            ).read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        if not with_records or _commits_records(args):
            found.append(int(entry.name))
    return found


def _commits_records(args: list[bytes]) -> bool:
    """Whether a round was planned once the topic had records: the first rounds, planned
    before the producer's first records, end at offset 0 (``--until-offsets {"0": 0, ...}``)."""
    if b"--until-offsets" not in args:
        return False
    until = json.loads(args[args.index(b"--until-offsets") + 1])
    return sum(int(v) for v in until.values()) > 0


def table_offsets(broker: BrokerProcess) -> list[tuple[int, int]]:
    from pyiceberg.catalog import load_catalog

    table = load_catalog("t", type="rest", uri=broker.catalog_url).load_table(("default", TOPIC))
    rows = (
        table.scan(selected_fields=("_kafka_metadata",))
        .to_arrow()
        .column("_kafka_metadata")
        .to_pylist()
    )
    return sorted((m["partition"], m["offset"]) for m in rows)


def current_snapshot(broker: BrokerProcess) -> int | None:
    from pyiceberg.catalog import load_catalog

    snapshot = (
        load_catalog("t", type="rest", uri=broker.catalog_url)
        .load_table(("default", TOPIC))
        .current_snapshot()
    )
    return None if snapshot is None else snapshot.snapshot_id


@pytest.fixture
def system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[BrokerProcess, Airflow]]:
    # These faults hit the rounds the task starts (a process per round, killed with the scheduler);
    # the warm round driver has its own crash test (tests/e2e/test_airflow_warm_driver.py).
    monkeypatch.setenv(warm_driver.DISABLE_ENV, "1")
    broker = BrokerProcess(tmp_path / "home", ["--segment-flush-ms", "200"]).start()
    stack = AirflowStack(
        broker.config(),
        broker.home.resolve(),
        free_port(),
    )
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        config = {
            "automq.table.topic.enable": "true",
            "automq.table.topic.commit.interval.ms": str(INTERVAL_MS),
        }
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, 2, 1, config=config)]).values():
            future.result(10)
        stack.migrate()
        stack.sync()
        stack.start()
        password = stack.wait_ready(should_stop=lambda: False)
        assert password, "the API server generated no admin password"
        wait_for(
            lambda: stack.db_sync is not None and stack.db_sync.poll() == 0,
            120,
            what="the table's pool to be created",
        )
        yield broker, Airflow(stack, password)
    finally:
        stack.stop()
        broker.stop()


@pytest.mark.timeout(900)
def test_scheduler_crash_clear_and_backfill_keep_the_table_exact(
    system: tuple[BrokerProcess, Airflow],
) -> None:
    broker, airflow = system
    home = broker.home.resolve()
    producer = Producer(broker)
    producer.start()
    try:
        # 1. Kill the scheduler while a round's process runs; start it again.
        wait_for(
            lambda: round_processes(home, with_records=True),
            180,
            interval=0.05,
            what="a commit round planned after the first records to be running",
        )
        airflow.stack.kill_and_restart("scheduler")
        assert not round_processes(home) or wait_for(
            lambda: not round_processes(home), 30, what="the killed round's processes to be gone"
        )
        killed_at = time.time()

        # Rounds go on after the restart (the killed commit is failed after the heartbeat
        # timeout and retried): two commits after it, the producer still writing.
        def committed_after_restart() -> bool:
            ended = [
                r
                for r in airflow.runs()
                if r["state"] == "success"
                and r["end_date"]
                and _epoch(r["end_date"]) > killed_at + 1
            ]
            commits = [
                r for r in ended if airflow.task_states(r["dag_run_id"]).get("commit") == "success"
            ]
            return len(commits) >= 2

        wait_for(
            committed_after_restart,
            300,
            interval=2,
            what="two committing runs after the scheduler restart",
        )
    finally:
        producer.stop.set()
        producer.join(60)
    assert producer.errors == [] and producer.acked

    acked = sorted(producer.acked)
    wait_for(
        lambda: table_offsets(broker) == acked,
        300,
        interval=2,
        what="the table to hold every acknowledged record once",
    )
    retried = [ti for ti in _task_instances(home) if ti[0] == "commit" and ti[1] > 1]
    assert retried, "no commit task was retried: the scheduler kill did not hit a round"

    # Let the scheduler finish the run in flight, then nothing new comes: the snapshot must stay put.
    wait_for(
        lambda: all(r["state"] in ("success", "failed") for r in airflow.runs()),
        120,
        interval=1,
        what="no run in flight",
    )
    snapshot = current_snapshot(broker)

    # 2. Clear a committed run and let it run again: it commits nothing new.
    committed = [
        r
        for r in airflow.runs()
        if r["state"] == "success"
        and r["run_type"] == "scheduled"
        and airflow.task_states(r["dag_run_id"]).get("commit") == "success"
    ]
    assert len(committed) >= 2, (committed, _task_instances(home))
    cleared = committed[0]
    airflow.call_retrying(
        f"/api/v2/dags/{DAG_ID}/clearTaskInstances",
        {
            "dry_run": False,
            "dag_run_id": cleared["dag_run_id"],
            "only_failed": False,
            "reset_dag_runs": True,
        },
    )

    def rerun_done() -> dict[str, str] | None:
        states = airflow.task_states(cleared["dag_run_id"])
        return (
            states
            if set(states.values()) <= {"success", "skipped"} and states.get("commit")
            else None
        )

    states = wait_for(rerun_done, 240, interval=2, what="the cleared run to finish again")
    assert states == {"commit": "skipped"}, states  # nothing new: no asset event

    # 3. Backfill the committed intervals (the UI's Backfill with "reprocess completed runs").
    first, last = committed[0], committed[min(2, len(committed) - 1)]
    airflow.call_retrying(
        "/api/v2/backfills",
        {
            "dag_id": DAG_ID,
            "from_date": first["logical_date"],
            "to_date": last["logical_date"],
            "reprocess_behavior": "completed",
            "max_active_runs": 1,
        },
    )

    def backfill_done() -> list[dict[str, Any]] | None:
        runs = [r for r in airflow.runs() if r["run_type"] == "backfill"]
        return runs if runs and all(r["state"] in ("success", "failed") for r in runs) else None

    backfilled = wait_for(backfill_done, 300, interval=2, what="the backfill runs to finish")
    failed = [r["dag_run_id"] for r in backfilled if r["state"] != "success"]
    assert not failed, (failed, _task_errors(home))
    for run in backfilled:
        assert airflow.task_states(run["dag_run_id"])["commit"] == "skipped", run

    assert current_snapshot(broker) == snapshot
    assert table_offsets(broker) == acked


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def _task_errors(home: Path) -> dict[str, str]:
    """The error each failed task try logged (its log file's path under the DAG's logs: the error),
    so that a failure says why Airflow failed the runs."""
    errors = {}
    for log in sorted((home / "airflow" / "logs" / f"dag_id={DAG_ID}").glob("run_id=*/*/*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if '"exc_value"' not in line:
                continue
            try:
                details = json.loads(line).get("error_detail") or [{}]
            except ValueError:  # not a JSON record: the line itself
                details = [{"exc_value": line}]
            errors[str(log.relative_to(log.parents[2]))] = str(details[0].get("exc_value"))[:300]
    return errors


def _task_instances(home: Path) -> list[tuple[str, int, str]]:
    """(task id, try number, state) of every task instance, from Airflow's database (read only)."""
    con = sqlite3.connect(f"file:{home / 'airflow' / 'airflow.db'}?mode=ro", uri=True, timeout=30)
    try:
        return [
            (str(t), int(n), str(s))
            for t, n, s in con.execute(
                "SELECT task_id, try_number, state FROM task_instance WHERE dag_id = ?", (DAG_ID,)
            )
        ]
    finally:
        con.close()
