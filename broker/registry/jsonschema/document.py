"""Load JSON Schema documents and classify their subschemas for the compatibility diff.

The diff in compat_json.py reasons about *kinds* of schemas the way Confluent's does (it
is built on everit's object model: StringSchema, NumberSchema, ObjectSchema, ...), so this
module turns a raw subschema into a `View`: its kind plus, for combined schemas, the
subschemas. A "type" list becomes an anyOf of single-typed copies, exactly as everit
does, which is what makes ["string"] -> ["string", "null"] a compatible extension.

`$ref` is resolved against the document itself (JSON pointers), against `$id`-based
URLs and against the schema references the registry passes in (name -> schema text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urljoin

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from broker.registry.errors import InvalidSchemaError

ANNOTATION_KEYS = frozenset(
    {
        "$schema",
        "$id",
        "id",
        "title",
        "description",
        "default",
        "examples",
        "definitions",
        "$defs",
        "$comment",
        "readOnly",
        "writeOnly",
        "deprecated",
        "$anchor",
        "format",
    }
)
COMBINATORS = ("allOf", "anyOf", "oneOf")
_KIND_KEYWORDS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "object",
        frozenset(
            {
                "properties",
                "required",
                "additionalProperties",
                "patternProperties",
                "minProperties",
                "maxProperties",
                "dependencies",
                "dependentRequired",
                "dependentSchemas",
                "propertyNames",
            }
        ),
    ),
    (
        "array",
        frozenset(
            {
                "items",
                "prefixItems",
                "additionalItems",
                "minItems",
                "maxItems",
                "uniqueItems",
                "contains",
            }
        ),
    ),
    ("string", frozenset({"minLength", "maxLength", "pattern"})),
    (
        "number",
        frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
    ),
)
# Keys whose values are data, not subschemas: never walked looking for $ref.
_DATA_KEYS = frozenset({"enum", "const", "default", "examples", "required"})


@dataclass
class JsonDoc:
    """A parsed document plus everything needed to resolve the refs inside it."""

    root: Any
    base: str
    others: dict[str, JsonDoc] = field(default_factory=dict)  # shared by all docs of a schema


@dataclass
class View:
    """A subschema classified by kind: empty, false, combined, enum, not, or a JSON type.

    The JSON types are object, array, string, number (with `integer` set for "integer"),
    boolean and null. `schema` is the dict the kind-specific keywords are read from.
    """

    kind: str
    schema: dict[str, Any]
    doc: JsonDoc
    criterion: str = ""
    subschemas: list[Any] = field(default_factory=list)
    integer: bool = False
    value: Any = None  # the subschema itself (True/False/dict), for recursing through compare


def load_json_schema(text: str, references: Mapping[str, str] | None = None) -> JsonDoc:
    """Parse and validate a JSON Schema and its references; raises InvalidSchemaError."""
    others: dict[str, JsonDoc] = {}
    for name, ref_text in (references or {}).items():
        others[name] = _load_one(ref_text, f"referenced JSON schema '{name}'", name, others)
    doc = _load_one(text, "JSON schema", "", others)
    _check_refs(doc, doc.root, "#")
    return doc


def _load_one(text: str, what: str, name: str, others: dict[str, JsonDoc]) -> JsonDoc:
    try:
        root = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidSchemaError(f"Invalid {what}: not valid JSON: {exc}") from None
    if not isinstance(root, (dict, bool)):
        raise InvalidSchemaError(f"Invalid {what}: a schema must be a JSON object or boolean")
    try:
        jsonschema.validators.validator_for(root).check_schema(root)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise InvalidSchemaError(f"Invalid {what} at #/{where}: {exc.message}") from None
    base = root.get("$id") or root.get("id") or name if isinstance(root, dict) else name
    return JsonDoc(root, base if isinstance(base, str) else name, others)


def _check_refs(doc: JsonDoc, value: Any, path: str, depth: int = 0) -> None:
    """Resolve every $ref once up front, so a dangling one is an invalid schema."""
    if depth > 200:
        return
    if isinstance(value, dict):
        ref = value.get("$ref")
        if isinstance(ref, str):
            resolve_ref(doc, ref, path)
        for key, sub in value.items():
            if key not in _DATA_KEYS:
                _check_refs(doc, sub, f"{path}/{key}", depth + 1)
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            _check_refs(doc, sub, f"{path}/{index}", depth + 1)


def resolve_ref(doc: JsonDoc, ref: str, path: str = "") -> tuple[Any, JsonDoc]:
    """The subschema `ref` points at and the document it lives in."""
    target, _, pointer = ref.partition("#")
    if target:
        found = _find_doc(doc, target)
        if found is None:
            raise InvalidSchemaError(
                f"Invalid JSON schema at {path}: $ref '{ref}' names a schema that is neither "
                "this document nor one of its references"
            )
        doc = found
    value = doc.root
    for token in (t for t in pointer.split("/") if t) if pointer.startswith("/") else ():
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            raise InvalidSchemaError(
                f"Invalid JSON schema at {path}: $ref '{ref}' does not resolve"
            )
    if pointer and not pointer.startswith("/"):
        value = _find_anchor(doc.root, pointer)
        if value is None:
            raise InvalidSchemaError(
                f"Invalid JSON schema at {path}: $ref '{ref}' does not resolve"
            )
    return value, doc


def _find_doc(doc: JsonDoc, target: str) -> JsonDoc | None:
    absolute = urljoin(doc.base, target) if doc.base else target
    if target in (doc.base, absolute) and doc.base:
        return doc
    for name, other in doc.others.items():
        if target in (name, other.base) or absolute in (
            name,
            other.base,
            urljoin(other.base, name),
        ):
            return other
    tail = target.rsplit("/", 1)[-1]
    for name, other in doc.others.items():
        if name.rsplit("/", 1)[-1] == tail or other.base.rsplit("/", 1)[-1] == tail:
            return other
    return None


def _find_anchor(value: Any, anchor: str) -> Any:
    if isinstance(value, dict):
        if value.get("$anchor") == anchor or value.get("$id") == f"#{anchor}":
            return value
        children: Any = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return None
    for child in children:
        found = _find_anchor(child, anchor)
        if found is not None:
            return found
    return None


def deref(value: Any, doc: JsonDoc) -> tuple[Any, JsonDoc]:
    """Follow $ref chains (draft-07 semantics: keywords beside $ref are ignored)."""
    for _ in range(64):
        if isinstance(value, dict) and isinstance(value.get("$ref"), str):
            value, doc = resolve_ref(doc, value["$ref"])
        else:
            break
    return value, doc


def classify(value: Any, doc: JsonDoc) -> View:
    """The View of an already dereferenced subschema."""
    view = _classify(value, doc)
    view.value = value
    return view


def _classify(value: Any, doc: JsonDoc) -> View:
    if value is True or (isinstance(value, dict) and not set(value) - ANNOTATION_KEYS):
        return View("empty", {}, doc)
    if value is False or not isinstance(value, dict):
        return View("false", {}, doc)
    combined = [k for k in COMBINATORS if isinstance(value.get(k), list)]
    if combined:
        rest = {k: v for k, v in value.items() if k not in COMBINATORS}
        parts: list[Any] = [{k: value[k]} for k in combined]
        if set(rest) - ANNOTATION_KEYS:
            parts.insert(0, rest)
        if len(parts) == 1:
            return View("combined", value, doc, combined[0], list(value[combined[0]]))
        return View("combined", value, doc, "allOf", parts)
    if "enum" in value or "const" in value:
        return View("enum", value, doc)
    types = value.get("type")
    if isinstance(types, list) and len(types) != 1:
        return View("combined", value, doc, "anyOf", [{**value, "type": t} for t in types])
    if isinstance(types, list):
        types = types[0]
    if "not" in value and not isinstance(types, str):
        return View("not", value, doc)
    if not isinstance(types, str):
        types = next((kind for kind, keys in _KIND_KEYWORDS if keys & set(value)), "empty")
    if types == "integer":
        return View("number", value, doc, integer=True)
    return View(types, value, doc)
