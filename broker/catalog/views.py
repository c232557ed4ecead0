"""View metadata for the REST spec's create and replace, built by the rules of
Iceberg's Java ``ViewMetadata.Builder``: pyiceberg 0.12 has the ViewMetadata
model but nothing that builds or updates it.

A create is built as the updates a fresh view needs (assign-uuid, set-location,
set-properties, add-schema, add-view-version, set-current-view-version), so
create and replace share one set of rules:

- ``add-schema`` reuses the id of an identical schema, else takes the highest
  id + 1 (the first schema is 0);
- ``add-view-version`` resolves a ``schema-id`` of -1 to the schema added last,
  reuses the id of an identical version (all but id and timestamp), else takes
  a fresh id; one SQL representation per dialect;
- ``set-current-view-version`` -1 is the version added last; every change of
  the current version is logged in ``version-log`` with its timestamp;
- a replace may not drop a dialect the current version has, unless
  ``replace.drop-dialect.allowed=true``;
- only the newest ``version.history.num-entries`` (10) versions are kept,
  with those the request added and the current one.

Invalid updates are 400s; a failed ``assert-view-uuid`` is a 409.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from pydantic import Field
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AssignUUIDUpdate,
    RemovePropertiesUpdate,
    SetLocationUpdate,
    SetPropertiesUpdate,
    UpgradeFormatVersionUpdate,
)
from pyiceberg.typedef import IcebergBaseModel
from pyiceberg.view.metadata import ViewHistoryEntry, ViewMetadata, ViewVersion

from broker.catalog.errors import BadRequest

FORMAT_VERSION = 1
LAST_ADDED = -1
HISTORY_SIZE, HISTORY_SIZE_DEFAULT = "version.history.num-entries", 10
DROP_DIALECT_ALLOWED = "replace.drop-dialect.allowed"


class AddViewVersionUpdate(IcebergBaseModel):
    action: Literal["add-view-version"] = Field(default="add-view-version")
    view_version: ViewVersion = Field(alias="view-version")


class SetCurrentViewVersionUpdate(IcebergBaseModel):
    action: Literal["set-current-view-version"] = Field(default="set-current-view-version")
    view_version_id: int = Field(alias="view-version-id")


ViewUpdate = Annotated[
    AssignUUIDUpdate
    | UpgradeFormatVersionUpdate
    | AddSchemaUpdate
    | SetLocationUpdate
    | SetPropertiesUpdate
    | RemovePropertiesUpdate
    | AddViewVersionUpdate
    | SetCurrentViewVersionUpdate,
    Field(discriminator="action"),
]


class AssertViewUUID(IcebergBaseModel):
    type: Literal["assert-view-uuid"] = Field(default="assert-view-uuid")
    uuid: str

    def validate_against(self, metadata: ViewMetadata) -> None:
        if metadata.view_uuid != self.uuid:
            raise CommitFailedException(
                f"View UUID does not match: expected {self.uuid} != {metadata.view_uuid}"
            )


def new_view(
    schema: Schema, version: ViewVersion, location: str, properties: dict[str, str]
) -> ViewMetadata:
    """A view's first metadata: version 1 on the given schema (whatever ids the request sent)."""
    builder = _Builder(None)
    for update in (
        AssignUUIDUpdate(uuid=uuid.uuid4()),
        SetLocationUpdate(location=location),
        SetPropertiesUpdate(updates=properties),
        AddSchemaUpdate(schema=schema),
        AddViewVersionUpdate.model_validate(
            {"view-version": version.model_copy(update={"version_id": 1, "schema_id": LAST_ADDED})}
        ),
        SetCurrentViewVersionUpdate.model_validate({"view-version-id": LAST_ADDED}),
    ):
        builder.apply(update)
    return builder.build()


def updated_view(
    base: ViewMetadata, requirements: list[AssertViewUUID], updates: list[ViewUpdate]
) -> ViewMetadata:
    """``base`` with the updates applied, once the requirements hold."""
    for requirement in requirements:
        requirement.validate_against(base)
    builder = _Builder(base)
    for update in updates:
        builder.apply(update)
    return builder.build()


def _dialects(version: ViewVersion) -> list[str]:
    return [r.root.dialect.lower() for r in version.representations]


def _same_version(a: ViewVersion, b: ViewVersion) -> bool:
    ignored = {"version_id", "timestamp_ms"}
    return a.model_dump(exclude=ignored) == b.model_dump(exclude=ignored)


class _Builder:
    """The metadata being built, as Java's builder keeps it between updates."""

    def __init__(self, base: ViewMetadata | None) -> None:
        self.base = base
        self.uuid = base.view_uuid if base else None
        self.location = base.location if base else None
        self.properties = dict(base.properties) if base else {}
        self.schemas: list[Schema] = list(base.schemas) if base else []
        self.versions: list[ViewVersion] = list(base.versions) if base else []
        self.log: list[ViewHistoryEntry] = list(base.version_log) if base else []
        self.current: int | None = base.current_version_id if base else None
        self.last_schema: int | None = None
        self.last_version: int | None = None
        self.added: set[int] = set()

    def apply(self, update: ViewUpdate) -> None:
        match update:
            case AssignUUIDUpdate():
                if self.uuid is not None and self.uuid != str(update.uuid):
                    raise BadRequest("Cannot reassign the uuid of a view")
                self.uuid = str(update.uuid)
            case UpgradeFormatVersionUpdate():
                if update.format_version != FORMAT_VERSION:
                    raise BadRequest(
                        f"Cannot change the view format version to {update.format_version}:"
                        f" only {FORMAT_VERSION} exists"
                    )
            case AddSchemaUpdate():
                self._add_schema(update.schema_)
            case SetLocationUpdate():
                self.location = update.location.rstrip("/")
            case SetPropertiesUpdate():
                self.properties.update(update.updates)
            case RemovePropertiesUpdate():  # keys the view lacks are ignored, as Java does
                for key in update.removals:
                    self.properties.pop(key, None)
            case AddViewVersionUpdate():
                self._add_version(update.view_version)
            case SetCurrentViewVersionUpdate():
                self._set_current(update.view_version_id)

    def _add_schema(self, schema: Schema) -> None:
        for known in self.schemas:
            if known == schema:  # pyiceberg compares fields and identifier ids, not the id
                self.last_schema = known.schema_id
                return
        schema_id = max((s.schema_id + 1 for s in self.schemas), default=0)
        self.schemas.append(schema.model_copy(update={"schema_id": schema_id}))
        self.last_schema = schema_id

    def _add_version(self, version: ViewVersion) -> None:
        if version.schema_id == LAST_ADDED:
            if self.last_schema is None:
                raise BadRequest("Cannot set last added schema: no schema has been added")
            version = version.model_copy(update={"schema_id": self.last_schema})
        if not any(s.schema_id == version.schema_id for s in self.schemas):
            raise BadRequest(f"Cannot add version with unknown schema: {version.schema_id}")
        dialects = _dialects(version)
        if not dialects:
            raise BadRequest("Invalid view version: it has no representation")
        if len(set(dialects)) != len(dialects):
            raise BadRequest("Invalid view version: more than one query for a dialect")
        for known in self.versions:
            if _same_version(known, version):
                self.last_version = known.version_id
                return
        version_id = max([version.version_id, *(v.version_id + 1 for v in self.versions)])
        self.versions.append(version.model_copy(update={"version_id": version_id}))
        self.last_version = version_id
        self.added.add(version_id)

    def _set_current(self, version_id: int) -> None:
        if version_id == LAST_ADDED:
            if self.last_version is None:
                raise BadRequest("Cannot set last version: no version has been added")
            version_id = self.last_version
        version = self._version(version_id)
        if version is None:
            raise BadRequest(f"Cannot set current version to unknown version: {version_id}")
        if self.current != version_id:
            self.current = version_id
            self.log.append(
                ViewHistoryEntry.model_validate(
                    {"timestamp-ms": version.timestamp_ms, "version-id": version_id}
                )
            )

    def _version(self, version_id: int) -> ViewVersion | None:
        return next((v for v in self.versions if v.version_id == version_id), None)

    def build(self) -> ViewMetadata:
        if self.uuid is None or not self.location:
            raise BadRequest("Invalid view metadata: no uuid or no location")
        current = self._version(self.current) if self.current is not None else None
        if current is None:
            raise BadRequest("Invalid view metadata: no current version")
        self._check_dialects(current)
        versions, log = self._expire(current.version_id)
        return ViewMetadata.model_validate(
            {
                "view-uuid": self.uuid,
                "format-version": FORMAT_VERSION,
                "location": self.location,
                "schemas": self.schemas,
                "current-version-id": current.version_id,
                "versions": versions,
                "version-log": log,
                "properties": self.properties,
            }
        )

    def _check_dialects(self, current: ViewVersion) -> None:
        if self.base is None or self.properties.get(DROP_DIALECT_ALLOWED, "false") == "true":
            return
        previous = self._version(self.base.current_version_id) or current
        dropped = set(_dialects(previous)) - set(_dialects(current))
        if dropped:
            raise BadRequest(
                f"Cannot replace view due to loss of view dialects {sorted(dropped)}"
                f" ({DROP_DIALECT_ALLOWED}=false)"
            )

    def _expire(self, current: int) -> tuple[list[ViewVersion], list[ViewHistoryEntry]]:
        """The newest versions within the history size, with the added and current ones; the
        log keeps its newest entries back to the first one of a version no longer kept."""
        raw = self.properties.get(HISTORY_SIZE, str(HISTORY_SIZE_DEFAULT))
        if not (raw.isascii() and raw.isdigit() and int(raw) > 0):
            raise BadRequest(f"{HISTORY_SIZE} must be a positive integer: {raw!r}")
        keep = max(int(raw), len(self.added) + 1)
        if len(self.versions) <= keep:
            return self.versions, self.log
        newest = sorted((v.version_id for v in self.versions), reverse=True)[:keep]
        kept = {*newest, *self.added, current}
        log: list[ViewHistoryEntry] = []
        for entry in self.log:
            log = [*log, entry] if entry.version_id in kept else []
        return [v for v in self.versions if v.version_id in kept], log
