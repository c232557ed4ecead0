"""What a commit task's round costs without a warm driver: the round as a Python process
first (``--without-spark``, what the task does now) against spark-submit of every round
(what it did before), in the same run.

Workload: ``bench/commit_round.py``'s ~500-byte Avro values with 16 fields (Confluent wire
format, registered under ``<topic>-value``), in two table topics of 4 partitions on one
broker, ``--mib`` MiB produced to each before every round (lz4, acks=all; not timed). Each
of ``--rounds`` turns runs, on each topic, one round over what was just produced and then
one with nothing new (an idle topic's round); the two ways take turns going first.

- ``python``: ``python -m spark_jobs.commit_round --without-spark`` (the commit task's
  first step; a round that needs Spark would end ``spark_needed``: none does here);
- ``spark-submit``: ``spark-submit --master local[*]`` of ``spark_jobs/commit_round.py``
  with the Iceberg jars, the venv's Python and ``SPARK_SUBMIT_OPTS`` as the commit
  operator sets them.

Both get ``--in-driver-max-bytes`` at its default (1 GiB) and the same environment
(``bench/commit_round.py``'s ``round_env``: compiled bytecode kept, as an installed
deployment has it). Figures per way, median over the turns: wall seconds and CPU seconds
of the round's processes (the JVM, the driver's Python: this script is their subreaper and
reaps them), for the round with records and the empty one; then the ratios spark-submit /
python (> 1: the Python process is cheaper).

    .venv/bin/python bench/task_round.py [--rounds 5] [--mib 4] [--quick] [--json PATH]

``--quick`` (one turn of 1 MiB, about a minute) prints the empty round's CPU ratio last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    MIB,
    REPO,
    BrokerProcess,
    become_subreaper,
    interrupt_on_sigterm,
    measure,
    own_children,
    reap_orphans,
    run_info,
    stop_processes,
)
from bench.commit_round import (
    create_table_topic,
    produce,
    register_schema,
    round_env,
    warm_bytecode,
)

WAYS = ("python", "spark-submit")
PARTITIONS = 4


def command(way: str, broker: BrokerProcess, topic: str, result: Path) -> list[str]:
    args = ["--admin-url", broker.admin_url, "--topic", topic, "--until-now"]
    args += ["--result", str(result)]
    if way == "python":
        return [sys.executable, "-m", "spark_jobs.commit_round", *args, "--without-spark"]
    from spark_jobs.jars import iceberg_jars

    return [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        "local[*]",
        "--jars",
        ",".join(iceberg_jars()),
        str(REPO / "spark_jobs" / "commit_round.py"),
        *args,
    ]


def environment(way: str) -> dict[str, str]:
    from icefall_airflow.commit_operator import DRIVER_JVM_OPTS

    env = round_env()
    if way == "spark-submit":
        env["SPARK_SUBMIT_OPTS"] = os.environ.get("SPARK_SUBMIT_OPTS", DRIVER_JVM_OPTS)
    return env


def one_round(
    way: str, broker: BrokerProcess, topic: str, workdir: Path, name: str
) -> tuple[float, float, dict[str, Any]]:
    """Wall and CPU seconds of one round's processes, and its result."""
    result = workdir / f"{name}.json"
    log = workdir / f"{name}.log"
    before = own_children()  # the broker: not the round's
    with open(log, "wb") as out, measure() as m:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            command(way, broker, topic, result),
            cwd=REPO,
            env=environment(way),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            code = proc.wait(600)
            wall = time.perf_counter() - t0
            reap_orphans(exclude=before)
        except BaseException:
            stop_processes({proc.pid} | (own_children() - before))
            raise
    if code != 0 or not result.exists():
        raise RuntimeError(f"{name} exited {code}:\n{log.read_text(errors='replace')[-3000:]}")
    return wall, m.cpu_total, json.loads(result.read_text())


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    broker = BrokerProcess(workdir / "home").start(60)
    figures: dict[str, dict[str, list[float]]] = {
        way: {"wall": [], "cpu": [], "empty_wall": [], "empty_cpu": []} for way in WAYS
    }
    try:
        topics = {way: f"bench-{way.replace('-', '')}" for way in WAYS}
        schema_ids = {}
        for topic in topics.values():
            create_table_topic(broker.bootstrap, topic, PARTITIONS)
            schema_ids[topic] = register_schema(broker.registry_url, f"{topic}-value")
        print(f"[bench] bytecode warmed in {warm_bytecode():.1f} s", file=sys.stderr)
        for turn in range(args.rounds):
            rows = {}
            for topic in topics.values():
                rows[topic] = produce(
                    broker.bootstrap, topic, schema_ids[topic], args.mib * MIB, "lz4"
                )["rows"]
            order = WAYS if turn % 2 == 0 else WAYS[::-1]
            for way in order:
                topic = topics[way]
                wall, cpu, result = one_round(way, broker, topic, workdir, f"{way}-{turn}")
                assert result["status"] == "committed" and result["rows"] == rows[topic], result
                assert result["executor"] == "driver", result
                empty_wall, empty_cpu, empty = one_round(
                    way, broker, topic, workdir, f"{way}-{turn}-empty"
                )
                assert empty["status"] == "nothing_new", empty
                for key, value in zip(
                    ("wall", "cpu", "empty_wall", "empty_cpu"),
                    (wall, cpu, empty_wall, empty_cpu),
                    strict=True,
                ):
                    figures[way][key].append(value)
                print(
                    f"[round] {way} turn {turn}: {rows[topic]:,} rows {wall:.2f} s {cpu:.2f} CPU-s; "
                    f"empty {empty_wall:.2f} s {empty_cpu:.2f} CPU-s",
                    file=sys.stderr,
                )
    finally:
        broker.stop(60)
    medians = {
        way: {key: round(statistics.median(values), 2) for key, values in f.items()}
        for way, f in figures.items()
    }
    py, ss = medians["python"], medians["spark-submit"]
    return {
        "medians": medians,
        "samples": figures,
        "ratios": {
            key: round(ss[key] / py[key], 2) for key in ("wall", "cpu", "empty_wall", "empty_cpu")
        },
    }


def markdown(info: dict[str, Any], found: dict[str, Any], args: argparse.Namespace) -> str:
    m, r = found["medians"], found["ratios"]
    lines = [
        f"{info['date']}, {info['machine']['cpu']} (nproc {info['machine']['nproc']}), "
        f"`{info['command']}`: {args.rounds} turns, {args.mib} MiB per round, medians:",
        "",
        "| way | round wall s | round CPU-s | empty round wall s | empty round CPU-s |",
        "|---|---|---|---|---|",
    ]
    for way in WAYS:
        f = m[way]
        lines.append(f"| {way} | {f['wall']} | {f['cpu']} | {f['empty_wall']} | {f['empty_cpu']} |")
    lines.append(
        f"| spark-submit / python | {r['wall']} × | {r['cpu']} × | {r['empty_wall']} × | "
        f"{r['empty_cpu']} × |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="turns (default 5)")
    parser.add_argument("--mib", type=int, default=4, help="MiB per round and topic (default 4)")
    parser.add_argument("--quick", action="store_true", help="one turn of 1 MiB")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.mib = 1, 1
    if args.rounds < 1 or args.mib < 1:
        parser.error("--rounds and --mib must be 1 or more")
    info = run_info()
    become_subreaper()  # the JVM's and the driver's CPU time is reaped here
    interrupt_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="icefall-bench-task-", dir=Path.home()) as tmp:
        found = run(args, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(info | found, indent=2))
    print(markdown(info, found, args))
    print(
        f"empty round CPU-s, spark-submit / python: {found['ratios']['empty_cpu']} × "
        f"(round with records: {found['ratios']['cpu']} ×)"
    )


if __name__ == "__main__":
    main()
