"""Parse Avro schema text, with its references, into the `avro` package's schema objects.

Two maintained parsers gate a schema: fastavro.parse_schema (what producers in this
project use, so a schema it rejects is useless to them; it also finds the references a
schema needs, in dependency order) and then the Apache `avro` package's own parser,
whose schema objects its ReaderWriterCompatibilityChecker (broker/registry/avro/compat.py)
walks. The latter rejects what fastavro lets through (duplicate field names, duplicate
or nested union branches).

Two things are added here, each because the `avro` package skips it:

* field default values are checked against their type (the Avro specification's
  "default" table; Confluent's registry rejects such schemas too);
* the aliases of named types are qualified with the type's namespace, as Java's
  ``Schema.getAliases()`` does, so that the checker's name matching (which compares the
  writer's full name with the reader's aliases) behaves as Confluent's.

Logical types are ignored by the checker (it compares the underlying types), as in
Avro's Java SchemaCompatibility which Confluent uses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import avro.errors
import avro.name
import avro.schema
import fastavro

from broker.registry.errors import InvalidSchemaError

_NAMED = (avro.schema.RecordSchema, avro.schema.EnumSchema, avro.schema.FixedSchema)


def parse_avro(text: str, references: Mapping[str, str] | None = None) -> avro.schema.Schema:
    """Validate `text` (and the referenced schemas it uses) and return the parsed schema.

    `references` maps a named type's full name to the schema text defining it, the way
    Confluent schema references work for Avro. Raises InvalidSchemaError.
    """
    refs = dict(references or {})
    obj = _load_json(text, "Avro schema")
    order = _fastavro_check(obj, refs)
    names = avro.name.Names()
    try:
        for key in order:
            avro.schema.make_avsc_object(json.loads(refs[key]), names)
        schema = avro.schema.make_avsc_object(obj, names)
    except (avro.errors.AvroException, TypeError, ValueError, KeyError) as exc:
        raise InvalidSchemaError(f"Invalid Avro schema: {exc}") from None
    _Walk().visit(schema, "")
    return schema


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidSchemaError(f"Invalid {what}: not valid JSON: {exc}") from None


def _reference_for(name: str, refs: Mapping[str, str]) -> str | None:
    """The reference key defining the named type `name`.

    Confluent parses every referenced schema into the same name table before the schema,
    so a reference is found by the full names its schema defines whatever its ``name``
    field says (``country.avsc`` for a record ``geo.Country``). The reference's own name
    is tried first, then the defined full names, then a type defined in no namespace
    with the same simple name (Java's name lookup falls back to the null namespace).
    """
    if name in refs:
        return name
    defined = {key: defined_names(refs[key]) for key in refs}
    for key, names in defined.items():
        if name in names:
            return key
    short = name.rsplit(".", 1)[-1]
    for key, names in defined.items():
        if key.rsplit(".", 1)[-1] == short or short in names:
            return key
    return None


def defined_names(text: str) -> set[str]:
    """The full names of the named types (record, enum, fixed) a schema text defines."""
    try:
        obj = json.loads(text)
    except (TypeError, ValueError):
        return set()
    out: set[str] = set()
    _collect_names(obj, "", out, 0)
    return out


def _collect_names(obj: Any, namespace: str, out: set[str], depth: int) -> None:
    if depth > 256:
        return
    if isinstance(obj, list):
        for item in obj:
            _collect_names(item, namespace, out, depth + 1)
        return
    if not isinstance(obj, dict):
        return
    kind, name = obj.get("type"), obj.get("name")
    if kind in ("record", "error", "enum", "fixed") and isinstance(name, str):
        ns = obj.get("namespace")
        if "." in name:
            full = name
        elif isinstance(ns, str) and ns:
            full = f"{ns}.{name}"
        else:
            full = f"{namespace}.{name}" if namespace else name
        out.add(full)
        namespace = full.rpartition(".")[0]
    for fld in obj.get("fields", []) if isinstance(obj.get("fields"), list) else []:
        if isinstance(fld, dict):
            _collect_names(fld.get("type"), namespace, out, depth + 1)
    for key in ("items", "values"):
        if key in obj:
            _collect_names(obj[key], namespace, out, depth + 1)
    if isinstance(kind, (dict, list)):
        _collect_names(kind, namespace, out, depth + 1)


def _fastavro_check(obj: Any, refs: Mapping[str, str]) -> list[str]:
    """Run fastavro.parse_schema, loading referenced schemas on demand; returns the keys
    of the references used, in dependency order (each after those it needs)."""
    named: dict[str, Any] = {}  # named types of the references parsed so far
    loaded: set[str] = set()
    order: list[str] = []

    def parse(schema: Any, label: str, key: str | None) -> None:
        while True:
            # A failed attempt may leave half-registered names behind: work on a copy.
            trial = dict(named)
            try:
                fastavro.parse_schema(schema, named_schemas=trial)
            except fastavro.schema.UnknownType as exc:
                found = _reference_for(str(exc.name), refs)
                if found is None or found in loaded:
                    raise InvalidSchemaError(
                        f"Invalid {label}: unknown type '{exc.name}' (not defined in the schema "
                        "and not given as a reference)"
                    ) from None
                loaded.add(found)
                what = f"referenced Avro schema '{found}'"
                parse(_load_json(refs[found], what), what, found)
            except InvalidSchemaError:
                raise
            except Exception as exc:  # noqa: BLE001 (fastavro raises SchemaParseException, KeyError...)
                detail = f"missing attribute {exc}" if isinstance(exc, KeyError) else str(exc)
                raise InvalidSchemaError(f"Invalid {label}: {detail}") from None
            else:
                named.update(trial)
                if key is not None:
                    order.append(key)
                return

    parse(obj, "Avro schema", None)
    return order


class _Walk:
    """Visits every schema node once: checks defaults, qualifies named types' aliases."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def visit(self, schema: avro.schema.Schema, path: str) -> None:
        if isinstance(schema, _NAMED):
            if id(schema) in self.seen:
                return
            self.seen.add(id(schema))
            _qualify_aliases(schema)
        if isinstance(schema, avro.schema.RecordSchema):
            for pos, fld in enumerate(schema.fields):
                fpath = f"{path}/fields/{pos}"
                self.visit(fld.type, f"{fpath}/type")
                if fld.has_default and not default_matches(fld.type, fld.default):
                    raise InvalidSchemaError(
                        f"Invalid Avro schema: default value {json.dumps(fld.default)} of field "
                        f"'{fld.name}' at {fpath} does not match its type {describe(fld.type)}"
                    )
        elif isinstance(schema, avro.schema.ArraySchema):
            self.visit(schema.items, f"{path}/items")
        elif isinstance(schema, avro.schema.MapSchema):
            self.visit(schema.values, f"{path}/values")
        elif isinstance(schema, avro.schema.UnionSchema):
            for index, branch in enumerate(schema.schemas):
                self.visit(branch, f"{path}/{index}")


def _qualify_aliases(schema: avro.schema.NamedSchema) -> None:
    aliases = schema.props.get("aliases")
    if not isinstance(aliases, list):
        return
    namespace = schema.fullname.rpartition(".")[0]
    schema.props["aliases"] = [
        a if not isinstance(a, str) or "." in a or not namespace else f"{namespace}.{a}"
        for a in aliases
    ]


def describe(schema: avro.schema.Schema) -> str:
    """Short human label for messages: the name of a named type, else the kind."""
    if isinstance(schema, avro.schema.UnionSchema):
        return "[" + ", ".join(describe(b) for b in schema.schemas) + "]"
    if isinstance(schema, _NAMED):
        return str(schema.fullname)
    return str(schema.type)


def default_matches(schema: avro.schema.Schema, value: Any, _depth: int = 0) -> bool:
    """Whether a JSON default value is valid for `schema` (Avro spec, "default" table).

    For unions any branch may match: the Avro 1.12 specification (AVRO-3649) relaxed the
    older "first branch only" rule, and fastavro accepts both.
    """
    if _depth > 64:
        return True  # absurdly deep default on a recursive type: do not recurse forever
    kind = schema.type
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("int", "long"):
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in ("float", "double"):
        return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value in (
            "NaN",
            "Infinity",
            "-Infinity",
        )
    if kind in ("bytes", "string"):
        return isinstance(value, str)
    if isinstance(schema, avro.schema.FixedSchema):
        return isinstance(value, str) and len(value) == schema.size
    if isinstance(schema, avro.schema.EnumSchema):
        return value in schema.symbols
    if isinstance(schema, avro.schema.ArraySchema):
        return isinstance(value, list) and all(
            default_matches(schema.items, v, _depth + 1) for v in value
        )
    if isinstance(schema, avro.schema.MapSchema):
        return isinstance(value, dict) and all(
            default_matches(schema.values, v, _depth + 1) for v in value.values()
        )
    if isinstance(schema, avro.schema.RecordSchema):
        return isinstance(value, dict) and all(
            default_matches(f.type, value[f.name], _depth + 1) if f.name in value else f.has_default
            for f in schema.fields
        )
    if isinstance(schema, avro.schema.UnionSchema):
        return any(default_matches(b, value, _depth + 1) for b in schema.schemas)
    return False
