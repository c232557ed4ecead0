"""The offsets checkpoint read from real table metadata (pyiceberg SqlCatalog, no Spark):
walking back past other writers' snapshots, and the tag answering after expiry."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.types import LongType, NestedField

from broker import checkpoint

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


@pytest.fixture
def table(tmp_path: Path) -> Table:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("n")
    return catalog.create_table(("n", "t"), SCHEMA)


def _append(table: Table, props: dict[str, str]) -> int:
    table.append(pa.table({"id": pa.array([1], pa.int64())}), snapshot_properties=props)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return snapshot.snapshot_id


def _round(table: Table, offsets: dict[int, int], round_id: str) -> int:
    snapshot_id = _append(
        table,
        {
            checkpoint.OFFSETS: checkpoint.encode_offsets(offsets),
            checkpoint.ROUND_ID: round_id,
            checkpoint.TOPIC_ID: "tid",
        },
    )
    if checkpoint.CHECKPOINT_TAG in table.metadata.refs:
        table.manage_snapshots().remove_tag(checkpoint.CHECKPOINT_TAG).commit()
    table.manage_snapshots().create_tag(snapshot_id, checkpoint.CHECKPOINT_TAG).commit()
    return snapshot_id


def test_no_rounds_no_checkpoint(table: Table) -> None:
    assert checkpoint.read_checkpoint(table.metadata) is checkpoint.NO_CHECKPOINT
    _append(table, {"other": "writer"})
    assert checkpoint.read_checkpoint(table.refresh().metadata).empty


def test_the_newest_round_on_main_wins_past_other_writers(table: Table) -> None:
    _round(table, {0: 10, 1: 5}, "r1")
    second = _round(table, {0: 20, 1: 7}, "r2")
    _append(table, {"written-by": "compaction"})
    found = checkpoint.read_checkpoint(table.refresh().metadata)
    assert found.offsets == {0: 20, 1: 7} and found.snapshot_id == second and found.round_id == "r2"
    assert found.topic_id == "tid"


def test_the_tag_answers_when_expiry_cut_the_ancestry(table: Table) -> None:
    _round(table, {0: 10}, "r1")
    tagged = _round(table, {0: 30}, "r2")
    later = _append(table, {"written-by": "compaction"})
    metadata = table.refresh().metadata
    # what expire_snapshots leaves: main's snapshot without its parents, plus the tagged one
    parentless = [
        s.model_copy(update={"parent_snapshot_id": -1}) if s.snapshot_id == later else s
        for s in metadata.snapshots
        if s.snapshot_id in (later, tagged)
    ]
    cut = metadata.model_copy(update={"snapshots": parentless})
    assert cut.refs[checkpoint.CHECKPOINT_TAG].snapshot_ref_type == SnapshotRefType.TAG
    found = checkpoint.read_checkpoint(cut)
    assert found.offsets == {0: 30} and found.snapshot_id == tagged


def test_offsets_round_trip_and_refuse_garbage() -> None:
    assert checkpoint.decode_offsets(checkpoint.encode_offsets({3: 7, 0: 1})) == {0: 1, 3: 7}
    with pytest.raises(ValueError, match="JSON object"):
        checkpoint.decode_offsets("[1, 2]")
    with pytest.raises(ValueError):
        checkpoint.decode_offsets('{"0": "x"}')


def test_a_round_is_found_by_its_id_with_the_checkpoint_it_started_from(table: Table) -> None:
    first = _round(table, {0: 10}, "r1")
    second = _round(table, {0: 20}, "r2")
    _append(table, {"written-by": "compaction"})
    third = _round(table, {0: 25}, "r3")
    metadata = table.refresh().metadata
    found = checkpoint.find_round(metadata, "r2")
    assert found is not None and found.snapshot.snapshot_id == second
    assert found.checkpoint.offsets == {0: 20} and found.checkpoint.round_id == "r2"
    assert found.before.snapshot_id == first and found.before.offsets == {0: 10}
    newest = checkpoint.find_round(metadata, "r3")
    assert newest is not None and newest.snapshot.snapshot_id == third
    assert newest.before.snapshot_id == second  # past the compaction's snapshot
    oldest = checkpoint.find_round(metadata, "r1")
    assert oldest is not None and oldest.before is checkpoint.NO_CHECKPOINT
    assert checkpoint.find_round(metadata, "r4") is None
