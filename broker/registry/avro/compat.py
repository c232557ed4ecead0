"""Avro reader/writer compatibility: the schema-resolution rules of the Avro spec.

This follows Avro's own `SchemaCompatibility` (which Confluent's registry uses) rule for
rule, so that a subject accepted or rejected here would be accepted or rejected there:

* same kind: records match names (reader aliases allowed) and then fields — every reader
  field is looked up in the writer by name, then by the reader field's aliases, and a
  reader field absent from the writer needs a default; enums match names and the writer's
  symbols must all be in the reader unless the reader declares a default symbol; fixed
  match names and size; arrays/maps compare items/values; a writer union is compatible
  when each of its branches is;
* different kinds: a writer union needs every branch readable; otherwise the promotions
  int->long/float/double, long->float/double, float->double and string<->bytes apply,
  and a reader union needs at least one branch that can read the writer.

Names compare unqualified (as Avro does), logical types are ignored, and recursion is
cut by memoising (reader, writer) pairs: a pair met again while being checked is
assumed compatible, which is sound because any real incompatibility is found on the
first, outer visit.
"""

from __future__ import annotations

from broker.registry.avro.schema import AvroField, AvroNode
from broker.registry.compat_common import Incompatibility

_PROMOTIONS: dict[str, frozenset[str]] = {
    "long": frozenset({"int"}),
    "float": frozenset({"int", "long"}),
    "double": frozenset({"int", "long", "float"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}

_Result = list[Incompatibility]


def check_avro_nodes(reader: AvroNode, writer: AvroNode) -> list[Incompatibility]:
    """Every reason data written with ``writer`` cannot be read with ``reader``, on already
    parsed schemas (lets callers parse each version once)."""
    return _Checker().check(reader, writer, "")


class _Checker:
    def __init__(self) -> None:
        # (id(reader), id(writer)) -> result; None while the pair is being checked.
        self.memo: dict[tuple[int, int], _Result | None] = {}

    def check(self, reader: AvroNode, writer: AvroNode, path: str) -> _Result:
        key = (id(reader), id(writer))
        if key in self.memo:
            return self.memo[key] or []
        self.memo[key] = None
        result = self.compute(reader, writer, path)
        self.memo[key] = result
        return result

    def compute(self, reader: AvroNode, writer: AvroNode, path: str) -> _Result:
        if reader.kind == writer.kind:
            return self.same_kind(reader, writer, path)
        if writer.kind == "union":
            return [
                issue
                for index, branch in enumerate(writer.branches)
                for issue in self.check(reader, branch, f"{path}/{index}")
            ]
        if writer.kind in _PROMOTIONS.get(reader.kind, frozenset()):
            return []
        if reader.kind == "union":
            for branch in reader.branches:
                if not self.check(branch, writer, path):
                    return []
            return [
                Incompatibility(
                    "MISSING_UNION_BRANCH",
                    path,
                    f"the union of {{reader}} ({reader.describe()}) has no branch that can read "
                    f"type {writer.describe()} of {{writer}}",
                )
            ]
        return [_type_mismatch(reader, writer, path)]

    def same_kind(self, reader: AvroNode, writer: AvroNode, path: str) -> _Result:
        kind = reader.kind
        if kind == "record":
            return _name_check(reader, writer, path) + self.record_fields(reader, writer, path)
        if kind == "enum":
            return _name_check(reader, writer, path) + _enum_symbols(reader, writer, path)
        if kind == "fixed":
            issues = _name_check(reader, writer, path)
            if reader.size != writer.size:
                issues.append(
                    Incompatibility(
                        "FIXED_SIZE_MISMATCH",
                        f"{path}/size",
                        f"the size of fixed '{reader.fullname}' is {reader.size} in {{reader}} "
                        f"but {writer.size} in {{writer}}",
                    )
                )
            return issues
        if kind in ("array", "map"):
            assert reader.items is not None and writer.items is not None
            step = "items" if kind == "array" else "values"
            return self.check(reader.items, writer.items, f"{path}/{step}")
        if kind == "union":
            return [
                issue
                for index, branch in enumerate(writer.branches)
                for issue in self.check(reader, branch, f"{path}/{index}")
            ]
        return []  # identical primitives

    def record_fields(self, reader: AvroNode, writer: AvroNode, path: str) -> _Result:
        issues: _Result = []
        writer_fields = {f.name: f for f in writer.fields}
        for rfield in reader.fields:
            fpath = f"{path}/fields/{rfield.pos}"
            wfield = _lookup_writer_field(writer_fields, rfield)
            if wfield is not None:
                issues += self.check(rfield.type, wfield.type, f"{fpath}/type")
            elif not rfield.has_default:
                issues.append(
                    Incompatibility(
                        "READER_FIELD_MISSING_DEFAULT_VALUE",
                        fpath,
                        f"the field '{rfield.name}' of record '{reader.fullname}' in {{reader}} has "
                        "no default value and is missing in {writer}",
                    )
                )
        return issues


def _lookup_writer_field(
    writer_fields: dict[str, AvroField], rfield: AvroField
) -> AvroField | None:
    """The writer field a reader field reads: same name first, then the reader's aliases."""
    if rfield.name in writer_fields:
        return writer_fields[rfield.name]
    for alias in rfield.aliases:
        if alias in writer_fields:
            return writer_fields[alias]
    return None


def _name_check(reader: AvroNode, writer: AvroNode, path: str) -> _Result:
    """Avro's schemaNameEquals: equal unqualified names, or a reader alias naming the writer."""
    if reader.name == writer.name or writer.fullname in reader.aliases:
        return []
    return [
        Incompatibility(
            "NAME_MISMATCH",
            f"{path}/name",
            f"the {reader.kind} is named '{reader.fullname}' in {{reader}} but "
            f"'{writer.fullname}' in {{writer}} (and no alias of the former matches)",
        )
    ]


def _enum_symbols(reader: AvroNode, writer: AvroNode, path: str) -> _Result:
    missing = [s for s in writer.symbols if s not in reader.symbols]
    if not missing or reader.enum_default is not None:
        return []
    return [
        Incompatibility(
            "MISSING_ENUM_SYMBOLS",
            f"{path}/symbols",
            f"enum '{reader.fullname}' in {{reader}} lacks symbols {missing} of {{writer}} "
            "and has no default symbol",
        )
    ]


def _type_mismatch(reader: AvroNode, writer: AvroNode, path: str) -> Incompatibility:
    return Incompatibility(
        "TYPE_MISMATCH",
        path,
        f"type {reader.describe()} of {{reader}} cannot read type {writer.describe()} "
        "of {writer}",
    )
