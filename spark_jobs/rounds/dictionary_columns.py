"""Which columns of a data file are worth a Parquet dictionary, decided from its first rows.

pyarrow's Parquet writer dictionary-encodes every column and gives a column chunk's
dictionary up only when it outgrows ``write.parquet.dict-size-bytes``. A column of
(nearly) unique fixed-width values, such as a Kafka offset, an id or an event time,
never outgrows it in a row group of tens of thousands of rows, so each row group
stores its values twice (the dictionary, then an index per row) and hashes every
value on the way: on the 16-field benchmark data the Kafka offset and timestamp, the
id and the event time cost the streamed writer ~18 % of its CPU and made the file
larger (``bench/BENCHMARKS.md``, "Parquet dictionaries only where they pay").

parquet-mr, which Spark and Iceberg's Java writers use, checks each column chunk's
first page instead and falls back to plain encoding when the dictionary and the
indices together are not smaller than the raw values
(``DictionaryValuesWriter.isCompressionSatisfying``). pyarrow has no such check and
takes its choice once per file, so ``dictionary_columns`` applies that test once per
file, to its first page's worth of rows (``write.parquet.page-row-limit``, 20,000 by
default) of its first row group: for each fixed-width leaf, the distinct values times
their Parquet width plus an index of ``ceil(log2(distinct))`` bits per value, against
the width per value. A column whose first rows say "plain" stays plain for the whole
file, where parquet-mr would test each row group again.

Strings and binaries keep their dictionary: counting their distinct values would cost
as much as the dictionary it might save, and pyarrow already drops a string dictionary
that outgrows its limit. Decimals and the leaves inside lists and maps keep it too;
booleans are never dictionary-encoded by Parquet. A schema with a nested type other
than struct, list and map gets pyarrow's default for every column (``True``): a path
named wrongly would silently lose its column the dictionary.

The answer is the column paths (``a.b`` for a struct's field, ``m.key_value.key``,
``l.list.element``: the paths pyarrow's writer gives them) for pyarrow's
``use_dictionary``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

# Rows of the first row group the test looks at when the table does not say: Iceberg's default
# ``write.parquet.page-row-limit``, a page as parquet-mr tests it. Counting the distinct
# values of 20,000 rows costs ~1 ms per fixed-width column, once per file.
SAMPLE_ROWS = 20_000


class _UnknownNesting(Exception):
    """A nested type whose Parquet column paths are not named here."""


def _leaves(fields: list[pa.Field], prefix: str, analysable: bool) -> Iterator[tuple[str, bool]]:
    """Every leaf's Parquet path, and whether its values can be counted here (a fixed-width
    leaf reached through structs only)."""
    for f in fields:
        path = prefix + f.name
        kind = f.type
        if pa.types.is_struct(kind):
            yield from _leaves(list(kind), path + ".", analysable)
        elif pa.types.is_map(kind):  # Parquet's names, whatever Arrow's fields are called
            entries = [kind.key_field.with_name("key"), kind.item_field.with_name("value")]
            yield from _leaves(entries, path + ".key_value.", False)
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            yield from _leaves([kind.value_field.with_name("element")], path + ".list.", False)
        elif pa.types.is_nested(kind):
            raise _UnknownNesting(f"{path}: {kind}")
        else:
            fixed = pa.types.is_integer(kind) or pa.types.is_floating(kind)
            yield path, analysable and (fixed or pa.types.is_temporal(kind))


def _dictionary_pays(column: pa.ChunkedArray) -> bool:
    """parquet-mr's test: the dictionary and its indices smaller than the plain values."""
    values = len(column) - column.null_count
    if values == 0:
        return True
    distinct = pc.count_distinct(column).as_py()
    kind = column.type
    width = (
        4 if kind.bit_width <= 32 or pa.types.is_date64(kind) else 8
    )  # INT32 or INT64, FLOAT, DOUBLE
    index_bits = max(1, math.ceil(math.log2(max(distinct, 2))))
    return distinct * width + values * index_bits / 8 < values * width


def column_paths(schema: pa.Schema) -> list[str]:
    """Every leaf column's path, as pyarrow's Parquet writer names it (struct, list and map
    nesting only: ``ValueError`` for another nested type)."""
    try:
        return [path for path, _ in _leaves(list(schema), "", True)]
    except _UnknownNesting as exc:
        raise ValueError(f"no Parquet column paths for {exc}") from exc


def dictionary_columns(first: pa.Table, sample_rows: int = SAMPLE_ROWS) -> list[str] | bool:
    """The column paths to dictionary-encode in a file whose first row group is ``first``
    (judged on its first ``sample_rows`` rows), or ``True`` (every column) for a schema with
    a nested type other than struct, list and map."""
    try:
        leaves = list(_leaves(list(first.schema), "", True))
    except _UnknownNesting:
        return True
    sample = first.slice(0, max(sample_rows, 1)).flatten()
    while any(pa.types.is_struct(f.type) for f in sample.schema):
        sample = sample.flatten()
    return [
        path
        for path, analysable in leaves
        if not analysable or _dictionary_pays(sample.column(path))
    ]
