"""Parsed table metadata by file location: a metadata file is read once per process.

A metadata JSON is never rewritten: every commit writes a new file (its name carries a
version and a UUID) and moves the catalog's pointer to it. So the metadata parsed from a
location stays true for that location, and a process that reads a table again and again
need not fetch and parse the same file each time: on S3 that is a HEAD and a GET, and the
parse of a file that grows with the table's snapshots. Used by the broker's catalog (each
load-table and each commit) and by Icefall's pyiceberg catalogs that read metadata files
themselves (Nessie, S3 Tables: a round's driver loads its table to plan, write and publish).
A REST catalog's clients get the metadata in the response and never come here.

A file the process writes itself is remembered as written, so the commit that follows it
reads nothing, and the file it supersedes (the previous entry of its metadata log) is
dropped: only a table's current metadata is worth keeping. A file deleted (a commit that
lost its swap) is dropped too.

Only the pointer's lookup (the catalog's database, S3 Tables' or Nessie's API) says which
location is current; this cache never answers that. Bounded by weight, not count: a
metadata file holds every snapshot the table keeps, so an entry weighs one plus its
snapshots, snapshot-log and metadata-log entries, and the least recently used go once the
total passes ``MAX_WEIGHT`` (about 4 KB parsed per snapshot: tens of MB at most).
"""

from __future__ import annotations

import threading

from cachetools import LRUCache
from pyiceberg.io import FileIO
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.metadata import TableMetadata

from broker import iceberg_json

MAX_WEIGHT = 20_000


def weight(metadata: TableMetadata) -> int:
    return 1 + len(metadata.snapshots) + len(metadata.snapshot_log) + len(metadata.metadata_log)


_cache: LRUCache[str, TableMetadata] = LRUCache(maxsize=MAX_WEIGHT, getsizeof=weight)
_lock = threading.Lock()


def read(io: FileIO, location: str) -> TableMetadata:
    """The metadata at ``location``, fetched and parsed only the first time."""
    with _lock:
        found = _cache.get(location)
    if found is not None:
        return found
    metadata = FromInputFile.table_metadata(io.new_input(location))
    _put(location, metadata)
    return metadata


def remember(location: str, metadata: TableMetadata) -> None:
    """``metadata`` is what ``location`` holds now (this process has just written or read it);
    the file it supersedes is dropped."""
    with _lock:
        if metadata.metadata_log:
            _cache.pop(metadata.metadata_log[-1].metadata_file, None)
    _put(location, metadata)


def write(metadata: TableMetadata, io: FileIO, location: str) -> None:
    """Write the metadata file (``broker.iceberg_json``, every format version) and remember it
    as the file holds it: the catalogs' ``_write_metadata``."""
    remember(location, iceberg_json.write_metadata(metadata, io, location))


def forget(location: str) -> None:
    """``location`` is gone (deleted) or no longer to be trusted."""
    with _lock:
        _cache.pop(location, None)


def clear() -> None:
    with _lock:
        _cache.clear()


def _put(location: str, metadata: TableMetadata) -> None:
    with _lock:
        try:
            _cache[location] = metadata
        except ValueError:  # heavier than the whole budget: not kept
            _cache.pop(location, None)
