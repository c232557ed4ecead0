"""The exactly-once step: a round's data becomes visible on ``main`` in one conditional catalog commit.

The round writes its data to its own branch ``icefall-round-<id>``, created at
the snapshot ``main`` had when the round read its start offsets (the planned
parent, P). The data snapshot S on that branch carries the new offsets in its
summary. Then one REST commit, with no retry, asks the catalog to

- require: the table is the same table (uuid) and ``main`` is still P;
- update: ``main`` -> S, tag ``icefall-checkpoint`` -> S, drop the round branch.

If another writer moved ``main`` since P (a concurrent round, compaction), the
catalog refuses (409) and nothing of this round is visible; the round starts
over from the new checkpoint. Iceberg's own commit retry is never in this
path: it would re-apply the append on top of the other writer's snapshot and
commit the same offsets twice. Before asking, the round checks that S's parent
is P, so ``main`` only ever moves forward by exactly this round's data.

Branches of rounds that died before publishing are left behind; they hold no
visible data and are removed by later rounds once older than ``STALE_BRANCH_MS``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import BadRequestError, CommitFailedException, CommitStateUnknownException
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotRefUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)

from broker.checkpoint import (
    CHECKPOINT_TAG,
    MAIN,
    REPROCESSED,
    ROUND_BRANCH_PREFIX,
    summary_properties,
)
from broker.external_catalogs.nessie import NessieCatalog

log = logging.getLogger(__name__)
STALE_BRANCH_MS = 60 * 60 * 1000
BRANCH_WRITE_ATTEMPTS = 5


class LostRace(RuntimeError):
    """``main`` moved since the round planned: the round's data was not published."""


class MultiTableCommitUnsupported(RuntimeError):
    """The round must commit several tables in one transaction and the catalog has none."""


class UnexpectedBranchState(RuntimeError):
    """The round branch does not hold exactly one new snapshot on top of the planned parent."""


def _set_ref(name: str, kind: SnapshotRefType, snapshot_id: int) -> SetSnapshotRefUpdate:
    return SetSnapshotRefUpdate.model_validate(
        {"ref-name": name, "type": kind, "snapshot-id": snapshot_id}
    )


def _remove_ref(name: str) -> RemoveSnapshotRefUpdate:
    return RemoveSnapshotRefUpdate.model_validate({"ref-name": name})


def _assert_ref(name: str, snapshot_id: int | None) -> AssertRefSnapshotId:
    """``snapshot_id=None``: the ref must not exist (a table no round has written yet)."""
    return AssertRefSnapshotId.model_validate({"ref": name, "snapshot-id": snapshot_id})


def branch_name(round_id: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in round_id)
    return ROUND_BRANCH_PREFIX + safe


def main_snapshot_id(table: Table) -> int | None:
    ref = table.metadata.refs.get(MAIN)
    return ref.snapshot_id if ref is not None else None


def create_branch(catalog: Catalog, table: Table, name: str, parent: int) -> None:
    """The round branch at the planned parent, only if ``main`` is still there
    (otherwise the round planned from a stale checkpoint and must start over)."""
    requirements: tuple[TableRequirement, ...] = (
        AssertTableUUID(uuid=table.metadata.table_uuid),
        _assert_ref(MAIN, parent),
    )
    updates: tuple[TableUpdate, ...] = (_set_ref(name, SnapshotRefType.BRANCH, parent),)
    try:
        catalog.commit_table(table, requirements, updates)
    except CommitFailedException as exc:
        raise LostRace(
            f"main moved before the round could branch from snapshot {parent}: {exc}"
        ) from exc


def round_snapshot(table: Table, name: str, parent: int | None) -> int:
    """The one snapshot the round's write added on its branch (checked, not assumed)."""
    ref = table.metadata.refs.get(name)
    if ref is None:
        raise UnexpectedBranchState(f"branch {name} does not exist after the write")
    snapshot = table.metadata.snapshot_by_id(ref.snapshot_id)
    if snapshot is None or snapshot.snapshot_id == parent or snapshot.parent_snapshot_id != parent:
        raise UnexpectedBranchState(
            f"branch {name} is at snapshot {ref.snapshot_id} whose parent is "
            f"{getattr(snapshot, 'parent_snapshot_id', None)}, not the planned parent {parent}"
        )
    return snapshot.snapshot_id


def _stale_branches(table: Table, keep: str, now_ms: int) -> list[str]:
    out = []
    for name, ref in table.metadata.refs.items():
        if not name.startswith(ROUND_BRANCH_PREFIX) or name == keep:
            continue
        snapshot = table.metadata.snapshot_by_id(ref.snapshot_id)
        if REPROCESSED in summary_properties(snapshot):
            continue  # a reprocess's pending DLQ deletion: dlq_catchup.finish_reprocesses decides
        if snapshot is None or now_ms - snapshot.timestamp_ms > STALE_BRANCH_MS:
            out.append(name)
    return out


@dataclass(frozen=True)
class BranchHead:
    """A table's round branch, ready to publish: ``main`` goes from ``parent`` to ``snapshot_id``."""

    table: Table
    branch: str
    parent: int | None
    snapshot_id: int
    tag_checkpoint: bool = True


def _change(head: BranchHead) -> tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]]:
    requirements: tuple[TableRequirement, ...] = (
        AssertTableUUID(uuid=head.table.metadata.table_uuid),
        _assert_ref(MAIN, head.parent),
    )
    updates: list[TableUpdate] = [_set_ref(MAIN, SnapshotRefType.BRANCH, head.snapshot_id)]
    if head.tag_checkpoint:
        updates.append(_set_ref(CHECKPOINT_TAG, SnapshotRefType.TAG, head.snapshot_id))
    updates.append(_remove_ref(head.branch))
    updates += [
        _remove_ref(stale)
        for stale in _stale_branches(head.table, head.branch, int(time.time() * 1000))
    ]
    return requirements, tuple(updates)


def publish(catalog: Catalog, heads: list[BranchHead], catalog_url: str | None = None) -> None:
    """Fast-forward every table's ``main`` to its round snapshot in ONE catalog commit
    (a multi-table transaction when there are several), or raise ``LostRace``."""
    try:
        if len(heads) == 1:
            requirements, updates = _change(heads[0])
            catalog.commit_table(heads[0].table, requirements, updates)
        elif isinstance(catalog, NessieCatalog):  # one Nessie commit of every table
            catalog.commit_tables([(head.table, *_change(head)) for head in heads])
        else:
            if not catalog_url:  # callers check dlq_catchup.multi_table_commits first
                raise MultiTableCommitUnsupported(
                    f"this round commits {len(heads)} tables at once (the table and its DLQ) and "
                    f"catalog {catalog.name} ({type(catalog).__name__}) has no multi-table "
                    "transaction"
                )
            _commit_transaction(catalog_url, heads, str(catalog.properties.get("prefix") or ""))
    except CommitFailedException as exc:
        raise LostRace(f"main moved while the round wrote: {exc}") from exc
    except CommitStateUnknownException:
        # the catalog may or may not have applied it: the first table says which (all or none changed)
        if main_snapshot_id(heads[0].table.refresh()) != heads[0].snapshot_id:
            raise
    for head in heads:
        log.info(
            "published snapshot %d on %s (parent %s)",
            head.snapshot_id,
            head.table.name(),
            head.parent,
        )


def _commit_transaction(catalog_url: str, heads: list[BranchHead], prefix: str = "") -> None:
    """``POST /v1/{prefix}/transactions/commit`` (pyiceberg has no client for it); ``prefix``:
    what the catalog's ``/v1/config`` told pyiceberg to put after ``/v1``."""
    from spark_jobs.broker_client import BrokerRequestError, http_json

    changes = []
    for head in heads:
        requirements, updates = _change(head)
        namespace, name = head.table.name()[-2:]
        changes.append(
            {
                "identifier": {"namespace": [namespace], "name": name},
                "requirements": [r.model_dump(mode="json", by_alias=True) for r in requirements],
                "updates": [u.model_dump(mode="json", by_alias=True) for u in updates],
            }
        )
    try:
        path = (
            "/v1/" + (prefix.strip("/") + "/" if prefix.strip("/") else "") + "transactions/commit"
        )
        http_json(catalog_url.rstrip("/") + path, "POST", {"table-changes": changes})
    except BrokerRequestError as exc:
        if exc.status == 409:
            raise CommitFailedException(str(exc)) from exc
        if exc.status is None or exc.status >= 500:
            raise CommitStateUnknownException(str(exc)) from exc
        raise


def write_to_branch(
    table: Table, write: Callable[[Table], None], attempts: int = BRANCH_WRITE_ATTEMPTS
) -> Table:
    """Run a pyiceberg write on the round's own branch; the table, refreshed, after it.

    Another writer's commit to another ref (a concurrent round's branch, ``main``) moves the
    table's last sequence number, and the catalog refuses ours (409, or 400 once pyiceberg's
    own retry re-sends the stale snapshot). Nobody else writes this branch, so writing again
    on fresh metadata is safe; a refused commit changed nothing."""
    for attempt in range(attempts):
        try:
            write(table)
            return table.refresh()
        except (CommitFailedException, BadRequestError) as exc:
            if attempt == attempts - 1:
                raise
            log.info(
                "write to a round branch of %s refused (%s); again on fresh metadata",
                table.name(),
                exc,
            )
            table = table.refresh()
    raise AssertionError("unreachable")


def drop_branch(catalog: Catalog, table: Table, name: str) -> None:
    """Best effort: a round that gives up removes its branch (a later round would anyway)."""
    try:
        if name in table.metadata.refs:
            catalog.commit_table(table, (), (_remove_ref(name),))
    except Exception as exc:  # noqa: BLE001 - cleanup must not hide the round's own error
        log.warning("could not remove branch %s: %s", name, exc)
