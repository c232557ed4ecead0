"""Request bodies and path parameters of the REST catalog, parsed strictly.

Bodies are pydantic models built on pyiceberg's own Schema, PartitionSpec,
SortOrder, TableRequirement and TableUpdate types, so the server accepts
exactly what pyiceberg can apply, and anything else is a 400 (the spec
requires a 400 for unknown updates and requirements). Names are checked
against what the SQL catalog can store unambiguously: it keeps a namespace as
its parts joined by "." in a 255-character column (a "." inside a level is
stored differently, see ``broker.catalog.store``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.view.metadata import ViewVersion

from broker.catalog.errors import BadRequest
from broker.catalog.views import AssertViewUUID, ViewUpdate

SEPARATOR = "\x1f"  # the spec's default namespace separator (sent url-encoded as %1F)
MAX_NAME = 255  # the SQL catalog's column width for namespaces, table names and property keys
MAX_VALUE = 1000  # ... and for property values

M = TypeVar("M", bound=BaseModel)


def check_name(name: str, what: str = "table name") -> str:
    """A table name or namespace part that maps to one SQL row and one directory."""
    if not name or name != name.strip():
        raise BadRequest(f"{what} must be non-empty without surrounding blanks: {name!r}")
    if name in (".", "..") or any(c in name for c in "/\\" + SEPARATOR) or not name.isprintable():
        raise BadRequest(
            f"{what} must be printable, without slashes or the 0x1F separator: {name!r}"
        )
    if len(name) > MAX_NAME:
        raise BadRequest(f"{what} is longer than {MAX_NAME} characters")
    return name


def check_namespace(parts: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    if not parts:
        raise BadRequest("namespace must have at least one level")
    for part in parts:
        check_name(part, "namespace level")
        if part.startswith(".") or part.endswith("."):
            raise BadRequest(f"namespace levels cannot begin or end with '.': {part!r}")
    if len(".".join(parts)) > MAX_NAME:
        raise BadRequest(f"namespace is longer than {MAX_NAME} characters")
    return tuple(parts)


def parse_namespace(value: str) -> tuple[str, ...]:
    """A namespace path or query parameter: levels joined by the 0x1F separator."""
    return check_namespace(value.split(SEPARATOR))


RESERVED_NAMESPACE_KEYS = frozenset({"exists"})  # the SQL catalog's marker row of every namespace


def check_properties(props: dict[str, str]) -> dict[str, str]:
    for key, value in props.items():
        if not key or len(key) > MAX_NAME or len(value) > MAX_VALUE:
            raise BadRequest(
                f"property keys must be 1-{MAX_NAME} and values 0-{MAX_VALUE} characters: {key[:40]!r}"
            )
    return props


def check_namespace_keys(keys: Iterable[str]) -> None:
    if reserved := RESERVED_NAMESPACE_KEYS.intersection(keys):
        raise BadRequest(f"namespace property keys {sorted(reserved)} are reserved by the catalog")


class _Request(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)


class CreateNamespaceRequest(_Request):
    namespace: list[str]
    properties: dict[str, str] = Field(default_factory=dict)


class UpdateNamespacePropertiesRequest(_Request):
    removals: list[str] = Field(default_factory=list)
    updates: dict[str, str] = Field(default_factory=dict)


class TableIdent(_Request):
    namespace: list[str]
    name: str

    @property
    def identifier(self) -> tuple[str, ...]:
        return (*check_namespace(self.namespace), check_name(self.name))


class RenameTableRequest(_Request):
    source: TableIdent
    destination: TableIdent


class CreateTableRequest(_Request):
    name: str
    location: str | None = None
    table_schema: Schema = Field(alias="schema")
    partition_spec: PartitionSpec | None = Field(default=None, alias="partition-spec")
    write_order: SortOrder | None = Field(default=None, alias="write-order")
    stage_create: bool = Field(default=False, alias="stage-create")
    properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("partition_spec", mode="before")
    @classmethod
    def _number_fields(cls, value: Any) -> Any:
        """The spec makes a new partition field's id optional; pyiceberg needs one
        (fresh ids are assigned when the table metadata is built anyway)."""
        if isinstance(value, dict) and isinstance(value.get("fields"), list):
            fields = [
                {**f, "field-id": 1000 + i} if isinstance(f, dict) and "field-id" not in f else f
                for i, f in enumerate(value["fields"])
            ]
            return {**value, "fields": fields}
        return value


class RegisterTableRequest(_Request):
    name: str
    metadata_location: str = Field(alias="metadata-location")
    overwrite: bool = False


class CommitTableRequest(_Request):
    identifier: TableIdent | None = None
    requirements: list[TableRequirement]
    updates: list[TableUpdate]


class CommitTransactionRequest(_Request):
    table_changes: list[CommitTableRequest] = Field(alias="table-changes")


class CreateViewRequest(_Request):
    name: str
    location: str | None = None
    view_schema: Schema = Field(alias="schema")
    view_version: ViewVersion = Field(alias="view-version")
    properties: dict[str, str] = Field(default_factory=dict)


class CommitViewRequest(_Request):
    identifier: TableIdent | None = None
    requirements: list[AssertViewUUID] = Field(default_factory=list)
    updates: list[ViewUpdate]


class RegisterViewRequest(_Request):
    name: str
    metadata_location: str = Field(alias="metadata-location")


class MetricsReport(_Request):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="allow")
    report_type: str = Field(alias="report-type")


async def read_body(request: web.Request, model: type[M]) -> M:
    """The JSON body as ``model``; malformed JSON or a wrong shape is a 400."""
    raw = await request.read()
    try:
        data = json.loads(raw) if raw else None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError:
        raise
    except Exception as exc:  # pyiceberg's validators also raise KeyError, TypeError...
        raise BadRequest(f"invalid request: {type(exc).__name__}: {exc}") from exc
