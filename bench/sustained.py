"""Sustained ingest under ``icefall up`` (issue 17, part 3): the highest produce rate at which
lag stays bounded with rounds every ``--interval-s``, broker, Airflow and rounds on this machine.

Each side starts ``icefall up`` (a temporary home, free ports, the demo producer at 1 record/s),
creates a 4-partition table topic with ``commit.interval.ms`` = the interval (its commit DAG
runs a round per interval, one at a time) and produces bench/commit_round.py's 16-field Avro
values (~500 B, Confluent wire format, lz4, acks=all) at a fixed rate with confluent-kafka in
a process of its own (bench/rate_producer.py: pre-built values, ``produce_batch``, no Python
callback per acknowledged record; cheap, since it runs on the cores it measures, and its CPU
counted apart as "producer"). Every 5 s it samples the lag: records acknowledged by the
broker minus the rows of the table's current snapshot. The sides:
The sides:

a) ``warm``: the warm round driver ``icefall up`` starts (one long-lived Spark driver that the
   commit task asks for each round);
b) ``spark-submit``: ``ICEFALL_NO_WARM_DRIVER=1``, the commit task's default elsewhere: the
   baseline. Until 2026-11-27 a spark-submit (a JVM start) per round; since then the task runs a
   round as a Python process first and spark-submits only one that needs Spark (above 1 GiB
   here), so this side's figures from before that date are spark-submit's.

The search: after a warm-up (the first round commits), the rate steps up through ``--rates``
(MiB/s of values), each step held ``--step-s``; a step is bounded when the lag does not grow
over its second half (least-squares slope x half the step below half a round's records, and
the last sample below three rounds' records). The first unbounded step ends the side. The
spark-submit side, the baseline, holds one step at ``--baseline-rate`` (``0``: ``--rates``
too), so a full run is about 35 minutes. The figure is the highest bounded rate / 2 cores, in
MiB/s per core; the CPU seconds per kind of process (broker, Airflow, warm driver and its JVM,
rounds without the warm driver, Spark's Python workers, the producer, the bench's own lag sampling) say
what bounds it.

Every process it starts is stopped on every way out (the end, an error, Ctrl-C, SIGTERM):
``icefall up`` with SIGINT, then its tree and process group; as a subreaper it also kills
what got orphaned on the way (``leave_no_processes``).

    .venv/bin/python bench/sustained.py --quick     # warm side, 20 s rounds, 60 s at 4 MiB/s
    .venv/bin/python bench/sustained.py             # warm 30, 50 MiB/s; spark-submit 10; 600 s steps
    .venv/bin/python bench/sustained.py --sides warm --rates 40,50,60

The last line prints the figure (``--quick``: the warm side's rate per core and whether its lag
stayed bounded; full: both sides' MiB/s per core and their ratio).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    MIB,
    REPO,
    CpuByProcess,
    leave_no_processes,
    machine,
    own_children,
    stop_processes,
)
from bench.commit_round import register_schema
from bench.rate_producer import ProducerGroup
from bench.vs_connect import committed
from tests.support import free_port, wait_for

TOPIC = "sustained"
PARTITIONS = 4
CORES = 2
SAMPLE_S = 5.0


@dataclass
class Step:
    rate_mib_s: float
    seconds: float
    records: int = 0
    mib: float = 0.0
    achieved_mib_s: float = 0.0  # what the producer sent (it may fall short of the rate)
    growth_records: float = 0.0  # lag growth over the step's second half (least squares)
    lag_end: int = 0
    lag_max: int = 0
    bounded: bool = False
    cpu_s: dict[str, float] = field(default_factory=dict)  # per kind of process, this step


@dataclass
class SideResult:
    name: str
    steps: list[Step] = field(default_factory=list)
    rounds: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def best(self) -> float:
        bounded = [min(s.rate_mib_s, s.achieved_mib_s) for s in self.steps if s.bounded]
        return max(bounded) if bounded else 0.0


def _classify(cmdline: str) -> str:
    if "broker.cli broker" in cmdline:
        return "broker"
    if (
        "commit_round" in cmdline
    ):  # spark_jobs/commit_round.py, or python -m spark_jobs.commit_round
        return "rounds without the warm driver"
    if "spark_jobs.warm_driver" in cmdline:
        return "warm driver (Python)"
    if "pyspark-shell" in cmdline:
        return "warm driver (JVM)"
    if ("pyspark" in cmdline and "daemon" in cmdline) or "spark_jobs.worker_daemon" in cmdline:
        return "Spark Python workers"  # pyspark's daemon, or the warm driver's own
    if "airflow" in cmdline:
        return "Airflow"
    if "broker.cli up" in cmdline:
        return "icefall up (demo producer)"
    return "other"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def icefall_up(home: Path, warm: bool) -> Any:
    """``icefall up`` on free ports; yields (process, bootstrap, registry URL, catalog URL)."""
    kafka, admin, registry, catalog, airflow = (free_port() for _ in range(5))
    env = {
        **os.environ,
        "ICEFALL_AIRFLOW_PORT": str(airflow),
        "ICEFALL_DEMO_COMMIT_INTERVAL_MS": "600000",  # the demo topic stays out of the way
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    if not warm:
        env["ICEFALL_NO_WARM_DRIVER"] = "1"
    command = [sys.executable, "-m", "broker.cli", "up", "--home", str(home), "--demo-rate", "1"]
    for flag, port in (
        ("kafka", kafka),
        ("admin", admin),
        ("registry", registry),
        ("catalog", catalog),
    ):
        command += [f"--{flag}-port", str(port)]
    with open(home.parent / f"{home.name}.out", "wb") as out:
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for(
            lambda: _airflow_up(airflow) or proc.poll() is not None, 300, what="icefall up ready"
        )
        if proc.poll() is not None:
            raise RuntimeError(f"icefall up exited {proc.returncode}; see {out.name}")
        if warm:
            ready = home / "airflow" / "logs" / "warm-driver.ready"
            wait_for(ready.exists, 180, what="the warm driver")
        yield (
            proc,
            f"127.0.0.1:{kafka}",
            f"http://127.0.0.1:{registry}",
            f"http://127.0.0.1:{catalog}",
        )
    finally:
        stop_icefall_up(proc)


def stop_icefall_up(proc: subprocess.Popen[bytes], grace: float = 90.0) -> None:
    """SIGINT (Ctrl-C: ``icefall up`` stops what it started, Airflow and the warm driver
    gracefully), then, past ``grace`` s, its whole tree; then its process group and whatever it
    left behind: a Spark JVM or Python worker whose parent exited is re-parented to this
    process (``leave_no_processes`` makes it a subreaper), so it is among ``own_children``."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        stop_processes({proc.pid})
        proc.wait(10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: its group is its pid
    stop_processes(own_children())


def _airflow_up(port: int) -> bool:
    try:
        return bool(_get(f"http://127.0.0.1:{port}/api/v2/monitor/health"))
    except OSError:
        return False


def _create_topic(bootstrap: str, interval_s: float) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    config = {
        "automq.table.topic.enable": "true",
        "automq.table.topic.commit.interval.ms": str(int(interval_s * 1000)),
        "max.message.bytes": str(2 * MIB),
    }
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config=config)]).values():
        future.result(15)


def _growth(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of lag over time x the samples' span: how much the lag grew."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    ml = sum(lag for _, lag in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    slope = sum((t - mt) * (lag - ml) for t, lag in samples) / var if var else 0.0
    return slope * (samples[-1][0] - samples[0][0])


def run_side(args: argparse.Namespace, name: str, folder: Path) -> SideResult:
    side = SideResult(name)
    home = folder / name
    warm = name == "warm"
    print(f"[{name}] starting icefall up ...", flush=True)
    with icefall_up(home, warm) as (proc, bootstrap, registry, catalog_url):
        from pyiceberg.catalog import load_catalog

        cpu = CpuByProcess(_classify, interval=1.0)
        cpu.start(proc.pid)
        _create_topic(bootstrap, args.interval_s)
        schema_id = register_schema(registry, f"{TOPIC}-value")
        catalog = load_catalog("bench", type="rest", uri=catalog_url)
        identifier = ("default", TOPIC)
        producer = ProducerGroup(
            bootstrap, TOPIC, schema_id, folder / f"{name}-producer.log", args.producers
        )
        cpu_self0 = time.process_time()
        try:
            with producer:
                producer.set_rate(0.2)
                # warm-up: the DAG is parsed and a first round commits
                wait_for(lambda: committed(catalog, identifier) > 0, 300, what="the first round")
                print(f"[{name}] first round committed; stepping the rate", flush=True)
                for rate in _rates(args, name):
                    step = _step(
                        args,
                        proc,
                        producer,
                        catalog,
                        identifier,
                        rate,
                        cpu,
                        cpu_self0,
                        _seconds(args, name),
                    )
                    side.steps.append(step)
                    print(f"[{name}] {json.dumps(asdict(step))}", flush=True)
                    if not step.bounded:
                        break
            producer.check()  # a record that failed in the final flush fails the side too
        except Exception as exc:  # noqa: BLE001 -- reported in the result, the other side runs
            side.error = f"{type(exc).__name__}: {exc}"
            print(f"[{name}] failed: {side.error}", flush=True)
        finally:
            producer.stop()
            side.cpu_s = cpu.stop()
            side.cpu_s["producer"] = round(float(producer.stat("cpu_s")), 1)
            side.cpu_s["bench"] = round(time.process_time() - cpu_self0, 1)
            side.rounds = _rounds(home)
    return side


def _step(
    args: argparse.Namespace,
    proc: subprocess.Popen[bytes],
    producer: ProducerGroup,
    catalog: Any,
    identifier: tuple[str, str],
    rate: float,
    cpu: CpuByProcess,
    cpu_self0: float,
    seconds: float,
) -> Step:
    """One step: ``rate`` MiB/s held ``seconds``, the lag sampled every ``SAMPLE_S``."""
    step = Step(rate, seconds)
    producer.set_rate(rate)
    t0, sent0, bytes0 = time.monotonic(), producer.stat("sent"), producer.stat("value_bytes")
    cpu_before = _cpu_now(cpu, producer, cpu_self0)
    samples: list[tuple[float, int]] = []
    while (elapsed := time.monotonic() - t0) < seconds:
        producer.check()
        if proc.poll() is not None:
            raise RuntimeError(f"icefall up exited {proc.returncode}")
        lag = producer.stat("acked") - committed(catalog, identifier)
        samples.append((elapsed, lag))
        time.sleep(SAMPLE_S)
    step.records = producer.stat("sent") - sent0
    step.mib = round((producer.stat("value_bytes") - bytes0) / MIB, 1)
    step.achieved_mib_s = round(step.mib / seconds, 2)
    cpu_after = _cpu_now(cpu, producer, cpu_self0)
    step.cpu_s = {
        k: round(v - cpu_before.get(k, 0.0), 1)
        for k, v in sorted(cpu_after.items(), key=lambda kv: -(kv[1] - cpu_before.get(kv[0], 0.0)))
        if v - cpu_before.get(k, 0.0) >= 0.1
    }
    half = [s for s in samples if s[0] >= seconds / 2]
    round_records = step.records / seconds * args.interval_s
    step.growth_records = round(_growth(half))
    step.lag_end, step.lag_max = samples[-1][1], max(lag for _, lag in samples)
    step.bounded = step.growth_records < 0.5 * round_records and step.lag_end < 3 * round_records
    return step


def _seconds(args: argparse.Namespace, side: str) -> float:
    """How long the side's steps are held: ``--step-s``; the spark-submit side's one step at
    ``--baseline-rate`` ``--baseline-step-s`` if given (a baseline that grows shows in less)."""
    if side == "spark-submit" and args.baseline_rate and args.baseline_step_s:
        return float(args.baseline_step_s)
    return float(args.step_s)


def _rates(args: argparse.Namespace, side: str) -> list[float]:
    """The side's steps: ``--rates``; the spark-submit side one step at ``--baseline-rate``."""
    if side == "spark-submit" and args.baseline_rate:
        return [args.baseline_rate]
    return list(args.rates)


def _cpu_now(cpu: CpuByProcess, producer: ProducerGroup, self0: float) -> dict[str, float]:
    """CPU seconds so far per kind of process (``CpuByProcess.by_kind``), the producer
    process's and this one's (the lag sampling) too."""
    out = cpu.by_kind()
    out["producer"] = float(producer.stat("cpu_s"))
    out["bench"] = time.process_time() - self0
    return out


def _rounds(home: Path) -> int:
    """Commit rounds that ran (the commit tasks' log directories)."""
    logs = home / "airflow" / "logs"
    return sum(1 for _ in logs.glob(f"dag_id=icefall_commit__{TOPIC}/run_id=*/task_id=commit"))


def markdown(sides: list[SideResult], args: argparse.Namespace, load: tuple[float, ...]) -> str:
    m = machine()
    lines = [
        f"{date.today()} · {m['nproc']} cores, {m['cpu']}, {m['mem_gib']} GiB · load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start",
        "",
        "| side | rate MiB/s | sent MiB/s | s | records | lag growth (2nd half) | lag at end "
        "| max lag | bounded | CPU s (top 4) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side in sides:
        for s in side.steps:
            lines.append(
                f"| {side.name} | {s.rate_mib_s:g} | {s.achieved_mib_s:g} | {s.seconds:g} | {s.records} | "
                f"{s.growth_records} | {s.lag_end} | {s.lag_max} | {'yes' if s.bounded else 'no'} | "
                + ", ".join(f"{k} {v:g}" for k, v in list(s.cpu_s.items())[:4])
                + " |"
            )
    lines.append("")
    for side in sides:
        cpu = ", ".join(f"{k} {v:g}" for k, v in sorted(side.cpu_s.items(), key=lambda kv: -kv[1]))
        lines.append(
            f"- {side.name}: best bounded {side.best:g} MiB/s = **{side.best / CORES:g} MiB/s per core**; "
            f"{side.rounds} rounds; CPU s of the whole side (start-up included): {cpu}"
            + (f"; error: {side.error}" if side.error else "")
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--rates",
        default="30,50",
        help="MiB/s of values, the steps of the warm side (and of spark-submit with "
        "--baseline-rate 0); the side ends at its first unbounded step",
    )
    parser.add_argument(
        "--baseline-rate",
        type=float,
        default=10.0,
        help="the spark-submit side's one step, MiB/s (0: step through --rates too)",
    )
    parser.add_argument("--step-s", type=float, default=600.0, help="how long a step is held")
    parser.add_argument(
        "--baseline-step-s",
        type=float,
        default=None,
        help="how long the spark-submit side's --baseline-rate step is held (default --step-s)",
    )
    parser.add_argument("--interval-s", type=float, default=60.0)
    parser.add_argument("--sides", default="warm,spark-submit", help="of warm,spark-submit")
    parser.add_argument(
        "--producers",
        type=int,
        default=1,
        help="producer processes sharing the rate (1 offers 60 MiB/s in ~0.5 core; more only "
        "when the machine is so busy that one does not get that share)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    if args.quick:
        args.rates, args.step_s, args.interval_s, args.sides = "4", 60.0, 20.0, "warm"
    args.rates = [float(r) for r in args.rates.split(",")]
    if unknown := set(args.sides.split(",")) - {"warm", "spark-submit"}:
        parser.error(f"unknown sides {sorted(unknown)}")
    try:
        with leave_no_processes():
            load = os.getloadavg()
            folder = Path(tempfile.mkdtemp(prefix="icefall-sustained-"))
            print(f"working in {folder}; load average {load}", flush=True)
            try:
                sides = []
                for name in args.sides.split(","):
                    sides.append(run_side(args, name, folder))
                    if (
                        not args.keep
                    ):  # a side's segments and tables (tens of GB) leave room for the next
                        shutil.rmtree(folder / name, ignore_errors=True)
            finally:
                if not args.keep:
                    shutil.rmtree(folder, ignore_errors=True)
    except KeyboardInterrupt as exc:
        sys.exit(f"interrupted ({exc or 'Ctrl-C'}): every process the benchmark started is stopped")
    print()
    print(
        "Command: `.venv/bin/python bench/sustained.py "
        + " ".join(a for a in sys.argv[1:])
        + f"` (interval {args.interval_s:g} s, steps of {args.step_s:g} s)"
    )
    print(markdown(sides, args, load))
    if args.quick:
        [side] = sides
        step = side.steps[-1] if side.steps else None
        bounded = "bounded" if step and step.bounded else "NOT bounded"
        print(
            f"quick: warm driver, {args.rates[0]:g} MiB/s = {args.rates[0] / CORES:g} MiB/s per core, "
            f"{args.interval_s:g} s rounds: lag {bounded}"
            + (f" (growth {step.growth_records} records over the 2nd half)" if step else "")
        )
    else:
        figures = {s.name: s.best / CORES for s in sides}
        base = figures.get("spark-submit") or 0.0
        ratio = f"{figures.get('warm', 0.0) / base:.2f}x" if base else "n/a"
        print(
            "sustained MiB/s per core at bounded lag: "
            + ", ".join(f"{s.name} {_figure(s)}" for s in sides)
            + f"; warm / spark-submit {ratio}"
        )


def _figure(side: SideResult) -> str:
    """The side's MiB/s per core: ``>= x`` when every step was bounded (its ceiling is higher),
    ``< x`` when even the first was not."""
    if side.error or not side.steps:
        return "n/a (" + (side.error or "no step") + ")"
    if all(s.bounded for s in side.steps):
        return f">= {side.best / CORES:g}"
    if not side.best:
        return f"< {side.steps[0].rate_mib_s / CORES:g}"
    return f"{side.best / CORES:g}"


if __name__ == "__main__":
    main()
