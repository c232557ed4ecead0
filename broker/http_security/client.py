"""How Icefall's own clients (the Spark jobs, the Airflow plugin, the broker's reader of an
external catalog) authenticate to the registry and the catalog: from their environment, which
the Airflow operators fill from Airflow connections at task run time
(``plugins/icefall_airflow/credentials.py``), never from argv, code, the manifest or
``/v1/cluster``.

* ``ICEFALL_REGISTRY_USER_INFO=user:password``: HTTP basic auth on the schema registry (what
  Confluent's clients call ``basic.auth.user.info``);
* ``ICEFALL_ADMIN_USER_INFO=user:password``: HTTP basic auth on the broker's admin API
  (``broker.admin_client``: every caller of the admin API, the ``icefall cluster`` command too);
* ``ICEFALL_CATALOG_CREDENTIAL=client_id:client_secret``: the Iceberg REST catalog's OAuth2
  client credentials (the ``credential`` catalog property of pyiceberg and Spark);
* ``ICEFALL_CATALOG_TOKEN=<token>``: a static bearer token for an external REST catalog that
  takes one (the ``token`` catalog property), which ``/v1/cluster`` never serves either.

TLS trust is the platform's: ``SSL_CERT_FILE`` (Python's ``urllib``), ``REQUESTS_CA_BUNDLE``
(pyiceberg) and the JVM's ``javax.net.ssl.trustStore`` (Spark).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping

REGISTRY_USER_INFO_ENV = "ICEFALL_REGISTRY_USER_INFO"
ADMIN_USER_INFO_ENV = "ICEFALL_ADMIN_USER_INFO"
CATALOG_CREDENTIAL_ENV = "ICEFALL_CATALOG_CREDENTIAL"
CATALOG_TOKEN_ENV = "ICEFALL_CATALOG_TOKEN"
TOKEN_PATH = "/v1/oauth/tokens"
# every variable above: what ``icefall_airflow.credentials.job_env`` may give a job
CREDENTIAL_ENVS = (
    REGISTRY_USER_INFO_ENV,
    CATALOG_CREDENTIAL_ENV,
    CATALOG_TOKEN_ENV,
    ADMIN_USER_INFO_ENV,
)


def registry_user_info() -> str | None:
    """``user:password`` for the registry, or None (an open registry)."""
    return os.environ.get(REGISTRY_USER_INFO_ENV) or None


def admin_user_info() -> str | None:
    """``user:password`` for the admin API, or None (an open admin API)."""
    return os.environ.get(ADMIN_USER_INFO_ENV) or None


def basic_auth_header(user_info: str | None) -> dict[str, str]:
    """The ``Authorization`` header for ``user:password`` (none for None)."""
    if not user_info:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(user_info.encode()).decode()}


def catalog_credential_properties(
    catalog_type: str, uri: str, given: dict[str, str], env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Iceberg catalog properties carrying ``ICEFALL_CATALOG_CREDENTIAL`` and
    ``ICEFALL_CATALOG_TOKEN`` of ``env`` (this process's environment unless given) for a REST
    catalog (nothing when unset, or when the catalog's own properties already authenticate it).
    The token endpoint is named (``oauth2-server-uri``: ``<uri>/v1/oauth/tokens`` unless given),
    as Iceberg asks clients to."""
    env = os.environ if env is None else env
    if catalog_type != "rest" or "credential" in given or "token" in given:
        return {}
    out = {}
    if token := env.get(CATALOG_TOKEN_ENV):
        out["token"] = token
    if credential := env.get(CATALOG_CREDENTIAL_ENV):
        out["credential"] = credential
        if "oauth2-server-uri" not in given and uri:
            out["oauth2-server-uri"] = uri.rstrip("/") + TOKEN_PATH
    return out
