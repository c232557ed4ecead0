"""Schema compatibility checkers: Avro resolution rules, JSON Schema and Protobuf diffs.

Pure and fast: no broker, no network. Each Avro case states the expected result in both
directions, so every rule is exercised as reader and as writer.
"""

from __future__ import annotations

import base64
import importlib
import json
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from broker.registry.compat import LEVELS, InvalidSchemaError, check_compatibility, parse_schema
from broker.registry.errors import InvalidSchemaError as SharedInvalidSchemaError
from broker.registry.protobuf.compat import (
    is_serialized_descriptor,
    parse_proto,
    render_proto,
    to_descriptor,
)
from broker.registry.protobuf.descriptor import from_descriptor


def avro(schema: Any) -> str:
    return json.dumps(schema)


def rec(*fields: dict[str, Any], name: str = "R", **extra: Any) -> str:
    return avro({"type": "record", "name": name, "fields": list(fields), **extra})


def f(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def enum(*symbols: str, name: str = "E", **extra: Any) -> dict[str, Any]:
    return {"type": "enum", "name": name, "symbols": list(symbols), **extra}


def fixed(size: int, name: str = "F", **extra: Any) -> dict[str, Any]:
    return {"type": "fixed", "name": name, "size": size, **extra}


def node(value_type: str, extra_field: dict[str, Any] | None = None) -> str:
    fields = [f("value", value_type), f("next", ["null", "Node"], default=None)]
    return rec(*fields, *([extra_field] if extra_field else []), name="Node")


def ok(schema_type: str, new: str, old: str | list[str], level: str) -> bool:
    return not check_compatibility(schema_type, new, old if isinstance(old, list) else [old], level)


def messages(schema_type: str, new: str, old: str | list[str], level: str) -> list[str]:
    return check_compatibility(schema_type, new, old if isinstance(old, list) else [old], level)


# -- Avro: (id, old, new, backward ok, forward ok) -------------------------------------------

AVRO_CASES: list[tuple[str, str, str, bool, bool]] = [
    ("identical", rec(f("a", "int")), rec(f("a", "int")), True, True),
    (
        "add field with default",
        rec(f("a", "int")),
        rec(f("a", "int"), f("b", "string", default="x")),
        True,
        True,
    ),
    (
        "add field without default",
        rec(f("a", "int")),
        rec(f("a", "int"), f("b", "string")),
        False,
        True,
    ),
    (
        "remove field with default",
        rec(f("a", "int"), f("b", "string", default="x")),
        rec(f("a", "int")),
        True,
        True,
    ),
    (
        "remove field without default",
        rec(f("a", "int"), f("b", "string")),
        rec(f("a", "int")),
        True,
        False,
    ),
    (
        "add null default field",
        rec(f("a", "int")),
        rec(f("a", "int"), f("b", ["null", "string"], default=None)),
        True,
        True,
    ),
    ("promote int to long", rec(f("a", "int")), rec(f("a", "long")), True, False),
    ("promote int to float", rec(f("a", "int")), rec(f("a", "float")), True, False),
    ("promote int to double", rec(f("a", "int")), rec(f("a", "double")), True, False),
    ("promote long to float", rec(f("a", "long")), rec(f("a", "float")), True, False),
    ("promote long to double", rec(f("a", "long")), rec(f("a", "double")), True, False),
    ("promote float to double", rec(f("a", "float")), rec(f("a", "double")), True, False),
    ("demote long to int", rec(f("a", "long")), rec(f("a", "int")), False, True),
    ("string to bytes", rec(f("a", "string")), rec(f("a", "bytes")), True, True),
    ("bytes to string", rec(f("a", "bytes")), rec(f("a", "string")), True, True),
    ("string to int", rec(f("a", "string")), rec(f("a", "int")), False, False),
    ("boolean to int", rec(f("a", "boolean")), rec(f("a", "int")), False, False),
    (
        "enum adds symbol",
        rec(f("e", enum("A", "B"))),
        rec(f("e", enum("A", "B", "C"))),
        True,
        False,
    ),
    (
        "enum removes symbol",
        rec(f("e", enum("A", "B", "C"))),
        rec(f("e", enum("A", "B"))),
        False,
        True,
    ),
    (
        "enum removes symbol, new has default",
        rec(f("e", enum("A", "B", "C"))),
        rec(f("e", enum("A", "B", default="A"))),
        True,
        True,
    ),
    (
        "enum adds symbol, old has default",
        rec(f("e", enum("A", "B", default="A"))),
        rec(f("e", enum("A", "B", "C", default="A"))),
        True,
        True,
    ),
    (
        "enum renamed",
        rec(f("e", enum("A", name="E1"))),
        rec(f("e", enum("A", name="E2"))),
        False,
        False,
    ),
    ("enum to string", rec(f("e", enum("A"))), rec(f("e", "string")), False, False),
    ("fixed size changed", rec(f("h", fixed(16))), rec(f("h", fixed(8))), False, False),
    ("fixed renamed", rec(f("h", fixed(16, "F1"))), rec(f("h", fixed(16, "F2"))), False, False),
    (
        "fixed renamed with alias",
        rec(f("h", fixed(16, "F1"))),
        rec(f("h", fixed(16, "F2", aliases=["F1"]))),
        True,
        False,
    ),
    ("record renamed", rec(f("a", "int"), name="R1"), rec(f("a", "int"), name="R2"), False, False),
    (
        "record renamed with alias",
        rec(f("a", "int"), name="R1"),
        rec(f("a", "int"), name="R2", aliases=["R1"]),
        True,
        False,
    ),
    (
        "namespace changed",
        rec(f("a", "int"), name="R", namespace="a.b"),
        rec(f("a", "int"), name="R", namespace="c.d"),
        True,
        True,
    ),
    (
        "field renamed with alias",
        rec(f("a", "int")),
        rec(f("b", "int", aliases=["a"])),
        True,
        False,
    ),
    ("field renamed without alias", rec(f("a", "int")), rec(f("b", "int")), False, False),
    (
        "array items promoted",
        rec(f("xs", {"type": "array", "items": "int"})),
        rec(f("xs", {"type": "array", "items": "long"})),
        True,
        False,
    ),
    (
        "map values demoted",
        rec(f("m", {"type": "map", "values": "long"})),
        rec(f("m", {"type": "map", "values": "int"})),
        False,
        True,
    ),
    (
        "array to map",
        rec(f("x", {"type": "array", "items": "int"})),
        rec(f("x", {"type": "map", "values": "int"})),
        False,
        False,
    ),
    ("int to nullable int", rec(f("a", "int")), rec(f("a", ["null", "int"])), True, False),
    (
        "union adds branch",
        rec(f("a", ["null", "int"])),
        rec(f("a", ["null", "int", "string"])),
        True,
        False,
    ),
    (
        "union removes branch",
        rec(f("a", ["null", "int", "string"])),
        rec(f("a", ["null", "int"])),
        False,
        True,
    ),
    (
        "union reordered",
        rec(f("a", ["null", "string"], default=None)),
        rec(f("a", ["string", "null"], default="x")),
        True,
        True,
    ),
    (
        "writer int, reader union promotes",
        rec(f("a", "int")),
        rec(f("a", ["null", "long"])),
        True,
        False,
    ),
    (
        "writer union, reader single type reads every branch",
        rec(f("a", ["int", "long"])),
        rec(f("a", "double")),
        True,
        False,
    ),
    (
        "writer union, reader single type misses a branch",
        rec(f("a", ["null", "int"])),
        rec(f("a", "int")),
        False,
        True,
    ),
    (
        "logical date to int",
        rec(f("d", {"type": "int", "logicalType": "date"})),
        rec(f("d", "int")),
        True,
        True,
    ),
    (
        "logical timestamp-millis to int",
        rec(f("t", {"type": "long", "logicalType": "timestamp-millis"})),
        rec(f("t", "int")),
        False,
        True,
    ),
    (
        "logical decimal bytes to string",
        rec(f("x", {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2})),
        rec(f("x", "string")),
        True,
        True,
    ),
    (
        "recursive type adds defaulted field",
        node("int"),
        node("int", f("label", "string", default="")),
        True,
        True,
    ),
    ("recursive type demotes value", node("long"), node("int"), False, True),
    ("top-level primitive promotion", avro("int"), avro("long"), True, False),
    ("top-level union to primitive", avro(["null", "string"]), avro("string"), False, True),
    (
        "nested record field type changed",
        rec(f("inner", {"type": "record", "name": "In", "fields": [f("x", "int")]})),
        rec(f("inner", {"type": "record", "name": "In", "fields": [f("x", "string")]})),
        False,
        False,
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "backward", "forward"),
    [c[1:] for c in AVRO_CASES],
    ids=[c[0] for c in AVRO_CASES],
)
def test_avro_resolution_rules(old: str, new: str, backward: bool, forward: bool) -> None:
    assert ok("AVRO", new, old, "BACKWARD") is backward
    assert ok("AVRO", new, old, "FORWARD") is forward
    assert ok("AVRO", new, old, "FULL") is (backward and forward)
    assert ok("AVRO", new, old, "NONE")


def test_avro_case_table_is_large_enough() -> None:
    assert len(AVRO_CASES) >= 30


def test_avro_messages_name_the_rule_and_path() -> None:
    [msg] = messages(
        "AVRO",
        rec(f("a", "int"), f("b", "string"), f("c", "int")),
        rec(f("a", "int"), f("c", "int")),
        "BACKWARD",
    )
    assert msg.startswith("READER_FIELD_MISSING_DEFAULT_VALUE at /fields/1:")
    assert "'b'" in msg and "new schema" in msg and "[BACKWARD, existing schema #1]" in msg

    [msg] = messages("AVRO", rec(f("a", "string")), rec(f("a", "int")), "BACKWARD")
    assert msg.startswith("TYPE_MISMATCH at /fields/0/type:")

    [msg] = messages("AVRO", rec(f("e", enum("A"))), rec(f("e", enum("A", "B"))), "BACKWARD")
    assert msg.startswith("MISSING_ENUM_SYMBOLS at /fields/0/type/symbols:") and "'B'" in msg

    [msg] = messages("AVRO", rec(f("h", fixed(8))), rec(f("h", fixed(4))), "BACKWARD")
    assert msg.startswith("FIXED_SIZE_MISMATCH at /fields/0/type/size:")

    [msg] = messages("AVRO", rec(f("a", "int"), name="X"), rec(f("a", "int"), name="Y"), "BACKWARD")
    assert msg.startswith("NAME_MISMATCH at /name:")

    [msg] = messages("AVRO", rec(f("a", ["null", "int"])), rec(f("a", "string")), "BACKWARD")
    assert msg.startswith("MISSING_UNION_BRANCH at /fields/0/type:")

    [msg] = messages("AVRO", rec(f("a", "int")), rec(f("a", ["null", "int"])), "BACKWARD")
    assert msg.startswith("TYPE_MISMATCH at /fields/0/type/0:")  # the writer's null branch


def test_avro_forward_messages_swap_old_and_new() -> None:
    [msg] = messages("AVRO", rec(f("a", "int")), rec(f("a", "int"), f("b", "string")), "FORWARD")
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in msg
    assert "in the old schema has no default value and is missing in the new schema" in msg
    assert msg.endswith("[FORWARD, existing schema #1]")


def test_avro_reports_every_incompatibility() -> None:
    found = messages(
        "AVRO",
        rec(f("a", "string"), f("b", "int"), f("c", enum("X"))),
        rec(f("a", "int"), f("c", enum("X", "Y"))),
        "BACKWARD",
    )
    kinds = sorted(m.split(" ", 1)[0] for m in found)
    assert kinds == ["MISSING_ENUM_SYMBOLS", "READER_FIELD_MISSING_DEFAULT_VALUE", "TYPE_MISMATCH"]
    # each message keeps its own location and detail (the `avro` package merges them
    # into unordered sets: broker/registry/avro/compat.py's paired-details shim)
    paths = {m.split(":", 1)[0] for m in found}
    assert paths == {
        "TYPE_MISMATCH at /fields/0/type",
        "READER_FIELD_MISSING_DEFAULT_VALUE at /fields/1",
        "MISSING_ENUM_SYMBOLS at /fields/2/type/symbols",
    }
    assert any("'b'" in m and m.startswith("READER_FIELD") for m in found)
    assert any("'Y'" in m and m.startswith("MISSING_ENUM") for m in found)


def test_avro_namespaced_alias_matches_as_in_java() -> None:
    """Unqualified aliases are qualified with the namespace (Java's Schema.getAliases();
    the `avro` package compares them unqualified: broker/registry/avro/schema.py)."""
    old = rec(f("a", "int"), name="R1", namespace="acme")
    new = rec(f("a", "int"), name="R2", namespace="acme", aliases=["R1"])
    assert ok("AVRO", new, old, "BACKWARD")
    assert not ok("AVRO", new, old, "FORWARD")


def test_avro_missing_field_with_enum_default_follows_java() -> None:
    """A reader field absent from the writer, without a field default but whose enum has
    a default symbol: Java's SchemaCompatibility (so Confluent) compares the enum with
    the writer record, a type mismatch; the `avro` package does the same."""
    old = rec(f("a", "int"))
    new = rec(f("a", "int"), f("e", enum("A", "B", default="A")))
    [msg] = messages("AVRO", new, old, "BACKWARD")
    assert msg.startswith("TYPE_MISMATCH at /fields/1/type:")


def test_avro_named_type_reused_by_name_and_references() -> None:
    address = {
        "type": "record",
        "name": "Address",
        "namespace": "acme",
        "fields": [f("street", "string")],
    }
    old = rec(f("home", address), f("work", "acme.Address"), name="Person", namespace="acme")
    changed = json.loads(json.dumps(address))
    changed["fields"][0]["type"] = "int"
    new = rec(f("home", changed), f("work", "acme.Address"), name="Person", namespace="acme")
    found = messages("AVRO", new, old, "BACKWARD")
    assert [m.split(":")[0] for m in found] == ["TYPE_MISMATCH at /fields/0/type/fields/0/type"]

    refs_v1 = {"acme.Address": avro(address)}
    refs_v2 = {
        "acme.Address": avro({**address, "fields": [f("street", "string"), f("zip", "string")]})
    }
    person = rec(f("home", "Address"), name="Person", namespace="acme")
    assert check_compatibility("AVRO", person, [person], "FULL", refs_v1) == []
    assert check_compatibility("AVRO", person, [person], "FULL", refs_v2) == []
    with pytest.raises(InvalidSchemaError, match="Address"):
        check_compatibility("AVRO", person, [], "BACKWARD")


# -- levels and histories ----------------------------------------------------------------------


def test_backward_transitive_checks_every_version() -> None:
    v1 = rec(f("a", "int"))
    v2 = rec(f("a", "int"), f("b", "string", default="x"))
    v3 = rec(f("a", "int"), f("b", "string"))  # needs b: only v2 data has it
    assert ok("AVRO", v3, [v1, v2], "BACKWARD")
    found = messages("AVRO", v3, [v1, v2], "BACKWARD_TRANSITIVE")
    assert len(found) == 1 and found[0].endswith("[BACKWARD, existing schema #1]")
    assert not ok("AVRO", v3, [v1, v2], "FULL_TRANSITIVE")


def test_forward_transitive_checks_every_version() -> None:
    v1 = rec(f("a", "int"), f("b", "string"))
    v2 = rec(f("a", "int"), f("b", "string", default="x"))
    v3 = rec(f("a", "int"))  # v1 readers need b
    assert ok("AVRO", v3, [v1, v2], "FORWARD")
    found = messages("AVRO", v3, [v1, v2], "FORWARD_TRANSITIVE")
    assert len(found) == 1 and found[0].endswith("[FORWARD, existing schema #1]")
    assert ok("AVRO", v3, [v1, v2], "FULL")
    assert not ok("AVRO", v3, [v1, v2], "FULL_TRANSITIVE")


def test_transitive_only_matters_for_older_versions() -> None:
    v1 = rec(f("a", "int"))
    v2 = rec(f("a", "long"))
    v3 = rec(f("a", "int"))
    assert ok("AVRO", v3, [v1, v2], "FORWARD")  # v2 (long) reads v3 ints
    assert ok("AVRO", v3, [v1, v2], "FORWARD_TRANSITIVE")
    assert not ok("AVRO", v3, [v1, v2], "BACKWARD")  # v3 (int) cannot read v2 longs
    found = messages("AVRO", v3, [v1, v2], "FULL_TRANSITIVE")
    assert [m.rsplit("[", 1)[1] for m in found] == ["BACKWARD, existing schema #2]"]


def test_levels_none_and_empty_history() -> None:
    assert LEVELS == (
        "NONE",
        "BACKWARD",
        "BACKWARD_TRANSITIVE",
        "FORWARD",
        "FORWARD_TRANSITIVE",
        "FULL",
        "FULL_TRANSITIVE",
    )
    incompatible_pair = (rec(f("a", "string")), [rec(f("a", "int"))])
    assert check_compatibility("AVRO", *incompatible_pair, "NONE") == []
    for level in LEVELS:
        assert check_compatibility("AVRO", rec(f("a", "int")), [], level) == []
    assert check_compatibility("avro", *incompatible_pair, "backward")  # case-insensitive
    with pytest.raises(ValueError, match="Unknown compatibility level"):
        check_compatibility("AVRO", *incompatible_pair, "SIDEWAYS")
    with pytest.raises(InvalidSchemaError, match="Unknown schema type"):
        check_compatibility("XML", "<a/>", [], "NONE")


def test_new_schema_is_validated_even_at_level_none() -> None:
    with pytest.raises(InvalidSchemaError):
        check_compatibility("AVRO", "{", [], "NONE")


# -- JSON Schema ------------------------------------------------------------------------------


def obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> str:
    schema: dict[str, Any] = {"type": "object", "properties": props, **extra}
    if required:
        schema["required"] = required
    return json.dumps(schema)


INT, NUM, STR = {"type": "integer"}, {"type": "number"}, {"type": "string"}
CLOSED: dict[str, Any] = {"additionalProperties": False}

JSON_CASES: list[tuple[str, str, str, bool, bool]] = [
    ("identical", obj({"a": INT}), obj({"a": INT}), True, True),
    ("open model: add optional property", obj({"a": INT}), obj({"a": INT, "b": STR}), False, True),
    ("open model: remove property", obj({"a": INT, "b": STR}), obj({"a": INT}), True, False),
    (
        "open model: add property with empty schema",
        obj({"a": INT}),
        obj({"a": INT, "b": {}}),
        True,
        True,
    ),
    (
        "closed model: add optional property",
        obj({"a": INT}, **CLOSED),
        obj({"a": INT, "b": STR}, **CLOSED),
        True,
        False,
    ),
    (
        "closed model: remove property",
        obj({"a": INT, "b": STR}, **CLOSED),
        obj({"a": INT}, **CLOSED),
        False,
        True,
    ),
    (
        "closed model: add required property",
        obj({"a": INT}, **CLOSED),
        obj({"a": INT, "b": STR}, ["b"], **CLOSED),
        False,
        False,
    ),
    (
        "closed model: add required property with default",
        obj({"a": INT}, **CLOSED),
        obj({"a": INT, "b": {"type": "string", "default": ""}}, ["b"], **CLOSED),
        True,
        False,
    ),
    (
        "partially open: added property covered",
        obj({"a": INT}, additionalProperties=STR),
        obj({"a": INT, "b": STR}, additionalProperties=STR),
        True,
        True,
    ),
    (
        "partially open: added property not covered",
        obj({"a": INT}, additionalProperties=STR),
        obj({"a": INT, "b": INT}, additionalProperties=STR),
        False,
        False,
    ),
    ("existing property made required", obj({"a": INT}), obj({"a": INT}, ["a"]), False, True),
    ("integer widened to number", obj({"a": INT}), obj({"a": NUM}), True, False),
    ("string to integer", obj({"a": STR}), obj({"a": INT}), False, False),
    ("type made nullable", obj({"a": STR}), obj({"a": {"type": ["string", "null"]}}), True, False),
    (
        "nullable integer widened",
        obj({"a": {"type": ["integer", "null"]}}),
        obj({"a": {"type": ["number", "null"]}}),
        True,
        False,
    ),
    (
        "enum widened",
        obj({"c": {"enum": ["r", "g"]}}),
        obj({"c": {"enum": ["r", "g", "b"]}}),
        True,
        False,
    ),
    (
        "enum changed",
        obj({"c": {"enum": ["r", "g"]}}),
        obj({"c": {"enum": ["r", "b"]}}),
        False,
        False,
    ),
    (
        "maxLength lowered",
        obj({"s": {"type": "string", "maxLength": 10}}),
        obj({"s": {"type": "string", "maxLength": 5}}),
        False,
        True,
    ),
    ("minimum removed", obj({"n": {"type": "number", "minimum": 0}}), obj({"n": NUM}), True, False),
    (
        "array items widened",
        obj({"xs": {"type": "array", "items": INT}}),
        obj({"xs": {"type": "array", "items": NUM}}),
        True,
        False,
    ),
    ("additionalProperties closed", obj({"a": INT}), obj({"a": INT}, **CLOSED), False, True),
    (
        "anyOf gains a branch",
        json.dumps({"anyOf": [INT, STR]}),
        json.dumps({"anyOf": [INT, STR, {"type": "boolean"}]}),
        True,
        False,
    ),
    ("anything to object", json.dumps({}), obj({"a": INT}), False, True),
]


@pytest.mark.parametrize(
    ("old", "new", "backward", "forward"),
    [c[1:] for c in JSON_CASES],
    ids=[c[0] for c in JSON_CASES],
)
def test_json_schema_rules(old: str, new: str, backward: bool, forward: bool) -> None:
    assert ok("JSON", new, old, "BACKWARD") is backward
    assert ok("JSON", new, old, "FORWARD") is forward


def test_json_messages() -> None:
    [msg] = messages("JSON", obj({"a": INT, "b": STR}), obj({"a": INT}), "BACKWARD")
    assert msg.startswith("PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL at #/properties/b:")
    [msg] = messages("JSON", obj({"a": INT}, ["a"]), obj({"a": INT}), "BACKWARD")
    assert msg.startswith("REQUIRED_ATTRIBUTE_ADDED at #/required/a:")
    [msg] = messages("JSON", obj({"a": NUM}), obj({"a": INT}), "FORWARD")
    assert msg.startswith("TYPE_NARROWED at #/properties/a:")


def test_json_refs_definitions_references_and_recursion() -> None:
    def tree(value: dict[str, Any]) -> str:
        return json.dumps(
            {
                "$ref": "#/definitions/node",
                "definitions": {
                    "node": {
                        "type": "object",
                        "properties": {
                            "value": value,
                            "children": {"type": "array", "items": {"$ref": "#/definitions/node"}},
                        },
                    }
                },
            }
        )

    assert ok("JSON", tree(NUM), tree(INT), "BACKWARD")
    [msg] = messages("JSON", tree(INT), tree(NUM), "BACKWARD")
    assert msg.startswith("TYPE_NARROWED at #/properties/value:")

    main = json.dumps({"type": "object", "properties": {"addr": {"$ref": "address.json"}}})
    v1 = {"address.json": obj({"street": STR}, **CLOSED)}
    v2 = {"address.json": obj({"street": STR, "zip": STR}, **CLOSED)}
    assert check_compatibility("JSON", main, [main], "FULL", v1) == []
    with pytest.raises(InvalidSchemaError, match="address.json"):
        check_compatibility("JSON", main, [], "NONE")
    assert parse_schema("JSON", main, v2) is not None


def test_json_refs_by_id_anchor_and_reference_name() -> None:
    """$ref resolution with `referencing`, and the two shims of jsonschema/document.py."""
    addr_v1 = {"address.json": obj({"street": STR}, **CLOSED)}
    addr_v2 = {"address.json": obj({"street": INT}, **CLOSED)}
    # relative to the main document's $id, then by the reference's name
    by_id = json.dumps(
        {
            "$id": "https://example.com/schemas/person.json",
            "type": "object",
            "properties": {"addr": {"$ref": "address.json"}},
        }
    )
    assert check_compatibility("JSON", by_id, [by_id], "FULL", addr_v1) == []
    # shim: an unregistered URI matched to a reference by its last segment
    by_url = json.dumps(
        {"type": "object", "properties": {"addr": {"$ref": "https://other.org/x/address.json"}}}
    )
    assert parse_schema("JSON", by_url, addr_v2) is not None
    # a 2020-12 $anchor and $defs, as `referencing` reads them
    anchored = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": {"n": {"$anchor": "num", "type": "integer"}},
        "type": "object",
        "properties": {"a": {"$ref": "#num"}},
    }
    widened = {**anchored, "$defs": {"n": {"$anchor": "num", "type": "number"}}}
    assert ok("JSON", json.dumps(widened), json.dumps(anchored), "BACKWARD")
    [msg] = messages("JSON", json.dumps(anchored), json.dumps(widened), "BACKWARD")
    assert msg.startswith("TYPE_NARROWED at #/properties/a:")
    # shim: a draft-07 style "$id": "#name" anchor under a key no dialect crawls
    loose = {"type": "object", "properties": {"a": {"$ref": "#num"}}}
    loose["extra"] = {"n": {"$id": "#num", "type": "integer"}}
    assert parse_schema("JSON", json.dumps(loose)) is not None
    with pytest.raises(InvalidSchemaError, match="does not resolve"):
        parse_schema("JSON", json.dumps({**loose, "extra": {}}))


# -- Protobuf ---------------------------------------------------------------------------------


def proto(body: str, package: str = "acme", syntax: str = "proto3") -> str:
    return f'syntax = "{syntax}";\npackage {package};\n{body}\n'


PROTO_BASE = proto("message Order { string id = 1; int32 qty = 2; }")

PROTO_CASES: list[tuple[str, str, str, bool, bool]] = [
    ("identical", PROTO_BASE, PROTO_BASE, True, True),
    (
        "add field",
        PROTO_BASE,
        proto("message Order { string id = 1; int32 qty = 2; bool x = 3; }"),
        True,
        True,
    ),
    ("remove field", PROTO_BASE, proto("message Order { string id = 1; }"), True, True),
    (
        "proto3 optional added",
        PROTO_BASE,
        proto("message Order { string id = 1; int32 qty = 2; optional string note = 3; }"),
        True,
        True,
    ),
    (
        "scalar type changed",
        PROTO_BASE,
        proto("message Order { string id = 1; string qty = 2; }"),
        False,
        False,
    ),
    (
        "wire-compatible scalar change",
        PROTO_BASE,
        proto("message Order { string id = 1; int64 qty = 2; }"),
        True,
        True,
    ),
    (
        "field renamed",
        PROTO_BASE,
        proto("message Order { string id = 1; int32 count = 2; }"),
        False,
        False,
    ),
    (
        "field renumbered",
        PROTO_BASE,
        proto("message Order { string id = 1; int32 qty = 3; }"),
        False,
        False,
    ),
    (
        "repeated to singular",
        proto("message Order { repeated int32 qty = 1; }"),
        proto("message Order { int32 qty = 1; }"),
        False,
        False,
    ),
    (
        "singular to repeated string",
        proto("message Order { string id = 1; }"),
        proto("message Order { repeated string id = 1; }"),
        False,
        False,
    ),
    (
        "message removed",
        proto("message A { int32 x = 1; }\nmessage B { int32 y = 1; }"),
        proto("message A { int32 x = 1; }"),
        False,
        True,
    ),
    (
        "message added",
        proto("message A { int32 x = 1; }"),
        proto("message A { int32 x = 1; }\nmessage B { int32 y = 1; }"),
        True,
        False,
    ),
    (
        "package changed",
        PROTO_BASE,
        proto("message Order { string id = 1; int32 qty = 2; }", package="other"),
        False,
        False,
    ),
    (
        "scalar to message",
        proto("message A { int32 x = 1; }\nmessage M { int32 v = 1; }"),
        proto("message A { M x = 1; }\nmessage M { int32 v = 1; }"),
        False,
        False,
    ),
    (
        "message type switched",
        proto("message A { M x = 1; }\nmessage M {}\nmessage N {}"),
        proto("message A { N x = 1; }\nmessage M {}\nmessage N {}"),
        False,
        False,
    ),
    (
        "enum and int32 are both varints",
        proto("message A { int32 s = 1; }\nenum S { S0 = 0; }"),
        proto("message A { S s = 1; }\nenum S { S0 = 0; }"),
        True,
        True,
    ),
    (
        "enum value added",
        proto("message A { S s = 1; }\nenum S { S0 = 0; }"),
        proto("message A { S s = 1; }\nenum S { S0 = 0; S1 = 1; }"),
        True,
        True,
    ),
    (
        "required field added (proto2)",
        proto("message A { optional int32 x = 1; }", syntax="proto2"),
        proto("message A { optional int32 x = 1; required int32 y = 2; }", syntax="proto2"),
        False,
        False,
    ),
    (
        "two fields moved into one oneof",
        proto("message A { int32 x = 1; int32 y = 2; }"),
        proto("message A { oneof o { int32 x = 1; int32 y = 2; } }"),
        False,
        True,
    ),
    (
        "one field moved into a new oneof",
        proto("message A { int32 x = 1; }"),
        proto("message A { oneof o { int32 x = 1; } }"),
        True,
        True,
    ),
    (
        "nested message field type changed",
        proto("message A { message In { int32 v = 1; } In in = 1; }"),
        proto("message A { message In { string v = 1; } In in = 1; }"),
        False,
        False,
    ),
    (
        "map value type changed",
        proto("message A { map<string, int32> m = 1; }"),
        proto("message A { map<string, string> m = 1; }"),
        False,
        False,
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "backward", "forward"),
    [c[1:] for c in PROTO_CASES],
    ids=[c[0] for c in PROTO_CASES],
)
def test_protobuf_rules(old: str, new: str, backward: bool, forward: bool) -> None:
    assert ok("PROTOBUF", new, old, "BACKWARD") is backward
    assert ok("PROTOBUF", new, old, "FORWARD") is forward


def test_protobuf_removed_number_reused_with_another_type() -> None:
    v1 = proto("message A { int32 a = 1; string keep = 2; }")
    v2 = proto("message A { string keep = 2; }")
    v3 = proto("message A { string b = 1; string keep = 2; }")
    assert ok("PROTOBUF", v3, [v1, v2], "FULL")
    found = messages("PROTOBUF", v3, [v1, v2], "BACKWARD_TRANSITIVE")
    kinds = {m.split(" ", 1)[0] for m in found}
    assert kinds == {"FIELD_NAME_CHANGED", "FIELD_SCALAR_KIND_CHANGED"}
    assert all(m.endswith("existing schema #1]") for m in found)


def test_protobuf_messages() -> None:
    [msg] = messages(
        "PROTOBUF",
        proto("message Order { string id = 1; string qty = 2; }"),
        PROTO_BASE,
        "BACKWARD",
    )
    assert msg.startswith("FIELD_SCALAR_KIND_CHANGED at #/Order/2:")
    [msg] = messages(
        "PROTOBUF", proto("message A {}"), proto("message A {}\nmessage Gone {}"), "BACKWARD"
    )
    assert msg.startswith("MESSAGE_REMOVED at #/Gone:")


def test_protobuf_serialized_form_equals_text_form() -> None:
    text = proto("""
        import "google/protobuf/timestamp.proto";
        message Order {
          string id = 1;
          map<string, Line> lines = 2;
          message Line { string sku = 1; int32 qty = 2; }
          optional int64 total = 3;
          oneof payment { string card = 4; string voucher = 5; }
          google.protobuf.Timestamp created = 6;
          Status status = 7;
          enum Status { UNKNOWN = 0; PAID = 1; }
        }""")
    fdp = to_descriptor(parse_proto(text), "order.proto")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(timestamp_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(fdp)  # the descriptor is well-formed enough for protobuf to build classes from
    order_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Order"))
    order = order_cls(id="1", total=3, card="c")
    order.lines["a"].qty = 2
    assert order_cls.FromString(order.SerializeToString()) == order

    # What confluent_kafka's ProtobufSerializer registers: base64 of the file descriptor.
    from confluent_kafka.schema_registry.common.protobuf import _schema_to_str

    sent = _schema_to_str(order_cls.DESCRIPTOR.file)
    assert is_serialized_descriptor(sent) and not is_serialized_descriptor(text)
    assert to_descriptor(parse_proto(sent), "order.proto") == fdp
    assert check_compatibility("PROTOBUF", sent, [text], "FULL_TRANSITIVE") == []
    assert check_compatibility("PROTOBUF", text, [sent], "FULL_TRANSITIVE") == []
    # and the text rendered from it parses back to the same descriptor
    assert to_descriptor(parse_proto(render_proto(parse_proto(sent))), "order.proto") == fdp


def test_map_entries_keep_their_position_among_nested_types() -> None:
    """Message indexes on the wire count nested types, map entries included."""
    text = proto("message A { message B {} map<string, int32> m = 1; message C {} B b = 2; }")
    fdp = to_descriptor(parse_proto(text))
    assert [n.name for n in fdp.message_type[0].nested_type] == ["B", "MEntry", "C"]
    again = to_descriptor(parse_proto(render_proto(parse_proto(text))))
    assert again == fdp


@pytest.mark.parametrize(
    "module_name",
    [
        "google.protobuf.descriptor_pb2",
        "google.protobuf.struct_pb2",
        "google.protobuf.type_pb2",
        "google.protobuf.api_pb2",
        "confluent_kafka.schema_registry.confluent.meta_pb2",
    ],
)
def test_parse_real_descriptors_and_their_rendered_text(module_name: str) -> None:
    serialized = importlib.import_module(module_name).DESCRIPTOR.serialized_pb
    sent = base64.standard_b64encode(serialized).decode()
    from_b64 = parse_proto(sent)
    from_text = parse_proto(render_proto(from_b64))
    assert check_compatibility("PROTOBUF", render_proto(from_b64), [sent], "FULL") == []
    assert [m.full_name for m in from_text.all_messages()] == [
        m.full_name for m in from_b64.all_messages()
    ]
    original = descriptor_pb2.FileDescriptorProto.FromString(serialized)
    from_b64.dependencies.clear()
    assert from_descriptor(to_descriptor(from_text, original.name)) == from_b64


def test_proto_parser_accepts_the_full_grammar() -> None:
    text = """
    // comment
    syntax = "proto2";
    package a.b;
    import public "other.proto";
    option java_package = "x.y";
    option (custom.opt).field = { nested: { v: 1 } list: [1, 2] };
    message M {
      option (custom.flag) = true;
      extensions 100 to max;
      reserved 5, 8 to 9;
      reserved "old";
      optional int32 a = 1 [default = -3, deprecated = true];
      required string s = 2 [default = "x\\"y"];
      repeated group Item = 3 { optional int32 v = 1; }
      oneof choice { int32 c1 = 4; string c2 = 6; }
      map<int64, M> children = 7;
      extend M { optional int32 ext = 100; }
      enum E { option allow_alias = true; A = 0; B = 1; C = 1; reserved 10 to max; }
      ;
    }
    extend M { optional string top_ext = 101; }
    service S { rpc Call (M) returns (stream M) { option deprecated = true; } }
    """
    other = """
    syntax = "proto2";
    package custom;
    import "google/protobuf/descriptor.proto";
    message V { optional int32 v = 1; }
    message Inner { optional V nested = 1; repeated int32 list = 2; }
    message Opt { optional Inner field = 1; }
    extend google.protobuf.FileOptions { optional Opt opt = 50000; }
    extend google.protobuf.MessageOptions { optional bool flag = 50001; }
    """
    pf = parse_proto(text, {"other.proto": other})
    assert pf.options["(custom.opt)"] == "{ field { nested { v: 1 } list: 1 list: 2 } }"
    assert pf.messages[0].options["(custom.flag)"] == "true"
    assert "option (custom.opt) = { field { nested { v: 1 } list: 1 list: 2 } };" in render_proto(
        pf
    )
    m = pf.messages[0]
    assert [(x.name, x.number, x.label) for x in m.fields] == [
        ("a", 1, "optional"),
        ("s", 2, "required"),
        ("item", 3, "repeated"),
        ("c1", 4, None),
        ("c2", 6, None),
        ("children", 7, None),
    ]
    assert m.fields[0].default == "-3" and m.fields[1].default == 'x"y'
    assert m.oneofs == ["choice"] and m.reserved_numbers == [(5, 5), (8, 9)]
    assert pf.services[0].methods[0].server_streaming
    assert (
        parse_proto('edition = "2023"; package e; message M { int32 x = 1; }').syntax == "editions"
    )


INVALID_PROTOS = [  # protoc's messages, located in the schema (line:column)
    ('syntax = "proto3"; message M { int32 x = 1 }', 'line 1:44: Expected ";".'),
    ('syntax = "proto3"; message M { Unknown x = 1; }', 'line 1:32: "Unknown" is not defined.'),
    ('syntax = "proto3"; message M { int32 x = 1; int32 y = 1; }', "has already been used"),
    ('syntax = "proto3"; message M { int32 x = 0; }', "must be positive integers"),
    ('syntax = "proto3"; message M { int32 x = 19000; }', "reserved for the protobuf"),
    ('syntax = "proto3"; message M { reserved 2; int32 x = 2; }', "uses reserved number 2"),
    ('syntax = "proto3"; message M { required int32 x = 1; }', "not allowed in proto3"),
    ('syntax = "proto3"; enum E { A = 1; }', "first enum value must be zero"),
    ('syntax = "proto3"; enum E { A = 0; B = 0; }', "allow_alias"),
    ('syntax = "proto4"; message M {}', 'Unrecognized syntax identifier "proto4"'),
    ('syntax = "proto2"; message M { int32 x = 1; }', 'Expected "required", "optional"'),
    ('syntax = "proto3"; message M { int32 x = 1;', "missing '}'"),
    ('syntax = "proto3"; message M { int32 x = 1; } @', "line 1:47: Expected top-level"),
    ('syntax = "proto3"; import "missing.proto";', 'Import "missing.proto" was not found'),
    ('syntax = "proto3"; message M { string s = 1 [(nope) = 1]; }', 'Option "(nope)" unknown'),
    ("Zm9vYmFy", "neither .proto text nor a base64 FileDescriptorProto"),
]


@pytest.mark.parametrize(("text", "error"), INVALID_PROTOS)
def test_invalid_protobuf(text: str, error: str) -> None:
    with pytest.raises(InvalidSchemaError, match="Invalid Protobuf schema") as info:
        parse_proto(text)
    assert error in str(info.value)


# -- invalid schemas ---------------------------------------------------------------------------

INVALID_AVRO = [
    ("{", "not valid JSON"),
    ('"Nope"', "unknown type 'Nope'"),
    (avro({"type": "record", "name": "R"}), "fields"),
    (rec(f("a", "int"), f("a", "long")), "Field name a already in use"),
    (rec(f("a", "int", default="x")), "Default value <x> must match schema type: int"),
    (rec(f("a", ["null", "int"], default="x")), "Default value <x> must match a schema in union"),
    (
        rec(f("a", {"type": "array", "items": "int"}, default=["x"])),
        "default value [\"x\"] of field 'a' at /fields/0 does not match its type array",
    ),
    (avro(enum("A", "A")), "unique"),
    (avro({"type": "fixed", "name": "F"}), "size"),
    (rec(f("a", "int"), name="1bad"), "1bad"),
    (avro(["null", ["int"]]), "Unions cannot contain other unions"),
    (avro(["int", "int"]), "int type already in Union"),
    (avro({"type": "array"}), "items"),
]


@pytest.mark.parametrize(("text", "error"), INVALID_AVRO)
def test_invalid_avro(text: str, error: str) -> None:
    with pytest.raises(InvalidSchemaError, match="Invalid Avro schema") as info:
        check_compatibility("AVRO", text, [], "NONE")
    assert error in str(info.value)


INVALID_JSON = [
    ("{", "not valid JSON"),
    ("[1, 2]", "must be a JSON object or boolean"),
    (json.dumps({"type": "strin"}), "Invalid JSON schema at #/type"),
    (json.dumps({"type": "object", "properties": 1}), "Invalid JSON schema at #/properties"),
    (json.dumps({"minLength": -1}), "Invalid JSON schema at #/minLength"),
    (json.dumps({"$ref": "#/definitions/missing"}), "does not resolve"),
]


@pytest.mark.parametrize(("text", "error"), INVALID_JSON)
def test_invalid_json_schema(text: str, error: str) -> None:
    with pytest.raises(InvalidSchemaError, match="Invalid JSON schema") as info:
        check_compatibility("JSON", text, [], "NONE")
    assert error in str(info.value)


def test_invalid_schema_error_is_a_value_error_shared_by_all_modules() -> None:
    assert InvalidSchemaError is SharedInvalidSchemaError
    assert issubclass(InvalidSchemaError, ValueError)
    with pytest.raises(InvalidSchemaError, match="existing schema #1"):
        check_compatibility("AVRO", rec(f("a", "int")), ["{"], "BACKWARD")


def test_proto2_groups_defaults_and_oneof_groups_round_trip() -> None:
    text = """syntax = "proto2"; package a.b;
    message M {
      message Before { optional int32 z = 1; }
      repeated group Item = 3 { optional int32 v = 1; }
      optional string s = 4 [default = "q\\"x"];
      optional E e = 5 [default = B];
      oneof o { int32 c = 6; group Og = 7 { optional int32 w = 1; } }
      map<string, Before> mm = 8;
      enum E { A = 0; B = 1; }
    }"""
    fdp = to_descriptor(parse_proto(text), "m.proto")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    m_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("a.b.M"))
    assert (m_cls().s, m_cls().e) == ('q"x', 1)
    assert [n.name for n in fdp.message_type[0].nested_type] == ["Before", "Item", "Og", "MmEntry"]
    rendered = render_proto(from_descriptor(fdp))
    assert to_descriptor(parse_proto(rendered), "m.proto") == fdp


def test_protobuf_confluent_meta_options_survive_canonical_text() -> None:
    """confluent/meta.proto needs no reference; its custom options stay in the canonical
    text (read back from protoc's descriptor with the pool it was compiled into)."""
    text = proto(
        'import "confluent/meta.proto";\n'
        'message Order { string id = 1 [(confluent.field_meta) = { doc: "the id" }]; }'
    )
    rendered = render_proto(parse_proto(text))
    assert '[(confluent.field_meta) = { doc: "the id" }]' in rendered
    assert render_proto(parse_proto(rendered)) == rendered
    assert check_compatibility("PROTOBUF", rendered, [text], "FULL") == []
