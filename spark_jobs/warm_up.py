"""The warm driver's warm-up: what a round's first Spark tasks would otherwise pay, paid before
the driver answers its health check (readiness means warm).

The first round of a new driver that ran Spark tasks took 31 s of ``read_write`` for what later
rounds did in 7-10 s (bench/BENCHMARKS.md, vs Connect): Spark's Python workers starting
(forked from the daemon, then importing the task modules) and the JVM's code of a Python job
(PythonRDD, the scheduler, Arrow's Python path) running cold. Here one task per core of the
session's master runs a small piece of the tasks' Python (a Parquet file written to memory with
pyarrow, as a task writes its data files), with the session's worker settings (reuse on, the
preloading ``worker_daemon``), so every core has a live worker; then one tiny DataFrame goes
through ``mapInArrow`` (the JVM <-> Arrow path of ``read_staged``). No catalog is touched: the
driver learns its catalogs from the rounds, and a warm-up writes to no table.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

log = logging.getLogger("icefall.warm_driver")


class WarmUp(BaseModel):
    """What the warm-up did: its wall time and the Python workers (pids) its tasks ran in."""

    seconds: float
    cores: int
    python_workers: list[int]


def _task(index: int) -> int:
    """A round task's first steps in a Python worker: its modules and a Parquet write."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import spark_jobs.rounds.tasks  # noqa: F401 -- the modules a round task deserializes with

    pq.write_table(pa.table({"i": [index]}), io.BytesIO())
    return os.getpid()


def _arrow(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def warm_up(spark: Any) -> WarmUp:
    """Start a Python worker on every core and run the round's JVM code paths once."""
    started = time.monotonic()
    sc = spark.sparkContext
    cores = max(1, int(sc.defaultParallelism))
    pids = sc.parallelize(range(cores), cores).map(_task).collect()
    rows = spark.createDataFrame([(1,)], "i int").mapInArrow(_arrow, "i int").collect()
    if [r.i for r in rows] != [1]:
        raise RuntimeError(f"the warm-up's Arrow round trip gave {rows}")
    done = WarmUp(
        seconds=round(time.monotonic() - started, 3),
        cores=cores,
        python_workers=sorted(set(pids)),
    )
    log.info(
        "warm-up done in %.1f s: %d core(s), Python workers %s",
        done.seconds,
        cores,
        done.python_workers,
    )
    return done
