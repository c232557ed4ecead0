"""The catalog's state: pyiceberg's SQL catalog (SQLite file or Postgres) plus
the warehouse policy. Every method blocks (SQL, metadata files), so the HTTP
layer calls them from a thread pool and the broker's event loop stays free.

pyiceberg does the Iceberg work (metadata building, files, SQL rows); this
class adds what a server needs on top: checks that turn bad input into 4xx
instead of half-done work (locations, unreadable metadata, races on create).

Namespace levels may contain ".", which pyiceberg's SQL catalog cannot keep
apart from its own level separator (it stores ``("a", "b")`` as ``"a.b"``).
So a "." inside a level is stored as 0x1F, the REST separator, which no level
can contain: ``("a.b",)`` is the row ``"a\x1fb"``. Namespaces without such
dots are stored exactly as before. Their tables' default location writes each
inner "." twice (``warehouse/a..b/t``), a directory no dot-free namespace maps
to, since levels neither start nor end with ".".
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from sqlalchemy import ColumnElement, event, select, update
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session

from broker import iceberg_json, metadata_cache
from broker.catalog.errors import BadRequest
from broker.catalog.locations import Warehouse, check_readable
from broker.catalog.models import CreateTableRequest
from broker.contracts import with_default_io

log = logging.getLogger(__name__)

CATALOG_NAME = "icefall"  # the catalog_name column of pyiceberg's SQL tables
VIEW_TYPE = "VIEW"  # iceberg_tables.iceberg_type of a view's row (broker/catalog/view_store.py)
# pyiceberg's row for a namespace without properties; kept on every namespace, hidden from clients
EXISTS_MARKER = {"exists": "true"}

Identifier = tuple[str, ...]

# what Iceberg's Java catalogs give every new table unless the create request sets it
NEW_TABLE_DEFAULTS = {TableProperties.PARQUET_COMPRESSION: "zstd"}
LEVEL_DOT = "\x1f"  # how a "." inside a namespace level is stored (see the module docstring)


def sql_namespace(namespace: Identifier) -> Identifier:
    """A namespace as pyiceberg's SQL catalog stores it."""
    return tuple(level.replace(".", LEVEL_DOT) for level in namespace)


def api_namespace(stored: Identifier) -> Identifier:
    """A namespace read from the SQL catalog's rows, as clients name it."""
    return tuple(level.replace(LEVEL_DOT, ".") for level in stored)


def sql_identifier(identifier: Identifier) -> Identifier:
    """A table identifier for the SQL catalog (table names are stored as they are)."""
    return (*sql_namespace(identifier[:-1]), identifier[-1])


def namespace_directory(namespace: Identifier) -> str:
    """The directory under the warehouse of a namespace's tables: pyiceberg's levels
    joined by ".", with a "." inside a level written twice."""
    return ".".join(level.replace(".", "..") for level in namespace)


@dataclass(frozen=True)
class LoadedTable:
    """A table's metadata and where it is stored (None for a staged create)."""

    metadata_location: str | None
    metadata: TableMetadata


class _SqlCatalog(SqlCatalog):
    """pyiceberg's SQL catalog, writing metadata files of every format version (``v3``) and
    reading each metadata file once (``broker.metadata_cache``: a load-table or a commit
    fetches no table's current metadata the broker has read or written, while it is cached)."""

    @staticmethod
    def _write_metadata(metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:
        metadata_cache.write(metadata, io, metadata_path)

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        """pyiceberg's, with the metadata from the cache (the row's checks are the same)."""
        location, namespace, name = (
            orm_table.metadata_location,
            orm_table.table_namespace,
            orm_table.table_name,
        )
        if not (location and namespace and name):
            return super()._convert_orm_to_iceberg(orm_table)  # its NoSuchTableError, named
        metadata = metadata_cache.read(load_file_io(self.properties, location), location)
        return Table(
            identifier=Catalog.identifier_to_tuple(namespace) + (name,),
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(metadata.properties, location),
            catalog=self,
        )

    def create_tables(self) -> None:
        """The catalog's tables, made by whichever broker sharing the database gets there first:
        brokers of a cluster start together, and the ones that lose the race to ``CREATE TABLE``
        (a duplicate key or relation error) find the winner's tables when they look again
        (``create_all`` skips tables that exist)."""
        for attempt in range(1, 6):
            try:
                super().create_tables()
            except (IntegrityError, ProgrammingError, OperationalError) as exc:
                if attempt == 5:
                    raise
                log.info("catalog tables being made by another broker (%s); looking again", exc)
                time.sleep(0.1 * attempt)
            else:
                return


class CatalogStore:
    def __init__(
        self, uri: str, warehouse: str, io_properties: dict[str, str] | None = None
    ) -> None:
        self.warehouse = Warehouse(warehouse)
        # schema v1 (iceberg_tables.iceberg_type, for views): pyiceberg adds the column to a
        # database created without it
        self.sql = _SqlCatalog(
            CATALOG_NAME,
            uri=uri,
            warehouse=self.warehouse.root,
            schema_version="v1",
            **with_default_io(io_properties or {}),
        )
        if self.sql.engine.dialect.name == "sqlite":
            # readers do not wait for the writer; a writer waits up to 10 s for another
            event.listen(self.sql.engine, "connect", _sqlite_pragmas)
            self.sql.engine.dispose()

    def close(self) -> None:
        self.sql.close()

    # ------------------------------------------------------------ namespaces

    def list_namespaces(self, parent: Identifier) -> list[Identifier]:
        return sorted(api_namespace(ns) for ns in self.sql.list_namespaces(sql_namespace(parent)))

    def create_namespace(self, namespace: Identifier, properties: dict[str, str]) -> dict[str, str]:
        try:
            self.sql.create_namespace(sql_namespace(namespace), {**properties, **EXISTS_MARKER})
        except IntegrityError as exc:  # created concurrently between pyiceberg's check and insert
            raise NamespaceAlreadyExistsError(
                f"Namespace {'.'.join(namespace)} already exists"
            ) from exc
        return self.load_namespace(namespace)

    def load_namespace(self, namespace: Identifier) -> dict[str, str]:
        properties = self.sql.load_namespace_properties(sql_namespace(namespace))
        return {k: v for k, v in properties.items() if k not in EXISTS_MARKER}

    def namespace_exists(self, namespace: Identifier) -> bool:
        return self.sql.namespace_exists(sql_namespace(namespace))

    def drop_namespace(self, namespace: Identifier) -> None:
        stored = sql_namespace(namespace)
        if self.sql.namespace_exists(stored) and self.sql.list_namespaces(stored):
            raise NamespaceNotEmptyError(f"Namespace {'.'.join(namespace)} has child namespaces")
        if self._has_views(namespace):  # pyiceberg counts only the tables
            raise NamespaceNotEmptyError(f"Namespace {'.'.join(namespace)} has views")
        self.sql.drop_namespace(stored)

    def _has_views(self, namespace: Identifier) -> bool:
        stmt = select(IcebergTables.table_name).where(
            IcebergTables.catalog_name == CATALOG_NAME,
            IcebergTables.table_namespace == Catalog.namespace_to_string(sql_namespace(namespace)),
            IcebergTables.iceberg_type == VIEW_TYPE,
        )
        with Session(self.sql.engine) as session:
            return session.scalar(stmt.limit(1)) is not None

    def update_namespace(
        self, namespace: Identifier, removals: set[str], updates: dict[str, str]
    ) -> dict[str, list[str]]:
        # the marker is rewritten every time: a namespace left without rows would cease to exist
        summary = self.sql.update_namespace_properties(
            sql_namespace(namespace), removals, {**updates, **EXISTS_MARKER}
        )
        return {
            "updated": sorted(set(summary.updated) - EXISTS_MARKER.keys()),
            "removed": sorted(summary.removed),
            "missing": sorted(summary.missing),
        }

    # ------------------------------------------------------------ tables

    def list_tables(self, namespace: Identifier) -> list[Identifier]:
        return sorted(
            (*api_namespace(ident[:-1]), ident[-1])
            for ident in self.sql.list_tables(sql_namespace(namespace))
        )

    def current_location(self, identifier: Identifier) -> str | None:
        """The table's metadata location from its SQL row alone (no file read), or None."""
        stmt = select(IcebergTables.metadata_location).where(*self.row_filter(identifier))
        with Session(self.sql.engine) as session:
            return session.scalar(stmt)

    def name_filter(self, identifier: Identifier) -> list[ColumnElement[bool]]:
        """The WHERE clause selecting the row of a name in pyiceberg's iceberg_tables,
        a table's or a view's."""
        return [
            IcebergTables.catalog_name == CATALOG_NAME,
            IcebergTables.table_namespace
            == Catalog.namespace_to_string(sql_namespace(identifier[:-1])),
            IcebergTables.table_name == identifier[-1],
        ]

    def row_filter(self, identifier: Identifier) -> list[ColumnElement[bool]]:
        """The WHERE clause selecting a table's row in pyiceberg's iceberg_tables."""
        clauses = self.name_filter(identifier)
        if (type_filter := self.sql._iceberg_type_filter()) is not None:
            clauses.append(type_filter)
        return clauses

    def existing_kind(self, identifier: Identifier) -> str | None:
        """ "TABLE" or "VIEW" when a table or a view has the name, else None."""
        stmt = select(IcebergTables.iceberg_type).where(*self.name_filter(identifier))
        with Session(self.sql.engine) as session:
            found = session.execute(stmt).first()
        if found is None:
            return None
        return VIEW_TYPE if found[0] == VIEW_TYPE else "TABLE"

    def check_no_view(self, identifier: Identifier) -> None:
        if self.existing_kind(identifier) == VIEW_TYPE:
            raise TableAlreadyExistsError(f"A view named {'.'.join(identifier)} already exists")

    def load_table(self, identifier: Identifier) -> LoadedTable:
        table = self.sql.load_table(sql_identifier(identifier))
        return LoadedTable(table.metadata_location, table.metadata)

    def create_table(self, identifier: Identifier, request: CreateTableRequest) -> LoadedTable:
        """Create the table, or with ``stage-create`` only build its first metadata
        (nothing is written; the client commits it with ``assert-create``)."""
        namespace, name = identifier[:-1], identifier[-1]
        if not self.namespace_exists(namespace):
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(namespace)}")
        if self.current_location(identifier) is not None:
            raise TableAlreadyExistsError(f"Table {'.'.join(identifier)} already exists")
        self.check_no_view(identifier)
        location = (request.location or self.default_location(namespace, name)).rstrip("/")
        self.warehouse.check(location)
        properties = {**NEW_TABLE_DEFAULTS, **request.properties}
        metadata_location = load_location_provider(
            location, properties
        ).new_table_metadata_file_location()
        self.warehouse.check(metadata_location, "metadata location")
        if properties.get(TableProperties.FORMAT_VERSION, "2") not in ("1", "2", "3"):
            raise BadRequest(
                f"unsupported format-version {properties[TableProperties.FORMAT_VERSION]!r}"
            )
        spec = request.partition_spec or UNPARTITIONED_PARTITION_SPEC
        order = request.write_order or UNSORTED_SORT_ORDER
        if request.stage_create:
            metadata = new_table_metadata(request.table_schema, spec, order, location, properties)
            return LoadedTable(None, iceberg_json.with_row_lineage(metadata))
        table = self.sql.create_table(
            sql_identifier(identifier), request.table_schema, location, spec, order, properties
        )
        return LoadedTable(table.metadata_location, table.metadata)

    def default_location(self, namespace: Identifier, name: str) -> str:
        """pyiceberg's rule: under the namespace's ``location`` if it has one, else
        ``warehouse/<namespace>/<table>``."""
        base = self.load_namespace(namespace).get("location")
        if base:
            return f"{base.rstrip('/')}/{name}"
        return f"{self.warehouse.root}/{namespace_directory(namespace)}/{name}"

    def drop_table(self, identifier: Identifier, purge: bool) -> None:
        if purge:
            self.sql.purge_table(sql_identifier(identifier))
        else:
            self.sql.drop_table(sql_identifier(identifier))

    def rename_table(self, source: Identifier, destination: Identifier) -> None:
        if self.current_location(source) is None:
            raise NoSuchTableError(f"Table does not exist: {'.'.join(source)}")
        if not self.namespace_exists(destination[:-1]):
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(destination[:-1])}")
        if self.current_location(destination) is not None:
            raise TableAlreadyExistsError(f"Table {'.'.join(destination)} already exists")
        self.check_no_view(destination)
        self.sql.rename_table(sql_identifier(source), sql_identifier(destination))

    def register_table(
        self, identifier: Identifier, metadata_location: str, overwrite: bool
    ) -> LoadedTable:
        """Point the catalog at an existing metadata file, read first so a bad
        location is a 400 and never leaves a row behind."""
        check_readable(metadata_location)
        if not self.namespace_exists(identifier[:-1]):
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(identifier[:-1])}")
        self.check_no_view(identifier)
        try:
            io = load_file_io(self.sql.properties, metadata_location)
            metadata = FromInputFile.table_metadata(io.new_input(metadata_location))
        except Exception as exc:  # whatever the FileIO raises, the request is at fault
            raise BadRequest(
                f"cannot read table metadata at {metadata_location!r}: {type(exc).__name__}"
            ) from exc
        # what the file holds now, whatever was cached for the location (a file the user
        # wrote again at a location used before): the one path where that can happen
        metadata_cache.remember(metadata_location, metadata)
        if self.current_location(identifier) is None:
            self.sql.register_table(sql_identifier(identifier), metadata_location)
        elif overwrite:
            with Session(self.sql.engine) as session:
                session.execute(
                    update(IcebergTables)
                    .where(*self.row_filter(identifier))
                    .values(metadata_location=metadata_location, previous_metadata_location=None)
                )
                session.commit()
        else:
            raise TableAlreadyExistsError(f"Table {'.'.join(identifier)} already exists")
        return LoadedTable(metadata_location, metadata)


def _sqlite_pragmas(dbapi_connection: object, _record: object) -> None:
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.close()
