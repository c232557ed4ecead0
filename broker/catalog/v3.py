"""Format v3 table metadata: what pyiceberg 0.12 reads and updates but refuses to write.

pyiceberg parses v3 metadata and its update logic already keeps v3 row
lineage (an added snapshot must carry ``first-row-id`` >= the table's
``next-row-id``, which then grows by the snapshot's ``added-rows``), but
``TableMetadataV3.model_dump_json`` raises "Writing V3 is not yet supported"
and its upgrade update stops at v2. The catalog needs neither guard: it only
stores and serves metadata that clients (Spark's Iceberg 1.10, pyiceberg)
build, and the spec's v3 metadata is v2's plus ``next-row-id`` (required,
0 for a new table; row lineage is always on in v3, there is no flag). So this
module

- serializes v3 metadata with pydantic's own dump (the fields and aliases of
  pyiceberg's model, which follow the spec) and always writes ``next-row-id``,
  for metadata files and REST responses alike;
- upgrades a v1/v2 table to v3 on an ``upgrade-format-version`` update:
  existing data files keep no row ids (the spec's rule for upgraded tables) and
  ``next-row-id`` starts at 0.
"""

from __future__ import annotations

import json
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.serializers import Compressor
from pyiceberg.table.metadata import TableMetadata, TableMetadataV3
from pyiceberg.table.update import (
    TableUpdate,
    UpgradeFormatVersionUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
)
from pyiceberg.typedef import IcebergBaseModel

V3 = 3
INITIAL_ROW_ID = 0


def with_row_lineage(metadata: TableMetadata) -> TableMetadata:
    """v3 metadata with ``next-row-id`` set (pyiceberg builds a new v3 table without it)."""
    if metadata.format_version >= V3 and getattr(metadata, "next_row_id", None) is None:
        return metadata.model_copy(update={"next_row_id": INITIAL_ROW_ID})
    return metadata


def to_json(metadata: TableMetadata) -> str:
    """The metadata as the spec's JSON, v3 included."""
    if metadata.format_version < V3:
        return metadata.model_dump_json()
    # pydantic's dump, past pyiceberg's refusing override: the same fields and aliases as v2 plus next-row-id
    return IcebergBaseModel.model_dump_json(with_row_lineage(metadata))


def to_dict(metadata: TableMetadata) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(to_json(metadata))
    return data


def write_metadata(metadata: TableMetadata, io: FileIO, location: str) -> None:
    """A metadata file, compressed as its name says (like pyiceberg's ``ToOutputFile``); never overwrites."""
    data = Compressor.get_compressor(location).bytes_compressor()(to_json(metadata).encode())
    with io.new_output(location).create(overwrite=False) as out:
        out.write(data)


class UpgradeToV3(UpgradeFormatVersionUpdate):
    """An ``upgrade-format-version`` update to 3, applied by this module (pyiceberg stops at 2)."""


def server_updates(updates: tuple[TableUpdate, ...]) -> tuple[TableUpdate, ...]:
    """The request's updates with upgrades to v3 handed to ``UpgradeToV3``."""
    return tuple(UpgradeToV3.model_validate({"format-version": V3})
                 if isinstance(u, UpgradeFormatVersionUpdate) and u.format_version == V3 else u
                 for u in updates)


@_apply_table_update.register(UpgradeToV3)
def _upgrade_to_v3(update: UpgradeToV3, base: TableMetadata, context: _TableMetadataUpdateContext) -> TableMetadata:
    if base.format_version == V3:
        return base
    if base.format_version == 1:  # v1 -> v2 first: pyiceberg moves v1's single schema/spec fields
        base = _apply_table_update(UpgradeFormatVersionUpdate.model_validate({"format-version": 2}), base, context)
    fields = {**dict(base), "format_version": V3, "next_row_id": INITIAL_ROW_ID}
    context.add_update(update)
    return TableMetadataV3.model_construct(**fields)
