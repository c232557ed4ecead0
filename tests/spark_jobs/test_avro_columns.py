"""The C column decoder (``avro_columns``) gives exactly the rows and error rows of the general path."""

from __future__ import annotations

import contextlib
import io
import math
import os
import struct
from typing import Any, Literal

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.types import StructType

from spark_jobs.decode import avro_columns, avro_schema, rows
from spark_jobs.decode.avro_schema import table_schema
from spark_jobs.decode.rows import RowConverter
from spark_jobs.decode.segments import RecordChunk

pytestmark = pytest.mark.skipif(
    not avro_columns.available(), reason="spark_jobs._avro_columns is not built"
)

SETTINGS = settings(
    max_examples=int(os.environ.get("ICEFALL_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
DATES = (-719162, 2932896)
MILLIS = (-62135596800000, 253402300799999)
MICROS = (-62135596800000000, 253402300799999999)

# type name -> (Avro type, strategy of valid values, strategy of values fastavro writes but the
# conversion refuses (None: none))
KINDS: dict[str, tuple[Any, Any, Any]] = {
    "boolean": ("boolean", st.booleans(), None),
    "int": ("int", st.integers(*INT32), st.integers(*INT64)),
    "long": ("long", st.integers(*INT64), None),
    "float": ("float", st.floats(width=32), None),
    "double": ("double", st.floats(), None),
    "string": ("string", st.text(max_size=40), None),
    "bytes": ("bytes", st.binary(max_size=40), None),
    "date": ({"type": "int", "logicalType": "date"}, st.integers(*DATES), st.integers(*INT32)),
    "ts_ms": (
        {"type": "long", "logicalType": "timestamp-millis"},
        st.integers(*MILLIS),
        st.integers(*INT64),
    ),
    "ts_us": (
        {"type": "long", "logicalType": "timestamp-micros"},
        st.integers(*MICROS),
        st.integers(*INT64),
    ),
    "ts_ms_naive": (
        {"type": "long", "logicalType": "timestamp-millis", "adjust-to-utc": False},
        st.integers(*MILLIS),
        None,
    ),
    "lts_us": (
        {"type": "long", "logicalType": "local-timestamp-micros"},
        st.integers(*MICROS),
        None,
    ),
    "nanos": ({"type": "long", "logicalType": "timestamp-nanos"}, st.integers(*INT64), None),
}
PROMOTE = {"int": "long", "float": "double"}
HEADER = b"\x00\x00\x00\x00\x01"


@st.composite
def flat_schemas(draw: Any) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, str, str]]]:
    """(writer schema, table schema, [(field name, kind, optionality)])."""
    names = draw(st.lists(st.sampled_from("abcdefghijkl"), min_size=1, max_size=8, unique=True))
    writer_fields, table_fields, spec = [], [], []
    for i, name in enumerate(names):
        kind = draw(st.sampled_from([*KINDS, "enum", "null"]))
        optional = draw(st.sampled_from(["required", "null_first", "null_second"]))
        if kind == "null":
            avro: Any = draw(st.sampled_from(["null", ["null"]]))
            optional = "required"
        elif kind == "enum":
            symbols = draw(
                st.lists(st.sampled_from(["A", "BB", "CC", "D_4", "e"]), min_size=1, unique=True)
            )
            avro = {"type": "enum", "name": f"E{i}", "symbols": symbols}
        else:
            avro = KINDS[kind][0]
        table_avro = avro
        if kind in PROMOTE and draw(st.booleans()):
            table_avro = PROMOTE[
                kind
            ]  # the table was widened; old writers still write the narrow type
        wrap = {
            "required": lambda t: t,
            "null_first": lambda t: ["null", t],
            "null_second": lambda t: [t, "null"],
        }
        writer_fields.append({"name": name, "type": wrap[optional](avro)})
        table_optional = optional
        if kind != "null" and optional == "required" and draw(st.booleans()):
            table_optional = (
                "null_first"  # the table's column is optional, the writer's field required
            )
        table_fields.append({"name": name, "type": wrap[table_optional](table_avro)})
        spec.append((name, kind, optional))
    if draw(st.booleans()):  # columns only the table has: all null
        table_fields.append({"name": "extra_s", "type": ["null", "string"]})
        table_fields.append(
            {"name": "extra_l", "type": ["null", {"type": "array", "items": "long"}]}
        )
    writer = {"type": "record", "name": "W", "namespace": "t", "fields": writer_fields}
    table = {"type": "record", "name": "W", "namespace": "t", "fields": table_fields}
    return writer, table, spec


@st.composite
def records(draw: Any, spec: list[tuple[str, str, str]], writer: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (name, kind, optional), field in zip(spec, writer["fields"], strict=True):
        if kind == "null" or (optional != "required" and draw(st.integers(0, 3)) == 0):
            out[name] = None
        elif kind == "enum":
            avro = (
                field["type"]
                if optional == "required"
                else next(t for t in field["type"] if t != "null")
            )
            out[name] = draw(st.sampled_from(avro["symbols"]))
        else:
            _, valid, refused = KINDS[kind]
            out[name] = draw(
                refused if refused is not None and draw(st.integers(0, 9)) == 0 else valid
            )
    return out


def encode(schema: dict[str, Any], record: dict[str, Any], header: bytes = HEADER) -> bytes:
    out = io.BytesIO()
    out.write(header)
    schemaless_writer(out, parse_schema(schema), record)
    return out.getvalue()


def _wide(node: Any) -> Any:
    """The type with ints as longs (the same encoding) and no logical types, so that fastavro's
    writer takes any 64-bit value, in unions too."""
    if isinstance(node, list):
        return [_wide(b) for b in node]
    if node == "int":
        return "long"
    if isinstance(node, dict) and node.get("type") in ("int", "long"):
        return "long"
    return node


def encode_wide(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    return encode(
        {**schema, "fields": [{**f, "type": _wide(f["type"])} for f in schema["fields"]]}, record
    )


@st.composite
def garbled(draw: Any, value: bytes) -> bytes | None:
    how = draw(
        st.sampled_from(["keep", "keep", "truncate", "flip", "append", "random", "none", "header"])
    )
    if how == "truncate":
        return value[: draw(st.integers(0, len(value)))]
    if how == "flip" and len(value) > 5:
        at = draw(st.integers(5, len(value) - 1))
        return value[:at] + bytes([value[at] ^ draw(st.integers(1, 255))]) + value[at + 1 :]
    if how == "append":
        return value + draw(st.binary(min_size=1, max_size=3))
    if how == "random":
        return HEADER + draw(st.binary(max_size=30))
    if how == "none":
        return None
    if how == "header":
        return draw(
            st.sampled_from([b"", b"\x01xyz", b"\x00\x00\x00\x00\x63" + value[5:]])
        )  # 99: unknown id
    return value


def chunk(values: list[bytes | None], keys: list[bytes | None] | None = None) -> RecordChunk:
    n = len(values)
    return RecordChunk(
        0,
        list(range(n)),
        [1_700_000_000_000] * n,
        keys if keys is not None else [b"k"] * n,
        values,
        [()] * n,
    )


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def outcome(converter: RowConverter, records_: RecordChunk) -> tuple[Any, ...]:
    result = converter.convert(records_)
    result.batch.validate(full=True)
    errors = [(e.offset, e.error_class) for e in result.errors]
    trailing = [e.message for e in result.errors if e.error_class == rows.TRAILING_BYTES]
    return result.batch.schema, _plain(result.batch.to_pylist()), errors, trailing


def assert_same(
    table: Any, lookup: dict[int, Any], records_: RecordChunk, **kwargs: Any
) -> tuple[Any, ...]:
    fast = RowConverter(table, lookup.__getitem__, **kwargs)
    slow = RowConverter(table, lookup.__getitem__, use_extension=False, **kwargs)
    got, want = outcome(fast, records_), outcome(slow, records_)
    assert got[0] == want[0]
    assert got[0].metadata == want[0].metadata
    assert [f.metadata for f in got[0]] == [f.metadata for f in want[0]]
    assert got[1:] == want[1:]
    return got


@SETTINGS
@given(data=st.data(), shape=flat_schemas(), flavor=st.sampled_from(["iceberg", "spark"]))
def test_random_flat_schemas_decode_as_fastavro_does(
    data: Any, shape: Any, flavor: Literal["iceberg", "spark"]
) -> None:
    writer, table_avro, spec = shape
    table = table_schema(table_avro)
    converter = RowConverter(table, {1: writer}.__getitem__, flavor=flavor)
    target = StructType(*converter.value_fields)
    assert avro_columns.compile_columns(avro_schema.parse_avro(writer), target, flavor) is not None
    drawn = data.draw(st.lists(records(spec, writer), max_size=12))
    values: list[bytes | None] = [encode_wide(writer, r) for r in drawn]
    values = [data.draw(garbled(v)) if v is not None else None for v in values]
    assert_same(table, {1: writer}, chunk(values), flavor=flavor)


@SETTINGS
@given(shape=flat_schemas(), bodies=st.lists(st.binary(max_size=40), max_size=20))
def test_garbage_bodies_fail_the_same_rows(shape: Any, bodies: list[bytes]) -> None:
    writer, table_avro, _ = shape
    assert_same(table_schema(table_avro), {1: writer}, chunk([HEADER + b for b in bodies]))


def test_fastavro_quirks_are_kept() -> None:
    schema = {
        "type": "record",
        "name": "Q",
        "fields": [
            {"name": "b", "type": "boolean"},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
            {"name": "u", "type": ["null", "long"]},
            {"name": "i", "type": "int"},
        ],
    }
    bodies = [
        b"\x02\x00\x00\x00",  # boolean byte 2: true
        b"\x00\x01\x00\x00",  # enum index -1: the last symbol
        b"\x00\x05\x00\x00",  # enum index -3: out of range
        b"\x00\x00\x01\x02\x00",  # union index -1: the last branch (long 1)
        b"\x00\x00\x00" + b"\x80" * 10 + b"\x02",  # an 11-byte varint: bits past 64 wrap
        b"\x00\x00\x00\xfe\xff\xff\xff\x1f",  # 2**32 - 1 does not fit the int column
        b"\x00\x00\x00\x00\x00",  # one byte too many
        b"\x00\x00\x00",  # one too few
    ]
    _, got, errors, trailing = assert_same(
        table_schema(schema), {1: schema}, chunk([HEADER + b for b in bodies])
    )
    assert [(r["b"], r["e"], r["u"], r["i"]) for r in got] == [
        (True, "A", None, 0),
        (False, "B", None, 0),
        (False, "A", 1, 0),
        (False, "A", None, 64),
    ]
    assert errors == [
        (2, rows.AVRO_DECODE),
        (5, rows.ARROW_CONVERSION),
        (6, rows.TRAILING_BYTES),
        (7, rows.AVRO_DECODE),
    ]
    assert trailing == ["value with schema id 1: 1 bytes left after the Avro value"]


def test_promoted_int_keeps_64_bit_values_and_error_messages_are_clear() -> None:
    writer = {
        "type": "record",
        "name": "P",
        "fields": [{"name": "n", "type": "int"}, {"name": "s", "type": "string"}],
    }
    table = table_schema(
        {**writer, "fields": [{"name": "n", "type": "long"}, {"name": "s", "type": "string"}]}
    )
    values: list[bytes | None] = [
        encode(writer, {"n": 2**40, "s": "x"}),
        HEADER + b"\x02\x04\xff\xfe",
        HEADER + b"\x02\x09ab",
    ]
    result = RowConverter(table, {1: writer}.__getitem__).convert(chunk(values))
    assert [r["n"] for r in result.batch.to_pylist()] == [2**40]
    messages = [(e.error_class, e.message) for e in result.errors]
    assert messages == [
        (rows.AVRO_DECODE, "value with schema id 1: field s: string is not valid UTF-8 at byte 7"),
        (
            rows.AVRO_DECODE,
            "value with schema id 1: field s: string length -5 is negative at byte 6",
        ),
    ]


def test_several_schema_ids_in_one_chunk_are_merged_row_for_row() -> None:
    # schema 1: flat (C); schema 2: the same fields reordered (C, a second pass); schema 3 writes a
    # decimal (general path); 99 is unknown; the table has the decimal column
    s1 = {
        "type": "record",
        "name": "M",
        "fields": [{"name": "id", "type": "long"}, {"name": "s", "type": ["null", "string"]}],
    }
    s2 = {
        "type": "record",
        "name": "M",
        "fields": [{"name": "s", "type": ["null", "string"]}, {"name": "id", "type": "long"}],
    }
    s3 = {
        "type": "record",
        "name": "M",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "s", "type": ["null", "string"]},
            {
                "name": "d",
                "type": [
                    "null",
                    {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
                ],
            },
        ],
    }
    import decimal

    lookup = {1: s1, 2: s2, 3: s3}
    h = {i: b"\x00" + struct.pack(">I", i) for i in (1, 2, 3, 99)}
    values: list[bytes | None] = [
        b"junk",
        encode(s1, {"id": 1, "s": "one"}, h[1]),
        encode(s3, {"id": 3, "s": None, "d": decimal.Decimal("1.25")}, h[3]),
        encode(s2, {"id": 2, "s": "two"}, h[2]),
        None,
        encode(s1, {"id": 4, "s": None}, h[99]),
        encode(s2, {"id": 5, "s": "five"}, h[2])[:-1],
        encode(s1, {"id": 6, "s": "six"}, h[1]),
    ]
    table = table_schema(s3)
    _, got, errors, _ = assert_same(table, lookup, chunk(values))
    assert [(r["id"], r["s"], r["d"]) for r in got] == [
        (1, "one", None),
        (3, None, decimal.Decimal("1.25")),
        (2, "two", None),
        (6, "six", None),
    ]
    assert errors == [
        (0, rows.MISSING_WIRE_HEADER),
        (4, rows.NULL_IN_REQUIRED),
        (5, rows.UNKNOWN_SCHEMA),
        (6, rows.AVRO_DECODE),
    ]
    assert_same(
        table_schema(s3, transform="none"), lookup, chunk(values)
    )  # the value as one struct column


def test_record_keys_by_schema_id_decode_in_c_too() -> None:
    key = {
        "type": "record",
        "name": "K",
        "fields": [{"name": "id", "type": "long"}, {"name": "region", "type": ["null", "string"]}],
    }
    value = {"type": "record", "name": "V", "fields": [{"name": "x", "type": "double"}]}
    table = table_schema(value, key_type="by_schema_id", key_schema=key)
    keys: list[bytes | None] = [
        encode(key, {"id": 7, "region": "eu"}, b"\x00\x00\x00\x00\x09"),
        None,
        b"\x00\x00\x00\x00\x09\x03",
    ]
    values: list[bytes | None] = [encode(value, {"x": 1.5})] * 3
    _, got, errors, _ = assert_same(
        table, {1: value, 9: key}, chunk(values, keys), key_type="by_schema_id"
    )
    assert [r["_kafka_key"] for r in got] == [{"id": 7, "region": "eu"}, None]
    assert errors == [(2, rows.AVRO_DECODE)]


@pytest.mark.parametrize(
    "field_type",
    [
        {"type": "fixed", "name": "F", "size": 2},
        {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 1},
        {"type": "string", "logicalType": "uuid"},
        {"type": "int", "logicalType": "time-millis"},
        {"type": "array", "items": "int"},
        {"type": "record", "name": "In", "fields": [{"name": "x", "type": "int"}]},
        ["null", "int", "string"],
        ["int", "string"],
    ],
)
def test_what_the_c_decoder_leaves_to_the_general_path(field_type: Any) -> None:
    schema = {
        "type": "record",
        "name": "U",
        "fields": [{"name": "id", "type": "long"}, {"name": "x", "type": field_type}],
    }
    parsed = avro_schema.parse_avro(schema)
    target = StructType(
        *[
            f
            for f in table_schema({**schema, "fields": schema["fields"][:1]}).fields
            if not f.name.startswith("_kafka")
        ]
    )
    assert avro_columns.compile_columns(parsed, target, "iceberg") is None


def test_the_general_path_when_the_extension_is_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = {"type": "record", "name": "N", "fields": [{"name": "id", "type": "long"}]}
    monkeypatch.setattr(avro_columns, "_ext", None)
    assert not avro_columns.available()
    converter = RowConverter(table_schema(schema), {1: schema}.__getitem__)
    assert converter.convert(chunk([encode(schema, {"id": 3})])).batch.column("id").to_pylist() == [
        3
    ]


def test_bad_programs_raise_instead_of_crashing() -> None:
    from spark_jobs import _avro_columns  # type: ignore[attr-defined]

    good = avro_columns.compile_columns(
        avro_schema.parse_avro(
            {
                "type": "record",
                "name": "G",
                "fields": [
                    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
                    {"name": "s", "type": "string"},
                ],
            }
        ),
        StructType(
            *[
                f
                for f in table_schema(
                    {
                        "type": "record",
                        "name": "G",
                        "fields": [
                            {"name": "e", "type": "string"},
                            {"name": "s", "type": "string"},
                        ],
                    }
                ).fields
                if not f.name.startswith("_kafka")
            ]
        ),
    )
    assert good is not None
    program = good.program
    for cut in range(len(program)):
        with pytest.raises(ValueError, match="invalid column program"):
            _avro_columns.decode(program[:cut], [HEADER + b"\x00\x02a"], HEADER)
    for at in range(len(program)):  # any byte changed: an answer or a ValueError, no crash
        broken = program[:at] + bytes([program[at] ^ 0xFF]) + program[at + 1 :]
        with contextlib.suppress(ValueError):
            _avro_columns.decode(broken, [HEADER + b"\x00\x02a", None, b"x"], HEADER)
    assert _avro_columns.decode(program, [], HEADER)[1] == 0
