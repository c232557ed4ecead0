"""Records -> Arrow rows: every Avro type round-trips, projection by name, error records."""

from __future__ import annotations

import copy
import datetime
import decimal
import io
import struct
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer

from spark_jobs.decode import avro_schema, rows
from spark_jobs.decode.avro_schema import table_schema
from spark_jobs.decode.rows import DecodeError, RowConverter, errors_to_arrow, schema_ids
from spark_jobs.decode.segments import RecordChunk
from spark_jobs.rounds.evolution import apply_schema_changes, plan_evolution

UTC = datetime.UTC
TS = datetime.datetime(2024, 2, 29, 23, 59, 58, 123000, tzinfo=UTC)

EVERYTHING: dict[str, Any] = {
    "type": "record",
    "name": "Everything",
    "namespace": "icefall.test",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "by", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "F3", "size": 3}},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {
            "name": "dec",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3},
        },
        {
            "name": "decf",
            "type": {
                "type": "fixed",
                "name": "D8",
                "size": 8,
                "logicalType": "decimal",
                "precision": 18,
                "scale": 4,
            },
        },
        {"name": "date", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tmil", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tmic", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "tsms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsus", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {
            "name": "tsnoz",
            "type": {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": False},
        },
        {"name": "lts", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "uidf",
            "type": {"type": "fixed", "name": "U16", "size": 16, "logicalType": "uuid"},
        },
        {"name": "nanos", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
        {"name": "opt", "type": ["null", "string"], "default": None},
        {
            "name": "optrec",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Point",
                    "fields": [
                        {"name": "x", "type": "int"},
                        {"name": "y", "type": ["null", "double"]},
                    ],
                },
            ],
        },
        {"name": "u", "type": ["null", "int", "long", "string", "Point", "Color"]},
        {"name": "arr", "type": {"type": "array", "items": ["null", "Point"]}},
        {"name": "m", "type": {"type": "map", "values": {"type": "array", "items": "long"}}},
        {
            "name": "kv",
            "type": {
                "type": "array",
                "logicalType": "map",
                "items": {
                    "type": "record",
                    "name": "KV",
                    "fields": [
                        {"name": "key", "type": "int"},
                        {"name": "value", "type": ["null", "string"]},
                    ],
                },
            },
        },
        {
            "name": "nested",
            "type": {
                "type": "record",
                "name": "Nested",
                "fields": [
                    {
                        "name": "inner",
                        "type": {"type": "array", "items": {"type": "map", "values": "Point"}},
                    },
                    {"name": "choice", "type": ["string", "bytes"]},
                ],
            },
        },
    ],
}
UID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def record(n: int) -> dict[str, Any]:
    """The n-th test record, as fastavro writes it (datetime etc. for logical types)."""
    return {
        "b": n % 2 == 0,
        "i": -n,
        "l": 2**40 + n,
        "f": 1.5 + n,
        "d": 1 / 3 + n,
        "s": f"héllo {n}",
        "by": bytes([n, 0, 255]),
        "fx": b"abc",
        "e": "GREEN" if n % 2 else "RED",
        "dec": decimal.Decimal(f"{n}.125"),
        "decf": decimal.Decimal(f"-{n}.0001"),
        "date": datetime.date(2024, 2, 29),
        "tmil": datetime.time(12, 34, 56, 789000),
        "tmic": datetime.time(1, 2, 3, 456789),
        "tsms": TS,
        "tsus": TS + datetime.timedelta(microseconds=456),
        "tsnoz": TS,
        "lts": TS.replace(tzinfo=None),
        "uid": UID,
        "uidf": UID.bytes,
        "nanos": 123456789,
        "opt": None if n % 2 else f"o{n}",
        "optrec": None if n % 3 == 0 else {"x": n, "y": None},
        "u": [None, 7, 2**40, "str", {"x": 1, "y": 2.5}, ("icefall.test.Color", "GREEN")][n % 6],
        "arr": [{"x": n, "y": 0.5}, None],
        "m": {"a": [1, 2], "b": []},
        "kv": [{"key": 1, "value": "one"}, {"key": 2, "value": None}],
        "nested": {"inner": [{"p": {"x": 1, "y": None}}], "choice": b"\x00" if n % 2 else "text"},
    }


def expected_row(n: int, uuid_as: str = "uuid") -> dict[str, Any]:
    """What Arrow's to_pylist gives back for record(n)."""
    r = record(n)
    u = r["u"]
    union_tag = [None, 0, 1, 2, 3, 4][n % 6]
    point = {"x": 1, "y": 2.5}
    return {
        **{
            k: r[k]
            for k in (
                "b",
                "i",
                "l",
                "f",
                "d",
                "s",
                "by",
                "fx",
                "e",
                "dec",
                "decf",
                "date",
                "tmil",
                "tmic",
                "tsms",
                "tsus",
                "nanos",
                "opt",
                "optrec",
            )
        },
        "tsnoz": TS.replace(tzinfo=None),  # timestamp without zone: the UTC wall time
        "lts": TS.replace(tzinfo=None),
        "uid": UID if uuid_as == "uuid" else str(UID),
        "uidf": UID if uuid_as == "uuid" else str(UID),
        "u": None
        if union_tag is None
        else {
            "tag": union_tag,
            **{f"field{i}": None for i in range(5)},
            f"field{union_tag}": point if union_tag == 3 else "GREEN" if union_tag == 4 else u,
        },
        "arr": r["arr"],
        "m": [("a", [1, 2]), ("b", [])],
        "kv": [(1, "one"), (2, None)],
        "nested": {
            "inner": [[("p", {"x": 1, "y": None})]],
            "choice": {"tag": 1, "field0": None, "field1": b"\x00"}
            if n % 2
            else {"tag": 0, "field0": "text", "field1": None},
        },
    }


def wire(schema: Any, schema_id: int, value: Any) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + struct.pack(">I", schema_id))
    schemaless_writer(out, parse_schema(schema), value)
    return out.getvalue()


def chunk(
    values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None, partition: int = 3
) -> RecordChunk:
    n = len(values)
    return RecordChunk(
        partition,
        list(range(100, 100 + n)),
        [1_700_000_000_000 + i for i in range(n)],
        list(keys) if keys is not None else [f"k{i}".encode() for i in range(n)],
        list(values),
        [(("h", b"v"), ("null", None))] * n,
    )


class Lookup:
    """A schema registry stand-in that counts look-ups."""

    def __init__(self, schemas: dict[int, Any]) -> None:
        self.schemas = schemas
        self.calls: list[int] = []

    def __call__(self, schema_id: int) -> Any:
        self.calls.append(schema_id)
        return self.schemas[schema_id]


def test_headers_none_some_or_all_come_out_as_the_records_had_them() -> None:
    """A chunk whose records have no headers takes a shortcut (empty maps from one offsets
    buffer): the column must be what converting each record's empty headers gives, and one
    record with headers among them must take the general path."""
    table = table_schema(EVERYTHING)
    converter = RowConverter(table, Lookup({5: EVERYTHING}))
    headers_type = avro_schema.arrow_schema(table).field("_kafka_headers").type
    for headers in ([()] * 4, [(), (("h", b"v"),), (), ()]):
        bare = chunk([wire(EVERYTHING, 5, record(n)) for n in range(4)])
        bare.headers = list(headers)
        column = converter.convert(bare).batch.column("_kafka_headers")
        assert column.equals(pa.array(headers, headers_type)), headers
        assert column.to_pylist() == [list(h) for h in headers]


def test_every_avro_type_round_trips_into_arrow() -> None:
    table = table_schema(EVERYTHING)
    converter = RowConverter(table, Lookup({5: EVERYTHING}))
    result = converter.convert(chunk([wire(EVERYTHING, 5, record(n)) for n in range(12)]))
    assert result.errors == []
    assert result.batch.schema == avro_schema.arrow_schema(table)
    got = result.batch.to_pylist()
    for n, row in enumerate(got):
        assert row["_kafka_key"] == f"k{n}"
        assert row["_kafka_headers"] == [("h", b"v"), ("null", None)]
        assert row["_kafka_metadata"] == {
            "partition": 3,
            "offset": 100 + n,
            "timestamp": datetime.datetime.fromtimestamp((1_700_000_000_000 + n) / 1000, UTC),
        }
        want = expected_row(n)
        assert {k: row[k] for k in want} == want, n
    # timestamps are UTC microseconds
    assert result.batch.column("tsus").type == pa.timestamp("us", tz="UTC")
    assert (
        result.batch.column("tsus").cast(pa.int64())[0].as_py()
        == int(TS.timestamp() * 1_000_000) + 456
    )


def test_spark_flavor_gives_uuids_as_strings() -> None:
    no_time = {
        **EVERYTHING,
        "fields": [f for f in EVERYTHING["fields"] if f["name"] not in ("tmil", "tmic")],
    }
    table = table_schema(no_time)
    values = [wire(no_time, 5, record(n)) for n in range(2)]
    result = RowConverter(table, Lookup({5: no_time}), flavor="spark").convert(chunk(values))
    assert result.errors == []
    row = result.batch.to_pylist()[1]
    assert row["uid"] == row["uidf"] == str(UID)


def test_rows_append_to_a_pyiceberg_table(tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    table_schema_ = table_schema(EVERYTHING)
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=tmp_path.as_uri())
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.everything", schema=table_schema_)
    result = RowConverter(table.schema(), Lookup({5: EVERYTHING})).convert(
        chunk([wire(EVERYTHING, 5, record(n)) for n in range(6)])
    )
    table.append(pa.Table.from_batches([result.batch]))
    back = catalog.load_table("ns.everything").scan().to_arrow().sort_by("l").to_pylist()
    assert [r["_kafka_metadata"]["offset"] for r in back] == list(range(100, 106))
    assert [r["u"] for r in back] == [expected_row(n)["u"] for n in range(6)]
    assert back[1]["dec"] == decimal.Decimal("1.125") and back[0]["uid"] == UID


def test_complex_union_tags_are_exact_even_when_branches_look_alike() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "n", "type": ["int", "long", "float", "double"]},
            {
                "name": "t",
                "type": ["string", {"type": "enum", "name": "E", "symbols": ["A"]}, "bytes"],
            },
            {"name": "one", "type": ["long"]},
        ],
    }
    # fastavro's writer picks the first matching branch; write with explicit branches instead
    values = []
    for branch, value, t_branch, t_value in [
        ("int", 1, "string", "A"),
        ("long", 1, "E", "A"),
        ("float", 1.5, "bytes", b"A"),
        ("double", 1.5, "string", "x"),
    ]:
        values.append(wire(schema, 1, {"n": (branch, value), "t": (t_branch, t_value), "one": 9}))
    result = RowConverter(table_schema(schema), Lookup({1: schema})).convert(chunk(values))
    assert result.errors == []
    got = result.batch.to_pylist()
    assert [r["n"]["tag"] for r in got] == [0, 1, 2, 3]
    assert [r["t"]["tag"] for r in got] == [0, 1, 2, 0]
    assert got[1]["n"] == {"tag": 1, "field0": None, "field1": 1, "field2": None, "field3": None}
    assert got[2]["t"] == {"tag": 2, "field0": None, "field1": None, "field2": b"A"}
    assert got[0]["one"] == {"tag": 0, "field0": 9}


V1 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "total", "type": "float"},
    ],
}
V2 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "total", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "lines", "type": {"type": "array", "items": "string"}, "default": []},
    ],
}


def evolved_for(tmp_path: Path, *schemas: Any) -> Any:
    """The table made from the first schema and evolved for the others, as the round does it."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=tmp_path.as_uri())
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=table_schema(schemas[0]))
    for schema in schemas[1:]:
        with table.update_schema() as update:
            apply_schema_changes(update, plan_evolution(table.schema(), schema))
    return table.schema()


def test_old_and_new_writers_project_into_the_evolved_table(tmp_path: Path) -> None:
    table = evolved_for(tmp_path, V1, V2)
    lookup = Lookup({1: V1, 2: V2})
    values = [
        wire(V1, 1, {"id": 1, "total": 2.5}),
        wire(V2, 2, {"id": 2**40, "total": 0.1, "note": "n", "lines": ["a"]}),
        wire(V1, 1, {"id": 3, "total": 1.0}),
    ]
    result = RowConverter(table, lookup).convert(chunk(values))
    assert result.errors == []
    got = [{k: r[k] for k in ("id", "total", "note", "lines")} for r in result.batch.to_pylist()]
    assert got == [
        {"id": 1, "total": 2.5, "note": None, "lines": None},
        {"id": 2**40, "total": 0.1, "note": "n", "lines": ["a"]},
        {"id": 3, "total": 1.0, "note": None, "lines": None},
    ]
    assert sorted(lookup.calls) == [1, 2]  # one look-up per schema id
    assert schema_ids(chunk(values)) == {1, 2}


def test_a_writer_the_table_was_not_evolved_for_is_an_error_not_silent_loss() -> None:
    result = RowConverter(table_schema(V1), Lookup({1: V1, 2: V2})).convert(
        chunk(
            [
                wire(V1, 1, {"id": 1, "total": 2.5}),
                wire(V2, 2, {"id": 2, "total": 0.1, "note": None, "lines": []}),
            ]
        )
    )
    assert result.batch.num_rows == 1
    (error,) = result.errors
    assert error.error_class == rows.TABLE_SCHEMA_BEHIND and error.offset == 101
    assert "widen id to long" in error.message and "add note string" in error.message


def test_error_records_instead_of_exceptions() -> None:
    string_id = {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "id", "type": "string"}, {"name": "total", "type": "float"}],
    }
    lookup = Lookup({1: V1, 3: string_id})
    good = wire(V1, 1, {"id": 1, "total": 2.5})
    values: list[bytes | None] = [
        good,
        b"not wire format",
        b"\x00\x00\x00\x00\x63" + good[5:],  # unknown schema id 99
        good[:6],  # the Avro body cut short
        good + b"\x00\x00",  # trailing bytes
        wire(string_id, 3, {"id": "x", "total": 1.0}),  # a type the column cannot take
        None,  # a tombstone, but id and total are required
        good,
    ]
    keys: list[bytes | None] = [
        b"k" if i < 7 else b"\xff\xfe" for i in range(8)
    ]  # the last is not UTF-8
    result = RowConverter(table_schema(V1), lookup).convert(chunk(values, keys))
    assert (
        result.batch.num_rows == 1
        and result.batch.column("_kafka_metadata")[0]["offset"].as_py() == 100
    )
    classes = {e.offset - 100: e.error_class for e in result.errors}
    assert classes == {
        1: rows.MISSING_WIRE_HEADER,
        2: rows.UNKNOWN_SCHEMA,
        3: rows.AVRO_DECODE,
        4: rows.TRAILING_BYTES,
        5: rows.INCOMPATIBLE_SCHEMA,
        6: rows.NULL_IN_REQUIRED,
        7: rows.INVALID_UTF8,
    }
    by_offset = {e.offset - 100: e for e in result.errors}
    assert "schema id 99" in by_offset[2].message
    assert "tombstone" in by_offset[6].message and "column id is required" in by_offset[6].message
    assert by_offset[1].value == b"not wire format" and by_offset[1].headers == (
        ("h", b"v"),
        ("null", None),
    )
    dlq = errors_to_arrow(result.errors)
    assert dlq.schema == rows.DLQ_ARROW_SCHEMA and dlq.num_rows == 7
    assert dlq.column("error_class").to_pylist()[0] == rows.MISSING_WIRE_HEADER


def test_a_value_arrow_cannot_hold_fails_only_its_row() -> None:
    # the writer claims decimal(4, 2) but writes a larger unscaled number (Avro does not check)
    schema = {
        "type": "record",
        "name": "P",
        "fields": [
            {
                "name": "p",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2},
            }
        ],
    }
    too_big = (
        b"\x00\x00\x00\x00\x01" + bytes([6]) + (1234567).to_bytes(3, "big")
    )  # length 3 zigzag = 6
    result = RowConverter(table_schema(schema), Lookup({1: schema})).convert(
        chunk([wire(schema, 1, {"p": decimal.Decimal("12.34")}), too_big])
    )
    assert [r["p"] for r in result.batch.to_pylist()] == [decimal.Decimal("12.34")]
    (error,) = result.errors
    assert error.error_class == rows.ARROW_CONVERSION


def test_keys_by_schema_id_and_raw() -> None:
    key_schema = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]}
    table = table_schema(V1, key_type="by_schema_id", key_schema=key_schema)
    lookup = Lookup({1: V1, 9: key_schema})
    value = wire(V1, 1, {"id": 1, "total": 1.0})
    result = RowConverter(table, lookup, key_type="by_schema_id").convert(
        chunk([value, value, value], keys=[wire(key_schema, 9, {"id": 77}), None, b"plain"])
    )
    assert [r["_kafka_key"] for r in result.batch.to_pylist()] == [{"id": 77}, None]
    assert [e.error_class for e in result.errors] == [rows.MISSING_WIRE_HEADER]
    assert "key lacks" in result.errors[0].message
    raw = RowConverter(table_schema(V1, key_type="raw"), lookup, key_type="raw").convert(
        chunk([value, value], keys=[b"\xff\x00", None])
    )
    assert [r["_kafka_key"] for r in raw.batch.to_pylist()] == [b"\xff\x00", None]


@pytest.mark.parametrize(
    "value_type, arrow_type, expected",
    [
        ("raw", pa.binary(), [b"\xffbin", None, "ünï".encode()]),
        ("string", pa.string(), [None, None, "ünï"]),  # the first is not UTF-8: an error record
    ],
)
def test_raw_and_string_values_fill_kafka_value(
    value_type: str, arrow_type: pa.DataType, expected: list[Any]
) -> None:
    table = table_schema(value_type=value_type)
    result = RowConverter(table, value_type=value_type).convert(
        chunk([b"\xffbin", None, "ünï".encode()])
    )
    assert result.batch.schema.field("_kafka_value").type == arrow_type
    got = [r["_kafka_value"] for r in result.batch.to_pylist()]
    if value_type == "string":
        assert got == expected[1:] and [e.error_class for e in result.errors] == [rows.INVALID_UTF8]
    else:
        assert got == expected and result.errors == []


def test_transform_none_keeps_the_value_as_one_struct_and_allows_tombstones() -> None:
    table = table_schema(V1, transform="none")
    result = RowConverter(table, Lookup({1: V1})).convert(
        chunk([wire(V1, 1, {"id": 5, "total": 0.5}), None])
    )
    assert result.errors == []
    assert [r["_kafka_value"] for r in result.batch.to_pylist()] == [{"id": 5, "total": 0.5}, None]


def test_required_nested_nulls_are_found_under_valid_parents_only() -> None:
    # the table requires s.x, but this writer (registered later, table not evolved) has it optional:
    # decode plans would refuse it, so check the validator directly on an Arrow batch
    from pyiceberg.types import IntegerType, ListType, MapType, NestedField, StringType, StructType

    s_type = StructType(NestedField(2, "x", IntegerType(), required=True))
    field = NestedField(1, "s", s_type, required=False)
    array = pa.array([{"x": 1}, None, {"x": None}], avro_schema.arrow_type(s_type))
    bad: dict[int, Any] = {}
    rows._check_required(array, field, "s", bad)
    assert sorted(bad) == [2] and "s.x" in bad[2].message
    lists = NestedField(3, "l", ListType(4, IntegerType(), element_required=True), required=True)
    bad = {}
    rows._check_required(pa.array([[1], None, [2, None]], pa.list_(pa.int32())), lists, "l", bad)
    assert sorted(bad) == [1, 2] and "l.element" in bad[2].message
    maps = NestedField(
        5, "m", MapType(6, StringType(), 7, IntegerType(), value_required=True), required=False
    )
    bad = {}
    rows._check_required(
        pa.array([[("a", 1)], [("b", None)], None], pa.map_(pa.string(), pa.int32())),
        maps,
        "m",
        bad,
    )
    assert sorted(bad) == [1] and "m.value" in bad[1].message


def test_converter_configuration_errors() -> None:
    with pytest.raises(ValueError, match="by_latest_schema is not supported yet"):
        RowConverter(table_schema(V1), Lookup({}), value_type="by_latest_schema")
    with pytest.raises(ValueError, match="needs a schema lookup"):
        RowConverter(table_schema(V1))
    with pytest.raises(ValueError, match="needs a _kafka_value column"):
        RowConverter(table_schema(V1), value_type="raw")
    with pytest.raises(ValueError, match="of type binary"):
        RowConverter(table_schema(value_type="string"), value_type="raw")


def test_error_dataclass_is_plain() -> None:
    e = DecodeError(1, 2, 3, "X", "m", None, b"v")
    assert copy.copy(e) == e and e.headers == ()
