"""The Iceberg REST catalog over HTTP (aiohttp), served by the broker process.

Routes follow the official OpenAPI document without the optional ``{prefix}``
segment (one catalog per broker, so ``/v1/namespaces``...); ``GET /v1/config``
sets no prefix and lists the endpoints in the spec's ``{prefix}`` template
form, which is how clients match them. Blocking work (SQL, metadata files)
runs in a small thread pool; commits, creates, drops, renames and registers
of tables and views hold a per-name asyncio lock (a table and a view share
their names), taken in sorted order when a request touches several names.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from broker import iceberg_json
from broker.catalog import commits, view_store
from broker.catalog.errors import (
    BadRequest,
    CatalogError,
    NotFound,
    Unsupported,
    error_middleware,
    head_error,
)
from broker.catalog.models import (
    CommitTableRequest,
    CommitTransactionRequest,
    CommitViewRequest,
    CreateNamespaceRequest,
    CreateTableRequest,
    CreateViewRequest,
    MetricsReport,
    RegisterTableRequest,
    RegisterViewRequest,
    RenameTableRequest,
    UpdateNamespacePropertiesRequest,
    check_name,
    check_namespace,
    check_namespace_keys,
    check_properties,
    parse_namespace,
    read_body,
)
from broker.catalog.store import CatalogStore, Identifier, LoadedTable
from broker.http_security.oauth import CatalogAuth
from broker.http_service import HttpService

log = logging.getLogger(__name__)
T = TypeVar("T")

NS = "/v1/namespaces/{namespace}"
TABLE = NS + "/tables/{table}"
VIEW = NS + "/views/{view}"
MAX_BODY = 64 * 1024 * 1024  # table metadata with many snapshots can be large

# What GET /v1/config advertises, in the spec's "<verb> <path template>" form.
ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "POST /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "DELETE /v1/{prefix}/namespaces/{namespace}",
    "POST /v1/{prefix}/namespaces/{namespace}/properties",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "POST /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/register",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/unregister",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}/credentials",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics",
    "POST /v1/{prefix}/tables/rename",
    "POST /v1/{prefix}/transactions/commit",
    "GET /v1/{prefix}/namespaces/{namespace}/views",
    "POST /v1/{prefix}/namespaces/{namespace}/views",
    "GET /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "POST /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/views/{view}",
    "POST /v1/{prefix}/namespaces/{namespace}/register-view",
    "POST /v1/{prefix}/views/rename",
]


class TableLocks:
    """One asyncio lock per table identifier, taken in a global order. A lock
    lives only while someone holds or awaits it (weak values), so names that
    were touched once do not accumulate."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[Identifier, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    @contextlib.asynccontextmanager
    async def hold(self, identifiers: Iterable[Identifier]) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for ident in sorted(set(identifiers)):
                lock = self._locks.get(ident)
                if lock is None:
                    lock = self._locks[ident] = asyncio.Lock()
                await stack.enter_async_context(lock)
            yield


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=headers
    )


def _metadata_json(metadata: Any) -> dict[str, Any]:
    return iceberg_json.to_dict(metadata)


def _table_result(
    table: LoadedTable, snapshots: str = "all", config: dict[str, str] | None = None
) -> dict[str, Any]:
    metadata = _metadata_json(table.metadata)
    if snapshots == "refs":
        referenced = {ref["snapshot-id"] for ref in metadata.get("refs", {}).values()}
        metadata["snapshots"] = [
            s for s in metadata.get("snapshots", []) if s["snapshot-id"] in referenced
        ]
    result: dict[str, Any] = {"metadata": metadata, "config": dict(config or {})}
    if table.metadata_location is not None:
        result["metadata-location"] = table.metadata_location
    return result


def _view_result(view: view_store.LoadedView) -> dict[str, Any]:
    return {
        "metadata-location": view.metadata_location,
        "metadata": view.metadata.model_dump(mode="json"),
        "config": {},
    }


def _etag(metadata_location: str | None, snapshots: str) -> str | None:
    if metadata_location is None:
        return None
    return '"' + hashlib.sha256(f"{metadata_location}|{snapshots}".encode()).hexdigest()[:32] + '"'


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "false").lower()
    if value not in ("true", "false"):
        raise BadRequest(f"{name} must be true or false")
    return value == "true"


def _page(request: web.Request, items: list[T]) -> tuple[list[T], dict[str, Any]]:
    """Pagination with the offset as the opaque token; without ``pageToken`` every item, token null."""
    token, size = request.query.get("pageToken"), request.query.get("pageSize")
    if token is None:
        return items, {"next-page-token": None}
    if token and not (token.isascii() and token.isdigit()):
        raise BadRequest(f"invalid pageToken {token!r}")
    if size is not None and not (size.isascii() and size.isdigit() and int(size) >= 1):
        raise BadRequest("pageSize must be a positive integer")
    start = int(token or 0)
    end = start + int(size) if size is not None else len(items)
    return items[start:end], {"next-page-token": str(end) if end < len(items) else None}


class CatalogApi(HttpService):
    def __init__(
        self,
        store: CatalogStore,
        workers: int = 4,
        client_config: dict[str, str] | None = None,
        table_config: dict[str, str] | None = None,
        auth: CatalogAuth | None = None,
    ) -> None:
        """``client_config``: the FileIO settings every client gets (``/v1/config`` defaults);
        ``table_config``: what each load-table result's ``config`` carries (the same, plus
        credentials when the broker vends them); ``auth``: OAuth2 tokens required on every
        route (None: open, the default)."""
        self.store = store
        self.auth = auth
        self.client_config = client_config or {}
        self.table_config = table_config if table_config is not None else self.client_config
        self.locks = TableLocks()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="iceberg-catalog")
        middlewares = [error_middleware, *([auth.middleware] if auth else [])]
        self.app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY)
        self.app.add_routes(
            [
                web.get("/v1/config", self.get_config),
                web.post("/v1/oauth/tokens", auth.token_endpoint if auth else self.oauth_tokens),
                web.get("/v1/namespaces", self.list_namespaces),
                web.post("/v1/namespaces", self.create_namespace),
                web.get(NS, self.load_namespace, allow_head=False),
                web.head(NS, self.namespace_exists),
                web.delete(NS, self.drop_namespace),
                web.post(NS + "/properties", self.update_properties),
                web.get(NS + "/tables", self.list_tables),
                web.post(NS + "/tables", self.create_table),
                web.post(NS + "/register", self.register_table),
                web.get(TABLE, self.load_table, allow_head=False),
                web.head(TABLE, self.table_exists),
                web.post(TABLE, self.commit_table),
                web.delete(TABLE, self.drop_table),
                web.post(TABLE + "/unregister", self.unregister_table),
                web.get(TABLE + "/credentials", self.load_credentials),
                web.post(TABLE + "/metrics", self.report_metrics),
                web.post(TABLE + "/plan", self.unsupported),
                web.get(TABLE + "/plan/{plan_id}", self.no_such_plan, allow_head=False),
                web.delete(TABLE + "/plan/{plan_id}", self.no_such_plan),
                web.post(TABLE + "/tasks", self.no_such_plan_task),
                web.post(TABLE + "/sign", self.unsupported),
                web.post("/v1/tables/rename", self.rename_table),
                web.post("/v1/transactions/commit", self.commit_transaction),
                web.get(NS + "/views", self.list_views),
                web.post(NS + "/views", self.create_view),
                web.post(NS + "/register-view", self.register_view),
                web.get(VIEW, self.load_view, allow_head=False),
                web.head(VIEW, self.view_exists),
                web.post(VIEW, self.replace_view),
                web.delete(VIEW, self.drop_view),
                web.post("/v1/views/rename", self.rename_view),
                web.get(NS + "/functions", self.list_functions),
                web.get(NS + "/functions/{function}", self.no_such_function, allow_head=False),
            ]
        )
        self.access_log = log if log.isEnabledFor(logging.DEBUG) else None

    async def close(self) -> None:
        await super().close()
        self.pool.shutdown(wait=True)
        self.store.close()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # ------------------------------------------------------------ helpers

    @staticmethod
    def _namespace(request: web.Request) -> Identifier:
        return parse_namespace(request.match_info["namespace"])

    @classmethod
    def _table(cls, request: web.Request) -> Identifier:
        return (*cls._namespace(request), check_name(request.match_info["table"]))

    @classmethod
    def _view(cls, request: web.Request) -> Identifier:
        return (*cls._namespace(request), check_name(request.match_info["view"], "view name"))

    async def _require_namespace(self, namespace: Identifier) -> None:
        if not await self._run(self.store.namespace_exists, namespace):
            raise NoSuchNamespaceError(f"Namespace does not exist: {'.'.join(namespace)}")

    async def _require_table(self, ident: Identifier) -> str:
        location = await self._run(self.store.current_location, ident)
        if location is None:
            raise NoSuchTableError(f"Table does not exist: {'.'.join(ident)}")
        return location

    # ------------------------------------------------------------ config

    async def get_config(self, request: web.Request) -> web.Response:
        return _json({"defaults": self.client_config, "overrides": {}, "endpoints": ENDPOINTS})

    async def oauth_tokens(self, request: web.Request) -> web.Response:
        return _json(
            {
                "error": "invalid_request",
                "error_description": "this catalog needs no authentication: configure no credential",
            },
            400,
        )

    # ------------------------------------------------------------ namespaces

    async def list_namespaces(self, request: web.Request) -> web.Response:
        parent_param = request.query.get("parent", "")
        parent = parse_namespace(parent_param) if parent_param else ()
        items, token = _page(request, await self._run(self.store.list_namespaces, parent))
        return _json({"namespaces": [list(ns) for ns in items], **token})

    async def create_namespace(self, request: web.Request) -> web.Response:
        body = await read_body(request, CreateNamespaceRequest)
        namespace = check_namespace(body.namespace)
        check_namespace_keys(body.properties)
        props = await self._run(
            self.store.create_namespace, namespace, check_properties(body.properties)
        )
        return _json({"namespace": list(namespace), "properties": props})

    async def load_namespace(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        props = await self._run(self.store.load_namespace, namespace)
        return _json({"namespace": list(namespace), "properties": props})

    async def namespace_exists(self, request: web.Request) -> web.Response:
        exists = await self._run(self.store.namespace_exists, self._namespace(request))
        return web.Response(status=204) if exists else head_error(404)

    async def drop_namespace(self, request: web.Request) -> web.Response:
        await self._run(self.store.drop_namespace, self._namespace(request))
        return web.Response(status=204)

    async def update_properties(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        body = await read_body(request, UpdateNamespacePropertiesRequest)
        removals, updates = set(body.removals), check_properties(body.updates)
        check_namespace_keys([*removals, *updates])
        if overlap := removals & updates.keys():
            raise CatalogError(
                f"keys both updated and removed: {sorted(overlap)}",
                422,
                "UnprocessableEntityException",
            )
        summary = await self._run(self.store.update_namespace, namespace, removals, updates)
        return _json(summary)

    # ------------------------------------------------------------ tables

    async def list_tables(self, request: web.Request) -> web.Response:
        items, token = _page(
            request, await self._run(self.store.list_tables, self._namespace(request))
        )
        return _json(
            {"identifiers": [{"namespace": list(t[:-1]), "name": t[-1]} for t in items], **token}
        )

    async def create_table(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        body = await read_body(request, CreateTableRequest)
        ident = (*namespace, check_name(body.name))
        check_properties(body.properties)
        async with self.locks.hold([ident]):
            table = await self._run(self.store.create_table, ident, body)
        headers = {"ETag": etag} if (etag := _etag(table.metadata_location, "all")) else None
        return _json(_table_result(table, config=self.table_config), headers=headers)

    async def register_table(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        body = await read_body(request, RegisterTableRequest)
        ident = (*namespace, check_name(body.name))
        async with self.locks.hold([ident]):
            table = await self._run(
                self.store.register_table, ident, body.metadata_location, body.overwrite
            )
        return _json(_table_result(table, config=self.table_config))

    async def load_table(self, request: web.Request) -> web.Response:
        ident = self._table(request)
        snapshots = request.query.get("snapshots", "all")
        if snapshots not in ("all", "refs"):
            raise BadRequest("snapshots must be 'all' or 'refs'")
        table = await self._run(self.store.load_table, ident)
        etag = _etag(table.metadata_location, snapshots)
        if etag and request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        return _json(
            _table_result(table, snapshots, self.table_config),
            headers={"ETag": etag} if etag else None,
        )

    async def table_exists(self, request: web.Request) -> web.Response:
        location = await self._run(self.store.current_location, self._table(request))
        return web.Response(status=204) if location is not None else head_error(404)

    async def drop_table(self, request: web.Request) -> web.Response:
        ident = self._table(request)
        purge = _flag(request, "purgeRequested")
        async with self.locks.hold([ident]):
            await self._run(self.store.drop_table, ident, purge)
        return web.Response(status=204)

    async def unregister_table(self, request: web.Request) -> web.Response:
        ident = self._table(request)
        async with self.locks.hold([ident]):
            table = await self._run(self.store.load_table, ident)
            await self._run(self.store.drop_table, ident, False)
        return _json(
            {
                "metadata-location": table.metadata_location,
                "metadata": _metadata_json(table.metadata),
            }
        )

    async def load_credentials(self, request: web.Request) -> web.Response:
        await self._require_table(self._table(request))
        return _json(
            {"storage-credentials": []}
        )  # the warehouse needs none beyond the client's own

    async def report_metrics(self, request: web.Request) -> web.Response:
        """Accepted and logged at debug level. Not checked against the table: Java
        clients report a create transaction's commit before committing it."""
        ident = self._table(request)
        report = await read_body(request, MetricsReport)
        log.debug("catalog metrics for %s: %s", ".".join(ident), report.report_type)
        return web.Response(status=204)

    async def rename_table(self, request: web.Request) -> web.Response:
        body = await read_body(request, RenameTableRequest)
        source, destination = body.source.identifier, body.destination.identifier
        async with self.locks.hold([source, destination]):
            await self._run(self.store.rename_table, source, destination)
        return web.Response(status=204)

    # ------------------------------------------------------------ commits

    async def commit_table(self, request: web.Request) -> web.Response:
        ident = self._table(request)
        body = await read_body(request, CommitTableRequest)
        change = commits.TableChange(ident, tuple(body.requirements), tuple(body.updates))
        async with self.locks.hold([ident]):
            (result,) = await self._run(commits.commit, self.store, [change])
        etag = _etag(result.metadata_location, "all")
        return _json(
            _table_result(result, config=self.table_config),
            headers={"ETag": etag} if etag else None,
        )

    async def commit_transaction(self, request: web.Request) -> web.Response:
        body = await read_body(request, CommitTransactionRequest)
        changes = []
        for item in body.table_changes:
            if item.identifier is None:
                raise BadRequest("every table change of a transaction needs an identifier")
            changes.append(
                commits.TableChange(
                    item.identifier.identifier, tuple(item.requirements), tuple(item.updates)
                )
            )
        idents = [c.identifier for c in changes]
        if len(set(idents)) != len(idents):
            raise BadRequest("a transaction may change each table once")
        async with self.locks.hold(idents):
            await self._run(commits.commit, self.store, changes)
        return web.Response(status=204)

    # ------------------------------------------------------------ views

    async def list_views(self, request: web.Request) -> web.Response:
        views = await self._run(view_store.list_views, self.store, self._namespace(request))
        items, token = _page(request, views)
        return _json(
            {"identifiers": [{"namespace": list(v[:-1]), "name": v[-1]} for v in items], **token}
        )

    async def create_view(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        body = await read_body(request, CreateViewRequest)
        ident = (*namespace, check_name(body.name, "view name"))
        check_properties(body.properties)
        async with self.locks.hold([ident]):
            view = await self._run(view_store.create, self.store, ident, body)
        return _json(_view_result(view))

    async def register_view(self, request: web.Request) -> web.Response:
        namespace = self._namespace(request)
        body = await read_body(request, RegisterViewRequest)
        ident = (*namespace, check_name(body.name, "view name"))
        async with self.locks.hold([ident]):
            view = await self._run(view_store.register, self.store, ident, body.metadata_location)
        return _json(_view_result(view))

    async def load_view(self, request: web.Request) -> web.Response:
        return _json(
            _view_result(await self._run(view_store.load, self.store, self._view(request)))
        )

    async def view_exists(self, request: web.Request) -> web.Response:
        location = await self._run(view_store.current_location, self.store, self._view(request))
        return web.Response(status=204) if location is not None else head_error(404)

    async def replace_view(self, request: web.Request) -> web.Response:
        ident = self._view(request)
        body = await read_body(request, CommitViewRequest)
        async with self.locks.hold([ident]):
            view = await self._run(
                view_store.commit, self.store, ident, body.requirements, body.updates
            )
        return _json(_view_result(view))

    async def drop_view(self, request: web.Request) -> web.Response:
        ident = self._view(request)
        async with self.locks.hold([ident]):
            await self._run(view_store.drop, self.store, ident)
        return web.Response(status=204)

    async def rename_view(self, request: web.Request) -> web.Response:
        body = await read_body(request, RenameTableRequest)
        source, destination = body.source.identifier, body.destination.identifier
        async with self.locks.hold([source, destination]):
            await self._run(view_store.rename, self.store, source, destination)
        return web.Response(status=204)

    # ------------------------------------------------------------ not supported

    async def unsupported(self, request: web.Request) -> web.Response:
        raise Unsupported(f"{request.method} {request.path} is not supported by this catalog")

    async def list_functions(self, request: web.Request) -> web.Response:
        await self._require_namespace(self._namespace(request))
        _page(request, [])
        return _json({"identifiers": [], "next-page-token": None})

    async def no_such_function(self, request: web.Request) -> web.Response:
        raise NotFound(
            f"Function does not exist: {request.match_info['function']}",
            type="NoSuchFunctionException",
        )

    async def no_such_plan(self, request: web.Request) -> web.Response:
        raise NotFound("this catalog plans no scans on the server", type="NoSuchPlanIdException")

    async def no_such_plan_task(self, request: web.Request) -> web.Response:
        raise NotFound("this catalog plans no scans on the server", type="NoSuchPlanTaskException")
