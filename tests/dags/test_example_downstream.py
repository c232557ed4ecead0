"""The example downstream DAG reads exactly the rows its triggering commit added."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest


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


def test_a_table_name_without_its_namespace_is_the_files_import_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Airflow shows a DAG file's exception as its import error: it says what to set."""
    import importlib.util

    from tests.support import REPO

    monkeypatch.setenv("ICEFALL_EXAMPLE_TABLE", "clicks")
    spec = importlib.util.spec_from_file_location(
        "example_downstream_bad", REPO / "dags" / "example_downstream.py"
    )
    assert spec is not None and spec.loader is not None
    with pytest.raises(ValueError, match=r"ICEFALL_EXAMPLE_TABLE='clicks': expected <namespace>"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
