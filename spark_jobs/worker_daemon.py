"""Spark's Python worker daemon (``pyspark.daemon``) with the round tasks' modules imported
before it forks a worker: the warm driver's ``spark.python.daemon.module``.

Spark forks every Python worker from one daemon per executor and kills workers idle for a
minute (``PythonWorkerFactory``), so a warm driver whose rounds come a minute or more apart
would otherwise have each Spark round's first tasks import pyarrow, pyiceberg and the decoders
again (seconds of CPU on two cores). Imported here once, every forked worker has them: the modules
a task imports on its way, found in a profile of the workers (pandas through pyarrow's
Parquet writer, pyiceberg's REST catalog module while the task function is unpickled).

Two fixed costs that pyspark's worker pays on every task, not once per worker, are cut here too
(a py-spy profile of Spark-task rounds in the warm driver found them at about twice the CPU of
the task itself, bench/BENCHMARKS.md):

- ``gc.collect()`` after each task of a reused worker (``pyspark.daemon``): a full collection
  walks every object the imports made (~135 k: pyarrow, pyiceberg, pydantic models, pandas),
  60-250 ms a task. ``gc.freeze()`` after the imports moves them to the permanent generation
  (the documented use: a pre-fork server), so a worker's collections walk only what its tasks
  made; it also keeps the forked workers from touching, and so copying, those pages.
- ``importlib.invalidate_caches()`` at the start of each task (``pyspark.worker.main``): on
  Python 3.11 every ``zipimporter`` in ``sys.path_importer_cache`` then reads its whole archive
  directory again, one per package directory imported from ``pyspark.zip`` (Spark puts it on
  the workers' ``PYTHONPATH``), 20-90 ms a task. Those archives never change while a worker
  lives, and an archive a task adds (``--py-files``) gets a new importer anyway, so here a
  zip importer keeps its directory (Python 3.12 made the call cheap itself: gh-103200).
"""

from __future__ import annotations

import gc
import sys
import zipimport

import pandas  # noqa: F401 -- pyarrow's Parquet writer imports it on a table's first write
import pyarrow.parquet  # noqa: F401
import pyiceberg.catalog.rest  # unpickling a round's task function imports it
import pyiceberg.io.pyarrow  # the writer, which ``tasks._write`` imports lazily
import pyiceberg.table.metadata  # noqa: F401
from pyspark import daemon

import spark_jobs.broker_client
import spark_jobs.rounds.tasks  # noqa: F401 -- pyarrow, the decoders


def _keep_zip_directories() -> None:
    """Make ``zipimporter.invalidate_caches`` a no-op on the Pythons where it re-reads archives."""
    if sys.version_info < (3, 12):
        zipimport.zipimporter.invalidate_caches = lambda self: None  # type: ignore[method-assign]


if __name__ == "__main__":
    _keep_zip_directories()
    gc.freeze()
    daemon.manager()
