"""Table metadata as the spec's JSON, format v3 included, for the catalog and the commit round.

pyiceberg 0.12 parses v3 metadata and its update logic already keeps v3 row
lineage (an added snapshot must carry ``first-row-id`` >= the table's
``next-row-id``, which then grows by the snapshot's ``added-rows``), but
``TableMetadataV3.model_dump_json`` raises "Writing V3 is not yet supported".
The spec's v3 metadata is v2's plus ``next-row-id`` (required, 0 for a new
table; row lineage is always on in v3, there is no flag), and pyiceberg's model
has exactly the spec's fields and aliases, so pydantic's own dump, past that
override, is the v3 JSON; ``next-row-id`` is always written. A separate module
from the catalog (``broker.catalog.v3``) so the commit round's driver can use it
without importing the HTTP server.
"""

from __future__ import annotations

import json
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.serializers import Compressor
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.typedef import IcebergBaseModel
from pyiceberg.utils.config import Config

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


def write_metadata(metadata: TableMetadata, io: FileIO, location: str) -> TableMetadata:
    """A metadata file, compressed as its name says; returns the metadata as the file holds it
    (its JSON parsed back: what a reader of the file gets, for ``broker.metadata_cache``).

    Written without pyiceberg's does-it-exist check: the name is new (a version and a UUID),
    the check is not atomic on S3 anyway (what makes a commit exclusive is the catalog's
    conditional pointer swap), and on S3 it cost a HEAD and a LIST before every commit."""
    if metadata.format_version < V3:  # as pyiceberg's ToOutputFile: -1 for no snapshot if asked
        legacy = Config().get_bool("legacy-current-snapshot-id")
        text = metadata.model_dump_json(exclude_none=not legacy)
    else:
        text = to_json(metadata)
    data = Compressor.get_compressor(location).bytes_compressor()(text.encode())
    with io.new_output(location).create(overwrite=True) as out:
        out.write(data)
    return TableMetadataUtil.parse_raw(text)
