"""Parse Avro schema text into a graph the compatibility checker can walk.

fastavro.parse_schema is the gatekeeper (it is what producers in this project use,
so a schema it rejects is useless to them), but its output is a dict tree in which a
named type appears once and is then referred to by name. Schema resolution needs to
follow those references, including recursive ones, so this module builds its own
node graph in which a reference *is* the referenced node (cycles included), and adds
the checks fastavro skips: duplicate field names, duplicate or nested union branches,
invalid names and default values that do not match their type.

Logical types are deliberately dropped: Confluent's Avro compatibility (Avro's
SchemaCompatibility) only looks at the underlying type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fastavro

from broker.registry.errors import InvalidSchemaError

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED_KINDS = frozenset({"record", "error", "enum", "fixed"})
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(eq=False)
class AvroField:
    """A record field; `pos` is its index, used in Confluent-style paths."""

    name: str
    type: AvroNode
    pos: int
    has_default: bool = False
    default: Any = None
    aliases: tuple[str, ...] = ()


@dataclass(eq=False)
class AvroNode:
    """One schema node. Identity (eq=False) matters: the checker memoises on node pairs.

    kind is a primitive name, "record", "enum", "fixed", "array", "map" or "union";
    `items` holds array items and map values, `branches` the union members.
    """

    kind: str
    fullname: str = ""
    aliases: frozenset[str] = frozenset()
    fields: list[AvroField] = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)
    enum_default: str | None = None
    size: int = 0
    items: AvroNode | None = None
    branches: list[AvroNode] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The unqualified name, which is what Avro's name matching compares."""
        return self.fullname.rsplit(".", 1)[-1]

    def describe(self) -> str:
        """Short human label for messages: the name of a named type, else the kind."""
        if self.kind == "union":
            return "[" + ", ".join(b.describe() for b in self.branches) + "]"
        return self.fullname or self.kind


def parse_avro(text: str, references: Mapping[str, str] | None = None) -> AvroNode:
    """Validate `text` (and the referenced schemas it uses) and return its node graph.

    `references` maps a named type's full name to the schema text defining it, the way
    Confluent schema references work for Avro. Raises InvalidSchemaError.
    """
    refs = dict(references or {})
    obj = _load_json(text, "Avro schema")
    _fastavro_check(obj, refs)
    return _Parser(refs).parse_root(obj)


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidSchemaError(f"Invalid {what}: not valid JSON: {exc}") from None


def _reference_for(name: str, refs: Mapping[str, str]) -> str | None:
    """The reference key defining `name`, matched by full name, then by simple name."""
    if name in refs:
        return name
    short = name.rsplit(".", 1)[-1]
    for key in refs:
        if key.rsplit(".", 1)[-1] == short:
            return key
    return None


def _fastavro_check(obj: Any, refs: Mapping[str, str]) -> None:
    """Run fastavro.parse_schema, loading referenced schemas on demand, in dependency order."""
    named: dict[str, Any] = {}  # named types of the references parsed so far
    loaded: set[str] = set()

    def parse(schema: Any, label: str) -> None:
        while True:
            # A failed attempt may leave half-registered names behind: work on a copy.
            trial = dict(named)
            try:
                fastavro.parse_schema(schema, named_schemas=trial)
            except fastavro.schema.UnknownType as exc:
                key = _reference_for(str(exc.name), refs)
                if key is None or key in loaded:
                    raise InvalidSchemaError(
                        f"Invalid {label}: unknown type '{exc.name}' (not defined in the schema "
                        "and not given as a reference)"
                    ) from None
                loaded.add(key)
                what = f"referenced Avro schema '{key}'"
                parse(_load_json(refs[key], what), what)
            except InvalidSchemaError:
                raise
            except Exception as exc:  # noqa: BLE001 (fastavro raises SchemaParseException, KeyError...)
                detail = f"missing attribute {exc}" if isinstance(exc, KeyError) else str(exc)
                raise InvalidSchemaError(f"Invalid {label}: {detail}") from None
            else:
                named.update(trial)
                return

    parse(obj, "Avro schema")


class _Parser:
    """Builds AvroNodes following the Avro name-resolution rules (namespaces, aliases)."""

    def __init__(self, refs: Mapping[str, str]) -> None:
        self.refs = refs
        self.names: dict[str, AvroNode] = {}
        self.loading: set[str] = set()
        self.pending_defaults: list[tuple[str, AvroField]] = []

    def parse_root(self, obj: Any) -> AvroNode:
        node = self.parse(obj, "", "")
        # Defaults are checked last: a default may refer to a type that is still
        # being built while its own record is parsed (recursive types).
        for path, fld in self.pending_defaults:
            if not default_matches(fld.type, fld.default):
                raise InvalidSchemaError(
                    f"Invalid Avro schema: default value {json.dumps(fld.default)} of field "
                    f"'{fld.name}' at {path} does not match its type {fld.type.describe()}"
                )
        return node

    def fail(self, path: str, message: str) -> InvalidSchemaError:
        return InvalidSchemaError(f"Invalid Avro schema at {path or '/'}: {message}")

    def parse(self, obj: Any, namespace: str, path: str) -> AvroNode:
        if isinstance(obj, str):
            return self.reference(obj, namespace, path)
        if isinstance(obj, list):
            return self.union(obj, namespace, path)
        if not isinstance(obj, dict):
            raise self.fail(path, f"a schema must be a string, object or array, not {obj!r}")
        kind = obj.get("type")
        if isinstance(kind, (dict, list)):
            return self.parse(kind, namespace, path)
        if not isinstance(kind, str):
            raise self.fail(path, "schema object has no string 'type'")
        if kind in PRIMITIVES:
            return AvroNode(kind)
        if kind in ("array", "map"):
            key = "items" if kind == "array" else "values"
            if key not in obj:
                raise self.fail(path, f"{kind} has no '{key}'")
            return AvroNode(kind, items=self.parse(obj[key], namespace, f"{path}/{key}"))
        if kind in NAMED_KINDS:
            return self.named(kind, obj, namespace, path)
        return self.reference(kind, namespace, path)

    def union(self, obj: list[Any], namespace: str, path: str) -> AvroNode:
        node = AvroNode("union")
        seen: set[str] = set()
        for index, member in enumerate(obj):
            branch = self.parse(member, namespace, f"{path}/{index}")
            if branch.kind == "union":
                raise self.fail(f"{path}/{index}", "unions may not immediately contain unions")
            key = branch.fullname or branch.kind
            if key in seen:
                raise self.fail(f"{path}/{index}", f"duplicate type {key} in union")
            seen.add(key)
            node.branches.append(branch)
        return node

    def reference(self, name: str, namespace: str, path: str) -> AvroNode:
        if name in PRIMITIVES:
            return AvroNode(name)
        candidates = (
            [name] if "." in name else ([f"{namespace}.{name}"] if namespace else []) + [name]
        )
        for candidate in candidates:
            if candidate in self.names:
                return self.names[candidate]
        key = _reference_for(candidates[0], self.refs)
        if key is not None and key not in self.loading:
            self.loading.add(key)
            self.parse(_load_json(self.refs[key], "referenced Avro schema"), "", "")
            return self.reference(name, namespace, path)
        raise self.fail(path, f"unknown type '{name}'")

    def fullname(self, obj: dict[str, Any], namespace: str, path: str) -> tuple[str, str]:
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            raise self.fail(path, "named type has no 'name'")
        if "." in name:
            full = name
        else:
            ns = obj.get("namespace", namespace)
            if ns is not None and not isinstance(ns, str):
                raise self.fail(path, "'namespace' must be a string")
            full = f"{ns}.{name}" if ns else name
        for part in full.split("."):
            if not _NAME_RE.match(part):
                raise self.fail(path, f"invalid name '{full}'")
        if full.rsplit(".", 1)[-1] in PRIMITIVES:
            raise self.fail(path, f"a named type may not be called '{name}'")
        if full in self.names:
            raise self.fail(path, f"can't redefine type '{full}'")
        return full, full.rpartition(".")[0]

    def aliases(self, obj: dict[str, Any], namespace: str) -> frozenset[str]:
        raw = obj.get("aliases") or []
        if not isinstance(raw, list):
            return frozenset()
        return frozenset(
            a if "." in a or not namespace else f"{namespace}.{a}"
            for a in raw
            if isinstance(a, str)
        )

    def named(self, kind: str, obj: dict[str, Any], namespace: str, path: str) -> AvroNode:
        full, own_ns = self.fullname(obj, namespace, path)
        node = AvroNode(
            "record" if kind == "error" else kind, fullname=full, aliases=self.aliases(obj, own_ns)
        )
        self.names[full] = node  # registered before the body: recursive references
        if kind == "fixed":
            size = obj.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise self.fail(path, f"fixed '{full}' needs a non-negative integer 'size'")
            node.size = size
        elif kind == "enum":
            self.enum_body(node, obj, path)
        else:
            self.record_body(node, obj, own_ns, path)
        return node

    def enum_body(self, node: AvroNode, obj: dict[str, Any], path: str) -> None:
        symbols = obj.get("symbols")
        if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
            raise self.fail(path, f"enum '{node.fullname}' needs a list of string 'symbols'")
        for symbol in symbols:
            if not _NAME_RE.match(symbol):
                raise self.fail(f"{path}/symbols", f"invalid enum symbol '{symbol}'")
        if len(set(symbols)) != len(symbols):
            raise self.fail(f"{path}/symbols", f"duplicate symbol in enum '{node.fullname}'")
        node.symbols = list(symbols)
        default = obj.get("default")
        if default is not None:
            if default not in symbols:
                raise self.fail(path, f"enum default '{default}' is not one of the symbols")
            node.enum_default = default

    def record_body(self, node: AvroNode, obj: dict[str, Any], namespace: str, path: str) -> None:
        fields = obj.get("fields")
        if not isinstance(fields, list):
            raise self.fail(path, f"record '{node.fullname}' needs a list of 'fields'")
        seen: set[str] = set()
        for pos, raw in enumerate(fields):
            fpath = f"{path}/fields/{pos}"
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                raise self.fail(fpath, "a field must be an object with a string 'name'")
            name = raw["name"]
            if not _NAME_RE.match(name):
                raise self.fail(fpath, f"invalid field name '{name}'")
            if name in seen:
                raise self.fail(fpath, f"duplicate field '{name}' in record '{node.fullname}'")
            seen.add(name)
            if "type" not in raw:
                raise self.fail(fpath, f"field '{name}' has no 'type'")
            aliases = tuple(a for a in raw.get("aliases") or [] if isinstance(a, str))
            fld = AvroField(
                name,
                self.parse(raw["type"], namespace, f"{fpath}/type"),
                pos,
                "default" in raw,
                raw.get("default"),
                aliases,
            )
            if fld.has_default:
                self.pending_defaults.append((fpath, fld))
            node.fields.append(fld)


def default_matches(node: AvroNode, value: Any, _depth: int = 0) -> bool:
    """Whether a JSON default value is valid for `node` (Avro spec, "default" table).

    For unions any branch may match: the Avro 1.12 specification (AVRO-3649) relaxed the
    older "first branch only" rule, and fastavro accepts both.
    """
    if _depth > 64:
        return True  # absurdly deep default on a recursive type: do not recurse forever
    kind = node.kind
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
    if kind == "fixed":
        return isinstance(value, str) and len(value) == node.size
    if kind == "enum":
        return value in node.symbols
    if kind == "array":
        assert node.items is not None
        return isinstance(value, list) and all(
            default_matches(node.items, v, _depth + 1) for v in value
        )
    if kind == "map":
        assert node.items is not None
        return isinstance(value, dict) and all(
            default_matches(node.items, v, _depth + 1) for v in value.values()
        )
    if kind == "record":
        return isinstance(value, dict) and all(
            default_matches(f.type, value[f.name], _depth + 1) if f.name in value else f.has_default
            for f in node.fields
        )
    if kind == "union":
        return any(default_matches(b, value, _depth + 1) for b in node.branches)
    return False
