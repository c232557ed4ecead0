"""AWS S3 Tables as a pyiceberg catalog (``automq.table.topic.catalog.type=tablebucket``).

pyiceberg 0.12 has no S3 Tables catalog, and S3 Tables' own Iceberg REST endpoint needs SigV4
signing that the rest of Icefall's readers do not set up. This catalog talks to the S3 Tables
API with boto3's ``s3tables`` client, the way AWS's Java ``S3TablesCatalog`` does:

- a table is created empty by ``CreateTable``; S3 Tables picks its storage (the table's
  ``warehouseLocation``); the first metadata JSON is written there and pointed at by
  ``UpdateTableMetadataLocation``;
- every commit applies the requirements and updates to the current metadata (pyiceberg's
  ``_update_and_stage_table``, as its Glue and SQL catalogs do), writes the new metadata JSON
  under the table's location, and swaps the pointer with ``UpdateTableMetadataLocation``
  carrying the version token read with the metadata: S3 Tables refuses the swap when another
  writer moved the table in between (``ConflictException``), which is ``CommitFailedException``
  here, so the round's one conditional commit stays conditional.

Properties: ``warehouse`` (the table bucket's ARN, required), ``s3tables.endpoint`` (else
boto3's own ``AWS_ENDPOINT_URL_S3TABLES``/``AWS_ENDPOINT_URL``), ``s3tables.region`` (else the
ARN's), ``client.access-key-id``/``client.secret-access-key``/``client.session-token`` (else
boto3's credential chain); ``s3.*`` go to the FileIO that reads and writes the files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyiceberg.catalog import Catalog, MetastoreCatalog, PropertiesUpdateSummary
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties

from broker import metadata_cache
from broker.external_catalogs.no_views import NoViews
from broker.external_catalogs.tablebucket import (
    ENDPOINT,
    ENDPOINT_KEY,
    WAREHOUSE_KEY,
    TableBucketSettingError,
    region_of,
)

if TYPE_CHECKING:
    import pyarrow as pa

REGION = "s3tables.region"


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3TablesCatalog(NoViews, MetastoreCatalog):
    """pyiceberg's ``Catalog`` on one S3 Tables table bucket (namespaces are one level)."""

    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **properties)
        self.arn = str(properties.get("warehouse") or "")
        region = properties.get(REGION) or region_of(self.arn)
        import boto3
        import botocore.config

        endpoint = properties.get(ENDPOINT) or None
        # its own session: credentials as the environment has them now (boto3's default
        # session keeps the first it found), and safe to use from several threads
        self.client: Any = boto3.session.Session().client(
            "s3tables",
            region_name=region,
            endpoint_url=endpoint,
            aws_access_key_id=properties.get("client.access-key-id"),
            aws_secret_access_key=properties.get("client.secret-access-key"),
            aws_session_token=properties.get("client.session-token"),
            config=botocore.config.Config(
                retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30
            ),
        )
        self.endpoint = endpoint or self.client.meta.endpoint_url
        # The FileIO of the table files: S3 in the bucket's region; an S3-compatible endpoint
        # (moto, a proxy) from the usual AWS variables when the catalog's s3.* do not name one.
        self.properties.setdefault("s3.region", region)
        s3_endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if s3_endpoint:
            self.properties.setdefault("s3.endpoint", s3_endpoint)

    # ------------------------------------------------------------ the API, with clear errors

    def _call(self, operation: str, **request: Any) -> Any:
        """One S3 Tables call; a connection or access failure names the settings to check."""
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        try:
            return getattr(self.client, operation)(tableBucketARN=self.arn, **request)
        except EndpointConnectionError as exc:
            raise ConnectionError(
                f"S3 Tables endpoint {self.endpoint} cannot be reached ({ENDPOINT_KEY} or "
                f"AWS_ENDPOINT_URL): {exc}"
            ) from exc
        except NoCredentialsError as exc:
            raise PermissionError(
                "no AWS credentials for S3 Tables (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a "
                "profile, or automq.table.topic.catalog.client.access-key-id/secret-access-key)"
            ) from exc
        except ClientError as exc:
            if _code(exc) in ("AccessDeniedException", "UnrecognizedClientException"):
                raise PermissionError(
                    f"S3 Tables refused {operation} on {self.arn} ({WAREHOUSE_KEY}): {exc}"
                ) from exc
            raise

    def _pages(self, operation: str, key: str, **request: Any) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            answer = self._call(
                operation, **request, **({"continuationToken": token} if token else {})
            )
            yield from answer.get(key, [])
            token = answer.get("continuationToken")
            if not token:
                return

    def _missing_bucket(self, exc: Exception) -> bool:
        return _code(exc) == "NotFoundException" and "bucket" in str(exc).lower()

    def check_bucket(self) -> None:
        """The table bucket exists and answers (a clear error naming the setting otherwise)."""
        from botocore.exceptions import ClientError

        try:
            self._call("get_table_bucket")
        except ClientError as exc:
            if _code(exc) == "NotFoundException":
                raise TableBucketSettingError(
                    f"{WAREHOUSE_KEY}={self.arn}: no such table bucket at {self.endpoint}"
                ) from exc
            raise

    # ------------------------------------------------------------ namespaces

    @staticmethod
    def _namespace(namespace: str | Identifier) -> str:
        parts = Catalog.identifier_to_tuple(namespace)
        if len(parts) != 1:
            raise NoSuchNamespaceError(f"S3 Tables namespaces are one level, got {namespace}")
        return parts[0]

    def create_namespace(
        self, namespace: str | Identifier, properties: Properties = EMPTY_DICT
    ) -> None:
        from botocore.exceptions import ClientError

        name = self._namespace(namespace)
        try:
            self._call("create_namespace", namespace=[name])
        except ClientError as exc:
            if _code(exc) == "ConflictException":
                raise NamespaceAlreadyExistsError(f"Namespace {name} already exists") from exc
            if _code(exc) == "NotFoundException":
                raise TableBucketSettingError(
                    f"{WAREHOUSE_KEY}={self.arn}: no such table bucket at {self.endpoint}"
                ) from exc
            raise

    def list_namespaces(self, namespace: str | Identifier = ()) -> list[Identifier]:
        if Catalog.identifier_to_tuple(namespace):
            return []
        return [(item["namespace"][0],) for item in self._pages("list_namespaces", "namespaces")]

    def load_namespace_properties(self, namespace: str | Identifier) -> Properties:
        from botocore.exceptions import ClientError

        name = self._namespace(namespace)
        try:
            self._call("get_namespace", namespace=name)
        except ClientError as exc:
            if _code(exc) == "NotFoundException":
                raise NoSuchNamespaceError(f"Namespace does not exist: {name}") from exc
            raise
        return {}

    def drop_namespace(self, namespace: str | Identifier) -> None:
        from botocore.exceptions import ClientError

        name = self._namespace(namespace)
        if self.list_tables(name):
            raise NamespaceNotEmptyError(f"Namespace {name} is not empty")
        try:
            self._call("delete_namespace", namespace=name)
        except ClientError as exc:
            if _code(exc) == "NotFoundException":
                raise NoSuchNamespaceError(f"Namespace does not exist: {name}") from exc
            raise

    def update_namespace_properties(
        self,
        namespace: str | Identifier,
        removals: set[str] | None = None,
        updates: Properties = EMPTY_DICT,
    ) -> PropertiesUpdateSummary:
        raise NotImplementedError("S3 Tables namespaces have no properties")

    # ------------------------------------------------------------ tables

    def list_tables(self, namespace: str | Identifier) -> list[Identifier]:
        from botocore.exceptions import ClientError

        name = self._namespace(namespace)
        try:
            return [
                (name, item["name"])
                for item in self._pages("list_tables", "tables", namespace=name)
            ]
        except ClientError as exc:
            if _code(exc) == "NotFoundException":
                raise NoSuchNamespaceError(f"Namespace does not exist: {name}") from exc
            raise

    def _pointer(self, namespace: str, name: str) -> tuple[str | None, str]:
        """(metadata location, version token) of a table, or NoSuchTableError."""
        from botocore.exceptions import ClientError

        try:
            answer = self._call("get_table_metadata_location", namespace=namespace, name=name)
        except ClientError as exc:
            if _code(exc) == "NotFoundException":
                raise NoSuchTableError(f"Table does not exist: {namespace}.{name}") from exc
            raise
        return answer.get("metadataLocation"), answer["versionToken"]

    def _table(self, namespace: str, name: str, metadata_location: str) -> Table:
        io = load_file_io(self.properties, metadata_location)
        metadata = metadata_cache.read(io, metadata_location)
        return Table(
            identifier=(namespace, name),
            metadata=metadata,
            metadata_location=metadata_location,
            io=self._load_file_io(metadata.properties, metadata_location),
            catalog=self,
        )

    def load_table(self, identifier: str | Identifier) -> Table:
        namespace, name = self.identifier_to_database_and_table(identifier, NoSuchTableError)
        location, _ = self._pointer(namespace, name)
        if not location:  # created, its first metadata not written (yet, or never)
            raise NoSuchTableError(f"Table has no metadata yet: {namespace}.{name}")
        return self._table(namespace, name, location)

    def table_exists(self, identifier: str | Identifier) -> bool:
        try:
            self.load_table(identifier)
        except NoSuchTableError:
            return False
        return True

    def create_table(
        self,
        identifier: str | Identifier,
        schema: Schema | pa.Schema,
        location: str | None = None,
        partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
        sort_order: SortOrder = UNSORTED_SORT_ORDER,
        properties: Properties = EMPTY_DICT,
    ) -> Table:
        """``CreateTable``, then the first metadata JSON in the location S3 Tables gave the table
        (``location`` cannot be chosen), pointed at with the new table's version token."""
        from botocore.exceptions import ClientError

        if location:
            raise ValueError("S3 Tables chooses a table's location: create it without one")
        namespace, name = self.identifier_to_database_and_table(identifier)
        iceberg_schema = self._convert_schema_if_needed(schema)
        try:
            self._call("create_table", namespace=namespace, name=name, format="ICEBERG")
        except ClientError as exc:
            if _code(exc) == "ConflictException" or "already exists" in str(exc):
                raise TableAlreadyExistsError(f"Table {namespace}.{name} already exists") from exc
            if _code(exc) == "NotFoundException":
                raise NoSuchNamespaceError(f"Namespace does not exist: {namespace}") from exc
            raise
        table = self._call("get_table", namespace=namespace, name=name)
        warehouse = str(table["warehouseLocation"]).rstrip("/")
        metadata = new_table_metadata(
            location=warehouse,
            schema=iceberg_schema,
            partition_spec=partition_spec,
            sort_order=sort_order,
            properties=properties,
        )
        metadata_location = load_location_provider(
            warehouse, properties
        ).new_table_metadata_file_location()
        io = self._load_file_io(properties, metadata_location)
        self._write_metadata(metadata, io, metadata_location)
        _, token = self._pointer(namespace, name)
        self._swap(namespace, name, metadata_location, token)
        return self.load_table((namespace, name))

    @staticmethod
    def _write_metadata(metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:
        """Without the exists check (S3 Tables' storage refuses ListObjectsV2); the name is new."""
        metadata_cache.write(metadata, io, metadata_path)

    def _swap(self, namespace: str, name: str, metadata_location: str, token: str) -> str:
        """``UpdateTableMetadataLocation`` with the version token: the conditional commit."""
        from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

        try:
            answer = self._call(
                "update_table_metadata_location",
                namespace=namespace,
                name=name,
                metadataLocation=metadata_location,
                versionToken=token,
            )
        except ClientError as exc:
            if _code(exc) in ("ConflictException", "VersionTokenMismatch"):
                raise CommitFailedException(
                    f"{namespace}.{name} changed since it was read (version token {token}): {exc}"
                ) from exc
            raise
        except (ConnectionClosedError, ReadTimeoutError) as exc:
            raise CommitStateUnknownException(str(exc)) from exc
        return str(answer.get("versionToken", ""))

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        namespace, name = self.identifier_to_database_and_table(table.name(), NoSuchTableError)
        location, token = self._pointer(namespace, name)
        if not location:
            raise NoSuchTableError(f"Table has no metadata yet: {namespace}.{name}")
        current = self._table(namespace, name, location)
        staged = self._update_and_stage_table(current, (namespace, name), requirements, updates)
        if staged.metadata == current.metadata:
            return CommitTableResponse(metadata=current.metadata, metadata_location=location)  # type: ignore[call-arg]
        self._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        self._swap(namespace, name, staged.metadata_location, token)
        return CommitTableResponse(  # type: ignore[call-arg]
            metadata=staged.metadata, metadata_location=staged.metadata_location
        )

    def drop_table(self, identifier: str | Identifier) -> None:
        from botocore.exceptions import ClientError

        namespace, name = self.identifier_to_database_and_table(identifier, NoSuchTableError)
        try:
            self._call("delete_table", namespace=namespace, name=name)
        except ClientError as exc:
            if _code(exc) == "NotFoundException":
                raise NoSuchTableError(f"Table does not exist: {namespace}.{name}") from exc
            raise

    def purge_table(self, identifier: str | Identifier) -> None:
        self.drop_table(identifier)  # S3 Tables deletes the table's storage with it

    def rename_table(
        self, from_identifier: str | Identifier, to_identifier: str | Identifier
    ) -> Table:
        namespace, name = self.identifier_to_database_and_table(from_identifier, NoSuchTableError)
        new_namespace, new_name = self.identifier_to_database_and_table(to_identifier)
        self._call(
            "rename_table",
            namespace=namespace,
            name=name,
            newNamespaceName=new_namespace,
            newName=new_name,
        )
        return self.load_table((new_namespace, new_name))

    def register_table(
        self, identifier: str | Identifier, metadata_location: str, overwrite: bool = False
    ) -> Table:
        raise NotImplementedError("S3 Tables cannot register a table's existing metadata")
