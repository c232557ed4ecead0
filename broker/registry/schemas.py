"""Schema validation and canonical forms for the three schema types.

- AVRO: JSON, checked by fastavro.parse_schema (and by the stricter checker in
  avro_schema when present). Stored as compact JSON, with ``{"type": "int"}``
  wrappers collapsed to ``"int"`` the way Avro's ``Schema.toString()`` does.
- JSON: a JSON Schema document, checked against its meta-schema by jsonschema.
  Stored as compact JSON.
- PROTOBUF: ``.proto`` text, or the base64 ``FileDescriptorProto`` that
  confluent-kafka's ProtobufSerializer sends; checked by compat_protobuf and
  stored as canonical ``.proto`` text (see proto_text).

Two schemas are "the same schema" (same id) when type, fingerprint (the canonical
text with JSON object keys sorted) and references are equal.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import fastavro

from broker.registry.errors import InvalidSchemaError

SCHEMA_TYPES = ("JSON", "PROTOBUF", "AVRO")  # the order Confluent lists them in
AVRO_PRIMITIVES = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
)


@dataclass(frozen=True)
class Reference:
    """A schema reference as the API and the ``_schemas`` records spell it."""

    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


def references_from_json(value: Any) -> list[Reference]:
    """Parse a ``references`` array; raises ValueError when it is malformed."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError("references must be an array")  # noqa: TRY004
    out: list[Reference] = []
    for item in value:
        if not isinstance(item, dict):
            raise ValueError("each reference must be an object with name, subject and version")  # noqa: TRY004
        name, subject, version = item.get("name"), item.get("subject"), item.get("version")
        if not isinstance(name, str) or not isinstance(subject, str) or not name or not subject:
            raise ValueError("a reference needs a non-empty name and subject")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError("a reference version must be an integer")  # noqa: TRY004
        out.append(Reference(name, subject, version))
    return out


@dataclass
class ResolvedReference:
    """A reference with the referenced schema's text (and its own references)."""

    name: str
    subject: str
    version: int
    schema_type: str
    schema: str
    references: list[ResolvedReference] = field(default_factory=list)


def flatten_references(refs: list[ResolvedReference]) -> dict[str, str]:
    """name -> schema text for every reference, transitive ones first (the form
    the compatibility checkers take)."""
    out: dict[str, str] = {}

    def visit(items: list[ResolvedReference]) -> None:
        for ref in items:
            visit(ref.references)
            out.setdefault(ref.name, ref.schema)

    visit(refs)
    return out


@dataclass
class ParsedSchema:
    schema_type: str
    canonical: str  # the text stored and served
    parsed: Any  # fastavro's parsed schema (AVRO), the document (JSON), the proto model (PROTOBUF)


def normalize_type(schema_type: Any) -> str:
    """The schema type of a request: missing means AVRO; unknown is an invalid schema."""
    if schema_type is None:
        return "AVRO"
    if not isinstance(schema_type, str) or schema_type.upper() not in SCHEMA_TYPES:
        raise InvalidSchemaError(f"Invalid schema type {schema_type!r}: use AVRO, JSON or PROTOBUF")
    return schema_type.upper()


def parse_schema(
    schema_type: str, text: str, refs: list[ResolvedReference], normalize: bool = False
) -> ParsedSchema:
    """Validate ``text`` as a schema of ``schema_type``; raises InvalidSchemaError.
    ``normalize`` puts a Protobuf schema in Confluent's normalized order (Avro and JSON
    texts already compare with their keys sorted)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidSchemaError("Empty schema")
    if schema_type == "AVRO":
        return _parse_avro(text, refs)
    if schema_type == "JSON":
        return _parse_json_schema(text)
    if schema_type == "PROTOBUF":
        return _parse_protobuf(text, refs, normalize)
    raise InvalidSchemaError(f"Invalid schema type {schema_type!r}")


def fingerprint(schema_type: str, canonical: str, references: list[Reference]) -> str:
    """The identity of a schema for id reuse: equal fingerprints, same id."""
    body = canonical
    if schema_type in ("AVRO", "JSON"):
        with contextlib.suppress(ValueError):
            body = json.dumps(
                json.loads(canonical), sort_keys=True, separators=(",", ":"), ensure_ascii=False
            )
    refs = json.dumps([r.to_json() for r in references], sort_keys=True, separators=(",", ":"))
    return f"{schema_type}\x00{body}\x00{refs}"


def _strict_check(schema_type: str, text: str, refs: list[ResolvedReference]) -> None:
    """The compatibility checker's own parser, so that every schema accepted can
    later be compared (duplicate Avro fields, defaults of the wrong type, ...)."""
    from broker.registry import compat

    try:
        compat.parse_schema(schema_type, text, flatten_references(refs) or None)
    except InvalidSchemaError:
        raise
    except RecursionError:
        raise InvalidSchemaError("Invalid schema: nested too deeply") from None
    except Exception as exc:  # a checker gap must still be a 42201, never a 500  # noqa: BLE001
        raise InvalidSchemaError(f"Invalid schema: {exc}") from None


# ------------------------------------------------------------------ AVRO


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _collapse_avro(obj: Any) -> Any:
    """``{"type": "int"}`` -> ``"int"`` everywhere a type may appear, recursively."""
    if isinstance(obj, list):
        return [_collapse_avro(x) for x in obj]
    if not isinstance(obj, dict):
        return obj
    if set(obj) == {"type"} and isinstance(obj["type"], str) and obj["type"] in AVRO_PRIMITIVES:
        return obj["type"]
    out = dict(obj)
    kind = out.get("type")
    if kind in ("record", "error") and isinstance(out.get("fields"), list):
        out["fields"] = [
            {**f, "type": _collapse_avro(f["type"])} if isinstance(f, dict) and "type" in f else f
            for f in out["fields"]
        ]
    elif kind == "array" and "items" in out:
        out["items"] = _collapse_avro(out["items"])
    elif kind == "map" and "values" in out:
        out["values"] = _collapse_avro(out["values"])
    elif isinstance(kind, (dict, list)):
        out["type"] = _collapse_avro(kind)
    return out


def _avro_named_schemas(refs: list[ResolvedReference]) -> dict[str, Any]:
    """fastavro's named-type table with every referenced Avro schema loaded,
    dependencies first."""
    named: dict[str, Any] = {}
    seen: set[tuple[str, int]] = set()

    def load(items: list[ResolvedReference]) -> None:
        for ref in items:
            if (ref.subject, ref.version) in seen:
                continue
            seen.add((ref.subject, ref.version))
            load(ref.references)
            if ref.schema_type != "AVRO":
                raise InvalidSchemaError(
                    f"Invalid schema: reference '{ref.name}' is a {ref.schema_type} schema"
                )
            try:
                fastavro.parse_schema(json.loads(ref.schema), named_schemas=named)
            except Exception as exc:  # noqa: BLE001
                raise InvalidSchemaError(
                    f"Invalid schema: referenced schema '{ref.name}' does not parse: {exc}"
                ) from None

    load(refs)
    return named


def parse_avro_with_refs(text: str, refs: list[ResolvedReference]) -> Any:
    """fastavro's parsed form of ``text`` (referenced named types resolved)."""
    named = _avro_named_schemas(refs)
    return fastavro.parse_schema(json.loads(text), named_schemas=named)


def _parse_avro(text: str, refs: list[ResolvedReference]) -> ParsedSchema:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise InvalidSchemaError(f"Invalid schema: not valid JSON: {exc}") from None
    if not isinstance(obj, (dict, list, str)):
        raise InvalidSchemaError("Invalid schema: an Avro schema is a JSON object, array or string")
    _strict_check("AVRO", text, refs)
    try:
        parsed = fastavro.parse_schema(obj, named_schemas=_avro_named_schemas(refs))
    except InvalidSchemaError:
        raise
    except fastavro.schema.UnknownType as exc:
        raise InvalidSchemaError(f"Invalid schema: unknown type '{exc.name}'") from None
    except Exception as exc:  # noqa: BLE001 - fastavro raises SchemaParseException, KeyError, TypeError, ValueError...
        detail = f"missing attribute {exc}" if isinstance(exc, KeyError) else str(exc)
        raise InvalidSchemaError(f"Invalid schema: {detail}") from None
    if (
        isinstance(obj, dict)
        and obj.get("type") in ("record", "error")
        and not isinstance(obj.get("fields"), list)
    ):
        raise InvalidSchemaError("Invalid schema: a record needs a 'fields' array")
    return ParsedSchema("AVRO", _compact(_collapse_avro(obj)), parsed)


# ------------------------------------------------------------------ JSON Schema


def _parse_json_schema(text: str) -> ParsedSchema:
    import jsonschema
    import jsonschema.exceptions
    import jsonschema.validators

    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise InvalidSchemaError(f"Invalid schema: not valid JSON: {exc}") from None
    if not isinstance(obj, (dict, bool)):
        raise InvalidSchemaError("Invalid schema: a JSON Schema is an object or a boolean")
    try:
        cls = jsonschema.validators.validator_for(obj, default=jsonschema.Draft7Validator)
        cls.check_schema(obj)
    except jsonschema.exceptions.SchemaError as exc:
        path = "/".join(str(p) for p in exc.absolute_path)
        raise InvalidSchemaError(f"Invalid JSON schema at '#/{path}': {exc.message}") from None
    except Exception as exc:  # an unknown $schema URI and the like  # noqa: BLE001
        raise InvalidSchemaError(f"Invalid JSON schema: {exc}") from None
    _strict_check("JSON", text, [])
    return ParsedSchema("JSON", _compact(obj), obj)


# ------------------------------------------------------------------ PROTOBUF


def _parse_protobuf(text: str, refs: list[ResolvedReference], normalize: bool) -> ParsedSchema:
    from broker.registry.protobuf import text as proto_text

    deps = {name: proto_text.as_text(schema) for name, schema in flatten_references(refs).items()}
    source, model = proto_text.canonical(text, deps, normalize)
    return ParsedSchema("PROTOBUF", source, model)
