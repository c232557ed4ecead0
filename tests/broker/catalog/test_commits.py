"""Table commits at the HTTP level: every requirement type, stage-create,
multi-table transactions and racing writers (in one broker and across two)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.broker.catalog.helpers import SCHEMA, Http, error_type
from tests.support import BrokerProcess


def _right_and_wrong(meta: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(a requirement the fresh table meets, the same requirement with a value it does not)."""
    return [
        (
            {"type": "assert-table-uuid", "uuid": meta["table-uuid"]},
            {"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000001"},
        ),
        (
            {"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": None},
            {"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 123},
        ),
        (
            {
                "type": "assert-last-assigned-field-id",
                "last-assigned-field-id": meta["last-column-id"],
            },
            {
                "type": "assert-last-assigned-field-id",
                "last-assigned-field-id": meta["last-column-id"] + 5,
            },
        ),
        (
            {"type": "assert-current-schema-id", "current-schema-id": meta["current-schema-id"]},
            {"type": "assert-current-schema-id", "current-schema-id": 7},
        ),
        (
            {
                "type": "assert-last-assigned-partition-id",
                "last-assigned-partition-id": meta["last-partition-id"],
            },
            {"type": "assert-last-assigned-partition-id", "last-assigned-partition-id": 4242},
        ),
        (
            {"type": "assert-default-spec-id", "default-spec-id": meta["default-spec-id"]},
            {"type": "assert-default-spec-id", "default-spec-id": 3},
        ),
        (
            {
                "type": "assert-default-sort-order-id",
                "default-sort-order-id": meta["default-sort-order-id"],
            },
            {"type": "assert-default-sort-order-id", "default-sort-order-id": 9},
        ),
    ]


SET_PROP = [{"action": "set-properties", "updates": {"k": "v"}}]


def test_each_requirement_is_checked(http: Http, namespace: str) -> None:
    created = http.create_table(namespace, "t")
    pairs = _right_and_wrong(created["metadata"])
    assert (
        len({right["type"] for right, _ in pairs}) == 7
    )  # plus assert-create below: all eight kinds
    for _right, wrong in pairs:
        status, body = http.commit(namespace, "t", [wrong], SET_PROP)
        assert (status, error_type(body)) == (409, "CommitFailedException"), wrong
    status, body = http.commit(namespace, "t", [{"type": "assert-create"}], SET_PROP)
    assert (status, error_type(body)) == (409, "CommitFailedException")
    assert (
        http.load(namespace, "t")["metadata-location"] == created["metadata-location"]
    )  # nothing landed

    status, body = http.commit(namespace, "t", [right for right, _ in pairs], SET_PROP)
    assert status == 200, body
    assert body["metadata"]["properties"]["k"] == "v"
    assert body["metadata-location"] != created["metadata-location"]
    assert body["metadata"]["metadata-log"][-1]["metadata-file"] == created["metadata-location"]
    assert http.load(namespace, "t")["metadata-location"] == body["metadata-location"]
    assert Path(urlparse(body["metadata-location"]).path).is_file()


@pytest.mark.parametrize(
    ("requirements", "updates"),
    [
        ([{"type": "assert-something-else"}], SET_PROP),
        ([], [{"action": "make-it-fast"}]),
        ([], [{"action": "set-current-schema", "schema-id": 42}]),
        ([], [{"action": "set-location", "location": "/tmp/not-the-warehouse"}]),
        ([], [{"action": "set-properties", "updates": {"write.metadata.path": "/tmp/elsewhere"}}]),
    ],
)
def test_bad_commits_are_400_and_change_nothing(
    http: Http, namespace: str, requirements: list[Any], updates: list[Any]
) -> None:
    before = http.create_table(namespace, "t")["metadata-location"]
    status, body = http.commit(namespace, "t", requirements, updates)
    assert (status, error_type(body)) == (400, "BadRequestException"), body
    assert http.load(namespace, "t")["metadata-location"] == before


def test_commit_to_a_missing_table_is_404(http: Http, namespace: str) -> None:
    status, body = http.commit(namespace, "absent", [], SET_PROP)
    assert (status, error_type(body)) == (404, "NoSuchTableException")


def _create_updates(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The initial updates a client sends to commit a staged create (as pyiceberg and Java do)."""
    return [
        {"action": "assign-uuid", "uuid": meta["table-uuid"]},
        {"action": "upgrade-format-version", "format-version": meta["format-version"]},
        {"action": "add-schema", "schema": meta["schemas"][0]},
        {"action": "set-current-schema", "schema-id": -1},
        {"action": "add-spec", "spec": meta["partition-specs"][0]},
        {"action": "set-default-spec", "spec-id": -1},
        {"action": "add-sort-order", "sort-order": meta["sort-orders"][0]},
        {"action": "set-default-sort-order", "sort-order-id": -1},
        {"action": "set-location", "location": meta["location"]},
        {"action": "set-properties", "updates": {"staged": "yes"}},
    ]


def test_stage_create_then_commit_with_assert_create(http: Http, namespace: str) -> None:
    status, staged = http.post(
        f"/v1/namespaces/{namespace}/tables",
        {"name": "ctas", "schema": SCHEMA, "stage-create": True},
    )
    assert status == 200
    assert staged.get("metadata-location") is None
    assert http.head(f"/v1/namespaces/{namespace}/tables/ctas") == 404  # nothing created yet

    updates = _create_updates(staged["metadata"])
    status, body = http.commit(namespace, "ctas", [{"type": "assert-create"}], updates)
    assert status == 200, body
    assert body["metadata"]["table-uuid"] == staged["metadata"]["table-uuid"]
    assert body["metadata"]["properties"] == {"staged": "yes"}
    assert http.load(namespace, "ctas")["metadata-location"] == body["metadata-location"]

    status, body = http.commit(namespace, "ctas", [{"type": "assert-create"}], updates)
    assert (status, error_type(body)) == (409, "CommitFailedException")


def test_stage_create_of_an_existing_table_is_409(http: Http, namespace: str) -> None:
    http.create_table(namespace, "t")
    status, body = http.post(
        f"/v1/namespaces/{namespace}/tables", {"name": "t", "schema": SCHEMA, "stage-create": True}
    )
    assert (status, error_type(body)) == (409, "AlreadyExistsException")


def _change(
    namespace: str, name: str, requirements: list[Any], updates: list[Any]
) -> dict[str, Any]:
    return {
        "identifier": {"namespace": [namespace], "name": name},
        "requirements": requirements,
        "updates": updates,
    }


def test_transaction_is_all_or_nothing(http: Http, namespace: str) -> None:
    a = http.create_table(namespace, "a")
    b = http.create_table(namespace, "b")
    uuid_a = {"type": "assert-table-uuid", "uuid": a["metadata"]["table-uuid"]}
    uuid_b = {"type": "assert-table-uuid", "uuid": b["metadata"]["table-uuid"]}

    status, body = http.post(
        "/v1/transactions/commit",
        {
            "table-changes": [
                _change(namespace, "a", [uuid_a], SET_PROP),
                _change(namespace, "b", [uuid_a], SET_PROP),  # b's uuid is not a's: fails
            ]
        },
    )
    assert (status, error_type(body)) == (409, "CommitFailedException")
    assert http.load(namespace, "a")["metadata-location"] == a["metadata-location"]

    status, body = http.post(
        "/v1/transactions/commit",
        {
            "table-changes": [
                _change(namespace, "a", [uuid_a], SET_PROP),
                _change(namespace, "missing", [], SET_PROP),
            ]
        },
    )
    assert (status, error_type(body)) == (404, "NoSuchTableException")
    assert http.load(namespace, "a")["metadata-location"] == a["metadata-location"]

    status, body = http.post(
        "/v1/transactions/commit",
        {
            "table-changes": [
                _change(namespace, "a", [uuid_a], SET_PROP),
                _change(namespace, "a", [uuid_a], SET_PROP),
            ]
        },
    )
    assert status == 400

    status, body = http.post(
        "/v1/transactions/commit",
        {
            "table-changes": [
                _change(namespace, "a", [uuid_a], SET_PROP),
                _change(namespace, "b", [uuid_b], SET_PROP),
            ]
        },
    )
    assert status == 204, body
    for name, before in (("a", a), ("b", b)):
        after = http.load(namespace, name)
        assert after["metadata-location"] != before["metadata-location"]
        assert after["metadata"]["properties"]["k"] == "v"


def _add_column(schema_id: int, field_id: int) -> tuple[list[Any], list[Any]]:
    """A schema change that only one of several writers based on the same schema can make."""
    fields = [
        *SCHEMA["fields"],
        *(
            {"id": i, "name": f"c{i}", "type": "string", "required": False}  # type: ignore[misc]
            for i in range(3, field_id + 1)
        ),
    ]
    requirements = [{"type": "assert-current-schema-id", "current-schema-id": schema_id}]
    updates = [
        {
            "action": "add-schema",
            "schema": {"type": "struct", "schema-id": schema_id + 1, "fields": fields},
        },
        {"action": "set-current-schema", "schema-id": -1},
    ]
    return requirements, updates


def _race(
    urls: list[str], namespace: str, name: str, schema_id: int, writers: int
) -> list[int | str]:
    """``writers`` commits based on the same schema, released together; their statuses
    (or the client's exception, so a failed request shows in the assertion)."""
    requirements, updates = _add_column(schema_id, 3 + schema_id)
    barrier = threading.Barrier(writers)
    statuses: list[int | str] = []

    def write(i: int) -> None:
        http = Http(urls[i % len(urls)])
        barrier.wait()
        try:
            statuses.append(http.commit(namespace, name, requirements, updates)[0])
        except Exception as exc:  # noqa: BLE001 - reported through the statuses
            statuses.append(repr(exc))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return statuses


def test_racing_writers_in_one_broker_exactly_one_wins(
    http: Http, catalog_broker: BrokerProcess, namespace: str
) -> None:
    http.create_table(namespace, "raced")
    for round_ in range(3):
        statuses = _race([catalog_broker.catalog_url], namespace, "raced", round_, writers=6)
        assert sorted(statuses, key=str) == [200] + [409] * 5, statuses
    assert http.load(namespace, "raced")["metadata"]["current-schema-id"] == 3


def test_racing_writers_on_two_brokers_sharing_the_catalog(tmp_path: Path) -> None:
    """The per-table lock is per process; here only the SQL compare-and-swap keeps one winner."""
    first = BrokerProcess(tmp_path / "a").start()
    shared = [
        "--catalog-uri",
        f"sqlite:///{(tmp_path / 'a' / 'catalog.sqlite').resolve()}",
        "--warehouse",
        str((tmp_path / "a" / "warehouse").resolve()),
    ]
    second = BrokerProcess(tmp_path / "b", shared)
    try:
        second.start()
        http = Http(first.catalog_url)
        assert http.post("/v1/namespaces", {"namespace": ["shared"]})[0] == 200
        http.create_table("shared", "t")
        assert Http(second.catalog_url).head("/v1/namespaces/shared/tables/t") == 204
        for round_ in range(5):
            statuses = _race(
                [first.catalog_url, second.catalog_url], "shared", "t", round_, writers=4
            )
            assert sorted(statuses, key=str) == [200, 409, 409, 409], (
                statuses,
                first.log_text()[-3000:],
                second.log_text()[-3000:],
            )
        assert Http(second.catalog_url).load("shared", "t")["metadata"]["current-schema-id"] == 5
    finally:
        second.stop()
        first.stop()


def test_removing_properties_the_table_lacks_is_not_an_error(http: Http, namespace: str) -> None:
    """Java's catalogs ignore a removal of a key the table does not have; pyiceberg
    alone raises KeyError, which was a 500 in both commit routes."""
    http.create_table(namespace, "props", properties={"owner": "ann", "team": "data"})
    removal = {"action": "remove-properties", "removals": ["owner", "absent"]}
    status, body = http.commit(namespace, "props", [], [removal])
    assert status == 200, body
    assert "owner" not in body["metadata"]["properties"]
    assert body["metadata"]["properties"]["team"] == "data"

    only_absent = {"action": "remove-properties", "removals": ["absent", "team"]}
    status, body = http.post(
        "/v1/transactions/commit",
        {"table-changes": [_change(namespace, "props", [], [only_absent])]},
    )
    assert status == 204, body
    properties = http.load(namespace, "props")["metadata"]["properties"]
    assert not {"owner", "team", "absent"} & set(properties)
