"""One Airflow configuration for the whole test session, set before Airflow is imported.

Airflow reads its configuration once, at import, so every test module that
touches Airflow calls :func:`configure` at import time (before ``import
airflow``). The AIRFLOW_HOME is a temporary directory removed at exit; its
SQLite database is migrated once per session, and only for tests that need it
(:func:`migrate_db`).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support import REPO

VENV_BIN = str(Path(sys.executable).parent)


@functools.cache
def configure() -> Path:
    """Point Airflow at a throwaway home, this repo's dags/ (the plugin comes by its entry point), and local Spark."""
    home = Path(tempfile.mkdtemp(prefix="icefall-airflow-"))
    atexit.register(shutil.rmtree, home, True)
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[2]"}',
            "PATH": os.pathsep.join([VENV_BIN, os.environ.get("PATH", "")]),
        }
    )
    return home


@functools.cache
def migrate_db() -> Path:
    """``airflow db migrate`` once per session (a subprocess: it is what a user runs)."""
    home = configure()
    subprocess.run(
        [os.path.join(VENV_BIN, "airflow"), "db", "migrate"],
        check=True,
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=300,
    )
    return home


def auth_headers(role: str | None = "admin") -> dict[str, str]:
    """An ``Authorization`` header with a JWT of Airflow's own auth manager (the Simple one the tests
    configure), as the API server issues at login: for calling the plugin's app in-process."""
    migrate_db()  # the auth manager looks every token up in the revoked_token table
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    manager = init_auth_manager()
    token = manager.generate_jwt(SimpleAuthManagerUser(username="admin", role=role))
    return {"Authorization": f"Bearer {token}"}
