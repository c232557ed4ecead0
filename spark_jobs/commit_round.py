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
ranges on the executors and write them to a round branch, then publish with
one conditional catalog commit (``round_commit``). A round that loses a race
to another writer starts over from the new checkpoint, so a round run twice,
two rounds at once, or a round killed and re-run commit each record once.
On a format v3 table every snapshot is written by Spark (pyiceberg 0.12 writes
no v3 manifests): append rounds stage their rows and Spark appends them, and
the base and empty snapshots are empty Spark appends; upsert rounds' MERGE
writes deletion vectors there instead of position deletes.
The result JSON says what happened; the exit code is 0 for ``committed`` and
``nothing_new``, 1 for a failed round (the message is on stderr and in the JSON).
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
from typing import Any

from broker import checkpoint
from broker.config import ObjectStoreConfig, aws_io_credentials, object_store_from_env
from broker.contracts import CatalogSpec, RoundResult, TopicPlan
from spark_jobs import (
    dlq,
    job_output,
    json_values,
    partitioning,
    round_plan,
    round_tasks,
    table_setup,
    upsert,
)
from spark_jobs.broker_client import AdminClient, RegistryClient, TableTopic
from spark_jobs.round_commit import (
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
from spark_jobs.round_tasks import TaskReport, TaskSpec, run_in_driver, run_tasks
from spark_jobs.rows import INCOMPATIBLE_SCHEMA, TABLE_SCHEMA_BEHIND, DecodeError
from spark_jobs.segments import cached_store, read_partition

log = logging.getLogger("icefall.commit_round")
SPARK_CATALOG = "icefall_round"
MAX_ATTEMPTS = 5
ERRORS_SHOWN = 5
KILL_POINT_ENV = "ICEFALL_ROUND_KILL_AT"  # tests: exit abruptly at a named point (see _kill_point)
DRIVER_MAX_BYTES_ENV = "ICEFALL_ROUND_IN_DRIVER_MAX_BYTES"
# Below this a round decodes in well under a second on one core, while starting Spark's
# context and Python workers takes several: the break-even on this 2-core machine is far above.
DEFAULT_DRIVER_MAX_BYTES = 64 << 20


class RoundFailed(RuntimeError):
    """The round cannot commit; the message says why and which records."""


def _kill_point(name: str) -> None:
    """Exit at once (no cleanup, like kill -9) when the test harness names this point."""
    if os.environ.get(KILL_POINT_ENV) == name:
        os._exit(137)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="commit_round", description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", required=True)
    until = parser.add_mutually_exclusive_group()
    until.add_argument("--until-append-time", type=int, metavar="MS",
                       help="commit the offsets the broker appended before this time (ms since the epoch)")
    until.add_argument("--until-offsets", metavar="JSON", help='commit up to these offsets, e.g. {"0": 1200}')
    until.add_argument("--until-now", action="store_true", help="commit everything appended so far (the default)")
    parser.add_argument("--result", type=Path, help="write the result JSON here")
    parser.add_argument("--round-id", default=None, help="recorded in the snapshot summary (default: a new uuid)")
    parser.add_argument("--max-records", type=int, default=None, help="at most this many offsets per partition")
    parser.add_argument("--admin-url", default=os.environ.get("ICEFALL_ADMIN_URL", "http://127.0.0.1:8090"))
    parser.add_argument("--catalog-url", default=None, help="Iceberg REST catalog (default: the broker's)")
    parser.add_argument("--master", default=None, help="Spark master when not run by spark-submit (default local[*])")
    parser.add_argument("--flush-deadline-s", type=float, default=60.0,
                        help="how long to wait for the broker to flush the planned offsets to segment objects")
    parser.add_argument("--in-driver-max-bytes", type=int, metavar="BYTES",
                        default=int(os.environ.get(DRIVER_MAX_BYTES_ENV, DEFAULT_DRIVER_MAX_BYTES)),
                        help="a round reading at most this many segment bytes runs its one task in the driver "
                             f"without starting Spark (default 64 MiB or ${DRIVER_MAX_BYTES_ENV}; 0: always Spark)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.until_offsets is not None:
        try:
            args.until_offsets = {int(p): int(o) for p, o in json.loads(args.until_offsets).items()}
        except (ValueError, AttributeError, TypeError) as exc:
            parser.error(f'--until-offsets must be a JSON object of partition -> offset, e.g. {{"0": 1200}}: {exc}')
    if args.max_records is not None and args.max_records < 1:
        parser.error("--max-records must be at least 1")
    if args.in_driver_max_bytes < 0:
        parser.error("--in-driver-max-bytes must be 0 or more")
    return args


# ---------------------------------------------------------------- Spark


def spark_session(app_name: str, master: str | None) -> Any:
    """Under spark-submit the master and jars come from spark-submit; started
    from Python, we launch local Spark here with the Iceberg jar."""
    from pyspark.sql import SparkSession

    from spark_jobs.jars import iceberg_jars

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if not _under_spark_submit():
        builder = (builder.master(master or "local[*]").config("spark.jars", ",".join(iceberg_jars()))
                   .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false"))
    elif master:
        builder = builder.master(master)
    session = (
        builder.config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.session.timeZone", "UTC")
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
    settings = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.cache-enabled": "false",
                **{f"{prefix}.{key}": value for key, value in spec.spark_properties().items()}}
    # S3FileIO takes the endpoint and region from the catalog's config; the job's own AWS
    # credentials go with the catalog (the JVM may have started before they were in the
    # environment, and executors get them with the table's FileIO).
    settings.update({f"{prefix}.{key}": value for key, value in aws_io_credentials().items()})
    for key, value in settings.items():
        spark.conf.set(key, value)
    return name


def _under_spark_submit() -> bool:
    """spark-submit starts the JVM before our code runs (PySpark then finds a gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


# ---------------------------------------------------------------- the round


class CommitRound:
    def __init__(self, args: argparse.Namespace, spark: Any = None) -> None:
        self.args = args
        self.admin = AdminClient(args.admin_url)
        cluster = self.admin.cluster()
        self.topic: TableTopic = self.admin.table_topic(args.topic)
        self.registry = RegistryClient(cluster.registry_url)
        self.catalog_spec = table_setup.job_catalog(args.catalog_url, cluster)
        self.catalog_url = self.catalog_spec.uri
        self.catalog = table_setup.catalog_for(self.catalog_spec)
        self.store: ObjectStoreConfig = object_store_from_env(cluster.object_store,
                                                              cluster.object_store_endpoint)
        self.options = table_setup.TableOptions.of(self.topic)
        self.upsert = upsert.UpsertOptions.of(self.topic)
        self.json = self.options.value_type == "json"
        self.staging = self.upsert is not None or self.json  # tasks stage rows for the driver's Spark write
        self.round_id = args.round_id or uuid.uuid4().hex
        self.branch = branch_name(self.round_id)
        self._spark: Any = spark
        self._own_spark = spark is None
        self.seconds: dict[str, float] = {}

    def spark(self) -> Any:
        if self._spark is None:
            started = time.monotonic()
            self._spark = spark_session(f"icefall-commit-{self.topic.topic}", self.args.master)
            self.seconds["spark_start"] = round(time.monotonic() - started, 3)
        return self._spark

    def result(self, status: str, **values: Any) -> RoundResult:
        return RoundResult(status=status, topic=self.topic.topic, namespace=self.topic.namespace,
                           table=self.topic.table, round_id=self.round_id,
                           until_append_ms=self.args.until_append_time, **values)

    def run(self) -> RoundResult:
        started = time.monotonic()
        broker_plan = self.admin.flushed_plan(self.topic.topic, self.args.until_append_time,
                                              self.args.flush_deadline_s)
        self.seconds["plan"] = round(time.monotonic() - started, 3)
        extra_ids: set[int] = set()
        changes: list[str] = []
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                result = self._attempt(broker_plan, extra_ids, changes)
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
            from spark_jobs.avro_decode import wire_schema_id

            for chunk in read_partition(cached_store(self.store), ranges[:1], max_records=1):
                return wire_schema_id(chunk.values[0]) if len(chunk) else None
            return None

        return first

    def _attempt(  # noqa: C901 (to be split in a change of its own)
        self, broker_plan: TopicPlan, extra_ids: set[int], changes: list[str]
    ) -> RoundResult:
        t0 = time.monotonic()
        table = self.catalog.load_table(self.topic.identifier) if self.catalog.table_exists(
            self.topic.identifier) else None
        found = checkpoint.read_checkpoint(table.metadata) if table is not None else checkpoint.NO_CHECKPOINT
        windows = round_plan.windows(broker_plan, found, self.topic.topic_id,
                                     until_offsets=self.args.until_offsets, max_records=self.args.max_records)
        plan = round_plan.RoundPlan(windows, self.args.until_append_time)
        skipped = sum(w.skipped for w in windows)
        if skipped:
            log.warning("%d records of %s were deleted by retention before any round committed them",
                        skipped, self.topic.topic)
        if plan.empty:
            return self.result("nothing_new", snapshot_id=found.snapshot_id, offsets_before=plan.offsets_before,
                               offsets_after=plan.offsets_after, seconds=self.seconds,
                               message="no new offsets since the last committed round")
        plan.ranges = round_plan.fetch_ranges(self.admin, self.topic.topic, windows)
        table = table_setup.load_or_create(self.catalog, self.topic, self.registry, self.options,
                                           self._first_schema_id(plan.ranges))
        # pyiceberg 0.12 writes no v3 manifests: on a v3 table every snapshot is Spark's (see _spark_empty)
        v3 = table.metadata.format_version >= 3
        staging = self.staging or v3
        schemas = table_setup.value_schemas(self.registry, self.topic.topic, extra_ids)
        evolved = table_setup.evolve(table, schemas, self.options)
        changes.extend(evolved.applied)
        table, spec_changes = partitioning.evolve(table.refresh(), self.topic.settings.partition_by)
        changes.extend(spec_changes)
        if self.upsert is not None:
            if not self.json:  # json: the id columns exist once the values' columns are inferred (_merge)
                upsert.check_columns(table.schema(), self.upsert)
            table = upsert.ensure_merge_on_read(table)
        table = self._spark_base_snapshot(table) if v3 else table_setup.ensure_base_snapshot(table)
        parent = main_snapshot_id(table)
        # Also when the plan found no table: a round that created it and committed in between leaves main
        # on its snapshot, and this round would write the same offsets again on top of it.
        if checkpoint.read_checkpoint(table.metadata).offsets != found.offsets:
            raise LostRace("another round committed while this one planned")
        self.seconds["prepare"] = round(time.monotonic() - t0, 3)
        _kill_point("before_write")

        assert parent is not None  # ensure_base_snapshot
        create_branch(self.catalog, table, self.branch, parent)
        metadata_json = (table.metadata.model_dump_json() if not staging
                         else upsert.staging_metadata_json(table, self.round_id, self._envelope(schemas, plan),
                                                           text_value=self.json, relax=self.staging))
        spec = TaskSpec(self.store, metadata_json, round_tasks.task_io_properties(table),
                        self.options.key_type, "string" if self.json else self.options.value_type, self.registry.url,
                        tuple(sorted(self.registry.known().items())))
        properties = {
            checkpoint.OFFSETS: checkpoint.encode_offsets(plan.offsets_after),
            checkpoint.ROUND_ID: self.round_id,
            checkpoint.TOPIC: self.topic.topic,
            checkpoint.TOPIC_ID: self.topic.topic_id,
        }
        round_bytes = sum(r.byte_end - r.byte_start for r in plan.ranges)
        executor = "driver" if round_bytes <= self.args.in_driver_max_bytes else "spark"
        try:
            spark = self.spark() if executor == "spark" else None  # its start-up is timed on its own
            started = time.monotonic()
            output = run_in_driver(spec, plan.ranges) if spark is None else run_tasks(
                spark, spec, round_plan.task_groups(plan.ranges, spark.sparkContext.defaultParallelism))
        except Exception:
            drop_branch(self.catalog, table.refresh(), self.branch)
            raise
        self.seconds["read_write"] = round(time.monotonic() - started, 3)
        report = output.report
        staged = [f.file_path for f in output.data_files] if staging else []
        try:
            parsed = None
            if self.json and staged:
                spark = self.spark()
                parsed = json_values.parse(
                    spark,
                    round_tasks.read_staged(spark, table, staged),
                    table,
                    self._spark_table(spark),
                    debezium=self.upsert is not None and self.upsert.debezium,
                )
                changes.extend(parsed.schema_changes)
                report.errors.extend(parsed.errors)
                report.rows -= len(parsed.errors)
                table = table.refresh()
            skipped_records = self._check_errors(report, table)
        except BaseException:
            if staging:
                drop_branch(self.catalog, table.refresh(), self.branch)
                upsert.remove_staging(table, staged)
            raise

        t1 = time.monotonic()
        def append_files(target: Any) -> None:
            with target.transaction() as tx, \
                    tx.update_snapshot(properties, branch=self.branch).fast_append() as append:
                for data_file in output.data_files:
                    append.append_data_file(data_file)

        merged = None
        if self.upsert is not None:
            merged = self._merge(self.spark(), table, staged, properties, parsed.rows if parsed else None)
        elif parsed is not None:
            self._append_rows(self.spark(), table, parsed.rows, staged, properties)
        elif v3 and staged:  # an append round on a v3 table: the staged rows appended by Spark
            self._append_rows(self.spark(), table, round_tasks.read_staged(self.spark(), table, staged), staged,
                              properties)
        if not staged or (merged is not None and not merged.merged):  # no staged rows: an empty snapshot
            if v3:
                self._spark_empty(table, properties, self.branch)
            else:
                # refreshed: the metadata in hand predates the round branch, and a write against it is refused
                table = write_to_branch(table.refresh(),
                                        append_files if not staging else lambda t: self._empty(t, properties))
        table = table.refresh()
        _kill_point("after_write")
        try:
            snapshot_id = round_snapshot(table, self.branch, parent)
        except UnexpectedBranchState as exc:
            drop_branch(self.catalog, table, self.branch)
            raise LostRace(str(exc)) from exc
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
        assert snapshot is not None
        if checkpoint.summary_properties(snapshot).get(checkpoint.OFFSETS) != properties[checkpoint.OFFSETS]:
            # a Spark write whose commit did not take the properties (CommitMetadata is per JVM thread):
            # publishing it would leave the checkpoint behind and the next round would write the records again
            drop_branch(self.catalog, table, self.branch)
            raise RoundFailed(f"the round's snapshot {snapshot_id} does not carry its offsets; nothing committed")
        heads = [BranchHead(table, self.branch, parent, snapshot_id)]
        if skipped_records:
            heads.append(self._dlq_head(skipped_records))
        _kill_point("before_publish")
        try:
            publish(self.catalog, heads, self.catalog_url)
        except LostRace:
            for head in heads:
                drop_branch(self.catalog, head.table.refresh(), self.branch)
            raise
        _kill_point("after_publish")
        self.seconds["commit"] = round(time.monotonic() - t1, 3)
        summary = checkpoint.summary_properties(snapshot)
        dlq_note = f", {len(skipped_records)} records to {dlq.dlq_name(self.topic.table)}" if skipped_records else ""
        if merged is not None:
            dlq_note = (f" (merged on {', '.join(self.upsert.id_columns) if self.upsert else ''}: "
                        f"{summary.get('added-records', '0')} rows written, "
                        f"{summary.get('added-position-deletes', '0')} rows replaced or deleted)" + dlq_note)
        return self.result(
            "committed", snapshot_id=snapshot_id, parent_snapshot_id=parent,
            offsets_before=plan.offsets_before, offsets_after=plan.offsets_after,
            records=sum(w.records for w in windows), rows=report.rows, dlq_rows=len(skipped_records),
            skipped_records=skipped, bytes_read=report.bytes_read,
            data_files=int(summary.get("added-data-files", 0)), executor=executor,
            seconds=self.seconds, message=f"committed {report.rows} rows{dlq_note}",
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
            raise RoundFailed(f"{self.topic.topic}: flatten_debezium needs the envelope's Avro schema in the registry")
        return self.registry.avro_schema(first)

    def _spark_table(self, spark: Any, branch: str | None = None) -> str:
        namespace, name = self.topic.identifier
        suffix = f".`branch_{branch}`" if branch else ""
        return f"{use_catalog(spark, self.catalog_spec)}.`{namespace}`.`{name}`{suffix}"

    def _empty(self, target: Any, properties: dict[str, str]) -> None:
        """A snapshot with no files: a staged round whose records all went to the DLQ still moves the offsets."""
        with target.transaction() as tx, tx.update_snapshot(properties, branch=self.branch).fast_append():
            pass

    def _spark_empty(self, table: Any, properties: dict[str, str], branch: str | None) -> None:
        """An empty snapshot written by Spark (pyiceberg 0.12 cannot write v3 manifest lists): Iceberg's
        Spark append commits a snapshot even without files. On ``branch``, or ``main`` when None."""
        spark = self.spark()
        target = self._spark_table(spark, branch)
        try:
            upsert.with_commit_properties(spark, properties,
                                          lambda: spark.table(target).limit(0).writeTo(target).append())
        except Exception:
            if branch is not None:
                drop_branch(self.catalog, table.refresh(), branch)
            raise

    def _spark_base_snapshot(self, table: Any) -> Any:
        """``table_setup.ensure_base_snapshot`` for a v3 table, through Spark. Unlike pyiceberg's it
        cannot insist that ``main`` is still missing: a round racing this one sees ``main`` move
        and starts over (``LostRace``), which costs time, not correctness."""
        if table.metadata.refs.get("main") is not None:
            return table
        self._spark_empty(table, {table_setup.BASE_PROPERTY: table_setup.BASE_NOTE}, None)
        return table.refresh()

    def _append_rows(self, spark: Any, table: Any, rows: Any, staged: list[str], properties: dict[str, str]) -> None:
        """A json round's rows appended to the round branch by Spark's Iceberg writer, one snapshot
        carrying ``properties`` (nullability is the table's: Spark's staged columns are all nullable)."""
        columns = [f"`{f.name}`" for f in table.schema().fields]
        try:
            upsert.with_commit_properties(spark, properties, lambda: rows.selectExpr(*columns).writeTo(
                self._spark_table(spark, self.branch)).option("check-nullability", "false").append())
        except Exception:
            drop_branch(self.catalog, table.refresh(), self.branch)
            raise
        finally:
            upsert.remove_staging(table, staged)

    def _merge(self, spark: Any, table: Any, staged: list[str], properties: dict[str, str], rows: Any = None
               ) -> upsert.MergeOutcome:
        """The upsert round's write: the staged rows MERGEd into the round branch (``upsert``)."""
        assert self.upsert is not None
        target = self._spark_table(spark, self.branch)
        try:
            if self.json:
                upsert.check_columns(table.schema(), self.upsert)
            staged_rows = round_tasks.read_staged(spark, table, staged) if staged and rows is None else None
            return upsert.merge_round(spark, target, table.schema(), self.upsert, staged_rows, properties,
                                      self.round_id, rows)
        except (upsert.BadUpsertRecords, upsert.UpsertConfigError) as exc:
            drop_branch(self.catalog, table.refresh(), self.branch)
            raise RoundFailed(f"{self.topic.topic}: {exc}") from exc
        except Exception:
            drop_branch(self.catalog, table.refresh(), self.branch)
            raise
        finally:
            upsert.remove_staging(table, staged)

    def _dlq_head(self, errors: list[DecodeError]) -> BranchHead:
        """The DLQ rows on the DLQ table's own round branch, published with the round's rows."""
        table = table_setup.ensure_base_snapshot(
            dlq.load_or_create(self.catalog, (self.topic.namespace, dlq.dlq_name(self.topic.table))))
        parent = main_snapshot_id(table)
        assert parent is not None
        create_branch(self.catalog, table, self.branch, parent)
        rows = dlq.to_arrow(errors, self.topic.topic, self.round_id, table.schema())
        table = write_to_branch(table.refresh(), lambda target: target.append(
            rows, snapshot_properties={checkpoint.ROUND_ID: self.round_id}, branch=self.branch))
        return BranchHead(table, self.branch, parent, round_snapshot(table, self.branch, parent),
                          tag_checkpoint=False)

    def _check_errors(self, report: TaskReport, table: Any) -> list[DecodeError]:
        """The records to send to the DLQ; raises when the tolerance does not allow skipping them all."""
        errors = report.errors
        if not errors:
            return []
        behind = {int(m.group(1)) for e in errors if e.error_class == TABLE_SCHEMA_BEHIND
                  and (m := re.match(r"schema id (\d+)", e.message))}
        if behind:
            drop_branch(self.catalog, table.refresh(), self.branch)
            raise _Evolve(behind)
        tolerance = self.topic.settings.errors_tolerance
        sorted_out = dlq.triage(errors, tolerance)
        if not sorted_out.fatal and not report.errors_dropped:
            return sorted_out.skipped
        drop_branch(self.catalog, table.refresh(), self.branch)
        if report.errors_dropped:
            raise RoundFailed(f"more than {len(errors)} bad records in one round of {self.topic.topic}; "
                              "nothing committed (run smaller rounds with --max-records)")
        fatal = sorted_out.fatal
        shown = "; ".join(f"partition {e.partition} offset {e.offset}: {e.error_class}: {e.message}"
                          for e in fatal[:ERRORS_SHOWN])
        kind = "schema" if any(e.error_class == INCOMPATIBLE_SCHEMA for e in fatal) else "record"
        raise RoundFailed(f"{len(fatal)} records of {self.topic.topic} cannot be written ({kind} errors; "
                          f"errors.tolerance={tolerance}), nothing committed: {shown}")


class _Evolve(Exception):
    def __init__(self, schema_ids: set[int]) -> None:
        super().__init__(f"records use schema ids {sorted(schema_ids)} the table was not evolved for")
        self.schema_ids = schema_ids


def _message(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, RoundFailed) else job_output.error_message(exc)


def run(argv: list[str] | None = None, spark: Any = None) -> tuple[int, RoundResult]:
    """One round from command-line arguments; ``spark``: a session to use (else one is started and stopped)."""
    args = parse_args(argv)
    started = time.monotonic()
    round_: CommitRound | None = None
    try:
        round_ = CommitRound(args, spark)
        result = round_.run()
        code = 0
    except Exception as exc:  # every failure ends as a clear message + result JSON
        log.debug("round failed", exc_info=True)
        message = _message(exc)
        print(f"commit round of {args.topic} failed: {message}", file=sys.stderr)
        if round_ is not None:
            result = round_.result("failed", message=message, seconds=round_.seconds)
        else:
            result = RoundResult(status="failed", topic=args.topic, round_id=args.round_id or "",
                                 until_append_ms=args.until_append_time, message=message)
        code = 1
    result.seconds["total"] = round(time.monotonic() - started, 3)
    if args.result is not None:
        job_output.write_result(args.result, result.to_json())
    log.info("round %s of %s: %s %s", result.round_id, args.topic, result.status, result.message)
    if round_ is not None and round_._own_spark and round_._spark is not None:
        round_._spark.stop()
    return code, result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(argv)[0]


if __name__ == "__main__":
    sys.exit(main())
