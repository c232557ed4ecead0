"""Parsed table metadata by file location: a metadata file is read once per process.

A metadata JSON is never rewritten: every commit writes a new file (its name carries a
version and a UUID) and moves the catalog's pointer to it. So the metadata parsed from a
location stays true for that location, and a process that reads a table again and again
(the broker's catalog on each load-table and each commit, a round's driver loading its
table to plan, write and publish, the warm driver's rounds) need not fetch and parse the
same file each time: on S3 that is a HEAD and a GET, and the parse of a file that grows with
the table's snapshots. A file the process writes itself is remembered as written, so the
commit that follows it reads nothing.

Only the pointer's lookup (the catalog's database, S3 Tables' or Nessie's API) says which
location is current; this cache never answers that. Bounded: the most recently used
``MAX_ENTRIES`` locations (an active table needs its current one).
"""

from __future__ import annotations

import threading

from cachetools import LRUCache
from pyiceberg.io import FileIO
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.metadata import TableMetadata

MAX_ENTRIES = 64

_cache: LRUCache[str, TableMetadata] = LRUCache(maxsize=MAX_ENTRIES)
_lock = threading.Lock()


def read(io: FileIO, location: str) -> TableMetadata:
    """The metadata at ``location``, fetched and parsed only the first time."""
    with _lock:
        found = _cache.get(location)
    if found is not None:
        return found
    metadata = FromInputFile.table_metadata(io.new_input(location))
    remember(location, metadata)
    return metadata


def remember(location: str, metadata: TableMetadata) -> None:
    """``metadata`` is what ``location`` holds (this process has just written it)."""
    with _lock:
        _cache[location] = metadata


def clear() -> None:
    with _lock:
        _cache.clear()
