"""Request parsing and response building on top of kio's generated types.

Handlers are written once for every version of an API: they read request
fields with ``field()`` (absent in old versions → default) and build responses
with ``build()``, which drops keyword arguments the version does not have and
turns plain ints into kio's error codes and timedeltas.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import types
import typing
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from broker.kafka import legacy_schemas

_FIXED_HEADER = struct.Struct(">hhi")


class UnsupportedRequest(Exception):
    """An API key or version the broker does not serve."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int, message: str) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


def peek_header(frame: bytes | bytearray) -> tuple[int, int, int]:
    """api key, api version, correlation id."""
    if len(frame) < _FIXED_HEADER.size:
        raise ValueError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _FIXED_HEADER.unpack_from(frame, 0)
    return api_key, api_version, correlation_id


def known_versions(api_key: int) -> tuple[int, int] | None:
    name = api_key_map.get(api_key)
    if name is None:
        return None
    versions = sorted(
        v for v, types in schema_name_map[name].items() if EntityType.request in types
    )
    return (versions[0], versions[-1]) if versions else None


@cache
def _request_reader(api_key: int, api_version: int) -> tuple[Any, Any]:
    legacy = legacy_schemas.SCHEMAS.get((api_key, api_version))
    schema = legacy[0] if legacy else load_request_schema(api_key, api_version)
    header_schema = schema.__header_schema__
    return entity_reader(header_schema), entity_reader(schema)


def parse_request(frame: bytes | bytearray) -> tuple[Any, Any]:
    """(header, request) or ValueError for bytes that do not parse."""
    api_key, api_version, _ = peek_header(frame)
    header_reader, body_reader = _request_reader(api_key, api_version)
    if isinstance(
        frame, bytearray
    ):  # kio's reader wants a read-only buffer; this view copies nothing
        frame = memoryview(frame).toreadonly()  # type: ignore[assignment]
    header, header_size = header_reader(frame, 0)
    # Like Kafka's own parser, trailing bytes are ignored: librdkafka sends an
    # extra field in Metadata v12 that the real broker tolerates.
    request, _ = body_reader(frame, header_size)
    check_nulls(request)
    return header, request


@cache
def _null_rules(cls: Any) -> tuple[tuple[str, bool, bool, type[Any] | None], ...]:
    """(name, nullable, is a tuple, nested entity) of the fields ``check_nulls`` looks at."""
    rules = []
    for f in dataclasses.fields(cls):
        annotation: Any = f.type
        nullable = typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(
            None
        ) in typing.get_args(annotation)
        many, entity = _entity_type(f)
        if nullable and entity is None:
            continue  # nothing to check
        rules.append((f.name, nullable, many, entity))
    return tuple(rules)


def check_nulls(entity: Any, path: str = "") -> None:
    """ValueError if a field the schema does not let be null is null.

    kio reads a length of -1 as null even for arrays that may not be null;
    Kafka's parser refuses such a request, and handlers rely on it.
    """
    for name, nullable, many, nested in _null_rules(entity.__class__):
        value = getattr(entity, name)
        if value is None:
            if not nullable:
                raise ValueError(f"{path}{name} is null, which its schema does not allow")
            continue
        if nested is not None:
            for item in value if many else (value,):
                check_nulls(item, f"{path}{name}.")


@cache
def response_schema(api_key: int, api_version: int) -> type[Any]:
    legacy = legacy_schemas.SCHEMAS.get((api_key, api_version))
    return legacy[1] if legacy else load_response_schema(api_key, api_version)


@cache
def _response_writers(schema: Any) -> tuple[Any, Any, Any]:
    header_schema = schema.__header_schema__
    return header_schema, entity_writer(header_schema), entity_writer(schema)


Buffer = bytes | bytearray | memoryview


class Spliced:
    """A bytes field given as several buffers (a Fetch partition's records: slices of cached
    segment blocks and tail batches), written into the response frame by reference: the
    records of a fetch are never joined nor copied into the encoded response."""

    __slots__ = ("nbytes", "pieces")

    def __init__(self, pieces: list[Buffer]) -> None:
        self.pieces = pieces
        self.nbytes = sum(len(p) for p in pieces)  # memoryviews of bytes: len is the byte count

    def __len__(self) -> int:
        return self.nbytes

    def __bytes__(self) -> bytes:
        return b"".join(self.pieces)


class _Gather:
    """What kio writes a response into: small writes go into a bytearray, ``Spliced`` values
    are kept as their buffers. ``parts`` is the frame, in order."""

    def __init__(self) -> None:
        self.parts: list[Buffer] = []
        self.small = bytearray()

    def write(self, data: Buffer | Spliced) -> int:
        if isinstance(data, Spliced):
            if self.small:
                self.parts.append(self.small)
                self.small = bytearray()
            self.parts.extend(data.pieces)
        else:
            self.small += data
        return len(data)

    def finish(self) -> list[Buffer]:
        if self.small or not self.parts:
            self.parts.append(self.small)
        return self.parts


def encode_response_parts(correlation_id: int, response: Any) -> list[Buffer]:
    """The response frame (size prefix included) as buffers to write one after another,
    ``Spliced`` fields by reference (Fetch; other responses take ``encode_response``, whose
    BytesIO is quicker for small frames)."""
    header_schema, header_writer, body_writer = _response_writers(typing.cast(Any, type(response)))
    out = _Gather()
    out.write(b"\0\0\0\0")
    header_writer(out, header_schema(correlation_id=correlation_id))
    body_writer(out, response)
    parts = out.finish()
    first = parts[0]
    assert isinstance(first, bytearray) and len(first) >= 4  # the size prefix and the header
    struct.pack_into(">i", first, 0, sum(len(p) for p in parts) - 4)
    return parts


def encode_response(correlation_id: int, response: Any) -> bytes:
    """The response frame as one bytes object (no ``Spliced`` fields: see
    ``encode_response_parts``)."""
    header_schema, header_writer, body_writer = _response_writers(typing.cast(Any, type(response)))
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    header_writer(buf, header_schema(correlation_id=correlation_id))
    body_writer(buf, response)
    data = buf.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


def _coerce(field: dataclasses.Field[Any], value: Any) -> Any:
    kafka_type = field.metadata.get("kafka_type")
    if kafka_type == "error_code" and not isinstance(value, ErrorCode):
        return ErrorCode(value)
    if kafka_type in ("timedelta_i32", "timedelta_i64") and not isinstance(
        value, datetime.timedelta
    ):
        return datetime.timedelta(milliseconds=value)
    if isinstance(value, list):
        return tuple(value)
    return value


@cache
def _entity_type(field: dataclasses.Field[Any]) -> tuple[bool, type[Any] | None]:
    """(is a tuple, nested entity class) of a field's annotation."""
    annotation: Any = field.type
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is tuple:
        inner = typing.get_args(annotation)[0]
        return True, typing.cast(type[Any], inner) if dataclasses.is_dataclass(inner) else None
    return False, typing.cast(type[Any], annotation) if dataclasses.is_dataclass(
        annotation
    ) else None


@cache
def _fields(cls: Any) -> tuple[dataclasses.Field[Any], ...]:
    return tuple(dataclasses.fields(cls))


def build(cls: type[Any], data: dict[str, Any]) -> Any:
    """Instantiate a kio entity of any version from nested dicts holding the
    superset of fields: keys the version lacks are dropped."""
    kwargs: dict[str, Any] = {}
    for f in _fields(typing.cast(Any, cls)):
        if f.name not in data:
            continue
        value = data[f.name]
        many, entity = _entity_type(f)
        if entity is not None and value is not None:
            if many:
                value = tuple(build(entity, v) if isinstance(v, dict) else v for v in value)
            elif isinstance(value, dict):
                value = build(entity, value)
        kwargs[f.name] = _coerce(f, value)
    return cls(**kwargs)


_BLANKS: dict[str, Any] = {
    "bool": False,
    "bytes": b"",
    "records": None,
    "string": "",
    "int8": -1,
    "int16": -1,
    "int32": -1,
    "int64": -1,
    "uint16": 0,
    "float64": 0.0,
    "timedelta_i32": 0,
    "timedelta_i64": 0,
    "uuid": None,
}


def error_response(cls: type[Any], code: int, message: str | None) -> Any:
    """The response of a request refused as a whole, as Kafka's ``getErrorResponse`` builds it:
    every top-level ``error_code`` the error, ``error_message`` its message, lists empty,
    numbers -1 and strings empty (a nested entity, when the schema insists on one, likewise)."""
    data: dict[str, Any] = {}
    for f in _fields(typing.cast(Any, cls)):
        kafka_type = f.metadata.get("kafka_type")
        many, entity = _entity_type(f)
        if f.name == "error_code":
            data[f.name] = code
        elif f.name == "error_message":
            data[f.name] = message
        elif f.name in ("throttle_time", "throttle_time_ms"):
            data[f.name] = 0
        elif many:
            data[f.name] = ()
        elif f.default is not dataclasses.MISSING:
            continue
        elif entity is not None:
            nullable = typing.get_origin(f.type) in (typing.Union, types.UnionType)
            data[f.name] = None if nullable else error_response(entity, code, message)
        elif kafka_type == "datetime_i64":
            data[f.name] = datetime.datetime.fromtimestamp(0, datetime.UTC)
        else:
            data[f.name] = _BLANKS.get(kafka_type or "")
    return build(cls, data)


class Responder:
    """Builds the response of the request's API and version from nested dicts."""

    def __init__(self, api_key: int, api_version: int) -> None:
        self.schema = response_schema(api_key, api_version)
        self.api_key = api_key
        self.version = api_version

    def error(self, code: int, message: str | None = None) -> Any:
        """This API's response refusing the whole request with ``code``."""
        return error_response(self.schema, code, message)

    def __call__(self, **data: Any) -> Any:
        data.setdefault("throttle_time", 0)
        return build(self.schema, data)


def field(request: Any, name: str, default: Any = None) -> Any:
    return getattr(request, name, default)


def ms(value: Any) -> int:
    """Milliseconds from a kio timedelta (or an int)."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


__all__ = [
    "Responder",
    "UnsupportedRequest",
    "build",
    "check_nulls",
    "Spliced",
    "encode_response",
    "encode_response_parts",
    "error_response",
    "field",
    "known_versions",
    "ms",
    "parse_request",
    "peek_header",
]
