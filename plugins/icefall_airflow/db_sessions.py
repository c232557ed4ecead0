"""Airflow's session maker under ``icefall up`` (``[database] sql_alchemy_session_maker``): on
SQLite, a pooled connection that hit "database is locked" is replaced at its next checkout.

Why: Airflow's backfill code, when the scheduler holds SQLite's lock, leaves a query result
unread on its connection (the ``SELECT`` of ``_create_backfill_dag_run_non_partitioned``, kept
alive by the error's traceback). An unread result keeps its read snapshot open, and Python 3.11's
``sqlite3`` no longer resets statements on rollback, so the connection went back to the pool
still reading the database as it was. Every later request it served saw no task instance created
since ("Task Instance not found") and could not write (``SQLITE_BUSY_SNAPSHOT``, also "database
is locked"): every round failed until Airflow restarted. Seen in
tests/reliability/test_airflow_faults.py; checked in tests/plugins/test_db_sessions.py.

There the connection that keeps the old snapshot is the one whose write was refused, so the
lock error marks it, and the pool's next checkout of it throws it away and opens a fresh one
(SQLAlchemy's documented ``DisconnectionError`` at checkout), outside any caller's transaction.
A connection left on an old snapshot some other way is replaced only once one of its writes is
refused; what it read before that was old. The guard is on Airflow's sync engine, which the
execution API, the scheduler and the backfill code use; its async engine (multi-team lookups,
the DAG-run wait service) is pooled without it.

Without a pool (``NullPool``) there is nothing to mark, but every session opens a connection and
reads the schema again: twice Airflow's idle CPU (bench/BENCHMARKS.md, "Airflow's database
connections").

Kept free of Airflow imports: every Airflow component imports it while it configures its ORM.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine, ExceptionContext
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

STALE = "icefall_stale_after_lock_error"


def session_maker(engine: Engine) -> sessionmaker[Any]:
    """The session factory Airflow builds by default, with the SQLite guard on ``engine``."""
    if engine.dialect.name == "sqlite" and not event.contains(engine, "handle_error", _mark):
        event.listen(engine, "handle_error", _mark)
        event.listen(engine, "checkout", _replace_marked)
    return sessionmaker(engine, autocommit=False, autoflush=False, expire_on_commit=False)


def _mark(context: ExceptionContext) -> None:
    error = context.original_exception
    if (
        context.connection is not None
        and isinstance(error, sqlite3.OperationalError)
        and "locked" in str(error)
    ):
        context.connection.info[STALE] = True


def _replace_marked(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
    if record.info.pop(STALE, False):
        raise DisconnectionError(
            "a SQLite connection that hit a lock error may read an old snapshot"
        )
