"""Spark's Python worker daemon (``pyspark.daemon``) with the round tasks' modules imported
before it forks a worker: the warm driver's ``spark.python.daemon.module``.

Spark forks every Python worker from one daemon per executor and kills workers idle for a
minute (``PythonWorkerFactory``), so a warm driver whose rounds come a minute or more apart
would otherwise have each Spark round's first tasks import pyarrow, pyiceberg and the decoders
again (seconds of CPU on two cores). Imported here once, every forked worker has them.
"""

from __future__ import annotations

from pyspark import daemon

import spark_jobs.rounds.tasks  # noqa: F401 -- pyarrow, pyiceberg's writer, the decoders

if __name__ == "__main__":
    daemon.manager()
