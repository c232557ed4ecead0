"""Format v3 tables in the catalog without an engine: created by pyiceberg and over
HTTP, stored as spec v3 metadata files (``next-row-id``), row lineage checked on
commits, upgrades from v2, registration and multi-table transactions. Spark's v3
writes (deletion vectors) are in test_spark.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadataV3
from pyiceberg.types import LongType, NestedField, StringType

from tests.broker.catalog.helpers import SCHEMA, Http, error_type

V3 = {"format-version": "3"}


def _file(location: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(location.removeprefix("file://")).read_text())
    return data


def _v3(table: Any) -> TableMetadataV3:
    """The table's metadata, which must be format v3."""
    assert isinstance(table.metadata, TableMetadataV3), table.metadata.format_version
    return table.metadata


def _snapshot(snapshot_id: int, first_row_id: int | None, added_rows: int) -> dict[str, Any]:
    snapshot: dict[str, Any] = {
        "snapshot-id": snapshot_id,
        "sequence-number": 1,
        "timestamp-ms": 1_700_000_000_000,
        "manifest-list": f"file:///nowhere/snap-{snapshot_id}.avro",
        "summary": {"operation": "append"},
        "schema-id": 0,
        "added-rows": added_rows,
    }
    if first_row_id is not None:
        snapshot["first-row-id"] = first_row_id
    return snapshot


def test_pyiceberg_creates_a_v3_table(rest: Catalog, namespace: str) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType())
    )
    table = rest.create_table(f"{namespace}.t", schema, properties=V3)
    assert _v3(table).next_row_id == 0
    stored = _file(table.metadata_location)
    assert (stored["format-version"], stored["next-row-id"]) == (3, 0)
    assert "format-version" not in stored["properties"]  # a table property only on the request

    with table.transaction() as tx:
        tx.set_properties(owner="icefall")
    loaded = rest.load_table(f"{namespace}.t")
    assert (loaded.metadata.format_version, loaded.properties["owner"]) == (3, "icefall")


def test_commits_keep_row_lineage(http: Http, namespace: str) -> None:
    created = http.create_table(namespace, "t", properties=V3)
    assert created["metadata"]["next-row-id"] == 0
    status, body = http.commit(
        namespace, "t", [], [{"action": "add-snapshot", "snapshot": _snapshot(1, None, 5)}]
    )
    assert (status, error_type(body)) == (400, "BadRequestException")
    assert "first row id" in body["error"]["message"]

    status, body = http.commit(
        namespace, "t", [], [{"action": "add-snapshot", "snapshot": _snapshot(1, 0, 5)}]
    )
    assert status == 200, body
    assert body["metadata"]["next-row-id"] == 5
    assert _file(body["metadata-location"])["snapshots"][0]["first-row-id"] == 0

    status, body = http.commit(
        namespace, "t", [], [{"action": "add-snapshot", "snapshot": _snapshot(2, 3, 1)}]
    )
    assert (status, error_type(body)) == (400, "BadRequestException")  # row ids 3 and 4 are taken
    assert http.load(namespace, "t")["metadata"]["next-row-id"] == 5


def test_upgrade_from_v2_and_refusals(http: Http, namespace: str) -> None:
    http.create_table(namespace, "t")
    status, body = http.commit(
        namespace, "t", [], [{"action": "upgrade-format-version", "format-version": 3}]
    )
    assert status == 200, body
    assert (body["metadata"]["format-version"], body["metadata"]["next-row-id"]) == (3, 0)
    assert _file(body["metadata-location"])["format-version"] == 3

    for version in (2, 4):  # no downgrade, no format this catalog does not know
        status, body = http.commit(
            namespace, "t", [], [{"action": "upgrade-format-version", "format-version": version}]
        )
        assert (status, error_type(body)) == (400, "BadRequestException"), body
    assert http.load(namespace, "t")["metadata"]["format-version"] == 3

    status, body = http.post(
        f"/v1/namespaces/{namespace}/tables",
        {"name": "v4", "schema": SCHEMA, "properties": {"format-version": "4"}},
    )
    assert (status, error_type(body)) == (400, "BadRequestException")


def test_stage_create_register_and_transaction(http: Http, namespace: str) -> None:
    status, body = http.post(
        f"/v1/namespaces/{namespace}/tables",
        {"name": "staged", "schema": SCHEMA, "stage-create": True, "properties": V3},
    )
    assert status == 200, body
    assert (body["metadata"]["format-version"], body["metadata"]["next-row-id"]) == (3, 0)

    a = http.create_table(namespace, "a", properties=V3)
    status, body = http.post(
        f"/v1/namespaces/{namespace}/register",
        {"name": "a_again", "metadata-location": a["metadata-location"]},
    )
    assert status == 200, body
    assert body["metadata"]["format-version"] == 3

    b = http.create_table(namespace, "b")
    status, body = http.post(
        "/v1/transactions/commit",
        {
            "table-changes": [
                {
                    "identifier": {"namespace": [namespace], "name": "a"},
                    "requirements": [],
                    "updates": [
                        {"action": "add-snapshot", "snapshot": _snapshot(7, 0, 2)},
                        {
                            "action": "set-snapshot-ref",
                            "ref-name": "main",
                            "type": "branch",
                            "snapshot-id": 7,
                        },
                    ],
                },
                {
                    "identifier": {"namespace": [namespace], "name": "b"},
                    "requirements": [],
                    "updates": [{"action": "upgrade-format-version", "format-version": 3}],
                },
            ]
        },
    )
    assert status == 204, body
    after_a, after_b = http.load(namespace, "a")["metadata"], http.load(namespace, "b")["metadata"]
    assert (after_a["next-row-id"], after_a["current-snapshot-id"]) == (2, 7)
    assert (after_b["format-version"], after_b["next-row-id"], b["metadata"]["format-version"]) == (
        3,
        0,
        2,
    )
