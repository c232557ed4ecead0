"""``icefall_airflow.sync`` against a real Airflow database: pools for table topics,
disabled topics' DAGs paused, re-enabled ones unpaused, a DAG paused by hand left alone, and
a priority parsing request for each DAG file built from the manifest (once: one pending
request per file), by the sync or by ``icefall up`` itself (``parse_request``).

DAGs reach the database the way a deployment's do (``airflow dags reserialize``
parses the dags folder against the manifest); the sync runs as its command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.supervisor import parse_request
from tests.dags import airflow_env, manifests
from tests.support import REPO

airflow_env.configure()

TOPIC = "synced"


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "ICEFALL_HOME": str(home)}  # icefall_airflow is installed: no PYTHONPATH


def reserialize(home: Path) -> None:
    subprocess.run(
        [os.path.join(airflow_env.VENV_BIN, "airflow"), "dags", "reserialize"],
        check=True,
        env=_env(home),
        capture_output=True,
        timeout=300,
    )


def run_sync(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "icefall_airflow.sync", *args],
        check=False,
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=300,
    )


def paused(dag_id: str) -> bool | None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        model = DagModel.get_dagmodel(dag_id, session=session)
        return None if model is None else bool(model.is_paused)


def parse_requests() -> list[tuple[str, str]]:
    from airflow.models.dagbag import DagPriorityParsingRequest
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(
                DagPriorityParsingRequest.bundle_name, DagPriorityParsingRequest.relative_fileloc
            )
        )
        return sorted((bundle, rel) for bundle, rel in rows)


def clear_parse_requests() -> None:
    from airflow.models.dagbag import DagPriorityParsingRequest
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(DagPriorityParsingRequest))


def set_paused(dag_id: str, value: bool) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        model = DagModel.get_dagmodel(dag_id, session=session)
        assert model is not None
        model.is_paused = value


@pytest.mark.timeout(600)
def test_disabling_pauses_and_enabling_resumes(tmp_path: Path) -> None:
    airflow_env.migrate_db()
    from airflow.models.pool import Pool

    commit_id, by_hand = f"icefall_commit__{TOPIC}", f"icefall_commit__{TOPIC}_manual"
    clear_parse_requests()  # another test's sync may have left some (no DAG processor here)

    # Disabled before Airflow ever parsed it: the sync says to come back (exit 3), pausing nothing.
    manifests.write(
        tmp_path, manifests.entry(f"{TOPIC}_manual"), disabled=(manifests.disabled_entry(TOPIC),)
    )
    early = run_sync(tmp_path)
    assert early.returncode == 3, early.stdout + early.stderr
    assert f"{commit_id} is not parsed yet" in early.stdout
    # the manifest's DAG files (they import icefall_airflow) are queued for the DAG processor
    manifest_files = sorted(
        p.name for p in (REPO / "dags").glob("*.py") if "icefall_airflow" in p.read_text()
    )
    assert "icefall_commit.py" in manifest_files
    assert parse_requests() == [("dags-folder", name) for name in manifest_files]
    for name in manifest_files:
        assert f"asked the DAG processor to re-parse {name}" in early.stdout
    again = run_sync(tmp_path)  # requests still pending: none added, none duplicated
    assert again.returncode == 3 and "re-parse" not in again.stdout, again.stdout + again.stderr
    assert parse_requests() == [("dags-folder", name) for name in manifest_files]
    # `icefall up` files the same rows itself (SQLite, no Airflow import), the commit DAGs' file
    # last (parsed first), and Airflow's model reads them; a pending one is not filed twice
    clear_parse_requests()
    database = airflow_env.configure() / "airflow.db"
    filed = parse_request.file_requests(database, REPO / "dags")
    assert sorted(filed) == manifest_files and filed[-1] == "icefall_commit.py"
    assert parse_requests() == [("dags-folder", name) for name in manifest_files]
    assert parse_request.file_requests(database, REPO / "dags") == []
    assert "re-parse" not in run_sync(tmp_path).stdout  # the sync sees them pending
    clear_parse_requests()  # `icefall up` filed them: its sync files none
    assert "re-parse" not in run_sync(tmp_path, "--no-parse-request").stdout
    assert parse_requests() == []

    reserialize(tmp_path)
    assert paused(commit_id) is False  # commit DAGs start unpaused
    set_paused(by_hand, True)  # an operator's own pause
    done = run_sync(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"paused {commit_id}" in done.stdout
    assert paused(commit_id) is True and paused(by_hand) is True
    assert Pool.get_pool(f"icefall_table__{TOPIC}_manual") is not None

    # Enabled again (and the manual one still enabled): only what the sync paused is unpaused.
    manifests.write(tmp_path, manifests.entry(f"{TOPIC}_manual"), manifests.entry(TOPIC))
    reserialize(tmp_path)
    done = run_sync(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"unpaused {commit_id}" in done.stdout
    assert paused(commit_id) is False and paused(by_hand) is True
    assert "unpaused" not in run_sync(tmp_path).stdout  # nothing left to undo
