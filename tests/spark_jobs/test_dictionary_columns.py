"""spark_jobs/rounds/dictionary_columns.py: a dictionary only where parquet-mr's test says it
pays, and the paths named as pyarrow's writer names its columns (a wrong path would lose a
column its dictionary without a word)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.rounds.dictionary_columns import SAMPLE_ROWS, column_paths, dictionary_columns

ROWS = 20_000


def _chosen(table: pa.Table, **kwargs: int) -> list[str]:
    chosen = dictionary_columns(table, **kwargs)
    assert isinstance(chosen, list), chosen
    return chosen


def _encoded(table: pa.Table, use_dictionary: list[str]) -> dict[str, bool]:
    """Each column chunk's path, and whether it was written with a dictionary page."""
    buf = io.BytesIO()
    pq.write_table(table, buf, use_dictionary=use_dictionary)
    group = pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata.row_group(0)
    return {
        group.column(i).path_in_schema: group.column(i).has_dictionary_page
        for i in range(group.num_columns)
    }


def _table() -> pa.Table:
    ids = list(range(ROWS))
    meta = pa.struct(
        [pa.field("partition", pa.int32()), pa.field("offset", pa.int64(), nullable=False)]
    )
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "event_time": pa.array(
                [1_700_000_000_000_000 + 7 * i for i in ids], pa.timestamp("us")
            ),
            "price": pa.array([i * 0.37 for i in ids], pa.float64()),
            "quantity": pa.array([i % 9 for i in ids], pa.int32()),
            "ms": pa.array([i % 5000 for i in ids], pa.int64()),
            "unique_name": pa.array([f"name-{i}" for i in ids]),
            "country": pa.array([("US", "DE", None)[i % 3] for i in ids]),
            "meta": pa.array([{"partition": i % 4, "offset": i} for i in ids], meta),
            "headers": pa.array(
                [[("k", f"v{i}".encode())] for i in ids], pa.map_(pa.string(), pa.binary())
            ),
            "tags": pa.array([[i, i + 1] for i in ids], pa.list_(pa.int64())),
            "nothing": pa.array([None] * ROWS, pa.int64()),
            "flag": pa.array([i % 2 == 0 for i in ids]),
        }
    )


def test_unique_fixed_width_columns_lose_their_dictionary_the_rest_keep_it() -> None:
    table = _table()
    chosen = _chosen(table)
    # values all distinct: the dictionary and an index per value outweigh the values
    for unique in ("id", "event_time", "price", "meta.offset"):
        assert unique not in chosen
    # few distinct values: it pays (5,000 of 20,000 int64s: 40 kB + 13 bits a row < 160 kB)
    for repeated in ("quantity", "ms", "meta.partition", "nothing"):
        assert repeated in chosen
    # never counted: strings (unique or not), leaves of maps and lists, booleans
    for kept in ("unique_name", "country", "headers.key_value.key", "headers.key_value.value"):
        assert kept in chosen
    assert "tags.list.element" in chosen and "flag" in chosen


def test_the_paths_are_the_writers_own() -> None:
    """Every path in the answer is one of the file's column chunks, those left out are the
    unique fixed-width ones, and the chunks written with a dictionary are exactly the chosen
    ones (Parquet gives booleans none; Arrow calls a list's values "item", Parquet "element")."""
    table = _table()
    chosen = _chosen(table)
    encoded = _encoded(table, chosen)
    assert column_paths(table.schema) == list(encoded), "not the file's columns, in order"
    assert set(chosen) <= set(encoded)
    assert set(encoded) - set(chosen) == {"id", "event_time", "price", "meta.offset"}
    with_dictionary = {path for path, has in encoded.items() if has}
    assert with_dictionary == set(chosen) - {"flag"}


def test_only_the_sample_is_counted() -> None:
    """A column unique in its first SAMPLE_ROWS rows loses the dictionary even if it repeats
    later: the test reads the start of the first row group only, as parquet-mr reads its first
    page."""
    values = list(range(SAMPLE_ROWS)) + [0] * (4 * SAMPLE_ROWS)
    assert _chosen(pa.table({"v": pa.array(values, pa.int64())})) == []
    repeats = [i % 10 for i in range(SAMPLE_ROWS)] + list(range(4 * SAMPLE_ROWS))
    assert _chosen(pa.table({"v": pa.array(repeats, pa.int64())})) == ["v"]


def test_a_nested_struct_is_walked_to_its_leaves() -> None:
    inner = pa.struct([pa.field("seq", pa.int64()), pa.field("kind", pa.int8())])
    outer = pa.struct([pa.field("inner", inner), pa.field("label", pa.string())])
    rows = [{"inner": {"seq": i, "kind": i % 3}, "label": "x"} for i in range(ROWS)]
    table = pa.table({"s": pa.array(rows, outer)})
    chosen = _chosen(table)
    assert chosen == ["s.inner.kind", "s.label"]
    assert {p for p, has in _encoded(table, chosen).items() if has} == set(chosen)


def test_the_sample_is_the_rows_asked_for() -> None:
    """The table's page row limit sets the sample: a column whose first 1,000 rows are
    distinct but which repeats after them keeps its dictionary when judged on more rows."""
    values = list(range(1000)) + [i % 1000 for i in range(19_000)]
    table = pa.table({"v": pa.array(values, pa.int64())})
    assert _chosen(table, sample_rows=1000) == []
    assert _chosen(table, sample_rows=20_000) == ["v"]


def test_a_nesting_it_cannot_name_gets_pyarrows_default() -> None:
    """A fixed-size list's Parquet path is not named here: every column keeps its dictionary
    (True) rather than one losing it to a wrong path."""
    table = pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "pair": pa.array([[i, i] for i in range(ROWS)], pa.list_(pa.int64(), 2)),
        }
    )
    assert dictionary_columns(table) is True
    with pytest.raises(ValueError, match="pair"):
        column_paths(table.schema)
