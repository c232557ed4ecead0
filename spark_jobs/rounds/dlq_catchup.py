"""Exactly once on a catalog that commits one table at a time (Glue, S3 Tables, a REST catalog
without ``POST /v1/{prefix}/transactions/commit``).

There the round's table commit and its DLQ commit cannot be one transaction. The table commit
goes first: it is the checkpoint, so records are never committed twice. Its snapshot summary
says how many rows the round sent to the DLQ (``icefall.dlq-rows``); before that commit the DLQ
rows were already written, as one snapshot carrying ``icefall.round-id`` and ``icefall.offsets``,
on the DLQ table's round branch. The DLQ commit follows (``catch_up``): it fast-forwards the
DLQ's ``main`` to that snapshot, or, when ``main`` moved meanwhile, appends the snapshot's rows
again on top. A crash between the two commits leaves the table ahead of its DLQ and the round's
branch in place, so every round first runs ``catch_up`` again before planning: a DLQ whose
``main`` already holds the checkpoint's round id is left alone, so it runs any number of times
and appends each round's DLQ rows once.

A DLQ reprocess is the same two commits the other way round: rows go into the table and out of
the DLQ. The table commit goes first again (its snapshot carries the reprocess's round id); the
DLQ's deletion waits on a branch of the DLQ named after that round id, its snapshot marked
``icefall.dlq-reprocessed``. After the table commit ``finish_reprocess`` fast-forwards the DLQ
to that branch, or, when the DLQ's ``main`` moved meanwhile, deletes the same rows from it
again (deleting rows already gone deletes nothing). A crash between the two leaves the rows in
both tables and the branch in place; before the next round or reprocess plans,
``finish_reprocesses`` finds every such branch and finishes it when the table holds its round
id, or drops it when the table's commit never happened. So a record leaves the DLQ once and is
written to the table once, whichever step a crash interrupts.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from broker import checkpoint
from broker.checkpoint import ROUND_BRANCH_PREFIX
from broker.contracts import CatalogSpec
from spark_jobs.rounds.publish import (
    STALE_BRANCH_MS,
    BranchHead,
    LostRace,
    branch_name,
    drop_branch,
    main_snapshot_id,
    publish,
)

log = logging.getLogger(__name__)
DLQ_ROWS = "icefall.dlq-rows"
REPROCESSED = checkpoint.REPROCESSED
TRANSACTIONS_ENDPOINT = "POST /v1/{prefix}/transactions/commit"
CATCH_UP_ATTEMPTS = 5
CLOCK_SKEW_MS = 5 * 60 * 1000  # snapshot times come from the writers' clocks


class DlqBehind(RuntimeError):
    """The table holds a round whose DLQ rows are not in the DLQ and cannot be found again."""


class ReprocessUndecided(RuntimeError):
    """A reprocess's DLQ branch whose table commit can no longer be told (expired snapshots)."""


def rest_endpoints_allow_transactions(config: dict[str, object]) -> bool:
    """What a REST catalog's ``/v1/config`` answer says: without an ``endpoints`` list (servers
    older than the list) the multi-table commit is assumed, as before; with one, it must be there."""
    endpoints = config.get("endpoints")
    if not isinstance(endpoints, list):
        return True
    return TRANSACTIONS_ENDPOINT in endpoints or "POST /v1/transactions/commit" in endpoints


def multi_table_commits(spec: CatalogSpec) -> bool:
    """Whether the tables' catalog moves several tables in one commit: Nessie does (one commit
    on its branch), REST catalogs that serve ``transactions/commit`` do; Glue and S3 Tables not."""
    if spec.type == "nessie":
        return True
    if spec.type != "rest":
        return False
    from spark_jobs.broker_client import BrokerRequestError, http_json

    url = spec.uri.rstrip("/") + "/v1/config"
    if spec.warehouse and not spec.builtin:
        url += "?warehouse=" + quote(spec.warehouse, safe="")
    try:
        answer = http_json(url)
    except BrokerRequestError as exc:
        if exc.status is not None:  # e.g. 401: a catalog that wants the client's own auth
            log.warning(
                "the REST catalog at %s answered %s to GET /v1/config without credentials; "
                "assuming it serves %s (as before the endpoints list)",
                spec.uri,
                exc.status,
                TRANSACTIONS_ENDPOINT,
            )
            return True
        raise BrokerRequestError(
            f"cannot read the catalog's /v1/config at {url} "
            f"(automq.table.topic.catalog.uri): {exc}",
            exc.status,
        ) from exc
    allowed = rest_endpoints_allow_transactions(answer if isinstance(answer, dict) else {})
    if not allowed:
        log.info(
            "the REST catalog at %s lists no %s: a round commits the table, then its DLQ",
            spec.uri,
            TRANSACTIONS_ENDPOINT,
        )
    return allowed


def _has_round(table: Table, round_id: str, since_ms: int | None = None) -> bool | None:
    """Whether a snapshot on ``main``'s ancestry was written by the round ``round_id``; None when
    the ancestry ends in expired snapshots before telling. ``since_ms``: the round wrote after
    then, so the walk stops (False) at the first snapshot older than that (less clock skew)."""
    snapshot_id = main_snapshot_id(table)
    while snapshot_id is not None:
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
        if snapshot is None:
            return None
        if checkpoint.summary_properties(snapshot).get(checkpoint.ROUND_ID) == round_id:
            return True
        if since_ms is not None and snapshot.timestamp_ms < since_ms - CLOCK_SKEW_MS:
            return False
        snapshot_id = snapshot.parent_snapshot_id
    return False


def catch_up(catalog: Catalog, table: Table, dlq_identifier: tuple[str, str]) -> int:
    """The DLQ rows of the round that wrote ``table``'s checkpoint, committed to the DLQ unless it
    has them already; how many rows this call committed (0: nothing to do)."""
    found = checkpoint.read_checkpoint(table.metadata)
    if found.snapshot_id is None or found.round_id is None:
        return 0
    snapshot = table.metadata.snapshot_by_id(found.snapshot_id)
    expected = int(checkpoint.summary_properties(snapshot).get(DLQ_ROWS, "0")) if snapshot else 0
    if expected == 0:
        return 0
    try:
        dlq = catalog.load_table(dlq_identifier)
    except NoSuchTableError as exc:
        raise DlqBehind(
            _lost(found.round_id, dlq_identifier, expected, "the table is gone")
        ) from exc
    branch = branch_name(found.round_id)
    for _ in range(CATCH_UP_ATTEMPTS):
        has_round = _has_round(dlq, found.round_id)
        if has_round:
            if branch in dlq.metadata.refs:
                drop_branch(catalog, dlq, branch)
            return 0
        ref = dlq.metadata.refs.get(branch)
        staged = dlq.metadata.snapshot_by_id(ref.snapshot_id) if ref is not None else None
        if staged is None and has_round is None:
            # the branch goes only once the DLQ has the rows (or with a refused table commit,
            # which never became the checkpoint): caught up, and maintenance expired that snapshot
            return 0
        if staged is None:
            raise DlqBehind(_lost(found.round_id, dlq_identifier, expected, f"no branch {branch}"))
        try:
            _fast_forward_or(catalog, dlq, branch, staged, _append_again)
        except (LostRace, CommitFailedException) as exc:
            log.info("catching up %s lost a race (%s); again", dlq.name(), exc)
            dlq = dlq.refresh()
            continue
        log.info("committed %d DLQ rows of round %s to %s", expected, found.round_id, dlq.name())
        return expected
    raise LostRace(f"other writers kept moving the main of {'.'.join(dlq_identifier)}")


def _append_again(catalog: Catalog, dlq: Table, staged: Snapshot, branch: str) -> None:
    """``main`` moved since the round branched (a DLQ reprocess): the round's rows on top of it,
    in one commit that requires ``main`` where it was (pyiceberg's append asserts the ref)."""
    equal: Any = EqualTo  # its pydantic signature hides the (term, literal) constructor from mypy
    properties = {
        k: v
        for k, v in checkpoint.summary_properties(staged).items()
        if k in (checkpoint.ROUND_ID, checkpoint.OFFSETS)
    }
    this_round = equal("round_id", properties[checkpoint.ROUND_ID])
    rows = dlq.scan(row_filter=this_round, snapshot_id=staged.snapshot_id).to_arrow()
    dlq.append(rows, snapshot_properties=properties)
    drop_branch(catalog, dlq.refresh(), branch)


def _lost(round_id: str, dlq: tuple[str, str], rows: int, why: str) -> str:
    return (
        f"the table holds round {round_id}, whose {rows} DLQ rows are not in "
        f"{'.'.join(dlq)} and cannot be found again ({why})"
    )


def sql_literal(text: str) -> str:
    """``text`` as a string literal of pyiceberg's filter expressions."""
    return "'" + text.replace("'", "''") + "'"


def dlq_filter(topic: str, by_partition: dict[int, list[int]]) -> str:
    """The DLQ rows of these offsets, as a pyiceberg filter expression."""
    either = " OR ".join(
        f"(partition = {p} AND offset IN ({', '.join(map(str, sorted(set(offsets))))}))"
        for p, offsets in sorted(by_partition.items())
    )
    return f"topic = {sql_literal(topic)} AND ({either})"


def finish_reprocesses(catalog: Catalog, table: Table, dlq_identifier: tuple[str, str]) -> int:
    """Every DLQ deletion a reprocess left on a branch (a crash between its two commits):
    finished when ``table`` holds the reprocess's round, dropped when it does not; how many
    were finished. A branch younger than an hour whose table commit has not happened may be a
    reprocess still running: it is left alone (``publish`` drops it once it is stale)."""
    try:
        dlq = catalog.load_table(dlq_identifier)
    except NoSuchTableError:
        return 0
    finished = 0
    now_ms = int(time.time() * 1000)
    for branch, ref in list(dlq.metadata.refs.items()):
        staged = dlq.metadata.snapshot_by_id(ref.snapshot_id)
        if not branch.startswith(ROUND_BRANCH_PREFIX) or staged is None:
            continue
        properties = checkpoint.summary_properties(staged)
        round_id = properties.get(checkpoint.ROUND_ID)
        if REPROCESSED not in properties or round_id is None:
            continue  # a round's DLQ rows: catch_up's
        committed = _has_round(table, round_id, staged.timestamp_ms)
        if committed is None:
            raise ReprocessUndecided(
                f"the DLQ reprocess {round_id} left branch {branch} on {'.'.join(dlq_identifier)} "
                f"and the snapshots of {table.name()} that would tell whether it committed have "
                "expired; drop the branch once you have checked its rows are not in the table"
            )
        if committed:
            finish_reprocess(catalog, dlq, branch)
            finished += 1
        elif now_ms - staged.timestamp_ms > STALE_BRANCH_MS:
            log.info("dropping %s of %s: its reprocess never committed", branch, dlq.name())
            drop_branch(catalog, dlq, branch)
        dlq = dlq.refresh()
    return finished


def finish_reprocess(catalog: Catalog, dlq: Table, branch: str) -> None:
    """The DLQ's half of a reprocess whose table commit is done: ``main`` fast-forwarded to the
    deletion staged on ``branch``, or, when ``main`` moved since, the same rows deleted on top."""
    for _ in range(CATCH_UP_ATTEMPTS):
        ref = dlq.metadata.refs.get(branch)
        staged = dlq.metadata.snapshot_by_id(ref.snapshot_id) if ref is not None else None
        if staged is None:
            return  # another caller finished it
        try:
            _fast_forward_or(catalog, dlq, branch, staged, _delete_again)
        except (LostRace, CommitFailedException) as exc:
            log.info("finishing %s on %s lost a race (%s); again", branch, dlq.name(), exc)
            dlq = dlq.refresh()
            continue
        log.info("the DLQ deletion on %s of %s is on main", branch, dlq.name())
        return
    raise LostRace(f"other writers kept moving the main of {dlq.name()}")


Redo = Callable[[Catalog, Table, Snapshot, str], None]


def _fast_forward_or(
    catalog: Catalog, dlq: Table, branch: str, staged: Snapshot, redo: Redo
) -> None:
    """The DLQ's ``main`` fast-forwarded to the branch's ``staged`` snapshot while ``main`` is
    still its parent (one conditional commit); else ``redo`` makes the same change on top of
    ``main`` and drops the branch."""
    if staged.parent_snapshot_id == main_snapshot_id(dlq):
        publish(
            catalog, [BranchHead(dlq, branch, staged.parent_snapshot_id, staged.snapshot_id, False)]
        )
    else:
        redo(catalog, dlq, staged, branch)


def moved_property(topic: str, by_partition: dict[int, list[int]]) -> str:
    """``icefall.dlq-moved``: the topic and, per partition, the [start, end) runs of the offsets
    a reprocess takes out of the DLQ (runs: a reprocess usually moves neighbouring records)."""
    runs = {str(p): offset_runs(offsets) for p, offsets in sorted(by_partition.items())}
    return json.dumps({"topic": topic, "runs": runs}, separators=(",", ":"))


def offset_runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted offsets -> [start, end) runs of consecutive ones."""
    out: list[tuple[int, int]] = []
    for o in sorted(set(offsets)):
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out


def _moved(properties: dict[str, str]) -> tuple[str, dict[int, list[int]]]:
    moved = json.loads(properties[checkpoint.DLQ_MOVED])
    return moved["topic"], {
        int(p): [o for start, end in spans for o in range(start, end)]
        for p, spans in moved["runs"].items()
    }


def _delete_again(catalog: Catalog, dlq: Table, staged: Snapshot, branch: str) -> None:
    """The rows the staged deletion took out of the DLQ (its ``icefall.dlq-moved``), deleted
    from ``main``; the branch dropped after. Read from the summary, not by comparing the staged
    snapshot with its parent: maintenance may have expired the parent."""
    summary = checkpoint.summary_properties(staged)
    topic, by_partition = _moved(summary)
    properties = {k: v for k, v in summary.items() if k in (checkpoint.ROUND_ID, REPROCESSED)}
    with dlq.transaction() as tx:
        tx.delete(dlq_filter(topic, by_partition), snapshot_properties=properties)
    drop_branch(catalog, dlq.refresh(), branch)
