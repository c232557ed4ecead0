"""A pyiceberg catalog on Project Nessie's own API (v2), because pyiceberg has none.

Nessie's Iceberg REST endpoint serves a table as its ``main`` snapshot alone (no Iceberg
branches or tags: docs/reference/nessie.md), which a round, writing on a branch and publishing
by moving ``main`` and a tag, cannot use. Iceberg's own ``NessieCatalog`` (Spark's side) keeps
the whole table metadata in files it writes and records their location in Nessie; this catalog
does the same, so both sides see the same metadata, refs included:

- a table is Nessie content of type ``ICEBERG_TABLE`` whose ``metadataLocation`` names the
  metadata file;
- a commit reads the content and the branch's hash, checks the requirements on that metadata,
  writes the new metadata file and asks Nessie for a commit *on that hash*: if another writer
  changed the table since, Nessie refuses (409) and nothing is visible (``CommitFailedException``);
- ``commit_tables`` puts several tables in one Nessie commit: all or none;
- metadata files are written by ``broker.iceberg_json``, format v3 included, as the built-in
  catalog does.

Use it with ``load_catalog(name, **{"py-catalog-impl": "broker.external_catalogs.nessie.NessieCatalog",
"uri": "http://HOST:19120/api/v2", "ref": "main", "warehouse": ...})``.
"""

from __future__ import annotations

from typing import Any

import requests
from pyiceberg.catalog import MetastoreCatalog, PropertiesUpdateSummary
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties

from broker import metadata_cache
from broker.catalog.v3 import server_updates
from broker.external_catalogs.no_views import NoViews

TIMEOUT_S = 30.0
Change = tuple[Table, tuple[TableRequirement, ...], tuple[TableUpdate, ...]]


def _response(metadata: TableMetadata, metadata_location: str) -> CommitTableResponse:
    return CommitTableResponse.model_validate(
        {"metadata": metadata, "metadata-location": metadata_location}
    )


class NessieError(RuntimeError):
    """Nessie answered with an error other than a conflict or a missing key."""


class NessieCatalog(NoViews, MetastoreCatalog):
    """Iceberg tables in Nessie at ``uri`` (its API v2), on branch ``ref`` (default ``main``)."""

    def __init__(self, name: str, **properties: str):
        super().__init__(name, **properties)
        if "uri" not in properties:
            raise ValueError(
                "a Nessie catalog needs uri: Nessie's API, e.g. http://HOST:19120/api/v2"
            )
        self.uri = properties["uri"].rstrip("/")
        self.ref = properties.get("ref", "main")
        self.session = requests.Session()

    @staticmethod
    def _write_metadata(metadata: TableMetadata, io: Any, metadata_path: str) -> None:
        """Every format version, v3 included (pyiceberg 0.12 writes up to v2)."""
        metadata_cache.write(metadata, io, metadata_path)

    # ------------------------------------------------------------------ Nessie API

    def _call(self, method: str, path: str, body: Any = None, ok404: bool = False) -> Any:
        url = self.uri + path
        try:
            response = self.session.request(method, url, json=body, timeout=TIMEOUT_S)
        except requests.RequestException as exc:
            raise NessieError(
                f"Nessie at {self.uri} (automq.table.topic.catalog.uri) did not answer "
                f"{method} {path}: {exc}"
            ) from exc
        if response.status_code == 404 and ok404:
            return None
        if response.status_code == 409:
            raise CommitFailedException(
                f"Nessie refused the commit (conflict): {response.text[:500]}"
            )
        if response.status_code >= 500:
            raise CommitStateUnknownException(
                f"Nessie: {response.status_code} {response.text[:500]}"
            )
        if response.status_code >= 400:
            raise NessieError(
                f"Nessie at {self.uri} (automq.table.topic.catalog.uri): {method} {path}: "
                f"{response.status_code} {response.text[:500]}"
            )
        return response.json() if response.content else None

    def _head(self) -> str:
        return str(self._call("GET", f"/trees/{self.ref}")["reference"]["hash"])

    @staticmethod
    def _key(identifier: Identifier) -> str:
        return ".".join(part.replace(".", "\u001d") for part in identifier)

    def _content(self, identifier: Identifier, at: str) -> dict[str, Any] | None:
        found = self._call(
            "GET", f"/trees/{self.ref}@{at}/contents/{self._key(identifier)}", ok404=True
        )
        return None if found is None else dict(found["content"])

    def _commit(self, at: str, message: str, operations: list[dict[str, Any]]) -> None:
        self._call(
            "POST",
            f"/trees/{self.ref}@{at}/history/commit",
            {"commitMeta": {"message": message}, "operations": operations},
        )

    def _entries(self) -> list[tuple[str, Identifier]]:
        answer = self._call("GET", f"/trees/{self.ref}/entries")
        return [(e["type"], tuple(e["name"]["elements"])) for e in answer.get("entries", [])]

    @staticmethod
    def _put_table(
        identifier: Identifier, content_id: str | None, location: str, metadata: TableMetadata
    ) -> dict[str, Any]:
        content: dict[str, Any] = {
            "type": "ICEBERG_TABLE",
            "metadataLocation": location,
            "snapshotId": metadata.current_snapshot_id
            if metadata.current_snapshot_id is not None
            else -1,
            "schemaId": metadata.current_schema_id,
            "specId": metadata.default_spec_id,
            "sortOrderId": metadata.default_sort_order_id,
        }
        if content_id is not None:
            content["id"] = content_id
        return {"type": "PUT", "key": {"elements": list(identifier)}, "content": content}

    # ------------------------------------------------------------------ tables

    def _table(self, identifier: Identifier, content: dict[str, Any]) -> Table:
        location = content["metadataLocation"]
        metadata = metadata_cache.read(load_file_io(self.properties, location), location)
        return Table(
            identifier, metadata, location, self._load_file_io(metadata.properties, location), self
        )

    def load_table(self, identifier: str | Identifier) -> Table:
        ident = self.identifier_to_tuple(identifier)
        content = self._content(ident, self._head())
        if content is None or content.get("type") != "ICEBERG_TABLE":
            raise NoSuchTableError(
                f"Table does not exist in Nessie ({self.ref}): {'.'.join(ident)}"
            )
        return self._table(ident, content)

    def create_table(
        self,
        identifier: str | Identifier,
        schema: Schema | Any,
        location: str | None = None,
        partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
        sort_order: SortOrder = UNSORTED_SORT_ORDER,
        properties: Properties = EMPTY_DICT,
    ) -> Table:
        staged = self._create_staged_table(
            identifier, schema, location, partition_spec, sort_order, properties
        )
        head = self._head()
        if self._content(staged.name(), head) is not None:
            raise TableAlreadyExistsError(f"Table already exists: {'.'.join(staged.name())}")
        if self._content(staged.name()[:-1], head) is None:
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(staged.name()[:-1])}")
        self._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        try:
            self._commit(
                head,
                f"create table {'.'.join(staged.name())}",
                [self._put_table(staged.name(), None, staged.metadata_location, staged.metadata)],
            )
        except CommitFailedException as exc:
            raise TableAlreadyExistsError(f"Table was created concurrently: {exc}") from exc
        return self.load_table(staged.name())

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        [response] = self.commit_tables([(table, requirements, updates)])
        return response

    def commit_tables(self, changes: list[Change]) -> list[CommitTableResponse]:
        """Every table's change in one Nessie commit, on the hash the tables were read at."""
        head = self._head()
        operations = []
        responses = []
        for table, requirements, updates in changes:
            ident = table.name()
            content = self._content(ident, head)
            current = None if content is None else self._table(ident, content)
            staged = self._update_and_stage_table(
                current, ident, requirements, server_updates(updates)
            )
            if current is not None and staged.metadata == current.metadata:
                responses.append(
                    _response(
                        metadata=current.metadata, metadata_location=current.metadata_location
                    )
                )
                continue
            self._write_metadata(staged.metadata, staged.io, staged.metadata_location)
            operations.append(
                self._put_table(
                    ident,
                    None if content is None else content["id"],
                    staged.metadata_location,
                    staged.metadata,
                )
            )
            responses.append(
                _response(metadata=staged.metadata, metadata_location=staged.metadata_location)
            )
        if operations:
            names = ", ".join(".".join(op["key"]["elements"]) for op in operations)
            self._commit(head, f"icefall: commit {names}", operations)
        return responses

    def table_exists(self, identifier: str | Identifier) -> bool:
        content = self._content(self.identifier_to_tuple(identifier), self._head())
        return content is not None and content.get("type") == "ICEBERG_TABLE"

    def list_tables(self, namespace: str | Identifier) -> list[Identifier]:
        ns = self.identifier_to_tuple(namespace)
        return [
            name for kind, name in self._entries() if kind == "ICEBERG_TABLE" and name[:-1] == ns
        ]

    def drop_table(self, identifier: str | Identifier) -> None:
        ident = self.identifier_to_tuple(identifier)
        head = self._head()
        if self._content(ident, head) is None:
            raise NoSuchTableError(f"Table does not exist: {'.'.join(ident)}")
        self._commit(
            head,
            f"drop table {'.'.join(ident)}",
            [{"type": "DELETE", "key": {"elements": list(ident)}}],
        )

    def register_table(
        self, identifier: str | Identifier, metadata_location: str, overwrite: bool = False
    ) -> Table:
        raise NotImplementedError("register a table with Nessie's own tools")

    def rename_table(
        self, from_identifier: str | Identifier, to_identifier: str | Identifier
    ) -> Table:
        raise NotImplementedError("rename a table with Nessie's own tools")

    # ------------------------------------------------------------------ namespaces

    def create_namespace(
        self, namespace: str | Identifier, properties: Properties = EMPTY_DICT
    ) -> None:
        ns = self.identifier_to_tuple(namespace)
        head = self._head()
        if self._content(ns, head) is not None:
            raise NamespaceAlreadyExistsError(f"Namespace already exists: {'.'.join(ns)}")
        operation = {
            "type": "PUT",
            "key": {"elements": list(ns)},
            "content": {"type": "NAMESPACE", "elements": list(ns), "properties": dict(properties)},
        }
        try:
            self._commit(head, f"create namespace {'.'.join(ns)}", [operation])
        except CommitFailedException as exc:
            raise NamespaceAlreadyExistsError(f"Namespace was created concurrently: {exc}") from exc

    def drop_namespace(self, namespace: str | Identifier) -> None:
        ns = self.identifier_to_tuple(namespace)
        head = self._head()
        if self._content(ns, head) is None:
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(ns)}")
        self._commit(
            head,
            f"drop namespace {'.'.join(ns)}",
            [{"type": "DELETE", "key": {"elements": list(ns)}}],
        )

    def list_namespaces(self, namespace: str | Identifier = ()) -> list[Identifier]:
        ns = self.identifier_to_tuple(namespace) if namespace else ()
        return [
            name
            for kind, name in self._entries()
            if kind == "NAMESPACE" and name[: len(ns)] == ns and len(name) == len(ns) + 1
        ]

    def load_namespace_properties(self, namespace: str | Identifier) -> Properties:
        ns = self.identifier_to_tuple(namespace)
        content = self._content(ns, self._head())
        if content is None or content.get("type") != "NAMESPACE":
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(ns)}")
        return dict(content.get("properties") or {})

    def update_namespace_properties(
        self,
        namespace: str | Identifier,
        removals: set[str] | None = None,
        updates: Properties = EMPTY_DICT,
    ) -> PropertiesUpdateSummary:
        raise NotImplementedError("namespace properties are not changed by Icefall")
