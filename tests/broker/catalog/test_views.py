"""Views in the REST catalog: the spec's view routes at the HTTP level (request and
response shapes of the OpenAPI document), pyiceberg's view calls, and views kept
in the catalog database across a restart."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchViewError, ViewAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyiceberg.view.metadata import SQLViewRepresentation, ViewRepresentation, ViewVersion

from broker.catalog import view_store
from broker.catalog.models import CreateViewRequest
from broker.catalog.store import CatalogStore
from tests.broker.catalog.helpers import Http, error_type
from tests.support import BrokerProcess

VIEW_SCHEMA = {
    "type": "struct",
    "schema-id": 7,  # the catalog numbers a view's schemas itself: the first one is 0
    "fields": [{"id": 1, "name": "id", "type": "long", "required": False}],
}
WIDER_SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [
        {"id": 1, "name": "id", "type": "long", "required": False},
        {"id": 2, "name": "name", "type": "string", "required": False},
    ],
}
VIEW_ENDPOINTS = [
    "GET /v1/{prefix}/namespaces/{namespace}/views",
    "POST /v1/{prefix}/namespaces/{namespace}/views",
    "GET /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "POST /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "POST /v1/{prefix}/namespaces/{namespace}/register-view",
    "POST /v1/{prefix}/views/rename",
]


def _version(namespace: str, sql: str, **queries: str) -> dict[str, Any]:
    """A ViewVersion: ``sql`` in Spark's dialect, plus one query per other dialect given."""
    representations = [{"type": "sql", "sql": sql, "dialect": "spark"}] + [
        {"type": "sql", "sql": q, "dialect": d} for d, q in queries.items()
    ]
    return {
        "version-id": 1,
        "timestamp-ms": 1_700_000_000_000,
        "schema-id": 0,
        "summary": {"engine-name": "spark"},
        "representations": representations,
        "default-namespace": [namespace],
    }


def _create(http: Http, namespace: str, name: str, **extra: Any) -> tuple[int, Any]:
    body = {
        "name": name,
        "schema": VIEW_SCHEMA,
        "view-version": _version(namespace, "SELECT id FROM t"),
        "properties": {"owner": "ann"},
        **extra,
    }
    return http.post(f"/v1/namespaces/{namespace}/views", body)


def _replace(http: Http, namespace: str, name: str, body: dict[str, Any]) -> tuple[int, Any]:
    return http.post(f"/v1/namespaces/{namespace}/views/{name}", body)


def _new_version(namespace: str, sql: str, **queries: str) -> list[dict[str, Any]]:
    """The updates of a Java client's replace: a schema, a version on it, made current."""
    return [
        {"action": "add-schema", "schema": WIDER_SCHEMA},
        {
            "action": "add-view-version",
            "view-version": {**_version(namespace, sql, **queries), "schema-id": -1},
        },
        {"action": "set-current-view-version", "view-version-id": -1},
    ]


def _file(location: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(urlparse(location).path).read_text())
    return data


def test_config_advertises_the_view_endpoints(http: Http) -> None:
    assert set(VIEW_ENDPOINTS) <= set(http.get("/v1/config")[1]["endpoints"])


def test_create_load_list_and_exists(
    http: Http, catalog_broker: BrokerProcess, namespace: str
) -> None:
    status, created = _create(http, namespace, "by_id")
    assert status == 200, created
    assert set(created) == {"metadata-location", "metadata", "config"}
    meta = created["metadata"]
    warehouse = (catalog_broker.home / "warehouse").resolve().as_uri()
    assert meta["location"] == f"{warehouse}/{namespace}/by_id"
    assert created["metadata-location"].startswith(f"{meta['location']}/metadata/00000-")
    assert _file(created["metadata-location"]) == meta  # the spec's ViewMetadata, as a file
    assert meta["format-version"] == 1 and uuid.UUID(meta["view-uuid"])
    assert meta["current-version-id"] == 1
    assert [s["schema-id"] for s in meta["schemas"]] == [0]
    (version,) = meta["versions"]
    assert version["schema-id"] == 0 and version["version-id"] == 1
    assert version["representations"] == [
        {"type": "sql", "sql": "SELECT id FROM t", "dialect": "spark"}
    ]
    assert version["default-namespace"] == [namespace]
    assert meta["version-log"] == [{"version-id": 1, "timestamp-ms": 1_700_000_000_000}]
    assert meta["properties"] == {"owner": "ann"}

    assert http.get(f"/v1/namespaces/{namespace}/views/by_id") == (200, created)
    assert http.head(f"/v1/namespaces/{namespace}/views/by_id") == 204
    assert http.head(f"/v1/namespaces/{namespace}/views/other") == 404
    status, body = http.get(f"/v1/namespaces/{namespace}/views/other")
    assert (status, error_type(body)) == (404, "NoSuchViewException")
    assert http.get(f"/v1/namespaces/{namespace}/views") == (
        200,
        {"identifiers": [{"namespace": [namespace], "name": "by_id"}], "next-page-token": None},
    )
    # a view is no table
    assert http.get(f"/v1/namespaces/{namespace}/tables")[1]["identifiers"] == []
    status, body = http.get(f"/v1/namespaces/{namespace}/tables/by_id")
    assert (status, error_type(body)) == (404, "NoSuchTableException")
    status, body = http.get("/v1/namespaces/nope/views")
    assert (status, error_type(body)) == (404, "NoSuchNamespaceException")


def test_names_are_shared_with_tables(http: Http, namespace: str) -> None:
    assert _create(http, namespace, "v")[0] == 200
    http.create_table(namespace, "t")
    for name in ("v", "t"):
        status, body = _create(http, namespace, name)
        assert (status, error_type(body)) == (409, "AlreadyExistsException")
    status, body = http.post(
        f"/v1/namespaces/{namespace}/tables", {"name": "v", "schema": VIEW_SCHEMA}
    )
    assert (status, error_type(body)) == (409, "AlreadyExistsException")
    status, body = _create(http, "nope", "v")
    assert (status, error_type(body)) == (404, "NoSuchNamespaceException")
    status, body = http.delete(f"/v1/namespaces/{namespace}/tables/v")
    assert (status, error_type(body)) == (404, "NoSuchTableException")
    assert http.head(f"/v1/namespaces/{namespace}/views/v") == 204


def test_replace_through_commits(http: Http, namespace: str) -> None:
    created = _create(http, namespace, "v")[1]
    view_uuid = created["metadata"]["view-uuid"]
    status, body = _replace(
        http,
        namespace,
        "v",
        {
            "identifier": {"namespace": [namespace], "name": "v"},
            "requirements": [{"type": "assert-view-uuid", "uuid": view_uuid}],
            "updates": [
                *_new_version(namespace, "SELECT id, name FROM t", trino="SELECT id, name FROM t"),
                {"action": "set-properties", "updates": {"comment": "wider"}},
                {"action": "remove-properties", "removals": ["owner", "absent"]},
            ],
        },
    )
    assert status == 200, body
    meta = body["metadata"]
    assert body["metadata-location"].split("/")[-1].startswith("00001-")
    assert _file(body["metadata-location"]) == meta
    assert meta["view-uuid"] == view_uuid and meta["current-version-id"] == 2
    assert [s["schema-id"] for s in meta["schemas"]] == [0, 1]
    assert [(v["version-id"], v["schema-id"]) for v in meta["versions"]] == [(1, 0), (2, 1)]
    assert [e["version-id"] for e in meta["version-log"]] == [1, 2]
    assert meta["properties"] == {"comment": "wider"}
    assert http.get(f"/v1/namespaces/{namespace}/views/v")[1] == body

    # back to version 1: no new version, one more log entry
    status, body = _replace(
        http,
        namespace,
        "v",
        {"updates": [{"action": "set-current-view-version", "view-version-id": 1}]},
    )
    assert status == 400 and "dialects" in body["error"]["message"]  # version 1 has no trino
    status, body = _replace(
        http,
        namespace,
        "v",
        {
            "updates": [
                {"action": "set-properties", "updates": {"replace.drop-dialect.allowed": "true"}},
                {"action": "set-current-view-version", "view-version-id": 1},
            ]
        },
    )
    assert status == 200, body
    assert body["metadata"]["current-version-id"] == 1
    assert [e["version-id"] for e in body["metadata"]["version-log"]] == [1, 2, 1]
    assert len(body["metadata"]["versions"]) == 2


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        (
            {
                "requirements": [{"type": "assert-view-uuid", "uuid": str(uuid.uuid4())}],
                "updates": [],
            },
            409,
            "CommitFailedException",
        ),
        ({"updates": [{"action": "set-current-view-version", "view-version-id": 5}]}, 400, None),
        ({"updates": [{"action": "set-current-view-version", "view-version-id": -1}]}, 400, None),
        ({"updates": [{"action": "upgrade-format-version", "format-version": 2}]}, 400, None),
        ({"updates": [{"action": "assign-uuid", "uuid": str(uuid.uuid4())}]}, 400, None),
        ({"updates": [{"action": "add-snapshot", "snapshot": {}}]}, 400, None),  # a table update
        ({"updates": [{"action": "set-location", "location": "/tmp/elsewhere"}]}, 400, None),
        ({"requirements": [{"type": "assert-create"}], "updates": []}, 400, None),
        ({"updates": "none"}, 400, None),
    ],
)
def test_bad_replaces_change_nothing(
    http: Http, namespace: str, body: dict[str, Any], status: int, kind: str | None
) -> None:
    created = _create(http, namespace, "v")[1]
    got, answer = _replace(http, namespace, "v", body)
    assert got == status, answer
    assert error_type(answer) == (kind or "BadRequestException")
    assert http.get(f"/v1/namespaces/{namespace}/views/v")[1] == created


def test_adding_a_version_twice_reuses_it(http: Http, namespace: str) -> None:
    _create(http, namespace, "v")
    updates = _new_version(namespace, "SELECT id, name FROM t")
    first = _replace(http, namespace, "v", {"updates": updates})[1]
    status, again = _replace(http, namespace, "v", {"updates": updates})
    assert status == 200
    assert again["metadata-location"] == first["metadata-location"]  # nothing changed, no file
    assert len(again["metadata"]["versions"]) == 2


def test_old_versions_expire(http: Http, namespace: str) -> None:
    _create(http, namespace, "v", properties={"version.history.num-entries": "2"})
    for i in range(3):
        status, body = _replace(
            http, namespace, "v", {"updates": _new_version(namespace, f"SELECT {i}")}
        )
        assert status == 200, body
    meta = body["metadata"]
    assert [v["version-id"] for v in meta["versions"]] == [3, 4]
    assert [e["version-id"] for e in meta["version-log"]] == [3, 4]


def test_rename_and_drop(http: Http, namespace: str) -> None:
    other = f"ns_{uuid.uuid4().hex[:10]}"
    assert http.post("/v1/namespaces", {"namespace": [other]})[0] == 200
    created = _create(http, namespace, "v")[1]
    http.create_table(other, "taken")

    def rename(src: list[str], dst: list[str]) -> tuple[int, Any]:
        return http.post(
            "/v1/views/rename",
            {
                "source": {"namespace": src[:-1], "name": src[-1]},
                "destination": {"namespace": dst[:-1], "name": dst[-1]},
            },
        )

    status, body = rename([namespace, "v"], [other, "taken"])
    assert (status, error_type(body)) == (409, "AlreadyExistsException")
    status, body = rename([namespace, "v"], ["nope", "v"])
    assert (status, error_type(body)) == (404, "NoSuchNamespaceException")
    status, body = rename([namespace, "none"], [other, "v2"])
    assert (status, error_type(body)) == (404, "NoSuchViewException")
    status, body = http.post(
        "/v1/tables/rename",
        {
            "source": {"namespace": [namespace], "name": "v"},
            "destination": {"namespace": [other], "name": "v2"},
        },
    )
    assert (status, error_type(body)) == (404, "NoSuchTableException")  # a view is no table

    assert rename([namespace, "v"], [other, "v2"]) == (204, None)
    assert http.head(f"/v1/namespaces/{namespace}/views/v") == 404
    assert http.get(f"/v1/namespaces/{other}/views/v2")[1] == created

    status, body = http.delete(f"/v1/namespaces/{other}/tables/taken")
    assert status == 204
    status, body = http.delete(f"/v1/namespaces/{other}")
    assert (status, error_type(body)) == (409, "NamespaceNotEmptyException")  # the view
    assert http.delete(f"/v1/namespaces/{other}/views/v2") == (204, None)
    status, body = http.delete(f"/v1/namespaces/{other}/views/v2")
    assert (status, error_type(body)) == (404, "NoSuchViewException")
    assert Path(urlparse(created["metadata-location"]).path).is_file()  # a drop keeps the files
    assert http.delete(f"/v1/namespaces/{other}")[0] == 204


def test_register_a_dropped_view_again(http: Http, namespace: str) -> None:
    created = _create(http, namespace, "v")[1]
    assert http.delete(f"/v1/namespaces/{namespace}/views/v")[0] == 204
    request = {"name": "back", "metadata-location": created["metadata-location"]}
    status, body = http.post(f"/v1/namespaces/{namespace}/register-view", request)
    assert status == 200, body
    assert body == {**created, "config": {}}
    assert http.get(f"/v1/namespaces/{namespace}/views/back")[1] == body
    status, body = http.post(f"/v1/namespaces/{namespace}/register-view", request)
    assert (status, error_type(body)) == (409, "AlreadyExistsException")
    status, body = http.post(
        f"/v1/namespaces/{namespace}/register-view",
        {"name": "bad", "metadata-location": "/etc/passwd"},
    )
    assert (status, error_type(body)) == (400, "BadRequestException")
    assert http.head(f"/v1/namespaces/{namespace}/views/bad") == 404


def test_view_in_a_namespace_with_a_dot(http: Http, catalog_broker: BrokerProcess) -> None:
    top = f"ns_{uuid.uuid4().hex[:8]}"
    assert http.post("/v1/namespaces", {"namespace": [f"{top}.a"]})[0] == 200
    status, body = _create(http, f"{top}.a", "v")
    assert status == 200, body
    warehouse = (catalog_broker.home / "warehouse").resolve().as_uri()
    assert body["metadata"]["location"] == f"{warehouse}/{top}..a/v"
    assert http.get(f"/v1/namespaces/{top}.a/views")[1]["identifiers"] == [
        {"namespace": [f"{top}.a"], "name": "v"}
    ]


SPARK_SQL = ViewVersion.model_validate(
    {
        "version-id": 1,
        "schema-id": 0,
        "representations": [
            ViewRepresentation(SQLViewRepresentation(type="sql", sql="SELECT 1", dialect="spark"))
        ],
        "default-namespace": ("default",),
    }
)


def test_pyiceberg_view_calls(rest: Catalog, namespace: str) -> None:
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "name", StringType()))
    view = rest.create_view((namespace, "recent"), schema, SPARK_SQL, properties={"k": "v"})
    assert view.metadata.current_version_id == 1 and view.metadata.properties == {"k": "v"}
    with pytest.raises(ViewAlreadyExistsError):
        rest.create_view((namespace, "recent"), schema, SPARK_SQL)
    assert rest.list_views(namespace) == [(namespace, "recent")]
    assert rest.view_exists((namespace, "recent"))
    assert not rest.view_exists((namespace, "other"))
    loaded = rest.load_view((namespace, "recent"))
    assert loaded.metadata == view.metadata
    assert loaded.metadata.schemas[0].find_field("name").field_id == 2
    rest.drop_view((namespace, "recent"))
    assert not rest.view_exists((namespace, "recent")) and rest.list_views(namespace) == []
    with pytest.raises(NoSuchViewError):
        rest.drop_view((namespace, "recent"))
    with pytest.raises(NoSuchViewError):
        rest.load_view((namespace, "recent"))


def test_views_survive_a_restart(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "home").start()
    try:
        http = Http(broker.catalog_url)
        assert http.post("/v1/namespaces", {"namespace": ["kept"]})[0] == 200
        created = _create(http, "kept", "v")[1]
        replaced = _replace(http, "kept", "v", {"updates": _new_version("kept", "SELECT 2")})[1]
    finally:
        broker.stop()
    broker = BrokerProcess(tmp_path / "home").start()
    try:
        http = Http(broker.catalog_url)
        assert http.get("/v1/namespaces/kept/views/v") == (200, replaced)
        assert replaced["metadata"]["view-uuid"] == created["metadata"]["view-uuid"]
    finally:
        broker.stop()


def test_a_catalog_database_without_the_type_column_gets_it(tmp_path: Path) -> None:
    """A database made by a pyiceberg before iceberg_tables.iceberg_type (JDBC schema v0):
    the store adds the column, so its tables stay tables and views can be kept."""
    db = tmp_path / "old.sqlite"
    with sqlite3.connect(db) as con:
        con.execute(
            "CREATE TABLE iceberg_tables (catalog_name VARCHAR(255) NOT NULL,"
            " table_namespace VARCHAR(255) NOT NULL, table_name VARCHAR(255) NOT NULL,"
            " metadata_location VARCHAR(1000), previous_metadata_location VARCHAR(1000),"
            " PRIMARY KEY (catalog_name, table_namespace, table_name))"
        )
        con.execute(
            "CREATE TABLE iceberg_namespace_properties (catalog_name VARCHAR(255) NOT NULL,"
            " namespace VARCHAR(255) NOT NULL, property_key VARCHAR(255) NOT NULL,"
            " property_value VARCHAR(1000) NOT NULL,"
            " PRIMARY KEY (catalog_name, namespace, property_key))"
        )
    store = CatalogStore(f"sqlite:///{db}", (tmp_path / "warehouse").as_uri())
    try:
        store.create_namespace(("ns",), {})
        request = CreateViewRequest.model_validate(
            {"name": "v", "schema": VIEW_SCHEMA, "view-version": _version("ns", "SELECT 1")}
        )
        created = view_store.create(store, ("ns", "v"), request)
        assert view_store.list_views(store, ("ns",)) == [("ns", "v")]
        assert view_store.load(store, ("ns", "v")) == created
        assert store.list_tables(("ns",)) == []
    finally:
        store.close()
