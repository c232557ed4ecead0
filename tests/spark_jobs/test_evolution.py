"""Schema evolution planning, checked on pyiceberg schemas and applied to a real pyiceberg table."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

from spark_jobs.decode.avro_schema import table_schema
from spark_jobs.rounds.evolution import (
    AddColumn,
    IncompatibleSchemaChange,
    MakeOptional,
    WidenColumn,
    apply_schema_changes,
    describe,
    plan_evolution,
    plan_schema_update,
)

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "amount", "type": "float"},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {
            "name": "customer",
            "type": {
                "type": "record",
                "name": "Customer",
                "fields": [{"name": "name", "type": "string"}],
            },
        },
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Line",
                    "fields": [{"name": "sku", "type": "string"}],
                },
            },
        },
        {
            "name": "attrs",
            "type": {
                "type": "map",
                "values": {
                    "type": "record",
                    "name": "Attr",
                    "fields": [{"name": "v", "type": "string"}],
                },
            },
        },
        {"name": "scores", "type": {"type": "array", "items": "int"}},
        {"name": "legacy", "type": "string"},
    ],
}


def evolve(**edits: Any) -> dict[str, Any]:
    """V1 with some fields replaced (name -> Avro type), added, or removed (None)."""
    schema = copy.deepcopy(V1)
    fields = {f["name"]: f for f in schema["fields"]}
    for name, avro_type in edits.items():
        if avro_type is None:
            schema["fields"] = [f for f in schema["fields"] if f["name"] != name]
        elif name in fields:
            fields[name]["type"] = avro_type
        else:
            schema["fields"].append({"name": name, "type": avro_type, "doc": f"new {name}"})
    return schema


def line(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Line", "fields": [{"name": n, "type": t} for n, t in fields]}


CURRENT = table_schema(V1)


def test_the_same_schema_needs_nothing() -> None:
    assert plan_evolution(CURRENT, V1) == []


def test_new_fields_are_added_optional_at_every_level() -> None:
    new = evolve(
        note=["null", "string"],
        tier="int",  # required in Avro, added as optional: old rows have no value
        customer={
            "type": "record",
            "name": "Customer",
            "fields": [
                {"name": "name", "type": "string"},
                {"name": "email", "type": ["null", "string"]},
            ],
        },
        lines={"type": "array", "items": line(("sku", "string"), ("qty", "int"))},
        attrs={
            "type": "map",
            "values": {
                "type": "record",
                "name": "Attr",
                "fields": [{"name": "v", "type": "string"}, {"name": "unit", "type": "string"}],
            },
        },
    )
    changes = plan_evolution(CURRENT, new)
    assert changes == [
        AddColumn(("customer", "email"), StringType()),
        AddColumn(("lines", "element", "qty"), IntegerType()),
        AddColumn(("attrs", "value", "unit"), StringType()),
        AddColumn(("note",), StringType(), "new note"),
        AddColumn(("tier",), IntegerType(), "new tier"),
    ]
    assert describe(changes)[0] == "add customer.email string"


def test_promotions_widen() -> None:
    new = evolve(
        id="long",
        amount="double",
        price={"type": "bytes", "logicalType": "decimal", "precision": 18, "scale": 2},
        scores={"type": "array", "items": "long"},
    )
    assert plan_evolution(CURRENT, new) == [
        WidenColumn(("id",), LongType()),
        WidenColumn(("amount",), DoubleType()),
        WidenColumn(("price",), DecimalType(18, 2)),
        WidenColumn(("scores", "element"), LongType()),
    ]


def test_optional_or_removed_fields_make_the_column_optional() -> None:
    new = evolve(
        legacy=None,
        customer=["null", V1["fields"][3]["type"]],
        scores={"type": "array", "items": ["null", "int"]},
    )
    assert plan_evolution(CURRENT, new) == [
        MakeOptional(("customer",)),
        MakeOptional(("scores", "element")),
        MakeOptional(("legacy",)),
    ]


def test_narrower_writers_are_accepted_unless_refused() -> None:
    widened = table_schema(evolve(id="long", amount="double"))
    assert plan_evolution(widened, V1) == []  # old producers still write int and float
    with pytest.raises(
        IncompatibleSchemaChange, match="column id: cannot change long to int: .*narrower"
    ):
        plan_evolution(widened, V1, refuse_narrowing=True)
    assert (
        plan_evolution(table_schema(evolve(tier=["null", "int"])), V1) == []
    )  # a dropped optional column


@pytest.mark.parametrize(
    "edits, column, message",
    [
        (
            {"id": "double"},
            "id",
            "not an Iceberg type promotion",
        ),  # Avro promotes int->double; Iceberg does not
        ({"legacy": "int"}, "legacy", "not an Iceberg type promotion"),
        (
            {"legacy": "bytes"},
            "legacy",
            "not an Iceberg type promotion",
        ),  # Avro reads string as bytes
        (
            {"price": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 3}},
            "price",
            "promotion",
        ),
        ({"customer": "string"}, "customer", "a different kind of type"),
        (
            {"legacy": {"type": "record", "name": "L", "fields": []}},
            "legacy",
            "a different kind of type",
        ),
        ({"scores": {"type": "map", "values": "int"}}, "scores", "a different kind of type"),
        (
            {"lines": {"type": "array", "items": line(("sku", "long"))}},
            "lines.element.sku",
            "promotion",
        ),
        (
            {
                "attrs": {
                    "type": "array",
                    "logicalType": "map",
                    "items": {
                        "type": "record",
                        "name": "KV",
                        "fields": [
                            {"name": "key", "type": "int"},
                            {"name": "value", "type": V1["fields"][5]["type"]["values"]},
                        ],
                    },
                }
            },
            "attrs.key",
            "map keys",
        ),
        # a union branch inserted in the middle shifts the fieldN columns
        ({"legacy": ["int", "string"]}, "legacy", "a different kind of type"),
    ],
)
def test_incompatible_changes_are_refused_with_the_column(
    edits: dict[str, Any], column: str, message: str
) -> None:
    with pytest.raises(IncompatibleSchemaChange, match=message) as caught:
        plan_evolution(CURRENT, evolve(**edits))
    assert ".".join(caught.value.path) == column


def test_complex_union_gaining_a_branch_at_the_end_adds_a_field() -> None:
    current = table_schema(evolve(legacy=["null", "int", "string"]))
    assert plan_evolution(current, evolve(legacy=["null", "int", "string", "double"])) == [
        AddColumn(("legacy", "field2"), DoubleType())
    ]
    with pytest.raises(IncompatibleSchemaChange, match="legacy.field0"):
        plan_evolution(current, evolve(legacy=["null", "string", "int"]))


def test_on_plain_pyiceberg_schemas() -> None:
    current = Schema(
        NestedField(1, "a", IntegerType(), required=True),
        NestedField(
            2, "s", StructType(NestedField(3, "x", IntegerType(), required=True)), required=False
        ),
    )
    target = Schema(
        NestedField(7, "a", LongType(), required=False),
        NestedField(
            8,
            "s",
            StructType(
                NestedField(9, "x", IntegerType(), required=True),
                NestedField(10, "y", StringType(), required=True),
            ),
            required=True,
        ),
    )
    assert plan_schema_update(current, target) == [
        WidenColumn(("a",), LongType()),
        MakeOptional(("a",)),
        AddColumn(("s", "y"), StringType()),
    ]


def test_applied_to_a_real_table_the_plan_gives_the_new_schema_and_keeps_ids(
    tmp_path: Path,
) -> None:
    catalog = SqlCatalog(
        "t", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=tmp_path.as_uri()
    )
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.orders", schema=CURRENT)
    before = {
        name: table.schema().find_field(name).field_id
        for name in ("id", "customer.name", "lines.element.sku")
    }
    new = evolve(
        id="long",
        amount="double",
        legacy=None,
        note=["null", "string"],
        price={"type": "bytes", "logicalType": "decimal", "precision": 18, "scale": 2},
        customer={
            "type": "record",
            "name": "Customer",
            "fields": [
                {"name": "name", "type": "string"},
                {"name": "email", "type": ["null", "string"]},
            ],
        },
        lines={"type": "array", "items": line(("sku", "string"), ("qty", "int"))},
        attrs={
            "type": "map",
            "values": {
                "type": "record",
                "name": "Attr",
                "fields": [{"name": "v", "type": "string"}, {"name": "unit", "type": "string"}],
            },
        },
        scores={"type": "array", "items": ["null", "long"]},
    )
    changes = plan_evolution(table.schema(), new)
    with table.update_schema() as update:
        apply_schema_changes(update, changes)
    table = catalog.load_table("ns.orders")
    evolved = table.schema()
    assert plan_evolution(evolved, new) == []  # nothing left to do
    assert {name: evolved.find_field(name).field_id for name in before} == before
    assert evolved.find_field("id").field_type == LongType()
    assert evolved.find_field("price").field_type == DecimalType(18, 2)
    assert not evolved.find_field("legacy").required
    assert not evolved.find_field("lines.element.qty").required
    assert evolved.find_field("attrs.value.unit").field_type == StringType()
    assert evolved.find_field("scores.element").field_type == LongType()
    assert not evolved.find_field("scores").field_type.element_required  # type: ignore[attr-defined]
    assert evolved.find_field("note").doc == "new note"
