"""Topic configuration keys: Kafka's own and AutoMQ's table-topic keys.

Every key a topic may carry is declared here with its default and a validator,
so CreateTopics/AlterConfigs reject unknown keys and bad values with Kafka's
INVALID_CONFIG and a message, and DescribeConfigs can list defaults.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker import names

LONG_MAX = 2**63 - 1
TABLE_PREFIX = "automq.table.topic."

# The table-topic keys, one constant each: the broker, the DAG factories and the Spark jobs
# name them through these (and read them through ``TableSettings``), never as string literals.
ENABLE = TABLE_PREFIX + "enable"
COMMIT_INTERVAL_MS = TABLE_PREFIX + "commit.interval.ms"
COMMIT_TRIGGER_BYTES = TABLE_PREFIX + "commit.trigger.bytes"
NAMESPACE = TABLE_PREFIX + "namespace"
CONVERT_VALUE_TYPE = TABLE_PREFIX + "convert.value.type"
CONVERT_KEY_TYPE = TABLE_PREFIX + "convert.key.type"
TRANSFORM_VALUE_TYPE = TABLE_PREFIX + "transform.value.type"
PARTITION_BY = TABLE_PREFIX + "partition.by"
ID_COLUMNS = TABLE_PREFIX + "id.columns"
UPSERT_ENABLE = TABLE_PREFIX + "upsert.enable"
CDC_FIELD = TABLE_PREFIX + "cdc.field"
ERRORS_TOLERANCE = TABLE_PREFIX + "errors.tolerance"
FORMAT_VERSION = TABLE_PREFIX + "format.version"
SCHEMA_VALIDATION = TABLE_PREFIX + "schema.validation"
SCHEMA_EVOLUTION_CHECK = TABLE_PREFIX + "schema.evolution.check"
FRESHNESS_SLA_MS = TABLE_PREFIX + "freshness.sla.ms"
EXPIRE_SNAPSHOT_ENABLED = TABLE_PREFIX + "expire.snapshot.enabled"
EXPIRE_SNAPSHOT_OLDER_THAN_HOURS = TABLE_PREFIX + "expire.snapshot.older.than.hours"
EXPIRE_SNAPSHOT_RETAIN_LAST = TABLE_PREFIX + "expire.snapshot.retain.last"
MAINTENANCE_ENABLE = TABLE_PREFIX + "maintenance.enable"
MAINTENANCE_INTERVAL = TABLE_PREFIX + "maintenance.interval.ms"
MAINTENANCE_TARGET_FILE_SIZE = TABLE_PREFIX + "maintenance.target.file.size.bytes"
MAINTENANCE_STRATEGY = TABLE_PREFIX + "maintenance.compaction.strategy"
MAINTENANCE_ZORDER_COLUMNS = TABLE_PREFIX + "maintenance.compaction.zorder.columns"
MAINTENANCE_DELETE_FILE_THRESHOLD = TABLE_PREFIX + "maintenance.compaction.delete.file.threshold"
MAINTENANCE_UNREFERENCED_DAYS = TABLE_PREFIX + "maintenance.unreferenced.days"


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


def _message_format_version(value: str) -> str:
    """Kafka 3.x accepted any release (``0.10.0``, ``2.8-IV1``, ``3.0``) and ignored it from 3.0
    on; Kafka 4 dropped the key. Accepted so tools that still send it work."""
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?(-IV\d+)?", value.strip()):
        raise InvalidConfigError(f"expected a Kafka release such as 3.0-IV1, got {value!r}")
    return value.strip()


def _throttled_replicas(value: str) -> str:
    """Kafka's form: ``*``, or ``partition:broker`` pairs separated by commas."""
    text = value.strip()
    if text not in ("", "*") and not re.fullmatch(r"\d+:\d+(,\d+:\d+)*", text.replace(" ", "")):
        raise InvalidConfigError(f"expected * or partition:broker pairs, got {value!r}")
    return text.replace(" ", "")


def _list_of(*choices: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        items = [item.strip() for item in value.split(",") if item.strip()]
        bad = [item for item in items if item not in choices]
        if bad:  # an empty list is allowed (cleanup.policy: neither deleted nor compacted)
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
        ConfigKey(
            "cleanup.policy",
            "delete",
            _list_of("delete", "compact"),
            "delete or compact old segments",
            7,
        ),
        ConfigKey(
            "compression.type",
            "producer",
            _choice("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
            "stored as the producer sent it; other values are accepted for compatibility",
            2,
        ),
        ConfigKey("delete.retention.ms", "86400000", _long(0), "tombstone retention", 5),
        ConfigKey("file.delete.delay.ms", "60000", _long(0), "delay before deleting a file", 5),
        ConfigKey(
            "flush.messages", str(LONG_MAX), _long(1), "(WAL group commit always applies)", 5
        ),
        ConfigKey("flush.ms", str(LONG_MAX), _long(0), "(WAL group commit always applies)", 5),
        ConfigKey(
            "index.interval.bytes", "4096", _long(0, 2**31 - 1), "unused: every batch is indexed", 3
        ),
        ConfigKey("max.compaction.lag.ms", str(LONG_MAX), _long(1), "compaction lag", 5),
        ConfigKey(
            "max.message.bytes", "1048588", _long(0, 2**31 - 1), "largest record batch accepted", 3
        ),
        ConfigKey(
            "message.timestamp.type",
            "CreateTime",
            _choice("CreateTime", "LogAppendTime", lower=False),
            "record timestamp semantics",
            2,
        ),
        ConfigKey(
            "message.timestamp.before.max.ms", str(LONG_MAX), _long(0), "timestamp skew allowed", 5
        ),
        ConfigKey(
            "message.timestamp.after.max.ms", str(LONG_MAX), _long(0), "timestamp skew allowed", 5
        ),
        ConfigKey(
            "message.timestamp.difference.max.ms",
            str(LONG_MAX),
            _long(0),
            "deprecated skew bound",
            5,
        ),
        ConfigKey("min.cleanable.dirty.ratio", "0.5", _double(0.0, 1.0), "compaction ratio", 6),
        ConfigKey("min.compaction.lag.ms", "0", _long(0), "compaction lag", 5),
        ConfigKey(
            "min.insync.replicas",
            "1",
            _long(1, 2**31 - 1),
            "durability comes from the WAL and object store",
            3,
        ),
        ConfigKey("preallocate", "false", _bool, "unused", 1),
        ConfigKey("retention.bytes", "-1", _long(-1), "bytes kept per partition (-1: no limit)", 5),
        ConfigKey(
            "retention.ms", "604800000", _long(-1), "time records stay readable (-1: forever)", 5
        ),
        ConfigKey(
            "segment.bytes", "1073741824", _long(14, 2**31 - 1), "unused: segments roll on flush", 3
        ),
        ConfigKey("segment.index.bytes", "10485760", _long(4, 2**31 - 1), "unused", 3),
        ConfigKey("segment.jitter.ms", "0", _long(0), "unused", 5),
        ConfigKey("segment.ms", "604800000", _long(1), "unused: segments roll on flush", 5),
        ConfigKey("unclean.leader.election.enable", "false", _bool, "single leader", 1),
        ConfigKey("message.downconversion.enable", "true", _bool, "unused", 1),
        ConfigKey(
            "leader.replication.throttled.replicas",
            "",
            _throttled_replicas,
            "unused: one replica per partition (kafka-reassign-partitions sets and clears it)",
            7,
        ),
        ConfigKey(
            "follower.replication.throttled.replicas",
            "",
            _throttled_replicas,
            "unused: one replica per partition (kafka-reassign-partitions sets and clears it)",
            7,
        ),
        ConfigKey(
            "message.format.version",
            "3.0-IV1",
            _message_format_version,
            "deprecated and ignored, as in Kafka 3.x (records are always format v2)",
            2,
        ),
        ConfigKey(
            "remote.storage.enable", "false", _bool, "the log is always in object storage", 1
        ),
        ConfigKey("local.retention.ms", "-2", _long(-2), "unused", 5),
        ConfigKey("local.retention.bytes", "-2", _long(-2), "unused", 5),
        # AutoMQ Table Topic keys.
        ConfigKey(ENABLE, "false", _bool, "make this topic a table topic", 1),
        ConfigKey(
            COMMIT_INTERVAL_MS,
            "60000",
            _long(1000, 15 * 60 * 1000),
            "commit round interval (the DAG schedule)",
            5,
        ),
        ConfigKey(
            COMMIT_TRIGGER_BYTES,
            "0",
            _long(0),
            "also start a commit round as soon as this many bytes wait for the table (0: on the interval only)",
            5,
        ),
        ConfigKey(NAMESPACE, "default", _identifier, "Iceberg namespace", 2),
        ConfigKey(CONVERT_VALUE_TYPE, "by_schema_id", _choice(*_CONVERT), "value conversion", 2),
        ConfigKey(CONVERT_KEY_TYPE, "string", _choice(*_CONVERT), "key conversion", 2),
        ConfigKey(
            TRANSFORM_VALUE_TYPE,
            "flatten",
            _choice("none", "flatten", "flatten_debezium"),
            "value transform",
            2,
        ),
        ConfigKey(PARTITION_BY, "", _partition_by, "Iceberg partition spec", 2),
        ConfigKey(ID_COLUMNS, "", _id_columns, "primary key for upsert", 2),
        ConfigKey(UPSERT_ENABLE, "false", _bool, "upsert by id columns", 1),
        ConfigKey(CDC_FIELD, "", _cdc_field, "field holding I/U/D", 2),
        ConfigKey(
            ERRORS_TOLERANCE,
            "invalid_data",
            _choice("none", "invalid_data", "all"),
            "what to do with bad records",
            2,
        ),
        ConfigKey(FORMAT_VERSION, "2", _choice("2", "3"), "Iceberg format version", 3),
        ConfigKey(
            SCHEMA_VALIDATION,
            "true",
            _bool,
            "data quality gate: refuse undecodable records at produce time (by_schema_id)",
            1,
        ),
        ConfigKey(
            SCHEMA_EVOLUTION_CHECK,
            "true",
            _bool,
            "schema registry: refuse (409) a value schema the table could not evolve to "
            "(broker/registry/table_check.py)",
            1,
        ),
        ConfigKey(
            FRESHNESS_SLA_MS,
            "",
            _unset_or(_long(1000, 366 * 24 * 3_600_000)),
            "freshness promise: no record waits longer than this to be in the table (unset: none); "
            "watched by a gauge, the view's breach flag and the commit DAG's deadline alert",
            5,
        ),
        ConfigKey(EXPIRE_SNAPSHOT_ENABLED, "true", _bool, "expire old snapshots", 1),
        ConfigKey(EXPIRE_SNAPSHOT_OLDER_THAN_HOURS, "1", _long(1), "snapshot age to expire", 3),
        ConfigKey(EXPIRE_SNAPSHOT_RETAIN_LAST, "1", _long(1), "snapshots always kept", 3),
        # Table maintenance (spark_jobs/maintain/settings.py reads these; the maintenance DAG's schedule).
        # "" means: not set on the topic, so the table property or S3 Tables' default applies.
        ConfigKey(MAINTENANCE_ENABLE, "true", _bool, "run the maintenance DAG for this table", 1),
        ConfigKey(
            MAINTENANCE_INTERVAL,
            str(MAINTENANCE_INTERVAL_MS),
            _long(MIN_MAINTENANCE_INTERVAL_MS, MAX_MAINTENANCE_INTERVAL_MS),
            "time between maintenance runs (the maintenance DAG's schedule)",
            5,
        ),
        ConfigKey(
            MAINTENANCE_TARGET_FILE_SIZE,
            "",
            _unset_or(_long(1)),
            "compaction target file size (unset: table property write.target-file-size-bytes, else 512 MiB)",
            5,
        ),
        ConfigKey(
            MAINTENANCE_STRATEGY,
            "",
            _unset_or(_choice("auto", "binpack", "sort", "zorder")),
            "compaction strategy (unset: table property, else auto: zorder when z-order columns are set, "
            "sort when the table has a sort order, else binpack)",
            2,
        ),
        ConfigKey(
            MAINTENANCE_ZORDER_COLUMNS,
            "",
            _id_columns,
            "z-order compaction by these columns, e.g. [user_id, ts] (unset: table property)",
            2,
        ),
        ConfigKey(
            MAINTENANCE_DELETE_FILE_THRESHOLD,
            "",
            _unset_or(_long(1, 2**31 - 1)),
            "compaction rewrites a data file with at least this many delete files (applying them) even when "
            "its size is fine (unset: table property, else 1)",
            3,
        ),
        ConfigKey(
            MAINTENANCE_UNREFERENCED_DAYS,
            "",
            _unset_or(_double(1.0, 36500.0)),
            "remove unreferenced files older than this (unset: table property, else 3 days); Iceberg "
            "refuses less than 1 day",
            6,
        ),
    ]
}


# The broker config each Kafka topic config falls back to (Kafka's ServerTopicConfigSynonyms):
# DescribeConfigs names it in a topic config's synonyms, as Kafka does.
BROKER_SYNONYMS: dict[str, str] = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "message.timestamp.difference.max.ms": "log.message.timestamp.difference.max.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "min.insync.replicas": "min.insync.replicas",
    "preallocate": "log.preallocate",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.index.bytes": "log.index.size.max.bytes",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "segment.ms": "log.roll.ms",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "message.downconversion.enable": "log.message.downconversion.enable",
    "message.format.version": "log.message.format.version",
    "local.retention.ms": "log.local.retention.ms",
    "local.retention.bytes": "log.local.retention.bytes",
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
        raise InvalidConfigError(
            f"Invalid value {value!r} for configuration {name}: {exc}"
        ) from None


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
    ids = configs.get(ID_COLUMNS)
    if configs.get(UPSERT_ENABLE) == "true" and not ids:
        raise InvalidConfigError(f"{UPSERT_ENABLE}=true needs {ID_COLUMNS}")
    if configs.get(CDC_FIELD) and not ids:
        raise InvalidConfigError(f"{CDC_FIELD} needs {ID_COLUMNS} (the rows it changes)")
    if configs.get(TRANSFORM_VALUE_TYPE) == "flatten_debezium" and not ids:
        raise InvalidConfigError(
            f"{TRANSFORM_VALUE_TYPE}=flatten_debezium needs {ID_COLUMNS} (the rows it changes)"
        )


def effective(configs: Mapping[str, str]) -> dict[str, str]:
    """Every known key with its value: the topic's own or the default."""
    result = {name: key.default for name, key in KEYS.items() if key.default is not None}
    result.update(configs)
    return result


def is_table_topic(configs: Mapping[str, str]) -> bool:
    return configs.get(ENABLE) == "true"


def table_name(topic: str) -> str:
    return names.table_name(topic)


def _int_or(value: str | None, default: int) -> int:
    """``value`` as an integer; ``default`` when it is unset or not a number (an old or hand-edited manifest)."""
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


@dataclass(frozen=True)
class TableSettings:
    """A typed view of a table topic's configs: every reader of an ``automq.table.topic.*`` key goes
    through here, so a key's name, default and parsing are this module's alone.

    ``configs`` may be a topic's own configs (unset keys take ``KEYS``' defaults) or the manifest's
    effective configs (all set). Readers on the Airflow side are lenient, as they always were: a
    manifest written by an older broker may lack a key or carry a value this version would refuse,
    and a DAG file must still parse.
    """

    configs: Mapping[str, str]

    def get(self, key: str) -> str:
        """The value of ``key`` (a full name, e.g. ``topic_configs.NAMESPACE``), else its declared default."""
        value = self.configs.get(key)
        if value is None:
            value = KEYS[key].default
        return "" if value is None else str(value)

    @property
    def enabled(self) -> bool:
        """Whether the topic is a table topic. Unset counts as on here: an entry of the manifest's
        ``table_topics`` is one, and old manifests did not copy the flag (``is_table_topic`` is the
        broker's stricter test of a topic's own configs)."""
        return str(self.configs.get(ENABLE, "true")).lower() == "true"

    @property
    def namespace(self) -> str:
        return self.get(NAMESPACE)

    @property
    def commit_interval_ms(self) -> int:
        return _int_or(self.get(COMMIT_INTERVAL_MS), 60_000)

    @property
    def commit_trigger_bytes(self) -> int:
        """0 (the default) commits on the interval only."""
        return max(_int_or(self.get(COMMIT_TRIGGER_BYTES), 0), 0)

    @property
    def convert_key_type(self) -> str:
        return self.get(CONVERT_KEY_TYPE)

    @property
    def convert_value_type(self) -> str:
        return self.get(CONVERT_VALUE_TYPE)

    @property
    def transform_value_type(self) -> str:
        return self.get(TRANSFORM_VALUE_TYPE)

    @property
    def flatten_debezium(self) -> bool:
        return self.transform_value_type == "flatten_debezium"

    @property
    def format_version(self) -> int:
        return int(self.get(FORMAT_VERSION))

    @property
    def partition_by(self) -> str:
        return self.get(PARTITION_BY)

    @property
    def id_columns(self) -> str:
        """The raw ``[a, b]`` list (``spark_jobs.rounds.upsert.parse_id_columns`` splits it)."""
        return self.get(ID_COLUMNS)

    @property
    def upsert_enabled(self) -> bool:
        return self.get(UPSERT_ENABLE) == "true"

    @property
    def cdc_field(self) -> str | None:
        return self.get(CDC_FIELD).strip() or None

    @property
    def rounds_need_spark(self) -> bool:
        """Whether every commit round with records needs Spark, whatever its size: an upsert
        table's MERGE, JSON values parsed into columns, a format v3 table (pyiceberg writes no v3
        manifests). The commit task spark-submits such rounds at once (``commit_operator``)."""
        return (
            self.upsert_enabled
            or self.cdc_field is not None
            or self.flatten_debezium
            or self.convert_value_type == "json"
            or _int_or(self.get(FORMAT_VERSION), 2) >= 3  # read at DAG parse time: never raises
        )

    @property
    def errors_tolerance(self) -> str:
        return self.get(ERRORS_TOLERANCE)

    @property
    def schema_validation(self) -> bool:
        return self.get(SCHEMA_VALIDATION) == "true"

    @property
    def schema_evolution_check(self) -> bool:
        return self.get(SCHEMA_EVOLUTION_CHECK).strip().lower() != "false"

    @property
    def freshness_sla_ms(self) -> int | None:
        """The promised freshness, or None when the topic makes no promise."""
        value = _int_or(self.get(FRESHNESS_SLA_MS), 0)
        return value if value > 0 else None

    @property
    def maintenance_enabled(self) -> bool:
        return self.get(MAINTENANCE_ENABLE).strip().lower() == "true"

    @property
    def maintenance_interval_ms(self) -> int:
        """The maintenance DAG's schedule (the broker validated it; an old manifest may lack it)."""
        return _int_or(self.configs.get(MAINTENANCE_INTERVAL), MAINTENANCE_INTERVAL_MS)

    def table_keys(self) -> dict[str, str]:
        """The ``automq.table.topic.*`` keys only (what the manifest carries per table topic)."""
        return {k: v for k, v in self.configs.items() if k.startswith(TABLE_PREFIX)}


def settings(configs: Mapping[str, str]) -> TableSettings:
    """The typed view of ``configs``."""
    return TableSettings(configs)
