"""Helpers for the catalog tests: a tiny JSON HTTP client and table requests."""

from __future__ import annotations

import json
from typing import Any

import requests

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [
        {"id": 1, "name": "id", "type": "long", "required": True},
        {"id": 2, "name": "name", "type": "string", "required": False},
    ],
}
UNPARTITIONED = {"spec-id": 0, "fields": []}


class Http:
    """JSON over HTTP against one catalog; returns (status, parsed body or None)."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self.session = requests.Session()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        resp = self.session.request(
            method, self.base + path, data=data, headers=headers, timeout=30
        )
        self.last = resp
        if not resp.content:
            return resp.status_code, None
        assert resp.headers["Content-Type"].startswith("application/json"), resp.headers
        return resp.status_code, resp.json()

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.request("POST", path, body, **kw)

    def delete(self, path: str) -> tuple[int, Any]:
        return self.request("DELETE", path)

    def head(self, path: str) -> int:
        return self.request("HEAD", path)[0]

    def create_table(self, namespace: str, name: str, **extra: Any) -> dict[str, Any]:
        status, body = self.post(
            f"/v1/namespaces/{namespace}/tables",
            {"name": name, "schema": SCHEMA, "partition-spec": UNPARTITIONED, **extra},
        )
        assert status == 200, body
        result: dict[str, Any] = body
        return result

    def load(self, namespace: str, name: str) -> dict[str, Any]:
        status, body = self.get(f"/v1/namespaces/{namespace}/tables/{name}")
        assert status == 200, body
        result: dict[str, Any] = body
        return result

    def commit(
        self, namespace: str, name: str, requirements: list[Any], updates: list[Any]
    ) -> tuple[int, Any]:
        return self.post(
            f"/v1/namespaces/{namespace}/tables/{name}",
            {"requirements": requirements, "updates": updates},
        )


def error_type(body: Any) -> str:
    """The spec's error model: {"error": {"message", "type", "code"}}; returns the type."""
    assert set(body) == {"error"}, body
    assert {"message", "type", "code"} <= set(body["error"]), body
    kind: str = body["error"]["type"]
    return kind
