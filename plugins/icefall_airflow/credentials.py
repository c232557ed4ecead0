"""Credentials for the registry and the catalog, from Airflow connections, looked up when a
task runs (never at DAG parse time):

* ``icefall_registry``: login and password of the schema registry's HTTP basic auth;
* ``icefall_admin``: login and password of the broker's admin API's HTTP basic auth
  (``admin.authentication.method=BASIC``), for every call of the admin API from Airflow (the
  tasks, the triggerer's size watch, the status view) and for the Spark jobs;
* ``icefall_catalog``: login = OAuth2 client id, password = client secret of the Iceberg REST
  catalog; or, for an external REST catalog that takes a static bearer token, the token in the
  extra (``{"token": "..."}``) or as the password of a connection without a login.

A missing connection means that service is open (the default). Airflow masks a connection's
password in task logs once it is read; the joined ``user:password`` forms are masked here too.
They reach a Spark job through spark-submit's environment (``job_env``), never its argv (which
``ps`` and the task log show), and the jobs never write them into a result or a log line
(``broker/http_security/client.py`` reads them there). Code in this process (pyiceberg in a
task, the status view in the long-lived API server) gets them as an argument, looked up anew
each time: this process's environment is never changed, so a rotated secret takes effect at
the next lookup.
"""

from __future__ import annotations

import os
from typing import Any

from broker.http_security.client import (
    ADMIN_USER_INFO_ENV,
    CATALOG_CREDENTIAL_ENV,
    CATALOG_TOKEN_ENV,
    REGISTRY_USER_INFO_ENV,
)

REGISTRY_CONN_ID = "icefall_registry"
CATALOG_CONN_ID = "icefall_catalog"
ADMIN_CONN_ID = "icefall_admin"


def _connection(conn_id: str) -> Any | None:
    """The Airflow connection ``conn_id``, or None when it is not defined.

    The Task SDK's lookup first. In a task its answer is final: it asks the environment's
    ``AIRFLOW_CONN_*``, the configured secrets backends and the Execution API, so "not found" is
    None at once (falling through to ``airflow.models`` asked the API server a second time and
    put a deprecation warning in every task log). Outside a task (the API server's status view)
    the SDK may have no way to the metadata database; that is the fallback's.
    """
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return Connection.get(conn_id)
    except AirflowNotFoundException:
        if _in_task():
            return None
    except Exception:  # noqa: BLE001 -- outside a task: the metadata DB, below
        pass
    try:
        from airflow.models.connection import Connection as StoredConnection

        return StoredConnection.get_connection_from_secrets(conn_id)
    except Exception:  # noqa: BLE001 -- not defined anywhere: the service is open
        return None


def _in_task() -> bool:
    """Whether this code runs in a task (the SDK has its context), by the SDK's public call."""
    from airflow.sdk import get_current_context

    try:
        get_current_context()
    except Exception:  # noqa: BLE001 -- "no context was found": not in a task
        return False
    return True


def _mask(*values: str) -> None:
    try:
        from airflow.sdk.log import mask_secret

        for value in values:
            mask_secret(value)
    except ImportError:  # pragma: no cover -- an Airflow without the SDK's masker
        pass


def _login_password(connection: Any | None) -> str | None:
    """``login:password`` of a connection, or None when it is not defined (or has no login)."""
    if connection is None or not connection.login:
        return None
    joined = f"{connection.login}:{connection.password or ''}"
    _mask(*([connection.password] if connection.password else []), joined)
    return joined


def _token(connection: Any | None) -> str | None:
    """A static bearer token: the extra's ``token``, or the password of a connection without a
    login."""
    if connection is None:
        return None
    try:
        extra = connection.extra_dejson
    except Exception:  # noqa: BLE001 -- an extra that is not JSON holds no token
        extra = {}
    token = extra.get("token") if isinstance(extra, dict) else None
    if not token and not connection.login:
        token = connection.password
    if token:
        _mask(str(token))
    return str(token) if token else None


def admin_user_info() -> str | None:
    """``user:password`` for the admin API: ``ICEFALL_ADMIN_USER_INFO`` of this process, else
    the ``icefall_admin`` connection's, else None (an open admin API). Looked up anew."""
    return os.environ.get(ADMIN_USER_INFO_ENV) or _login_password(_connection(ADMIN_CONN_ID))


def job_env() -> dict[str, str]:
    """The environment variables carrying the connections' credentials to a Spark job (those
    already in this process's environment win: a deployment may set them there). Looked up
    anew at each call."""
    out: dict[str, str] = {}
    wanted = {
        REGISTRY_USER_INFO_ENV: os.environ.get(REGISTRY_USER_INFO_ENV),
        CATALOG_CREDENTIAL_ENV: os.environ.get(CATALOG_CREDENTIAL_ENV),
        CATALOG_TOKEN_ENV: os.environ.get(CATALOG_TOKEN_ENV),
        ADMIN_USER_INFO_ENV: admin_user_info(),
    }
    if not wanted[REGISTRY_USER_INFO_ENV]:
        wanted[REGISTRY_USER_INFO_ENV] = _login_password(_connection(REGISTRY_CONN_ID))
    if not (wanted[CATALOG_CREDENTIAL_ENV] and wanted[CATALOG_TOKEN_ENV]):
        catalog = _connection(CATALOG_CONN_ID)
        wanted[CATALOG_CREDENTIAL_ENV] = wanted[CATALOG_CREDENTIAL_ENV] or _login_password(catalog)
        wanted[CATALOG_TOKEN_ENV] = wanted[CATALOG_TOKEN_ENV] or _token(catalog)
    for var, value in wanted.items():
        if value:
            out[var] = value
    return out
