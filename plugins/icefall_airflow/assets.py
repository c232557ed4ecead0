"""The asset a table topic's commits are published on: ``icefall/<namespace>/<table>``.

One constructor, so the commit DAGs and the data teams' DAGs that schedule on
them build the very same asset (name, URI and group).
"""

from __future__ import annotations

from airflow.sdk import Asset, AssetWatcher

from icefall_airflow import settings


def table_asset(namespace: str, table: str) -> Asset:
    name = settings.asset_name(namespace, table)
    return Asset(name=name, uri=name, group="icefall")


def pending_asset(namespace: str, table: str, watchers: list[AssetWatcher]) -> Asset:
    """``icefall/<namespace>/<table>/pending``: watched by the table's size trigger."""
    name = settings.pending_asset_name(namespace, table)
    return Asset(name=name, uri=name, group="icefall", watchers=watchers)


def dlq_reprocess_asset(namespace: str, table: str) -> Asset:
    """``icefall/<namespace>/<table>/dlq-reprocess``: one event per DLQ reprocess that moved rows."""
    name = settings.dlq_asset_name(namespace, table)
    return Asset(name=name, uri=name, group="icefall")


def maintenance_asset(namespace: str, table: str) -> Asset:
    """``icefall/<namespace>/<table>/maintenance``: one event per maintenance run of the table."""
    name = settings.maintenance_asset_name(namespace, table)
    return Asset(name=name, uri=name, group="icefall")


def closed_partitions_asset(namespace: str, table: str) -> Asset:
    """``icefall/<namespace>/<table>/closed-partitions``: one partitioned event per event-time
    partition (hour or day) of the table that a commit closed (``event_partitions``)."""
    name = settings.closed_partitions_asset_name(namespace, table)
    return Asset(name=name, uri=name, group="icefall")
