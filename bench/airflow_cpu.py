"""Airflow's own CPU under ``icefall up`` (issue 17): what each component costs while idle and
per commit round, so that settings which cut it can be measured rather than guessed.

Starts ``icefall up`` (bench/sustained.py's ``icefall_up``: a temporary home, free ports, the
warm round driver, the demo topic at 1 record/s with a 10-minute interval), then:

1. idle: ``--idle-s`` seconds with no table topic but the demo's; Airflow's CPU per minute;
2. rounds: creates a 4-partition table topic with a ``--interval-s`` commit interval, produces
   a trickle of Avro values (``--rate`` MiB/s) and, once its first round committed, measures
   ``--rounds-s`` seconds; the CPU above the idle rate divided by the commit tasks that ran in
   that window is the cost of a round (its commit task, which plans, runs the round and
   publishes: the task process, the scheduler's and the API server's share).

Every process is charged to the Airflow component it descends from (the child of ``icefall
up`` it is under: api-server, scheduler with its LocalExecutor workers and task processes,
dag-processor, triggerer, warm driver, broker), and within it to its own process title (a
Spark job's own time to "spark jobs"), sampled every 0.2 s per process keyed by pid and start
time; a process that ended counts whole through its reaper's children time (``ComponentCpu``).
Also prints how long the new topic's commit DAG took to appear in Airflow's database after the
topic was created, and where a round's time goes between its interval's end and its commit
task's end (``round_stages``, from Airflow's metadata: the scheduler creating the run, the task
queued, running, its plan made, done).

    .venv/bin/python bench/airflow_cpu.py                 # 60 s idle, 180 s of 20 s rounds
    .venv/bin/python bench/airflow_cpu.py --keep          # and keep its temporary folder
    .venv/bin/python bench/airflow_cpu.py --stages HOME/airflow/airflow.db --dag-id D
                                                # the stages of a kept run (vs_connect --keep)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ProcessLedger,
    Sampler,
    _parents,
    become_subreaper,
    cmdline,
    machine,
)
from bench.commit_round import register_schema
from bench.rate_producer import ProducerProcess
from bench.sustained import TOPIC, _create_topic, icefall_up
from bench.vs_connect import committed
from tests.support import wait_for


def _cmdline(pid: int) -> str:
    return (cmdline(pid) or "").strip()


def _component(cmdline: str) -> str:
    for name in ("api-server", "scheduler", "dag-processor", "triggerer"):
        if f"airflow {name}" in cmdline or f"airflow {name.replace('-', '_')}" in cmdline:
            return f"airflow {name}"
    if "broker.cli broker" in cmdline:
        return "broker"
    if "warm_driver" in cmdline or "pyspark-shell" in cmdline:
        return "warm driver"
    if "icefall_airflow.sync" in cmdline:
        return "icefall sync"
    return "other"


def _spark_job(cmdline: str) -> bool:
    return (
        "java" in cmdline.split(" ", 1)[0] or "spark_jobs" in cmdline or "spark-submit" in cmdline
    )


def _spark_jobs_running(root: int) -> bool:
    """A spark-submit (a JVM) runs under an Airflow component: a maintenance or commit job."""
    parents = _parents()
    for pid in parents:
        top, hops = pid, 0
        while top in parents and parents[top] != root and hops < 20:
            top, hops = parents[top], hops + 1
        if (
            parents.get(top) == root
            and _component(_cmdline(top)).startswith("airflow ")
            and _spark_job(_cmdline(pid))
        ):
            return True
    return False


_Label = tuple[str, str, bool]  # (component, process title, a Spark job)


class ComponentCpu(Sampler):
    """CPU seconds per (component, process title) of the tree under ``root``, sampled.

    Counted by bench/_common.py's ``ProcessLedger`` (per process keyed by pid and start time):
    a live process counts its own time under its title and its reaped children's time under
    "reaped by <its title>"; a process that ended keeps its last sample under its own title
    and, when its reaper is measured, takes it out of "reaped by <the reaper>" (which keeps
    only the tail after that sample). A child of ``root`` (``icefall up``, not measured) that
    ended counts its last sample. A Spark job (a JVM, a job's Python) counts its own time
    under "spark jobs", not its component."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        super().__init__(interval)
        self.root = root
        self.ledger: ProcessLedger[_Label] = ProcessLedger()
        self.start_sampling()

    def _label(
        self, pid: int, cmd: str, before: _Label | None, parents: Mapping[int, int]
    ) -> _Label | None:
        cmd = cmd.strip()
        if before is not None:
            component, title, spark = before
            if cmd and not spark and _spark_job(cmd):  # exec'd into a JVM
                title, spark = cmd[:60], True
            return component, title, spark
        top, hops = pid, 0
        while top in parents and parents[top] != self.root and hops < 20:
            top, hops = parents[top], hops + 1
        if parents.get(top) != self.root:
            return None  # the root itself
        return _component(_cmdline(top)), (cmd or "?")[:60], _spark_job(cmd)

    def sample(self) -> None:
        self.ledger.sample_tree(self.root, self._label)

    def totals(self) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}

        def add(key: tuple[str, str], seconds: float) -> None:
            out[key] = out.get(key, 0.0) + seconds

        with self.ledger.lock:
            self.sample()
            shares = self.ledger.shares()
        for (component, title, spark), own, reaped in shares:
            kind = _title_kind(title)
            add(("spark jobs" if spark else component, kind), own)
            add((component, f"reaped by {kind}"), reaped)
        return out

    def stop(self) -> None:
        self.stop_sampling()


def _title_kind(title: str) -> str:
    """Groups process titles: task processes by kind, not by task instance."""
    for prefix in ("airflow task supervisor", "airflow supervisor", "airflow task runner"):
        if title.startswith(prefix):
            return prefix
    if "LocalExecutor" in title:
        return "LocalExecutor worker"
    if "multiprocessing" in title:
        return "multiprocessing child"
    return title.split(" --", 1)[0][:40]


def _diff(
    after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    return {
        k: v - before.get(k, 0.0) for k, v in after.items() if abs(v - before.get(k, 0.0)) >= 0.05
    }


def _by_component(cpu: dict[tuple[str, str], float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (component, _), seconds in cpu.items():
        out[component] = out.get(component, 0.0) + seconds
    return out


def _commit_tasks(home: Path) -> set[str]:
    logs = home / "airflow" / "logs"
    return {str(p) for p in logs.glob("dag_id=icefall_commit__*/run_id=*/task_id=commit")}


def _dag_parsed(home: Path, dag_id: str) -> bool:
    try:
        with sqlite3.connect(f"file:{home / 'airflow' / 'airflow.db'}?mode=ro", uri=True) as db:
            row = db.execute(
                "SELECT 1 FROM dag WHERE dag_id = ? AND NOT is_stale", (dag_id,)
            ).fetchone()
    except sqlite3.Error:
        return False
    return row is not None


# (stage, its end: a dag_run column, a (task, task_instance column), or the commit task's plan
# time, "planned": its XCom ``plan``'s planned_at_ms), in order; each stage lasts from the
# previous one's end, the first from the interval's end (data_interval_end). The commit DAG's
# timetable creates a run 4 s before its interval ends (icefall_airflow.timetable), so the
# stages up to the commit task's start are negative: done before the end; the task then waits
# for the end, plans, runs the round and publishes, all in one process (commit_operator).
STAGES: tuple[tuple[str, str | tuple[str, str]], ...] = (
    ("scheduler creates the run", "queued_at"),
    ("commit queued", ("commit", "queued_dttm")),
    ("commit queued -> running", ("commit", "start_date")),
    ("commit plans (its process: parse, wait for the end, plan)", "planned"),
    ("commit's round and publish", ("commit", "end_date")),
)


def _stamp(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None  # stored in UTC


def round_stages(db: Path, dag_id: str) -> list[dict[str, float]]:
    """For each successful scheduled run of ``dag_id``: each stage's seconds (``STAGES``), from
    Airflow's metadata database ``db`` (task instances' queued/start/end times, the run's)."""
    out = []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        runs = conn.execute(
            "SELECT run_id, data_interval_end, queued_at FROM dag_run WHERE dag_id = ? AND "
            "state = 'success' AND run_type = 'scheduled' ORDER BY data_interval_end",
            (dag_id,),
        ).fetchall()
        for run_id, interval_end, queued_at in runs:
            tasks = {
                row[0]: dict(zip(("queued_dttm", "start_date", "end_date"), row[1:], strict=True))
                for row in conn.execute(
                    "SELECT task_id, queued_dttm, start_date, end_date FROM task_instance "
                    "WHERE dag_id = ? AND run_id = ?",
                    (dag_id, run_id),
                )
            }
            planned = _planned_at(conn, dag_id, run_id)
            previous, stages = _stamp(interval_end), {}
            for name, end in STAGES:
                if end == "planned":
                    at = planned
                else:
                    at = _stamp(
                        queued_at if end == "queued_at" else tasks.get(end[0], {}).get(end[1])
                    )
                if at is None or previous is None:
                    break
                stages[name], previous = at - previous, at
            else:
                out.append(stages)
    return out


def _planned_at(conn: sqlite3.Connection, dag_id: str, run_id: str) -> float | None:
    """When the commit task of ``run_id`` made its plan (its XCom ``plan``), in epoch seconds."""
    row = conn.execute(
        "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = 'commit' "
        "AND key = 'plan'",
        (dag_id, run_id),
    ).fetchone()
    plan = json.loads(row[0]) if row and row[0] else None
    if isinstance(plan, str):  # stored as a JSON string of the JSON
        plan = json.loads(plan)
    return plan["planned_at_ms"] / 1000 if isinstance(plan, dict) else None


def print_stages(db: Path, dag_id: str) -> None:
    rounds = round_stages(db, dag_id)
    if not rounds:
        print(f"no complete scheduled run of {dag_id} in {db}")
        return
    print(f"\nwhere a round's time goes, {dag_id}, {len(rounds)} rounds (s):")
    print("| stage | median | min | max | since the interval's end (sum of medians) |")
    print("|---|---|---|---|---|")
    total = 0.0
    for name, _ in STAGES:
        values = [r[name] for r in rounds]
        mean = statistics.median(values)
        total += mean
        print(f"| {name} | {mean:.2f} | {min(values):.2f} | {max(values):.2f} | {total:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--rounds-s", type=float, default=180.0)
    parser.add_argument("--interval-s", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=0.05, help="MiB/s to the table topic")
    parser.add_argument("--label", default="")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--stages", type=Path, help="only print the round stages of this airflow.db"
    )
    parser.add_argument("--dag-id", default=f"icefall_commit__{TOPIC}", help="with --stages")
    args = parser.parse_args()
    if args.stages:
        print_stages(args.stages, args.dag_id)
        return
    become_subreaper()
    folder = Path(tempfile.mkdtemp(prefix="icefall-airflow-cpu-"))
    try:
        measure(args, folder)
    finally:
        if args.keep:
            print(f"kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def measure(args: argparse.Namespace, folder: Path) -> None:
    """The idle window, then the rounds window, under ``icefall up`` in ``folder``; prints the
    tables and, last, their JSON."""
    load = os.getloadavg()
    home = folder / "up"
    print(f"working in {folder}; load average {load}", flush=True)
    with icefall_up(home, warm=True) as (proc, bootstrap, registry, catalog_url):
        from pyiceberg.catalog import load_catalog

        cpu = ComponentCpu(proc.pid)
        # the start's maintenance and demo jobs finish before the idle window
        wait_for(lambda: not _spark_jobs_running(proc.pid), 300, what="the start's Spark jobs")
        time.sleep(10)  # settling: a duration, not a condition
        before, tasks0, t0 = cpu.totals(), _commit_tasks(home), time.monotonic()
        time.sleep(args.idle_s)
        idle = _diff(cpu.totals(), before)
        idle_s = time.monotonic() - t0
        idle_rounds = len(_commit_tasks(home) - tasks0)

        created = time.monotonic()
        _create_topic(bootstrap, args.interval_s)
        dag_id = f"icefall_commit__{TOPIC}"
        wait_for(lambda: _dag_parsed(home, dag_id), 120, what="the new topic's DAG")
        appeared_s = time.monotonic() - created
        schema_id = register_schema(registry, f"{TOPIC}-value")
        log = folder / "producer.log"
        with ProducerProcess(bootstrap, TOPIC, schema_id, log) as producer:
            producer.set_rate(args.rate)
            catalog = load_catalog("bench", type="rest", uri=catalog_url)
            wait_for(
                lambda: committed(catalog, ("default", TOPIC)) > 0, 300, what="the first round"
            )
            before, tasks0, t0 = cpu.totals(), _commit_tasks(home), time.monotonic()
            time.sleep(args.rounds_s)
            busy = _diff(cpu.totals(), before)
            busy_s = time.monotonic() - t0
            rounds = len(_commit_tasks(home) - tasks0)
        producer.check()
        cpu.stop()
    end_load = os.getloadavg()

    idle_c, busy_c = _by_component(idle), _by_component(busy)
    print()
    m = machine()
    print(
        f"{args.label} {time.strftime('%Y-%m-%d %H:%M')} UTC · {m['nproc']} cores, {m['cpu']} · "
        f"load {load[0]:.2f} at start, {end_load[0]:.2f} at end"
    )
    print(f"new topic's DAG in Airflow's database {appeared_s:.1f} s after the topic was created")
    print(
        f"idle window {idle_s:.0f} s ({idle_rounds} rounds); rounds window {busy_s:.0f} s, {rounds} rounds"
    )
    print("| component | idle CPU-s/min | rounds window CPU-s | per round (above idle) |")
    print("|---|---|---|---|")
    rows = {}
    for comp in sorted(set(idle_c) | set(busy_c)):
        per_min = idle_c.get(comp, 0.0) / idle_s * 60
        extra = busy_c.get(comp, 0.0) - per_min * busy_s / 60
        rows[comp] = (per_min, busy_c.get(comp, 0.0), extra / rounds if rounds else 0.0)
        print(f"| {comp} | {per_min:.2f} | {busy_c.get(comp, 0.0):.1f} | {rows[comp][2]:.2f} |")
    af = [c for c in rows if c.startswith("airflow")]
    print(
        f"| **Airflow** | {sum(rows[c][0] for c in af):.2f} | {sum(rows[c][1] for c in af):.1f} "
        f"| {sum(rows[c][2] for c in af):.2f} |"
    )
    print("\nby process title (rounds window):")
    for (comp, title), seconds in sorted(busy.items(), key=lambda kv: -kv[1]):
        print(f"  {comp:22} {title:42} {seconds:7.1f}")
    print("by process title (idle window):")
    for (comp, title), seconds in sorted(idle.items(), key=lambda kv: -kv[1]):
        print(f"  {comp:22} {title:42} {seconds:7.1f}")
    print_stages(home / "airflow" / "airflow.db", dag_id)
    print(
        json.dumps(
            {
                "idle_per_min": idle_c,
                "idle_s": idle_s,
                "busy": busy_c,
                "busy_s": busy_s,
                "rounds": rounds,
                "dag_appeared_s": appeared_s,
            }
        )
    )


if __name__ == "__main__":
    main()
