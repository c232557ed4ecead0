"""The C validator (broker._gate) and its Avro programs (broker.avro_program).

The reference is fastavro: a value is valid when ``schemaless_reader`` reads it
without an error *and* consumes all of its bytes. The validator must refuse
every value fastavro refuses, and accept every value fastavro accepts except
where it is deliberately stricter (``STRICTER``). Values it defers (uuid strings
that are not plain hex...) get fastavro's verdict, as the gate does.
"""

from __future__ import annotations

import datetime
import decimal
import io
import re
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import avro_program
from broker.gate import DataQualityGate, GateRejection
from broker.kafka import records

_gate = pytest.importorskip("broker._gate")

# What the validator refuses although fastavro reads it.
STRICTER = re.compile(
    r"boolean byte is \d+, not 0 or 1"
    r"|outside the 32-bit int range"
    r"|varint is longer than 10 bytes"
    r"|(enum|union) index -\d+ is outside"
    r"|nested deeper than \d+ levels"
    r"|zero-byte items"
    r"|block count -9223372036854775808 is out of range"
)

UTC = datetime.UTC
LINKED = {
    "type": "record",
    "name": "Node",
    "fields": [{"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}],
}
TREE = {
    "type": "record",
    "name": "Tree",
    "namespace": "t",
    "fields": [
        {"name": "label", "type": "string"},
        {"name": "kids", "type": {"type": "array", "items": "Tree"}},
    ],
}
COLOR = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}
MD5 = {"type": "fixed", "name": "MD5", "size": 4}
INNER = {
    "type": "record",
    "name": "Inner",
    "fields": [{"name": "s", "type": "string"}, {"name": "flag", "type": "boolean"}],
}
KITCHEN = {
    "type": "record",
    "name": "Kitchen",
    "namespace": "k",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "n", "type": "int"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "raw", "type": "bytes"},
        {"name": "inner", "type": INNER},
        {"name": "again", "type": "Inner"},
        {"name": "color", "type": COLOR},
        {"name": "hash", "type": MD5},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "maybe", "type": ["null", "string", "long", "Inner"]},
        {
            "name": "nested",
            "type": {"type": "array", "items": {"type": "map", "values": ["null", "int"]}},
        },
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}

INNER_VALUE = {"s": "in", "flag": True}
KITCHEN_VALUE = {
    "id": 2**40,
    "n": -7,
    "f": 1.5,
    "d": -2.25,
    "raw": b"\x00\xff",
    "inner": INNER_VALUE,
    "again": {"s": "ünï", "flag": False},
    "color": "BLUE",
    "hash": b"abcd",
    "tags": ["a", "βγ"],
    "counts": {"x": 1, "y": -1},
    "maybe": {"s": "u", "flag": True},
    "nested": [{"a": None, "b": 3}, {}],
    "day": datetime.date(2024, 2, 29),
    "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=UTC),
    "amount": decimal.Decimal("-12.34"),
    "uid": str(uuid.UUID(int=12345)),
}

# (schema, values fastavro can write)
CASES: list[tuple[Any, list[Any]]] = [
    ("null", [None]),
    ("boolean", [True, False]),
    ("int", [0, -1, 1, 2**31 - 1, -(2**31)]),
    ("long", [0, -1, 2**63 - 1, -(2**63)]),
    ("float", [1.5, float("inf")]),
    ("double", [-2.25]),
    ("bytes", [b"", b"\x00\xff" * 5]),
    ("string", ["", "héllo ✓ 𝄞", "x" * 40]),
    (INNER, [INNER_VALUE]),
    (
        {
            "type": "record",
            "name": "Outer",
            "fields": [
                {"name": "id", "type": "long"},
                {"name": "inner", "type": INNER},
                {"name": "again", "type": "Inner"},
            ],
        },
        [{"id": 5, "inner": INNER_VALUE, "again": {"s": "", "flag": False}}],
    ),
    ({"type": "array", "items": "int"}, [[], [1, -2, 3]]),
    ({"type": "array", "items": {"type": "array", "items": "string"}}, [[["a"], [], ["b", "c"]]]),
    ({"type": "array", "items": INNER}, [[INNER_VALUE, INNER_VALUE]]),
    ({"type": "map", "values": "long"}, [{}, {"a": 1, "ü": -3}]),
    ({"type": "map", "values": ["null", "string"]}, [{"a": None, "b": "x"}]),
    ({"type": "map", "values": {"type": "array", "items": "double"}}, [{"k": [1.0, 2.0]}]),
    (["null", "string", "long"], [None, "s", 7]),
    (["null", INNER, "double"], [None, INNER_VALUE, 0.5]),
    (COLOR, ["RED", "BLUE"]),
    (MD5, [b"\x01\x02\x03\x04"]),
    (LINKED, [{"v": 1, "next": None}, {"v": 1, "next": {"v": 2, "next": {"v": 3, "next": None}}}]),
    (
        TREE,
        [
            {
                "label": "root",
                "kids": [
                    {"label": "a", "kids": []},
                    {"label": "b", "kids": [{"label": "c", "kids": []}]},
                ],
            }
        ],
    ),
    (
        {
            "type": "record",
            "name": "A",
            "namespace": "x.y",
            "fields": [
                {
                    "name": "b",
                    "type": {
                        "type": "record",
                        "name": "B",
                        "fields": [{"name": "i", "type": "int"}],
                    },
                },
                {"name": "b2", "type": "B"},
                {"name": "b3", "type": "x.y.B"},
            ],
        },
        [{"b": {"i": 1}, "b2": {"i": 2}, "b3": {"i": 3}}],
    ),
    (
        {"type": "int", "logicalType": "date"},
        [datetime.date(1970, 1, 1), datetime.date(1, 1, 1), datetime.date(9999, 12, 31)],
    ),
    ({"type": "int", "logicalType": "time-millis"}, [datetime.time(23, 59, 59, 999000)]),
    ({"type": "long", "logicalType": "time-micros"}, [datetime.time(12, 0, 0, 1)]),
    (
        {"type": "long", "logicalType": "timestamp-millis"},
        [datetime.datetime(2024, 1, 2, tzinfo=UTC)],
    ),
    ({"type": "long", "logicalType": "timestamp-micros"}, [datetime.datetime(1, 1, 1, tzinfo=UTC)]),
    ({"type": "long", "logicalType": "local-timestamp-millis"}, [datetime.datetime(2024, 1, 2)]),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, [datetime.datetime(9999, 12, 31)]),
    ({"type": "string", "logicalType": "uuid"}, [str(uuid.UUID(int=2**128 - 1))]),
    (
        {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        [decimal.Decimal("12.34")],
    ),
    (
        {
            "type": "fixed",
            "name": "Dec",
            "size": 8,
            "logicalType": "decimal",
            "precision": 18,
            "scale": 4,
        },
        [decimal.Decimal("-1.2345")],
    ),
    ({"type": "string", "logicalType": "something-else"}, ["kept as a string"]),
    (
        {
            "type": "record",
            "name": "Ev",
            "fields": [
                {
                    "name": "at",
                    "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
                }
            ],
        },
        [{"at": None}, {"at": 0}],
    ),
    (KITCHEN, [KITCHEN_VALUE]),
]
FUZZ = [(parse_schema(s), avro_program.compile_schema(s), v) for s, vs in CASES for v in vs]
FUZZ_ENCODED = [(parsed, program, i) for i, (parsed, program, _) in enumerate(FUZZ)]


def encode(parsed: Any, value: Any) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, parsed, value)
    return buf.getvalue()


ENCODED = [encode(parsed, value) for parsed, _, value in FUZZ]


def fastavro_ok(parsed: Any, data: bytes) -> bool:
    stream = io.BytesIO(data)
    try:
        schemaless_reader(stream, parsed, None)
    except Exception:  # noqa: BLE001 - any failure is a refusal
        return False
    return stream.tell() == len(data)


def verdict(program: bytes, parsed: Any, data: bytes) -> tuple[bool, str | None]:
    """The gate's verdict: the validator's, or fastavro's for a value it defers."""
    problem, deferred = _gate.validate(program, data)
    if problem is None and deferred:
        return fastavro_ok(parsed, data), None
    return problem is None, problem


def assert_agrees(program: bytes, parsed: Any, data: bytes) -> None:
    ok, problem = verdict(program, parsed, data)
    reference = fastavro_ok(parsed, data)
    if reference and not ok:
        assert problem is not None and STRICTER.search(problem), (data, problem)
    if not reference:
        assert not ok, f"fastavro refuses {data!r}, the validator accepts it"


# ---------------------------------------------------------------- the program table


@pytest.mark.parametrize("case", range(len(FUZZ)))
def test_valid_values_pass_and_truncations_and_extensions_fail(case: int) -> None:
    parsed, program, _ = FUZZ[case]
    data = ENCODED[case]
    assert verdict(program, parsed, data) == (True, None)
    for cut in range(len(data)):
        assert_agrees(program, parsed, data[:cut])
    for extra in (b"\x00", b"\x02x", b"\xff" * 3):
        problem, _ = _gate.validate(program, data + extra)
        assert problem == f"{len(extra)} bytes left over"


def mutate(data: bytes, draw: Any) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["replace", "insert", "delete", "bits"]))
        pos = draw(st.integers(0, len(out)))
        if kind == "insert" or not out:
            out[pos:pos] = bytes([draw(st.integers(0, 255))])
        elif kind == "delete":
            del out[min(pos, len(out) - 1)]
        elif kind == "replace":
            out[min(pos, len(out) - 1)] = draw(st.integers(0, 255))
        else:
            out[min(pos, len(out) - 1)] ^= 1 << draw(st.integers(0, 7))
    return bytes(out)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_values_get_fastavros_verdict(data: st.DataObject) -> None:
    parsed, program, i = data.draw(st.sampled_from(FUZZ_ENCODED))
    assert_agrees(program, parsed, mutate(ENCODED[i], data.draw))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FUZZ_ENCODED), st.binary(max_size=40))
def test_random_bytes_get_fastavros_verdict(case: tuple[Any, bytes, int], blob: bytes) -> None:
    parsed, program, _ = case
    assert_agrees(program, parsed, blob)


def zz(n: int) -> bytes:
    raw = ((n << 1) ^ (n >> 63)) & (2**64 - 1)
    out = bytearray()
    while raw > 0x7F:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    return bytes(out + bytes([raw]))


STRING_PROGRAM = avro_program.compile_schema("string")


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=80), st.text(max_size=40).map(str.encode)), st.data())
def test_strings_are_utf8_exactly_as_python_decodes_it(raw: bytes, data: st.DataObject) -> None:
    if raw and data.draw(st.booleans()):
        raw = mutate(raw, data.draw)
    try:
        raw.decode("utf-8")  # what fastavro does (handle_unicode_errors="strict")
        expected = None
    except UnicodeDecodeError as exc:
        expected = f"string is not valid UTF-8 at byte {len(zz(len(raw))) + exc.start}"
    problem, _ = _gate.validate(STRING_PROGRAM, zz(len(raw)) + raw)
    assert problem == expected


@pytest.mark.parametrize(
    "logical, kind",
    [
        ("date", "int"),
        ("time-millis", "int"),
        ("time-micros", "long"),
        ("timestamp-millis", "long"),
        ("timestamp-micros", "long"),
        ("local-timestamp-millis", "long"),
        ("local-timestamp-micros", "long"),
    ],
)
def test_logical_ranges_match_fastavros_conversions(logical: str, kind: str) -> None:
    schema = {"type": kind, "logicalType": logical}
    parsed, program = parse_schema(schema), avro_program.compile_schema(schema)
    edges: list[int] = [0, 1, -1, 2**31 - 1, -(2**31), 2**62, -(2**62), 2**63 - 1, -(2**63)]
    for ranges in (avro_program._INT_RANGES, avro_program._LONG_RANGES):
        for lo, hi in ranges.values():
            edges += [lo - 1, lo, lo + 1, hi - 1, hi, hi + 1]
    for n in edges:
        if -(2**63) <= n < 2**63:
            assert_agrees(program, parsed, zz(n))
            if -(2**31) <= n < 2**31 or kind == "long":
                ok, _ = verdict(program, parsed, zz(n))
                assert ok == fastavro_ok(parsed, zz(n)), n


@pytest.mark.parametrize(
    "text, accepted",
    [
        ("12345678-1234-5678-1234-567812345678", True),
        ("12345678123456781234567812345678", True),
        ("{12345678-1234-5678-1234-567812345678}", True),  # deferred: uuid.UUID accepts it
        ("urn:uuid:12345678-1234-5678-1234-567812345678", True),
        ("12345678-1234-5678-1234-56781234567", False),
        ("not a uuid", False),
        ("", False),
    ],
)
def test_uuid_strings_get_uuid_uuids_verdict(text: str, accepted: bool) -> None:
    schema = {"type": "string", "logicalType": "uuid"}
    parsed, program = parse_schema(schema), avro_program.compile_schema(schema)
    data = zz(len(text.encode())) + text.encode()
    assert verdict(program, parsed, data)[0] is accepted is fastavro_ok(parsed, data)


def test_decimals_fastavro_cannot_convert_are_deferred() -> None:
    big = b"\x7f" + b"\xff" * 2000
    schema = {"type": "bytes", "logicalType": "decimal", "precision": 4}
    program = avro_program.compile_schema(schema)
    assert _gate.validate(program, zz(2) + b"\x01\x02") == (None, False)
    assert _gate.validate(program, zz(len(big)) + big) == (None, True)
    odd = {"type": "fixed", "name": "D", "size": 2, "logicalType": "decimal", "precision": 0}
    assert _gate.validate(avro_program.compile_schema(odd), b"\x00\x01") == (None, True)


@pytest.mark.parametrize(
    "schema, data, message",
    [
        ("boolean", b"\x02", "boolean byte is 2, not 0 or 1, at byte 0"),
        ("int", zz(2**31), "int is outside the 32-bit int range at byte 0"),
        ("long", b"\xff" * 10 + b"\x01", "long varint is longer than 10 bytes at byte 0"),
        (COLOR, zz(-1), "enum index -1 is outside [0, 3) at byte 0"),
        (COLOR, zz(3), "enum index 3 is outside [0, 3) at byte 0"),
        (["null", "int"], zz(-1) + b"\x02", "union index -1 is outside [0, 2) at byte 0"),
        ("string", zz(-1), "string length -1 is negative at byte 0"),
        ("string", zz(5) + b"abc", "string length runs past the end at byte 0"),
        ("string", zz(3) + b"a\xed\xa0", "string is not valid UTF-8 at byte 2"),
        ("string", zz(2) + b"\xc0\x80", "string is not valid UTF-8 at byte 1"),  # overlong NUL
        (
            {"type": "map", "values": "int"},
            zz(1) + zz(1) + b"\xff\x00\x00",
            "map key is not valid UTF-8 at byte 2",
        ),
        (
            {"type": "array", "items": "long"},
            zz(5) + b"\x00",
            "array block count 5 exceeds the 1 bytes left at byte 0",
        ),
        (
            {"type": "array", "items": "null"},
            zz(2_000_000) + b"\x00",
            "array of more than 1000000 zero-byte items",
        ),
        ("double", b"\x00" * 7, "double runs past the end at byte 0"),
        (MD5, b"abc", "fixed(4) runs past the end at byte 0"),
        (
            {"type": "int", "logicalType": "date"},
            zz(2932897),
            "logical value 2932897 is outside [-719162, 2932896]",
        ),
    ],
)
def test_refusals_name_the_problem(schema: Any, data: bytes, message: str) -> None:
    problem, _ = _gate.validate(avro_program.compile_schema(schema), data)
    assert problem is not None and problem.startswith(message), problem


def test_zero_width_items_and_negative_block_counts() -> None:
    empty = {"type": "record", "name": "Empty", "fields": [{"name": "n", "type": "null"}]}
    for items in ("null", empty, {"type": "fixed", "name": "Z", "size": 0}):
        schema = {"type": "array", "items": items}
        parsed, program = parse_schema(schema), avro_program.compile_schema(schema)
        data = zz(1000) + zz(-3) + zz(0) + zz(0)  # 1000 items, then a sized block of 3
        assert verdict(program, parsed, data) == (True, None)
        assert fastavro_ok(parsed, data)
    longs = {"type": "array", "items": "long"}
    parsed, program = parse_schema(longs), avro_program.compile_schema(longs)
    data = zz(-2) + zz(2) + zz(1) + zz(2) + zz(0)  # block size is read, not checked (as fastavro)
    assert verdict(program, parsed, data) == (True, None) and fastavro_ok(parsed, data)
    problem, _ = _gate.validate(program, zz(-(2**63)) + zz(0))
    assert problem is not None and "out of range" in problem


def test_recursion_is_depth_limited() -> None:
    program = avro_program.compile_schema(LINKED)
    deep = b"\x00\x02" * 400 + b"\x00\x00"  # 401 nodes
    assert _gate.validate(program, deep) == (None, False)
    assert fastavro_ok(parse_schema(LINKED), deep)
    too_deep = b"\x00\x02" * (_gate.MAX_DEPTH + 5) + b"\x00\x00"  # fastavro segfaults at ~5000
    problem, _ = _gate.validate(program, too_deep)
    assert problem is not None and f"nested deeper than {_gate.MAX_DEPTH} levels" in problem
    infinite = {"type": "record", "name": "Loop", "fields": [{"name": "again", "type": "Loop"}]}
    problem, _ = _gate.validate(avro_program.compile_schema(infinite), b"")
    assert problem is not None and "nested deeper" in problem


def test_compiles_json_text_registry_parsed_schemas_and_top_level_unions() -> None:
    import json

    from broker.registry.schemas import ResolvedReference, parse_avro_with_refs

    text = json.dumps(KITCHEN)
    assert avro_program.compile_schema(text) == avro_program.compile_schema(KITCHEN)
    assert avro_program.compile_schema('"string"') == avro_program.compile_schema("string")
    union = [INNER, "null", {"type": "array", "items": "Inner"}]
    parsed = parse_schema(union)
    program = avro_program.compile_schema(parsed)
    assert verdict(program, parsed, encode(parsed, [INNER_VALUE]))[0]
    # the registry's parsed form: referenced types in __named_schemas
    ref = ResolvedReference(
        "ns.A",
        "a-value",
        1,
        "AVRO",
        json.dumps(
            {
                "type": "record",
                "name": "A",
                "namespace": "ns",
                "fields": [{"name": "x", "type": "int"}],
            }
        ),
    )
    parsed = parse_avro_with_refs(
        json.dumps(
            {
                "type": "record",
                "name": "B",
                "fields": [{"name": "a", "type": "ns.A"}, {"name": "b", "type": "ns.A"}],
            }
        ),
        [ref],
    )
    program = avro_program.compile_schema(parsed)
    data = encode(parsed, {"a": {"x": 1}, "b": {"x": -1}})
    assert verdict(program, parsed, data) == (True, None)
    assert verdict(program, parsed, data[:-1])[0] is False
    # a top-level union keeps no named types: fastavro cannot read it, the compiler refuses it too
    union_with_ref = parse_avro_with_refs(json.dumps(["null", "ns.A"]), [ref])
    assert not fastavro_ok(union_with_ref, b"\x00")
    with pytest.raises(avro_program.AvroProgramError):
        avro_program.compile_schema(union_with_ref)
    with pytest.raises(avro_program.AvroProgramError):
        avro_program.compile_schema(
            {"type": "record", "name": "R", "fields": [{"name": "x", "type": "Nope"}]}
        )


def test_programs_and_inputs_never_crash() -> None:
    program = avro_program.compile_schema(KITCHEN)
    for bad in (
        b"",
        b"AVP1",
        b"AVP1\x01\x00\x00\x00",
        b"AVP1\x01\x00\x00\x00\xff\x00\x00\x00\x00",
        b"XXXX\x01\x00\x00\x00\x00\x00\x00\x00\x00",
        program[:-3],
        program[:20],
    ):
        try:
            _gate.validate(bad, ENCODED[-1])
        except ValueError as exc:
            assert "invalid validator program" in str(exc)
    with pytest.raises(TypeError):
        _gate.check_values("text", 1, {})
    with pytest.raises(TypeError):
        _gate.check_values(b"", 1, {}, deferred=())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60), st.binary(max_size=60))
def test_random_programs_never_crash(code: bytes, data: bytes) -> None:
    program = avro_program.MAGIC + struct.pack("<III", 2, 0, min(len(code), 7)) + code
    try:
        _gate.validate(program, data)
    except ValueError as exc:
        assert "invalid validator program" in str(exc)


# ---------------------------------------------------------------- Kafka batches


SCHEMA = parse_schema(KITCHEN)
PROGRAMS = {7: avro_program.compile_schema(KITCHEN)}


def wire(value: Any, schema_id: int = 7) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + encode(SCHEMA, value)


def body(batch: bytes) -> memoryview:
    return memoryview(batch)[records.HEADER_SIZE :]


def test_check_values_on_real_batches() -> None:
    good = wire(KITCHEN_VALUE)
    values: list[bytes | None] = [good, None, good]
    batch = records.encode_batch(
        [(b"k", v) for v in values], 0, headers=[[("h", b"x"), ("n", None)]] * 3
    )
    assert _gate.check_values(body(batch), 3, PROGRAMS, []) is None
    bad_values = {
        b"no": "lacks the Confluent wire format (magic byte 0 + 4-byte schema id)",
        b"\x00\x00\x00\x00\x63\x00": "names schema id 99, which the registry does not know",
        good[
            :-3
        ]: "does not decode with Avro schema id 7: string length runs past the end at byte ",
        good + b"\x00\x00": "has 2 bytes left over after decoding with Avro schema id 7",
    }
    for bad, message in bad_values.items():
        batch = records.encode_batch([(None, v) for v in [good, None, bad, b"also bad"]], 0)
        result = _gate.check_values(body(batch), 4, PROGRAMS, [])
        assert result is not None and result[0] == 2 and result[1].startswith(message), result
    # a program of None defers the value to the caller; a KeyError is an unknown id
    batch = records.encode_batch([(None, v) for v in [good, wire(KITCHEN_VALUE, 8), b"bad"]], 0)
    deferred: list[tuple[int, int, int]] = []
    result = _gate.check_values(body(batch), 3, {**PROGRAMS, 8: None}, deferred)
    assert result == (2, "lacks the Confluent wire format (magic byte 0 + 4-byte schema id)")
    ((index, start, end),) = deferred
    assert index == 1 and bytes(body(batch)[start:end]) == wire(KITCHEN_VALUE, 8)


def test_malformed_framing_raises_like_decode_batch() -> None:
    batch = records.encode_batch([(None, wire(KITCHEN_VALUE))] * 2, 0)
    for length in (63, 2000, -2):  # the first record's length, not what its fields take
        original = bytes(body(batch))
        prefix = next(i for i, byte in enumerate(original) if not byte & 0x80) + 1
        broken = zz(length) + original[prefix:]
        expected = reference_framing(batch, broken, 2)
        assert expected is not None
        with pytest.raises(_gate.FramingError) as raised:
            _gate.check_values(broken, 2, PROGRAMS, [])
        assert str(raised.value) == expected
    with pytest.raises(_gate.FramingError, match="runs past the end"):
        _gate.check_values(b"", 1, PROGRAMS, [])


def reference_framing(batch: bytes, body_bytes: bytes, count: int) -> str | None:
    """decode_batch's complaint about a body, or None."""
    header = batch[: records.HEADER_SIZE]
    rebuilt = bytearray(header + body_bytes)
    struct.pack_into(">i", rebuilt, 8, len(rebuilt) - records.LOG_OVERHEAD)
    struct.pack_into(">i", rebuilt, 57, count)
    try:
        records.decode_batch(bytes(rebuilt))
    except records.CorruptBatchError as exc:
        return str(exc)
    return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_framing_agrees_with_decode_batch_and_check_record_framing(data: st.DataObject) -> None:
    values = data.draw(
        st.lists(st.sampled_from([wire(KITCHEN_VALUE), None, b"x", b""]), min_size=1, max_size=4)
    )
    batch = records.encode_batch(
        [(b"key", v) for v in values], 0, headers=[[("h", b"v")]] * len(values)
    )
    mutated = mutate(bytes(body(batch)), data.draw)
    count = len(values) + data.draw(st.integers(-1, 1))
    expected = reference_framing(batch, mutated, count)
    try:
        _gate.check_values(mutated, count, PROGRAMS, [])
        got = None
    except _gate.FramingError as exc:
        got = str(exc)
    assert got == expected
    try:
        records._check_record_framing_py(
            memoryview(mutated), count
        )  # the Python walk, not the C one
        framing = None
    except records.CorruptBatchError as exc:
        framing = str(exc)
    assert _gate.record_framing_problem(mutated, count) == framing


# ---------------------------------------------------------------- the gate, C against Python


@dataclass
class Registered:
    schema_type: str
    parsed: Any


class Schemas:
    def __init__(self) -> None:
        self.by_id: dict[int, Registered] = {
            7: Registered("AVRO", SCHEMA),
            8: Registered("JSON", {}),
            9: Registered("PROTOBUF", None),
            10: Registered("AVRO", parse_schema({"type": "string", "logicalType": "uuid"})),
            11: Registered("AVRO", None),  # the registry could not parse it
        }

    def schema_by_id(self, schema_id: int) -> Registered | None:
        return self.by_id.get(schema_id)


def both(
    records_bytes: bytes, schemas: Schemas | None = None
) -> tuple[GateRejection | None, GateRejection | None]:
    schemas = schemas or Schemas()
    return (
        DataQualityGate(schemas).check(records_bytes),
        DataQualityGate(schemas, use_extension=False).check(records_bytes),
    )


def same_verdict(c: GateRejection | None, py: GateRejection | None) -> bool:
    if c is None or py is None:
        return c == py
    if c.batch_index != py.batch_index:
        return False
    avro = re.compile(
        r"(does not decode with|bytes left over after decoding with) Avro schema id \d+"
    )
    if avro.search(
        py.message
    ):  # the same record refused; fastavro's words differ from the validator's
        return bool(avro.search(c.message))
    return c.message == py.message


def test_gate_matches_the_python_gate() -> None:
    good = wire(KITCHEN_VALUE)
    uid = b"\x00" + struct.pack(">I", 10)
    cases: list[list[bytes | None]] = [
        [good, None, b"\x00" + struct.pack(">I", 8) + b'{"a": 1}'],
        [good, b"\x00" + struct.pack(">I", 8) + b"{nope"],
        [good, b"\x00" + struct.pack(">I", 9) + b"\x01\x02anything"],
        [uid + zz(36) + b"12345678-1234-5678-1234-567812345678", uid + zz(2) + b"{}"],
        [uid + zz(38) + b"{12345678-1234-5678-1234-567812345678}", good[:-1]],
        [good, b"\x00" + struct.pack(">I", 11) + b"\x00"],
        [good, good + b"\x00", b"x"],
    ]
    for values in cases:
        blob = records.encode_batch([(None, good)], 0) + records.encode_batch(
            [(None, v) for v in values], 0
        )
        c, py = both(blob)
        assert same_verdict(c, py), (values, c, py)
    assert both(records.encode_batch([(None, good)], 0)[:-1]) == (
        None,
        None,
    )  # corrupt: the log refuses it


def test_gate_reads_compressed_batches() -> None:
    import cramjam

    batch = records.encode_batch([(None, wire(KITCHEN_VALUE)), (None, b"bad")], 0)
    compressed = bytes(cramjam.zstd.compress(bytes(body(batch))))
    after_crc = bytearray(batch[21 : records.HEADER_SIZE] + compressed)
    struct.pack_into(">h", after_crc, 0, records.COMPRESSION_ZSTD)
    from crc32c import crc32c

    head = bytearray(batch[:21])
    struct.pack_into(">i", head, 8, 21 + len(after_crc) - records.LOG_OVERHEAD)
    struct.pack_into(">I", head, 17, crc32c(bytes(after_crc)))
    c, py = both(bytes(head + after_crc))
    assert c is not None and c.batch_index == 1 and same_verdict(c, py)


def test_gate_sees_schemas_registered_later() -> None:
    schemas = Schemas()
    gate = DataQualityGate(schemas)
    blob = records.encode_batch([(None, wire(KITCHEN_VALUE, 12))], 0)
    rejection = gate.check(blob)
    assert rejection is not None and "names schema id 12" in rejection.message
    schemas.by_id[12] = Registered("AVRO", SCHEMA)
    assert gate.check(blob) is None
    del schemas.by_id[12]  # hard-deleted: unknown again
    assert gate.check(blob) is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_produce_requests_get_the_python_gates_verdict(data: st.DataObject) -> None:
    from crc32c import crc32c

    values = data.draw(
        st.lists(st.sampled_from([wire(KITCHEN_VALUE), None]), min_size=1, max_size=3)
    )
    first = records.encode_batch([(None, wire(KITCHEN_VALUE))], 0)
    batch = bytearray(records.encode_batch([(b"k", v) for v in values], 0))
    mutated = bytearray(mutate(bytes(batch[records.HEADER_SIZE :]), data.draw))
    batch = batch[: records.HEADER_SIZE] + mutated
    struct.pack_into(">i", batch, 8, len(batch) - records.LOG_OVERHEAD)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    c, py = both(first + bytes(batch))
    if c is not None and STRICTER.search(c.message):
        assert py is None or py.batch_index >= c.batch_index
    else:
        assert same_verdict(c, py), (c, py)


def test_without_the_extension_the_gate_checks_in_python() -> None:
    import subprocess
    import sys

    script = """
import logging, sys
sys.modules["broker._gate"] = None  # as if it were not built
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from broker.kafka import records
from broker.gate import DataQualityGate
from tests.broker.test_gate import Schemas, avro
gate = DataQualityGate(Schemas())
DataQualityGate(Schemas())  # logs once
good = records.encode_batch([(None, avro(7, {"id": 1, "name": "a"}))], 0)
assert gate.check(good) is None
bad = gate.check(good + records.encode_batch([(None, b"nope")], 0))
assert bad is not None and bad.batch_index == 1, bad
"""
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=repo,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("broker._gate is not built") == 1, result.stderr
