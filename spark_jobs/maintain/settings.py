"""The settings of one table's maintenance run: S3 Tables' three jobs, their knobs and defaults.

Where each value comes from, first match wins:

1. the job's flag (``--target-file-size-bytes``, ``--strategy``, ``--min-input-files``,
   ``--delete-file-threshold``, ``--expire-older-than-hours``, ``--retain-last``, ``--orphan-older-than-days``);
2. the table topic's config (``automq.table.topic.expire.snapshot.*``, declared by the broker
   with AutoMQ's defaults: enabled, older than 1 h, keep 1; and the ``automq.table.topic.
   maintenance.*`` keys below, unset by default);
3. the table's properties (``write.target-file-size-bytes``, Iceberg's own key, which Spark's
   writers use too; ``icefall.maintenance.*``);
4. S3 Tables' defaults: target file size 512 MiB, strategy ``auto`` (binpack; sort when the
   table has a sort order; z-order when z-order columns are configured), unreferenced files removed after 3 days,
   and any data file with a delete file rewritten (delete file threshold 1: S3 Tables' compaction
   "applies the effects of row-level deletes").

S3 Tables' snapshot defaults (keep at least 1 snapshot, expire those older than 120 h) are
not used: the topic configs always carry a value (AutoMQ's 1 h / 1), and they win.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from broker import topic_configs as declared

MIB = 1024 * 1024

# S3 Tables' defaults (icebergCompaction.targetFileSizeMB, icebergUnreferencedFileRemoval.unreferencedDays,
# icebergSnapshotManagement.minSnapshotsToKeep / maxSnapshotAgeHours).
S3_TABLES_TARGET_FILE_SIZE_BYTES = 512 * MIB
S3_TABLES_UNREFERENCED_DAYS = 3.0
S3_TABLES_MIN_SNAPSHOTS_TO_KEEP = 1
S3_TABLES_MAX_SNAPSHOT_AGE_HOURS = 120.0

# Topic configs (broker/topic_configs.py declares the keys and their defaults; the expire.snapshot.*
# ones always carry a value, the maintenance.* ones default to "": not set, the table property or the
# default applies).
EXPIRE_ENABLED = declared.EXPIRE_SNAPSHOT_ENABLED
EXPIRE_OLDER_THAN_HOURS = declared.EXPIRE_SNAPSHOT_OLDER_THAN_HOURS
EXPIRE_RETAIN_LAST = declared.EXPIRE_SNAPSHOT_RETAIN_LAST
TOPIC_TARGET_FILE_SIZE = declared.MAINTENANCE_TARGET_FILE_SIZE
TOPIC_STRATEGY = declared.MAINTENANCE_STRATEGY
TOPIC_ORPHAN_DAYS = declared.MAINTENANCE_UNREFERENCED_DAYS
TOPIC_ZORDER_COLUMNS = declared.MAINTENANCE_ZORDER_COLUMNS
TOPIC_DELETE_FILE_THRESHOLD = declared.MAINTENANCE_DELETE_FILE_THRESHOLD

# Table properties.
TARGET_FILE_SIZE_PROPERTY = (
    "write.target-file-size-bytes"  # Iceberg's key; its default is 512 MiB too
)
STRATEGY_PROPERTY = "icefall.maintenance.compaction.strategy"
MIN_INPUT_FILES_PROPERTY = "icefall.maintenance.compaction.min-input-files"
ICEBERG_MIN_INPUT_FILES = (
    5  # rewrite_data_files' own default: fewer small files in a group are left alone
)
ORPHAN_DAYS_PROPERTY = "icefall.maintenance.unreferenced-days"
ZORDER_COLUMNS_PROPERTY = "icefall.maintenance.compaction.zorder-columns"
DELETE_FILE_THRESHOLD_PROPERTY = "icefall.maintenance.compaction.delete-file-threshold"
# rewrite_data_files' delete-file-threshold: a data file with at least this many delete files is
# rewritten (its deletes applied) even when its size is fine. Iceberg's own default never does
# (Integer.MAX_VALUE; only its delete-ratio-threshold, 30 % of the rows deleted, applies). An upsert
# table's readers pay for every delete file on every scan, and S3 Tables' compaction applies pending
# deletes, so: 1. Raise it where rewriting a large file for a few deleted rows costs more than it saves.
DEFAULT_DELETE_FILE_THRESHOLD = 1

AUTO, BINPACK, SORT, ZORDER = "auto", "binpack", "sort", "zorder"
STRATEGIES = (AUTO, BINPACK, SORT, ZORDER)
ACTIONS = ("compact", "manifests", "expire", "orphans")  # the order they run in


def _topic_default(key: str, fallback: str) -> str:
    """The broker's declared default of a topic config (so the two cannot drift apart)."""
    found = declared.KEYS.get(key)
    return found.default if found is not None and found.default is not None else fallback


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("true", "1", "yes")


@dataclass(frozen=True)
class Settings:
    target_file_size_bytes: int
    strategy: str  # auto, binpack, sort or zorder
    min_input_files: int
    expire_enabled: bool
    expire_older_than_hours: float
    retain_last: int
    orphan_older_than_days: float
    sources: dict[str, str]  # setting -> flag / topic config / table property / default
    zorder_columns: tuple[str, ...] = ()  # z-order compaction interleaves these columns' values
    delete_file_threshold: int = DEFAULT_DELETE_FILE_THRESHOLD  # see DEFAULT_DELETE_FILE_THRESHOLD

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def compaction_strategy(self, table_sorted: bool) -> str:
        """binpack, sort by the table's sort order, or z-order by ``zorder_columns``; ``auto``
        picks z-order when columns are configured, else sort when the table has a sort order."""
        if self.strategy == AUTO:
            return ZORDER if self.zorder_columns else SORT if table_sorted else BINPACK
        return self.strategy


def resolve(
    topic_configs: Mapping[str, str],
    table_properties: Mapping[str, str],
    flags: Mapping[str, Any] | None = None,
) -> Settings:
    """The settings for one table; ``flags`` holds the job's overrides (None = not given)."""
    flags = flags or {}
    sources: dict[str, str] = {}

    def pick(name: str, topic_key: str | None, property_key: str | None, default: str) -> str:
        if flags.get(name) is not None:
            sources[name] = "flag"
            return str(flags[name])
        if topic_key is not None and topic_configs.get(topic_key) not in (None, ""):
            sources[name] = f"topic config {topic_key}"
            return str(topic_configs[topic_key])
        if property_key is not None and table_properties.get(property_key) not in (None, ""):
            sources[name] = f"table property {property_key}"
            return str(table_properties[property_key])
        sources[name] = "default"
        return default

    target = int(
        pick(
            "target_file_size_bytes",
            TOPIC_TARGET_FILE_SIZE,
            TARGET_FILE_SIZE_PROPERTY,
            str(S3_TABLES_TARGET_FILE_SIZE_BYTES),
        )
    )
    strategy = pick("strategy", TOPIC_STRATEGY, STRATEGY_PROPERTY, AUTO).strip().lower()
    min_input = int(
        pick("min_input_files", None, MIN_INPUT_FILES_PROPERTY, str(ICEBERG_MIN_INPUT_FILES))
    )
    delete_threshold = int(
        pick(
            "delete_file_threshold",
            TOPIC_DELETE_FILE_THRESHOLD,
            DELETE_FILE_THRESHOLD_PROPERTY,
            str(DEFAULT_DELETE_FILE_THRESHOLD),
        )
    )
    enabled = _truthy(
        pick("expire_enabled", EXPIRE_ENABLED, None, _topic_default(EXPIRE_ENABLED, "true"))
    )
    hours = float(
        pick(
            "expire_older_than_hours",
            EXPIRE_OLDER_THAN_HOURS,
            None,
            _topic_default(EXPIRE_OLDER_THAN_HOURS, "1"),
        )
    )
    retain = int(
        pick("retain_last", EXPIRE_RETAIN_LAST, None, _topic_default(EXPIRE_RETAIN_LAST, "1"))
    )
    days = float(
        pick(
            "orphan_older_than_days",
            TOPIC_ORPHAN_DAYS,
            ORPHAN_DAYS_PROPERTY,
            str(S3_TABLES_UNREFERENCED_DAYS),
        )
    )
    if target < 1:
        raise ValueError(f"target file size must be positive, got {target}")
    if strategy not in STRATEGIES:
        raise ValueError(
            f"compaction strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}"
        )
    zorder = parse_columns(
        pick("zorder_columns", TOPIC_ZORDER_COLUMNS, ZORDER_COLUMNS_PROPERTY, "")
    )
    if strategy == ZORDER and not zorder:
        raise ValueError(
            f"compaction strategy zorder needs columns ({TOPIC_ZORDER_COLUMNS} or the table "
            f"property {ZORDER_COLUMNS_PROPERTY})"
        )
    if min_input < 1:
        raise ValueError(f"min input files must be at least 1, got {min_input}")
    if delete_threshold < 1:
        raise ValueError(f"delete file threshold must be at least 1, got {delete_threshold}")
    if retain < 1:
        raise ValueError(f"retain last must be at least 1, got {retain}")
    if hours < 0 or days < 0:
        raise ValueError("snapshot age and orphan age must not be negative")
    return Settings(
        target, strategy, min_input, enabled, hours, retain, days, sources, zorder, delete_threshold
    )


def parse_columns(text: str) -> tuple[str, ...]:
    """``[a, b.c]`` or ``a,b.c`` -> ("a", "b.c")."""
    inner = text.strip().removeprefix("[").removesuffix("]")
    return tuple(c.strip() for c in inner.split(",") if c.strip())


def parse_actions(text: str) -> list[str]:
    """``compact,expire`` -> the actions in the order they run; unknown names are an error."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ACTIONS]
    if unknown or not names:
        raise ValueError(f"unknown actions {unknown}; choose from {','.join(ACTIONS)}")
    return [a for a in ACTIONS if a in names]
