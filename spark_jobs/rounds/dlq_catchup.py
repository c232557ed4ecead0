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
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table

from broker import checkpoint
from broker.contracts import CatalogSpec
from spark_jobs.rounds.publish import (
    BranchHead,
    LostRace,
    branch_name,
    drop_branch,
    main_snapshot_id,
    publish,
)

log = logging.getLogger(__name__)
DLQ_ROWS = "icefall.dlq-rows"
TRANSACTIONS_ENDPOINT = "POST /v1/{prefix}/transactions/commit"
CATCH_UP_ATTEMPTS = 5


class DlqBehind(RuntimeError):
    """The table holds a round whose DLQ rows are not in the DLQ and cannot be found again."""


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


def _has_round(table: Table, round_id: str) -> bool | None:
    """Whether a snapshot on ``main``'s ancestry was written by the round ``round_id``; None when
    the ancestry ends in expired snapshots before telling."""
    snapshot_id = main_snapshot_id(table)
    while snapshot_id is not None:
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
        if snapshot is None:
            return None
        if checkpoint.summary_properties(snapshot).get(checkpoint.ROUND_ID) == round_id:
            return True
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
            if staged.parent_snapshot_id == main_snapshot_id(dlq):
                publish(
                    catalog,
                    [BranchHead(dlq, branch, staged.parent_snapshot_id, staged.snapshot_id, False)],
                )
            else:
                _append_again(catalog, dlq, staged.snapshot_id, found.round_id, branch)
        except (LostRace, CommitFailedException) as exc:
            log.info("catching up %s lost a race (%s); again", dlq.name(), exc)
            dlq = dlq.refresh()
            continue
        log.info("committed %d DLQ rows of round %s to %s", expected, found.round_id, dlq.name())
        return expected
    raise LostRace(f"other writers kept moving the main of {'.'.join(dlq_identifier)}")


def _append_again(
    catalog: Catalog, dlq: Table, snapshot_id: int, round_id: str, branch: str
) -> None:
    """``main`` moved since the round branched (a DLQ reprocess): the round's rows on top of it,
    in one commit that requires ``main`` where it was (pyiceberg's append asserts the ref)."""
    equal: Any = EqualTo  # its pydantic signature hides the (term, literal) constructor from mypy
    this_round = equal("round_id", round_id)
    rows = dlq.scan(row_filter=this_round, snapshot_id=snapshot_id).to_arrow()
    staged = dlq.metadata.snapshot_by_id(snapshot_id)
    assert staged is not None
    properties = {
        k: v
        for k, v in checkpoint.summary_properties(staged).items()
        if k in (checkpoint.ROUND_ID, checkpoint.OFFSETS)
    }
    dlq.append(rows, snapshot_properties=properties)
    drop_branch(catalog, dlq.refresh(), branch)


def _lost(round_id: str, dlq: tuple[str, str], rows: int, why: str) -> str:
    return (
        f"the table holds round {round_id}, whose {rows} DLQ rows are not in "
        f"{'.'.join(dlq)} and cannot be found again ({why})"
    )
