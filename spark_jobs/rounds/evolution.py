"""Schema evolution planning: what a table must change to take records of a new Avro schema.

A pure function of (the table's current Iceberg schema, the schema the new
records need), so the commit round can plan on the driver, log the plan, refuse
a bad one before writing anything, and apply it with ``table.update_schema()``
in the same transaction as the data. Columns are matched by name (Avro
resolves fields by name too); nothing is ever dropped or renamed.

Allowed, and planned:

- a field the table lacks -> add it (nested too, inside structs, list
  elements and map values), always as an optional column: Iceberg v1/v2
  cannot add a required column because old rows have no value for it;
- int -> long, float -> double, decimal(P, S) -> decimal(P', S) with P' > P
  (Iceberg's type promotions);
- a column required in the table but optional in the new schema, or absent
  from it -> make it optional (new rows will not have a value for it).

Accepted without a change: a new type the column already holds (int into a
long column, float into double, a narrower decimal), a field that became
required, a column the new schema no longer has (kept, and made optional).
Old producers keep writing the old schema after a widening, so "the new
schema is narrower than the table" is normal and must not fail the round;
pass ``refuse_narrowing=True`` to treat it as an error instead.

Anything else raises ``IncompatibleSchemaChange`` naming the column: a
change of type that is not a promotion (long -> double, string -> int,
fixed[8] -> fixed[16], decimal scale change), a struct that became a
primitive, a map key type change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StructType,
)

from spark_jobs.decode.avro_schema import AvroSchemaLike, table_schema

Path = tuple[str, ...]


class IncompatibleSchemaChange(ValueError):
    """The new schema cannot be taken by the table without rewriting its data."""

    def __init__(self, path: Path, current: IcebergType, new: IcebergType, reason: str) -> None:
        self.path = path
        self.current = current
        self.new = new
        self.reason = reason
        super().__init__(f"column {'.'.join(path)}: cannot change {current} to {new}: {reason}")


@dataclass(frozen=True)
class AddColumn:
    """``update.add_column(path, field_type, doc)``; ``path`` goes through
    list elements and map values by their names ``element`` and ``value``."""

    path: Path
    field_type: IcebergType
    doc: str | None = None


@dataclass(frozen=True)
class WidenColumn:
    """``update.update_column(path, field_type=new_type)``."""

    path: Path
    new_type: PrimitiveType


@dataclass(frozen=True)
class MakeOptional:
    """``update.make_column_optional(path)``."""

    path: Path


SchemaChange = AddColumn | WidenColumn | MakeOptional


def plan_schema_update(
    current: Schema, target: Schema, *, refuse_narrowing: bool = False
) -> list[SchemaChange]:
    """The changes that let ``current`` take rows of ``target`` (ids of ``target`` are ignored)."""
    changes: list[SchemaChange] = []
    _struct(current.as_struct(), target.as_struct(), (), changes, refuse_narrowing)
    return changes


def plan_evolution(
    current: Schema,
    value_schema: AvroSchemaLike | None,
    *,
    refuse_narrowing: bool = False,
    **table_options: Any,
) -> list[SchemaChange]:
    """``plan_schema_update`` against the table schema a new Avro value schema
    gives (``table_options``: ``key_type``, ``value_type``, ``transform``,
    ``key_schema``, ``format_version``, as for ``avro_schema.table_schema``)."""
    return plan_schema_update(
        current, table_schema(value_schema, **table_options), refuse_narrowing=refuse_narrowing
    )


def apply_schema_changes(update: UpdateSchema, changes: Sequence[SchemaChange]) -> UpdateSchema:
    """Stage the planned changes on ``table.update_schema()`` (or a transaction's)."""
    for change in changes:
        if isinstance(change, AddColumn):
            update.add_column(change.path, change.field_type, doc=change.doc)
        elif isinstance(change, WidenColumn):
            update.update_column(change.path, field_type=change.new_type)
        else:
            update.make_column_optional(change.path)
    return update


def describe(changes: Sequence[SchemaChange]) -> list[str]:
    """One line per change, for logs and the round's result JSON."""
    out = []
    for change in changes:
        name = ".".join(change.path)
        if isinstance(change, AddColumn):
            out.append(f"add {name} {change.field_type}")
        elif isinstance(change, WidenColumn):
            out.append(f"widen {name} to {change.new_type}")
        else:
            out.append(f"make {name} optional")
    return out


# ---------------------------------------------------------------- the walk


def can_promote(old: IcebergType, new: IcebergType) -> bool:
    """Iceberg's type promotions (spec, "Schema Evolution"); pyiceberg's own
    ``promote`` also allows string<->binary and fixed->uuid, which are read
    conversions, not table evolutions."""
    if isinstance(old, IntegerType) and isinstance(new, LongType):
        return True
    if isinstance(old, FloatType) and isinstance(new, DoubleType):
        return True
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return old.scale == new.scale and old.precision < new.precision
    return False


def _struct(
    current: StructType, target: StructType, path: Path, changes: list[SchemaChange], strict: bool
) -> None:
    names = {f.name: f for f in current.fields}
    wanted = {f.name for f in target.fields}
    for field in target.fields:
        existing = names.get(field.name)
        if existing is None:
            changes.append(AddColumn(path + (field.name,), field.field_type, field.doc))
            continue
        _field(existing, field, path + (field.name,), changes, strict)
    for field in current.fields:
        if field.name not in wanted and field.required:
            changes.append(MakeOptional(path + (field.name,)))


def _field(
    current: NestedField, target: NestedField, path: Path, changes: list[SchemaChange], strict: bool
) -> None:
    _type(current.field_type, target.field_type, path, changes, strict)
    if current.required and not target.required:
        changes.append(MakeOptional(path))


def _type(
    current: IcebergType, target: IcebergType, path: Path, changes: list[SchemaChange], strict: bool
) -> None:
    if isinstance(current, StructType) and isinstance(target, StructType):
        _struct(current, target, path, changes, strict)
    elif isinstance(current, ListType) and isinstance(target, ListType):
        _field(current.element_field, target.element_field, path + ("element",), changes, strict)
    elif isinstance(current, MapType) and isinstance(target, MapType):
        if current.key_type != target.key_type:
            raise IncompatibleSchemaChange(
                path + ("key",), current.key_type, target.key_type, "map keys cannot change type"
            )
        _field(current.value_field, target.value_field, path + ("value",), changes, strict)
    elif isinstance(current, PrimitiveType) and isinstance(target, PrimitiveType):
        if current == target:
            return
        if can_promote(current, target):
            changes.append(WidenColumn(path, target))
        elif can_promote(target, current):
            if strict:
                raise IncompatibleSchemaChange(
                    path, current, target, "the new type is narrower than the column"
                )
        else:
            raise IncompatibleSchemaChange(path, current, target, "not an Iceberg type promotion")
    else:
        raise IncompatibleSchemaChange(path, current, target, "a different kind of type")
