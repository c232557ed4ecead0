"""pyiceberg's PyArrow FileIO with one S3 request per small file written, for every catalog
Icefall opens.

pyarrow's S3 file system starts a multipart upload when an output stream opens, so each
object pyiceberg writes (a metadata JSON, a manifest, a manifest list, a small round's
Parquet file) costs three requests: CreateMultipartUpload, UploadPart,
CompleteMultipartUpload. With ``allow_delayed_open`` pyarrow waits for the first part to
fill: an object smaller than one part goes as a single PutObject, a larger one is
multipart as before. A commit round writes three metadata files (round branch, data,
publish) and a manifest, a manifest list and a data file, so on S3 this saves twelve of its
requests: round latency at 20-30 ms a request, and S3's price per request.

pyiceberg builds the ``S3FileSystem`` itself and has no property for the option, so
``IcefallFileIO`` rebuilds the one pyiceberg made with the option on, through pyarrow's own
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
"""

from __future__ import annotations

from typing import cast

from pyarrow.fs import FileSystem, S3FileSystem
from pyiceberg.io.pyarrow import PyArrowFileIO

RETRY_STRATEGY_IMPL = "s3.retry-strategy-impl"  # pyiceberg's S3_RETRY_STRATEGY_IMPL


class IcefallFileIO(PyArrowFileIO):
    """``PyArrowFileIO`` whose S3 file systems open output streams lazily (see the module)."""

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        made = super()._initialize_s3_fs(netloc)
        if self.properties.get(RETRY_STRATEGY_IMPL) or not isinstance(made, S3FileSystem):
            return made
        rebuild, (settings,) = made.__reduce__()
        return cast(FileSystem, rebuild({**settings, "allow_delayed_open": True}))
