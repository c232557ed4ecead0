"""A commit round with its table and segments on S3 (moto's server) against the same round on
local files, in one run (issue 13).

Workload: ``bench/commit_round.py``'s: N MiB of ~500-byte Avro values with 16 fields
(Confluent wire format, schema registered under ``<topic>-value``) in a table topic
with 4 partitions, produced with confluent-kafka (lz4, 1 MiB batches, acks=all) to
each of two brokers, the same values in the same order. Produce time is printed but
is no part of the figures.

Compared, in the same run: a broker on local files (default object store and
warehouse under its home) and a broker with ``--object-store s3://BUCKET/segments
--warehouse s3://BUCKET/warehouse``, the bucket created by this script in moto's S3
server (``python -m moto.server`` on loopback, started here and stopped at the end).
On S3 the round reads the segments from S3 and writes the Parquet files and the table
metadata to S3; the round gets the S3 credentials in its environment and the endpoint
from the catalog, as in production. Both brokers are started and filled before the
first round, and are idle while the rounds run.

Round: ``python -m spark_jobs.commit_round --admin-url URL --topic T --until-now
--result PATH`` in a subprocess (its own Spark, ``local[CORES]``, the same cores for
both), wall time including Spark start-up, and the phases from its result JSON; then
the same command with nothing new, ``--empty-rounds`` times (default 3): the fixed
cost of a round, their median. Order: local round, local empty round, S3 round, S3
empty round, then the other empty rounds, local and S3 taking turns.

Figures, per backend: rows/s and MiB/s of record value bytes (wall time of the round
process), wall seconds, the round's phases (``spark_start``, ``plan``, ``prepare``,
``read_write``, ``commit``, ``total``), the empty rounds' median wall seconds (fixed
cost), CPU seconds of the round's processes (JVM, driver, Python workers; the full
round's, and the empty rounds' median), and the CPU seconds moto's server spent during
the backend's full round and first empty round (~0 for local). Ratios S3 / local:
throughput (rows/s; < 1 = slower on S3), fixed cost (> 1 = dearer on S3), and the
same two in CPU seconds, which hold up better than wall time when other jobs share
the machine. Moto keeps objects in memory in one Python process on loopback: no
network latency or bandwidth limit, so the figures are S3's request pattern and the
client libraries' cost, not a real S3's.

    .venv/bin/python bench/s3_round.py [--mib 256] [--cores 2] [--partitions 4]
        [--compression lz4] [--empty-rounds 3] [--keep DIR] [--json PATH]

``--keep DIR`` keeps the broker homes and logs, moto's log, round logs and results.
Ctrl-C (or SIGTERM) stops the round, both brokers and moto's server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    MIB,
    BrokerProcess,
    become_subreaper,
    interrupt_on_sigterm,
    pid_cpu_seconds,
    run_info,
)
from bench.commit_round import (
    create_table_topic,
    flush_broker,
    produce,
    register_schema,
    run_round,
    the_round,
)
from tests.conftest import MOTO_CREDENTIALS, MotoS3

TOPIC = "bench-events"
BACKENDS = ("local", "s3")
PHASES = ("spark_start", "plan", "prepare", "read_write", "commit", "total")


def start_brokers(
    stack: contextlib.ExitStack, workdir: Path, moto: MotoS3
) -> dict[str, BrokerProcess]:
    """The local broker and the S3 broker (bucket created here); each stopped when ``stack`` closes."""
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    moto.client().create_bucket(Bucket=bucket)
    brokers = {
        "local": BrokerProcess(workdir / "local"),
        "s3": BrokerProcess(
            workdir / "s3",
            [
                "--object-store",
                f"s3://{bucket}/segments",
                "--warehouse",
                f"s3://{bucket}/warehouse",
            ],
            env=moto.env(),
        ),
    }
    for name, broker in brokers.items():
        stack.callback(_stop_broker, broker, name)  # registered first: also stopped if start fails
        broker.start(60)
    return brokers


def _stop_broker(broker: BrokerProcess, name: str) -> None:
    try:
        broker.stop(60)
    except Exception as exc:  # noqa: BLE001 -- killed by stop(); the others still have to stop
        print(f"[bench] broker {name} did not stop cleanly: {exc!r}", file=sys.stderr)


def fill(broker: BrokerProcess, mib: int, partitions: int, compression: str) -> dict[str, Any]:
    schema_id = register_schema(broker.registry_url, f"{TOPIC}-value")
    create_table_topic(broker.bootstrap, TOPIC, partitions)
    prod = produce(broker.bootstrap, TOPIC, schema_id, mib * MIB, compression)
    flush_broker(broker, TOPIC, prod["rows"])
    return prod


def round_env() -> dict[str, str]:
    """What the round process gets on top of ``commit_round.round_env()``: the credentials
    only (moto accepts any); the endpoint, path style and region come from the catalog.
    Both backends' rounds get the same environment."""
    return dict(MOTO_CREDENTIALS)


def empty_round(broker: BrokerProcess, workdir: Path, cores: int, name: str) -> tuple[float, float]:
    """One more empty round: its wall and CPU seconds."""
    m, result = run_round(broker, TOPIC, workdir, cores, name, env=round_env())
    assert result.get("status") == "nothing_new" and int(result.get("rows", 0)) == 0, (
        f"empty round: {result}"
    )
    return round(m.wall, 2), round(
        m.cpu_total, 1
    )  # cpu_total includes the /proc samples run_round adds


def summary(
    rnd: dict[str, Any], empties: list[tuple[float, float]], moto_cpu: float
) -> dict[str, Any]:
    full = rnd["full"]
    phases = full.get("phases_s") or {}
    return {
        "rows": full["rows"],
        "mib": full["mib"],
        "wall_s": full["wall_s"],
        "rows_per_s": full["rows_per_s"],
        "mib_per_s": full["mib_per_s"],
        "cpu_s": full["cpu_s"],
        "mib_per_cpu_s": full["mib_per_cpu_s"],
        "cpu_by_process_s": full.get("cpu_by_process_s"),
        "data_files": full.get("data_files"),
        "executor": rnd["results"]["round"].get("executor"),
        "phases_s": {k: phases[k] for k in PHASES if k in phases},
        "outside_job_s": full.get("outside_job_s"),
        "empty_wall_s": round(statistics.median(w for w, _ in empties), 2),
        "empty_walls_s": [w for w, _ in empties],
        "empty_cpu_s": round(statistics.median(c for _, c in empties), 1),
        "empty_phases_s": rnd["empty"].get("phases_s"),
        "moto_cpu_s": round(moto_cpu, 1),
    }


def ratios(local: dict[str, Any], s3: dict[str, Any]) -> dict[str, float | None]:
    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    lp, sp = local["phases_s"], s3["phases_s"]
    return {
        "throughput": ratio(s3["rows_per_s"], local["rows_per_s"]),
        "fixed_cost": ratio(s3["empty_wall_s"], local["empty_wall_s"]),
        "round_cpu_s": ratio(s3["cpu_s"], local["cpu_s"]),
        "empty_cpu_s": ratio(s3["empty_cpu_s"], local["empty_cpu_s"]),
        "read_write_s": ratio(sp.get("read_write"), lp.get("read_write")),
        "commit_s": ratio(sp.get("commit"), lp.get("commit")),
    }


def markdown(
    info: dict[str, Any],
    prod: dict[str, dict[str, Any]],
    res: dict[str, dict[str, Any]],
    rat: dict[str, float | None],
    args: argparse.Namespace,
) -> str:
    mach = info["machine"]
    p = prod["local"]
    lines = [
        (
            f"Date {info['date']}; machine: {mach['nproc']} cores ({mach['cpu']}), {mach['mem_gib']} GiB, "
            f"{mach['os']}, Python {mach['python']}; brokers, moto, bench and Spark share the cores."
        ),
        "",
        (
            f"Command: `{info['command']}` ({p['rows']:,} records, {p['value_bytes'] / MIB:.0f} MiB of values, "
            f"16 fields, {args.partitions} partitions, {args.compression}, to each broker; produced in "
            + ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in prod.items())
            + ", not counted)."
        ),
        "",
        (
            "| backend | round wall s | rows/s | MiB/s | spark_start | plan | prepare | read_write | commit "
            "| job total | round CPU s | empty round s (fixed cost) | empty round CPU s | moto CPU s |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in BACKENDS:
        r = res[name]
        ph = r["phases_s"]
        lines.append(
            f"| {name} | {r['wall_s']} | {r['rows_per_s']:,} | {r['mib_per_s']} "
            + "".join(f"| {ph.get(k, '—')} " for k in PHASES)
            + f"| {r['cpu_s']} | {r['empty_wall_s']} ({', '.join(map(str, r['empty_walls_s']))}) "
            f"| {r['empty_cpu_s']} | {r['moto_cpu_s']} |"
        )
    lines += [
        "",
        (
            f"**S3 / local: throughput {rat['throughput']}, fixed cost {rat['fixed_cost']}**; in CPU seconds: "
            f"round {rat['round_cpu_s']}, empty round {rat['empty_cpu_s']} (read_write phase "
            f"{rat['read_write_s']}x the time, commit phase {rat['commit_s']}x). Empty rounds: median of "
            f"{args.empty_rounds}, each listed."
        ),
        (
            f"Executor: {res['local']['executor']} (local), {res['s3']['executor']} (S3); data files: "
            f"{res['local']['data_files']} (local), {res['s3']['data_files']} (S3)."
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mib", type=int, default=256, help="MiB of record values per broker (default 256)"
    )
    parser.add_argument(
        "--cores", type=int, default=2, help="cores for each round: local[N] (default 2)"
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--compression", default="lz4", choices=["none", "lz4", "snappy", "zstd", "gzip"]
    )
    parser.add_argument(
        "--empty-rounds",
        type=int,
        default=3,
        help="empty rounds per backend; the fixed cost is their median (default 3)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep broker homes, logs and results in this directory",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="also write all figures to this JSON file"
    )
    args = parser.parse_args()
    if args.empty_rounds < 1:
        parser.error("--empty-rounds must be 1 or more")

    info = run_info()
    become_subreaper()  # so the Spark JVM's CPU time is counted (PySpark never waits for it)
    interrupt_on_sigterm()  # SIGTERM unwinds like Ctrl-C: the finally blocks below stop everything
    prod: dict[str, dict[str, Any]] = {}
    rounds: dict[str, dict[str, Any]] = {}
    res: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            workdir = Path(
                tempfile.mkdtemp(prefix=f"s3-{time.strftime('%Y%m%d-%H%M%S')}-", dir=args.keep)
            )
            print(f"[bench] working in {workdir}", file=sys.stderr)
        else:
            workdir = Path(
                stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="icefall-bench-s3-", dir=Path.home())
                )
            )
        moto = MotoS3(workdir / "moto.log")
        stack.callback(moto.stop)
        moto.wait_ready()
        brokers = start_brokers(stack, workdir, moto)
        try:
            for name, broker in brokers.items():
                prod[name] = fill(broker, args.mib, args.partitions, args.compression)
                print(
                    f"[produce] {name}: {prod[name]['rows']:,} rows, {prod[name]['value_bytes'] / MIB:.1f} MiB "
                    f"in {prod[name]['seconds']:.1f} s",
                    file=sys.stderr,
                )
            assert prod["local"]["rows"] == prod["s3"]["rows"], prod
            moto_cpu: dict[str, float] = {}
            empties: dict[str, list[tuple[float, float]]] = {}
            for name, broker in brokers.items():  # the full round, then the_round's empty round
                moto_before = pid_cpu_seconds(moto.proc.pid)
                rounds[name] = the_round(
                    broker,
                    TOPIC,
                    workdir,
                    args.cores,
                    prod[name]["rows"],
                    prod[name]["value_bytes"],
                    env=round_env(),
                    name=f"{name}-round",
                )
                moto_cpu[name] = pid_cpu_seconds(moto.proc.pid) - moto_before
                empty = rounds[name]["empty"]
                empties[name] = [(empty["wall_s"], empty["cpu_s"])]
            for i in range(
                2, args.empty_rounds + 1
            ):  # the other empty rounds, the backends taking turns
                for name, broker in brokers.items():
                    empties[name].append(
                        empty_round(broker, workdir, args.cores, f"empty-{name}-round-{i}")
                    )
            for name in brokers:
                res[name] = summary(rounds[name], empties[name], moto_cpu[name])
                print(f"[round] {name}: {json.dumps(res[name])}", file=sys.stderr)
        except BaseException:
            for name, broker in brokers.items():
                print(
                    f"[bench] broker {name} log tail:\n{broker.log_text()[-2000:]}", file=sys.stderr
                )
            raise
    rat = ratios(res["local"], res["s3"])
    figures = {
        "info": info,
        "produce": prod,
        "results": res,
        "s3_over_local": rat,
        "rounds": rounds,
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    print(json.dumps({k: v for k, v in figures.items() if k != "rounds"}, indent=2, default=str))
    print()
    print(markdown(info, prod, res, rat, args))


if __name__ == "__main__":
    main()
