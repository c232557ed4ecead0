"""Views in the catalog database: rows of pyiceberg's ``iceberg_tables`` with
``iceberg_type = 'VIEW'``, each pointing at a view metadata file (the spec's
ViewMetadata JSON) under the warehouse, as a table's row points at its
table metadata.

That is how Iceberg's Java JdbcCatalog keeps views (its schema v1, which
pyiceberg 0.12's SqlCatalog creates and whose view rows it already leaves out
of every table lookup), so a Java JdbcCatalog on the same database sees the
same views, and a table and a view never share a name: the row's primary key
is (catalog, namespace, name). A create writes ``00000-<uuid>.metadata.json``
under ``<location>/metadata`` (or ``write.metadata.path``), then inserts the
row; a replace writes the next version's file and moves the row's pointer
with a compare-and-swap, retried from a fresh load when a writer outside this
process won, as table commits are (broker/catalog/commits.py). A drop removes
the row only: a view has no data, and its metadata files stay, as with Java's
catalogs. Every function blocks (SQL, files): the HTTP layer runs them in its
thread pool.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchNamespaceError,
    NoSuchViewError,
    ViewAlreadyExistsError,
)
from pyiceberg.io import load_file_io
from pyiceberg.serializers import Compressor
from pyiceberg.view.metadata import ViewMetadata
from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from broker.catalog import views
from broker.catalog.errors import BadRequest
from broker.catalog.locations import check_readable
from broker.catalog.models import CreateViewRequest
from broker.catalog.store import CATALOG_NAME, VIEW_TYPE, CatalogStore, Identifier, sql_namespace

log = logging.getLogger(__name__)

ATTEMPTS = 3  # swaps lost to another process before giving up with CommitFailedException
METADATA_PATH = "write.metadata.path"


@dataclass(frozen=True)
class LoadedView:
    metadata_location: str
    metadata: ViewMetadata


def _name(identifier: Identifier) -> str:
    return ".".join(identifier)


def current_location(store: CatalogStore, identifier: Identifier) -> str | None:
    """The view's metadata location from its SQL row, or None when there is no such view."""
    stmt = select(IcebergTables.metadata_location).where(
        *store.name_filter(identifier), IcebergTables.iceberg_type == VIEW_TYPE
    )
    with Session(store.sql.engine) as session:
        return session.scalar(stmt)


def list_views(store: CatalogStore, namespace: Identifier) -> list[Identifier]:
    if not store.namespace_exists(namespace):
        raise NoSuchNamespaceError(f"Namespace does not exist: {_name(namespace)}")
    stmt = select(IcebergTables.table_name).where(
        IcebergTables.catalog_name == CATALOG_NAME,
        IcebergTables.table_namespace == Catalog.namespace_to_string(sql_namespace(namespace)),
        IcebergTables.iceberg_type == VIEW_TYPE,
    )
    with Session(store.sql.engine) as session:
        return sorted((*namespace, name) for name in session.scalars(stmt))


def load(store: CatalogStore, identifier: Identifier) -> LoadedView:
    location = current_location(store, identifier)
    if location is None:
        raise NoSuchViewError(f"View does not exist: {_name(identifier)}")
    return LoadedView(location, _read(store, location))


def create(store: CatalogStore, identifier: Identifier, request: CreateViewRequest) -> LoadedView:
    namespace, name = identifier[:-1], identifier[-1]
    _check_free(store, identifier)
    location = (request.location or store.default_location(namespace, name)).rstrip("/")
    store.warehouse.check(location, "view location")
    metadata = views.new_view(
        request.view_schema, request.view_version, location, request.properties
    )
    metadata_location = _new_metadata_location(store, metadata, 0)
    _write(store, metadata, metadata_location)
    try:
        _insert(store, identifier, metadata_location)
    except BaseException:
        _delete(store, metadata_location)
        raise
    return LoadedView(metadata_location, metadata)


def register(store: CatalogStore, identifier: Identifier, metadata_location: str) -> LoadedView:
    """Point the catalog at an existing view metadata file, read first so a bad location
    is a 400 and never leaves a row behind."""
    check_readable(metadata_location)
    _check_free(store, identifier)
    try:
        metadata = _read(store, metadata_location)
    except Exception as exc:  # whatever the FileIO or the parser raises, the request is at fault
        raise BadRequest(
            f"cannot read view metadata at {metadata_location!r}: {type(exc).__name__}"
        ) from exc
    _insert(store, identifier, metadata_location)
    return LoadedView(metadata_location, metadata)


def commit(
    store: CatalogStore,
    identifier: Identifier,
    requirements: list[views.AssertViewUUID],
    updates: list[views.ViewUpdate],
) -> LoadedView:
    """Replace the view's metadata with the updates applied (nothing is written when they
    change nothing)."""
    for attempt in range(1, ATTEMPTS + 1):
        current = load(store, identifier)
        metadata = views.updated_view(current.metadata, requirements, updates)
        if metadata == current.metadata:
            return current
        store.warehouse.check(metadata.location, "view location")
        version = store.sql._parse_metadata_version(current.metadata_location) + 1
        metadata_location = _new_metadata_location(store, metadata, version)
        _write(store, metadata, metadata_location)
        try:
            swapped = _swap(store, identifier, current.metadata_location, metadata_location)
        except BaseException:
            _delete(store, metadata_location)
            raise
        if swapped:
            return LoadedView(metadata_location, metadata)
        _delete(store, metadata_location)
        log.info("view commit lost a swap to another writer (attempt %d of %d)", attempt, ATTEMPTS)
    raise CommitFailedException(f"view changed concurrently {ATTEMPTS} times; retry the commit")


def drop(store: CatalogStore, identifier: Identifier) -> None:
    stmt = delete(IcebergTables).where(
        *store.name_filter(identifier), IcebergTables.iceberg_type == VIEW_TYPE
    )
    with Session(store.sql.engine) as session:
        deleted = session.execute(stmt).rowcount  # type: ignore[attr-defined]
        session.commit()
    if deleted != 1:
        raise NoSuchViewError(f"View does not exist: {_name(identifier)}")


def rename(store: CatalogStore, source: Identifier, destination: Identifier) -> None:
    if current_location(store, source) is None:
        raise NoSuchViewError(f"View does not exist: {_name(source)}")
    _check_free(store, destination)
    stmt = (
        update(IcebergTables)
        .where(*store.name_filter(source), IcebergTables.iceberg_type == VIEW_TYPE)
        .values(
            table_namespace=Catalog.namespace_to_string(sql_namespace(destination[:-1])),
            table_name=destination[-1],
        )
    )
    with Session(store.sql.engine) as session:
        try:
            moved = session.execute(stmt).rowcount  # type: ignore[attr-defined]
            session.commit()
        except IntegrityError as exc:  # the name was taken concurrently
            raise ViewAlreadyExistsError(f"{_name(destination)} already exists") from exc
    if moved != 1:
        raise NoSuchViewError(f"View does not exist: {_name(source)}")


# ------------------------------------------------------------ rows and files


def _check_free(store: CatalogStore, identifier: Identifier) -> None:
    """The namespace exists and no table or view has the name."""
    if not store.namespace_exists(identifier[:-1]):
        raise NoSuchNamespaceError(f"Namespace does not exist: {_name(identifier[:-1])}")
    if (kind := store.existing_kind(identifier)) is not None:
        raise ViewAlreadyExistsError(f"A {kind.lower()} named {_name(identifier)} already exists")


def _insert(store: CatalogStore, identifier: Identifier, metadata_location: str) -> None:
    row = {
        "catalog_name": CATALOG_NAME,
        "table_namespace": Catalog.namespace_to_string(sql_namespace(identifier[:-1])),
        "table_name": identifier[-1],
        "metadata_location": metadata_location,
        "previous_metadata_location": None,
        "iceberg_type": VIEW_TYPE,
    }
    with Session(store.sql.engine) as session:
        try:
            session.execute(insert(IcebergTables).values(**row))
            session.commit()
        except IntegrityError as exc:  # created concurrently (another broker on the database)
            raise ViewAlreadyExistsError(f"{_name(identifier)} already exists") from exc


def _swap(store: CatalogStore, identifier: Identifier, expected: str, new: str) -> bool:
    """Move the row's pointer from ``expected`` to ``new``; False when it moved meanwhile."""
    stmt = (
        update(IcebergTables)
        .where(
            *store.name_filter(identifier),
            IcebergTables.iceberg_type == VIEW_TYPE,
            IcebergTables.metadata_location == expected,
        )
        .values(metadata_location=new, previous_metadata_location=expected)
    )
    with Session(store.sql.engine) as session:
        swapped = session.execute(stmt).rowcount == 1  # type: ignore[attr-defined]
        session.commit()
    return swapped


def _new_metadata_location(store: CatalogStore, metadata: ViewMetadata, version: int) -> str:
    directory = metadata.properties.get(METADATA_PATH) or f"{metadata.location}/metadata"
    location = f"{directory.rstrip('/')}/{version:05d}-{uuid.uuid4()}.metadata.json"
    return store.warehouse.check(location, "metadata location")


def _write(store: CatalogStore, metadata: ViewMetadata, location: str) -> None:
    io = load_file_io(store.sql.properties, location)
    # no does-it-exist check (a HEAD and a LIST on S3): the name is new, as a table's
    # (broker.iceberg_json.write_metadata)
    with io.new_output(location).create(overwrite=True) as out:
        out.write(metadata.model_dump_json().encode())


def _read(store: CatalogStore, location: str) -> ViewMetadata:
    """A view metadata file, plain or gzipped (``.gz.metadata.json``, as Java may write them)."""
    io = load_file_io(store.sql.properties, location)
    with io.new_input(location).open() as raw:
        data = Compressor.get_compressor(location).stream_decompressor(raw).read()
    return ViewMetadata.model_validate_json(data)


def _delete(store: CatalogStore, location: str) -> None:
    try:
        load_file_io(store.sql.properties, location).delete(location)
    except Exception:  # noqa: BLE001 - an orphan metadata file is harmless
        log.warning("could not delete unused view metadata file %s", location)
