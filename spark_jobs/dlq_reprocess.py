"""Re-process a table topic's DLQ after a fix: the records that now decode move to the table.

After registering a missing schema, or fixing what made records undecodable,
run::

    python -m spark_jobs.dlq_reprocess --topic clicks --result /tmp/reprocess.json

It reads the DLQ rows of the topic (``<table>__dlq``), re-reads those offsets
from the segment objects (the DLQ keeps the bytes, but the segments are the
source of truth), converts them with the table's current schema (evolved for
every schema the registry now knows), and in ONE catalog transaction appends
the rows that now decode to the table and deletes their rows from the DLQ (on
Glue, S3 Tables and REST catalogs without multi-table commits: the table's
commit, then the DLQ's, which ``dlq_catchup`` finishes after a crash).
Records that still fail stay in the DLQ, with their old error. Running it
twice moves nothing twice: the second run no longer finds the moved rows.
The table's offsets checkpoint is not touched (these offsets were committed
by the round that sent them to the DLQ).

The DLQ holds few rows, so the driver decodes them. An append table (format
v2) gets them with a pyiceberg append and Spark is not started. An upsert/CDC
table gets a Spark MERGE on its id columns that takes a DLQ record only if no
later record of its id has been committed since (``_write_with_spark``), and a
format v3 table a Spark append (pyiceberg 0.12 writes no v3 manifests).
These are the commit round's writers (``round_writers``), on a reprocess
branch that any error drops, as a round's.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from broker import checkpoint, log_setup
from broker.config import ObjectStoreConfig, object_store_from_env
from broker.contracts import CatalogSpec, ReprocessResult
from spark_jobs import commit_round, job_args, job_output
from spark_jobs.broker_client import AdminClient, BrokerRequestError, RegistryClient, TableTopic
from spark_jobs.commit_round import spark_session, use_catalog
from spark_jobs.decode.avro_decode import wire_schema_id
from spark_jobs.decode.rows import RowConverter
from spark_jobs.decode.segments import (
    RecordChunk,
    SegmentRange,
    cached_store,
    ranges_from_admin,
    read_ranges,
)
from spark_jobs.rounds import dlq, dlq_catchup, table_setup, upsert
from spark_jobs.rounds import plan as round_plan
from spark_jobs.rounds import tasks as round_tasks
from spark_jobs.rounds import writers as round_writers
from spark_jobs.rounds.publish import (
    BranchHead,
    LostRace,
    branch_name,
    create_branch,
    drop_branch,
    main_snapshot_id,
    publish,
    round_snapshot,
    write_to_branch,
)
from spark_jobs.rounds.tasks import TaskSpec, run_in_driver, run_tasks

log = logging.getLogger("icefall.dlq_reprocess")
REPROCESSED = checkpoint.REPROCESSED


@dataclass
class _Job:
    """What every reprocess path needs: the topic, its clients, and the DLQ offsets to retry."""

    args: argparse.Namespace
    topic: TableTopic
    admin: AdminClient
    registry: RegistryClient
    catalog: Catalog
    catalog_spec: CatalogSpec
    store_config: ObjectStoreConfig
    options: table_setup.TableOptions
    upsert: upsert.UpsertOptions | None
    result: ReprocessResult
    by_partition: dict[int, list[int]] = field(default_factory=dict)
    log_start: dict[int, int] = field(default_factory=dict)
    # DLQ records whose segments retention has deleted: the DLQ's copy of them is all there is
    retained: list[RecordChunk] = field(default_factory=list)

    @property
    def wanted(self) -> set[tuple[int, int]]:
        return {(p, o) for p, offsets in self.by_partition.items() for o in offsets}

    @property
    def in_segments(self) -> dict[int, list[int]]:
        """The DLQ offsets still in the topic's segments (at or past the log start)."""
        out = {
            p: [o for o in offsets if o >= self.log_start.get(p, 0)]
            for p, offsets in self.by_partition.items()
        }
        return {p: offsets for p, offsets in out.items() if offsets}

    @property
    def only_in_dlq(self) -> set[tuple[int, int]]:
        return {(c.partition, o) for c in self.retained for o in c.offsets}

    def ranges(self, windows: list[tuple[int, int, int]]) -> list[SegmentRange]:
        """(partition, start, end) windows -> the segment byte ranges that hold them."""
        out: list[SegmentRange] = []
        for p, start, end in windows:
            out.extend(ranges_from_admin(self.admin.ranges(self.topic.topic, p, start, end)))
        return out

    def dlq_windows(self) -> list[tuple[int, int, int]]:
        return [
            (p, a, b)
            for p, offsets in sorted(self.in_segments.items())
            for a, b in dlq_catchup.offset_runs(offsets)
        ]


def _retained_chunks(rows: pa.Table, log_start: dict[int, int]) -> list[RecordChunk]:
    """The DLQ rows below their partition's log start as records to decode, one chunk a partition."""
    columns = {
        name: rows.column(name).to_pylist()
        for name in ("partition", "offset", "key", "value", "headers")
    }
    micros = rows.column("timestamp").cast(pa.int64()).to_pylist()
    chunks: dict[int, RecordChunk] = {}
    for i in sorted(
        range(rows.num_rows), key=lambda i: (columns["partition"][i], columns["offset"][i])
    ):
        p, o = int(columns["partition"][i]), int(columns["offset"][i])
        if o >= log_start.get(p, 0):
            continue
        chunk = chunks.setdefault(p, RecordChunk(p))
        chunk.offsets.append(o)
        chunk.timestamps.append(int(micros[i]) // 1000)
        chunk.keys.append(columns["key"][i])
        chunk.values.append(columns["value"][i])
        chunk.headers.append(tuple(columns["headers"][i] or ()))
    return [chunks[p] for p in sorted(chunks)]


def reprocess(args: argparse.Namespace, spark: Any = None) -> ReprocessResult:
    admin = AdminClient(args.admin_url)
    cluster = admin.cluster()
    topic = admin.table_topic(args.topic)
    catalog_spec = table_setup.job_catalog(args.catalog_url, cluster)
    store = object_store_from_env(cluster.object_store, cluster.object_store_endpoint)
    multi_table = dlq_catchup.multi_table_commits(catalog_spec)
    if topic.settings.convert_value_type == "json":
        raise NotImplementedError(
            f"{topic.topic} has JSON values (convert.value.type=json): their DLQ records "
            "are not JSON objects or do not fit the inferred columns, and reprocess does not "
            "infer columns yet; nothing moved"
        )
    job = _Job(
        args,
        topic,
        admin,
        RegistryClient(cluster.registry_url),
        table_setup.catalog_for(catalog_spec),
        catalog_spec,
        store,
        table_setup.TableOptions.of(topic),
        upsert.UpsertOptions.of(topic),
        ReprocessResult(
            status="nothing_to_move", topic=topic.topic, round_id=args.round_id or uuid.uuid4().hex
        ),
    )
    result = job.result
    dlq_ident = (topic.namespace, dlq.dlq_name(topic.table))
    if not job.catalog.table_exists(dlq_ident) or not job.catalog.table_exists(topic.identifier):
        result.message = "no DLQ table"
        return result
    if not multi_table:  # a reprocess a crash cut between its table and DLQ commits, finished first
        dlq_catchup.finish_reprocesses(
            job.catalog, job.catalog.load_table(topic.identifier), dlq_ident
        )
    dlq_table = job.catalog.load_table(dlq_ident)
    bad = dlq_table.scan(row_filter=f"topic = {dlq_catchup.sql_literal(topic.topic)}").to_arrow()
    result.dlq_rows = bad.num_rows
    if not bad.num_rows:
        result.message = "the DLQ has no rows of this topic"
        return result
    for p, o in zip(
        bad.column("partition").to_pylist(), bad.column("offset").to_pylist(), strict=True
    ):
        job.by_partition.setdefault(int(p), []).append(int(o))
    job.log_start = {
        p.partition: p.log_start_offset for p in admin.plan(topic.topic, None).partitions
    }
    job.retained = _retained_chunks(bad, job.log_start)
    result.only_in_dlq = len(job.only_in_dlq)

    # evolve the table for every schema id of the DLQ records the registry can answer now
    dlq_chunks = job.retained + list(
        read_ranges(cached_store(store), job.ranges(job.dlq_windows()))
    )
    ids = {i for c in dlq_chunks for i in map(wire_schema_id, c.values) if i is not None}
    table = job.catalog.load_table(topic.identifier)
    evolved = table_setup.evolve(
        table,
        table_setup.value_schemas(job.registry, topic.topic, _known(job.registry, ids)),
        job.options,
    )
    result.schema_changes = evolved.applied
    table = table.refresh()
    v3 = table.metadata.format_version >= 3
    if job.upsert is None and not v3:
        heads, moved, written = _append_with_pyiceberg(
            job, table_setup.ensure_base_snapshot(table), dlq_chunks
        )
    else:
        heads, moved, written = _write_with_spark(job, table, spark, dlq_chunks)
    result.moved = sum(len(v) for v in moved.values())
    result.moved_offsets = {str(p): sorted(offsets) for p, offsets in sorted(written.items())}
    unavailable = (
        f"{result.unavailable} stay: retention deleted their segments, so an upsert table cannot tell "
        "whether a later record replaced them"
        if result.unavailable
        else ""
    )
    if not moved:
        result.message = "; ".join(
            m
            for m in (
                f"none of the {result.still_bad} records retried decode yet"
                if result.still_bad
                else "",
                unavailable,
            )
            if m
        )
        return result

    branch = branch_name(result.round_id)
    properties = _properties(result, result.moved)
    dlq_table = table_setup.ensure_base_snapshot(dlq_table.refresh())
    dlq_parent = main_snapshot_id(dlq_table)
    assert dlq_parent is not None
    create_branch(job.catalog, dlq_table, branch, dlq_parent)

    dlq_properties = {
        **properties,
        checkpoint.DLQ_MOVED: dlq_catchup.moved_property(topic.topic, moved),
    }

    def delete_moved(target: Table) -> None:
        with target.transaction() as tx:
            tx.delete(
                dlq_catchup.dlq_filter(topic.topic, moved),
                snapshot_properties=dlq_properties,
                branch=branch,
            )

    dlq_table = write_to_branch(dlq_table.refresh(), delete_moved)
    dlq_head = BranchHead(
        dlq_table,
        branch,
        dlq_parent,
        round_snapshot(dlq_table, branch, dlq_parent),
        tag_checkpoint=False,
    )
    if multi_table or not heads:
        publish(job.catalog, [*heads, dlq_head], job.catalog_spec.uri)
    else:  # the table first (its round id says the rows are in), then the DLQ (dlq_catchup)
        try:
            publish(job.catalog, heads)
        except LostRace:
            drop_branch(job.catalog, dlq_table.refresh(), branch)
            raise
        commit_round._kill_point("between_commits")
        dlq_catchup.finish_reprocess(job.catalog, dlq_table.refresh(), branch)
    result.status = "moved"
    result.snapshot_id = heads[0].snapshot_id if heads else None
    result.dlq_snapshot_id = dlq_head.snapshot_id
    result.message = (
        f"moved {result.moved} records from the DLQ to {topic.namespace}.{topic.table}"
        + (
            f" ({result.superseded} already replaced by a later record of their id)"
            if result.superseded
            else ""
        )
        + (f"; {unavailable}" if unavailable else "")
        + (f"; {result.still_bad} still do not decode" if result.still_bad else "")
    )
    return result


def _append_with_pyiceberg(
    job: _Job, table: Table, chunks: list[Any]
) -> tuple[list[BranchHead], dict[int, list[int]], dict[int, list[int]]]:
    """An append table (format v2): the DLQ records that decode now, appended in the driver."""
    converter = RowConverter(
        table.schema(),
        job.registry.avro_schema,
        key_type=job.options.key_type,
        value_type=job.options.value_type,
    )
    wanted = job.wanted
    batches: list[pa.RecordBatch] = []
    moved: dict[int, list[int]] = {}
    for chunk in chunks:
        rows = converter.convert(chunk)
        failed = {e.offset for e in rows.errors}
        job.result.still_bad += sum(
            1 for o in chunk.offsets if (chunk.partition, o) in wanted and o in failed
        )
        good = [o for o in chunk.offsets if o not in failed]
        keep = pa.array([(chunk.partition, o) in wanted for o in good], pa.bool_())
        batches.append(rows.batch.filter(keep))
        moved.setdefault(chunk.partition, []).extend(
            o for o in good if (chunk.partition, o) in wanted
        )
    moved = {p: offsets for p, offsets in moved.items() if offsets}
    if not moved:
        return [], {}, {}
    branch = branch_name(job.result.round_id)
    parent = main_snapshot_id(table)
    assert parent is not None
    create_branch(job.catalog, table, branch, parent)
    rows = pa.Table.from_batches(batches, schema=converter.arrow_schema)
    with round_writers.round_branch(job.catalog, table, branch):
        round_writers.PyIcebergAppend(branch, rows=rows).write(
            table, _properties(job.result, sum(len(v) for v in moved.values()))
        )
        table = table.refresh()
        head = BranchHead(
            table, branch, parent, round_snapshot(table, branch, parent), tag_checkpoint=False
        )
    return [head], moved, moved


def _properties(result: ReprocessResult, retried_ok: int) -> dict[str, str]:
    """The snapshot summary of the table's reprocess commit (``REPROCESSED``: DLQ records that decode now)."""
    return {checkpoint.ROUND_ID: result.round_id, REPROCESSED: str(retried_ok)}


def _write_with_spark(
    job: _Job, table: Table, spark: Any, dlq_chunks: list[RecordChunk]
) -> tuple[list[BranchHead], dict[int, list[int]], dict[int, list[int]]]:
    """An upsert/CDC table, or any format v3 table (pyiceberg 0.12 writes no v3 manifests): the
    records are staged as a round's are (``round_tasks``; every column optional for a merge, the
    table's own columns for an append) and Spark's Iceberg writer appends them, or MERGEs them on
    the id columns, on the reprocess branch (``round_writers``).

    An upsert table must not take an old record over a newer one: the replay reads each
    partition from its first DLQ offset up to the table's committed offset, and a DLQ record
    is merged only if it is still the last record of its id there (``merge_round(only=...)``).
    One that a later record has replaced is taken out of the DLQ with nothing written: the
    table already holds what it would have become. An append stages just the DLQ records,
    ``dlq_chunks``, already read for the schema ids: their segments are not read twice."""
    result = job.result
    wanted, output, spark = _stage(job, table, spark, dlq_chunks)
    staged = [f.file_path for f in output.data_files]
    branch = branch_name(result.round_id)
    with round_writers.round_branch(job.catalog, table, branch, staged) as cleanup:
        if output.report.errors_dropped:  # the failures not kept would pass for records that decode
            raise RuntimeError(
                f"more than {len(output.report.errors)} of the records retried still fail; "
                "nothing moved (fix what they have in common, then run again)"
            )
        failed = {(e.partition, e.offset) for e in output.report.errors}
        result.still_bad = len(wanted & failed)
        now_good = sorted(wanted - failed)
        if not now_good:
            cleanup.remove_staged()
            return [], {}, {}
        parent = main_snapshot_id(table)
        if parent is None:
            raise RuntimeError(f"{job.topic.table} has no snapshot on main yet; nothing moved")
        spark = _spark(job, spark)
        create_branch(job.catalog, table, branch, parent)
        moved, written = _write_replay(job, table, spark, branch, staged, now_good)
        cleanup.remove_staged()
        table = table.refresh()
        if (
            not written
        ):  # every record a later one replaced (or none mergeable): only the DLQ changes
            drop_branch(job.catalog, table, branch)
            return [], _by_partition(moved), {}
        head = BranchHead(
            table, branch, parent, round_snapshot(table, branch, parent), tag_checkpoint=False
        )
    return [head], _by_partition(moved), _by_partition(written)


def _spark(job: _Job, spark: Any) -> Any:
    """``spark``, or a session started for the reprocess."""
    return (
        spark
        if spark is not None
        else spark_session(f"icefall-dlq-reprocess-{job.topic.topic}", job.args.master)
    )


def _stage(
    job: _Job, table: Table, spark: Any, dlq_chunks: list[RecordChunk]
) -> tuple[set[tuple[int, int]], round_tasks.TaskOutput, Any]:
    """The records to write staged as a round's are (an upsert table: the replay from each
    partition's first DLQ offset; else the DLQ records); the DLQ records wanted from them, the
    tasks' output and the Spark session (if the tasks started one)."""
    committed = checkpoint.read_checkpoint(table.metadata).offsets
    wanted = job.wanted
    windows: list[tuple[int, int, int]] = []
    extra = dlq_chunks
    if job.upsert is not None:
        upsert.check_columns(table.schema(), job.upsert)
        windows = [
            (p, min(offsets), max(committed.get(p, 0), max(offsets) + 1))
            for p, offsets in sorted(job.in_segments.items())
        ]
        job.result.unavailable = len(job.only_in_dlq)
        wanted -= job.only_in_dlq
        extra = []
    metadata_json = upsert.staging_metadata_json(
        table, job.result.round_id, _envelope(job), relax=job.upsert is not None
    )
    spec = TaskSpec(
        job.store_config,
        metadata_json,
        round_tasks.task_io_properties(table),
        job.options.key_type,
        job.options.value_type,
        job.registry.url,
        tuple(sorted(job.registry.known().items())),
        registry_user_info=job.registry.user_info,
    )
    ranges = job.ranges(windows)
    if extra or sum(r.byte_end - r.byte_start for r in ranges) <= job.args.in_driver_max_bytes:
        return wanted, run_in_driver(spec, ranges, extra), spark
    # a long upsert replay: Spark tasks decode and stage it, as in a large round
    spark = _spark(job, spark)
    return (
        wanted,
        run_tasks(
            spark, spec, round_plan.task_groups(ranges, spark.sparkContext.defaultParallelism)
        ),
        spark,
    )


def _envelope(job: _Job) -> str | None:
    """For ``flatten_debezium``: the Debezium envelope schema the staged rows keep whole."""
    if job.upsert is None or not job.upsert.debezium:
        return None
    schemas = table_setup.value_schemas(job.registry, job.topic.topic)
    if not schemas:
        raise RuntimeError(
            f"{job.topic.topic}: flatten_debezium needs the envelope's Avro schema in the registry"
        )
    return schemas[-1][1]


def _write_replay(
    job: _Job,
    table: Table,
    spark: Any,
    branch: str,
    staged: list[str],
    now_good: list[tuple[int, int]],
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The DLQ records that decode now (``now_good``) on the branch: MERGEd (an upsert table; those a
    later record replaced or that have no id or op are not written) or appended. The records that
    leave the DLQ and those written."""
    namespace, name = job.topic.identifier
    target = round_writers.SparkTarget(
        lambda: spark,
        lambda session: (
            f"{use_catalog(session, job.catalog_spec)}.`{namespace}`.`{name}`.`branch_{branch}`"
        ),
    )
    properties = _properties(job.result, len(now_good))
    if job.upsert is None:
        round_writers.SparkAppend(
            target,
            lambda session, t: upsert.keep_offsets(
                session, round_tasks.read_staged(session, t, staged), now_good
            ),
        ).write(table, properties)
        return now_good, now_good
    merge = round_writers.SparkMerge(target, job.upsert, job.result.round_id, staged, only=now_good)
    merge.write(table, properties)
    assert merge.outcome is not None
    job.result.still_bad += len(
        merge.outcome.bad
    )  # decodes now, but has no id or I/U/D op: it stays
    moved = sorted(set(now_good) - set(merge.outcome.bad))
    written = list(merge.outcome.applied)
    job.result.superseded = len(moved) - len(written)
    return moved, written


def _by_partition(pairs: list[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p, o in sorted(pairs):
        out.setdefault(p, []).append(o)
    return out


def _known(registry: RegistryClient, ids: set[int]) -> set[int]:
    """The ids the registry can answer now (the others stay bad)."""
    out = set()
    for schema_id in ids:
        try:
            registry.avro_schema(schema_id)
        except (
            BrokerRequestError,
            ValueError,
        ) as exc:  # an unknown id is exactly what may still be broken
            log.info("schema id %d is still unusable: %s", schema_id, exc)
        else:
            out.add(schema_id)
    return out


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="dlq_reprocess", description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", required=True)
    job_args.add_common_flags(
        parser,
        "Spark master for upsert and format v3 tables (default: spark-submit's, else local[*])",
    )
    parser.add_argument("--round-id", default=None)
    job_args.add_in_driver_max_bytes(
        parser,
        "an upsert replay of at most this many segment bytes is decoded in the driver, a "
        f"longer one by Spark tasks (default 1 GiB or ${job_args.DRIVER_MAX_BYTES_ENV}, as "
        "commit rounds)",
    )
    parser.add_argument("--result", type=Path)
    args = parser.parse_args(argv)
    log_setup.configure("INFO")
    started = time.monotonic()
    try:
        result = reprocess(args, spark)
        code = 0
    except Exception as exc:  # a clear message and a result file, as the commit round does
        log.debug("reprocess failed", exc_info=True)
        result = ReprocessResult(
            status="failed",
            topic=args.topic,
            round_id=args.round_id or "",
            message=f"{type(exc).__name__}: {exc}",
        )
        print(f"DLQ reprocess of {args.topic} failed: {result.message}", file=sys.stderr)
        code = 1
    result.seconds = round(time.monotonic() - started, 3)
    if args.result is not None:
        job_output.write_result(args.result, result.to_json())
    log.info("%s: %s", result.status, result.message)
    return code


def run(argv: list[str], spark: Any = None) -> tuple[int, dict[str, Any]]:
    """For tests: main() and the result it wrote (``spark``: a session to reuse)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "result.json"
        code = main([*argv, "--result", str(path)], spark)
        return code, json.loads(path.read_text())


if __name__ == "__main__":
    sys.exit(main())
