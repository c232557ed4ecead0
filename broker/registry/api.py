"""The Confluent Schema Registry REST API (the subset every Confluent serializer
and ``SchemaRegistryClient`` uses), served by the broker on ``registry_port``.

Answers are ``application/vnd.schemaregistry.v1+json``; errors are
``{"error_code": ..., "message": ...}`` with Confluent's statuses and codes (see
api_errors). Bad input never becomes a 500: bodies, paths and query parameters are
checked here, schemas by the store.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from broker.http_security.registry_auth import RegistryAuth, readable
from broker.http_service import HttpService
from broker.registry import api_errors as errors
from broker.registry.api_errors import RegistryError
from broker.registry.errors import InvalidSchemaError
from broker.registry.forward import Forwarder
from broker.registry.schemas import (
    SCHEMA_TYPES,
    Reference,
    flatten_references,
    normalize_type,
    references_from_json,
)
from broker.registry.store import LATEST, MAX_VERSION, RegisteredSchema, SchemaStore, SubjectVersion
from broker.registry.table_check import TableCheck

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# What the registry produces, with Confluent's server-side weights (Versions.*_WEIGHTED):
# the client's Accept picks among them, its q first, then these weights.
PRODUCES = (
    (CONTENT_TYPE, 1.0),
    ("application/vnd.schemaregistry+json", 0.9),
    ("application/json", 0.5),
)
# What the registry consumes (Versions.SCHEMA_REGISTRY_V1_JSON, ..., GENERIC_REQUEST); a
# request without a Content-Type is application/octet-stream, as in Jersey.
CONSUMES = frozenset(
    {
        CONTENT_TYPE,
        "application/vnd.schemaregistry+json",
        "application/json",
        "application/octet-stream",
    }
)


def reply(obj: Any, status: int = 200) -> web.Response:
    return text_reply(json.dumps(obj, ensure_ascii=False), status)


def text_reply(text: str, status: int = 200) -> web.Response:
    """A UTF-8 body under the bare media type (no ``; charset=``), as Confluent answers."""
    return web.Response(body=text.encode(), status=status, content_type=CONTENT_TYPE)


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").strip().lower() == "true"


def _int_param(request: web.Request, name: str, default: int) -> int:
    value = request.query.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise errors.bad_request(
            f"Query parameter '{name}' must be an integer, got {value!r}"
        ) from None


def _page(request: web.Request, items: list[Any]) -> list[Any]:
    offset = max(_int_param(request, "offset", 0), 0)
    limit = _int_param(request, "limit", -1)
    items = items[offset:]
    return items if limit < 0 else items[:limit]


def parse_version(text: str) -> int:
    """A version path segment: 1..2^31-1, or "latest" / -1 (LATEST); else 42202."""
    if text.strip().lower() == "latest":
        return LATEST
    try:
        value = int(text.strip())
    except ValueError:
        raise errors.invalid_version(text) from None
    if value == LATEST or 1 <= value <= MAX_VERSION:
        return value
    raise errors.invalid_version(text)


def _subject(request: web.Request) -> str:
    subject = request.match_info["subject"]
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in subject):
        raise errors.invalid_subject(subject)
    return subject


async def _body(request: web.Request) -> dict[str, Any]:
    """The JSON object in the request body: 400 when it is not JSON or not an
    object (rest-utils' Json{Parse,Mapping}ExceptionMapper), 422 when it is empty."""
    raw = await request.read()
    if not raw.strip():
        raise errors.unprocessable("Request body is empty: a JSON object is required")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.bad_request(
            f"Unexpected content in the request body: not valid JSON ({exc})"
        ) from None
    if not isinstance(body, dict):
        raise errors.bad_request(
            f"Cannot deserialize the request body: expected a JSON object, got {type(body).__name__}"
        )
    return body


def _schema_request(body: dict[str, Any]) -> tuple[str, Any, list[Reference]]:
    """(schemaType, schema text, references) of a register/lookup/compatibility body."""
    text = body.get("schema")
    if isinstance(text, (dict, list)):
        raise errors.bad_request(
            "Cannot deserialize value of type `java.lang.String` from an object or array "
            "(field 'schema' must be a string)"
        )
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = str(text)
    try:
        refs = references_from_json(body.get("references"))
    except ValueError as exc:
        raise errors.bad_request(f"Cannot deserialize field 'references': {exc}") from None
    try:
        schema_type = normalize_type(body.get("schemaType"))
    except InvalidSchemaError as exc:
        raise errors.invalid_schema(str(exc)) from None
    return schema_type, text, refs


def negotiate(accept: str) -> str | None:
    """The media type to answer with for an ``Accept`` header (None: nothing acceptable).

    Each type the registry produces is scored by the best Accept range matching it
    (exact, ``application/*``, ``*/*``), by q and then by the server's own weight."""
    ranges: list[tuple[str, float]] = []
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if not media:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        ranges.append((media.lower(), q))
    if not ranges:
        return CONTENT_TYPE
    best: tuple[float, float, str] | None = None
    for produced, weight in PRODUCES:
        kind = produced.split("/")[0]
        qs = [q for media, q in ranges if media in (produced, f"{kind}/*", "*/*")]
        if qs and max(qs) > 0 and (best is None or (max(qs), weight) > best[:2]):
            best = (max(qs), weight, produced)
    return best[2] if best else None


def _http_error(exc: web.HTTPException) -> web.Response:
    """An aiohttp error (no route 404, 405, 413...) in the registry's body, its headers kept
    (``Allow`` on a 405, as Jersey sends)."""
    response = reply(
        {"error_code": exc.status, "message": f"HTTP {exc.status} {exc.reason}"}, exc.status
    )
    if "Allow" in exc.headers:
        response.headers["Allow"] = exc.headers["Allow"]
    return response


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Errors in the registry's body; Content-Type and Accept checked as Jersey does them
    (no route, then 415, then 406, before the handler runs)."""
    media = negotiate(request.headers.get("Accept", ""))
    response = await _answer(request, handler, media is not None)
    if media is not None and media != CONTENT_TYPE and response.content_type == CONTENT_TYPE:
        response.content_type = media
    return response


async def _answer(request: web.Request, handler: Handler, acceptable: bool) -> web.StreamResponse:
    if request.match_info.http_exception is None:
        if request.method in ("POST", "PUT") and request.content_type.lower() not in CONSUMES:
            return reply({"error_code": 415, "message": "HTTP 415 Unsupported Media Type"}, 415)
        if not acceptable:
            return reply({"error_code": 406, "message": "HTTP 406 Not Acceptable"}, 406)
    try:
        return await handler(request)
    except RegistryError as exc:
        return reply(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(exc)
    except Exception as exc:  # a bug; still answer in the registry's format
        log.exception("schema registry: %s %s failed", request.method, request.path)
        return reply(
            {"error_code": 500, "message": f"Internal Server Error: {type(exc).__name__}"}, 500
        )


class RegistryApi(HttpService):
    def __init__(
        self,
        store: SchemaStore,
        table_check: TableCheck | None = None,
        auth: RegistryAuth | None = None,
        forward: Forwarder | None = None,
    ) -> None:
        """``auth``: basic auth and roles on every request (None: open, the default).
        ``forward`` (cluster mode): writes go to the registry's one writer, after the
        caller's credentials and role were checked here."""
        self.store = store
        self.table_check = table_check  # a table topic's value schemas against its Iceberg table
        middlewares = [
            error_middleware,
            *([auth.middleware] if auth else []),
            *([forward.middleware] if forward else []),
        ]
        self.app = web.Application(middlewares=middlewares, client_max_size=16 * 1024 * 1024)
        s = "{subject:[^/]+}"  # any character but '/', '{' and '}' included (URL-encoded or not)
        self.app.add_routes(
            [
                web.get("/", self.root),
                web.get("/contexts", self.contexts),
                web.get("/subjects", self.list_subjects),
                web.post(f"/subjects/{s}", self.lookup),
                web.delete(f"/subjects/{s}", self.delete_subject),
                web.get(f"/subjects/{s}/versions", self.list_versions),
                web.post(f"/subjects/{s}/versions", self.register),
                web.get(f"/subjects/{s}/versions/{{version}}", self.get_version),
                web.delete(f"/subjects/{s}/versions/{{version}}", self.delete_version),
                web.get(f"/subjects/{s}/versions/{{version}}/schema", self.get_version_schema),
                web.get(f"/subjects/{s}/versions/{{version}}/referencedby", self.referenced_by),
                web.get("/schemas", self.list_schemas),
                web.get("/schemas/types", self.schema_types),
                web.get("/schemas/ids/{id}", self.get_by_id),
                web.get("/schemas/ids/{id}/schema", self.get_by_id_schema),
                web.get("/schemas/ids/{id}/subjects", self.subjects_of_id),
                web.get("/schemas/ids/{id}/versions", self.versions_of_id),
                web.post(
                    f"/compatibility/subjects/{s}/versions/{{version}}", self.compatibility_version
                ),
                web.post(f"/compatibility/subjects/{s}/versions", self.compatibility_all),
                web.get("/config", self.get_config),
                web.put("/config", self.put_config),
                web.delete("/config", self.delete_config),
                web.get(f"/config/{s}", self.get_config),
                web.put(f"/config/{s}", self.put_config),
                web.delete(f"/config/{s}", self.delete_config),
                web.get("/mode", self.get_mode),
                web.put("/mode", self.put_mode),
                web.delete("/mode", self.delete_mode),
                web.get(f"/mode/{s}", self.get_mode),
                web.put(f"/mode/{s}", self.put_mode),
                web.delete(f"/mode/{s}", self.delete_mode),
            ]
        )
        self._serialized: dict[
            int, str
        ] = {}  # protobuf id -> base64 descriptor (an id's schema never changes)

    # ------------------------------------------------------------------ rendering

    def _schema_text(self, rs: RegisteredSchema, fmt: str | None) -> str:
        if rs.schema_type != "PROTOBUF":
            return rs.schema
        from broker.registry.protobuf import text as proto_text

        if fmt == "serialized":
            cached = self._serialized.get(rs.id)
            if cached is not None:
                return cached
            try:
                deps = {
                    name: proto_text.as_text(text)
                    for name, text in flatten_references(self.store.resolve(rs.references)).items()
                }
                self._serialized[rs.id] = proto_text.as_serialized(rs.schema, deps)
                return self._serialized[rs.id]
            except Exception as exc:  # noqa: BLE001
                log.warning("schema id %d: no serialized form: %s", rs.id, exc)
                raise errors.invalid_schema(
                    f"Schema {rs.id} cannot be returned in the serialized format: {exc}"
                ) from None
        return proto_text.as_text(rs.schema)

    def _schema_json(self, rs: RegisteredSchema, fmt: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if rs.schema_type != "AVRO":
            out["schemaType"] = rs.schema_type
        if rs.references:
            out["references"] = [r.to_json() for r in rs.references]
        out["schema"] = self._schema_text(rs, fmt)
        return out

    def _version_json(self, sv: SubjectVersion, fmt: str | None) -> dict[str, Any]:
        rs = self.store.schema_of(sv)
        return {
            "subject": sv.subject,
            "version": sv.version,
            "id": rs.id,
            **self._schema_json(rs, fmt),
        }

    def _schema_id(self, request: web.Request) -> int:
        try:
            return int(request.match_info["id"])
        except ValueError:
            raise errors.not_found() from None

    # ------------------------------------------------------------------ handlers

    async def root(self, request: web.Request) -> web.Response:
        return reply({})

    async def contexts(self, request: web.Request) -> web.Response:
        return reply(["."])

    async def list_subjects(self, request: web.Request) -> web.Response:
        deleted_only = _flag(request, "deletedOnly") or _flag(request, "deleted_only")
        subjects = self.store.list_subjects(
            _flag(request, "deleted"), deleted_only, request.query.get("subjectPrefix", "")
        )
        return reply(_page(request, readable(request, subjects)))

    async def list_versions(self, request: web.Request) -> web.Response:
        deleted_only = _flag(request, "deletedOnly") or _flag(request, "deleted_only")
        versions = self.store.list_versions(
            _subject(request), _flag(request, "deleted"), deleted_only
        )
        return reply(_page(request, versions))

    async def register(self, request: web.Request) -> web.Response:
        subject = _subject(request)
        body = await _body(request)
        schema_type, text, refs = _schema_request(body)
        schema_id, version = body.get("id"), body.get("version")
        for name, value in (("id", schema_id), ("version", version)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise errors.bad_request(f"Cannot deserialize field '{name}': expected an integer")
        if schema_id is not None and schema_id < 0:
            schema_id = None  # -1 is the Java client's "no id"
        if version is not None and version <= 0:
            version = None
        if self.table_check is not None and schema_id is None:
            await self.table_check.check(
                subject, schema_type, text, refs, _flag(request, "normalize")
            )
        sv, rs = await self.store.register(
            subject, schema_type, text, refs, schema_id, version, _flag(request, "normalize")
        )
        return reply({"id": rs.id, "version": sv.version})

    async def lookup(self, request: web.Request) -> web.Response:
        subject = _subject(request)
        body = await _body(request)
        schema_type, text, refs = _schema_request(body)
        sv, _ = self.store.lookup(
            subject,
            schema_type,
            text,
            refs,
            _flag(request, "deleted"),
            _flag(request, "normalize"),
        )
        return reply(self._version_json(sv, request.query.get("format")))

    async def get_version(self, request: web.Request) -> web.Response:
        sv = self.store.get_version(
            _subject(request),
            parse_version(request.match_info["version"]),
            _flag(request, "deleted"),
        )
        return reply(self._version_json(sv, request.query.get("format")))

    async def get_version_schema(self, request: web.Request) -> web.Response:
        sv = self.store.get_version(
            _subject(request),
            parse_version(request.match_info["version"]),
            _flag(request, "deleted"),
        )
        text = self._schema_text(self.store.schema_of(sv), request.query.get("format"))
        return text_reply(text)

    async def referenced_by(self, request: web.Request) -> web.Response:
        sv = self.store.get_version(
            _subject(request), parse_version(request.match_info["version"]), True
        )
        return reply(_page(request, self.store.referenced_by(sv)))

    async def delete_subject(self, request: web.Request) -> web.Response:
        versions = await self.store.delete_subject(_subject(request), _flag(request, "permanent"))
        return reply(versions)

    async def delete_version(self, request: web.Request) -> web.Response:
        subject = _subject(request)
        version = await self.store.delete_version(
            subject, parse_version(request.match_info["version"]), _flag(request, "permanent")
        )
        return reply(version)

    async def list_schemas(self, request: web.Request) -> web.Response:
        prefix = request.query.get("subjectPrefix", "")
        deleted, latest_only = _flag(request, "deleted"), _flag(request, "latestOnly")
        out = []
        for subject in readable(request, self.store.list_subjects(deleted, False, prefix)):
            versions = self.store.subjects[subject].included(deleted)
            for sv in versions[-1:] if latest_only else versions:
                out.append(self._version_json(sv, request.query.get("format")))
        return reply(_page(request, out))

    async def schema_types(self, request: web.Request) -> web.Response:
        return reply(list(SCHEMA_TYPES))

    async def get_by_id(self, request: web.Request) -> web.Response:
        schema_id = self._schema_id(request)
        rs = self.store.schema_by_id(schema_id)
        if rs is None:
            raise errors.schema_not_found(schema_id)
        return reply(self._schema_json(rs, request.query.get("format")))

    async def get_by_id_schema(self, request: web.Request) -> web.Response:
        schema_id = self._schema_id(request)
        rs = self.store.schema_by_id(schema_id)
        if rs is None:
            raise errors.schema_not_found(schema_id)
        return text_reply(self._schema_text(rs, request.query.get("format")))

    async def subjects_of_id(self, request: web.Request) -> web.Response:
        versions = self.store.versions_of_id(
            self._schema_id(request), _flag(request, "deleted"), request.query.get("subject")
        )
        subjects = readable(request, sorted({sv.subject for sv in versions}))
        return reply(_page(request, subjects))

    async def versions_of_id(self, request: web.Request) -> web.Response:
        versions = self.store.versions_of_id(
            self._schema_id(request), _flag(request, "deleted"), request.query.get("subject")
        )
        shown = set(readable(request, {sv.subject for sv in versions}))
        return reply(
            _page(
                request,
                [
                    {"subject": sv.subject, "version": sv.version}
                    for sv in versions
                    if sv.subject in shown
                ],
            )
        )

    async def _compatibility(self, request: web.Request, version: int | None) -> web.Response:
        subject = _subject(request)
        body = await _body(request)
        schema_type, text, refs = _schema_request(body)
        verbose = _flag(request, "verbose")
        try:
            messages = self.store.test_compatibility(
                subject, version, schema_type, text, refs, _flag(request, "normalize")
            )
        except RegistryError as exc:
            if not (verbose and exc.code == 42201):
                raise
            messages = [exc.message]  # Confluent: verbose turns an invalid schema into a message
        answer: dict[str, Any] = {"is_compatible": not messages}
        if verbose:
            answer["messages"] = messages
        return reply(answer)

    async def compatibility_version(self, request: web.Request) -> web.Response:
        return await self._compatibility(request, parse_version(request.match_info["version"]))

    async def compatibility_all(self, request: web.Request) -> web.Response:
        return await self._compatibility(request, None)

    async def get_config(self, request: web.Request) -> web.Response:
        subject = _subject(request) if "subject" in request.match_info else None
        return reply(self.store.get_config(subject, _flag(request, "defaultToGlobal")))

    async def put_config(self, request: web.Request) -> web.Response:
        subject = _subject(request) if "subject" in request.match_info else None
        body = await _body(request)
        return reply(await self.store.set_config(subject, body))

    async def delete_config(self, request: web.Request) -> web.Response:
        subject = _subject(request) if "subject" in request.match_info else None
        return reply(await self.store.delete_config(subject))

    async def get_mode(self, request: web.Request) -> web.Response:
        subject = _subject(request) if "subject" in request.match_info else None
        return reply({"mode": self.store.get_mode(subject, _flag(request, "defaultToGlobal"))})

    async def put_mode(self, request: web.Request) -> web.Response:
        subject = _subject(request) if "subject" in request.match_info else None
        body = await _body(request)
        return reply(
            {"mode": await self.store.set_mode(subject, body.get("mode"), _flag(request, "force"))}
        )

    async def delete_mode(self, request: web.Request) -> web.Response:
        subject = _subject(request) if "subject" in request.match_info else None
        return reply({"mode": await self.store.delete_mode(subject)})
