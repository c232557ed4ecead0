"""Table updates the catalog applies differently from pyiceberg, so clients see
what Iceberg's Java catalogs do.

pyiceberg applies a request's updates with ``update_table_metadata``; a few of
them need the server's rules instead of the client library's:

- ``remove-properties`` of a key the table does not have: pyiceberg raises
  ``KeyError`` (a 500 here), Java's ``TableMetadata.Builder`` ignores the key.
  Spark's ``ALTER TABLE ... UNSET TBLPROPERTIES IF EXISTS`` and a client
  retrying a commit whose first attempt landed both send such removals.
- ``upgrade-format-version`` to 3 (``broker.catalog.v3``).
"""

from __future__ import annotations

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    RemovePropertiesUpdate,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
)

from broker.catalog import v3


class RemovePresentProperties(RemovePropertiesUpdate):
    """A ``remove-properties`` update that skips keys the table does not have."""


def server_updates(updates: tuple[TableUpdate, ...]) -> tuple[TableUpdate, ...]:
    """The request's updates, each handed to the catalog's own rule where it has one."""
    return tuple(
        RemovePresentProperties(removals=u.removals) if isinstance(u, RemovePropertiesUpdate) else u
        for u in v3.server_updates(updates)
    )


@_apply_table_update.register(RemovePresentProperties)
def _remove_present_properties(
    update: RemovePresentProperties, base: TableMetadata, context: _TableMetadataUpdateContext
) -> TableMetadata:
    if not update.removals:
        return base
    removed = set(update.removals)
    properties = {k: v for k, v in base.properties.items() if k not in removed}
    context.add_update(update)
    return base.model_copy(update={"properties": properties})
