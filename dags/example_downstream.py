"""Example: a data team's DAG hung off a table topic's commits.

Scheduled on the asset ``icefall/default/clicks`` (the demo table that
``icefall up`` fills), it runs once per commit round that added a snapshot.
Each triggering event's extra names the snapshot and the offsets the round
added, so the task reads exactly the new rows of that snapshot (a time-travel
scan pinned to the snapshot id, filtered to the round's offsets) and
aggregates them with DuckDB. Copy it, change the asset and the query.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import DAG, task
from icefall_airflow import manifest
from icefall_airflow.assets import table_asset

log = logging.getLogger(__name__)
CLICKS = table_asset("default", "clicks")


def new_rows_query(extra: dict[str, Any]) -> str:
    """SQL over the scanned snapshot (view ``snap``) keeping only the offsets this round added."""
    before, after = extra.get("offsets_before") or {}, extra.get("offsets_after") or {}
    ranges = [
        f"(_kafka_metadata.partition = {int(p)} AND _kafka_metadata.offset >= {int(before.get(p, 0))} "
        f"AND _kafka_metadata.offset < {int(o)})"
        for p, o in after.items()
    ]
    where = " OR ".join(ranges) or "FALSE"
    return f"SELECT page, count(*) AS clicks FROM snap WHERE {where} GROUP BY page ORDER BY clicks DESC"


with DAG(
    dag_id="icefall_example_downstream__clicks",
    description="Example downstream DAG: page counts of each new commit to default.clicks",
    schedule=[CLICKS],
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["icefall", "example"],
    doc_md=__doc__,
):

    @task
    def page_counts_of_new_commits(*, triggering_asset_events: Any) -> list[dict[str, Any]]:
        import duckdb
        from icefall_airflow.broker_client import BrokerClient
        from icefall_airflow.tables import open_catalog

        catalog = BrokerClient(manifest.admin_url()).cluster().tables_catalog
        table = open_catalog(catalog).load_table(("default", "clicks"))
        summaries = []
        for event in triggering_asset_events[CLICKS]:
            extra = event.extra
            snap = table.scan(
                snapshot_id=int(extra["snapshot_id"]), selected_fields=("page", "_kafka_metadata")
            ).to_arrow()
            con = duckdb.connect()
            con.register("snap", snap)
            counts = con.sql(new_rows_query(extra)).fetchall()
            log.info(
                "snapshot %s (round %s, %s rows): %s",
                extra["snapshot_id"],
                extra.get("round_id"),
                extra.get("rows"),
                counts,
            )
            summaries.append({"snapshot_id": extra["snapshot_id"], "page_counts": dict(counts)})
        return summaries

    page_counts_of_new_commits()  # type: ignore[call-arg]  # Airflow passes the events
