"""The commit round's view of the broker: its admin API and schema registry, over plain HTTP.

The round needs only the admin URL: ``GET /v1/cluster`` names the registry,
the catalog and the object store. Plain ``urllib`` (no client library) so the
same code runs on the driver and on executors of any Spark cluster.

The admin API's client is ``broker.admin_client`` (the Airflow plugin's too),
re-exported here; the registry client is the jobs' own (only they read schemas).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from broker.admin_client import DEFAULT_TIMEOUT_S, AdminClient, BrokerRequestError, http_json
from broker.contracts import TableTopic
from broker.http_security import client as client_auth

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "AdminClient",
    "BrokerRequestError",
    "RegistryClient",
    "TableTopic",
    "http_json",
]


class RegistryClient:
    """Schema lookups by id and by subject, cached (schemas under an id never change).
    ``user_info`` (``user:password``, default ``$ICEFALL_REGISTRY_USER_INFO``): HTTP basic auth
    for a registry that requires it."""

    def __init__(
        self, registry_url: str, timeout: float = DEFAULT_TIMEOUT_S, user_info: str | None = None
    ) -> None:
        self.url = registry_url.rstrip("/")
        self.timeout = timeout
        self.user_info = user_info or client_auth.registry_user_info()
        self._headers = client_auth.basic_auth_header(self.user_info)
        self._by_id: dict[int, dict[str, Any]] = {}

    def __repr__(self) -> str:  # never the password
        return f"RegistryClient({self.url!r})"

    def schema(self, schema_id: int) -> dict[str, Any]:
        """``{"schema": text, "schemaType": ...}`` of an id."""
        found = self._by_id.get(schema_id)
        if found is None:
            found = http_json(
                f"{self.url}/schemas/ids/{schema_id}", timeout=self.timeout, headers=self._headers
            )
            assert isinstance(found, dict)
            self._by_id[schema_id] = found
        return found

    def avro_schema(self, schema_id: int) -> str:
        """The Avro schema text of an id; a non-Avro schema is an error (the round decodes Avro)."""
        found = self.schema(schema_id)
        kind = found.get("schemaType", "AVRO")
        if kind != "AVRO":
            raise ValueError(f"schema id {schema_id} is {kind}, not AVRO")
        return str(found["schema"])

    def subject_versions(self, subject: str) -> list[tuple[int, str]]:
        """(id, Avro schema text) of every version of ``subject``, oldest first; [] for an unknown subject."""
        quoted = urllib.parse.quote(subject, safe="")
        try:
            versions = http_json(
                f"{self.url}/subjects/{quoted}/versions",
                timeout=self.timeout,
                headers=self._headers,
            )
        except BrokerRequestError as exc:
            if exc.status == 404:
                return []
            raise
        out = []
        for version in sorted(versions):
            entry = http_json(
                f"{self.url}/subjects/{quoted}/versions/{version}",
                timeout=self.timeout,
                headers=self._headers,
            )
            if entry.get("schemaType", "AVRO") != "AVRO":
                continue
            self._by_id[int(entry["id"])] = {"schema": entry["schema"], "schemaType": "AVRO"}
            out.append((int(entry["id"]), str(entry["schema"])))
        return out

    def known(self) -> dict[int, str]:
        """Every Avro schema fetched so far, by id: shipped to executors so they rarely ask."""
        return {
            i: str(s["schema"])
            for i, s in self._by_id.items()
            if s.get("schemaType", "AVRO") == "AVRO"
        }
