"""Topic configuration keys: Kafka's own and AutoMQ's table-topic keys.

Every key a topic may carry is declared here with its default and a validator,
so CreateTopics/AlterConfigs reject unknown keys and bad values with Kafka's
INVALID_CONFIG and a message, and DescribeConfigs can list defaults.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

LONG_MAX = 2**63 - 1
TABLE_PREFIX = "automq.table.topic."


class InvalidConfigError(ValueError):
    """A topic config key or value that the broker will not accept."""


@dataclass(frozen=True)
class ConfigKey:
    name: str
    default: str | None
    validate: Callable[[str], str]
    doc: str
    config_type: int  # DescribeConfigs v3+ type code: 1 bool, 2 string, 3 int, 4 short, 5 long, 6 double, 7 list


def _long(low: int = -(2**63), high: int = LONG_MAX) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            number = int(value.strip())
        except ValueError:
            raise InvalidConfigError(f"expected an integer, got {value!r}") from None
        if not low <= number <= high:
            raise InvalidConfigError(f"value {number} is outside [{low}, {high}]")
        return str(number)

    return check


def _double(low: float, high: float) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            number = float(value)
        except ValueError:
            raise InvalidConfigError(f"expected a number, got {value!r}") from None
        if not low <= number <= high:
            raise InvalidConfigError(f"value {number} is outside [{low}, {high}]")
        return value.strip()

    return check


def _choice(*choices: str, lower: bool = True) -> Callable[[str], str]:
    def check(value: str) -> str:
        normalized = value.strip().lower() if lower else value.strip()
        allowed = [c.lower() if lower else c for c in choices]
        if normalized not in allowed:
            raise InvalidConfigError(f"expected one of {', '.join(choices)}, got {value!r}")
        return choices[allowed.index(normalized)]

    return check


def _bool(value: str) -> str:
    normalized = value.strip().lower()
    if normalized not in ("true", "false"):
        raise InvalidConfigError(f"expected true or false, got {value!r}")
    return normalized


def _list_of(*choices: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        items = [item.strip() for item in value.split(",") if item.strip()]
        bad = [item for item in items if item not in choices]
        if bad or not items:
            raise InvalidConfigError(f"expected a list of {', '.join(choices)}, got {value!r}")
        return ",".join(items)

    return check


_IDENT = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_TRANSFORM = re.compile(
    rf"^(?:{_IDENT}|(?:year|month|day|hour)\(\s*{_IDENT}\s*\)"
    rf"|(?:bucket|truncate)\(\s*{_IDENT}\s*,\s*[1-9][0-9]*\s*\))$"
)


def _bracket_list(value: str) -> list[str]:
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    items: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        items.append(current.strip())
    return items


def _partition_by(value: str) -> str:
    items = _bracket_list(value)
    for item in items:
        if not _TRANSFORM.match(item):
            raise InvalidConfigError(
                f"bad partition transform {item!r}: use col, year(col), month(col), day(col), "
                "hour(col), bucket(col, N) or truncate(col, W)"
            )
    return "[" + ", ".join(items) + "]" if items else ""


def _id_columns(value: str) -> str:
    items = _bracket_list(value)
    for item in items:
        if not re.fullmatch(_IDENT, item):
            raise InvalidConfigError(f"bad id column {item!r}")
    return "[" + ", ".join(items) + "]" if items else ""


def _identifier(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value.strip()):
        raise InvalidConfigError(f"expected an identifier (letters, digits, _), got {value!r}")
    return value.strip()


def _cdc_field(value: str) -> str:
    """A column name (nested with dots), or empty for none."""
    if value.strip() and not re.fullmatch(_IDENT, value.strip()):
        raise InvalidConfigError(f"expected a column name, got {value!r}")
    return value.strip()


def _unset_or(check: Callable[[str], str]) -> Callable[[str], str]:
    """An empty value means "not set here" (the next source of the setting applies)."""

    def unset_or(value: str) -> str:
        return "" if not value.strip() else check(value)

    return unset_or


# The maintenance DAG's schedule: hourly by default; at least a minute (a run costs a Spark start),
# at most 30 days.
MAINTENANCE_INTERVAL_MS = 3_600_000
MIN_MAINTENANCE_INTERVAL_MS = 60_000
MAX_MAINTENANCE_INTERVAL_MS = 30 * 24 * 3_600_000

_CONVERT = ("raw", "string", "by_schema_id", "by_latest_schema", "json")

KEYS: Mapping[str, ConfigKey] = {
    key.name: key
    for key in [
        # Kafka's topic-level configs (defaults as in Apache Kafka 4.x).
        ConfigKey("cleanup.policy", "delete", _list_of("delete", "compact"), "delete or compact old segments", 7),
        ConfigKey(
            "compression.type",
            "producer",
            _choice("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
            "stored as the producer sent it; other values are accepted for compatibility",
            2,
        ),
        ConfigKey("delete.retention.ms", "86400000", _long(0), "tombstone retention", 5),
        ConfigKey("file.delete.delay.ms", "60000", _long(0), "delay before deleting a file", 5),
        ConfigKey("flush.messages", str(LONG_MAX), _long(1), "(WAL group commit always applies)", 5),
        ConfigKey("flush.ms", str(LONG_MAX), _long(0), "(WAL group commit always applies)", 5),
        ConfigKey("index.interval.bytes", "4096", _long(0, 2**31 - 1), "unused: every batch is indexed", 3),
        ConfigKey("max.compaction.lag.ms", str(LONG_MAX), _long(1), "compaction lag", 5),
        ConfigKey("max.message.bytes", "1048588", _long(0, 2**31 - 1), "largest record batch accepted", 3),
        ConfigKey(
            "message.timestamp.type", "CreateTime", _choice("CreateTime", "LogAppendTime", lower=False),
            "record timestamp semantics", 2,
        ),
        ConfigKey("message.timestamp.before.max.ms", str(LONG_MAX), _long(0), "timestamp skew allowed", 5),
        ConfigKey("message.timestamp.after.max.ms", str(LONG_MAX), _long(0), "timestamp skew allowed", 5),
        ConfigKey("message.timestamp.difference.max.ms", str(LONG_MAX), _long(0), "deprecated skew bound", 5),
        ConfigKey("min.cleanable.dirty.ratio", "0.5", _double(0.0, 1.0), "compaction ratio", 6),
        ConfigKey("min.compaction.lag.ms", "0", _long(0), "compaction lag", 5),
        ConfigKey("min.insync.replicas", "1", _long(1, 2**31 - 1), "durability comes from the WAL and object store", 3),
        ConfigKey("preallocate", "false", _bool, "unused", 1),
        ConfigKey("retention.bytes", "-1", _long(-1), "bytes kept per partition (-1: no limit)", 5),
        ConfigKey("retention.ms", "604800000", _long(-1), "time records stay readable (-1: forever)", 5),
        ConfigKey("segment.bytes", "1073741824", _long(14, 2**31 - 1), "unused: segments roll on flush", 3),
        ConfigKey("segment.index.bytes", "10485760", _long(4, 2**31 - 1), "unused", 3),
        ConfigKey("segment.jitter.ms", "0", _long(0), "unused", 5),
        ConfigKey("segment.ms", "604800000", _long(1), "unused: segments roll on flush", 5),
        ConfigKey("unclean.leader.election.enable", "false", _bool, "single leader", 1),
        ConfigKey("message.downconversion.enable", "true", _bool, "unused", 1),
        ConfigKey("remote.storage.enable", "false", _bool, "the log is always in object storage", 1),
        ConfigKey("local.retention.ms", "-2", _long(-2), "unused", 5),
        ConfigKey("local.retention.bytes", "-2", _long(-2), "unused", 5),
        # AutoMQ Table Topic keys.
        ConfigKey(TABLE_PREFIX + "enable", "false", _bool, "make this topic a table topic", 1),
        ConfigKey(
            TABLE_PREFIX + "commit.interval.ms", "60000", _long(1000, 15 * 60 * 1000),
            "commit round interval (the DAG schedule)", 5,
        ),
        ConfigKey(
            TABLE_PREFIX + "commit.trigger.bytes", "0", _long(0),
            "also start a commit round as soon as this many bytes wait for the table (0: on the interval only)", 5,
        ),
        ConfigKey(TABLE_PREFIX + "namespace", "default", _identifier, "Iceberg namespace", 2),
        ConfigKey(TABLE_PREFIX + "convert.value.type", "by_schema_id", _choice(*_CONVERT), "value conversion", 2),
        ConfigKey(TABLE_PREFIX + "convert.key.type", "string", _choice(*_CONVERT), "key conversion", 2),
        ConfigKey(
            TABLE_PREFIX + "transform.value.type", "flatten",
            _choice("none", "flatten", "flatten_debezium"), "value transform", 2,
        ),
        ConfigKey(TABLE_PREFIX + "partition.by", "", _partition_by, "Iceberg partition spec", 2),
        ConfigKey(TABLE_PREFIX + "id.columns", "", _id_columns, "primary key for upsert", 2),
        ConfigKey(TABLE_PREFIX + "upsert.enable", "false", _bool, "upsert by id columns", 1),
        ConfigKey(TABLE_PREFIX + "cdc.field", "", _cdc_field, "field holding I/U/D", 2),
        ConfigKey(
            TABLE_PREFIX + "errors.tolerance", "invalid_data",
            _choice("none", "invalid_data", "all"), "what to do with bad records", 2,
        ),
        ConfigKey(TABLE_PREFIX + "format.version", "2", _choice("2", "3"), "Iceberg format version", 3),
        ConfigKey(
            TABLE_PREFIX + "schema.validation", "true", _bool,
            "data quality gate: refuse undecodable records at produce time (by_schema_id)", 1,
        ),
        ConfigKey(TABLE_PREFIX + "expire.snapshot.enabled", "true", _bool, "expire old snapshots", 1),
        ConfigKey(TABLE_PREFIX + "expire.snapshot.older.than.hours", "1", _long(1), "snapshot age to expire", 3),
        ConfigKey(TABLE_PREFIX + "expire.snapshot.retain.last", "1", _long(1), "snapshots always kept", 3),
        # Table maintenance (spark_jobs/maintenance_settings.py reads these; the maintenance DAG's schedule).
        # "" means: not set on the topic, so the table property or S3 Tables' default applies.
        ConfigKey(TABLE_PREFIX + "maintenance.enable", "true", _bool, "run the maintenance DAG for this table", 1),
        ConfigKey(
            TABLE_PREFIX + "maintenance.interval.ms", str(MAINTENANCE_INTERVAL_MS),
            _long(MIN_MAINTENANCE_INTERVAL_MS, MAX_MAINTENANCE_INTERVAL_MS),
            "time between maintenance runs (the maintenance DAG's schedule)", 5,
        ),
        ConfigKey(
            TABLE_PREFIX + "maintenance.target.file.size.bytes", "", _unset_or(_long(1)),
            "compaction target file size (unset: table property write.target-file-size-bytes, else 512 MiB)", 5,
        ),
        ConfigKey(
            TABLE_PREFIX + "maintenance.compaction.strategy", "",
            _unset_or(_choice("auto", "binpack", "sort", "zorder")),
            "compaction strategy (unset: table property, else auto: zorder when z-order columns are set, "
            "sort when the table has a sort order, else binpack)", 2,
        ),
        ConfigKey(
            TABLE_PREFIX + "maintenance.compaction.zorder.columns", "", _id_columns,
            "z-order compaction by these columns, e.g. [user_id, ts] (unset: table property)", 2,
        ),
        ConfigKey(
            TABLE_PREFIX + "maintenance.compaction.delete.file.threshold", "", _unset_or(_long(1, 2**31 - 1)),
            "compaction rewrites a data file with at least this many delete files (applying them) even when "
            "its size is fine (unset: table property, else 1)", 3,
        ),
        ConfigKey(
            TABLE_PREFIX + "maintenance.unreferenced.days", "", _unset_or(_double(1.0, 36500.0)),
            "remove unreferenced files older than this (unset: table property, else 3 days); Iceberg "
            "refuses less than 1 day", 6,
        ),
    ]
}


def validate(name: str, value: str | None) -> str | None:
    """The normalized value, or InvalidConfigError naming the key."""
    key = KEYS.get(name)
    if key is None:
        raise InvalidConfigError(f"Unknown topic config name: {name}")
    if value is None:
        return None
    try:
        return key.validate(value)
    except InvalidConfigError as exc:
        raise InvalidConfigError(f"Invalid value {value!r} for configuration {name}: {exc}") from None


def validate_all(configs: Mapping[str, str | None]) -> dict[str, str]:
    result: dict[str, str] = {}
    for name, value in configs.items():
        normalized = validate(name, value)
        if normalized is not None:
            result[name] = normalized
    check_consistency(result)
    return result


def check_consistency(configs: Mapping[str, str]) -> None:
    """Rules that span keys (an upsert table needs id columns)."""
    ids = configs.get(TABLE_PREFIX + "id.columns")
    if configs.get(TABLE_PREFIX + "upsert.enable") == "true" and not ids:
        raise InvalidConfigError(f"{TABLE_PREFIX}upsert.enable=true needs {TABLE_PREFIX}id.columns")
    if configs.get(TABLE_PREFIX + "cdc.field") and not ids:
        raise InvalidConfigError(f"{TABLE_PREFIX}cdc.field needs {TABLE_PREFIX}id.columns (the rows it changes)")
    if configs.get(TABLE_PREFIX + "transform.value.type") == "flatten_debezium" and not ids:
        raise InvalidConfigError(f"{TABLE_PREFIX}transform.value.type=flatten_debezium needs "
                                 f"{TABLE_PREFIX}id.columns (the rows it changes)")


def effective(configs: Mapping[str, str]) -> dict[str, str]:
    """Every known key with its value: the topic's own or the default."""
    result = {name: key.default for name, key in KEYS.items() if key.default is not None}
    result.update(configs)
    return result


def is_table_topic(configs: Mapping[str, str]) -> bool:
    return configs.get(TABLE_PREFIX + "enable") == "true"


def table_name(topic: str) -> str:
    return topic.replace(".", "_").replace("-", "_")
