"""A round's write step: its rows encoded into Parquet while they decode
(``spark_jobs/rounds/streamed_files.py``) against pyiceberg's writer, which encodes a
file's rows once they have all been decoded, in the same run.

Workload: ``bench/commit_round.py``'s ~500-byte Avro values with 16 fields (Confluent
wire format), in two table topics of 4 partitions on one broker; ``--mib`` MiB produced
to each before every turn (lz4, acks=all; not timed). Each of ``--rounds`` turns runs one
round on each topic, in this process and without Spark (what the warm driver and the
commit task's Python process do), the two ways taking turns going first:

- ``streamed``: the round as Icefall runs it;
- ``pyiceberg``: the same round with ``streamed_files.streams`` answering no, so the
  rows go to pyiceberg's ``_dataframe_to_data_files`` (what every round did before,
  and what a partitioned table's round still does).

Figures per way, medians over the turns: the round's wall seconds (plan to commit: what
a table's freshness pays), this process's CPU seconds over the round (all its threads),
the committed Parquet bytes per round (``added-files-size`` of the snapshot) and the
data files; then the ratios pyiceberg / streamed (> 1: streaming is better). The first
round of each way (table creation, imports) is not counted.

    .venv/bin/python bench/streamed_write.py [--rounds 7] [--mib 90] [--quick] [--json PATH]

``--quick`` (three turns of 48 MiB, about a minute) prints the wall ratio last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import MIB, BrokerProcess, interrupt_on_sigterm, run_info
from bench.commit_round import (
    _table_identifier,
    create_table_topic,
    load_catalog,
    produce,
    register_schema,
    round_env,
)

WAYS = ("streamed", "pyiceberg")
PARTITIONS = 4


def one_round(way: str, broker: BrokerProcess, topic: str) -> tuple[float, float, Any]:
    """Wall and CPU seconds of one in-process round, and its result."""
    from spark_jobs import commit_round
    from spark_jobs.rounds import streamed_files

    argv = ["--admin-url", broker.admin_url, "--topic", topic, "--until-now", "--without-spark"]
    streams = streamed_files.streams
    if way == "pyiceberg":
        streamed_files.streams = lambda metadata: False  # type: ignore[assignment]
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        code, result = commit_round.run(argv, spark=None)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        streamed_files.streams = streams  # type: ignore[assignment]
    if code != 0:
        raise RuntimeError(f"{way} round of {topic} failed: {result.message}")
    return wall, cpu, result


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    broker = BrokerProcess(workdir / "home").start(60)
    os.environ.update(round_env())
    figures: dict[str, dict[str, list[float]]] = {
        way: {"wall": [], "cpu": [], "parquet_mib": [], "files": []} for way in WAYS
    }
    try:
        catalog = load_catalog(broker.catalog_url)
        topics = {way: f"bench-{way}" for way in WAYS}
        schema_ids = {}
        for topic in topics.values():
            create_table_topic(broker.bootstrap, topic, PARTITIONS)
            schema_ids[topic] = register_schema(broker.registry_url, f"{topic}-value")
        for turn in range(args.rounds + 1):  # turn 0: the table's creation, not counted
            rows = {
                topic: produce(broker.bootstrap, topic, schema_ids[topic], args.mib * MIB, "lz4")[
                    "rows"
                ]
                for topic in topics.values()
            }
            for way in WAYS if turn % 2 == 0 else WAYS[::-1]:
                topic = topics[way]
                wall, cpu, result = one_round(way, broker, topic)
                assert result.status == "committed" and result.rows == rows[topic], result
                table = catalog.load_table(f"default.{_table_identifier(topic)}")
                snapshot = table.snapshot_by_id(result.snapshot_id)
                size = int(snapshot.summary["added-files-size"]) / MIB
                print(
                    f"[round] {way} turn {turn}: {result.rows:,} rows {wall:.3f} s "
                    f"{cpu:.3f} CPU-s, {result.data_files} files of {size:.1f} MiB",
                    file=sys.stderr,
                )
                if turn:
                    for key, value in zip(
                        ("wall", "cpu", "parquet_mib", "files"),
                        (wall, cpu, size, result.data_files),
                        strict=True,
                    ):
                        figures[way][key].append(value)
    finally:
        broker.stop(60)
    medians = {
        way: {key: round(statistics.median(values), 3) for key, values in f.items()}
        for way, f in figures.items()
    }
    ours, theirs = medians["streamed"], medians["pyiceberg"]
    return {
        "medians": medians,
        "samples": figures,
        "ratios": {
            key: round(theirs[key] / ours[key], 2) for key in ("wall", "cpu", "parquet_mib")
        },
    }


def markdown(info: dict[str, Any], found: dict[str, Any], args: argparse.Namespace) -> str:
    m, r = found["medians"], found["ratios"]
    lines = [
        f"{info['date']}, {info['machine']['cpu']} (nproc {info['machine']['nproc']}), "
        f"`{info['command']}`: {args.rounds} turns of {args.mib} MiB per round, medians:",
        "",
        "| writer | round wall s | round CPU-s | Parquet MiB per round | files per round |",
        "|---|---|---|---|---|",
    ]
    for way in WAYS:
        f = m[way]
        lines.append(f"| {way} | {f['wall']} | {f['cpu']} | {f['parquet_mib']} | {f['files']} |")
    lines.append(
        f"| pyiceberg / streamed | {r['wall']} × | {r['cpu']} × | {r['parquet_mib']} × | |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="turns counted (default 7)")
    parser.add_argument("--mib", type=int, default=90, help="MiB per round and topic (default 90)")
    parser.add_argument("--quick", action="store_true", help="three turns of 48 MiB")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.mib = 3, 48
    if args.rounds < 1 or args.mib < 1:
        parser.error("--rounds and --mib must be 1 or more")
    info = run_info()
    interrupt_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="icefall-bench-streamed-", dir=Path.home()) as tmp:
        found = run(args, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(info | found, indent=2))
    print(markdown(info, found, args))
    print(
        f"round wall s, pyiceberg / streamed: {found['ratios']['wall']} × "
        f"(CPU-s {found['ratios']['cpu']} ×, Parquet bytes {found['ratios']['parquet_mib']} ×)"
    )


if __name__ == "__main__":
    main()
