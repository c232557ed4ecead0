"""Credentials for the registry and the catalog, from Airflow connections, looked up when a
task runs (never at DAG parse time):

* ``icefall_registry``: login and password of the schema registry's HTTP basic auth;
* ``icefall_catalog``: login = OAuth2 client id, password = client secret of the Iceberg REST
  catalog.

A missing connection means that service is open (the default). Airflow masks a connection's
password in task logs once it is read; the joined ``user:password`` forms are masked here too.
They reach a Spark job through spark-submit's environment (``job_env``), never its argv (which
``ps`` and the task log show), and the jobs never write them into a result or a log line
(``broker/http_security/client.py`` reads them there).
"""

from __future__ import annotations

import os
from typing import Any

from broker.http_security.client import CATALOG_CREDENTIAL_ENV, REGISTRY_USER_INFO_ENV

REGISTRY_CONN_ID = "icefall_registry"
CATALOG_CONN_ID = "icefall_catalog"


def _login_password(conn_id: str) -> str | None:
    """``login:password`` of a connection, or None when it is not defined (or has no login)."""
    connection: Any
    try:
        from airflow.sdk import Connection

        connection = Connection.get(conn_id)
    except Exception:  # noqa: BLE001 -- outside a task (the API server's view): the metadata DB
        try:
            from airflow.models.connection import Connection as StoredConnection

            connection = StoredConnection.get_connection_from_secrets(conn_id)
        except Exception:  # noqa: BLE001 -- not defined anywhere: the service is open
            return None
    if not connection.login:
        return None
    joined = f"{connection.login}:{connection.password or ''}"
    try:
        from airflow.sdk.log import mask_secret

        if connection.password:
            mask_secret(connection.password)
        mask_secret(joined)
    except ImportError:  # pragma: no cover -- an Airflow without the SDK's masker
        pass
    return joined


def job_env() -> dict[str, str]:
    """The environment variables carrying the connections' credentials to a Spark job (those
    already in this process's environment win: a deployment may set them there)."""
    out: dict[str, str] = {}
    for var, conn_id in (
        (REGISTRY_USER_INFO_ENV, REGISTRY_CONN_ID),
        (CATALOG_CREDENTIAL_ENV, CATALOG_CONN_ID),
    ):
        value = os.environ.get(var) or _login_password(conn_id)
        if value:
            out[var] = value
    return out


def export() -> None:
    """Put the credentials into this process's environment, for code here that opens the
    catalog or registry itself (pyiceberg in a task, the status view)."""
    for var, value in job_env().items():
        os.environ.setdefault(var, value)
