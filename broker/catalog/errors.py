"""The REST catalog's error model: every failure leaves as
``{"error": {"message", "type", "code"}}``.

Clients pick their exception from the status code and the ``type`` (Java's
ErrorHandlers tell NoSuchNamespaceException from NoSuchTableException on a 404
by the type), so the types are the Java simple names the spec's examples use.
Bad input must never become a 500: request parsing raises ``BadRequest`` and
pyiceberg's own exceptions are mapped here, in one place.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

import pydantic
from aiohttp import web
from pyiceberg import exceptions as ice

log = logging.getLogger(__name__)


class CatalogError(Exception):
    """An error with its HTTP status and Iceberg error type."""

    status = 500
    type = "ServiceFailureException"

    def __init__(self, message: str, status: int | None = None, type: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type


class BadRequest(CatalogError):
    status, type = 400, "BadRequestException"


class Unsupported(CatalogError):
    status, type = 406, "UnsupportedOperationException"


class NotFound(CatalogError):
    status, type = 404, "NotFoundException"


# pyiceberg exception -> (status, type); the first matching class wins.
_MAPPED: list[tuple[type[BaseException], int, str]] = [
    (ice.NoSuchNamespaceError, 404, "NoSuchNamespaceException"),
    (ice.NoSuchTableError, 404, "NoSuchTableException"),
    (ice.NoSuchViewError, 404, "NoSuchViewException"),
    (ice.NamespaceAlreadyExistsError, 409, "AlreadyExistsException"),
    (ice.TableAlreadyExistsError, 409, "AlreadyExistsException"),
    (ice.ViewAlreadyExistsError, 409, "AlreadyExistsException"),
    (ice.NamespaceNotEmptyError, 409, "NamespaceNotEmptyException"),
    (ice.CommitFailedException, 409, "CommitFailedException"),
    (ice.ValidationError, 400, "ValidationException"),
    (ice.ResolveError, 400, "BadRequestException"),
    (pydantic.ValidationError, 400, "BadRequestException"),
    (NotImplementedError, 406, "UnsupportedOperationException"),
    # pyiceberg raises ValueError for updates that do not apply (unknown schema id, ...)
    (ValueError, 400, "BadRequestException"),
]


def as_catalog_error(exc: BaseException) -> CatalogError | None:
    """The catalog error for a known exception, or None for a server fault."""
    if isinstance(exc, CatalogError):
        return exc
    for cls, status, type_ in _MAPPED:
        if isinstance(exc, cls):
            return CatalogError(_message(exc), status, type_)
    return None


def _message(exc: BaseException) -> str:
    if isinstance(exc, pydantic.ValidationError):
        parts = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err["loc"])
            parts.append(f"{where}: {err['msg']}" if where else err["msg"])
        return "invalid request: " + "; ".join(parts)
    # pyiceberg names namespaces as stored, with a "." inside a level as 0x1F (store.py)
    return str(exc).replace("\x1f", ".") or type(exc).__name__


def error_response(
    status: int, type_: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": type_, "code": status}}
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=headers
    )


def head_error(status: int) -> web.Response:
    """An error answer to HEAD: the error model's content type, no body."""
    return web.Response(status=status, content_type="application/json")


# aiohttp's own HTTP errors (no route, wrong method, body too large) in the error model
_HTTP_TYPES = {
    404: "NotFoundException",
    405: "MethodNotAllowedException",
    413: "BadRequestException",
}


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return error_response(
            exc.status,
            _HTTP_TYPES.get(exc.status, "BadRequestException"),
            exc.reason or "error",
            headers,
        )
    except Exception as exc:  # every failure leaves in the error model
        mapped = as_catalog_error(exc)
        if mapped is None:
            log.exception("catalog: %s %s failed", request.method, request.path)
            return error_response(
                500, "ServiceFailureException", f"internal error: {type(exc).__name__}: {exc}"
            )
        if request.method == "HEAD":
            return head_error(mapped.status)
        return error_response(mapped.status, mapped.type, mapped.message)
