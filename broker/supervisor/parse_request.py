"""File Airflow priority parsing requests straight into ``icefall up``'s SQLite database: the new
DAGs of a manifest change are parsed a second after it, not after a sync process has started.

``icefall up`` parses the manifest's DAG files every 300 s only and relies on a request per
manifest change (``icefall_airflow.reparse``, filed by ``python -m icefall_airflow.sync``).
That process imports Airflow first: 3-4 s on an idle machine, 15 s on a loaded one, which the
old 10 s periodic parse beat. So ``icefall up`` also files the requests itself, with the
standard library, the moment it sees the manifest change: the rows of
``dag_priority_parsing_request`` as Airflow's model makes them (``id`` = md5 of
``bundle:relative path``, so a pending request is never doubled). Should the table not be
what this expects (another Airflow version), it says so and the sync's request still comes.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

BUNDLE = "dags-folder"  # Airflow's default bundle: the [core] dags_folder
MARKER = "icefall_airflow"  # the DAG files built from the manifest import it
FIRST = "icefall_commit"  # the commit DAGs: parsed first


def manifest_dag_files(folder: Path) -> list[str]:
    """The DAG files under ``folder`` built from the manifest (relative paths), in the order to
    file them: the DAG processor puts each claimed file at the front of its queue, so the last
    filed is parsed first, and that is the commit DAGs' file."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        try:
            if MARKER in path.read_text(errors="replace"):
                out.append(str(path.relative_to(folder)))
        except OSError:
            continue
    return sorted(out, key=lambda rel: FIRST in rel)


def request_id(bundle: str, rel: str) -> str:
    """The request's primary key as Airflow computes it (``models.dagbag.generate_md5_hash``)."""
    return hashlib.md5(f"{bundle}:{rel}".encode()).hexdigest()  # Airflow's key, not security


def file_requests(database: Path, folder: Path) -> list[str]:
    """Insert a request for each manifest DAG file without one; returns the files requested.
    Raises ``sqlite3.Error`` when the database or its table is not there (Airflow not migrated)."""
    files = manifest_dag_files(folder)
    done = []
    db = sqlite3.connect(database, timeout=5)
    try:
        with db:  # one transaction
            for rel in files:
                cursor = db.execute(
                    "INSERT OR IGNORE INTO dag_priority_parsing_request "
                    "(id, bundle_name, relative_fileloc) VALUES (?, ?, ?)",
                    (request_id(BUNDLE, rel), BUNDLE, rel),
                )
                if cursor.rowcount:
                    done.append(rel)
    finally:
        db.close()
    return done
