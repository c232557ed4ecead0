"""Re-process a table topic's DLQ after a fix: the records that now decode move to the table.

After registering a missing schema, or fixing what made records undecodable,
run::

    python -m spark_jobs.dlq_reprocess --topic clicks --result /tmp/reprocess.json

It reads the DLQ rows of the topic (``<table>__dlq``), re-reads those offsets
from the segment objects (the DLQ keeps the bytes, but the segments are the
source of truth), converts them with the table's current schema (evolved for
every schema the registry now knows), and in ONE catalog transaction appends
the rows that now decode to the table and deletes their rows from the DLQ.
Records that still fail stay in the DLQ, with their old error. Running it
twice moves nothing twice: the second run no longer finds the moved rows.
The table's offsets checkpoint is not touched (these offsets were committed
by the round that sent them to the DLQ).

The DLQ holds few rows, so the driver does the work; Spark is not started.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from broker import checkpoint
from broker.config import object_store_from_env
from spark_jobs import dlq, job_output, table_setup, upsert
from spark_jobs.avro_decode import wire_schema_id
from spark_jobs.broker_client import AdminClient, BrokerRequestError, RegistryClient
from spark_jobs.round_commit import (
    BranchHead,
    branch_name,
    create_branch,
    main_snapshot_id,
    publish,
    round_snapshot,
)
from spark_jobs.rows import RowConverter
from spark_jobs.segments import SegmentRange, cached_store, ranges_from_admin, read_ranges

log = logging.getLogger("icefall.dlq_reprocess")
REPROCESSED = "icefall.dlq-reprocessed"


@dataclass
class ReprocessResult:
    status: str  # "moved", "nothing_to_move", "failed"
    topic: str
    round_id: str
    dlq_rows: int = 0
    moved: int = 0
    still_bad: int = 0
    snapshot_id: int | None = None
    dlq_snapshot_id: int | None = None
    schema_changes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    message: str = ""


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted offsets -> [start, end) runs of consecutive ones."""
    out: list[tuple[int, int]] = []
    for o in sorted(set(offsets)):
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _dlq_filter(topic: str, by_partition: dict[int, list[int]]) -> str:
    """The DLQ rows of these offsets, as a pyiceberg filter expression."""
    either = " OR ".join(f"(partition = {p} AND offset IN ({', '.join(map(str, sorted(set(offsets))))}))"
                         for p, offsets in sorted(by_partition.items()))
    return f"topic = {_literal(topic)} AND ({either})"


def reprocess(args: argparse.Namespace) -> ReprocessResult:
    admin = AdminClient(args.admin_url)
    cluster = admin.cluster()
    topic = admin.table_topic(args.topic)
    registry = RegistryClient(cluster["registry_url"])
    catalog_url = args.catalog_url or cluster["catalog_url"]
    catalog = table_setup.catalog_for(catalog_url)
    store = cached_store(object_store_from_env(cluster["object_store"]))
    options = table_setup.TableOptions.of(topic)
    if upsert.UpsertOptions.of(topic) is not None:  # appending would add rows the table's ids already have
        raise NotImplementedError(f"{topic.topic} is an upsert/CDC table topic: its DLQ records would have to be "
                                  "merged by id, which reprocess does not do yet; nothing moved")
    round_id = args.round_id or uuid.uuid4().hex
    result = ReprocessResult("nothing_to_move", topic.topic, round_id)

    dlq_ident = (topic.namespace, dlq.dlq_name(topic.table))
    if not catalog.table_exists(dlq_ident) or not catalog.table_exists(topic.identifier):
        result.message = "no DLQ table"
        return result
    dlq_table = catalog.load_table(dlq_ident)
    if catalog.load_table(topic.identifier).metadata.format_version >= 3:  # pyiceberg 0.12 appends to v2 only
        raise NotImplementedError(f"{topic.table} is a format v3 table: reprocess appends with pyiceberg, which "
                                  "writes no v3 manifests yet; nothing moved")
    bad = dlq_table.scan(row_filter=f"topic = {_literal(topic.topic)}",
                         selected_fields=("partition", "offset")).to_arrow()
    result.dlq_rows = bad.num_rows
    if not bad.num_rows:
        result.message = "the DLQ has no rows of this topic"
        return result
    by_partition: dict[int, list[int]] = {}
    for p, o in zip(bad.column("partition").to_pylist(), bad.column("offset").to_pylist(), strict=True):
        by_partition.setdefault(int(p), []).append(int(o))

    ranges: list[SegmentRange] = []
    for p, offsets in sorted(by_partition.items()):
        for start, end in _runs(offsets):
            ranges.extend(ranges_from_admin(admin.ranges(topic.topic, p, start, end)))
    chunks = list(read_ranges(store, ranges))
    ids = {i for c in chunks for i in map(wire_schema_id, c.values) if i is not None}
    table = catalog.load_table(topic.identifier)
    evolved = table_setup.evolve(table, table_setup.value_schemas(registry, topic.topic, _known(registry, ids)),
                                 options)
    result.schema_changes = evolved.applied
    table = table_setup.ensure_base_snapshot(table.refresh())
    converter = RowConverter(table.schema(), registry.avro_schema, key_type=options.key_type,
                             value_type=options.value_type)
    wanted = {(p, o) for p, offsets in by_partition.items() for o in offsets}
    batches: list[pa.RecordBatch] = []
    moved: dict[int, list[int]] = {}
    still_bad = 0
    for chunk in chunks:
        rows = converter.convert(chunk)
        failed = {e.offset for e in rows.errors}
        still_bad += sum(1 for o in chunk.offsets if (chunk.partition, o) in wanted and o in failed)
        good = [o for o in chunk.offsets if o not in failed]
        keep = pa.array([(chunk.partition, o) in wanted for o in good], pa.bool_())
        batches.append(rows.batch.filter(keep))
        moved.setdefault(chunk.partition, []).extend(o for o in good if (chunk.partition, o) in wanted)
    moved = {p: offsets for p, offsets in moved.items() if offsets}
    result.moved = sum(len(v) for v in moved.values())
    result.still_bad = still_bad
    if not moved:
        result.message = f"none of the {result.dlq_rows} DLQ records decode yet"
        return result

    branch = branch_name(round_id)
    properties = {checkpoint.ROUND_ID: round_id, REPROCESSED: str(result.moved)}
    parent = main_snapshot_id(table)
    assert parent is not None
    create_branch(catalog, table, branch, parent)
    table.refresh().append(pa.Table.from_batches(batches, schema=converter.arrow_schema),
                           snapshot_properties=properties, branch=branch)
    table = table.refresh()
    dlq_table = table_setup.ensure_base_snapshot(dlq_table.refresh())
    dlq_parent = main_snapshot_id(dlq_table)
    assert dlq_parent is not None
    create_branch(catalog, dlq_table, branch, dlq_parent)
    with dlq_table.refresh().transaction() as tx:
        tx.delete(_dlq_filter(topic.topic, moved), snapshot_properties=properties, branch=branch)
    dlq_table = dlq_table.refresh()
    heads = [BranchHead(table, branch, parent, round_snapshot(table, branch, parent), tag_checkpoint=False),
             BranchHead(dlq_table, branch, dlq_parent, round_snapshot(dlq_table, branch, dlq_parent),
                        tag_checkpoint=False)]
    publish(catalog, heads, catalog_url)
    result.status = "moved"
    result.snapshot_id, result.dlq_snapshot_id = heads[0].snapshot_id, heads[1].snapshot_id
    result.message = f"moved {result.moved} records from the DLQ to {topic.namespace}.{topic.table}" + (
        f"; {still_bad} still do not decode" if still_bad else "")
    return result


def _known(registry: RegistryClient, ids: set[int]) -> set[int]:
    """The ids the registry can answer now (the others stay bad)."""
    out = set()
    for schema_id in ids:
        try:
            registry.avro_schema(schema_id)
        except (BrokerRequestError, ValueError) as exc:  # an unknown id is exactly what may still be broken
            log.info("schema id %d is still unusable: %s", schema_id, exc)
        else:
            out.add(schema_id)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dlq_reprocess", description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--admin-url", default=os.environ.get("ICEFALL_ADMIN_URL", "http://127.0.0.1:8090"))
    parser.add_argument("--catalog-url", default=None)
    parser.add_argument("--round-id", default=None)
    parser.add_argument("--result", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    try:
        result = reprocess(args)
        code = 0
    except Exception as exc:  # a clear message and a result file, as the commit round does
        log.debug("reprocess failed", exc_info=True)
        result = ReprocessResult("failed", args.topic, args.round_id or "", message=f"{type(exc).__name__}: {exc}")
        print(f"DLQ reprocess of {args.topic} failed: {result.message}", file=sys.stderr)
        code = 1
    result.seconds = round(time.monotonic() - started, 3)
    if args.result is not None:
        job_output.write_result(args.result, asdict(result))
    log.info("%s: %s", result.status, result.message)
    return code


def run(argv: list[str]) -> tuple[int, dict[str, Any]]:
    """For tests: main() and the result it wrote."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "result.json"
        code = main([*argv, "--result", str(path)])
        return code, json.loads(path.read_text())


if __name__ == "__main__":
    sys.exit(main())
