"""JSON Schema compatibility, modelled on Confluent's JSON Schema diff.

Confluent compares an *original* schema (the writer: what existing data was validated
against) with an *update* (the reader) and classifies each difference; some kinds are
compatible (the update accepts at least what the original accepted), the rest are not.
The kind names and the content-model rules are Confluent's:

* open content model (additionalProperties absent/true, no patternProperties): removing a
  property is compatible (old data with it still validates), adding one is not, because
  old data may already carry that name with any value — unless the new property schema
  is empty (accepts anything);
* closed content model (additionalProperties false): adding an optional property is
  compatible, adding a required one is not (unless it has a default), and removing one
  is not;
* partially open (additionalProperties is a schema, or patternProperties match): the
  added/removed property must be covered by that schema;
* required added to an existing property is incompatible; integer -> number is a
  compatible widening, number -> integer is not; enum extended is compatible, narrowed
  or changed is not; string/number/array/object bounds may only loosen; a type becoming
  a union (anyOf/oneOf/type list) containing it is compatible; combined schemas match
  their subschemas pairwise (maximum bipartite matching).

Only the incompatible differences are reported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from broker.registry.compat_common import Incompatibility
from broker.registry.jsonschema.document import JsonDoc, View, classify, deref

COMPATIBLE_CHANGES = frozenset(
    {
        "SCHEMA_REMOVED",
        "TYPE_EXTENDED",
        "MAX_LENGTH_INCREASED",
        "MAX_LENGTH_REMOVED",
        "MIN_LENGTH_DECREASED",
        "MIN_LENGTH_REMOVED",
        "PATTERN_REMOVED",
        "MAXIMUM_INCREASED",
        "MAXIMUM_REMOVED",
        "MINIMUM_DECREASED",
        "MINIMUM_REMOVED",
        "EXCLUSIVE_MAXIMUM_INCREASED",
        "EXCLUSIVE_MAXIMUM_REMOVED",
        "EXCLUSIVE_MINIMUM_DECREASED",
        "EXCLUSIVE_MINIMUM_REMOVED",
        "MULTIPLE_OF_REDUCED",
        "MULTIPLE_OF_REMOVED",
        "REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED",
        "REQUIRED_ATTRIBUTE_REMOVED",
        "DEPENDENCY_ARRAY_NARROWED",
        "DEPENDENCY_ARRAY_REMOVED",
        "DEPENDENCY_SCHEMA_REMOVED",
        "MAX_PROPERTIES_INCREASED",
        "MAX_PROPERTIES_REMOVED",
        "MIN_PROPERTIES_DECREASED",
        "MIN_PROPERTIES_REMOVED",
        "ADDITIONAL_PROPERTIES_ADDED",
        "ADDITIONAL_PROPERTIES_EXTENDED",
        "PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL",
        "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL",
        "OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
        "PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL",
        "PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL",
        "PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
        "PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
        "MAX_ITEMS_INCREASED",
        "MAX_ITEMS_REMOVED",
        "MIN_ITEMS_DECREASED",
        "MIN_ITEMS_REMOVED",
        "UNIQUE_ITEMS_REMOVED",
        "ADDITIONAL_ITEMS_ADDED",
        "ADDITIONAL_ITEMS_EXTENDED",
        "ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL",
        "ITEM_ADDED_TO_CLOSED_CONTENT_MODEL",
        "ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL",
        "ENUM_ARRAY_EXTENDED",
        "COMBINED_TYPE_EXTENDED",
        "PRODUCT_TYPE_NARROWED",
        "SUM_TYPE_EXTENDED",
        "NOT_TYPE_NARROWED",
    }
)

_Diffs = list[Incompatibility]
_Node = tuple[Any, JsonDoc]


def check_json_docs(reader: JsonDoc, writer: JsonDoc) -> list[Incompatibility]:
    """Every incompatible difference when data valid for the writer is read by the reader,
    on already loaded documents."""
    diffs = _Differ().compare((writer.root, writer), (reader.root, reader), "#")
    return [d for d in diffs if d.kind not in COMPATIBLE_CHANGES]


def _compatible(diffs: _Diffs) -> bool:
    return all(d.kind in COMPATIBLE_CHANGES for d in diffs)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _diff(kind: str, path: str, text: str) -> Incompatibility:
    return Incompatibility(kind, path, text)


class _Differ:
    """Walks original (writer) and update (reader) together, collecting differences."""

    def __init__(self) -> None:
        self.in_progress: set[tuple[int, int]] = set()
        self.keep_alive: list[Any] = []  # ids of synthetic subschemas must stay unique

    def compare(self, original: _Node, update: _Node, path: str) -> _Diffs:
        o_value, o_doc = deref(*original)
        u_value, u_doc = deref(*update)
        key = (id(o_value), id(u_value))
        if key in self.in_progress or len(self.in_progress) > 400:
            return []  # recursive schema met again: the outer visit reports any problem
        self.in_progress.add(key)
        self.keep_alive += [o_value, u_value]
        try:
            return self.compare_views(classify(o_value, o_doc), classify(u_value, u_doc), path)
        finally:
            self.in_progress.discard(key)

    def compare_views(self, o: View, u: View, path: str) -> _Diffs:
        if o.kind != "combined" and u.kind == "combined":
            if len(u.subschemas) == 1 or u.criterion in ("anyOf", "oneOf"):
                for sub in u.subschemas:
                    diffs = self.compare((o.value, o.doc), (sub, u.doc), path)
                    if _compatible(diffs):
                        if len(u.subschemas) == 1:
                            return diffs
                        return diffs + [
                            _diff(
                                "SUM_TYPE_EXTENDED", path, "{reader} turned the type into a union"
                            )
                        ]
        elif o.kind == "combined" and u.kind != "combined" and len(o.subschemas) == 1:
            diffs = self.compare((o.subschemas[0], o.doc), (u.value, u.doc), path)
            if _compatible(diffs):
                return diffs
        if o.kind != u.kind:
            if o.kind == "false" or u.kind == "empty":
                return []
            return [
                _diff(
                    "TYPE_CHANGED",
                    path,
                    f"the type is {_describe(o)} in {{writer}} but {_describe(u)} in {{reader}}",
                )
            ]
        handler = _HANDLERS.get(o.kind)
        return handler(self, o, u, path) if handler else []

    # -- per kind -------------------------------------------------------------------

    def strings(self, o: View, u: View, path: str) -> _Diffs:
        diffs = _bound(o.schema, u.schema, "maxLength", path, upper=True)
        diffs += _bound(o.schema, u.schema, "minLength", path, upper=False)
        op, up = o.schema.get("pattern"), u.schema.get("pattern")
        if op != up:
            kind = (
                "PATTERN_ADDED"
                if op is None
                else "PATTERN_REMOVED"
                if up is None
                else "PATTERN_CHANGED"
            )
            diffs.append(
                _diff(
                    kind,
                    f"{path}/pattern",
                    f"pattern is {op!r} in {{writer}} and {up!r} in {{reader}}",
                )
            )
        return diffs

    def numbers(self, o: View, u: View, path: str) -> _Diffs:
        diffs: _Diffs = []
        for keyword, upper in (
            ("maximum", True),
            ("minimum", False),
            ("exclusiveMaximum", True),
            ("exclusiveMinimum", False),
        ):
            diffs += _bound(o.schema, u.schema, keyword, path, upper)
        diffs += _multiple_of(o.schema.get("multipleOf"), u.schema.get("multipleOf"), path)
        if o.integer and not u.integer:
            diffs.append(_diff("TYPE_EXTENDED", path, "integer widened to number"))
        elif u.integer and not o.integer:
            diffs.append(
                _diff(
                    "TYPE_NARROWED",
                    path,
                    "the type is number in {writer} but only integer in {reader}",
                )
            )
        return diffs

    def enums(self, o: View, u: View, path: str) -> _Diffs:
        o_values, u_values = _enum_values(o.schema), _enum_values(u.schema)
        if set(o_values) == set(u_values):
            return []
        if set(o_values) <= set(u_values):
            kind = "ENUM_ARRAY_EXTENDED"
        elif set(u_values) <= set(o_values):
            kind = "ENUM_ARRAY_NARROWED"
        else:
            kind = "ENUM_ARRAY_CHANGED"
        missing = [o_values[k] for k in o_values if k not in u_values]
        return [
            _diff(
                kind,
                f"{path}/enum",
                f"values {missing} allowed by {{writer}} are not allowed by {{reader}}"
                if missing
                else "{reader} allows more values",
            )
        ]

    def nots(self, o: View, u: View, path: str) -> _Diffs:
        o_not, u_not = o.schema.get("not"), u.schema.get("not")
        if _canonical(o_not) == _canonical(u_not):
            return []
        # not A -> not B is compatible when B accepts no more than A does.
        diffs = self.compare((u_not, u.doc), (o_not, o.doc), f"{path}/not")
        if _compatible(diffs):
            return [_diff("NOT_TYPE_NARROWED", f"{path}/not", "the negated schema narrowed")]
        return [
            _diff(
                "NOT_TYPE_EXTENDED",
                f"{path}/not",
                "{reader} negates a schema that accepts values {writer} allowed",
            )
        ]

    def combined(self, o: View, u: View, path: str) -> _Diffs:
        diffs: _Diffs = []
        if o.criterion != u.criterion:
            single_o, single_u = len(o.subschemas) == 1, len(u.subschemas) == 1
            if (
                u.criterion == "anyOf"
                or (u.criterion == "oneOf" and single_o)
                or (u.criterion == "allOf" and single_o and single_u)
            ):
                diffs.append(_diff("COMBINED_TYPE_EXTENDED", path, "combination loosened"))
            else:
                return [
                    _diff(
                        "COMBINED_TYPE_CHANGED",
                        path,
                        f"{{writer}} uses {o.criterion} but {{reader}} uses {u.criterion}",
                    )
                ]
        o_subs = _dedupe(o.subschemas)
        u_subs = _dedupe(u.subschemas)
        if len(o_subs) != len(u_subs):
            more = len(o_subs) < len(u_subs)
            if u.criterion == "allOf":
                kind = "PRODUCT_TYPE_EXTENDED" if more else "PRODUCT_TYPE_NARROWED"
            else:
                kind = "SUM_TYPE_EXTENDED" if more else "SUM_TYPE_NARROWED"
            diffs.append(
                _diff(
                    kind,
                    path,
                    f"{u.criterion} has {len(o_subs)} subschemas in "
                    f"{{writer}} and {len(u_subs)} in {{reader}}",
                )
            )
        edges: dict[tuple[int, int], _Diffs] = {}
        for i, o_sub in enumerate(o_subs):
            for j, u_sub in enumerate(u_subs):
                sub = self.compare((o_sub, o.doc), (u_sub, u.doc), f"{path}/{o.criterion}/{i}")
                if _compatible(sub):
                    edges[(i, j)] = sub
        matching = _max_matching(len(o_subs), len(u_subs), edges)
        for edge in matching:
            diffs += edges[edge]
        if len(matching) < min(len(o_subs), len(u_subs)):
            diffs.append(
                _diff(
                    "COMBINED_TYPE_SUBSCHEMAS_CHANGED",
                    path,
                    f"not every subschema of {{writer}}'s {o.criterion} has a "
                    f"compatible counterpart in {{reader}}",
                )
            )
        return diffs

    def objects(self, o: View, u: View, path: str) -> _Diffs:
        os, us = o.schema, u.schema
        diffs = self.required(o, u, path) + self.properties(o, u, path)
        diffs += self.dependencies(o, u, path)
        diffs += self.additional(
            o, u, f"{path}/additionalProperties", "additionalProperties", "ADDITIONAL_PROPERTIES"
        )
        diffs += _bound(os, us, "maxProperties", path, upper=True)
        diffs += _bound(os, us, "minProperties", path, upper=False)
        return diffs

    def required(self, o: View, u: View, path: str) -> _Diffs:
        diffs: _Diffs = []
        o_props, u_props = _props(o.schema), _props(u.schema)
        o_req, u_req = set(o.schema.get("required") or []), set(u.schema.get("required") or [])
        for name in o_props:
            if name not in u_props:
                continue
            if name in u_req and name not in o_req:
                if _has_default(u_props[name], u.doc):
                    diffs.append(
                        _diff(
                            "REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED",
                            f"{path}/required/{name}",
                            "required with a default",
                        )
                    )
                else:
                    diffs.append(
                        _diff(
                            "REQUIRED_ATTRIBUTE_ADDED",
                            f"{path}/required/{name}",
                            f"property '{name}' is required in {{reader}} but optional "
                            "in {writer}",
                        )
                    )
            elif name in o_req and name not in u_req:
                diffs.append(
                    _diff(
                        "REQUIRED_ATTRIBUTE_REMOVED",
                        f"{path}/required/{name}",
                        "no longer required",
                    )
                )
        return diffs

    def properties(self, o: View, u: View, path: str) -> _Diffs:
        diffs: _Diffs = []
        o_props, u_props = _props(o.schema), _props(u.schema)
        u_req = set(u.schema.get("required") or [])
        for name in list(o_props) + [n for n in u_props if n not in o_props]:
            ppath = f"{path}/properties/{name}"
            if name in o_props and name in u_props:
                diffs += self.compare((o_props[name], o.doc), (u_props[name], u.doc), ppath)
            elif name in o_props:
                diffs += self.property_removed(o_props[name], o, u, name, ppath)
            else:
                diffs += self.property_added(u_props[name], o, u, name, ppath, name in u_req)
        return diffs

    def property_removed(self, schema: Any, o: View, u: View, name: str, path: str) -> _Diffs:
        if _is_open(u.schema):
            return [_diff("PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL", path, "removed (open model)")]
        partial = _partial_schema(u.schema, name)
        if partial is not None:
            sub = self.compare((schema, o.doc), (partial, u.doc), path)
            if _compatible(sub):
                return sub + [
                    _diff(
                        "PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                        path,
                        "covered",
                    )
                ]
            return sub + [
                _diff(
                    "PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                    path,
                    f"property '{name}' of {{writer}} was removed and {{reader}}'s "
                    "additionalProperties/patternProperties do not accept its values",
                )
            ]
        if deref(schema, o.doc)[0] is False:
            return [_diff("PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL", path, "removed")]
        return [
            _diff(
                "PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL",
                path,
                f"property '{name}' of {{writer}} was removed and {{reader}} does not allow "
                "additional properties",
            )
        ]

    def property_added(
        self, schema: Any, o: View, u: View, name: str, path: str, required: bool
    ) -> _Diffs:
        if _is_open(o.schema):
            if classify(*deref(schema, u.doc)).kind == "empty":
                return [
                    _diff("PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL", path, "added")
                ]
            return [
                _diff(
                    "PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL",
                    path,
                    f"property '{name}' was added to {{reader}}, but {{writer}} has an open "
                    "content model, so existing data may hold any value under that name",
                )
            ]
        diffs: _Diffs = []
        partial = _partial_schema(o.schema, name)
        if partial is not None:
            sub = self.compare((partial, o.doc), (schema, u.doc), path)
            diffs += sub
            if _compatible(sub):
                diffs.append(
                    _diff(
                        "PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", path, "covered"
                    )
                )
            else:
                diffs.append(
                    _diff(
                        "PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                        path,
                        f"property '{name}' was added to {{reader}} but values "
                        "{writer} accepted under that name do not validate against it",
                    )
                )
        if not required:
            diffs.append(_diff("OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL", path, "added"))
        elif _has_default(schema, u.doc):
            diffs.append(
                _diff(
                    "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL",
                    path,
                    "added with default",
                )
            )
        else:
            diffs.append(
                _diff(
                    "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
                    path,
                    f"required property '{name}' was added to {{reader}}; data written "
                    "with {writer} does not have it",
                )
            )
        return diffs

    def additional(self, o: View, u: View, path: str, keyword: str, prefix: str) -> _Diffs:
        """additionalProperties / additionalItems: false < schema < absent or true."""
        o_permits, u_permits = (
            o.schema.get(keyword) is not False,
            u.schema.get(keyword) is not False,
        )
        o_sub, u_sub = _sub_schema(o.schema.get(keyword)), _sub_schema(u.schema.get(keyword))
        if o_permits != u_permits:
            if u_permits:
                return [_diff(f"{prefix}_ADDED", path, "now allowed")]
            return [
                _diff(
                    f"{prefix}_REMOVED",
                    path,
                    f"{{writer}} allows {keyword} but {{reader}} forbids them",
                )
            ]
        if o_sub is None and u_sub is not None:
            return [
                _diff(
                    f"{prefix}_NARROWED",
                    path,
                    f"{{reader}} restricts {keyword} that {{writer}} left unconstrained",
                )
            ]
        if u_sub is None and o_sub is not None:
            return [_diff(f"{prefix}_EXTENDED", path, "now unconstrained")]
        if o_sub is not None and u_sub is not None:
            return self.compare((o_sub, o.doc), (u_sub, u.doc), path)
        return []

    def dependencies(self, o: View, u: View, path: str) -> _Diffs:
        diffs: _Diffs = []
        o_arrays, o_schemas = _dependencies(o.schema)
        u_arrays, u_schemas = _dependencies(u.schema)
        for name in sorted(set(o_arrays) | set(u_arrays)):
            dpath = f"{path}/dependencies/{name}"
            ov, uv = o_arrays.get(name), u_arrays.get(name)
            if uv is None:
                diffs.append(_diff("DEPENDENCY_ARRAY_REMOVED", dpath, "removed"))
            elif ov is None:
                diffs.append(
                    _diff(
                        "DEPENDENCY_ARRAY_ADDED",
                        dpath,
                        f"{{reader}} adds a dependency of property '{name}'",
                    )
                )
            elif ov != uv:
                kind = (
                    "DEPENDENCY_ARRAY_EXTENDED"
                    if ov <= uv
                    else "DEPENDENCY_ARRAY_NARROWED"
                    if uv <= ov
                    else "DEPENDENCY_ARRAY_CHANGED"
                )
                diffs.append(
                    _diff(
                        kind,
                        dpath,
                        f"dependencies of property '{name}' changed "
                        f"from {sorted(ov)} to {sorted(uv)}",
                    )
                )
        for name in sorted(set(o_schemas) | set(u_schemas)):
            dpath = f"{path}/dependencies/{name}"
            if name not in u_schemas:
                diffs.append(_diff("DEPENDENCY_SCHEMA_REMOVED", dpath, "removed"))
            elif name not in o_schemas:
                diffs.append(
                    _diff(
                        "DEPENDENCY_SCHEMA_ADDED",
                        dpath,
                        f"{{reader}} adds a schema dependency on property '{name}'",
                    )
                )
            else:
                diffs += self.compare((o_schemas[name], o.doc), (u_schemas[name], u.doc), dpath)
        return diffs

    def arrays(self, o: View, u: View, path: str) -> _Diffs:
        os, us = o.schema, u.schema
        diffs: _Diffs = []
        o_items, u_items = _item_schema(os), _item_schema(us)
        if o_items is not None and u_items is not None:
            diffs += self.compare((o_items, o.doc), (u_items, u.doc), f"{path}/items")
        elif (
            o_items is None
            and u_items is not None
            and classify(*deref(u_items, u.doc)).kind != "empty"
        ):
            diffs.append(
                _diff(
                    "SCHEMA_ADDED",
                    f"{path}/items",
                    "{reader} constrains the items that {writer} left open",
                )
            )
        diffs += self.tuple_items(o, u, path)
        diffs += _bound(os, us, "maxItems", path, upper=True)
        diffs += _bound(os, us, "minItems", path, upper=False)
        if bool(os.get("uniqueItems")) != bool(us.get("uniqueItems")):
            if us.get("uniqueItems"):
                diffs.append(
                    _diff(
                        "UNIQUE_ITEMS_ADDED",
                        f"{path}/uniqueItems",
                        "{reader} requires unique items, {writer} did not",
                    )
                )
            else:
                diffs.append(_diff("UNIQUE_ITEMS_REMOVED", f"{path}/uniqueItems", "removed"))
        return diffs

    def tuple_items(self, o: View, u: View, path: str) -> _Diffs:
        o_tuple, u_tuple = _tuple_items(o.schema), _tuple_items(u.schema)
        if not o_tuple and not u_tuple:
            return []
        diffs = self.additional(
            o, u, f"{path}/additionalItems", "additionalItems", "ADDITIONAL_ITEMS"
        )
        for index in range(max(len(o_tuple), len(u_tuple))):
            ipath = f"{path}/items/{index}"
            if index < len(o_tuple) and index < len(u_tuple):
                diffs += self.compare((o_tuple[index], o.doc), (u_tuple[index], u.doc), ipath)
            elif index < len(o_tuple):
                if u.schema.get("additionalItems") is False:
                    diffs.append(
                        _diff(
                            "ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL",
                            ipath,
                            f"tuple item {index} of {{writer}} is not allowed by {{reader}}",
                        )
                    )
                else:
                    diffs.append(_diff("ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL", ipath, "removed"))
            elif o.schema.get("additionalItems") is False:
                diffs.append(_diff("ITEM_ADDED_TO_CLOSED_CONTENT_MODEL", ipath, "added"))
            elif classify(*deref(u_tuple[index], u.doc)).kind == "empty":
                diffs.append(
                    _diff("ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL", ipath, "added")
                )
            else:
                diffs.append(
                    _diff(
                        "ITEM_ADDED_TO_OPEN_CONTENT_MODEL",
                        ipath,
                        f"tuple item {index} was added to {{reader}} but {{writer}} "
                        "allowed any value there",
                    )
                )
        return diffs


_HANDLERS: dict[str, Callable[[_Differ, View, View, str], _Diffs]] = {
    "string": _Differ.strings,
    "number": _Differ.numbers,
    "enum": _Differ.enums,
    "not": _Differ.nots,
    "combined": _Differ.combined,
    "object": _Differ.objects,
    "array": _Differ.arrays,
}


def _describe(view: View) -> str:
    if view.kind == "number" and view.integer:
        return "integer"
    if view.kind == "combined":
        return view.criterion
    return {"empty": "any value", "false": "no value"}.get(view.kind, view.kind)


def _bound(o: dict[str, Any], u: dict[str, Any], keyword: str, path: str, upper: bool) -> _Diffs:
    """A numeric limit: loosening (raise an upper, lower a lower, drop) is compatible."""
    ov, uv = _number(o.get(keyword)), _number(u.get(keyword))
    if ov == uv:
        return []
    name = re.sub(r"(?<!^)([A-Z])", r"_\1", keyword).upper()
    if ov is None:
        kind, text = f"{name}_ADDED", f"{{reader}} adds {keyword} {uv}"
    elif uv is None:
        kind, text = f"{name}_REMOVED", "removed"
    elif uv > ov:
        kind, text = f"{name}_INCREASED", f"{keyword} raised from {ov} to {uv}"
    else:
        kind, text = f"{name}_DECREASED", f"{keyword} lowered from {ov} to {uv}"
    if kind.endswith("_INCREASED") and not upper or kind.endswith("_DECREASED") and upper:
        text = f"{keyword} is {ov} in {{writer}} but {uv} in {{reader}}"
    return [_diff(kind, f"{path}/{keyword}", text)]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # draft-04 boolean exclusiveMaximum and the like: not a limit
    return float(value)


def _multiple_of(ov: Any, uv: Any, path: str) -> _Diffs:
    o, u = _number(ov), _number(uv)
    if o == u:
        return []
    p = f"{path}/multipleOf"
    if o is None:
        return [_diff("MULTIPLE_OF_ADDED", p, f"{{reader}} requires multiples of {uv}")]
    if u is None:
        return [_diff("MULTIPLE_OF_REMOVED", p, "removed")]
    of, uf = Fraction(str(ov)), Fraction(str(uv))
    if (of / uf).denominator == 1:
        return [_diff("MULTIPLE_OF_REDUCED", p, "reduced")]
    kind = "MULTIPLE_OF_EXPANDED" if (uf / of).denominator == 1 else "MULTIPLE_OF_CHANGED"
    return [_diff(kind, p, f"multipleOf is {ov} in {{writer}} but {uv} in {{reader}}")]


def _enum_values(schema: dict[str, Any]) -> dict[str, Any]:
    values = schema["enum"] if isinstance(schema.get("enum"), list) else [schema.get("const")]
    return {_canonical(v): v for v in values}


def _dedupe(subschemas: list[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for sub in subschemas:
        seen.setdefault(_canonical(sub), sub)
    return list(seen.values())


def _max_matching(
    left: int, right: int, edges: Mapping[tuple[int, int], object]
) -> list[tuple[int, int]]:
    """Maximum bipartite matching (Kuhn's augmenting paths); the graphs are tiny."""
    match_right: dict[int, int] = {}

    def augment(i: int, seen: set[int]) -> bool:
        for j in range(right):
            if (i, j) in edges and j not in seen:
                seen.add(j)
                if j not in match_right or augment(match_right[j], seen):
                    match_right[j] = i
                    return True
        return False

    for i in range(left):
        augment(i, set())
    return sorted((i, j) for j, i in match_right.items())


def _props(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    return props if isinstance(props, dict) else {}


def _has_default(schema: Any, doc: JsonDoc) -> bool:
    value, _ = deref(schema, doc)
    return isinstance(value, dict) and "default" in value


def _sub_schema(value: Any) -> Any:
    """The schema of additionalProperties/Items, or None when absent, true, false or {}."""
    if isinstance(value, dict) and value:
        return value
    return None


def _is_open(schema: dict[str, Any]) -> bool:
    return (
        not schema.get("patternProperties")
        and _sub_schema(schema.get("additionalProperties")) is None
        and schema.get("additionalProperties") is not False
    )


def _partial_schema(schema: dict[str, Any], name: str) -> Any:
    for pattern, sub in (schema.get("patternProperties") or {}).items():
        try:
            if re.search(pattern, name):
                return sub
        except re.error:
            continue
    return _sub_schema(schema.get("additionalProperties"))


def _dependencies(schema: dict[str, Any]) -> tuple[dict[str, frozenset[str]], dict[str, Any]]:
    arrays: dict[str, frozenset[str]] = {}
    schemas: dict[str, Any] = {}
    for keyword in ("dependencies", "dependentRequired", "dependentSchemas"):
        for name, value in (schema.get(keyword) or {}).items():
            if isinstance(value, list):
                arrays[name] = frozenset(str(v) for v in value)
            else:
                schemas[name] = value
    return arrays, schemas


def _item_schema(schema: dict[str, Any]) -> Any:
    items = schema.get("items")
    return None if isinstance(items, list) else items


def _tuple_items(schema: dict[str, Any]) -> list[Any]:
    if isinstance(schema.get("prefixItems"), list):
        return list(schema["prefixItems"])
    items = schema.get("items")
    return list(items) if isinstance(items, list) else []
