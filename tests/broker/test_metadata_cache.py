"""broker.metadata_cache: a metadata file is fetched once per process, a file written is
remembered as written, and the cache holds the most recently used locations only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.snapshots import MetadataLogEntry
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.types import LongType, NestedField

from broker import iceberg_json, metadata_cache


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    metadata_cache.clear()
    yield
    metadata_cache.clear()


def table_metadata(location: Path, format_version: int = 2) -> TableMetadata:
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    return new_table_metadata(
        schema,
        UNPARTITIONED_PARTITION_SPEC,
        UNSORTED_SORT_ORDER,
        location.as_uri(),
        {"format-version": str(format_version)},
    )


def test_a_file_is_fetched_once(tmp_path: Path) -> None:
    io, path = PyArrowFileIO(), tmp_path / "00001.metadata.json"
    written = iceberg_json.write_metadata(table_metadata(tmp_path), io, str(path))
    first = metadata_cache.read(io, str(path))
    assert first == written
    path.unlink()  # a second read that fetched would fail now
    assert metadata_cache.read(io, str(path)) is first
    metadata_cache.forget(str(path))
    with pytest.raises(FileNotFoundError):
        metadata_cache.read(io, str(path))


@pytest.mark.parametrize("format_version", [2, 3])
def test_a_file_written_is_remembered_as_the_file_holds_it(
    tmp_path: Path, format_version: int
) -> None:
    """v3: the file has next-row-id though pyiceberg's new metadata has none; so does the cache."""
    io, path = PyArrowFileIO(), tmp_path / "00001.metadata.json"
    written = iceberg_json.write_metadata(table_metadata(tmp_path, format_version), io, str(path))
    metadata_cache.remember(str(path), written)
    path_copy = tmp_path / "copy.metadata.json"
    path_copy.write_bytes(path.read_bytes())
    assert metadata_cache.read(io, str(path)) == metadata_cache.read(io, str(path_copy))
    if format_version == 3:
        assert getattr(metadata_cache.read(io, str(path)), "next_row_id", None) == 0


def test_a_commit_drops_the_file_it_supersedes(tmp_path: Path) -> None:
    io, first, second = (
        PyArrowFileIO(),
        tmp_path / "00001.metadata.json",
        tmp_path / "00002.metadata.json",
    )
    base = iceberg_json.write_metadata(table_metadata(tmp_path), io, str(first))
    metadata_cache.read(io, str(first))
    log = [
        MetadataLogEntry.model_validate(
            {"metadata-file": str(first), "timestamp-ms": base.last_updated_ms}
        )
    ]
    newer = base.model_copy(update={"metadata_log": log})
    metadata_cache.remember(str(second), iceberg_json.write_metadata(newer, io, str(second)))
    first.unlink()
    with pytest.raises(FileNotFoundError):  # not kept: read again, and gone
        metadata_cache.read(io, str(first))
    second.unlink()
    assert metadata_cache.read(io, str(second)).metadata_log == log


def test_the_least_recently_used_go_past_the_weight_budget(tmp_path: Path) -> None:
    io, path = PyArrowFileIO(), tmp_path / "00001.metadata.json"
    metadata = iceberg_json.write_metadata(table_metadata(tmp_path), io, str(path))
    metadata_cache.read(io, str(path))
    for n in range(metadata_cache.MAX_WEIGHT // metadata_cache.weight(metadata)):
        metadata_cache.remember(str(tmp_path / f"other-{n}.metadata.json"), metadata)
    path.unlink()
    with pytest.raises(FileNotFoundError):
        metadata_cache.read(io, str(path))
