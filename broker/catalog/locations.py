"""Where the catalog lets tables live: under the warehouse, nowhere else.

The catalog has no authentication and writes metadata files itself (at create
and at every commit), so a table location or a ``write.metadata.path`` taken
from a request must not point it at an arbitrary directory of the broker's
machine. Like Polaris' allowed locations, but with the warehouse as the one
allowed root.
"""

from __future__ import annotations

import posixpath
from urllib.parse import unquote, urlparse

from broker.catalog.errors import BadRequest

# schemes pyiceberg's FileIO can read; register-table refuses anything else (no http:// fetches)
READABLE_SCHEMES = frozenset(
    {"file", "s3", "s3a", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "hdfs"}
)


def _key(uri: str) -> tuple[str, str, str]:
    """(scheme, authority, normalised path) of a location; a bare path is a local file."""
    parsed = urlparse(uri)
    scheme = parsed.scheme or "file"
    path = unquote(parsed.path) if scheme == "file" else parsed.path
    return scheme, parsed.netloc, posixpath.normpath("/" + path.lstrip("/")) if path else "/"


class Warehouse:
    """The warehouse root and the containment test for locations under it."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self._root = _key(self.root)

    def contains(self, location: str) -> bool:
        if any(ord(c) < 32 for c in location):
            return False
        scheme, authority, path = _key(location)
        root_scheme, root_authority, root_path = self._root
        if scheme != root_scheme and {scheme, root_scheme} - {"s3", "s3a", "s3n"}:
            return False
        return authority == root_authority and (
            path == root_path or path.startswith(root_path.rstrip("/") + "/")
        )

    def check(self, location: str, what: str = "table location") -> str:
        if not self.contains(location):
            raise BadRequest(f"{what} {location!r} is outside the warehouse {self.root}")
        return location


def check_readable(location: str) -> str:
    """A metadata file location pyiceberg may open for register-table."""
    if not location or any(ord(c) < 32 for c in location):
        raise BadRequest("metadata-location is empty or has control characters")
    scheme = urlparse(location).scheme
    if scheme and scheme not in READABLE_SCHEMES:
        raise BadRequest(f"metadata-location scheme {scheme!r} is not supported")
    if not scheme and not location.startswith("/"):
        raise BadRequest("metadata-location must be an absolute path or URI")
    return location
