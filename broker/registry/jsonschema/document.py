"""Load JSON Schema documents and classify their subschemas for the compatibility diff.

The diff in compat_json.py reasons about *kinds* of schemas the way Confluent's does (it
is built on everit's object model: StringSchema, NumberSchema, ObjectSchema, ...), so this
module turns a raw subschema into a `View`: its kind plus, for combined schemas, the
subschemas. A "type" list becomes an anyOf of single-typed copies, exactly as everit
does, which is what makes ["string"] -> ["string", "null"] a compatible extension.

`$ref` is resolved with the `referencing` library (what `jsonschema` itself uses): a
registry holds the document and the schema references the registry passes in (name ->
schema text), each under its name, under its own `$id` and under its name resolved
against the main document's `$id`; each document is read in the dialect its `$schema`
names (the one `jsonschema` validates it with). Two shims keep what the registry
accepted before `referencing`, for schemas written loosely:

* a plain-name fragment (``#foo``) that `referencing` does not find as an anchor of the
  dialect is looked for anywhere in the target document as ``$anchor: foo`` or
  ``$id: "#foo"``, also in non-keyword positions (a draft-07 ``$id`` anchor in a
  2020-12 document, or an anchor under an unknown key, which the specification does
  not crawl);
* a URI no resource is registered under is matched to a reference by its last path
  segment (``https://example.com/schemas/address.json`` -> ``address.json``), as Confluent
  resolves references by name.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import referencing
import referencing.exceptions
import referencing.jsonschema

from broker.registry.errors import InvalidSchemaError

if TYPE_CHECKING:
    from referencing._core import Resolver

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
    """A subschema's document: its root and the resolver for the refs inside it."""

    root: Any
    resolver: Resolver[Any]


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
    root = _load_one(text, "JSON schema")
    base = _own_id(root) or ""
    resources: dict[str, referencing.Resource[Any]] = {base: _resource(root)}
    for name, ref_text in (references or {}).items():
        resource = _resource(_load_one(ref_text, f"referenced JSON schema '{name}'"))
        for uri in (name, _own_id(resource.contents), urljoin(base, name) if base else None):
            if uri:
                resources.setdefault(uri.rstrip("#"), resource)
    registry: referencing.Registry[Any] = referencing.Registry(  # type: ignore[call-arg]
        retrieve=functools.partial(_by_last_segment, resources)  # attrs alias of _retrieve
    ).with_resources(resources.items())
    doc = JsonDoc(root, registry.resolver(base_uri=base))
    _check_refs(doc, root, "#")
    return doc


def _load_one(text: str, what: str) -> Any:
    try:
        root = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidSchemaError(f"Invalid {what}: not valid JSON: {exc}") from None
    if not isinstance(root, (dict, bool)):
        raise InvalidSchemaError(f"Invalid {what}: a schema must be a JSON object or boolean")
    try:
        validator_class(root).check_schema(root)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise InvalidSchemaError(f"Invalid {what} at #/{where}: {exc.message}") from None
    return root


def validator_class(root: Any) -> Any:
    """The `jsonschema` validator of the dialect a document's ``$schema`` names (draft-04,
    -06, -07, 2019-09, 2020-12); without one, draft-07, the version Confluent's registry
    reads such a document as (so ``items`` may be an array of schemas, a tuple)."""
    return jsonschema.validators.validator_for(root, default=jsonschema.Draft7Validator)


def _own_id(root: Any) -> str | None:
    if not isinstance(root, dict):
        return None
    found = root.get("$id") or root.get("id")
    return found.rstrip("#") if isinstance(found, str) else None


def _resource(root: Any) -> referencing.Resource[Any]:
    """The document as a resource of the dialect `jsonschema` validated it with."""
    dialect = validator_class(root).META_SCHEMA["$schema"]
    spec = referencing.jsonschema.specification_with(
        dialect, default=referencing.jsonschema.DRAFT202012
    )
    return spec.create_resource(root)


def _by_last_segment(
    resources: Mapping[str, referencing.Resource[Any]], uri: str
) -> referencing.Resource[Any]:
    """Shim: a reference named by the last segment of an unregistered URI."""
    tail = uri.rstrip("/").rsplit("/", 1)[-1]
    for name, resource in resources.items():
        if name and name.rsplit("/", 1)[-1] == tail:
            return resource
    raise referencing.exceptions.NoSuchResource(uri)


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
    try:
        resolved = doc.resolver.lookup(ref)
    except referencing.exceptions.NoSuchAnchor as exc:
        found = _find_anchor(exc.resource.contents, exc.anchor)
        if found is None:
            raise _unresolved(ref, path) from None
        target = doc.resolver.lookup(ref.partition("#")[0] or "#")
        return found, JsonDoc(target.contents, target.resolver)
    except referencing.exceptions.Unresolvable:
        if _names_no_resource(doc, ref.partition("#")[0]):
            raise InvalidSchemaError(
                f"Invalid JSON schema at {path}: $ref '{ref}' names a schema that is neither "
                "this document nor one of its references"
            ) from None
        raise _unresolved(ref, path) from None
    target = resolved.resolver.lookup("#")
    return resolved.contents, JsonDoc(target.contents, resolved.resolver)


def _names_no_resource(doc: JsonDoc, target: str) -> bool:
    if not target:
        return False
    try:
        doc.resolver.lookup(target)
    except referencing.exceptions.Unresolvable:
        return True
    return False


def _unresolved(ref: str, path: str) -> InvalidSchemaError:
    return InvalidSchemaError(f"Invalid JSON schema at {path}: $ref '{ref}' does not resolve")


def _find_anchor(value: Any, anchor: str) -> Any:
    """Shim: ``$anchor: name`` or ``$id: "#name"`` anywhere in a document."""
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
