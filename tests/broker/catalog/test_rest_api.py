"""The REST catalog at the HTTP level: the spec's routes, status codes and error model."""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.broker.catalog.helpers import SCHEMA, Http, error_type
from tests.support import BrokerProcess


def test_config_advertises_the_endpoints_without_a_prefix(http: Http) -> None:
    status, body = http.get("/v1/config?warehouse=anything")
    assert status == 200
    assert (
        body["defaults"] == {} and body["overrides"] == {}
    )  # no "prefix": routes are /v1/namespaces...
    assert "POST /v1/{prefix}/transactions/commit" in body["endpoints"]
    assert "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}" in body["endpoints"]


def test_namespace_lifecycle(http: Http) -> None:
    top = f"ns_{uuid.uuid4().hex[:8]}"
    assert http.post("/v1/namespaces", {"namespace": [top], "properties": {"owner": "ann"}}) == (
        200,
        {"namespace": [top], "properties": {"owner": "ann"}},
    )
    status, body = http.post("/v1/namespaces", {"namespace": [top]})
    assert (status, error_type(body)) == (409, "AlreadyExistsException")
    assert http.post("/v1/namespaces", {"namespace": [top, "child"]})[0] == 200

    assert [top] in http.get("/v1/namespaces")[1]["namespaces"]
    assert http.get(f"/v1/namespaces?parent={top}")[1]["namespaces"] == [[top, "child"]]
    assert http.get(f"/v1/namespaces/{top}%1Fchild")[1]["namespace"] == [top, "child"]
    assert http.head(f"/v1/namespaces/{top}%1Fchild") == 204
    assert http.head(f"/v1/namespaces/{top}%1Fnone") == 404

    status, body = http.post(
        f"/v1/namespaces/{top}/properties",
        {"removals": ["owner", "absent"], "updates": {"team": "data"}},
    )
    assert status == 200
    assert body == {"updated": ["team"], "removed": ["owner"], "missing": ["absent"]}
    assert http.get(f"/v1/namespaces/{top}")[1]["properties"] == {"team": "data"}
    status, body = http.post(
        f"/v1/namespaces/{top}/properties", {"removals": ["team"], "updates": {"team": "x"}}
    )
    assert status == 422 and error_type(body) == "UnprocessableEntityException"

    status, body = http.delete(f"/v1/namespaces/{top}")
    assert (status, error_type(body)) == (409, "NamespaceNotEmptyException")  # it has a child
    assert http.delete(f"/v1/namespaces/{top}%1Fchild")[0] == 204
    assert http.delete(f"/v1/namespaces/{top}")[0] == 204
    status, body = http.get(f"/v1/namespaces/{top}")
    assert (status, error_type(body)) == (404, "NoSuchNamespaceException")


def test_removing_every_property_keeps_the_namespace(http: Http) -> None:
    assert (
        http.post("/v1/namespaces", {"namespace": ["owned"], "properties": {"owner": "ann"}})[0]
        == 200
    )
    status, body = http.post("/v1/namespaces/owned/properties", {"removals": ["owner"]})
    assert (status, body["removed"]) == (200, ["owner"])
    assert http.get("/v1/namespaces/owned") == (200, {"namespace": ["owned"], "properties": {}})
    status, body = http.post("/v1/namespaces/owned/properties", {"updates": {"exists": "no"}})
    assert (status, error_type(body)) == (400, "BadRequestException")  # the SQL catalog's marker


def test_dots_inside_namespace_levels(http: Http, catalog_broker: BrokerProcess) -> None:
    """["x.a"] and ["x", "a"] are two namespaces (pyiceberg's SQL catalog alone would store
    both as "x.a"), each with its own tables in its own directory."""
    top = f"ns_{uuid.uuid4().hex[:8]}"
    dotted, nested = f"{top}.a", f"{top}%1Fa"
    assert http.post("/v1/namespaces", {"namespace": [f"{top}.a"], "properties": {"k": "1"}}) == (
        200,
        {"namespace": [f"{top}.a"], "properties": {"k": "1"}},
    )
    assert http.post("/v1/namespaces", {"namespace": [top, "a"]})[0] == 200
    assert http.post("/v1/namespaces", {"namespace": [f"{top}.a", "b.c"]})[0] == 200
    status, body = http.post("/v1/namespaces", {"namespace": [f"{top}.a"]})
    assert (status, error_type(body)) == (409, "AlreadyExistsException")

    listed = http.get("/v1/namespaces")[1]["namespaces"]
    assert [f"{top}.a"] in listed and [top] in listed and [top, "a"] not in listed
    assert http.get(f"/v1/namespaces?parent={top}")[1]["namespaces"] == [[top, "a"]]
    assert http.get(f"/v1/namespaces?parent={dotted}")[1]["namespaces"] == [[f"{top}.a", "b.c"]]
    assert http.get(f"/v1/namespaces/{dotted}") == (
        200,
        {"namespace": [f"{top}.a"], "properties": {"k": "1"}},
    )
    assert http.get(f"/v1/namespaces/{nested}")[1] == {"namespace": [top, "a"], "properties": {}}
    assert http.head(f"/v1/namespaces/{dotted}%1Fb.c") == 204
    assert http.head(f"/v1/namespaces/{dotted}%1Fb") == 404
    status, body = http.get(f"/v1/namespaces/{dotted}/tables/none")
    assert (status, error_type(body)) == (404, "NoSuchTableException")
    assert body["error"]["message"] == f"Table does not exist: {top}.a.none"

    dotted_table = http.create_table(dotted, "t")
    nested_table = http.create_table(nested, "t")
    warehouse = (catalog_broker.home / "warehouse").resolve().as_uri()
    assert dotted_table["metadata"]["location"] == f"{warehouse}/{top}..a/t"
    assert nested_table["metadata"]["location"] == f"{warehouse}/{top}.a/t"
    assert http.get(f"/v1/namespaces/{dotted}/tables")[1]["identifiers"] == [
        {"namespace": [f"{top}.a"], "name": "t"}
    ]
    status, body = http.commit(
        dotted, "t", [], [{"action": "set-properties", "updates": {"v": "2"}}]
    )
    assert status == 200, body
    assert http.load(dotted, "t")["metadata"]["properties"]["v"] == "2"
    assert "v" not in http.load(nested, "t")["metadata"]["properties"]

    rename = {
        "source": {"namespace": [f"{top}.a"], "name": "t"},
        "destination": {"namespace": [f"{top}.a", "b.c"], "name": "moved"},
    }
    assert http.post("/v1/tables/rename", rename)[0] == 204
    assert http.head(f"/v1/namespaces/{dotted}%1Fb.c/tables/moved") == 204
    assert http.delete(f"/v1/namespaces/{dotted}%1Fb.c/tables/moved")[0] == 204
    status, body = http.delete(f"/v1/namespaces/{dotted}")
    assert (status, error_type(body)) == (409, "NamespaceNotEmptyException")  # it has a child
    assert http.delete(f"/v1/namespaces/{dotted}%1Fb.c")[0] == 204
    assert http.delete(f"/v1/namespaces/{dotted}")[0] == 204
    assert http.head(f"/v1/namespaces/{dotted}") == 404
    assert http.load(nested, "t")["metadata-location"] == nested_table["metadata-location"]


def test_new_tables_get_zstd_parquet_unless_they_set_a_codec(http: Http, namespace: str) -> None:
    codec = "write.parquet.compression-codec"
    assert http.create_table(namespace, "plain")["metadata"]["properties"][codec] == "zstd"
    assert http.load(namespace, "plain")["metadata"]["properties"][codec] == "zstd"
    chosen = http.create_table(namespace, "chosen", properties={codec: "snappy"})
    assert chosen["metadata"]["properties"][codec] == "snappy"
    staged = http.create_table(namespace, "staged", **{"stage-create": True})
    assert staged["metadata"]["properties"][codec] == "zstd"


@pytest.mark.parametrize(
    ("method", "path", "raw", "status"),
    [
        ("POST", "/v1/namespaces", b"{not json", 400),
        ("POST", "/v1/namespaces", b"[]", 400),
        ("POST", "/v1/namespaces", b"[" * 100_000 + b"]" * 100_000, 400),
        ("POST", "/v1/namespaces", b'{"namespace": "flat"}', 400),
        ("POST", "/v1/namespaces", b'{"namespace": []}', 400),
        ("POST", "/v1/namespaces", b'{"namespace": [".a"]}', 400),
        ("POST", "/v1/namespaces", b'{"namespace": ["a", "b."]}', 400),
        ("POST", "/v1/namespaces", b'{"namespace": ["a/b"]}', 400),
        ("GET", "/v1/namespaces?parent=%1F", b"", 400),
        ("GET", "/v1/namespaces?pageToken=abc", b"", 400),
        ("GET", "/v1/no/such/route", b"", 404),
        ("PUT", "/v1/config", b"", 405),
    ],
)
def test_bad_requests_get_the_error_model(
    http: Http, method: str, path: str, raw: bytes, status: int
) -> None:
    got, body = http.request(method, path, raw=raw or None)
    assert got == status
    assert body["error"]["code"] == status
    error_type(body)


def test_pagination(http: Http, namespace: str) -> None:
    for name in ("a", "b", "c"):
        http.create_table(namespace, name)
    assert [
        t["name"] for t in http.get(f"/v1/namespaces/{namespace}/tables")[1]["identifiers"]
    ] == ["a", "b", "c"]
    _, page = http.get(f"/v1/namespaces/{namespace}/tables?pageToken=&pageSize=2")
    assert [t["name"] for t in page["identifiers"]] == ["a", "b"]
    token = page["next-page-token"]
    _, page = http.get(f"/v1/namespaces/{namespace}/tables?pageToken={token}&pageSize=2")
    assert [t["name"] for t in page["identifiers"]] == ["c"] and page["next-page-token"] is None


def test_table_lifecycle(http: Http, catalog_broker: BrokerProcess, namespace: str) -> None:
    created = http.create_table(namespace, "events", properties={"owner": "ann"})
    location = created["metadata-location"]
    assert location.startswith((catalog_broker.home / "warehouse").resolve().as_uri())
    assert Path(urlparse(location).path).is_file()
    assert created["metadata"]["properties"]["owner"] == "ann"
    assert created["config"] == {}

    status, body = http.post(
        f"/v1/namespaces/{namespace}/tables", {"name": "events", "schema": SCHEMA}
    )
    assert (status, error_type(body)) == (409, "AlreadyExistsException")
    status, body = http.post("/v1/namespaces/nope/tables", {"name": "t", "schema": SCHEMA})
    assert (status, error_type(body)) == (404, "NoSuchNamespaceException")

    loaded = http.load(namespace, "events")
    assert loaded["metadata-location"] == location
    assert loaded["metadata"]["table-uuid"] == created["metadata"]["table-uuid"]
    assert http.head(f"/v1/namespaces/{namespace}/tables/events") == 204
    assert http.head(f"/v1/namespaces/{namespace}/tables/other") == 404
    status, body = http.get(f"/v1/namespaces/{namespace}/tables/other")
    assert (status, error_type(body)) == (404, "NoSuchTableException")

    status, _ = http.post(
        "/v1/tables/rename",
        {
            "source": {"namespace": [namespace], "name": "events"},
            "destination": {"namespace": [namespace], "name": "renamed"},
        },
    )
    assert status == 204
    assert http.head(f"/v1/namespaces/{namespace}/tables/events") == 404
    assert http.load(namespace, "renamed")["metadata-location"] == location
    status, body = http.post(
        "/v1/tables/rename",
        {
            "source": {"namespace": [namespace], "name": "events"},
            "destination": {"namespace": [namespace], "name": "x"},
        },
    )
    assert (status, error_type(body)) == (404, "NoSuchTableException")

    assert http.delete(f"/v1/namespaces/{namespace}/tables/renamed")[0] == 204
    assert Path(urlparse(location).path).is_file()  # a plain drop keeps the files
    assert http.delete(f"/v1/namespaces/{namespace}/tables/renamed")[0] == 404


def test_drop_with_purge_deletes_the_metadata(http: Http, namespace: str) -> None:
    location = http.create_table(namespace, "gone")["metadata-location"]
    assert http.delete(f"/v1/namespaces/{namespace}/tables/gone?purgeRequested=true")[0] == 204
    assert not Path(urlparse(location).path).exists()


def test_register_and_unregister(http: Http, namespace: str) -> None:
    location = http.create_table(namespace, "orig")["metadata-location"]
    status, body = http.post(f"/v1/namespaces/{namespace}/tables/orig/unregister")
    assert status == 200 and body["metadata-location"] == location
    assert http.head(f"/v1/namespaces/{namespace}/tables/orig") == 404

    status, body = http.post(
        f"/v1/namespaces/{namespace}/register", {"name": "again", "metadata-location": location}
    )
    assert status == 200 and body["metadata-location"] == location
    assert http.load(namespace, "again")["metadata-location"] == location
    status, body = http.post(
        f"/v1/namespaces/{namespace}/register", {"name": "again", "metadata-location": location}
    )
    assert (status, error_type(body)) == (409, "AlreadyExistsException")
    status, _ = http.post(
        f"/v1/namespaces/{namespace}/register",
        {"name": "again", "metadata-location": location, "overwrite": True},
    )
    assert status == 200


@pytest.mark.parametrize(
    "location", ["/etc/passwd", "http://example.invalid/m.json", "relative.json", "/no/such.json"]
)
def test_register_refuses_what_is_not_readable_metadata(
    http: Http, namespace: str, location: str
) -> None:
    status, body = http.post(
        f"/v1/namespaces/{namespace}/register", {"name": "bad", "metadata-location": location}
    )
    assert (status, error_type(body)) == (400, "BadRequestException")
    assert http.head(f"/v1/namespaces/{namespace}/tables/bad") == 404  # no row left behind


@pytest.mark.parametrize(
    "extra",
    [
        {"location": "/tmp/outside-the-warehouse"},
        {"location": "relative/dir"},
        {"properties": {"write.metadata.path": "/tmp/elsewhere"}},
    ],
)
def test_tables_stay_inside_the_warehouse(
    http: Http, namespace: str, extra: dict[str, object]
) -> None:
    status, body = http.post(
        f"/v1/namespaces/{namespace}/tables", {"name": "t", "schema": SCHEMA, **extra}
    )
    assert (status, error_type(body)) == (400, "BadRequestException")
    assert not Path("/tmp/outside-the-warehouse").exists()


def test_etag_and_snapshots_refs(http: Http, namespace: str) -> None:
    http.create_table(namespace, "tagged")
    http.get(f"/v1/namespaces/{namespace}/tables/tagged")
    etag = http.last.headers["ETag"]
    status, body = http.get(
        f"/v1/namespaces/{namespace}/tables/tagged", headers={"If-None-Match": etag}
    )
    assert status == 304 and body is None
    status, body = http.get(f"/v1/namespaces/{namespace}/tables/tagged?snapshots=refs")
    assert status == 200 and http.last.headers["ETag"] != etag
    status, body = http.get(f"/v1/namespaces/{namespace}/tables/tagged?snapshots=some")
    assert status == 400


def test_metrics_are_accepted(http: Http, namespace: str) -> None:
    http.create_table(namespace, "m")
    status, _ = http.post(
        f"/v1/namespaces/{namespace}/tables/m/metrics",
        {
            "report-type": "commit-report",
            "table-name": "m",
            "snapshot-id": 1,
            "sequence-number": 1,
            "operation": "append",
            "metrics": {},
        },
    )
    assert status == 204
    assert http.post(f"/v1/namespaces/{namespace}/tables/m/metrics", {"no": "type"})[0] == 400


@pytest.mark.parametrize(
    ("method", "path", "status", "kind"),
    [
        ("GET", "/v1/namespaces/{ns}/functions", 200, None),
        ("GET", "/v1/namespaces/{ns}/functions/f", 404, "NoSuchFunctionException"),
        ("POST", "/v1/namespaces/{ns}/tables/t/plan", 406, "UnsupportedOperationException"),
        ("GET", "/v1/namespaces/{ns}/tables/t/plan/p1", 404, "NoSuchPlanIdException"),
        ("POST", "/v1/namespaces/{ns}/tables/t/sign", 406, "UnsupportedOperationException"),
    ],
)
def test_what_the_catalog_does_not_do_is_a_clean_4xx(
    http: Http, namespace: str, method: str, path: str, status: int, kind: str | None
) -> None:
    got, body = http.request(method, path.format(ns=namespace), {} if method == "POST" else None)
    assert got == status
    if kind:
        assert error_type(body) == kind
    else:
        assert body["identifiers"] == []


def test_catalog_survives_a_restart(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "home").start()
    try:
        http = Http(broker.catalog_url)
        assert http.post("/v1/namespaces", {"namespace": ["kept"]})[0] == 200
        location = http.create_table("kept", "t")["metadata-location"]
    finally:
        broker.stop()
    broker = BrokerProcess(tmp_path / "home").start()
    try:
        assert Http(broker.catalog_url).load("kept", "t")["metadata-location"] == location
    finally:
        broker.stop()
