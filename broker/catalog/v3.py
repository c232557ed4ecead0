"""Format v3 tables in the catalog: what pyiceberg 0.12 reads and updates but refuses to write.

Metadata files and REST responses go through ``broker.iceberg_json`` (v3 JSON
with ``next-row-id``). This module adds the one update pyiceberg stops short of:
``upgrade-format-version`` to 3 (its ``SUPPORTED_TABLE_FORMAT_VERSION`` is 2).
Upgrading a v1/v2 table keeps its data files without row ids (the spec's rule
for upgraded tables) and starts ``next-row-id`` at 0; Spark's
``ALTER TABLE ... SET TBLPROPERTIES ('format-version'='3')`` and CTAS into a v3
table (a staged create) send it.
"""

from __future__ import annotations

from pyiceberg.table.metadata import TableMetadata, TableMetadataV3
from pyiceberg.table.update import (
    TableUpdate,
    UpgradeFormatVersionUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
)

from broker.iceberg_json import INITIAL_ROW_ID, V3


class UpgradeToV3(UpgradeFormatVersionUpdate):
    """An ``upgrade-format-version`` update to 3, applied by this module (pyiceberg stops at 2)."""


def server_updates(updates: tuple[TableUpdate, ...]) -> tuple[TableUpdate, ...]:
    """The request's updates with upgrades to v3 handed to ``UpgradeToV3``."""
    return tuple(
        UpgradeToV3.model_validate({"format-version": V3})
        if isinstance(u, UpgradeFormatVersionUpdate) and u.format_version == V3
        else u
        for u in updates
    )


@_apply_table_update.register(UpgradeToV3)
def _upgrade_to_v3(
    update: UpgradeToV3, base: TableMetadata, context: _TableMetadataUpdateContext
) -> TableMetadata:
    if base.format_version == V3:
        return base
    if base.format_version == 1:  # v1 -> v2 first: pyiceberg moves v1's single schema/spec fields
        base = _apply_table_update(
            UpgradeFormatVersionUpdate.model_validate({"format-version": 2}), base, context
        )
    fields = {**dict(base), "format_version": V3, "next_row_id": INITIAL_ROW_ID}
    context.add_update(update)
    return TableMetadataV3.model_construct(**fields)
