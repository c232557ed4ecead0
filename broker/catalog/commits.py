"""Table commits: requirements checked, metadata written, pointers swapped in
one SQL transaction, so a commit of one table or of several is all or nothing.

pyiceberg's ``SqlCatalog.commit_table`` does this for one table; the REST
spec's ``transactions/commit`` needs it for several at once, so this module
runs the same steps over a list: pyiceberg's requirement checks
(``TableRequirement.validate``) and ``update_table_metadata`` (through
``MetastoreCatalog._update_and_stage_table``), the new metadata file, then an
``UPDATE ... WHERE metadata_location = <the one the requirements were checked
against>`` per table inside one transaction. Two writers can never both win:
the second one's compare-and-swap matches no row. A swap that loses to a
writer outside this process (several brokers on one Postgres) is retried from
a fresh load, like Iceberg's own REST server does; a requirement that fails is
final (409 CommitFailedException). The HTTP layer also serialises commits per
table with an asyncio lock, so inside one broker swaps do not even collide.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import StagedTable, Table
from pyiceberg.table.update import AssertCreate, TableRequirement, TableUpdate
from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from broker import metadata_cache
from broker.catalog import updates
from broker.catalog.errors import CatalogError
from broker.catalog.store import (
    CatalogStore,
    Identifier,
    LoadedTable,
    sql_identifier,
    sql_namespace,
)

log = logging.getLogger(__name__)

ATTEMPTS = 3  # swaps lost to another process before giving up with CommitFailedException


@dataclass(frozen=True)
class TableChange:
    identifier: Identifier
    requirements: tuple[TableRequirement, ...]
    updates: tuple[TableUpdate, ...]


class CommitStateUnknown(CatalogError):
    status, type = 500, "CommitStateUnknownException"


class _LostSwap(Exception):
    """Another writer moved a table's pointer after it was loaded."""


@dataclass(frozen=True)
class _Staged:
    identifier: Identifier
    current: Table | None
    new: StagedTable

    @property
    def changed(self) -> bool:
        return self.current is None or self.new.metadata != self.current.metadata

    def result(self) -> LoadedTable:
        if self.current is None or self.changed:
            return LoadedTable(self.new.metadata_location, self.new.metadata)
        return LoadedTable(self.current.metadata_location, self.current.metadata)


def commit(store: CatalogStore, changes: list[TableChange]) -> list[LoadedTable]:
    """Apply every change or none; one response per change, in order."""
    for attempt in range(1, ATTEMPTS + 1):
        staged = [_stage(store, change) for change in changes]
        written: list[_Staged] = []
        try:
            for item in staged:
                if item.changed:
                    store.sql._write_metadata(
                        item.new.metadata, item.new.io, item.new.metadata_location
                    )
                    written.append(item)
            _swap(store, staged)
        except CommitStateUnknown:
            raise  # the files may be live now: leave them
        except _LostSwap:
            _delete(written)
            log.info(
                "catalog commit lost a swap to another writer (attempt %d of %d)", attempt, ATTEMPTS
            )
            continue
        except BaseException:
            _delete(written)
            raise
        return [item.result() for item in staged]
    raise CommitFailedException(f"tables changed concurrently {ATTEMPTS} times; retry the commit")


def _stage(store: CatalogStore, change: TableChange) -> _Staged:
    """Check the requirements against the current metadata and build the new one (nothing written)."""
    ident = change.identifier
    try:
        current: Table | None = store.sql.load_table(sql_identifier(ident))
    except NoSuchTableError:
        current = None
    if current is None:
        if not any(isinstance(r, AssertCreate) for r in change.requirements):
            raise NoSuchTableError(f"Table does not exist: {'.'.join(ident)}")
        if not store.namespace_exists(ident[:-1]):
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(ident[:-1])}")
        store.check_no_view(ident)
    new = store.sql._update_and_stage_table(
        current, ident, change.requirements, updates.server_updates(change.updates)
    )
    store.warehouse.check(new.metadata.location)
    store.warehouse.check(new.metadata_location, "metadata location")
    return _Staged(ident, current, new)


def _swap(store: CatalogStore, staged: list[_Staged]) -> None:
    """Move every table's pointer in one transaction; unchanged tables are
    swapped with themselves so their requirements still hold at commit time."""
    with Session(store.sql.engine) as session:
        for item in staged:
            if item.current is None:
                namespace = Catalog.namespace_to_string(sql_namespace(item.identifier[:-1]))
                row = store.sql._create_table_row(
                    namespace, item.identifier[-1], item.new.metadata_location
                )
                try:
                    session.execute(insert(IcebergTables).values(**row))
                except (
                    IntegrityError
                ) as exc:  # created concurrently: assert-create fails on the retry
                    raise _LostSwap from exc
                continue
            new_location = (
                item.new.metadata_location if item.changed else item.current.metadata_location
            )
            result = session.execute(
                update(IcebergTables)
                .where(
                    *store.row_filter(item.identifier),
                    IcebergTables.metadata_location == item.current.metadata_location,
                )
                .values(
                    metadata_location=new_location,
                    previous_metadata_location=item.current.metadata_location
                    if item.changed
                    else IcebergTables.previous_metadata_location,
                )
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                raise _LostSwap
        try:
            session.commit()
        except Exception as exc:
            raise CommitStateUnknown(
                f"the catalog database failed while committing: {exc}"
            ) from exc


def _delete(staged: list[_Staged]) -> None:
    for item in staged:
        metadata_cache.forget(item.new.metadata_location)
        try:
            item.new.io.delete(item.new.metadata_location)
        except Exception:  # noqa: BLE001 - an orphan metadata file is harmless
            log.warning("could not delete unused metadata file %s", item.new.metadata_location)
