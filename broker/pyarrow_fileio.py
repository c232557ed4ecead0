"""pyiceberg's PyArrow FileIO whose S3 file systems open their output streams lazily: one
PutObject for a file smaller than a part (``broker.iceberg_fileio`` says why, and why this
module is imported only when a file is opened)."""

from __future__ import annotations

from typing import cast

from pyarrow.fs import FileSystem, S3FileSystem
from pyiceberg.io.pyarrow import PyArrowFileIO

RETRY_STRATEGY_IMPL = "s3.retry-strategy-impl"  # pyiceberg's S3_RETRY_STRATEGY_IMPL


class DelayedOpenFileIO(PyArrowFileIO):
    """``PyArrowFileIO`` with ``allow_delayed_open`` on the S3 file systems it makes, unless a
    custom retry strategy is set (pyarrow's pickling, which rebuilds it, cannot carry one)."""

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        made = super()._initialize_s3_fs(netloc)
        if self.properties.get(RETRY_STRATEGY_IMPL) or not isinstance(made, S3FileSystem):
            return made
        rebuild, (settings,) = made.__reduce__()
        return cast(FileSystem, rebuild({**settings, "allow_delayed_open": True}))
