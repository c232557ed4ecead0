"""Bad input to the schema registry: Confluent's statuses and error codes, never a 500.

Codes follow Confluent's registry (io.confluent.kafka.schemaregistry.rest.exceptions.Errors)
and rest-utils: a body that is not JSON, or JSON of the wrong shape, is 400 / 400
(JsonParseExceptionMapper, JsonMappingExceptionMapper); an empty body 422 / 422.
"""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from tests.broker.registry.helpers import CONTENT_TYPE, error, http
from tests.support import BrokerProcess

RECORD = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})


def _subject() -> str:
    return f"err-{uuid.uuid4().hex[:8]}"


def _register(base: str, subject: str, schema: str, **extra: object) -> int:
    status, answer = http(
        base, "POST", f"/subjects/{subject}/versions", {"schema": schema, **extra}
    )
    assert status == 200, answer
    schema_id: int = answer["id"]
    return schema_id


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/subjects/{s}/versions"),
        ("POST", "/subjects/{s}"),
        ("POST", "/compatibility/subjects/{s}/versions/latest"),
        ("POST", "/compatibility/subjects/{s}/versions"),
        ("PUT", "/config"),
        ("PUT", "/config/{s}"),
        ("PUT", "/mode/{s}"),
    ],
)
def test_malformed_bodies(registry_broker: BrokerProcess, method: str, path: str) -> None:
    base, s = registry_broker.registry_url, _subject()
    path = path.format(s=s)
    for raw in (b"{not json", b'{"schema": ', b"\xff\xfe\x00garbage", b'{"schema": "x"} trailing'):
        assert error(base, method, path, raw=raw)[:2] == (400, 400), raw
    for shape in (b"[1, 2]", b'"a string"', b"42", b"null"):
        assert error(base, method, path, raw=shape)[:2] == (400, 400), shape
    assert error(base, method, path, raw=b"")[:2] == (422, 422)


def test_wrongly_typed_fields(registry_broker: BrokerProcess) -> None:
    base, s = registry_broker.registry_url, _subject()
    url = f"/subjects/{s}/versions"
    assert error(base, "POST", url, {"schema": {"type": "string"}})[:2] == (400, 400)
    assert error(base, "POST", url, {"schema": RECORD, "references": "nope"})[:2] == (400, 400)
    assert error(base, "POST", url, {"schema": RECORD, "references": [{"name": "x"}]})[:2] == (
        400,
        400,
    )
    assert error(base, "POST", url, {"schema": RECORD, "id": "seven"})[:2] == (400, 400)
    assert error(base, "POST", url, {})[:2] == (422, 42201)  # no schema
    assert error(base, "POST", url, {"schema": ""})[:2] == (422, 42201)
    assert error(base, "POST", url, {"schema": RECORD, "schemaType": "XML"})[:2] == (422, 42201)


@pytest.mark.parametrize(
    "schema_type,schema",
    [
        ("AVRO", "not json at all"),
        ("AVRO", '{"type": "nosuchtype"}'),
        ("AVRO", '{"type": "record", "name": "R"}'),  # no fields
        (
            "AVRO",
            '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", "default": "x"}]}',
        ),
        (
            "AVRO",
            '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, {"name": "a", "type": "int"}]}',
        ),
        ("AVRO", '{"type": "enum", "name": "E", "symbols": ["A", "A"]}'),
        ("AVRO", '{"type": "record", "name": "1bad", "fields": []}'),
        ("AVRO", "5"),
        ("JSON", '{"type": 5}'),
        ("JSON", '{"properties": {"a": {"type": "nope"}}}'),
        ("JSON", "[1, 2]"),
        ("JSON", "{broken"),
        ("PROTOBUF", 'syntax = "proto3"; message M { int32 a = 1; string a = 2; }'),
        ("PROTOBUF", 'syntax = "proto3"; message M { int32 a = 0; }'),
        ("PROTOBUF", "message M {"),
        ("PROTOBUF", 'syntax = "proto3"; message M { Missing m = 1; }'),
        ("PROTOBUF", "this is not protobuf"),
    ],
)
def test_invalid_schemas(registry_broker: BrokerProcess, schema_type: str, schema: str) -> None:
    base, s = registry_broker.registry_url, _subject()
    body = {"schema": schema, "schemaType": schema_type}
    assert error(base, "POST", f"/subjects/{s}/versions", body)[:2] == (422, 42201)
    assert error(base, "POST", f"/compatibility/subjects/{s}/versions/latest", body)[:2] == (
        422,
        42201,
    )
    assert http(base, "GET", f"/subjects/{s}/versions")[0] == 404  # nothing was registered


def test_unknown_subjects_versions_and_ids(registry_broker: BrokerProcess) -> None:
    base, s, missing = registry_broker.registry_url, _subject(), _subject()
    schema_id = _register(base, s, RECORD)
    for method, path in [
        ("GET", f"/subjects/{missing}/versions"),
        ("GET", f"/subjects/{missing}/versions/1"),
        ("GET", f"/subjects/{missing}/versions/latest"),
        ("DELETE", f"/subjects/{missing}"),
        ("DELETE", f"/subjects/{missing}/versions/1"),
        ("GET", f"/subjects/{missing}/versions/1/schema"),
        ("GET", f"/subjects/{missing}/versions/1/referencedby"),
    ]:
        body = {"schema": RECORD} if method == "POST" else None
        assert error(base, method, path, body)[:2] == (404, 40401), path
    assert error(base, "POST", f"/subjects/{missing}", {"schema": RECORD})[:2] == (404, 40401)
    for method, path in [
        ("GET", f"/subjects/{s}/versions/2"),
        ("DELETE", f"/subjects/{s}/versions/9"),
        ("GET", f"/subjects/{s}/versions/2/schema"),
        ("POST", f"/compatibility/subjects/{s}/versions/5"),
        # CompatibilityResource looks the version up without asking for the subject first
        ("POST", f"/compatibility/subjects/{missing}/versions/3"),
    ]:
        body = {"schema": RECORD} if method == "POST" else None
        assert error(base, method, path, body)[:2] == (404, 40402), path
    # ... and "latest" of a subject that does not exist is compatible
    latest = f"/compatibility/subjects/{missing}/versions/latest"
    assert http(base, "POST", latest, {"schema": RECORD}) == (200, {"is_compatible": True})
    other = json.dumps({"type": "record", "name": "Other", "fields": []})
    assert error(base, "POST", f"/subjects/{s}", {"schema": other})[:2] == (404, 40403)
    for path in (
        f"/schemas/ids/{schema_id + 100000}",
        f"/schemas/ids/{schema_id + 100000}/schema",
        f"/schemas/ids/{schema_id + 100000}/versions",
        f"/schemas/ids/{schema_id + 100000}/subjects",
    ):
        status, code, message = error(base, "GET", path)
        assert (status, code) == (404, 40403) and str(schema_id + 100000) in message
    assert error(base, "GET", "/schemas/ids/abc")[:2] == (404, 404)
    assert error(base, "GET", "/no/such/path")[:2] == (404, 404)
    assert error(base, "PATCH", "/config")[:2] == (405, 405)


@pytest.mark.parametrize("version", ["0", "-2", "abc", "1.5", "2147483648", "latestt"])
def test_invalid_versions(registry_broker: BrokerProcess, version: str) -> None:
    base, s = registry_broker.registry_url, _subject()
    _register(base, s, RECORD)
    for method, path in [
        ("GET", f"/subjects/{s}/versions/{version}"),
        ("DELETE", f"/subjects/{s}/versions/{version}"),
        ("GET", f"/subjects/{s}/versions/{version}/schema"),
        ("POST", f"/compatibility/subjects/{s}/versions/{version}"),
    ]:
        body = {"schema": RECORD} if method == "POST" else None
        status, code, message = error(base, method, path, body)
        assert (status, code) == (422, 42202) and version in message, (path, message)


def test_incompatible_schema(registry_broker: BrokerProcess) -> None:
    base, s = registry_broker.registry_url, _subject()
    _register(base, s, RECORD)
    breaking = json.dumps(
        {
            "type": "record",
            "name": "R",
            "fields": [{"name": "a", "type": "string"}, {"name": "b", "type": "int"}],
        }
    )
    status, code, message = error(base, "POST", f"/subjects/{s}/versions", {"schema": breaking})
    assert (status, code) == (409, 409)
    assert message.startswith(
        f'Schema being registered is incompatible with an earlier schema for subject "{s}"'
    )
    # both problems are listed, with the level
    assert (
        "TYPE_MISMATCH at /fields/0" in message
        and "READER_FIELD_MISSING_DEFAULT_VALUE at /fields/1" in message
    )
    assert "{compatibility: 'BACKWARD'}" in message, message
    assert http(base, "GET", f"/subjects/{s}/versions") == (200, [1])
    # a JSON schema after an Avro one is a different type: incompatible too
    status, code, message = error(
        base,
        "POST",
        f"/subjects/{s}/versions",
        {"schema": '{"type": "object"}', "schemaType": "JSON"},
    )
    assert (status, code) == (409, 409) and "different schema type" in message


def test_bad_compatibility_levels_and_modes(registry_broker: BrokerProcess) -> None:
    base, s = registry_broker.registry_url, _subject()
    for body in ({"compatibility": "SIDEWAYS"}, {"compatibility": 3}, {}, {"compatibility": None}):
        assert error(base, "PUT", "/config", body)[:2] == (422, 42203), body
        assert error(base, "PUT", f"/config/{s}", body)[:2] == (422, 42203), body
    assert http(base, "GET", "/config") == (200, {"compatibilityLevel": "BACKWARD"})
    for body in ({"mode": "WRITEONLY"}, {"mode": 1}, {}):
        assert error(base, "PUT", "/mode", body)[:2] == (422, 42204), body
        assert error(base, "PUT", f"/mode/{s}", body)[:2] == (422, 42204), body
    assert http(base, "GET", "/mode") == (200, {"mode": "READWRITE"})
    assert error(base, "GET", f"/config/{s}")[:2] == (404, 40408)
    assert error(base, "GET", f"/mode/{s}")[:2] == (404, 40409)
    assert error(base, "DELETE", f"/config/{s}")[:2] == (404, 40401)
    assert error(base, "DELETE", f"/mode/{s}")[:2] == (404, 40401)


def test_delete_state_errors(registry_broker: BrokerProcess) -> None:
    base, s = registry_broker.registry_url, _subject()
    _register(base, s, RECORD)
    assert error(base, "DELETE", f"/subjects/{s}?permanent=true")[:2] == (404, 40405)
    assert error(base, "DELETE", f"/subjects/{s}/versions/1?permanent=true")[:2] == (404, 40407)
    assert http(base, "DELETE", f"/subjects/{s}/versions/1") == (200, 1)
    assert error(base, "DELETE", f"/subjects/{s}/versions/1")[:2] == (404, 40406)
    assert error(base, "DELETE", f"/subjects/{s}")[:2] == (404, 40404)
    assert error(base, "GET", f"/subjects/{s}/versions/1")[:2] == (404, 40401)
    assert http(base, "GET", f"/subjects/{s}/versions/1?deleted=true")[0] == 200
    assert http(base, "DELETE", f"/subjects/{s}/versions/1?permanent=true") == (200, 1)
    assert error(base, "DELETE", f"/subjects/{s}/versions/1?permanent=true")[:2] == (404, 40401)
    # a reference to a schema that does not exist is an invalid schema
    body = {
        "schema": json.dumps(
            {"type": "record", "name": "X", "fields": [{"name": "r", "type": "R"}]}
        ),
        "references": [{"name": "R", "subject": s, "version": 1}],
    }
    assert error(base, "POST", f"/subjects/{_subject()}/versions", body)[:2] == (422, 42201)


def test_garbage_never_500(registry_broker: BrokerProcess) -> None:
    """Every endpoint with odd paths, parameters and bodies: always a 2xx or 4xx answer."""
    base, s = registry_broker.registry_url, _subject()
    _register(base, s, RECORD)
    paths = [
        "/subjects/{s}/versions",
        "/subjects/{s}",
        "/subjects/{s}/versions/{v}",
        "/subjects/{s}/versions/{v}/schema",
        "/subjects/{s}/versions/{v}/referencedby",
        "/compatibility/subjects/{s}/versions/{v}",
        "/compatibility/subjects/{s}/versions",
        "/schemas/ids/{v}",
        "/schemas/ids/{v}/versions",
        "/config/{s}",
        "/mode/{s}",
        "/subjects",
        "/schemas",
    ]
    subjects = [s, "%00", "a%2Fb", "%E2%98%83"]
    versions = ["latest", "-1", "99999999999999999999", "1e3"]
    params = ["?deleted=maybe&offset=x", "?format=serialized&limit=-5&permanent=TRUE&verbose=1"]
    bodies: list[bytes | None] = [
        None,
        b"{}",
        b'{"schema": "\\"string\\"", "references": []}',
        b'{"schema": "\\"int\\"", "schemaType": "PROTOBUF"}',
        b'{"schema": "{\\"$ref\\": \\"#/definitions/x\\"}", "schemaType": "JSON"}',
        b'{"schema": "[\\"null\\", \\"null\\"]"}',
        b'{"compatibility": "none", "mode": "readonly"}',
    ]
    failures = []
    pick = itertools.cycle(bodies)
    for path, sub, ver, param in itertools.product(paths, subjects, versions, params):
        url = path.format(s=sub, v=ver) + param
        for method in ("GET", "POST", "PUT", "DELETE"):
            body = next(pick)
            status, _ = http(base, method, url, raw=body)
            if status >= 500:
                failures.append((method, url, body, status))
    assert not failures, failures[:10]
    assert http(base, "PUT", "/mode", {"mode": "READWRITE"})[0] == 200
    assert http(base, "PUT", "/config", {"compatibility": "BACKWARD"})[0] == 200


def _raw(
    base: str, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) with the request headers exactly as given."""
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_invalid_schema_message_is_confluents(registry_broker: BrokerProcess) -> None:
    base, s = registry_broker.registry_url, _subject()
    bad = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]})
    status, code, message = error(base, "POST", f"/subjects/{s}/versions", {"schema": bad})
    assert (status, code) == (422, 42201)
    assert message.startswith(f"Invalid schema {{subject={s},") and f"schema={bad}" in message
    assert "with refs [] of type AVRO, details: " in message and "nope" in message, message
    # verbose compatibility turns an invalid schema into a message, as Confluent does
    _register(base, s, RECORD)
    status, answer = http(
        base, "POST", f"/compatibility/subjects/{s}/versions/latest?verbose=true", {"schema": bad}
    )
    assert status == 200 and answer["is_compatible"] is False, answer
    assert answer["messages"][0].startswith("Invalid schema {"), answer


def test_media_types_and_negotiation(registry_broker: BrokerProcess) -> None:
    base = registry_broker.registry_url
    assert _raw(base, "GET", "/subjects")[1]["Content-Type"] == CONTENT_TYPE
    for accept, media in [
        ("*/*", CONTENT_TYPE),
        ("application/json", "application/json"),
        ("application/vnd.schemaregistry+json", "application/vnd.schemaregistry+json"),
        ("application/*", CONTENT_TYPE),
        ("application/json, application/vnd.schemaregistry.v1+json", CONTENT_TYPE),
        (
            "application/json; q=0.9, application/vnd.schemaregistry.v1+json; q=0.1",
            "application/json",
        ),
    ]:
        status, headers, _ = _raw(base, "GET", "/subjects", Accept=accept)
        assert (status, headers["Content-Type"]) == (200, media), accept
    # an error answers in the negotiated type too
    status, headers, body = _raw(
        base, "GET", f"/subjects/{_subject()}/versions", Accept="application/json"
    )
    assert (status, headers["Content-Type"], json.loads(body)["error_code"]) == (
        404,
        "application/json",
        40401,
    )
    status, _, body = _raw(base, "GET", "/subjects", Accept="text/html")
    assert (status, json.loads(body)) == (
        406,
        {"error_code": 406, "message": "HTTP 406 Not Acceptable"},
    )
    # a body of a type the registry does not consume (curl -d's default) is refused unread
    s = _subject()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _, body = _raw(
        base, "POST", f"/subjects/{s}/versions", json.dumps({"schema": RECORD}).encode(), **form
    )
    assert (status, json.loads(body)["error_code"]) == (415, 415)
    assert http(base, "GET", f"/subjects/{s}/versions")[0] == 404
    for ctype in (
        "application/json",
        "application/vnd.schemaregistry+json",
        "application/octet-stream",
    ):
        status, _, body = _raw(
            base,
            "POST",
            f"/subjects/{s}/versions",
            json.dumps({"schema": RECORD}).encode(),
            **{"Content-Type": ctype},
        )
        assert status == 200, (ctype, body)


def test_method_not_allowed_names_the_allowed_ones(registry_broker: BrokerProcess) -> None:
    base = registry_broker.registry_url
    status, headers, body = _raw(base, "PATCH", "/config")
    assert (status, json.loads(body)["error_code"]) == (405, 405)
    assert set(headers["Allow"].split(",")) >= {"GET", "PUT", "DELETE"}, headers
    status, headers, _ = _raw(base, "PUT", f"/subjects/{_subject()}/versions")
    assert status == 405 and set(headers["Allow"].split(",")) >= {"GET", "POST"}, headers


def test_subjects_with_braces(registry_broker: BrokerProcess) -> None:
    """``{`` and ``}`` are legal in a subject (the client URL-encodes them)."""
    base = registry_broker.registry_url
    client = SchemaRegistryClient({"url": base, "max.retries": 0})
    subject = f"{{ns}}.{_subject()}-value"
    schema_id = client.register_schema(subject, Schema(RECORD, "AVRO"))
    assert client.get_latest_version(subject).schema_id == schema_id
    assert subject in client.get_subjects()
    encoded = urllib.parse.quote(subject, safe="")
    assert http(base, "GET", f"/subjects/{encoded}/versions") == (200, [1])
    assert subject in http(base, "GET", f"/schemas/ids/{schema_id}/subjects")[1]
    assert client.delete_subject(subject) == [1]
