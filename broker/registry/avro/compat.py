"""Avro reader/writer compatibility: the Apache `avro` package's checker, Confluent's rules.

Confluent's registry uses Avro's Java ``SchemaCompatibility``; the `avro` package's
``ReaderWriterCompatibilityChecker`` is its Python port (same rules: name and alias
matching, reader fields missing from the writer need a default, enum symbols unless the
reader has a default symbol, fixed sizes, the int->long->float->double and
string<->bytes promotions, union branches, recursion cut by memoising pairs). Two
shims keep its results what Confluent reports, each pinned by a test in
tests/broker/registry/test_compat.py:

* **Paired details.** The port merges every incompatibility's message and location into
  two unordered sets, so which message belongs to which place is lost (Java keeps them
  paired). While one check runs, the module's ``incompatible`` builds its results with a
  ``Detail`` (type, message, location) in place of the bare type; merging only
  concatenates those lists, so the final result lists exactly the incompatibilities that
  count, each with its own message and location. Outside our checks (a context variable
  says so) it behaves as before. Test: test_avro_reports_every_incompatibility.
* **Writer-union locations.** The port checks each branch of a writer union against a
  non-union reader without passing the location on, so the problems of a branch are
  reported at "/" (Java reports ``.../<branch index>``). ``_ConfluentChecker`` passes it.
  Test: test_avro_messages_name_the_rule_and_path (the writer's null branch).

Field default values and alias qualification are handled when parsing
(broker/registry/avro/schema.py).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

import avro.compatibility as avro_compat
import avro.schema

from broker.registry.compat_common import Incompatibility


@dataclass(frozen=True)
class Detail:
    """One incompatibility as the `avro` package found it, kept whole."""

    kind: avro_compat.SchemaIncompatibilityType
    message: str
    location: str


_paired = contextvars.ContextVar("avro_compat_paired", default=False)
_incompatible = avro_compat.incompatible


def _paired_incompatible(
    incompat_type: avro_compat.SchemaIncompatibilityType, message: str, location: list[str]
) -> avro_compat.SchemaCompatibilityResult:
    result = _incompatible(incompat_type, message, location)
    if _paired.get():
        [where] = result.locations
        result.incompatibilities = [Detail(incompat_type, message, where)]  # type: ignore[list-item]
    return result


avro_compat.incompatible = _paired_incompatible  # the module's own functions look it up here


class _ConfluentChecker(avro_compat.ReaderWriterCompatibilityChecker):
    def calculate_compatibility(
        self, reader: avro.schema.Schema, writer: avro.schema.Schema, location: list[str]
    ) -> avro_compat.SchemaCompatibilityResult:
        if isinstance(writer, avro.schema.UnionSchema) and reader.type != "union":
            result = avro_compat.CompatibleResult
            for index, branch in enumerate(writer.schemas):
                found = self.get_compatibility(reader, branch, str(index), location)
                result = avro_compat.merge(result, found)
            return result
        return super().calculate_compatibility(reader, writer, location)


def check_avro_schemas(
    reader: avro.schema.Schema, writer: avro.schema.Schema
) -> list[Incompatibility]:
    """Every reason data written with ``writer`` cannot be read with ``reader``, on already
    parsed schemas (lets callers parse each version once)."""
    token = _paired.set(True)
    try:
        result = _ConfluentChecker().get_compatibility(reader, writer)
    finally:
        _paired.reset(token)
    return [_render(d) for d in result.incompatibilities if isinstance(d, Detail)]


_DESCRIPTIONS: dict[str, str] = {
    "name_mismatch": "the name of a type in {reader} differs from {writer} ({message})",
    "fixed_size_mismatch": "the size of a fixed type in {reader} differs from {writer} ({message})",
    "missing_enum_symbols": "an enum in {reader} lacks symbols {message} of {writer} and has "
    "no default symbol",
    "reader_field_missing_default_value": "the field '{message}' in {reader} has no default "
    "value and is missing in {writer}",
    "type_mismatch": "a type in {reader} cannot read the type in {writer} ({message})",
    "missing_union_branch": "a union in {reader} cannot read a type in {writer} ({message})",
}


def _render(detail: Detail) -> Incompatibility:
    template = _DESCRIPTIONS[detail.kind.value]
    # {reader}/{writer} stay placeholders for Incompatibility.render.
    text = template.replace("{message}", detail.message)
    return Incompatibility(detail.kind.value.upper(), detail.location, text)
