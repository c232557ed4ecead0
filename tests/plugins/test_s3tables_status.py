"""The Table topics view says who maintains each table: Icefall's maintenance DAG, or AWS S3
Tables itself when the tables' catalog is a table bucket."""

from __future__ import annotations

from spark_jobs.maintain import s3tables as s3tables_maintenance


def test_the_view_names_who_maintains_each_table() -> None:
    from icefall_airflow.view import render

    row = {
        "topic": "t",
        "namespace": "default",
        "table": "t",
        "error": None,
        "dag_id": "icefall_commit__t",
        "dag_runs_url": "dags/icefall_commit__t/runs",
        "lag_records": 0,
        "lag_seconds": 0.0,
        "last_commit_ms": None,
        "snapshot_id": 1,
        "rows": 5,
        "dlq_rows": 0,
        "last_maintenance_ms": None,
    }
    assert s3tables_maintenance.maintainer("tablebucket") == "S3 Tables"
    assert s3tables_maintenance.maintainer("rest") == "Icefall"
    assert "by S3 Tables" in render({"tables": [{**row, "maintained_by": "S3 Tables"}]})
    assert "by Icefall" in render({"tables": [row]})
