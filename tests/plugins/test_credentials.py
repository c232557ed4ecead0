"""The admin API's, registry's and catalog's credentials come from the Airflow connections when a
task runs, go to a Spark job as environment variables, and are masked in task logs."""

from __future__ import annotations

import json
import os

import pytest

from broker.contracts import CatalogSpec
from broker.http_security.client import (
    ADMIN_USER_INFO_ENV,
    CATALOG_CREDENTIAL_ENV,
    CATALOG_TOKEN_ENV,
    REGISTRY_USER_INFO_ENV,
    basic_auth_header,
)


def test_job_env_reads_the_connections_and_masks_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact
    from icefall_airflow import credentials

    for name in (REGISTRY_USER_INFO_ENV, CATALOG_CREDENTIAL_ENV, CATALOG_TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(ADMIN_USER_INFO_ENV, raising=False)
    for conn_id in ("REGISTRY", "CATALOG", "ADMIN"):
        monkeypatch.delenv(f"AIRFLOW_CONN_ICEFALL_{conn_id}", raising=False)
    assert credentials.job_env() == {}  # no connections: the services are open
    assert credentials.admin_user_info() is None

    catalog = {"conn_type": "http", "login": "etl", "password": "s3cr3t-catalog"}
    registry = {"conn_type": "http", "login": "rounds", "password": "s3cr3t-registry"}
    admin = {"conn_type": "http", "login": "planner", "password": "s3cr3t-admin"}
    monkeypatch.setenv("AIRFLOW_CONN_ICEFALL_CATALOG", json.dumps(catalog))
    monkeypatch.setenv("AIRFLOW_CONN_ICEFALL_REGISTRY", json.dumps(registry))
    monkeypatch.setenv("AIRFLOW_CONN_ICEFALL_ADMIN", json.dumps(admin))
    assert credentials.job_env() == {
        REGISTRY_USER_INFO_ENV: "rounds:s3cr3t-registry",
        CATALOG_CREDENTIAL_ENV: "etl:s3cr3t-catalog",
        ADMIN_USER_INFO_ENV: "planner:s3cr3t-admin",
    }
    logged = str(
        redact("round env: rounds:s3cr3t-registry etl:s3cr3t-catalog planner:s3cr3t-admin")
    )
    assert "s3cr3t" not in logged

    # the plugin's admin API client logs in with the connection
    from icefall_airflow.broker_client import BrokerClient

    assert BrokerClient("http://broker:8090")._headers == basic_auth_header("planner:s3cr3t-admin")
    monkeypatch.setenv(ADMIN_USER_INFO_ENV, "deployment:admin")  # the environment's win
    assert credentials.admin_user_info() == "deployment:admin"

    monkeypatch.setenv(CATALOG_CREDENTIAL_ENV, "deployment:own")  # the environment's win
    assert credentials.job_env()[CATALOG_CREDENTIAL_ENV] == "deployment:own"


def test_a_rotated_catalog_secret_counts_at_once_and_a_token_is_passed_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The long-lived API server reads the connection at each catalog it opens and hands the
    credential over as a catalog property, never into its environment (where the first value
    would stick until a restart). A static bearer token comes from the extra or the password of a
    connection without a login, as ``ICEFALL_CATALOG_TOKEN`` and the ``token`` property."""
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact
    from icefall_airflow import credentials

    for name in (REGISTRY_USER_INFO_ENV, CATALOG_CREDENTIAL_ENV, CATALOG_TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_ICEFALL_REGISTRY", raising=False)
    spec = CatalogSpec.rest("http://broker:8181")
    for secret in ("first-s3cr3t", "rotated-s3cr3t"):
        conn = {"conn_type": "http", "login": "etl", "password": secret}
        monkeypatch.setenv("AIRFLOW_CONN_ICEFALL_CATALOG", json.dumps(conn))
        properties = spec.pyiceberg_properties(env=credentials.job_env())
        assert properties["credential"] == f"etl:{secret}"
        assert CATALOG_CREDENTIAL_ENV not in os.environ
    assert "credential" not in spec.pyiceberg_properties()  # nothing left in the environment

    by_extra = {"conn_type": "http", "extra": json.dumps({"token": "t0k3n-extra"})}
    by_password = {"conn_type": "http", "password": "t0k3n-password"}
    for conn, token in ((by_extra, "t0k3n-extra"), (by_password, "t0k3n-password")):
        monkeypatch.setenv("AIRFLOW_CONN_ICEFALL_CATALOG", json.dumps(conn))
        env = credentials.job_env()
        assert env == {CATALOG_TOKEN_ENV: token}
        assert spec.pyiceberg_properties(env=env)["token"] == token
        assert "t0k3n" not in str(redact(f"catalog token {token}"))
    # a catalog whose own properties authenticate it keeps them
    own = CatalogSpec(uri="https://polaris", properties={"token": "own"}, builtin=False)
    assert own.pyiceberg_properties(env=env)["token"] == "own"
