"""pyiceberg's REST client against the broker's catalog: tables, data, schema
evolution, create transactions and writers that race."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NamespaceNotEmptyError, NoSuchTableError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "category", StringType()),
    NestedField(3, "ts", TimestamptzType()),
)
# identity partitioning: pyiceberg writes time transforms only with the optional pyiceberg-core
BY_CATEGORY = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="category")
)
NO_RETRIES = {"commit.retry.num-retries": "0"}  # so a lost race surfaces instead of being rebased


def _rows(table: Table, ids: list[int], category: str = "a") -> pa.Table:
    ts = datetime(2024, 1, 1, tzinfo=UTC)
    return pa.Table.from_pylist(
        [{"id": i, "category": category, "ts": ts} for i in ids], schema=table.schema().as_arrow()
    )


def _append_together(tables: list[Table], ids: list[list[int]]) -> list[str]:
    """Each table object appends its rows, all released at once; "won" or "lost" per writer."""
    barrier = threading.Barrier(len(tables))
    outcomes: list[str] = []

    def write(table: Table, rows: pa.Table) -> None:
        barrier.wait()
        try:
            table.append(rows)
            outcomes.append("won")
        except CommitFailedException:
            outcomes.append("lost")

    threads = [
        threading.Thread(target=write, args=(t, _rows(t, i)))
        for t, i in zip(tables, ids, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


def test_create_append_read_and_evolve(rest: Catalog, namespace: str) -> None:
    table = rest.create_table(f"{namespace}.events", SCHEMA, partition_spec=BY_CATEGORY)
    assert rest.list_tables(namespace) == [(namespace, "events")]
    assert table.spec().fields[0].name == "category"

    table.append(_rows(table, [1, 2], "a"))
    table.append(_rows(table, [3], "b"))
    reloaded = rest.load_table(f"{namespace}.events")
    assert sorted(reloaded.scan().to_arrow().column("id").to_pylist()) == [1, 2, 3]
    assert len(reloaded.metadata.snapshots) == 2
    assert {t.file.partition[0] for t in reloaded.scan().plan_files()} == {"a", "b"}

    with reloaded.update_schema() as update:
        update.add_column("note", StringType())
    evolved = rest.load_table(f"{namespace}.events")
    assert evolved.schema().find_field("note").field_id == 4
    assert evolved.metadata.current_schema_id == 1
    evolved.append(
        pa.Table.from_pylist(
            [{"id": 4, "category": "a", "ts": None, "note": "new"}],
            schema=evolved.schema().as_arrow(),
        )
    )
    rows = {
        r["id"]: r["note"]
        for r in rest.load_table(f"{namespace}.events").scan().to_arrow().to_pylist()
    }
    assert rows == {1: None, 2: None, 3: None, 4: "new"}

    with pytest.raises(NamespaceNotEmptyError):
        rest.drop_namespace(namespace)
    rest.drop_table(f"{namespace}.events")
    with pytest.raises(NoSuchTableError):
        rest.load_table(f"{namespace}.events")


def test_create_table_transaction(rest: Catalog, namespace: str) -> None:
    tx = rest.create_table_transaction(f"{namespace}.staged", SCHEMA, properties={"owner": "ann"})
    assert not rest.table_exists(f"{namespace}.staged")
    tx.append(
        pa.Table.from_pylist([{"id": 1, "category": "x", "ts": None}], schema=SCHEMA.as_arrow())
    )
    tx.commit_transaction()
    table = rest.load_table(f"{namespace}.staged")
    assert table.properties["owner"] == "ann"
    assert table.scan().to_arrow().column("id").to_pylist() == [1]


def test_two_writers_on_the_same_snapshot_one_wins(rest: Catalog, namespace: str) -> None:
    table = rest.create_table(f"{namespace}.contended", SCHEMA, properties=NO_RETRIES)
    table.append(_rows(table, [0]))
    first, second = rest.load_table(table.name()), rest.load_table(table.name())
    first.append(_rows(first, [1]))
    with pytest.raises(CommitFailedException):
        second.append(_rows(second, [2]))
    assert sorted(rest.load_table(table.name()).scan().to_arrow().column("id").to_pylist()) == [
        0,
        1,
    ]


def test_concurrent_writers_exactly_one_commit_lands(rest: Catalog, namespace: str) -> None:
    table = rest.create_table(f"{namespace}.racing", SCHEMA, properties=NO_RETRIES)
    for round_ in range(3):
        writers = [rest.load_table(table.name()) for _ in range(4)]
        base = writers[0].metadata.current_snapshot_id
        assert all(w.metadata.current_snapshot_id == base for w in writers)
        outcomes = _append_together(writers, [[round_ * 10 + i] for i in range(len(writers))])
        assert sorted(outcomes) == ["lost", "lost", "lost", "won"]
    landed = rest.load_table(table.name())
    assert len(landed.metadata.snapshots) == 3
    assert len(landed.scan().to_arrow()) == 3


def test_two_clients_remove_the_same_property(rest: Catalog, namespace: str) -> None:
    """The second removal reaches the catalog for a key the table no longer has: ignored, as
    Java's catalogs do (it was a 500). pyiceberg 0.12 itself refuses to send a removal of a key
    its own copy of the metadata lacks (KeyError in the client), so the key goes missing
    between the second client's load and its commit."""
    table = rest.create_table(
        f"{namespace}.props", SCHEMA, properties={"owner": "ann", "team": "data"}
    )
    first, second = rest.load_table(table.name()), rest.load_table(table.name())
    first.transaction().remove_properties("owner").commit_transaction()
    with second.transaction() as tx:
        tx.remove_properties("owner", "team")
    assert not {"owner", "team"} & set(rest.load_table(table.name()).properties)


def test_namespace_with_a_dot_inside_a_level(rest: Catalog) -> None:
    """pyiceberg takes a tuple's levels as they are (a string identifier would be split on
    its dots) and sends them joined by %1F."""
    top = f"ns_{uuid.uuid4().hex[:8]}"
    dotted, nested = (f"{top}.v1",), (top, "v1")
    rest.create_namespace(dotted, {"owner": "ann"})
    rest.create_namespace(nested)
    assert dotted in rest.list_namespaces() and (top,) in rest.list_namespaces()
    assert rest.list_namespaces((top,)) == [nested]
    assert rest.load_namespace_properties(dotted) == {"owner": "ann"}
    assert rest.namespace_exists(dotted) and not rest.namespace_exists((f"{top}.v2",))

    table = rest.create_table((*dotted, "events"), SCHEMA)
    assert table.properties["write.parquet.compression-codec"] == "zstd"
    table.append(_rows(table, [1, 2]))
    rest.create_table((*nested, "events"), SCHEMA)
    assert rest.list_tables(dotted) == [(*dotted, "events")]
    loaded = rest.load_table((*dotted, "events"))
    assert sorted(loaded.scan().to_arrow().column("id").to_pylist()) == [1, 2]
    assert len(rest.load_table((*nested, "events")).scan().to_arrow()) == 0

    with pytest.raises(NamespaceNotEmptyError):
        rest.drop_namespace(dotted)
    rest.drop_table((*dotted, "events"))
    rest.drop_namespace(dotted)
    assert not rest.namespace_exists(dotted) and rest.namespace_exists(nested)
