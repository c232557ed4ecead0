"""The DAG files stay cheap to parse: Airflow's dag-processor imports every one of them
every few seconds, so neither they nor what they import at module level may load Spark,
pyiceberg, Arrow, DuckDB, boto3 or a Kafka client (the tasks import those when they run), nor
the apache-spark provider's operator and hook or the OpenLineage client (``job_operator``
imports the hook only when a job is submitted). ruff's TID253 (pyproject.toml) checks the DAG
files' own imports; this checks the chain."""

from __future__ import annotations

import os
from pathlib import Path

from tests.dags import manifests
from tests.support import REPO, python_json

HEAVY = (
    "pyspark",
    "pyiceberg",
    "pyarrow",
    "pandas",
    "polars",
    "duckdb",
    "boto3",
    "botocore",
    "confluent_kafka",
    "kafka",
    "aiokafka",
    "fastavro",
    "psycopg",
)
# Modules (and their submodules): the Spark provider's operator imports OpenLineage's listener
# and client, ~0.5 CPU-s in every parse and task process
HEAVY_MODULES = (
    "airflow.providers.apache.spark.operators",
    "airflow.providers.apache.spark.hooks",
    "airflow.providers.openlineage.plugins",
    "openlineage",
)

# A fresh interpreter (this one has imported half of them already), as the dag-processor does it.
SCRIPT = """
import importlib.util, json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
print(json.dumps(sorted(sys.modules)))
"""


def test_parsing_the_dag_files_loads_no_heavy_module(tmp_path: Path) -> None:
    manifests.write(
        tmp_path, manifests.entry("clicks"), manifests.entry("shop.orders", 30_000, "shop", 3)
    )
    # icefall_airflow is installed with the distribution: no PYTHONPATH
    env = {**os.environ, "ICEFALL_HOME": str(tmp_path)}
    modules = python_json(["-c", SCRIPT, str(REPO / "dags")], env, cwd=REPO)
    loaded = {name.split(".")[0] for name in modules}
    assert "icefall_airflow.commit_operator" in modules  # the factories ran
    assert loaded.isdisjoint(HEAVY), f"parsing dags/ loads {sorted(loaded & set(HEAVY))}"
    heavy = [m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY_MODULES)]
    assert not heavy, f"parsing dags/ loads {heavy}"
