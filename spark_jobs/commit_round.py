"""One commit round: the offsets of a table topic that arrived since the last round -> one Iceberg commit.

Run it with spark-submit (the Iceberg runtime jar on ``--jars``)::

    spark-submit --jars "$(python -c 'from spark_jobs.jars import iceberg_jars; print(",".join(iceberg_jars()))')" \\
        spark_jobs/commit_round.py --topic clicks --until-append-time 1732270000000 --result /tmp/round.json

or as ``python -m spark_jobs.commit_round ...``, which starts its own Spark
(``--master``, default ``local[*]``) with the jar. The broker's admin URL
(``--admin-url``, default ``$ICEFALL_ADMIN_URL`` or http://127.0.0.1:8090) is
all it needs: the broker names its registry, catalog and object store;
object-store credentials come from this process's ``AWS_*`` environment.

The round: plan (start offsets from the table's checkpoint, end offsets from
the broker for the cut), create/evolve the table, read and decode the segment
ranges on the executors and write them to a round branch (with the writer the
table and topic call for, ``round_writers``; any error drops the branch), then
publish with one conditional catalog commit (``round_commit``). A round that
loses a race to another writer starts over from the new checkpoint, so a round
run twice, two rounds at once, or a round killed and re-run commit each record
once. A round re-run under the id of one that already committed (its task died after
the commit, and Airflow retries it) reports that commit again, ``from_earlier_try``
(``rounds.earlier_try``), so its asset event is not lost.
On a format v3 table every snapshot is written by Spark (pyiceberg 0.12 writes
no v3 manifests): append rounds stage their rows and Spark appends them, and
the base and empty snapshots are empty Spark appends; upsert rounds' MERGE
writes deletion vectors there instead of position deletes.
The result JSON says what happened; the exit code is 0 for ``committed`` and
``nothing_new``, 1 for a failed round (the message is on stderr and in the JSON).

A round whose plan is empty, or whose one task runs in the driver (``--in-driver-max-bytes``)
and writes with pyiceberg, never starts Spark: run as ``python -m`` it needs no JVM at all.
``--without-spark`` makes that a promise: a round that would need Spark (above that size, an
upsert or JSON table, format v3) decides so from its plan before it writes any rows (a DLQ
commit a crash left half done is finished first, as in every round) and ends
``spark_needed`` (exit 0), and the caller runs it with spark-submit. The commit task does
that when no warm driver serves it (``icefall_airflow.commit_operator``), so an idle topic's
round, or a small one, costs a Python process instead of a JVM's start.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker import checkpoint, log_setup
from broker.catalog.glue_check import glue_problem
from broker.config import ObjectStoreConfig, aws_io_credentials, object_store_from_env
from broker.contracts import ROUND_SPARK_NEEDED, CatalogSpec, RoundResult, TopicPlan
from broker.env_values import ROUND_IN_DRIVER_MAX_BYTES
from spark_jobs import job_args, job_output
from spark_jobs.broker_client import AdminClient, RegistryClient, TableTopic
from spark_jobs.decode import json_values
from spark_jobs.decode.rows import INCOMPATIBLE_SCHEMA, TABLE_SCHEMA_BEHIND, DecodeError
from spark_jobs.decode.segments import cached_store, read_partition
from spark_jobs.rounds import (
    dlq,
    dlq_catchup,
    earlier_try,
    event_time,
    partitioning,
    table_setup,
    upsert,
)
from spark_jobs.rounds import plan as round_plan
from spark_jobs.rounds import tasks as round_tasks
from spark_jobs.rounds import writers as round_writers
from spark_jobs.rounds.publish import (
    BranchHead,
    LostRace,
    UnexpectedBranchState,
    branch_name,
    create_branch,
    drop_branch,
    main_snapshot_id,
    publish,
    round_snapshot,
    write_to_branch,
)
from spark_jobs.rounds.streamed_files import streams
from spark_jobs.rounds.tasks import TaskReport, TaskSpec, run_in_driver, run_tasks

if TYPE_CHECKING:
    from spark_jobs.prestage import StagedRows

log = logging.getLogger("icefall.commit_round")
SPARK_CATALOG = "icefall_round"
MAX_ATTEMPTS = 5
ERRORS_SHOWN = 5
KILL_POINT_ENV = "ICEFALL_ROUND_KILL_AT"  # tests: exit abruptly at a named point (see _kill_point)
DRIVER_MAX_BYTES_ENV = job_args.DRIVER_MAX_BYTES_ENV
# A round of at most this many segment bytes runs as one task in the driver's Python process.
# Measured (bench/BENCHMARKS.md): the same task function ran ~140 MB/s on one core in the
# driver, while Spark tasks (``local[2]``) reached that only on 1 GiB rounds; a 70 MB round cost
# 3.5 CPU-s per 900 k records in the driver against 13 as Spark tasks (and one file, not 9);
# still ~1.5 x after the tasks' fixed costs were cut (``worker_daemon``, ``plan.task_groups``).
# So on a machine of a few cores Spark pays off only above ~1 GiB; memory stays bounded either
# way (``rounds.tasks``: streamed, or slices for a partitioned table). With a Spark cluster of
# many executors a lower limit spreads large rounds sooner.
DEFAULT_DRIVER_MAX_BYTES = ROUND_IN_DRIVER_MAX_BYTES.default


class RoundFailed(RuntimeError):
    """The round cannot commit; the message says why and which records."""


def _kill_point(name: str) -> None:
    """Exit at once (no cleanup, like kill -9) when the test harness names this point."""
    if os.environ.get(KILL_POINT_ENV) == name:
        os._exit(137)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # no abbreviations: the warm driver refuses some flags by name (``--mast`` is no ``--master``)
    parser = argparse.ArgumentParser(
        prog="commit_round", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("--topic", required=True)
    until = parser.add_mutually_exclusive_group()
    until.add_argument(
        "--until-append-time",
        type=int,
        metavar="MS",
        help="commit the offsets the broker appended before this time (ms since the epoch)",
    )
    until.add_argument(
        "--until-offsets", metavar="JSON", help='commit up to these offsets, e.g. {"0": 1200}'
    )
    until.add_argument(
        "--until-now", action="store_true", help="commit everything appended so far (the default)"
    )
    parser.add_argument("--result", type=Path, help="write the result JSON here")
    parser.add_argument(
        "--round-id", default=None, help="recorded in the snapshot summary (default: a new uuid)"
    )
    parser.add_argument(
        "--max-records", type=int, default=None, help="at most this many offsets per partition"
    )
    job_args.add_common_flags(parser)
    parser.add_argument(
        "--flush-deadline-s",
        type=float,
        default=60.0,
        help="how long to wait for the broker to flush the planned offsets to segment objects",
    )
    job_args.add_in_driver_max_bytes(
        parser,
        "a round reading at most this many segment bytes runs its one task in the driver "
        f"without starting Spark (default 1 GiB or ${DRIVER_MAX_BYTES_ENV}; 0: always Spark)",
    )
    parser.add_argument(
        "--without-spark",
        action="store_true",
        help="never start Spark: a round that needs it (above --in-driver-max-bytes, upsert, JSON, "
        f"format v3) writes none of its rows and reports {ROUND_SPARK_NEEDED!r}, to be run again "
        "with Spark",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.until_offsets is not None:
        try:
            args.until_offsets = {int(p): int(o) for p, o in json.loads(args.until_offsets).items()}
        except (ValueError, AttributeError, TypeError) as exc:
            parser.error(
                f'--until-offsets must be a JSON object of partition -> offset, e.g. {{"0": 1200}}: {exc}'
            )
    if args.max_records is not None and args.max_records < 1:
        parser.error("--max-records must be at least 1")
    if args.in_driver_max_bytes < 0:
        parser.error("--in-driver-max-bytes must be 0 or more")
    return args


# ---------------------------------------------------------------- Spark


REDACTION_REGEX = "(?i)secret|password|token|access[.]?key|credential"


def spark_session(app_name: str, master: str | None, conf: dict[str, str] | None = None) -> Any:
    """Under spark-submit the master and jars come from spark-submit; started
    from Python, we launch local Spark here with the Iceberg jar (and ``conf``, e.g. the driver's
    JVM options: a truststore for a catalog on TLS)."""
    from pyspark.sql import SparkSession

    from spark_jobs.jars import iceberg_jars

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if not _under_spark_submit():
        builder = (
            builder.master(master or "local[*]")
            .config("spark.jars", ",".join(iceberg_jars()))
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            # no console progress bar: its thread redraws every 200 ms, noise in task logs and CPU
            # in the idle warm driver (0.66 -> 0.40 CPU-s a minute without it, one sample each)
            .config("spark.ui.showConsoleProgress", "false")
        )
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
    elif master:
        builder = builder.master(master)
    session = (
        builder.config(
            "spark.sql.extensions",
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .config("spark.sql.session.timeZone", "UTC")
        # Spark's default redaction, plus the catalog's OAuth2 ``credential`` property
        .config("spark.redaction.regex", REDACTION_REGEX)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    return session


def use_catalog(spark: Any, catalog: str | CatalogSpec) -> str:
    """A Spark catalog name for the tables' catalog (a REST catalog URL, or the broker's spec of
    it), configured at run time (Spark loads catalogs by name on first use), so one session can
    serve rounds of several brokers (tests) and a user's own ``spark.sql.catalog.*`` settings are
    left alone."""
    spec = CatalogSpec.rest(catalog) if isinstance(catalog, str) else catalog
    name = f"{SPARK_CATALOG}_{hashlib.sha1(spec.model_dump_json().encode()).hexdigest()[:8]}"
    prefix = f"spark.sql.catalog.{name}"
    settings = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.cache-enabled": "false",
        **{f"{prefix}.{key}": value for key, value in spec.spark_properties().items()},
    }
    # S3FileIO takes the endpoint and region from the catalog's config; the job's own AWS
    # credentials go with the catalog (the JVM may have started before they were in the
    # environment, and executors get them with the table's FileIO).
    settings.update({f"{prefix}.{key}": value for key, value in aws_io_credentials().items()})
    for key, value in settings.items():
        spark.conf.set(key, value)
    if spec.type == "glue":
        _driver_aws_credentials(spark)
    return name


def _driver_aws_credentials(spark: Any) -> None:
    """Iceberg's Glue client takes no credentials from catalog properties, only the AWS SDK's
    chain, whose first link is the JVM's system properties: this process's ``AWS_*``
    credentials go there (the JVM may have started before they were in the environment). Only
    the driver talks to Glue."""
    system = spark.sparkContext._jvm.java.lang.System
    for prop, env in (
        ("aws.accessKeyId", "AWS_ACCESS_KEY_ID"),
        ("aws.secretAccessKey", "AWS_SECRET_ACCESS_KEY"),
        ("aws.sessionToken", "AWS_SESSION_TOKEN"),
    ):
        if os.environ.get(env):
            system.setProperty(prop, os.environ[env])


def _under_spark_submit() -> bool:
    """spark-submit starts the JVM before our code runs (PySpark then finds a gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


# ---------------------------------------------------------------- the round


class CommitRound:
    def __init__(
        self, args: argparse.Namespace, spark: Any = None, staged: StagedRows | None = None
    ) -> None:
        self.args = args
        # the rows a pre-stage wrote for this round (the warm driver's ``spark_jobs.prestage``):
        # used if the table and offsets still match (``_from_prestage``), else dropped
        self.staged = staged
        self.prestaged_records = 0
        self.admin = AdminClient(args.admin_url)
        cluster = self.admin.cluster()
        self.topic: TableTopic = self.admin.table_topic(args.topic)
        self.registry = RegistryClient(cluster.registry_url)
        self.catalog_spec = table_setup.job_catalog(args.catalog_url, cluster)
        self.catalog_url = self.catalog_spec.uri
        if self.catalog_spec.type == "glue" and (problem := glue_problem(self.catalog_spec)):
            raise RoundFailed(problem[1])
        self.catalog = table_setup.catalog_for(self.catalog_spec)
        # Glue, S3 Tables, some REST catalogs: the table, then its DLQ (``dlq_catchup``)
        self.multi_table = dlq_catchup.multi_table_commits(self.catalog_spec)
        self.store: ObjectStoreConfig = object_store_from_env(
            cluster.object_store, cluster.object_store_endpoint
        )
        self.options = table_setup.TableOptions.of(self.topic)
        if self.options.format_version >= 3 and self.catalog_spec.type not in ("rest", "nessie"):
            raise RoundFailed(
                f"{self.topic.topic}: automq.table.topic.format.version=3 needs a REST or Nessie catalog "
                f"(automq.table.topic.catalog.type={self.catalog_spec.type} has its clients write "
                "the metadata files, and pyiceberg 0.12 cannot write v3 ones); use 2"
            )
        self.upsert = upsert.UpsertOptions.of(self.topic)
        self.json = self.options.value_type == "json"
        self.staging = (
            self.upsert is not None or self.json
        )  # tasks stage rows for the driver's Spark write
        self.round_id = args.round_id or uuid.uuid4().hex
        self.branch = branch_name(self.round_id)
        self._spark: Any = spark
        self._own_spark = spark is None
        self.seconds: dict[str, float] = {}
        self._event_time_spec = event_time.EventTimeSpec()  # set for the tasks (_run_tasks)
        self._planned_metadata: Any = None  # the table's metadata as the plan read it

    def spark(self) -> Any:
        if self._spark is None and self.args.without_spark:
            # _spark_needed decides before anything is written; should a step it does not know
            # ask for Spark anyway, the round's branch is dropped on the way out (round_branch)
            raise _SparkNeeded("a step that needs Spark")
        if self._spark is None:
            started = time.monotonic()
            self._spark = spark_session(f"icefall-commit-{self.topic.topic}", self.args.master)
            self.seconds["spark_start"] = round(time.monotonic() - started, 3)
        return self._spark

    def result(self, status: str, **values: Any) -> RoundResult:
        return RoundResult(
            status=status,
            topic=self.topic.topic,
            namespace=self.topic.namespace,
            table=self.topic.table,
            round_id=self.round_id,
            until_append_ms=self.args.until_append_time,
            **values,
        )

    def run(self) -> RoundResult:
        started = time.monotonic()
        if self.args.until_offsets is not None:  # the commit task's plan: it flushed them
            broker_plan = self.admin.covering_plan(
                self.topic.topic, self.args.until_offsets, self.args.flush_deadline_s
            )
        else:
            broker_plan = self.admin.flushed_plan(
                self.topic.topic, self.args.until_append_time, self.args.flush_deadline_s
            )
        self.seconds["plan"] = round(time.monotonic() - started, 3)
        if not self.multi_table:
            self._catch_up_dlq()
        extra_ids: set[int] = set()
        changes: list[str] = []
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                result = self._attempt(broker_plan, extra_ids, changes)
            except _SparkNeeded as exc:
                return self.result(
                    ROUND_SPARK_NEEDED,
                    seconds=self.seconds,
                    message=f"nothing committed: the round needs Spark ({exc})",
                )
            except LostRace as exc:
                log.warning("round %s lost a race (attempt %d): %s", self.round_id, attempt, exc)
            except _Evolve as again:
                extra_ids |= again.schema_ids
            else:
                result.attempts = attempt
                result.schema_changes = changes
                return result
        raise RoundFailed(f"gave up after {MAX_ATTEMPTS} attempts: other writers kept moving main")

    def _first_schema_id(self, ranges: list[Any]) -> Callable[[], int | None]:
        def first() -> int | None:
            from spark_jobs.decode.avro_decode import wire_schema_id

            for chunk in read_partition(cached_store(self.store), ranges[:1], max_records=1):
                return wire_schema_id(chunk.values[0]) if len(chunk) else None
            return None

        return first

    def _attempt(
        self, broker_plan: TopicPlan, extra_ids: set[int], changes: list[str]
    ) -> RoundResult:
        """plan -> prepare the table -> on the round branch: read and decode (the tasks), write
        (``round_writers``), check -> publish. Any error on the way drops the branch
        (``round_branch``); a kill leaves it for a later round."""
        t0 = time.monotonic()
        self.prestaged_records = 0  # an attempt after a lost race reads everything itself
        plan, found = self._plan(broker_plan)
        if plan.empty:
            earlier = self._earlier_try()
            if earlier is not None:
                return earlier
            return self.result(
                "nothing_new",
                snapshot_id=found.snapshot_id,
                offsets_before=plan.offsets_before,
                offsets_after=plan.offsets_after,
                seconds=self.seconds,
                message="no new offsets since the last committed round",
            )
        plan.ranges = round_plan.fetch_ranges(self.admin, self.topic.topic, plan.windows)
        if self.args.without_spark and (why := self._spark_needed(plan)):
            return self.result(
                ROUND_SPARK_NEEDED,
                offsets_before=plan.offsets_before,
                offsets_after=plan.offsets_after,
                records=sum(w.records for w in plan.windows),
                seconds=self.seconds,
                message=f"nothing committed: the round needs Spark ({why})",
            )
        table, schemas, parent = self._prepare(plan, found, extra_ids, changes)
        self.seconds["prepare"] = round(time.monotonic() - t0, 3)
        _kill_point("before_write")

        create_branch(self.catalog, table, self.branch, parent)
        properties = self._properties(plan)
        with round_writers.round_branch(self.catalog, table, self.branch) as cleanup:
            output, executor = self._run_tasks(table, plan, schemas)
            rows, table = self._round_rows(table, output, cleanup, changes)
            skipped_records = self._check_errors(output.report)
            if skipped_records:  # what ``dlq_catchup`` looks for after a crash between two commits
                properties[dlq_catchup.DLQ_ROWS] = str(len(skipped_records))
            times = self._event_times(table, found, broker_plan, plan, output.report)
            properties.update(times.summary(self._event_time_spec))
            t1 = time.monotonic()
            self._write(rows, table, properties)
            cleanup.remove_staged()
            table = table.refresh()
            _kill_point("after_write")
            snapshot = self._verify(table, parent, properties)
            heads = [BranchHead(table, self.branch, parent, snapshot.snapshot_id)]
            if skipped_records:
                heads.append(self._dlq_head(skipped_records, properties))
        # outside round_branch: a publish whose outcome is unknown must leave the branches as they are
        _kill_point("before_publish")
        self._publish(heads)
        _kill_point("after_publish")
        self.seconds["commit"] = round(time.monotonic() - t1, 3)
        return self._committed(
            plan, parent, snapshot, output.report, skipped_records, executor, times
        )

    def _plan(self, broker_plan: TopicPlan) -> tuple[round_plan.RoundPlan, checkpoint.Checkpoint]:
        """The round's offsets: from the table's checkpoint (none yet: from the start) to the broker's cut."""
        table = self._table_or_none()
        self._planned_metadata = table.metadata if table is not None else None
        found = (
            checkpoint.read_checkpoint(table.metadata)
            if table is not None
            else checkpoint.NO_CHECKPOINT
        )
        windows = round_plan.windows(
            broker_plan,
            found,
            self.topic.topic_id,
            until_offsets=self.args.until_offsets,
            max_records=self.args.max_records,
        )
        skipped = sum(w.skipped for w in windows)
        if skipped:
            log.warning(
                "%d records of %s were deleted by retention before any round committed them",
                skipped,
                self.topic.topic,
            )
        return round_plan.RoundPlan(windows, self.args.until_append_time), found

    def _spark_needed(self, plan: round_plan.RoundPlan) -> str | None:
        """Why this round cannot run without Spark, or None: what its ``_run_tasks``,
        ``_round_rows`` and ``_write`` would decide, known from the plan and the table's metadata
        before anything is written."""
        metadata = self._planned_metadata
        if self.upsert is not None:
            return "an upsert table's MERGE"
        if self.json:
            return "JSON values parsed into columns"
        if self.options.format_version >= 3 or (
            metadata is not None and metadata.format_version >= 3
        ):
            return "a format v3 table"
        if plan.bytes > self.args.in_driver_max_bytes:
            return (
                f"{plan.bytes} bytes, above --in-driver-max-bytes {self.args.in_driver_max_bytes}"
            )
        return None

    def _earlier_try(self) -> RoundResult | None:
        """This round as an earlier try of it committed it (``earlier_try``), when its plan is
        empty because that commit is in the table; else None."""
        metadata = self._planned_metadata
        if metadata is None or not self.args.round_id:
            return None
        found = checkpoint.find_round(metadata, self.round_id)
        if found is None or not found.checkpoint.belongs_to(self.topic.topic_id):
            return None
        values = earlier_try.committed_values(metadata, found, self.topic.topic_id)
        log.info("round %s: %s", self.round_id, values["message"])
        return self.result("committed", seconds=self.seconds, **values)

    def _prepare(
        self,
        plan: round_plan.RoundPlan,
        found: checkpoint.Checkpoint,
        extra_ids: set[int],
        changes: list[str],
    ) -> tuple[Any, list[tuple[int, str]], int]:
        """The table created or evolved for the round's records, with a snapshot on ``main`` (the
        planned parent, returned with the table and the value schemas); raises ``LostRace`` when
        another round committed since the plan."""
        table = table_setup.load_or_create(
            self.catalog,
            self.topic,
            self.registry,
            self.options,
            self._first_schema_id(plan.ranges),
        )
        schemas = table_setup.value_schemas(self.registry, self.topic.topic, extra_ids)
        evolved = table_setup.evolve(table, schemas, self.options)
        changes.extend(evolved.applied)
        table, spec_changes = partitioning.evolve(table.refresh(), self.topic.settings.partition_by)
        changes.extend(spec_changes)
        if self.upsert is not None:
            if (
                not self.json
            ):  # json: the id columns exist once the values' columns are inferred (SparkMerge)
                upsert.check_columns(table.schema(), self.upsert)
            table = upsert.ensure_merge_on_read(table)
        # pyiceberg 0.12 writes no v3 manifests: on a v3 table every snapshot is Spark's (round_writers)
        table = (
            self._spark_base_snapshot(table)
            if _v3(table)
            else table_setup.ensure_base_snapshot(table)
        )
        parent = main_snapshot_id(table)
        # Also when the plan found no table: a round that created it and committed in between leaves main
        # on its snapshot, and this round would write the same offsets again on top of it.
        if checkpoint.read_checkpoint(table.metadata).offsets != found.offsets:
            raise LostRace("another round committed while this one planned")
        assert parent is not None  # ensure_base_snapshot
        return table, schemas, parent

    def _properties(self, plan: round_plan.RoundPlan) -> dict[str, str]:
        """The round snapshot's summary properties: the checkpoint ``publish`` makes visible."""
        return {
            checkpoint.OFFSETS: checkpoint.encode_offsets(plan.offsets_after),
            checkpoint.ROUND_ID: self.round_id,
            checkpoint.TOPIC: self.topic.topic,
            checkpoint.TOPIC_ID: self.topic.topic_id,
        }

    def _event_times(
        self,
        table: Any,
        found: checkpoint.Checkpoint,
        broker_plan: TopicPlan,
        plan: round_plan.RoundPlan,
        report: TaskReport,
    ) -> event_time.Advance:
        """The event-time state after this round, from its checkpoint snapshot's (``event_time``):
        a partition the round commits up to the broker's high watermark is idle."""
        parent = (  # a topic deleted and created again starts afresh, as its offsets do
            table.metadata.snapshot_by_id(found.snapshot_id)
            if found.snapshot_id is not None and found.belongs_to(self.topic.topic_id)
            else None
        )
        state = event_time.State.from_summary(
            checkpoint.summary_properties(parent) if parent is not None else {}
        )
        after = plan.offsets_after
        idle = {
            p.partition
            for p in broker_plan.partitions
            if after.get(p.partition, p.log_start_offset) >= p.high_watermark
        }
        partitions = [p.partition for p in broker_plan.partitions]
        return event_time.advance(
            state, self._event_time_spec, report.event_times, partitions, idle
        )

    def _staging(self, table: Any) -> bool:
        """Whether the tasks stage their rows for a Spark write by the driver (not the table's own files)."""
        return self.staging or _v3(table)

    def task_spec(
        self, table: Any, schemas: list[tuple[int, str]], plan: round_plan.RoundPlan | None
    ) -> TaskSpec:
        """What the round's tasks get (``rounds.tasks``): the table's metadata (for a table whose
        rows are staged, the staging table's, ``plan`` then needed), schemas and settings."""
        if self._staging(table):
            assert plan is not None
            metadata_json = upsert.staging_metadata_json(
                table,
                self.round_id,
                self._envelope(schemas, plan),
                text_value=self.json,
                relax=self.staging,
            )
            from pyiceberg.table.metadata import TableMetadataUtil

            schema = TableMetadataUtil.parse_raw(metadata_json).schema()
        else:
            metadata_json = table.metadata.model_dump_json()
            # the table's own: parsing the JSON just made was 3.6 % of the warm driver's samples
            schema = table.metadata.schema()
        self._event_time_spec = event_time.EventTimeSpec.of(
            self.topic.settings.partition_by, schema
        )
        return TaskSpec(
            self.store,
            metadata_json,
            round_tasks.task_io_properties(table),
            self.options.key_type,
            "string" if self.json else self.options.value_type,
            self.registry.url,
            tuple(sorted(self.registry.known().items())),
            registry_user_info=self.registry.user_info,
            event_time=self._event_time_spec,
        )

    def prestage_start(self) -> tuple[TaskSpec, checkpoint.Checkpoint] | str:
        """For a pre-stage of this topic's next round (``spark_jobs.prestage``): the spec that
        round's tasks will get if the table does not change before it, and the checkpoint it
        will start from; or why its rows cannot be written ahead. Changes nothing."""
        if self.staging:
            return "an upsert or JSON table's rows are staged for Spark's write"
        table = self._table_or_none()
        if table is None:
            return "the table does not exist yet"
        if _v3(table) or not streams(table.metadata):
            return "only an unpartitioned Parquet table of format v1 or v2 is written ahead"
        schemas = table_setup.value_schemas(self.registry, self.topic.topic, set())
        return self.task_spec(table, schemas, None), checkpoint.read_checkpoint(table.metadata)

    def _run_tasks(
        self, table: Any, plan: round_plan.RoundPlan, schemas: list[tuple[int, str]]
    ) -> tuple[round_tasks.TaskOutput, str]:
        """The round's ranges read and decoded into data files (staged, or the table's), in the
        driver for a small round (what a pre-stage wrote of them, and the rest), else by Spark
        tasks; the output and where it ran."""
        spec = self.task_spec(table, schemas, plan)
        executor = "driver" if plan.bytes <= self.args.in_driver_max_bytes else "spark"
        if executor == "spark" and self.staged is not None:
            self.staged.drop()  # Spark's tasks write their own files
            self.staged = None
        spark = self.spark() if executor == "spark" else None  # its start-up is timed on its own
        started = time.monotonic()
        output = (
            (self._from_prestage(spec, plan) or run_in_driver(spec, plan.ranges))
            if spark is None
            else run_tasks(
                spark,
                spec,
                round_plan.task_groups(plan.ranges, spark.sparkContext.defaultParallelism),
            )
        )
        self.seconds["read_write"] = round(time.monotonic() - started, 3)
        return output, executor

    def _from_prestage(
        self, spec: TaskSpec, plan: round_plan.RoundPlan
    ) -> round_tasks.TaskOutput | None:
        """The round's data files from the rows a pre-stage wrote and the rest of its ranges,
        when the pre-stage wrote for the same spec and a start of each partition's window;
        else None (its files deleted). Used once: a round that starts over reads everything."""
        staged, self.staged = self.staged, None
        if staged is None:
            return None
        why = staged.mismatch(spec, plan.windows)
        if why is not None:
            log.info("round %s: not using the rows written ahead: %s", self.round_id, why)
            staged.drop()
            return None
        try:
            rest = round_plan.fetch_ranges(self.admin, self.topic.topic, staged.rest(plan.windows))
            output = staged.finish(rest)
        except Exception as exc:  # noqa: BLE001 -- e.g. its FileIO's credentials expired since
            log.warning(
                "round %s: the file written ahead could not be finished (%s); reading it all",
                self.round_id,
                exc,
            )
            staged.drop()
            return None
        self.prestaged_records = staged.records
        return output

    def _round_rows(
        self,
        table: Any,
        output: round_tasks.TaskOutput,
        cleanup: round_writers.BranchCleanup,
        changes: list[str],
    ) -> tuple[round_writers.RoundRows, Any]:
        """What the tasks wrote (staged files go to ``cleanup``), and for a JSON round its values
        parsed into the table's columns (the table evolved for them, refreshed; the values that do
        not parse join the errors)."""
        staged = [f.file_path for f in output.data_files] if self._staging(table) else []
        cleanup.staged.extend(staged)
        if not (self.json and staged):
            return round_writers.RoundRows(output.data_files, staged), table
        spark = self.spark()
        parsed = json_values.parse(
            spark,
            round_tasks.read_staged(spark, table, staged),
            table,
            self._spark_table(spark),
            debezium=self.upsert is not None and self.upsert.debezium,
        )
        changes.extend(parsed.schema_changes)
        output.report.errors.extend(parsed.errors)
        output.report.rows -= len(parsed.errors)
        return round_writers.RoundRows(output.data_files, staged, parsed.rows), table.refresh()

    def _write(self, rows: round_writers.RoundRows, table: Any, properties: dict[str, str]) -> None:
        """The round's rows as one snapshot on its branch, by the writer its facts call for."""
        target = round_writers.SparkTarget(
            self.spark, lambda spark: self._spark_table(spark, self.branch)
        )
        writer = round_writers.round_writer(
            rows,
            self.branch,
            target,
            self.round_id,
            options=self.upsert,
            json=self.json,
            v3=_v3(table),
        )
        try:
            writer.write(table, properties)
        except (upsert.BadUpsertRecords, upsert.UpsertConfigError) as exc:
            raise RoundFailed(f"{self.topic.topic}: {exc}") from exc

    def _verify(self, table: Any, parent: int, properties: dict[str, str]) -> Any:
        """The round's snapshot: exactly one on the planned parent, carrying the round's offsets."""
        try:
            snapshot_id = round_snapshot(table, self.branch, parent)
        except UnexpectedBranchState as exc:
            raise LostRace(str(exc)) from exc
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
        assert snapshot is not None
        if (
            checkpoint.summary_properties(snapshot).get(checkpoint.OFFSETS)
            != properties[checkpoint.OFFSETS]
        ):
            # a Spark write whose commit did not take the properties (CommitMetadata is per JVM thread):
            # publishing it would leave the checkpoint behind and the next round would write the records again
            raise RoundFailed(
                f"the round's snapshot {snapshot_id} does not carry its offsets; nothing committed"
            )
        return snapshot

    def _publish(self, heads: list[BranchHead]) -> None:
        """``publish``; a lost race drops every table's round branch (refused: nothing changed).
        Without multi-table commits: the table (the checkpoint), then the DLQ (``dlq_catchup``)."""
        one_commit = self.multi_table or len(heads) == 1
        try:
            publish(self.catalog, heads if one_commit else heads[:1], self.catalog_url)
        except LostRace:
            for head in heads:
                drop_branch(self.catalog, head.table.refresh(), self.branch)
            raise
        if not one_commit:
            _kill_point("between_commits")
            self._catch_up_dlq(heads[0].table.refresh())

    def _table_or_none(self) -> Any:
        """The topic's table, None when it does not exist yet: one catalog request (a load that
        may find nothing), where ``table_exists`` then ``load_table`` made two on every round."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.topic.identifier)
        except NoSuchTableError:
            return None

    def _catch_up_dlq(self, table: Any = None) -> None:
        """The DLQ rows of the table's last round committed to the DLQ if they are not yet there;
        at the round's start (``table`` None) a DLQ reprocess a crash cut in two is finished too."""
        identifier = (self.topic.namespace, dlq.dlq_name(self.topic.table))
        try:
            if table is None:
                if (table := self._table_or_none()) is None:
                    return
                dlq_catchup.finish_reprocesses(self.catalog, table, identifier)
            dlq_catchup.catch_up(self.catalog, table, identifier)
        except (LostRace, dlq_catchup.DlqBehind, dlq_catchup.ReprocessUndecided) as exc:
            raise RoundFailed(
                f"{'.'.join(identifier)} is behind {'.'.join(self.topic.identifier)}: {exc}"
            ) from exc

    def _committed(
        self,
        plan: round_plan.RoundPlan,
        parent: int,
        snapshot: Any,
        report: TaskReport,
        skipped_records: list[DecodeError],
        executor: str,
        times: event_time.Advance,
    ) -> RoundResult:
        spec = self._event_time_spec
        summary = checkpoint.summary_properties(snapshot)
        dlq_note = (
            f", {len(skipped_records)} records to {dlq.dlq_name(self.topic.table)}"
            if skipped_records
            else ""
        )
        if self.upsert is not None:
            dlq_note = (
                f" (merged on {', '.join(self.upsert.id_columns)}: "
                f"{summary.get('added-records', '0')} rows written, "
                f"{summary.get('added-position-deletes', '0')} rows replaced or deleted)" + dlq_note
            )
        return self.result(
            "committed",
            snapshot_id=snapshot.snapshot_id,
            parent_snapshot_id=parent,
            snapshot_timestamp_ms=snapshot.timestamp_ms,
            offsets_before=plan.offsets_before,
            offsets_after=plan.offsets_after,
            records=sum(w.records for w in plan.windows),
            rows=report.rows,
            dlq_rows=len(skipped_records),
            skipped_records=sum(w.skipped for w in plan.windows),
            bytes_read=report.bytes_read,
            data_files=int(summary.get("added-data-files", 0)),
            executor=executor,
            prestaged_records=self.prestaged_records,
            seconds=self.seconds,
            message=f"committed {report.rows} rows{dlq_note}",
            event_time_column=spec.column,
            event_time_min_ms=report.event_times.min_ms,
            event_time_max_ms=report.event_times.max_ms,
            event_time_granularity=spec.granularity,
            watermarks=times.after.watermarks,
            watermark_before_ms=times.before.watermark,
            watermark_ms=times.after.watermark,
            closed_windows=times.closed,
            late_windows=times.late,
        )

    def _envelope(self, schemas: list[tuple[int, str]], plan: round_plan.RoundPlan) -> str | None:
        """For ``flatten_debezium``: the Debezium envelope schema the staged rows keep whole (the
        value subject's latest, else the round's first record's)."""
        if self.upsert is None or not self.upsert.debezium or self.json:
            return None
        if schemas:
            return schemas[-1][1]
        first = self._first_schema_id(plan.ranges)()
        if first is None:
            raise RoundFailed(
                f"{self.topic.topic}: flatten_debezium needs the envelope's Avro schema in the registry"
            )
        return self.registry.avro_schema(first)

    def _spark_table(self, spark: Any, branch: str | None = None) -> str:
        namespace, name = self.topic.identifier
        suffix = f".`branch_{branch}`" if branch else ""
        return f"{use_catalog(spark, self.catalog_spec)}.`{namespace}`.`{name}`{suffix}"

    def _spark_base_snapshot(self, table: Any) -> Any:
        """``table_setup.ensure_base_snapshot`` for a v3 table, through Spark. Unlike pyiceberg's it
        cannot insist that ``main`` is still missing: a round racing this one sees ``main`` move
        and starts over (``LostRace``), which costs time, not correctness."""
        if table.metadata.refs.get("main") is not None:
            return table
        main = round_writers.SparkTarget(self.spark, self._spark_table)
        round_writers.SparkEmpty(main).write(
            table, {table_setup.BASE_PROPERTY: table_setup.BASE_NOTE}
        )
        return table.refresh()

    def _dlq_head(self, errors: list[DecodeError], properties: dict[str, str]) -> BranchHead:
        """The DLQ rows on the DLQ table's own round branch, published with the round's rows."""
        table = table_setup.ensure_base_snapshot(
            dlq.load_or_create(self.catalog, (self.topic.namespace, dlq.dlq_name(self.topic.table)))
        )
        parent = main_snapshot_id(table)
        assert parent is not None
        create_branch(self.catalog, table, self.branch, parent)
        rows = dlq.to_arrow(errors, self.topic.topic, self.round_id, table.schema())
        table = write_to_branch(
            table.refresh(),
            lambda target: target.append(
                rows,
                snapshot_properties={
                    checkpoint.ROUND_ID: self.round_id,
                    checkpoint.OFFSETS: properties[checkpoint.OFFSETS],
                },
                branch=self.branch,
            ),
        )
        return BranchHead(
            table,
            self.branch,
            parent,
            round_snapshot(table, self.branch, parent),
            tag_checkpoint=False,
        )

    def _check_errors(self, report: TaskReport) -> list[DecodeError]:
        """The records to send to the DLQ; raises when the tolerance does not allow skipping them all
        (``round_branch`` drops the branch)."""
        errors = report.errors
        if not errors:
            return []
        behind = {
            int(m.group(1))
            for e in errors
            if e.error_class == TABLE_SCHEMA_BEHIND
            and (m := re.match(r"schema id (\d+)", e.message))
        }
        if behind:
            raise _Evolve(behind)
        tolerance = self.topic.settings.errors_tolerance
        sorted_out = dlq.triage(errors, tolerance)
        if not sorted_out.fatal and not report.errors_dropped:
            return sorted_out.skipped
        if report.errors_dropped:
            raise RoundFailed(
                f"more than {len(errors)} bad records in one round of {self.topic.topic}; "
                "nothing committed (run smaller rounds with --max-records)"
            )
        fatal = sorted_out.fatal
        shown = "; ".join(
            f"partition {e.partition} offset {e.offset}: {e.error_class}: {e.message}"
            for e in fatal[:ERRORS_SHOWN]
        )
        kind = "schema" if any(e.error_class == INCOMPATIBLE_SCHEMA for e in fatal) else "record"
        raise RoundFailed(
            f"{len(fatal)} records of {self.topic.topic} cannot be written ({kind} errors; "
            f"errors.tolerance={tolerance}), nothing committed: {shown}"
        )


def _v3(table: Any) -> bool:
    """pyiceberg 0.12 writes no v3 manifests: on a format v3 table every snapshot is Spark's."""
    return bool(table.metadata.format_version >= 3)


class _SparkNeeded(Exception):
    """A ``--without-spark`` round reached a step that needs Spark (the message says which)."""


class _Evolve(Exception):
    def __init__(self, schema_ids: set[int]) -> None:
        super().__init__(
            f"records use schema ids {sorted(schema_ids)} the table was not evolved for"
        )
        self.schema_ids = schema_ids


def _message(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, RoundFailed) else job_output.error_message(exc)


def run(
    argv: list[str] | None = None, spark: Any = None, staged: StagedRows | None = None
) -> tuple[int, RoundResult]:
    """One round from command-line arguments; ``spark``: a session to use (else one is started
    and stopped); ``staged``: the rows a pre-stage wrote for it (``spark_jobs.prestage``)."""
    args = parse_args(argv)
    started = time.monotonic()
    round_: CommitRound | None = None
    try:
        round_ = CommitRound(args, spark, staged)
        result = round_.run()
        code = 0
    except Exception as exc:  # every failure ends as a clear message + result JSON
        log.debug("round failed", exc_info=True)
        message = _message(exc)
        print(f"commit round of {args.topic} failed: {message}", file=sys.stderr)
        if round_ is not None:
            result = round_.result("failed", message=message, seconds=round_.seconds)
        else:
            result = RoundResult(
                status="failed",
                topic=args.topic,
                round_id=args.round_id or "",
                until_append_ms=args.until_append_time,
                message=message,
            )
        code = 1
    result.seconds["total"] = round(time.monotonic() - started, 3)
    if args.result is not None:
        job_output.write_result(args.result, result.to_json())
    log.info("round %s of %s: %s %s", result.round_id, args.topic, result.status, result.message)
    if staged is not None:
        staged.drop()  # unless the round used them: a round that ended before it wrote rows
    if round_ is not None and round_._own_spark and round_._spark is not None:
        round_._spark.stop()
    return code, result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_setup.configure(args.log_level)
    return run(argv)[0]


if __name__ == "__main__":
    sys.exit(main())
