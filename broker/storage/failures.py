"""Which exceptions mean "this broker's storage cannot write now" (a full disk, an I/O
error, a read-only remount), as opposed to a bug or bad input.

Such a failure is the disk's, not the request's: the caller gets Kafka's retriable
KAFKA_STORAGE_ERROR with the reason, the connection stays open, and the broker says so in
its log once in a while (``StorageFailureLog``), not once per request, because clients
retry many times a second while a disk stays full. Every writer that can hit it (the WAL,
the metadata database, the manifest, the local object store) shares this one test."""

from __future__ import annotations

import errno
import logging
import sqlite3
import time
from collections.abc import Callable

from broker.repeated_log import RepeatedLog

# ENOSPC: the disk is full; EDQUOT: the quota is; EIO: the device failed; EROFS: remounted read-only
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
# SQLite's messages for SQLITE_FULL, SQLITE_IOERR and SQLITE_READONLY
_SQLITE_MESSAGES = ("database or disk is full", "disk i/o error", "readonly database")
# Postgres (cluster mode): class 53 "insufficient resources" (53100 disk_full) and 58030 io_error
_PG_STATES = ("53100", "58030")


def is_storage_failure(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        return True
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(m in text for m in _SQLITE_MESSAGES)
    return getattr(exc, "sqlstate", None) in _PG_STATES


class StorageFailureLog:
    """One log line per ``every_s`` for requests refused because storage cannot write, with
    how many were refused since the last line."""

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lines = RepeatedLog(logger, every_s, logging.ERROR, clock, wrappers=1)

    def refused(self, what: str, exc: BaseException, code: str = "KAFKA_STORAGE_ERROR") -> None:
        # the message, not the exception: a held exception holds its frames (produce buffers)
        self._lines.log(None, "%s refused with %s, storage cannot write: %s", what, code, str(exc))
