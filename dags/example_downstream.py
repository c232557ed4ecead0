"""Example: a data team's DAGs hung off a table topic's commits.

Two DAGs on the demo table ``default.clicks`` that ``icefall up`` fills
(``ICEFALL_EXAMPLE_TABLE=<namespace>.<table>`` points them at another table).

``icefall_example_downstream__clicks`` is scheduled on the asset
``icefall/default/clicks`` and runs once per commit round that added a
snapshot. Each triggering event's extra names the snapshot and the offsets the
round added, so the task reads exactly the new rows of that snapshot (a
time-travel scan pinned to the snapshot id, filtered to the round's offsets)
and aggregates them with DuckDB.

``icefall_example_hourly__clicks`` runs once per closed event-time partition:
it is scheduled with ``PartitionedAssetTimetable`` on
``icefall/default/clicks/closed-partitions``, which gets one partitioned event
per hour (or day) once every Kafka partition's watermark has passed its end, on
a table partitioned by ``hour(...)``/``day(...)`` of a timestamp (set
``automq.table.topic.partition.by=[hour(_kafka_metadata.timestamp)]`` on the
topic). The run's ``partition_key`` is the hour's start (UTC); the task reads
that hour's rows and counts pages with DuckDB. Copy them, change the table and
the query.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import DAG, PartitionedAssetTimetable, task
from icefall_airflow import event_partitions, manifest
from icefall_airflow.assets import closed_partitions_asset, table_asset

log = logging.getLogger(__name__)
EXAMPLE_TABLE = os.environ.get("ICEFALL_EXAMPLE_TABLE", "default.clicks")
NAMESPACE, _, TABLE = EXAMPLE_TABLE.partition(".")
if not NAMESPACE or not TABLE:  # Airflow shows this as the file's import error
    raise ValueError(
        f"ICEFALL_EXAMPLE_TABLE={EXAMPLE_TABLE!r}: expected <namespace>.<table>, e.g. default.clicks"
    )
CLICKS = table_asset(NAMESPACE, TABLE)
CLICKS_CLOSED = closed_partitions_asset(NAMESPACE, TABLE)


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
    dag_id=f"icefall_example_downstream__{TABLE}",
    description=f"Example downstream DAG: page counts of each new commit to {NAMESPACE}.{TABLE}",
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
        table = open_catalog(catalog).load_table((NAMESPACE, TABLE))
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


def partition_rows(table: Any, key: str, extra: dict[str, Any], columns: tuple[str, ...]) -> Any:
    """The rows of the event-time partition ``key`` (an Arrow table), as of the snapshot that
    closed it (the event's extra names the event-time column and the granularity)."""
    start, end = event_partitions.window(key, str(extra["granularity"]))
    column = str(extra["event_time_column"])
    where = f"{column} >= '{start.isoformat()}' AND {column} < '{end.isoformat()}'"
    top = {column.split(".")[0], *columns}
    scan = table.scan(
        row_filter=where, snapshot_id=int(extra["snapshot_id"]), selected_fields=tuple(top)
    )
    return scan.to_arrow()


def page_counts_of_partition(table: Any, key: str, extra: dict[str, Any]) -> dict[str, int]:
    import duckdb

    con = duckdb.connect()
    con.register("part", partition_rows(table, key, extra, ("page",)))
    return dict(con.sql("SELECT page, count(*) FROM part GROUP BY page").fetchall())


with DAG(
    dag_id=f"icefall_example_hourly__{TABLE}",
    description=f"Example downstream DAG: page counts of each closed hour of {NAMESPACE}.{TABLE}",
    schedule=PartitionedAssetTimetable(assets=CLICKS_CLOSED),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["icefall", "example"],
    doc_md=__doc__,
):

    @task
    def page_counts_of_closed_partition(
        *, dag_run: Any, triggering_asset_events: Any
    ) -> dict[str, Any]:
        from icefall_airflow.broker_client import BrokerClient
        from icefall_airflow.tables import open_catalog

        key = dag_run.partition_key
        extra = dict(triggering_asset_events[CLICKS_CLOSED][-1].extra)
        catalog = BrokerClient(manifest.admin_url()).cluster().tables_catalog
        table = open_catalog(catalog).load_table((NAMESPACE, TABLE))
        counts = page_counts_of_partition(table, key, extra)
        log.info(
            "%s %s (closed by snapshot %s): %s",
            extra["granularity"],
            key,
            extra["snapshot_id"],
            counts,
        )
        return {"partition_key": key, "page_counts": counts}

    page_counts_of_closed_partition()  # type: ignore[call-arg]  # Airflow passes the run and events
