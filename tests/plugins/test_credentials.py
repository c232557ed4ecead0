"""The registry's and catalog's credentials come from the Airflow connections when a task runs,
go to a Spark job as environment variables, and are masked in task logs."""

from __future__ import annotations

import json

import pytest

from broker.http_security.client import CATALOG_CREDENTIAL_ENV, REGISTRY_USER_INFO_ENV


def test_job_env_reads_the_connections_and_masks_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact
    from icefall_airflow import credentials

    for name in (REGISTRY_USER_INFO_ENV, CATALOG_CREDENTIAL_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_ICEFALL_REGISTRY", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_ICEFALL_CATALOG", raising=False)
    assert credentials.job_env() == {}  # no connections: the services are open

    catalog = {"conn_type": "http", "login": "etl", "password": "s3cr3t-catalog"}
    registry = {"conn_type": "http", "login": "rounds", "password": "s3cr3t-registry"}
    monkeypatch.setenv("AIRFLOW_CONN_ICEFALL_CATALOG", json.dumps(catalog))
    monkeypatch.setenv("AIRFLOW_CONN_ICEFALL_REGISTRY", json.dumps(registry))
    assert credentials.job_env() == {
        REGISTRY_USER_INFO_ENV: "rounds:s3cr3t-registry",
        CATALOG_CREDENTIAL_ENV: "etl:s3cr3t-catalog",
    }
    logged = str(redact("round env: rounds:s3cr3t-registry etl:s3cr3t-catalog"))
    assert "s3cr3t" not in logged

    monkeypatch.setenv(CATALOG_CREDENTIAL_ENV, "deployment:own")  # the environment's win
    assert credentials.job_env()[CATALOG_CREDENTIAL_ENV] == "deployment:own"
