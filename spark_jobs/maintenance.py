"""S3 Tables-style maintenance of one table topic's table, with Iceberg's Spark procedures.

Run it with spark-submit (the Iceberg runtime jar on ``--jars``)::

    spark-submit --jars "$(python -c 'from spark_jobs.jars import iceberg_jars; print(",".join(iceberg_jars()))')" \\
        spark_jobs/maintenance.py --topic clicks --result /tmp/maintenance.json

or as ``python -m spark_jobs.maintenance ...``, which starts its own Spark
(``--master``, default ``local[*]``) with the jar. The broker's admin URL
(``--admin-url``, default ``$ICEFALL_ADMIN_URL`` or http://127.0.0.1:8090)
names the catalog; settings come from the topic configs, the table's
properties and the flags (``maintenance_settings``).

The actions, in this order (``--actions``, default all four):

- ``compact``: ``rewrite_data_files`` (binpack; sort by the table's sort order
  when it has one) to the target file size. On an upsert table (merge-on-read
  deletes) it also rewrites every data file with at least ``delete-file-threshold``
  delete files, applying them, then ``rewrite_position_delete_files`` compacts the
  position delete files left and drops dangling ones where Iceberg 1.10 can
  (``position_deletes`` in the result says what it did or why it skipped);
- ``manifests``: ``rewrite_manifests``;
- ``expire``: ``expire_snapshots`` older than the topic's
  ``expire.snapshot.older.than.hours``, keeping ``expire.snapshot.retain.last``.
  Tags are never expired by age, so the snapshot tagged ``icefall-checkpoint``
  (the commit round's offsets) survives and the next round starts where it should;
- ``orphans``: ``remove_orphan_files`` older than N days (S3 Tables: 3).

On AWS S3 Tables (``automq.table.topic.catalog.type=tablebucket``) the service does
``compact``, ``expire`` and ``orphans`` itself: the job writes the topic's settings to the
table's S3 Tables maintenance configuration instead (``maintain/s3tables.py``, reported as
the ``s3tables`` action) and runs only ``manifests``.

The DLQ table ``<table>__dlq``, when it exists, gets ``compact`` and ``expire``
too. Maintenance commits move ``main``: a commit round running at the same time
loses its publish race and starts over (Airflow's per-table pool serialises them).
The result JSON says what each action did; the exit code is 0 when every action
ran (or the table does not exist yet), 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from broker import contracts, log_setup
from spark_jobs import job_args, job_output
from spark_jobs.broker_client import AdminClient
from spark_jobs.maintain import s3tables as s3tables_maintenance
from spark_jobs.maintain import summary as maintenance_summary
from spark_jobs.maintain.settings import (
    ACTIONS,
    EXPIRE_ENABLED,
    SORT,
    ZORDER,
    Settings,
    parse_actions,
    resolve,
)
from spark_jobs.rounds import dlq, table_setup

log = logging.getLogger("icefall.maintenance")
DLQ_ACTIONS = ("compact", "expire")
ORPHAN_PATHS_SHOWN = 20
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


# rewrite_data_files options that drop the delete files compaction left pointing at nothing.
# Upsert rounds write partition-scoped position deletes (no referenced data file), which stay in
# the table after compaction applied them. remove-dangling-deletes drops delete files older than
# every live data file of their partition; by default the new files keep the rewrite's starting
# sequence number, the same as the newest round's deletes, so those would never count as older.
# Committing them with a fresh sequence number is safe here: a round that adds position deletes
# for the files being rewritten makes the rewrite's commit fail Iceberg's validation, never lose
# the deletes (and the pool shared with the rounds keeps the two apart anyway); equality deletes,
# the case the starting sequence number exists for, are never written by our rounds.
DANGLING_DELETE_OPTIONS = (
    "'remove-dangling-deletes', 'true', 'use-starting-sequence-number', 'false'"
)


# What maintenance did to one table: the contract's model, filled in as the actions run.
TableResult = contracts.MaintenanceTableResult


@dataclass
class MaintenanceResult:
    status: str  # done, no_table, failed
    topic: str
    namespace: str = ""
    table: str = ""
    now_ms: int = 0
    actions: list[str] = field(default_factory=list)
    result: TableResult | None = None
    dlq: TableResult | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        """The result JSON (``broker.contracts.MaintenanceResult``): the table's own figures at the
        top level, what Airflow and the status view read; the DLQ table's under ``dlq``."""
        main = self.result.to_json() if self.result is not None else {}
        return contracts.MaintenanceResult(
            status=self.status,
            topic=self.topic,
            namespace=self.namespace,
            table=self.table,
            now_ms=self.now_ms,
            actions=self.actions,
            dlq=self.dlq,
            seconds={**main.get("seconds", {}), **self.seconds},
            message=self.message,
            per_action=main.get("actions", {}),
            **{
                k: main.get(k)
                for k in (
                    "snapshot_id_before",
                    "snapshot_id",
                    "snapshots_before",
                    "snapshots_after",
                    "data_files_before",
                    "data_files_after",
                    "delete_files_before",
                    "delete_files_after",
                    "settings",
                )
            },
        ).to_json()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="maintenance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument(
        "--actions",
        default=",".join(ACTIONS),
        help=f"comma-separated subset of {','.join(ACTIONS)} (default: all, in that order)",
    )
    parser.add_argument("--result", type=Path, help="write the result JSON here")
    job_args.add_common_flags(parser)
    parser.add_argument(
        "--now-ms",
        type=int,
        default=None,
        help="the time the age thresholds count back from (default: now; for tests)",
    )
    parser.add_argument(
        "--target-file-size-bytes",
        type=int,
        default=None,
        help="compaction target (default: table property write.target-file-size-bytes, else 512 MiB)",
    )
    parser.add_argument(
        "--strategy",
        choices=("auto", "binpack", "sort", "zorder"),
        default=None,
        help="compaction strategy (default auto: zorder when z-order columns are configured, "
        "sort when the table has a sort order, else binpack)",
    )
    parser.add_argument(
        "--zorder-columns",
        default=None,
        help="z-order compaction by these columns, e.g. 'id,ts' (default: topic config "
        "maintenance.compaction.zorder.columns, table property)",
    )
    parser.add_argument(
        "--min-input-files",
        type=int,
        default=None,
        help="compact a group of small files only when it has at least this many (default 5, Iceberg's)",
    )
    parser.add_argument(
        "--delete-file-threshold",
        type=int,
        default=None,
        help="rewrite a data file with at least this many delete files even when its size is fine "
        "(default: topic config maintenance.compaction.delete.file.threshold, table property, 1)",
    )
    parser.add_argument(
        "--expire-older-than-hours",
        type=float,
        default=None,
        help="expire snapshots older than this (default: topic config expire.snapshot.older.than.hours)",
    )
    parser.add_argument(
        "--retain-last",
        type=int,
        default=None,
        help="snapshots always kept (default: topic config expire.snapshot.retain.last)",
    )
    parser.add_argument(
        "--orphan-older-than-days",
        type=float,
        default=None,
        help="remove unreferenced files older than this (default 3, as S3 Tables)",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    try:
        args.actions = parse_actions(args.actions)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "target_file_size_bytes": args.target_file_size_bytes,
        "strategy": args.strategy,
        "zorder_columns": args.zorder_columns,
        "min_input_files": args.min_input_files,
        "delete_file_threshold": args.delete_file_threshold,
        "expire_older_than_hours": args.expire_older_than_hours,
        "retain_last": args.retain_last,
        "orphan_older_than_days": args.orphan_older_than_days,
    }


def sql_timestamp(ms: int) -> str:
    """A Spark SQL TIMESTAMP literal for ``ms`` since the epoch, independent of the session time zone."""
    at = datetime.fromtimestamp(ms / 1000, UTC)
    return f"TIMESTAMP '{at.strftime('%Y-%m-%d %H:%M:%S')}.{at.microsecond:06d}Z'"


def _quote(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


def _quote_column(name: str) -> str:
    """A column (nested with dots) for Iceberg's sort-order parser: each part in backticks."""
    return ".".join(_quote(part) for part in name.split("."))


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _first_row(rows: list[Any]) -> dict[str, Any]:
    return rows[0].asDict() if rows else {}


def _count(row: dict[str, Any], column: str) -> int:
    value = row.get(column)
    return int(value) if value is not None else 0


class Maintenance:
    def __init__(self, args: argparse.Namespace, spark: Any = None) -> None:
        self.args = args
        admin = AdminClient(args.admin_url)
        cluster = admin.cluster()
        self.topic = admin.table_topic(args.topic)
        self.catalog_spec = table_setup.job_catalog(args.catalog_url, cluster)
        self.catalog = table_setup.catalog_for(self.catalog_spec)
        self.now_ms: int = args.now_ms if args.now_ms is not None else int(time.time() * 1000)
        self._spark: Any = spark
        self._own_spark = spark is None
        self._spark_catalog: str | None = None
        self.seconds: dict[str, float] = {}

    def result(self, status: str, **values: Any) -> MaintenanceResult:
        return MaintenanceResult(
            status,
            self.topic.topic,
            self.topic.namespace,
            self.topic.table,
            self.now_ms,
            list(self.args.actions),
            **values,
        )

    def spark_catalog(self) -> tuple[Any, str]:
        if self._spark is None:
            from spark_jobs.commit_round import spark_session

            started = time.monotonic()
            self._spark = spark_session(f"icefall-maintain-{self.topic.topic}", self.args.master)
            _small_shuffles(self._spark)
            self.seconds["spark_start"] = round(time.monotonic() - started, 3)
        if self._spark_catalog is None:
            from spark_jobs.commit_round import use_catalog

            self._spark_catalog = use_catalog(self._spark, self.catalog_spec)
        return self._spark, self._spark_catalog

    def run(self) -> MaintenanceResult:
        identifier = self.topic.identifier
        if not self.catalog.table_exists(identifier):
            return self.result(
                "no_table",
                message=f"{'.'.join(identifier)} does not exist yet (no round committed)",
            )
        main = self.maintain(identifier, self.args.actions)
        dlq_result = None
        dlq_identifier = (self.topic.namespace, dlq.dlq_name(self.topic.table))
        dlq_actions = [a for a in self.args.actions if a in DLQ_ACTIONS]
        if dlq_actions and self.catalog.table_exists(dlq_identifier):
            dlq_result = self.maintain(dlq_identifier, dlq_actions)
        failed = [
            f"{r.table} {name}: {a['error']}"
            for r in (main, dlq_result)
            if r is not None
            for name, a in r.actions.items()
            if "error" in a
        ]
        if failed:
            return self.result("failed", result=main, dlq=dlq_result, message="; ".join(failed))
        done = ", ".join(f"{name} {_summary(name, a)}" for name, a in main.actions.items())
        return self.result("done", result=main, dlq=dlq_result, message=done)

    def maintain(self, identifier: tuple[str, str], actions: list[str]) -> TableResult:
        table = self.catalog.load_table(identifier)
        settings = resolve(self.topic.configs, table.properties, _flags(self.args))
        name = ".".join(identifier)
        current = table.current_snapshot()
        out = TableResult(
            table=name,
            settings=settings.to_json(),
            snapshots_before=len(table.metadata.snapshots),
            snapshot_id_before=current.snapshot_id if current is not None else None,
            data_files_before=_total(current, "total-data-files"),
            delete_files_before=_total(current, "total-delete-files"),
        )
        if self.catalog_spec.type == "tablebucket":  # S3 Tables maintains the table itself
            out.actions["s3tables"] = self._configure_s3tables(identifier, settings)
            actions = s3tables_maintenance.left_to_icefall(actions)
        target = f"{_quote(identifier[0])}.{_quote(identifier[1])}"
        steps = {
            "compact": self._compact,
            "manifests": self._rewrite_manifests,
            "expire": self._expire,
            "orphans": self._remove_orphans,
        }
        for action in actions:
            started = time.monotonic()
            spark, catalog = self.spark_catalog()
            try:
                done = steps[action](spark, catalog, target, table, settings)
            except Exception as exc:  # the other actions still run; the job fails at the end
                log.warning("%s of %s failed", action, name, exc_info=True)
                done = {"error": job_output.error_message(exc)}
            done["seconds"] = out.seconds[action] = round(time.monotonic() - started, 3)
            out.actions[action] = done
            log.info("%s %s: %s", name, action, _summary(action, done))
            table = table.refresh()
        current = table.current_snapshot()
        out.snapshot_id = current.snapshot_id if current is not None else None
        out.snapshots_after = len(table.metadata.snapshots)
        out.data_files_after = _total(current, "total-data-files")
        out.delete_files_after = _total(current, "total-delete-files")
        return out

    def _configure_s3tables(
        self, identifier: tuple[str, str], settings: Settings
    ) -> dict[str, Any]:
        """The topic's maintenance settings written to S3 Tables (``maintain/s3tables.py``)."""
        started = time.monotonic()
        try:
            done = s3tables_maintenance.configure(
                s3tables_maintenance.client_for(self.catalog),
                self.catalog_spec.warehouse or "",
                identifier,
                settings,
                self.topic.configs,
            )
        except Exception as exc:  # reported like a failed action
            log.warning("writing S3 Tables' maintenance configuration failed", exc_info=True)
            done = {"error": job_output.error_message(exc)}
        done["seconds"] = round(time.monotonic() - started, 3)
        return done

    def record(self, result: MaintenanceResult) -> None:
        """Keep the run's summary on the table (``icefall.maintenance.last-run``) for the status
        view and any engine. A metadata-only commit (no snapshot), so it does not move ``main``
        and a commit round publishing meanwhile is not disturbed. Failing to record is a warning
        in the result, not a failed run: the maintenance itself is done."""
        summary = maintenance_summary.summarize(result.to_json())
        try:
            table = self.catalog.load_table(self.topic.identifier)
            with table.transaction() as transaction:
                transaction.set_properties(
                    {
                        maintenance_summary.LAST_RUN_PROPERTY: maintenance_summary.to_property(
                            summary
                        )
                    }
                )
        except Exception as exc:  # a catalog or network error: see the docstring
            log.warning(
                "could not record the maintenance run on %s",
                ".".join(self.topic.identifier),
                exc_info=True,
            )
            result.message += f" (not recorded on the table: {job_output.error_message(exc)})"

    def _call(self, spark: Any, catalog: str, procedure: str, **named: str) -> list[Any]:
        arguments = ", ".join(f"{k} => {v}" for k, v in named.items())
        sql = f"CALL {catalog}.system.{procedure}({arguments})"
        log.debug("%s", sql)
        rows: list[Any] = spark.sql(sql).collect()
        return rows

    def _compact(
        self, spark: Any, catalog: str, target: str, table: Any, settings: Settings
    ) -> dict[str, Any]:
        sort_order = table.sort_order()
        strategy = settings.compaction_strategy(not sort_order.is_unsorted)
        options = (
            f"map('target-file-size-bytes', '{settings.target_file_size_bytes}', "
            f"'min-input-files', '{settings.min_input_files}', "
            f"'delete-file-threshold', '{settings.delete_file_threshold}', {DANGLING_DELETE_OPTIONS})"
        )
        named = {"table": _sql_string(target), "options": options}
        if (
            strategy == ZORDER
        ):  # Iceberg's z-order is the sort strategy with a zorder(...) sort order
            columns = ", ".join(_quote_column(c) for c in settings.zorder_columns)
            named.update(strategy=_sql_string(SORT), sort_order=_sql_string(f"zorder({columns})"))
        else:
            named["strategy"] = _sql_string(strategy)
        row = _first_row(self._call(spark, catalog, "rewrite_data_files", **named))
        done_extra = {"zorder_columns": list(settings.zorder_columns)} if strategy == ZORDER else {}
        done: dict[str, Any] = {
            "strategy": strategy,
            **done_extra,
            "target_file_size_bytes": settings.target_file_size_bytes,
            "min_input_files": settings.min_input_files,
            "delete_file_threshold": settings.delete_file_threshold,
            "rewritten_data_files": _count(row, "rewritten_data_files_count"),
            "added_data_files": _count(row, "added_data_files_count"),
            "rewritten_bytes": _count(row, "rewritten_bytes_count"),
            "failed_data_files": _count(row, "failed_data_files_count"),
            "removed_delete_files": _count(row, "removed_delete_files_count"),
        }
        started = time.monotonic()
        try:
            deletes = self._rewrite_position_deletes(
                spark,
                catalog,
                target,
                table.refresh(),
                settings,
                rewrote_data=done["rewritten_data_files"] > 0,
            )
        except (
            Exception
        ) as exc:  # keep what rewrite_data_files did; the action still counts as failed
            log.warning("rewrite_position_delete_files of %s failed", target, exc_info=True)
            deletes = {"error": job_output.error_message(exc)}
            done["error"] = f"rewrite_position_delete_files: {deletes['error']}"
        deletes["seconds"] = round(time.monotonic() - started, 3)
        done["position_deletes"] = deletes
        return done

    def _rewrite_position_deletes(
        self,
        spark: Any,
        catalog: str,
        target: str,
        table: Any,
        settings: Settings,
        rewrote_data: bool,
    ) -> dict[str, Any]:
        """``rewrite_position_delete_files`` where it has work: it bin-packs small position
        delete files and drops the ones (and the rows in them) that point at data files no
        longer live, e.g. partition-scoped deletes whose data files compaction just rewrote.

        Skipped, with the reason in the result, where it cannot run: a table with a map or
        list column (every table topic: ``_kafka_headers``; see ``_has_map_or_list``). And
        where it would only copy files one to one: file-scoped deletes (a referenced data
        file) are one per data file, kept merged by the writer and removed with their data
        file by ``rewrite_data_files``; so are a v3 table's deletion vectors (Puffin). On v3,
        Iceberg's procedure only converts position delete files left from v2 into deletion
        vectors, so it runs there only when such files exist. (Upsert rounds write
        partition-scoped deletes: no referenced data file, observed with Iceberg 1.10.)"""
        version = int(table.metadata.format_version)
        base = {
            "format_version": version,
            "rewritten_delete_files": 0,
            "added_delete_files": 0,
            "rewritten_bytes": 0,
            "added_bytes": 0,
        }
        if version < 2:
            return {**base, "skipped": "format version 1 has no delete files"}
        if (
            _total(table.current_snapshot(), "total-delete-files") == 0
        ):  # an append-only table: no Spark job
            return {**base, "position_delete_files": 0, "skipped": "no delete files"}
        files = spark.sql(
            f"SELECT file_format, referenced_data_file FROM {catalog}.{target}.delete_files "
            "WHERE content = 1"
        ).collect()
        puffin = sum(1 for f in files if str(f["file_format"]).upper() == "PUFFIN")
        file_scoped = sum(1 for f in files if f["referenced_data_file"] is not None)
        base.update(position_delete_files=len(files), deletion_vectors=puffin)
        if not files:
            return {**base, "skipped": "no position delete files"}
        if _has_map_or_list(table.schema()):
            return {
                **base,
                "skipped": "Iceberg 1.10's position_deletes reader cannot read a table with a map or "
                "list column (every table topic has _kafka_headers); compaction applies "
                "the deletes instead (delete file threshold)",
            }
        if version >= 3 and puffin == len(files):
            return {
                **base,
                "skipped": "deletion vectors only (one per data file; compaction applies them)",
            }
        if version == 2 and file_scoped == len(files):
            return {
                **base,
                "skipped": "file-scoped deletes only (one per data file; compaction applies them)",
            }
        # After rewrite_data_files, partition-scoped deletes may point only at files it replaced.
        # Its remove-dangling-deletes cannot tell (it compares sequence numbers, and the new files
        # keep the rewrite's starting one); rewriting every delete file filters such rows out.
        rewrite_all = "true" if rewrote_data else "false"
        options = (
            f"map('min-input-files', '{settings.min_input_files}', 'rewrite-all', '{rewrite_all}')"
        )
        row = _first_row(
            self._call(
                spark,
                catalog,
                "rewrite_position_delete_files",
                table=_sql_string(target),
                options=options,
            )
        )
        return {
            **base,
            "rewritten_delete_files": _count(row, "rewritten_delete_files_count"),
            "added_delete_files": _count(row, "added_delete_files_count"),
            "rewritten_bytes": _count(row, "rewritten_bytes_count"),
            "added_bytes": _count(row, "added_bytes_count"),
        }

    def _rewrite_manifests(
        self, spark: Any, catalog: str, target: str, table: Any, settings: Settings
    ) -> dict[str, Any]:
        row = _first_row(self._call(spark, catalog, "rewrite_manifests", table=_sql_string(target)))
        return {
            "rewritten_manifests": _count(row, "rewritten_manifests_count"),
            "added_manifests": _count(row, "added_manifests_count"),
        }

    def _expire(
        self, spark: Any, catalog: str, target: str, table: Any, settings: Settings
    ) -> dict[str, Any]:
        if not settings.expire_enabled:
            return {"skipped": f"{EXPIRE_ENABLED}=false", "snapshots_expired": 0}
        older_than_ms = self.now_ms - int(settings.expire_older_than_hours * HOUR_MS)
        before = {s.snapshot_id for s in table.metadata.snapshots}
        row = _first_row(
            self._call(
                spark,
                catalog,
                "expire_snapshots",
                table=_sql_string(target),
                older_than=sql_timestamp(older_than_ms),
                retain_last=str(settings.retain_last),
            )
        )
        after = {s.snapshot_id for s in table.refresh().metadata.snapshots}
        return {
            "older_than_ms": older_than_ms,
            "retain_last": settings.retain_last,
            "snapshots_expired": len(before - after),
            "deleted_data_files": _count(row, "deleted_data_files_count"),
            "deleted_position_delete_files": _count(row, "deleted_position_delete_files_count"),
            "deleted_equality_delete_files": _count(row, "deleted_equality_delete_files_count"),
            "deleted_manifest_files": _count(row, "deleted_manifest_files_count"),
            "deleted_manifest_lists": _count(row, "deleted_manifest_lists_count"),
            "deleted_statistics_files": _count(row, "deleted_statistics_files_count"),
        }

    def _remove_orphans(
        self, spark: Any, catalog: str, target: str, table: Any, settings: Settings
    ) -> dict[str, Any]:
        older_than_ms = self.now_ms - int(settings.orphan_older_than_days * DAY_MS)
        named = {"table": _sql_string(target), "older_than": sql_timestamp(older_than_ms)}
        if not table.location().startswith(("file:", "/")):
            # Object stores (s3://...) are listed by the table's FileIO: the Iceberg runtime has
            # no Hadoop FileSystem for them, and S3FileIO lists prefixes itself.
            named["prefix_listing"] = "true"
        rows = self._call(spark, catalog, "remove_orphan_files", **named)
        paths = [str(r["orphan_file_location"]) for r in rows]
        return {
            "older_than_ms": older_than_ms,
            "removed": len(paths),
            "paths": paths[:ORPHAN_PATHS_SHOWN],
        }


def _small_shuffles(spark: Any) -> None:
    """On a local master left at Spark's default of 200 shuffle partitions, one per core: the
    procedures' joins (expire_snapshots compares the files of expired and kept snapshots) then run
    a few tasks instead of hundreds of near-empty ones. A cluster's or the user's setting is kept."""
    conf = spark.sparkContext.getConf()
    if conf.get("spark.master", "").startswith("local") and not conf.contains(
        "spark.sql.shuffle.partitions"
    ):
        spark.conf.set(
            "spark.sql.shuffle.partitions", str(max(1, spark.sparkContext.defaultParallelism))
        )


def _has_map_or_list(schema: Any) -> bool:
    """Whether a pyiceberg schema has a map or list anywhere: Iceberg 1.10's position_deletes
    metadata table (what rewrite_position_delete_files reads) builds an identity partition spec
    over the table's columns, and that refuses fields inside a map or list ("Invalid partition
    field parent: map<string, binary>")."""
    from pyiceberg.schema import index_by_id
    from pyiceberg.types import ListType, MapType

    return any(
        isinstance(field.field_type, ListType | MapType) for field in index_by_id(schema).values()
    )


def _total(snapshot: Any, key: str) -> int | None:
    """A ``total-*`` count of a snapshot's summary (``total-data-files``, ``total-delete-files``)."""
    if snapshot is None or snapshot.summary is None:
        return None
    value = snapshot.summary.get(key)
    return int(value) if value is not None else None


def _summary(action: str, done: dict[str, Any]) -> str:
    if "error" in done:
        return f"failed: {done['error']}"
    if "skipped" in done:
        return f"skipped ({done['skipped']})"
    if action == "compact":
        deletes = done.get("position_deletes") or {}
        tail = (
            f", {deletes['rewritten_delete_files']} position delete files -> {deletes['added_delete_files']}"
            if deletes.get("rewritten_delete_files")
            else ""
        )
        removed = (
            f", {done['removed_delete_files']} delete files applied"
            if done.get("removed_delete_files")
            else ""
        )
        return f"{done['rewritten_data_files']} data files -> {done['added_data_files']}{removed}{tail}"
    if action == "s3tables":
        written = done.get("configuration", {})
        return "maintained by S3 Tables: " + ", ".join(
            f"{kind} {value['status']}" for kind, value in written.items()
        )
    if action == "manifests":
        return f"{done['rewritten_manifests']} manifests -> {done['added_manifests']}"
    if action == "expire":
        return f"{done['snapshots_expired']} snapshots expired, {done['deleted_data_files']} data files deleted"
    return f"{done['removed']} orphan files removed"


def run(argv: list[str] | None = None, spark: Any = None) -> tuple[int, MaintenanceResult]:
    """One maintenance run from command-line arguments; ``spark``: a session to use (else one
    is started and stopped)."""
    args = parse_args(argv)
    started = time.monotonic()
    job: Maintenance | None = None
    try:
        job = Maintenance(args, spark)
        result = job.run()
    except Exception as exc:  # every failure ends as a clear message + result JSON
        log.debug("maintenance failed", exc_info=True)
        message = job_output.error_message(exc)
        result = (
            job.result("failed", message=message)
            if job is not None
            else MaintenanceResult(
                "failed", args.topic, actions=list(args.actions), message=message
            )
        )
    if job is not None:
        result.seconds.update(job.seconds)
    result.seconds["total"] = round(time.monotonic() - started, 3)
    if job is not None and result.result is not None:
        job.record(result)
    code = 1 if result.status == "failed" else 0
    if code:
        print(f"maintenance of {args.topic} failed: {result.message}", file=sys.stderr)
    if args.result is not None:
        job_output.write_result(args.result, result.to_json())
    log.info("maintenance of %s: %s %s", args.topic, result.status, result.message)
    if job is not None and job._own_spark and job._spark is not None:
        job._spark.stop()
    return code, result


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    args = parse_args(argv)
    log_setup.configure(args.log_level)
    return run(argv, spark)[0]


if __name__ == "__main__":
    sys.exit(main())
