"""Which jars every Spark session and spark-submit of the project gets.

They come from Maven Central by their coordinates, as Spark users take them:
``spark_jobs/jvm/pom.xml`` names the Apache Iceberg Spark runtime
(``org.apache.iceberg:iceberg-spark-runtime-3.5_2.12``) and
``org.apache.iceberg:iceberg-aws-bundle`` (the AWS SDK v2 that the runtime's
S3FileIO and Glue catalog call); ``make setup`` copies them into ``JARS_DIR`` inside the
virtualenv and checks each against the committed ``jvm/jars.sha256``. No jar
is downloaded at run time, so a Spark session starts the same offline.

``ICEFALL_ICEBERG_JARS`` (comma-separated paths) overrides the folder, e.g. on
a cluster that ships its own copies; ``ICEFALL_JARS_DIR`` points at another
folder of pinned jars (a Docker image, say).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "ICEFALL_ICEBERG_JARS"
DIR_ENV = "ICEFALL_JARS_DIR"
JVM_DIR = Path(__file__).resolve().parent / "jvm"
CHECKSUMS = JVM_DIR / "jars.sha256"
# Where `make setup` puts them: inside the virtualenv, so each checkout's venv has its own pinned set.
JARS_DIR = Path(sys.prefix) / "share" / "icefall" / "jars"


def scala_version() -> str:
    """The Scala binary version of the installed PySpark (its scala-library jar)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in jars.glob("scala-library-*.jar"):
        return ".".join(jar.name.removeprefix("scala-library-").split(".")[:2])
    return "2.12"  # PySpark 3.5's default build


def pinned_jar_names() -> list[str]:
    """The jar file names ``jvm/jars.sha256`` pins (one ``<sha256>  <name>`` line each)."""
    return [line.split()[1] for line in CHECKSUMS.read_text().splitlines() if line.strip()]


def iceberg_jars() -> list[str]:
    """Paths of the jars to put on Spark's classpath (``spark.jars``): the Iceberg runtime
    for the installed PySpark's Scala version and the AWS bundle."""
    if override := os.environ.get(ENV, "").strip():
        paths = [p.strip() for p in override.split(",") if p.strip()]
        missing = [p for p in paths if not Path(p).is_file()]
        if missing:
            raise FileNotFoundError(f"{ENV} names jars that do not exist: {missing}")
        return paths
    folder = Path(os.environ.get(DIR_ENV) or JARS_DIR)
    names = pinned_jar_names()
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the pinned Iceberg jars {missing} are not in {folder}: run `make setup` (it fetches them "
            f"from Maven Central with {JVM_DIR / 'pom.xml'}), or set {ENV} or {DIR_ENV}"
        )
    scala = scala_version()
    runtime = [n for n in names if n.startswith("iceberg-spark-runtime-")]
    if not any(n.startswith(f"iceberg-spark-runtime-3.5_{scala}-") for n in runtime):
        raise FileNotFoundError(
            f"the pinned Iceberg runtime {runtime} is not built for PySpark's Scala {scala}"
        )
    return [str(folder / name) for name in names]
