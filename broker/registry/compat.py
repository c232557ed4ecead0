"""Schema compatibility checks for the registry: levels, direction, history.

The format modules (avro, jsonschema and protobuf .compat) only know how to compare
one reader schema with one writer schema. This module maps Confluent's compatibility
levels onto such comparisons:

* BACKWARD — the new schema reads data written with the old one (reader = new);
* FORWARD  — the old schema reads data written with the new one (reader = old);
* FULL     — both;
* the plain levels compare with the latest registered version only, the *_TRANSITIVE
  ones with every registered version (newest first, as Confluent reports them);
* NONE     — no check, but the new schema must still parse.

It is pure (no I/O), so the REST layer decides what "existing" means (e.g. excluding
soft-deleted versions) and how to wrap the messages in its 409 / verbose responses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.registry.avro.compat import check_avro_schemas
from broker.registry.avro.schema import parse_avro
from broker.registry.compat_common import Incompatibility
from broker.registry.errors import InvalidSchemaError
from broker.registry.jsonschema.compat import check_json_docs
from broker.registry.jsonschema.document import load_json_schema
from broker.registry.protobuf.compat import check_protobuf_files, parse_proto

__all__ = ["LEVELS", "SCHEMA_TYPES", "InvalidSchemaError", "check_compatibility", "parse_schema"]

LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")


@dataclass(frozen=True)
class _Format:
    parse: Callable[[str, Mapping[str, str] | None], Any]
    check: Callable[[Any, Any], list[Incompatibility]]  # (reader, writer)


_FORMATS: dict[str, _Format] = {
    "AVRO": _Format(parse_avro, check_avro_schemas),
    "JSON": _Format(load_json_schema, check_json_docs),
    "PROTOBUF": _Format(parse_proto, check_protobuf_files),
}


def parse_schema(schema_type: str, schema: str, references: Mapping[str, str] | None = None) -> Any:
    """Validate a schema of the given type; returns the parsed form, raises InvalidSchemaError.

    Lets the REST layer validate on registration with exactly the parser the checks use.
    """
    return _format(schema_type).parse(schema, references)


def _format(schema_type: str) -> _Format:
    fmt = _FORMATS.get((schema_type or "AVRO").upper())
    if fmt is None:
        raise InvalidSchemaError(
            f"Unknown schema type {schema_type!r}: expected one of {', '.join(SCHEMA_TYPES)}"
        )
    return fmt


def check_compatibility(
    schema_type: str,
    new_schema: str,
    existing: list[str],
    level: str,
    references: dict[str, str] | None = None,
) -> list[str]:
    """Messages describing every incompatibility of `new_schema` against the registered
    versions `existing` (oldest first) under `level`; empty list = compatible.

    schema_type is "AVRO", "JSON" or "PROTOBUF". Non-transitive levels compare with the
    latest existing version only; transitive ones with all. BACKWARD: new schema (reader)
    can read data written with the old one (writer). FORWARD: old reader reads new writer
    data. FULL: both. `references` maps referenced names (Avro named types / JSON $ref /
    proto imports) to their schema text, for schemas that use references.

    Each message reads "<ERROR_TYPE> at <path>: <description> [<DIRECTION>, existing
    schema #<n>]", where n is the 1-based position of the old schema in `existing`.
    Raises InvalidSchemaError if a schema does not parse, ValueError for an unknown level.
    """
    normalized = (level or "").upper()
    if normalized not in LEVELS:
        raise ValueError(
            f"Unknown compatibility level {level!r}: expected one of {', '.join(LEVELS)}"
        )
    fmt = _format(schema_type)
    new = fmt.parse(new_schema, references)
    if normalized == "NONE" or not existing:
        return []
    positions = (
        range(len(existing), 0, -1) if normalized.endswith("_TRANSITIVE") else [len(existing)]
    )
    directions = [d for d in ("BACKWARD", "FORWARD") if normalized.startswith((d, "FULL"))]
    messages: list[str] = []
    for position in positions:
        try:
            old = fmt.parse(existing[position - 1], references)
        except InvalidSchemaError as exc:
            raise InvalidSchemaError(f"existing schema #{position} does not parse: {exc}") from None
        for direction in directions:
            suffix = f" [{direction}, existing schema #{position}]"
            if direction == "BACKWARD":
                found = fmt.check(new, old)
                messages += [i.render("the new schema", "the old schema") + suffix for i in found]
            else:
                found = fmt.check(old, new)
                messages += [i.render("the old schema", "the new schema") + suffix for i in found]
    # A named type used twice is checked once (memoised) but may be reported per use.
    return list(dict.fromkeys(messages))
