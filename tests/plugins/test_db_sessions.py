"""The Airflow database settings ``icefall up`` runs Airflow with (``AirflowStack.env``, its
session maker ``icefall_airflow.db_sessions``): a session that ends with a result still open
and a lock error must not leave later sessions an old database.

Airflow's backfill code leaves such a result when the scheduler holds SQLite's lock (its
row-lock query, a plain ``SELECT`` on SQLite, never read to its end and kept alive by the
error's traceback). On a pooled
connection its read snapshot outlived the request: every later request the connection served
read the database as it was then and could not write to it, so task instances created since
were "not found", heartbeats failed, and every round failed until a restart (seen in
tests/reliability/test_airflow_faults.py). The check runs Airflow's own engine, configured from
the stack's environment, in a process of its own (Airflow reads its settings at import)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.supervisor import warm_driver
from broker.supervisor.up import AirflowStack
from tests.support import free_port, python_json

SCRIPT = """
import json, sqlite3, sys
from sqlalchemy import text
from airflow import settings

database = settings.engine.url.database
with settings.engine.begin() as conn:
    conn.execute(text("CREATE TABLE task (id TEXT PRIMARY KEY, state TEXT)"))
    conn.execute(text("INSERT INTO task VALUES ('old', 'queued')"))

# What Airflow's backfill does when the scheduler commits meanwhile: in a nested transaction, a
# SELECT whose result is never read to its end, then a write, refused: the scheduler committed
# after the SELECT's snapshot (SQLITE_BUSY_SNAPSHOT, "database is locked"). The traceback, kept,
# keeps the result alive.
kept = []
session = settings.NonScopedSession()
try:
    with session.begin_nested():
        kept.append(session.execute(text("SELECT * FROM task")))
        scheduler = sqlite3.connect(database, isolation_level=None)
        scheduler.execute("INSERT INTO task VALUES ('new', 'queued')")
        scheduler.close()
        session.execute(text("UPDATE task SET state = 'backfill'"))
except Exception as exc:
    kept.append(exc)
    session.rollback()
finally:
    session.close()

seen, updated = [], []
for _ in range(8):  # one after another: each takes the connection the last one returned
    session = settings.NonScopedSession()
    try:
        seen.append(sorted(session.execute(text("SELECT id FROM task")).scalars()))
        result = session.execute(text("UPDATE task SET state = 'running' WHERE id = 'new'"))
        session.commit()
        updated.append(result.rowcount)
    except Exception as exc:
        updated.append(repr(exc)[:200])
    finally:
        session.close()
print(json.dumps({"error": repr(kept[-1])[:200], "seen": seen, "updated": updated}))
"""


def test_a_session_left_with_an_open_result_does_not_give_later_ones_an_old_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(warm_driver.DISABLE_ENV, "1")
    home = tmp_path / "home"
    stack = AirflowStack(BrokerConfig(home=home), home, free_port())
    stack.home.mkdir(parents=True)
    report = python_json(["-c", SCRIPT], stack.env)
    assert "database is locked" in report["error"], report  # the lock error, as in Airflow
    assert report["seen"] == [["new", "old"]] * 8, report
    assert report["updated"] == [1] * 8, report
