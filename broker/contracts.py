"""What crosses a process boundary, as pydantic models: the one definition of each JSON document.

Three runtimes talk to each other in JSON: the broker (its admin API and the
table-topic manifest it writes), the Airflow plugin (the DAGs parse the
manifest, tasks call the admin API and hand plans and results on through XCom) and
the Spark jobs (they call the admin API and write a result JSON the operators
read). Each side used to build and pick apart those dicts on its own, so a key
renamed on one side failed at run time on the other. Each document is a model
here, and both ends use it: the broker serves ``model_dump(mode="json")`` of
the model a client parses with ``model_validate``.

The field names and their order are the JSON's as it always was (Airflow keeps
XComs and asset-event extras of earlier runs; tests compare answers), so a
model is a description of an existing contract, not a new one. Offsets keyed by
partition are ``dict[int, int]`` in Python and ``{"<partition>": offset}``,
sorted, in JSON (JSON object keys are strings).

Models read like the JSON dicts they replace too (``answer["partitions"]``,
``answer.get("x")``): code and tests written against the dicts keep working
while callers move to attributes.

Only pydantic and the standard library: the broker package is installed on
Spark executors and in Airflow, and the DAG files import the manifest model at
parse time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, field_validator

from broker import names, topic_configs
from broker.external_catalogs import tablebucket

# Icefall's FileIO for every pyiceberg catalog its processes open (broker/iceberg_fileio.py);
# named here, not imported: this module is read at DAG parse time, and pyiceberg imports that
# one when a catalog loads a table
ICEFALL_FILE_IO = "broker.iceberg_fileio.IcefallFileIO"


def with_default_io(properties: Mapping[str, str]) -> dict[str, str]:
    """``properties`` with ``py-io-impl`` = Icefall's FileIO unless they name a FileIO."""
    return {"py-io-impl": ICEFALL_FILE_IO, **properties}


def _offsets_json(offsets: Mapping[int, int]) -> dict[str, int]:
    return {str(p): int(o) for p, o in sorted(offsets.items(), key=lambda item: int(item[0]))}


# partition -> offset; ``{"<partition>": offset}`` sorted by partition in JSON
Offsets = Annotated[dict[int, int], PlainSerializer(_offsets_json, when_used="json")]


class Contract(BaseModel):
    """Base of every model here: unknown keys are ignored (a newer peer may add some), and the
    model reads like the JSON dict it describes."""

    model_config = ConfigDict(extra="ignore")

    def __getitem__(self, key: str) -> Any:
        if key not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in type(self).model_fields

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in type(self).model_fields else default

    def to_json(self) -> dict[str, Any]:
        """The JSON document (what the broker serves, a job writes, a task puts in XCom)."""
        return self.model_dump(mode="json")


# ---------------------------------------------------------------- the table-topic manifest


class TableTopic(Contract):
    """One entry of the broker's table-topic manifest (``GET /v1/table-topics``, ``table_topics.json``).

    Lenient where old manifests were: no namespace means ``default``, config values are
    kept as text (the broker writes them so; a hand-edited file may not).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    topic: str
    topic_id: str = ""
    partitions: int = 1
    namespace: str = "default"
    table: str
    commit_interval_ms: int = 60_000
    configs: dict[str, str] = Field(default_factory=dict)
    # when the broker created the topic (ms since the epoch): the maintenance DAG's first run
    # comes one interval after it; 0 in manifests written before the field
    created_ms: int = 0

    @field_validator("namespace", mode="before")
    @classmethod
    def _namespace(cls, value: Any) -> Any:
        return value or "default"

    @field_validator("topic", "topic_id", "table", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return "" if value is None else str(value)

    @field_validator("configs", mode="before")
    @classmethod
    def _configs(cls, value: Any) -> Any:
        return {str(k): str(v) for k, v in (value or {}).items()}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TableTopic:
        return cls.model_validate(raw)

    @property
    def settings(self) -> topic_configs.TableSettings:
        """The topic's ``automq.table.topic.*`` configs, typed (``broker.topic_configs``)."""
        return topic_configs.TableSettings(self.configs)

    @property
    def identifier(self) -> tuple[str, str]:
        """(namespace, table): the table's catalog identifier."""
        return (self.namespace, self.table)

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    @property
    def commit_trigger_bytes(self) -> int:
        """``automq.table.topic.commit.trigger.bytes``: 0 (the default) commits on the interval only."""
        return self.settings.commit_trigger_bytes

    @property
    def dag_id(self) -> str:
        return names.commit_dag_id(self.topic)

    @property
    def pool(self) -> str:
        return names.pool_name(self.topic)

    @property
    def asset_name(self) -> str:
        return names.asset_name(self.namespace, self.table)

    @property
    def dlq_table(self) -> str:
        return names.dlq_table(self.table)


MANIFEST_VERSION = 1


class Manifest(Contract):
    """The table-topic manifest: ``table_topics``, and ``disabled_table_topics`` (topics whose
    ``automq.table.topic.enable`` is set to ``false``: their DAGs stay, paused)."""

    version: int = MANIFEST_VERSION
    admin_url: str | None = None
    table_topics: Sequence[
        TableTopic
    ]  # a list (Sequence: the plugin's Manifest narrows the entry type)
    disabled_table_topics: Sequence[TableTopic] = Field(default_factory=list)

    @field_validator("disabled_table_topics", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return value or []

    def find(self, topic: str) -> TableTopic | None:
        """The table topic named ``topic`` (not a disabled one), None when there is none."""
        return next((t for t in self.table_topics if t.topic == topic), None)


# ---------------------------------------------------------------- the admin API: requests


class PlanRequest(Contract):
    """``GET /v1/topics/{topic}/plan``: end offsets for ``until_append_ms`` (exclusive), or the flushed end."""

    until_append_ms: int | None = None

    def query(self) -> dict[str, str]:
        return (
            {}
            if self.until_append_ms is None
            else {"until_append_ms": str(int(self.until_append_ms))}
        )


class RangesRequest(Contract):
    """``GET /v1/topics/{topic}/partitions/{partition}/ranges?start=A&end=B``."""

    partition: int
    start: int
    end: int

    def query(self) -> dict[str, str]:
        return {"start": str(self.start), "end": str(self.end)}


class PendingRequest(Contract):
    """``GET /v1/topics/{topic}/pending?from={"<partition>": offset}``: ``since`` moves the start past
    the committed offsets (a size trigger that already fired up to them)."""

    since: Offsets = Field(default_factory=dict)

    def query(self) -> dict[str, str]:
        return {"from": json.dumps({str(p): int(o) for p, o in self.since.items()})}

    @staticmethod
    def parse_offsets(text: str) -> dict[int, int]:
        """``{"<partition>": <offset>}`` (JSON) -> {partition: offset}; ValueError or TypeError when it is not that."""
        value = json.loads(text)
        if not isinstance(value, dict):
            raise TypeError("not a JSON object")
        return {int(p): int(o) for p, o in value.items()}


# ---------------------------------------------------------------- the admin API: responses


class ErrorAnswer(Contract):
    """Any error of the admin API (the HTTP status is ``error_code`` too)."""

    error_code: int
    message: str


class Health(Contract):
    """``GET /healthz`` (503 while the WAL cannot write: a full disk)."""

    status: str
    object_store: str
    segments_written: int
    flush_failures: int
    unflushed_bytes: int
    max_unflushed_bytes: int
    produces_held: int


NESSIE_PY_CATALOG = "broker.external_catalogs.nessie.NessieCatalog"


class CatalogSpec(Contract):
    """The Iceberg catalog that holds the tables, as the broker's settings name it
    (``automq.table.topic.catalog.type|uri|warehouse`` and the other
    ``automq.table.topic.catalog.<property>`` keys): what a job, the plugin or the broker's
    own readers need to open it with pyiceberg or Spark. ``builtin``: the broker's own REST
    catalog. Opened: REST catalogs (the built-in one or any Iceberg REST catalog), AWS Glue,
    AWS S3 Tables (``tablebucket``: ``warehouse`` is the table bucket's ARN) and Nessie (Spark:
    Iceberg's ``NessieCatalog``; pyiceberg: broker/external_catalogs/nessie.py)."""

    type: str = "rest"
    uri: str = ""  # empty for catalogs without one (glue)
    warehouse: str | None = None
    properties: dict[str, str] = Field(default_factory=dict)
    builtin: bool = True

    @classmethod
    def rest(cls, uri: str) -> CatalogSpec:
        """The broker's own catalog at ``uri`` (or a job's ``--catalog-url``)."""
        return cls(uri=uri)

    def pyiceberg_properties(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """``load_catalog(name, **these)``. pyiceberg has no S3 Tables or Nessie catalog: those
        are Icefall's (broker/external_catalogs/). ``env``: where the REST catalog's credentials
        come from (this process's environment unless given). The FileIO is Icefall's
        (``broker.iceberg_fileio``) unless the properties name one."""
        return with_default_io(self._pyiceberg_catalog_properties(env))

    def _pyiceberg_catalog_properties(self, env: Mapping[str, str] | None) -> dict[str, str]:
        if self.type == tablebucket.TYPE:  # AWS S3 Tables: warehouse is the table bucket's ARN
            return tablebucket.pyiceberg_properties(self.warehouse or "", self.properties)
        extra = {"warehouse": self.warehouse} if self.warehouse and not self.builtin else {}
        if self.type == "nessie":  # on Nessie's own API
            return {
                **self.properties,
                **extra,
                "py-catalog-impl": NESSIE_PY_CATALOG,
                "uri": self.uri,
            }
        uri = {"uri": self.uri} if self.uri else {}
        return {**self.properties, **extra, "type": self.type, **uri, **self._credential(env)}

    def _credential(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The OAuth2 client credentials or bearer token for a REST catalog
        (``ICEFALL_CATALOG_CREDENTIAL``, ``ICEFALL_CATALOG_TOKEN``, filled from an Airflow
        connection): never part of the spec itself, so never in ``/v1/cluster`` or a result."""
        from broker.http_security.client import catalog_credential_properties

        return catalog_credential_properties(self.type, self.uri, self.properties, env)

    def spark_properties(self) -> dict[str, str]:
        """``spark.sql.catalog.<name>.<key>`` settings of a ``SparkCatalog`` for it."""
        if self.type == tablebucket.TYPE:
            return tablebucket.spark_properties(self.warehouse or "", self.properties)
        extra = {"warehouse": self.warehouse} if self.warehouse and not self.builtin else {}
        uri = {"uri": self.uri} if self.uri else {}
        return {**self.properties, **extra, "type": self.type, **uri, **self._credential()}

    def without_secrets(self) -> CatalogSpec:
        """This spec with no secret catalog property (``credential``, ``token``, keys, passwords):
        what ``/v1/cluster`` may serve. Jobs take those from their environment."""
        from broker.external_catalogs.catalog_properties import is_secret

        kept = {k: v for k, v in self.properties.items() if not is_secret(k)}
        return self.model_copy(update={"properties": kept})


class ClusterMember(Contract):
    """A live broker of the cluster (cluster mode): its id, where it listens (listener name ->
    [host, port], and the "admin", "registry" and "catalog" URLs), its rack."""

    node_id: int
    endpoints: dict[str, Any] = Field(default_factory=dict)
    rack: str | None = None


class ClusterInfo(Contract):
    """``GET /v1/cluster``: where the other services are. Never any credentials.
    ``node_id``: the broker that answered; ``brokers``: the live ones (cluster mode; one
    broker lists none)."""

    cluster_id: str
    bootstrap: str
    registry_url: str
    catalog_url: str  # the tables' REST catalog: the built-in one, or catalog.uri
    object_store: str
    object_store_endpoint: str | None = None
    warehouse: str | None = None
    catalog: CatalogSpec | None = None  # None from a broker older than the catalog keys
    node_id: int | None = None  # None from a broker older than clusters
    brokers: list[ClusterMember] = Field(default_factory=list)

    @property
    def tables_catalog(self) -> CatalogSpec:
        return self.catalog or CatalogSpec.rest(self.catalog_url)


class PartitionOffsets(Contract):
    partition: int
    log_start_offset: int
    high_watermark: int
    flushed_offset: int
    last_append_ms: int | None = None
    # the first offset of the earliest open transaction, or the high watermark; None from a
    # broker older than transactions
    last_stable_offset: int | None = None


class TopicOffsets(Contract):
    """``GET /v1/topics/{topic}/offsets``."""

    topic: str = ""
    topic_id: str = ""
    table_topic: bool = False
    partitions: list[PartitionOffsets]


class PartitionPlan(Contract):
    partition: int
    log_start_offset: int
    end_offset: int  # never past the last stable offset: a round commits no open transaction
    flushed: bool
    high_watermark: int
    last_stable_offset: int | None = None


class TopicPlan(Contract):
    """``GET /v1/topics/{topic}/plan``: per partition the end offset and whether the broker flushed that far."""

    topic: str = ""
    until_append_ms: int | None = None
    partitions: list[PartitionPlan]
    # the broker's clock when it answered; before ``until_append_ms`` no partition is
    # reported flushed, as batches may still be appended before that time
    broker_time_ms: int | None = None

    @property
    def early(self) -> bool:
        """Asked for a time the broker's clock has not reached: the end offsets are not final."""
        return (
            self.until_append_ms is not None
            and self.broker_time_ms is not None
            and self.broker_time_ms < self.until_append_ms
        )

    @property
    def flushed(self) -> bool:
        return all(p.flushed for p in self.partitions)

    @property
    def not_flushed(self) -> list[int]:
        return [p.partition for p in self.partitions if not p.flushed]


class ObjectRange(Contract):
    """Object bytes holding whole batches: the first may begin before the asked start."""

    object_key: str
    byte_start: int
    byte_end: int
    first_offset: int
    end_offset: int
    max_append_ms: int


class AbortedTransaction(Contract):
    """A transaction that was aborted: its producer, first offset and marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int


class TopicRanges(Contract):
    """``GET /v1/topics/{topic}/partitions/{partition}/ranges``."""

    topic: str
    partition: int
    start: int
    end: int
    object_store: str
    ranges: list[ObjectRange]
    # aborted transactions with records in [start, end), for a read_committed reader
    aborted_transactions: list[AbortedTransaction] = []


class PartitionPending(Contract):
    partition: int
    start_offset: int
    end_offset: int
    records: int
    bytes: int


class Pending(Contract):
    """``GET /v1/topics/{topic}/pending``: what waits for the table's next commit round."""

    topic: str
    committed_offsets: Offsets
    records: int
    bytes: int
    partitions: list[PartitionPending]


class FlushAnswer(Contract):
    """``POST /v1/flush``."""

    bytes_written: int
    note: str | None = None  # why nothing was written (cluster mode: acks wait for the index)


class RetentionBlocked(Contract):
    """A table topic partition whose retention waits for the table to commit."""

    topic: str
    partition: int
    log_start_offset: int
    wanted_log_start_offset: int  # where retention.ms/bytes would put the log start
    committed_offset: int  # the table's next offset for this partition
    blocked_offsets: int
    blocked_bytes: int  # segment bytes kept only because the table has not committed them
    since_ms: int
    passes: int


class Retention(Contract):
    """``GET /v1/retention``: segment retention since the broker started."""

    passes: int
    chunks_deleted: int
    bytes_deleted: int
    objects_deleted: int
    orphans_deleted: int
    delete_failures: int
    blocked_passes: int  # partition-passes where the table held retention back
    last_pass_ms: int | None = None
    blocked: list[RetentionBlocked]


# ---------------------------------------------------------------- lag


def lag_start(committed: int | None, log_start_offset: int) -> int:
    """Where a table's lag starts in a partition: its committed offset (the log start when it has
    none); never before the log start, since records before it are gone for good."""
    return max(committed if committed is not None else log_start_offset, log_start_offset)


def lag_seconds(oldest_append_ms: Iterable[int | None], now_ms: int) -> float:
    """Seconds of append time since the oldest record not yet in the table was appended (``oldest``:
    per lagging partition; None where unknown), 0 when the table is caught up."""
    known = [ms for ms in oldest_append_ms if ms is not None]
    return max(0.0, (now_ms - min(known)) / 1000) if known else 0.0


class PartitionLag(Contract):
    partition: int
    log_start_offset: int
    end_offset: int  # the broker's high watermark
    committed_offset: int  # the next offset the table would take
    lag_records: int
    oldest_uncommitted_append_ms: int | None

    @classmethod
    def of(
        cls,
        partition: int,
        log_start_offset: int,
        end_offset: int,
        committed: int | None,
        oldest_append_ms: Callable[[int], int | None],
    ) -> PartitionLag:
        """The lag of one partition whose table holds ``committed`` (None: nothing yet);
        ``oldest_append_ms(start)`` is asked only when the partition lags."""
        start = lag_start(committed, log_start_offset)
        behind = max(end_offset - start, 0)
        return cls(
            partition=partition,
            log_start_offset=log_start_offset,
            end_offset=end_offset,
            committed_offset=committed if committed is not None else log_start_offset,
            lag_records=behind,
            oldest_uncommitted_append_ms=oldest_append_ms(start) if behind else None,
        )


class Lag(Contract):
    """How far a table is behind its topic, in records and in seconds of append time (the status
    view, the publish step's asset event and the broker's ``icefall_table_lag_*`` metrics)."""

    records: int
    seconds: float
    measured_at_ms: int
    partitions: list[PartitionLag]

    @classmethod
    def of(cls, partitions: list[PartitionLag], now_ms: int) -> Lag:
        oldest = [p.oldest_uncommitted_append_ms for p in partitions if p.lag_records > 0]
        return cls(
            records=sum(p.lag_records for p in partitions),
            seconds=round(lag_seconds(oldest, now_ms), 3),
            measured_at_ms=now_ms,
            partitions=partitions,
        )


class Freshness(Contract):
    """A table against its topic's freshness promise (``automq.table.topic.freshness.sla.ms``).

    Freshness is how long the oldest record not yet in the table has waited (broker append
    time), 0 when the table holds every record: the table holds everything appended before
    ``now - seconds``. It is ``Lag.seconds`` by definition. Not "now minus the newest committed
    record's append time": on a quiet topic that grows while nothing is missing, and a record
    arriving after an idle hour would breach the promise the moment it is appended.
    """

    seconds: float
    sla_ms: int | None = None
    breached: bool = False

    @classmethod
    def of(cls, lag: Lag, sla_ms: int | None) -> Freshness:
        return cls(
            seconds=lag.seconds,
            sla_ms=sla_ms,
            breached=sla_ms is not None and lag.seconds * 1000 > sla_ms,
        )


# ---------------------------------------------------------------- the round plan (the commit task's XCom plan)


class RoundPlan(Contract):
    """The offsets a commit round is told to commit up to, and where the log stood (plan -> commit)."""

    topic: str
    round_id: str
    until_append_ms: int | None = None
    max_records: int | None = None
    end_offsets: Offsets
    high_watermarks: Offsets = Field(default_factory=dict)
    log_start_offsets: Offsets = Field(default_factory=dict)
    planned_at_ms: int = 0


# ---------------------------------------------------------------- job results (the result JSON)

# step -> seconds it took (int or float kept as the job wrote it)
Seconds = dict[str, int | float]

ROUND_STATUSES = ("committed", "nothing_new")  # and "failed", with a message
# only from ``commit_round.py --without-spark``: the round needs Spark and wrote nothing; the
# commit task runs it again with spark-submit
ROUND_SPARK_NEEDED = "spark_needed"
MAINTENANCE_STATUSES = ("done", "no_table", "failed")
REPROCESS_STATUSES = ("moved", "nothing_to_move", "failed")


class RoundResult(Contract):
    """What ``spark_jobs/commit_round.py --result`` writes; the commit task publishes from it."""

    model_config = ConfigDict(extra="ignore", validate_assignment=False)

    status: str
    topic: str
    namespace: str = ""
    table: str = ""
    round_id: str = ""
    until_append_ms: int | None = None
    snapshot_id: int | None = None
    parent_snapshot_id: int | None = None
    snapshot_timestamp_ms: int | None = None  # the commit's time, as the catalog recorded it
    offsets_before: Offsets = Field(default_factory=dict)
    offsets_after: Offsets = Field(default_factory=dict)
    records: int = 0
    rows: int = 0
    dlq_rows: int = 0
    skipped_records: int = 0
    bytes_read: int = 0
    data_files: int = 0
    attempts: int = 0
    schema_changes: list[str] = Field(default_factory=list)
    # an earlier try of this round id made the commit (spark_jobs/rounds/earlier_try.py); the
    # figures are from its snapshot's summary
    from_earlier_try: bool = False
    executor: str = ""  # "driver" (small round, no SparkContext) or "spark"
    # of ``records``, those the warm driver had written before the round began (its pre-stage,
    # spark_jobs/prestage.py)
    prestaged_records: int = 0
    seconds: Seconds = Field(default_factory=dict)
    # Event time (spark_jobs/rounds/event_time.py): the column (the Kafka record timestamp
    # ``_kafka_metadata.timestamp`` unless the table is partitioned by hour/day of a timestamp
    # column), the range of this round's rows (ms since the epoch), the table's watermark before
    # and after (per Kafka partition in ``watermarks``), and with ``event_time_granularity``
    # (hour/day) the starts of the windows this commit closed and the late ones it wrote into.
    event_time_column: str = ""
    event_time_min_ms: int | None = None
    event_time_max_ms: int | None = None
    event_time_granularity: str | None = None
    watermarks: Offsets = Field(default_factory=dict)
    watermark_before_ms: int | None = None
    watermark_ms: int | None = None
    closed_windows: list[int] = Field(default_factory=list)
    late_windows: list[int] = Field(default_factory=list)
    message: str = ""


class MaintenanceTableResult(Contract):
    """What maintenance did to one table (the DLQ table's figures in a result's ``dlq``)."""

    table: str
    snapshot_id_before: int | None = None
    snapshot_id: int | None = None  # after
    snapshots_before: int = 0
    snapshots_after: int = 0
    data_files_before: int | None = None
    data_files_after: int | None = None
    delete_files_before: int | None = None
    delete_files_after: int | None = None
    actions: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seconds: Seconds = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)


class MaintenanceResult(Contract):
    """What ``spark_jobs/maintenance.py --result`` writes: the table's own figures at the top level
    (what Airflow and the status view read), the DLQ table's under ``dlq``."""

    status: str  # done, no_table, failed
    topic: str
    namespace: str = ""
    table: str = ""
    now_ms: int = 0
    actions: list[str] = Field(default_factory=list)
    dlq: MaintenanceTableResult | None = None
    seconds: Seconds = Field(default_factory=dict)
    message: str = ""
    snapshot_id_before: int | None = None
    snapshot_id: int | None = None
    snapshots_before: int | None = None
    snapshots_after: int | None = None
    data_files_before: int | None = None
    data_files_after: int | None = None
    delete_files_before: int | None = None
    delete_files_after: int | None = None
    settings: dict[str, Any] | None = None
    per_action: dict[str, dict[str, Any]] = Field(default_factory=dict)


class ReprocessResult(Contract):
    """What ``spark_jobs/dlq_reprocess.py --result`` writes; the DLQ DAG's publish step reads it."""

    model_config = ConfigDict(extra="ignore", validate_assignment=False)

    status: str  # "moved", "nothing_to_move", "failed"
    topic: str
    round_id: str = ""
    dlq_rows: int = 0
    moved: int = 0
    still_bad: int = 0
    superseded: int = (
        0  # upsert tables: moved out of the DLQ, but a later record of the id had already won
    )
    # partition -> offsets of the rows this reprocess wrote to the table (not the superseded ones)
    moved_offsets: dict[str, list[int]] = Field(default_factory=dict)
    only_in_dlq: int = (
        0  # DLQ records whose segments retention deleted: decoded from the DLQ's copy
    )
    unavailable: int = (
        0  # upsert tables: such records stay in the DLQ (nothing to compare them with)
    )
    snapshot_id: int | None = None
    dlq_snapshot_id: int | None = None
    schema_changes: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    message: str = ""
