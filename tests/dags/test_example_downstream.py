"""The example downstream DAG reads exactly the rows its triggering commit added."""

from __future__ import annotations

import duckdb
import pyarrow as pa


def test_query_keeps_only_the_offsets_of_the_commit() -> None:
    import importlib.util

    from tests.support import REPO

    spec = importlib.util.spec_from_file_location(
        "example_downstream", REPO / "dags" / "example_downstream.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    meta = pa.StructArray.from_arrays(
        [pa.array([0, 0, 0, 1, 1, 1], pa.int32()), pa.array([0, 1, 2, 0, 1, 2], pa.int64())],
        names=["partition", "offset"],
    )
    snap = pa.table({"page": ["/", "/docs", "/docs", "/", "/", "/blog"], "_kafka_metadata": meta})
    extra = {"offsets_before": {"0": 1, "1": 2}, "offsets_after": {"0": 3, "1": 3}}
    con = duckdb.connect()
    con.register("snap", snap)
    assert dict(con.sql(module.new_rows_query(extra)).fetchall()) == {"/docs": 2, "/blog": 1}
    assert module.CLICKS.name == "icefall/default/clicks"
