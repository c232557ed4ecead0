"""Reliability figures with trial counts (issue 8): what tests/reliability checks
with small counts, run many times.

crash    kill -9 of the broker at random moments under full-speed acks=all load,
         ``--runs`` runs of ``--kills`` kills per backend (local, s3 on moto, s3
         with the store unreachable across kills); acknowledged-and-lost,
         duplicates and order violations per producer kind.
wide     1,000 partitions read by 200 concurrent consumers: the broker's RSS vs
         its own 1-partition baseline in the same run; then a commit round over
         the 1,000-partition topic vs one over a 1-partition topic with the same
         records (same run).
cluster  a 3-broker cluster (Postgres, one shared object-store directory): ``--runs``
         trials, each a SIGKILL of one random broker at a random moment under acks=all
         load and its restart (tests/reliability/cluster_kills.py); failover times
         (kill to the first acknowledged produce on each moved partition), acknowledged-
         and-lost, duplicates, order violations, consumer group progress.
pause    the same cluster (the tests' 3 s lease, 300 ms heartbeat): ``--runs`` trials, each
         4 SIGSTOPs of a random broker for 0.5..6 s under acks=all load
         (``cluster_kills.run_pause_trial``): a stalled broker, which loses its leases and drops
         out of the others' Metadata when the stall outlasts a lease. Duplicates per producer
         kind, and each trial's leadership events when a producer that never retries got one.
rounds   ``--round-trials`` commit rounds (separate processes, Spark local[2])
         SIGKILLed at a random moment in 0..1.3 x a round's duration, each
         followed by a complete round; the table is compared with the topic
         after every trial (missing and duplicate rows).

    .venv/bin/python bench/reliability.py [--only crash,wide,rounds,cluster,pause] [--runs 5] [--kills 5]
                                          [--round-trials 10] [--seed 1]

Prints one JSON line per run and a summary JSON at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine
from tests.broker.test_s3_object_store import TcpProxy
from tests.conftest import MotoS3
from tests.reliability.cluster_kills import (
    ClusterTrial,
    PauseTrial,
    run_cluster_trial,
    run_pause_trial,
    three_brokers,
)
from tests.reliability.crash_load import CrashRun, ProducerOutcome, run_crashes
from tests.reliability.resources import run_wide
from tests.reliability.rounds import complete_round, kill_round_at_random
from tests.spark_jobs.round_support import CLICK_V1, AvroProducer, new_topic, table_offsets
from tests.spark_jobs.test_commit_round import clicks
from tests.support import BrokerProcess


def crash_runs(args: argparse.Namespace, work: Path) -> list[CrashRun]:
    runs: list[CrashRun] = []
    moto = MotoS3(work / "moto.log")
    try:
        moto.wait_ready()
        for backend in ("local", "s3", "s3+outage"):
            for i in range(args.runs):
                seed = args.seed * 1000 + len(runs)
                home = work / f"crash-{len(runs)}"
                proxy = TcpProxy(moto.port) if backend != "local" else None
                extra = ["--segment-flush-ms", "100"]
                env = None
                if proxy is not None:
                    bucket = f"bench-{uuid.uuid4().hex[:10]}"
                    moto.client().create_bucket(Bucket=bucket)
                    extra += ["--object-store", f"s3://{bucket}/crash"]
                    env = moto.env(proxy.endpoint)
                broker = BrokerProcess(home, extra, env).start()
                try:
                    outage = (
                        (proxy.down, proxy.up)
                        if proxy is not None and backend == "s3+outage"
                        else None
                    )
                    run = run_crashes(
                        broker, kills=args.kills, seed=seed, backend=backend, outage=outage
                    )
                finally:
                    broker.stop()
                    if proxy is not None:
                        proxy.down()
                print(json.dumps({"crash": run.as_dict()}), flush=True)
                runs.append(run)
                del i
    finally:
        moto.stop()
    return runs


PRODUCER_COUNTS = (
    "produced",
    "acked",
    "failed",
    "acked_lost",
    "acked_misplaced",
    "duplicates",
    "order_violations",
    "unknown",
)


def producer_totals(runs: Iterable[dict[str, ProducerOutcome]]) -> dict[str, dict[str, int]]:
    """Per producer kind, each of ``PRODUCER_COUNTS`` summed over the runs (or trials)."""
    kinds: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for producers in runs:
        for name, outcome in producers.items():
            for key in PRODUCER_COUNTS:
                kinds[name][key] += getattr(outcome, key)
    return {k: dict(v) for k, v in kinds.items()}


def summarise_crashes(runs: list[CrashRun]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by_backend: dict[str, list[CrashRun]] = defaultdict(list)
    for run in runs:
        by_backend[run.backend].append(run)
    for backend, group in by_backend.items():
        restarts = sorted(s for run in group for s in run.restart_seconds)
        out[backend] = {
            "runs": len(group),
            "kills": sum(r.kills for r in group),
            "startup_kills": sum(r.startup_kills for r in group),
            "outage_seconds": round(sum(r.outage_seconds for r in group), 1),
            "restart_s_median": restarts[len(restarts) // 2] if restarts else None,
            "producers": producer_totals(run.producers for run in group),
        }
    return out


def cluster_trials(args: argparse.Namespace, work: Path) -> list[ClusterTrial]:
    """``args.runs`` kill -9 trials on one 3-broker cluster (a fresh topic per trial)."""
    trials: list[ClusterTrial] = []
    timing = {"lease_ms": args.lease_ms, "heartbeat_ms": args.heartbeat_ms}
    with three_brokers(work / "cluster", **timing) as brokers:
        for i in range(args.runs):
            trial = run_cluster_trial(brokers, seed=args.seed * 1000 + i)
            print(json.dumps({"cluster_trial": trial.as_dict()}), flush=True)
            trials.append(trial)
    return trials


def pause_trials(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``args.runs`` pause trials on one 3-broker cluster with the tests' lease and heartbeat."""
    trials: list[PauseTrial] = []
    with three_brokers(work / "pause") as brokers:
        for i in range(args.runs):
            trial = run_pause_trial(brokers, seed=args.seed * 1000 + i)
            line = trial.as_dict()
            if not trial.producers["noretry"].duplicates:
                del line["events"]  # only when it explains something
            print(json.dumps({"pause_trial": line}), flush=True)
            trials.append(trial)
    return {
        "trials": len(trials),
        "pauses": sum(len(t.pauses) for t in trials),
        "trials_with_noretry_duplicates": sum(
            bool(t.producers["noretry"].duplicates) for t in trials
        ),
        "producers": producer_totals(t.producers for t in trials),
    }


def _quantile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else None


def summarise_cluster(trials: list[ClusterTrial], args: argparse.Namespace) -> dict[str, Any]:
    failovers = [s for t in trials for s in t.failover_s.values()]
    worst = [max(t.failover_s.values()) for t in trials if t.failover_s]
    groups = [t.group_s for t in trials if t.group_s is not None]
    return {
        "trials": len(trials),
        "lease_ms": args.lease_ms,
        "heartbeat_ms": args.heartbeat_ms,
        "victims": dict(sorted(Counter(t.victim for t in trials).items())),
        "moved_partitions": len(failovers),
        "failover_s_p50": _quantile(failovers, 0.5),
        "failover_s_max": max(failovers) if failovers else None,
        "failover_s_worst_per_trial": sorted(worst),
        "metadata_s_p50": _quantile([t.metadata_s for t in trials], 0.5),
        "metadata_s_max": max((t.metadata_s for t in trials), default=None),
        "restart_s_p50": _quantile([t.restart_s for t in trials], 0.5),
        "group_s_p50": _quantile(groups, 0.5),
        "group_s_max": max(groups) if groups else None,
        "group_stalled_trials": sum(t.group_s is None for t in trials),
        "group_missing": sum(t.group_missing for t in trials),
        "producers": producer_totals(t.producers for t in trials),
    }


def round_kills(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import random

    rng = random.Random(args.seed)
    broker = BrokerProcess(work / "rounds", ["--segment-flush-ms", "100"]).start()
    trials: list[dict[str, Any]] = []
    try:
        topic = new_topic(broker, partitions=3)
        producer = AvroProducer(broker, topic, CLICK_V1)
        producer.send(clicks(0, 1000))
        first = complete_round(broker, topic, work)
        duration = float(first["seconds"]["total"])
        n = 1000
        for _ in range(args.round_trials):
            producer.send(clicks(n, 500))
            n += 500
            delay, code = kill_round_at_random(broker, topic, work, rng, max_delay_s=1.3 * duration)
            rerun = complete_round(broker, topic, work)
            offsets = table_offsets(broker, topic)
            acked = sorted(producer.acked)
            trial = {
                "kill_after_s": round(delay, 2),
                "finished_before_kill": code is not None,
                "rerun": rerun["status"],
                "rows": len(offsets),
                "missing": len(set(acked) - set(offsets)),
                "duplicates": len(offsets) - len(set(offsets)),
            }
            print(json.dumps({"round_trial": trial}), flush=True)
            trials.append(trial)
    finally:
        broker.stop()
    return {
        "trials": len(trials),
        "round_s": duration,
        "killed_mid_round": sum(not t["finished_before_kill"] for t in trials),
        "missing": sum(t["missing"] for t in trials),
        "duplicates": sum(t["duplicates"] for t in trials),
        "kill_after_s": sorted(t["kill_after_s"] for t in trials),
    }


def wide_round(work: Path, partitions: int, records: int) -> dict[str, Any]:
    """A commit round over ``partitions`` partitions vs one partition, same records, same broker."""
    broker = BrokerProcess(work / "wide-round", ["--segment-flush-ms", "200"]).start()
    out: dict[str, Any] = {"records": records}
    try:
        for label, count in (("baseline_1_partition", 1), (f"{partitions}_partitions", partitions)):
            topic = new_topic(broker, partitions=count)
            producer = AvroProducer(broker, topic, CLICK_V1)
            producer.send(clicks(0, records), key=lambda v: str(v["id"]).encode())
            result = complete_round(broker, topic, work)
            exact = table_offsets(broker, topic) == sorted(producer.acked)
            out[label] = {"status": result["status"], "exact": exact, "seconds": result["seconds"]}
        out["total_over_baseline"] = round(
            out[f"{partitions}_partitions"]["seconds"]["total"]
            / out["baseline_1_partition"]["seconds"]["total"],
            2,
        )
    finally:
        broker.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="crash,wide,rounds,cluster")
    parser.add_argument(
        "--runs", type=int, default=5, help="crash runs per backend; cluster: kill trials"
    )
    parser.add_argument("--lease-ms", type=int, default=6000, help="cluster: broker.lease.ms")
    parser.add_argument(
        "--heartbeat-ms", type=int, default=1000, help="cluster: broker.heartbeat.interval.ms"
    )
    parser.add_argument("--kills", type=int, default=5, help="kills per crash run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--per-partition", type=int, default=50)
    parser.add_argument("--round-trials", type=int, default=10)
    parser.add_argument(
        "--round-records", type=int, default=20000, help="records in the 1,000-partition round"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    assert only <= {"crash", "wide", "rounds", "cluster", "pause"}, only
    summary: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": " ".join(sys.argv),
    }
    with tempfile.TemporaryDirectory(prefix="icefall-reliability-") as tmp:
        work = Path(tmp)
        if "crash" in only:
            summary["crash"] = summarise_crashes(crash_runs(args, work))
        if "wide" in only:
            broker = BrokerProcess(work / "wide", ["--segment-flush-ms", "200"]).start()
            try:
                wide = run_wide(
                    broker,
                    partitions=args.partitions,
                    connections=args.connections,
                    per_partition=args.per_partition,
                )
            finally:
                broker.stop()
            summary["wide"] = {
                **wide.as_dict(),
                "peak_over_baseline": round(wide.peak_rss_mib / wide.baseline_rss_mib, 2),
            }
            summary["wide_round"] = wide_round(work, args.partitions, args.round_records)
        if "rounds" in only:
            summary["rounds"] = round_kills(args, work)
        if "cluster" in only:
            summary["cluster"] = summarise_cluster(cluster_trials(args, work), args)
        if "pause" in only:
            summary["pause"] = pause_trials(args, work)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
