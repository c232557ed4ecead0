"""The Airflow database settings ``icefall up`` runs Airflow with (``AirflowStack.env``): a
session that ends with a result still open must not leave later sessions an old database.

Airflow's backfill code leaves such a result when the scheduler holds SQLite's lock (an
unconsumed ``SELECT ... FOR UPDATE`` kept alive by the error's traceback). On a pooled
connection its read snapshot outlived the request: every later request the connection served
read the database as it was then and could not write to it, so task instances created since
were "not found", heartbeats failed, and every round failed until a restart (seen in
tests/reliability/test_airflow_faults.py). The check runs Airflow's own engine, configured from
the stack's environment, in a process of its own (Airflow reads its settings at import)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.supervisor import warm_driver
from broker.supervisor.up import AirflowStack
from tests.support import free_port

SCRIPT = """
import json, sqlite3, sys
from sqlalchemy import text
from airflow import settings

database = settings.engine.url.database
with settings.engine.begin() as conn:
    conn.execute(text("CREATE TABLE task (id TEXT PRIMARY KEY, state TEXT)"))
    conn.execute(text("INSERT INTO task VALUES ('old', 'queued')"))

leaked = []
session = settings.NonScopedSession()
try:
    with session.begin_nested():
        leaked.append(session.execute(text("SELECT * FROM task")))  # never read to its end
        raise RuntimeError("database is locked")
except RuntimeError:
    session.rollback()
finally:
    session.close()

other = sqlite3.connect(database, isolation_level=None)  # the scheduler, say
other.execute("INSERT INTO task VALUES ('new', 'queued')")
other.close()

seen, updated = [], []
for _ in range(5):  # more sessions than a pool keeps connections
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
print(json.dumps({"pool": type(settings.engine.pool).__name__, "seen": seen, "updated": updated}))
"""


def test_a_session_left_with_an_open_result_does_not_give_later_ones_an_old_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(warm_driver.DISABLE_ENV, "1")
    home = tmp_path / "home"
    stack = AirflowStack(BrokerConfig(home=home), home, free_port())
    stack.home.mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["seen"] == [["new", "old"]] * 5, report
    assert report["updated"] == [1] * 5, report
