"""Airflow's login in front of the "Table topics" view: who may see which table topics.

Airflow mounts a plugin's FastAPI app with ``app.mount()``, whose routes inherit
none of the core API's dependencies: without this module anyone who reaches the
API server reads the view. So every route here depends on Airflow's own
``get_user`` (``airflow.api_fastapi.core_api.security``): the JWT from the
``Authorization: Bearer`` header, else the ``_token`` cookie the Airflow UI sets at
login, validated by the configured auth manager (Simple, FAB, Keycloak...). No
token: 401 (an invalid or expired one: Airflow's 401/403), and the HTML pages
redirect to the auth manager's login page (``get_url_login(next_url=...)``), which
brings the user back after logging in.

Authorization follows the DAGs: a table topic's row, charts and snapshots are
shown to a user the auth manager lets read (GET) its commit DAG, the runs the
view links to. A table topic whose DAG the user may not read is left out, as
Airflow leaves out such DAGs from its own lists.
"""

from __future__ import annotations

from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.core_api.security import get_user
from fastapi import Depends, Request, status
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

User = Annotated[BaseUser, Depends(get_user)]


def may_read_dag(user: BaseUser, dag_id: str) -> bool:
    """Whether the auth manager lets ``user`` read the DAG ``dag_id`` (and so its table topic)."""
    return bool(
        get_auth_manager().is_authorized_dag(method="GET", details=DagDetails(id=dag_id), user=user)
    )


def visible(user: BaseUser, answer: dict[str, Any]) -> dict[str, Any]:
    """The status answer with only the table topics whose commit DAG ``user`` may read."""
    tables = [t for t in answer["tables"] if may_read_dag(user, t["dag_id"])]
    return {**answer, "tables": tables, "hidden_tables": len(answer["tables"]) - len(tables)}


def login_url(request: Request) -> str:
    """The auth manager's login page, coming back to the page asked for."""
    return str(get_auth_manager().get_url_login(next_url=str(request.url)))


async def not_logged_in(request: Request, exc: Exception) -> Response:
    """An HTTPException of the app: a page asked for without a (valid) login goes to the login
    page; the JSON endpoints, and every other error, answer with the status and detail."""
    assert isinstance(exc, StarletteHTTPException)  # what the app registers this handler for
    unauthenticated = exc.status_code == status.HTTP_401_UNAUTHORIZED or (
        exc.status_code == status.HTTP_403_FORBIDDEN and exc.detail == "Invalid JWT token"
    )
    if (
        unauthenticated
        and request.method == "GET"
        and not request.url.path.startswith(_api_prefix(request))
    ):
        return RedirectResponse(login_url(request), status_code=status.HTTP_303_SEE_OTHER)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def _api_prefix(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/") + "/api/"
