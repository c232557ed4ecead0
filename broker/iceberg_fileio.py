"""Icefall's FileIO for every catalog it opens: pyiceberg's PyArrow FileIO, made at the first
file, with one S3 request per small file written.

pyarrow's S3 file system starts a multipart upload when an output stream opens, so each
object pyiceberg writes (a metadata JSON, a manifest, a manifest list, a small round's
Parquet file) costs three requests: CreateMultipartUpload, UploadPart,
CompleteMultipartUpload. With ``allow_delayed_open`` pyarrow waits for the first part to
fill: an object smaller than one part goes as a single PutObject, a larger one is
multipart as before. A commit round writes three metadata files (round branch, data,
publish) and a manifest, a manifest list and a data file, so on S3 this saves twelve of its
requests: round latency at 20-30 ms a request, and S3's price per request.

pyiceberg builds the ``S3FileSystem`` itself and has no property for the option, so
Icefall's FileIO rebuilds the one pyiceberg made with the option on, through pyarrow's own
pickling (``__reduce__`` gives every setting it was made with). One setting does not survive
that: a custom ``s3.retry-strategy-impl``; with one set, the file system stays as pyiceberg
made it.

``broker.contracts.with_default_io`` names it as ``py-io-impl`` in the properties of the
catalogs Icefall's processes open (the broker's own store, the rounds', the Airflow plugin's),
unless the properties name another FileIO (``automq.table.topic.catalog.py-io-impl``). It is
never handed to a catalog's clients: their pyiceberg has no ``broker`` package. What naming
it changes besides S3 writes: every scheme gets pyarrow's file system, where pyiceberg would
pick its fsspec FileIO for a few (Azure's ``abfs``, ``hf://``; pyarrow reads Azure too), and an
external REST catalog's ``/v1/config`` defaults cannot name a FileIO over it (its overrides
can). A round's Spark tasks load it too: their ``--py-files`` zip carries the ``broker``
package (``icefall_airflow.py_files``), and with ``ICEFALL_SPARK_PY_FILES=none`` the
executors' Icefall must be as new as the driver's.

The PyArrow FileIO is made at its first file, not when its catalog loads a table: pyiceberg's PyArrow FileIO
module imports ``pyarrow.dataset``, and with it pandas (pyarrow's pandas shim), ~0.5 s of CPU.
pyiceberg makes a table's FileIO on every ``load_table``, but a commit round with nothing new
(the round of an idle table topic, every commit interval, as a process of its own where no warm
driver runs it) reads every fact it needs from the metadata the catalog answers with and opens
no file. So ``IcefallFileIO`` is a ``FileIO`` that hands ``new_input``, ``new_output`` and
``delete`` (the whole interface pyiceberg calls) to the PyArrow FileIO it makes at the first of
them, ``DelayedOpenFileIO`` in ``broker.pyarrow_fileio``.

That PyArrow FileIO is shared by the ``IcefallFileIO``s of a process with the same properties
(the last ``SHARED_MAX`` sets). pyiceberg makes a FileIO at every ``load_table`` and commit, and
each PyArrow FileIO makes its own file systems: on S3 a new AWS client and new connections (on
AWS a TLS handshake each) for every table load and commit that opens a file (a round's data
and manifest files, a commit's metadata file). Shared, one client's connections serve them
all. A forked child starts with none shared (the AWS SDK is not fork-safe), the FileIOs it
inherits too.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pyiceberg.io import FileIO, InputFile, OutputFile
from pyiceberg.typedef import EMPTY_DICT, Properties

if TYPE_CHECKING:
    from broker.pyarrow_fileio import DelayedOpenFileIO


# property sets whose PyArrow FileIO (and its file systems, connections and any credentials
# the properties carry) are kept for the next FileIO, for the life of the process
SHARED_MAX = 64
_shared: OrderedDict[tuple[tuple[str, str], ...], DelayedOpenFileIO] = OrderedDict()
_sharing = threading.Lock()


def _forget_in_child() -> None:
    """A forked child shares nothing made before the fork, and takes a new lock (another thread
    of the parent may have held the old one at the fork)."""
    global _sharing
    _sharing = threading.Lock()
    _shared.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _shared_pyarrow_io(properties: Properties) -> DelayedOpenFileIO:
    """The PyArrow FileIO of these properties in this process, made at the first call."""
    key = tuple(sorted((name, str(value)) for name, value in properties.items()))
    with _sharing:
        if (made := _shared.get(key)) is not None:
            _shared.move_to_end(key)
            return made
        from broker.pyarrow_fileio import DelayedOpenFileIO

        made = _shared[key] = DelayedOpenFileIO(dict(properties))  # not the caller's dict
        if len(_shared) > SHARED_MAX:
            _shared.popitem(last=False)
        return made


class IcefallFileIO(FileIO):
    """pyiceberg's PyArrow FileIO, made at the first file and with S3 output streams opened
    lazily (see the module)."""

    def __init__(self, properties: Properties = EMPTY_DICT) -> None:
        super().__init__(properties)
        self._made: DelayedOpenFileIO | None = None
        self._made_in = 0  # the process that made it: a forked child makes its own

    def pyarrow_io(self) -> DelayedOpenFileIO:
        """The PyArrow FileIO every call goes to: the process's for these properties, made
        (and pyarrow's modules imported) at the first file."""
        if self._made is None or self._made_in != os.getpid():
            self._made, self._made_in = _shared_pyarrow_io(self.properties), os.getpid()
        return self._made

    def new_input(self, location: str) -> InputFile:
        return self.pyarrow_io().new_input(location)

    def new_output(self, location: str) -> OutputFile:
        return self.pyarrow_io().new_output(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        self.pyarrow_io().delete(location)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as its properties (a Spark task's copy uses its own process's file systems)."""
        return {"properties": self.properties}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["properties"])  # type: ignore[misc]
