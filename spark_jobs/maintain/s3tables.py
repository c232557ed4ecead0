"""S3 Tables maintains its tables itself: write the topic's maintenance settings there.

When the tables' catalog is AWS S3 Tables (``automq.table.topic.catalog.type=tablebucket``),
the service compacts, expires snapshots and removes unreferenced files on its own schedule
(and its storage refuses the ``DeleteObject`` calls Icefall's expiry and orphan removal make).
So the maintenance job does not run those three itself: it writes the topic's
``automq.table.topic.maintenance.*`` and ``expire.snapshot.*`` keys to the table's S3 Tables
maintenance configuration (``PutTableMaintenanceConfiguration``, types ``icebergCompaction`` and
``icebergSnapshotManagement``) and runs only what S3 Tables does not do: ``rewrite_manifests``.

What does not map: S3 Tables' unreferenced-file removal is set per table *bucket*
(``PutTableBucketMaintenanceConfiguration``), not per table, so the topic's
``maintenance.unreferenced.days`` is not written (the bucket's setting applies);
``maintenance.compaction.zorder.columns`` and ``delete.file.threshold`` have no S3 Tables
counterpart (its z-order uses the table's sort order; its compaction applies deletes).

moto does not serve these calls: the requests are checked against botocore's model of the API
(tests), and are untested against the live service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker import topic_configs
from spark_jobs.maintain.settings import AUTO, BINPACK, MIB, SORT, ZORDER, Settings

# What S3 Tables does itself; the job's other actions still run (rewrite_manifests).
DONE_BY_S3_TABLES = ("compact", "expire", "orphans")
MAINTAINER_ICEFALL = "Icefall"
MAINTAINER_S3_TABLES = "S3 Tables"
STRATEGY = {AUTO: "auto", BINPACK: "binpack", SORT: "sort", ZORDER: "z-order"}
# S3 Tables accepts a target file size of 64 to 512 MB.
MIN_TARGET_MB, MAX_TARGET_MB = 64, 512


def maintainer(catalog_type: str) -> str:
    """Who compacts and expires the tables of a catalog of this type."""
    return MAINTAINER_S3_TABLES if catalog_type == "tablebucket" else MAINTAINER_ICEFALL


def left_to_icefall(actions: list[str]) -> list[str]:
    """The job's actions S3 Tables does not do."""
    return [a for a in actions if a not in DONE_BY_S3_TABLES]


def _hours(value: float) -> int:
    return max(1, round(value))


def requests(
    table_bucket_arn: str,
    namespace: str,
    name: str,
    settings: Settings,
    topic: Mapping[str, str],
) -> list[dict[str, Any]]:
    """The ``PutTableMaintenanceConfiguration`` requests for one table: compaction and
    snapshot management, from the resolved settings (topic configs win over table properties)."""
    target_mb = settings.target_file_size_bytes // MIB
    if not MIN_TARGET_MB <= target_mb <= MAX_TARGET_MB:
        raise ValueError(
            f"{topic_configs.MAINTENANCE_TARGET_FILE_SIZE}={settings.target_file_size_bytes}: "
            f"S3 Tables compacts to {MIN_TARGET_MB}-{MAX_TARGET_MB} MiB files"
        )
    compaction_on = str(topic.get(topic_configs.MAINTENANCE_ENABLE, "true")).lower() != "false"
    table = {"tableBucketARN": table_bucket_arn, "namespace": namespace, "name": name}
    return [
        {
            **table,
            "type": "icebergCompaction",
            "value": {
                "status": "enabled" if compaction_on else "disabled",
                "settings": {
                    "icebergCompaction": {
                        "targetFileSizeMB": target_mb,
                        "strategy": STRATEGY[settings.strategy],
                    }
                },
            },
        },
        {
            **table,
            "type": "icebergSnapshotManagement",
            "value": {
                "status": "enabled" if settings.expire_enabled else "disabled",
                "settings": {
                    "icebergSnapshotManagement": {
                        "minSnapshotsToKeep": max(1, settings.retain_last),
                        "maxSnapshotAgeHours": _hours(settings.expire_older_than_hours),
                    }
                },
            },
        },
    ]


def client_for(catalog: Any) -> Any:
    """The boto3 ``s3tables`` client of the tables' catalog (Icefall's pyiceberg S3 Tables
    catalog keeps one, with the endpoint, region and credentials it was given)."""
    return catalog.client


def configure(
    client: Any,
    table_bucket_arn: str,
    identifier: tuple[str, str],
    settings: Settings,
    topic: Mapping[str, str],
) -> dict[str, Any]:
    """Write the table's maintenance configuration to S3 Tables with ``client`` (boto3's
    ``s3tables``); what was written, for the job's result."""
    written: dict[str, Any] = {}
    for request in requests(table_bucket_arn, *identifier, settings, topic):
        client.put_table_maintenance_configuration(**request)
        written[request["type"]] = request["value"]
    return {"maintained_by": MAINTAINER_S3_TABLES, "configuration": written}
