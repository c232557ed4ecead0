"""Where the Apache Iceberg Spark runtime jar comes from, for every Spark
session and spark-submit of the project.

DESIGN.md pins it to the wheel ``snowpark-connect-deps-iceberg==1.0.2``
(Iceberg 1.10 for Spark 3.5; 1.0.3 strips the shaded Jackson classes), so no
Maven download is needed. ``ICEFALL_ICEBERG_JARS`` (comma-separated paths)
overrides it, e.g. for a cluster that has its own copy.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "ICEFALL_ICEBERG_JARS"
RUNTIME_GLOB = "iceberg-spark-runtime-3.5_{scala}-*.jar"


def scala_version() -> str:
    """The Scala binary version of the installed PySpark (its scala-library jar)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in jars.glob("scala-library-*.jar"):
        return ".".join(jar.name.removeprefix("scala-library-").split(".")[:2])
    return "2.12"  # PySpark 3.5's default build


def iceberg_jars() -> list[str]:
    """Paths of the jars to put on Spark's classpath (``spark.jars``)."""
    if override := os.environ.get(ENV, "").strip():
        paths = [p.strip() for p in override.split(",") if p.strip()]
        missing = [p for p in paths if not Path(p).is_file()]
        if missing:
            raise FileNotFoundError(f"{ENV} names jars that do not exist: {missing}")
        return paths
    import snowpark_connect_deps_iceberg as wheel

    found = sorted(wheel.get_jars_dir().glob(RUNTIME_GLOB.format(scala=scala_version())))
    if not found:
        raise FileNotFoundError(
            f"no {RUNTIME_GLOB.format(scala=scala_version())} in {wheel.get_jars_dir()}; "
            f"install snowpark-connect-deps-iceberg==1.0.2 or set {ENV}")
    return [str(found[-1])]
