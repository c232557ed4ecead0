"""The DAG files stay cheap to parse: Airflow's dag-processor imports every one of them
every few seconds, so neither they nor what they import at module level may load Spark,
pyiceberg, Arrow, DuckDB, boto3 or a Kafka client (the tasks import those when they run).
ruff's TID253 (pyproject.toml) checks the DAG files' own imports; this checks the chain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.dags import manifests
from tests.support import REPO

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

# A fresh interpreter (this one has imported half of them already), as the dag-processor does it.
SCRIPT = """
import importlib.util, json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_parsing_the_dag_files_loads_no_heavy_module(tmp_path: Path) -> None:
    manifests.write(
        tmp_path, manifests.entry("clicks"), manifests.entry("shop.orders", 30_000, "shop", 3)
    )
    # icefall_airflow is installed with the distribution: no PYTHONPATH
    env = {**os.environ, "ICEFALL_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(REPO / "dags")],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "icefall_airflow" in loaded  # the factories ran
    assert loaded.isdisjoint(HEAVY), f"parsing dags/ loads {sorted(loaded & set(HEAVY))}"
