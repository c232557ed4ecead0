"""What the Iceberg catalog says about a table topic's table (and its DLQ table).

Read through pyiceberg's REST client against the broker's catalog (the URL
comes from the admin API's ``/v1/cluster``), so it works wherever the status
view or a task runs. The commit checkpoint is read with ``broker.checkpoint``,
the same code the commit round uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.checkpoint import NO_CHECKPOINT, Checkpoint, read_checkpoint
from broker.contracts import CatalogSpec
from spark_jobs.maintain import summary as maintenance_summary

REPLACE = "replace"  # the snapshot operation of rewrite_data_files / rewrite_manifests


@dataclass(frozen=True)
class TableFacts:
    exists: bool
    checkpoint: Checkpoint = NO_CHECKPOINT
    rows: int | None = None
    current_snapshot_id: int | None = None
    last_maintenance_ms: int | None = None
    last_maintenance: dict[str, Any] | None = None  # the maintenance job's summary of its last run


def open_catalog(catalog: str | CatalogSpec) -> Any:
    """pyiceberg's client of the tables' catalog: a REST catalog URL, or the broker's spec of it
    (``ClusterInfo.tables_catalog``: the built-in catalog or the one the catalog keys name)."""
    from pyiceberg.catalog import load_catalog

    from icefall_airflow import credentials

    spec = CatalogSpec.rest(catalog) if isinstance(catalog, str) else catalog
    # the icefall_catalog connection's credentials as they are now (a rotated secret counts at
    # once), handed over: the long-lived API server's environment is never changed
    return load_catalog("icefall", **spec.pyiceberg_properties(env=credentials.job_env()))


def _load(catalog: Any, namespace: str, table: str) -> Any | None:
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table((namespace, table))
    except (NoSuchTableError, NoSuchNamespaceError):
        return None


def _total_records(snapshot: Any) -> int | None:
    if snapshot is None or snapshot.summary is None:
        return 0 if snapshot is None else None
    value = snapshot.summary.get("total-records")
    return int(value) if value is not None else None


def table_facts(catalog: Any, namespace: str, table: str) -> TableFacts:
    """Checkpoint, row count (from the snapshot summary, no scan) and last maintenance of a table."""
    loaded = _load(catalog, namespace, table)
    if loaded is None:
        return TableFacts(exists=False)
    metadata = loaded.metadata
    current = loaded.current_snapshot()
    replaced = [
        s.timestamp_ms
        for s in metadata.snapshots
        if s.summary is not None and s.summary.operation.value == REPLACE
    ]
    # The maintenance job records its last run on the table; without that record (maintenance run
    # by another tool), the newest compaction snapshot is the best answer there is.
    recorded = maintenance_summary.from_properties(metadata.properties)
    last_ms = recorded.get("at_ms") if recorded is not None else None
    return TableFacts(
        True,
        read_checkpoint(metadata),
        _total_records(current),
        current.snapshot_id if current is not None else None,
        last_ms if last_ms is not None else max(replaced, default=None),
        recorded,
    )


def row_count(catalog: Any, namespace: str, table: str) -> int | None:
    """Rows in a table's current snapshot, None when the table does not exist."""
    loaded = _load(catalog, namespace, table)
    return None if loaded is None else _total_records(loaded.current_snapshot())
