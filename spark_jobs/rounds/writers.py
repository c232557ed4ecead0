"""The write step of a round: its rows onto its branch as one snapshot, and the branch's cleanup.

A round (``commit_round``) and a DLQ reprocess (``dlq_reprocess``) both write
to a branch of their own and publish it with ``round_commit.publish``. What
they write with depends on the table and the topic, and it is one of:

- ``PyIcebergAppend``: a format v2 append table; the data files the tasks
  wrote (or, for the DLQ, an Arrow table) in pyiceberg's fast append, with no
  Spark at all;
- ``SparkAppend``: a format v3 table (pyiceberg 0.12 writes no v3 manifests)
  or a JSON round: rows (the staged files read back, or the JSON values'
  parsed rows) appended by Spark's Iceberg writer;
- ``SparkMerge``: an upsert/CDC table: the rows MERGEd on the id columns
  (``upsert.merge_round``);
- ``SparkEmpty``: an empty snapshot written by Spark, for a v3 table whose
  round has no rows (pyiceberg's is a ``PyIcebergAppend`` of no files).

Each is a ``Writer``: one ``write(table, properties)`` that adds one snapshot
carrying ``properties`` (the offsets, the round id) on the branch, and says
whether it had anything to write. ``round_writer`` picks a round's from its
facts (upsert? JSON? format v3?); a round whose writer has nothing to write
still commits an empty snapshot, so its offsets move (``OrEmpty``).

``round_branch`` is the one place that undoes a branch: on any ``Exception``
inside it, the branch is dropped and the staged files are removed, and the
error goes on. Not on other ``BaseException``s: a killed round (``kill -9``,
simulated in tests by a ``BaseException``) leaves its branch for a later round
to remove (``round_commit.STALE_BRANCH_MS``), and its staged files for
``remove_orphan_files``. Neither is visible: only ``publish`` moves ``main``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from spark_jobs.rounds import tasks as round_tasks
from spark_jobs.rounds import upsert
from spark_jobs.rounds.publish import drop_branch, write_to_branch


@dataclass
class BranchCleanup:
    """What ``round_branch`` undoes on an error: the branch, and the staged files listed here."""

    table: Table
    staged: list[str] = field(default_factory=list)

    def remove_staged(self) -> None:
        """The staged files, once written into the table (or no longer wanted)."""
        upsert.remove_staging(self.table, self.staged)
        self.staged = []


@contextlib.contextmanager
def round_branch(
    catalog: Catalog, table: Table, branch: str, staged: Sequence[str] = ()
) -> Iterator[BranchCleanup]:
    """Drop ``branch`` and remove the staged files (``staged``, and those added to the cleanup
    later) when the block raises an ``Exception``; the error is raised again."""
    cleanup = BranchCleanup(table, list(staged))
    try:
        yield cleanup
    except Exception:
        drop_branch(catalog, table.refresh(), branch)
        cleanup.remove_staged()
        raise


class Writer(Protocol):
    """How a round's rows become its snapshot: the round checks and publishes whatever it wrote
    the same way, so the table's kind changes nothing else in it."""

    def write(self, table: Table, properties: dict[str, str]) -> bool:
        """One snapshot with ``properties`` on the branch; False: nothing to write, nothing written."""


@dataclass(frozen=True)
class SparkTarget:
    """The table, or one of its branches, for Spark's Iceberg writer (the session starts on first use)."""

    session: Callable[[], Any]
    name: Callable[[Any], str]  # the session -> catalog.`namespace`.`table`[.`branch_<branch>`]


@dataclass(frozen=True)
class PyIcebergAppend:
    """``data_files`` (written by the tasks in the table's location) in one fast append, or
    ``rows`` (an Arrow table) appended by pyiceberg; no files and no rows: an empty snapshot."""

    branch: str
    data_files: Sequence[Any] = ()
    rows: Any = None

    def write(self, table: Table, properties: dict[str, str]) -> bool:
        def append(target: Table) -> None:
            if self.rows is not None:
                target.append(self.rows, snapshot_properties=properties, branch=self.branch)
                return
            with (
                target.transaction() as tx,
                tx.update_snapshot(properties, branch=self.branch).fast_append() as fast,
            ):
                for data_file in self.data_files:
                    fast.append_data_file(data_file)

        # refreshed: the metadata in hand may predate the branch, and a write against it is refused
        write_to_branch(table.refresh(), append)
        return True


@dataclass(frozen=True)
class SparkAppend:
    """``rows`` (the session and table -> a DataFrame; None: no rows) appended by Spark in one
    snapshot (nullability is the table's: staged and parsed columns are all nullable)."""

    target: SparkTarget
    rows: Callable[[Any, Table], Any] | None

    def write(self, table: Table, properties: dict[str, str]) -> bool:
        if self.rows is None:
            return False
        spark = self.target.session()
        name = self.target.name(spark)
        columns = [f"`{f.name}`" for f in table.schema().fields]
        frame = self.rows(spark, table)
        upsert.with_commit_properties(
            spark,
            properties,
            lambda: (
                frame.selectExpr(*columns)
                .writeTo(name)
                .option("check-nullability", "false")
                .append()
            ),
        )
        return True


@dataclass
class SparkMerge:
    """The staged files (or ``rows``, a DataFrame of the table's columns) MERGEd on the id
    columns in one snapshot (``upsert.merge_round``; ``only``: the DLQ's records). ``outcome``:
    what the merge did, once written."""

    target: SparkTarget
    options: upsert.UpsertOptions
    round_id: str
    staged: Sequence[str] = ()
    rows: Any = None
    check_columns: bool = (
        False  # JSON: the id columns exist only once the values' columns are inferred
    )
    only: Sequence[tuple[int, int]] | None = None
    outcome: upsert.MergeOutcome | None = None

    def write(self, table: Table, properties: dict[str, str]) -> bool:
        spark = self.target.session()
        name = self.target.name(spark)
        if self.check_columns:
            upsert.check_columns(table.schema(), self.options)
        staged = (
            round_tasks.read_staged(spark, table, self.staged)
            if self.staged and self.rows is None
            else None
        )
        self.outcome = upsert.merge_round(
            spark,
            name,
            table.schema(),
            self.options,
            staged,
            properties,
            self.round_id,
            self.rows,
            only=self.only,
        )
        return self.outcome.merged


@dataclass(frozen=True)
class SparkEmpty:
    """An empty snapshot by Spark (pyiceberg 0.12 cannot write v3 manifest lists): Iceberg's
    Spark append commits a snapshot even without files."""

    target: SparkTarget

    def write(self, table: Table, properties: dict[str, str]) -> bool:
        spark = self.target.session()
        name = self.target.name(spark)
        upsert.with_commit_properties(
            spark, properties, lambda: spark.table(name).limit(0).writeTo(name).append()
        )
        return True


@dataclass(frozen=True)
class OrEmpty:
    """``writer``, or an empty snapshot when it has nothing to write: a round whose records all
    went to the DLQ (or that staged no rows) still moves its offsets."""

    writer: Writer
    empty: Writer

    def write(self, table: Table, properties: dict[str, str]) -> bool:
        return self.writer.write(table, properties) or self.empty.write(table, properties)


@dataclass(frozen=True)
class RoundRows:
    """What a round's tasks left to write: the data files (the table's own, or staged ones) and,
    for a JSON round, the values' rows parsed on the driver (a DataFrame; None: nothing staged)."""

    data_files: Sequence[Any]
    staged: Sequence[str]
    parsed: Any = None


def round_writer(
    rows: RoundRows,
    branch: str,
    target: SparkTarget,
    round_id: str,
    *,
    options: upsert.UpsertOptions | None,
    json: bool,
    v3: bool,
) -> Writer:
    """A round's writer, from its facts: upsert (MERGE), JSON (its parsed rows by Spark), format
    v3 (everything by Spark), else the tasks' files by pyiceberg."""
    empty: Writer = SparkEmpty(target) if v3 else PyIcebergAppend(branch)
    if options is not None:
        return OrEmpty(
            SparkMerge(target, options, round_id, rows.staged, rows.parsed, check_columns=json),
            empty,
        )
    if json:
        parsed = rows.parsed
        return OrEmpty(
            SparkAppend(target, None if parsed is None else lambda spark, table: parsed), empty
        )
    if v3:
        return OrEmpty(
            SparkAppend(target, staged_rows(rows.staged) if rows.staged else None), empty
        )
    return PyIcebergAppend(branch, rows.data_files)


def staged_rows(staged: Sequence[str]) -> Callable[[Any, Table], Any]:
    """The staged files as a DataFrame, for ``SparkAppend`` (``round_tasks.read_staged``)."""
    return lambda spark, table: round_tasks.read_staged(spark, table, staged)
