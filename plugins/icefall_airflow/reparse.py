"""Ask the DAG processor to re-parse the manifest's DAG files now: a table topic's DAG appears
(or goes stale) within a second of the manifest changing, not at the next periodic parse.

The DAG files that read the broker's manifest at parse time (those importing
``icefall_airflow``) change only when the manifest does, so ``icefall up`` lets the DAG
processor re-parse them on a long interval (re-parsing every 10 s was a large part of Airflow's
idle CPU) and, whenever the manifest changes, files a priority parsing request for each: a row
of Airflow's ``dag_priority_parsing_request`` table, what the REST API's ``PUT
/api/v2/parseDagFile/{file_token}`` files and what the DAG processor claims at the top of every
loop (about once a second). ``icefall_airflow.sync`` calls it, so other deployments get it by
running the sync after changing table topics; ``icefall up`` also files them itself, without
starting a process (``broker.supervisor.parse_request``, which also says which files and in
what order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.supervisor.parse_request import BUNDLE, manifest_dag_files


def request_parse(session: Any, folder: Path | None = None) -> list[str]:
    """File a priority parsing request for each manifest DAG file that has none pending; returns
    the files requested. ``folder``: the DAGs folder (default: Airflow's ``[core] dags_folder``)."""
    from airflow.configuration import conf
    from airflow.models.dagbag import DagPriorityParsingRequest
    from sqlalchemy import select

    folder = folder or Path(conf.get("core", "dags_folder"))
    pending = set(
        session.scalars(
            select(DagPriorityParsingRequest.relative_fileloc).where(
                DagPriorityParsingRequest.bundle_name == BUNDLE
            )
        )
    )
    files = [f for f in manifest_dag_files(folder) if f not in pending]
    for rel in files:
        session.add(DagPriorityParsingRequest(bundle_name=BUNDLE, relative_fileloc=rel))
    return files
