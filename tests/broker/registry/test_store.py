"""SchemaStore in-process over an in-memory topic: rebuilding from records,
``schema_by_id`` for the produce-time gate, and damaged topics."""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass, field
from typing import Any

import fastavro
import pytest

from broker.registry.api_errors import RegistryError
from broker.registry.schemas import Reference
from broker.registry.store import SchemaStore


@dataclass
class _Record:
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass
class _Cluster:
    topics: dict[str, object] = field(default_factory=dict)


class MemoryTopic:
    """What SchemaStore needs of InternalTopic, kept in a list."""

    name = "_schemas"

    def __init__(self, records: list[_Record] | None = None) -> None:
        self.records = records if records is not None else []
        self.cluster = _Cluster({self.name: object()} if self.records else {})

    def ensure(self) -> None:
        self.cluster.topics[self.name] = object()

    async def append(self, key: bytes | None, value: bytes | None) -> int:
        self.ensure()
        self.records.append(_Record(len(self.records), key, value))
        return len(self.records) - 1

    async def read_all(self) -> list[_Record]:
        return list(self.records)

    async def read_from(self, offset: int) -> tuple[list[_Record], int]:
        return self.records[offset:], len(self.records)

    def end_offset(self) -> int | None:
        return len(self.records) if self.name in self.cluster.topics else None

    async def wait_for_data(self, timeout: float) -> None:  # noqa: ASYNC109
        await asyncio.sleep(timeout)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


ADDRESS = json.dumps(
    {
        "type": "record",
        "name": "Address",
        "namespace": "t",
        "fields": [{"name": "street", "type": "string"}],
    }
)
PERSON = json.dumps(
    {
        "type": "record",
        "name": "Person",
        "namespace": "t",
        "fields": [{"name": "name", "type": "string"}, {"name": "home", "type": "t.Address"}],
    }
)


async def _fill(store: SchemaStore) -> dict[str, int]:
    await store.load()
    _, address = await store.register("address", "AVRO", ADDRESS, [])
    _, person = await store.register(
        "person-value", "AVRO", PERSON, [Reference("t.Address", "address", 1)]
    )
    _, doc = await store.register("doc-value", "JSON", '{"type": "object"}', [])
    await store.delete_version("doc-value", 1)
    await store.set_config("person-value", {"compatibility": "FULL"})
    return {"address": address.id, "person": person.id, "doc": doc.id}


def _avro_round_trip(parsed: Any, value: dict[str, Any]) -> Any:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, value)
    buf.seek(0)
    return fastavro.schemaless_reader(buf, parsed)


def test_schema_by_id_and_rebuild_from_records() -> None:
    topic = MemoryTopic()
    store = SchemaStore(topic)  # type: ignore[arg-type]
    ids = run(_fill(store))
    value = {"name": "ada", "home": {"street": "Main"}}
    for current in (store, SchemaStore(MemoryTopic(topic.records))):  # type: ignore[arg-type]
        if current is not store:
            run(current.load())
        person = current.schema_by_id(ids["person"])
        assert person is not None and person.schema_type == "AVRO"
        assert person.references == [Reference("t.Address", "address", 1)]
        assert _avro_round_trip(person.parsed, value) == value  # references resolved in `parsed`
        doc = current.schema_by_id(ids["doc"])  # soft-deleted versions keep their id readable
        assert doc is not None and doc.schema_type == "JSON" and doc.parsed == {"type": "object"}
        assert current.schema_by_id(999) is None
        assert current.compatibility("person-value") == "FULL"
        assert current.list_versions("doc-value", deleted=True) == [1]
        assert current.max_id == max(ids.values())


def test_damaged_records_are_skipped() -> None:
    good = MemoryTopic()
    run(_fill(SchemaStore(good)))  # type: ignore[arg-type]
    junk = [
        _Record(0, b"not json", b"{}"),
        _Record(0, None, b"{}"),
        _Record(0, b'["a list"]', b"{}"),
        _Record(0, b'{"keytype":"SCHEMA","subject":"x","version":1,"magic":1}', b"not json"),
        _Record(0, b'{"keytype":"SCHEMA","subject":"x","version":1,"magic":1}', b'{"id": "NaN"}'),
        _Record(
            0, b'{"keytype":"CONFIG","subject":"x","magic":0}', b'{"compatibilityLevel":"SIDEWAYS"}'
        ),
        _Record(0, b'{"keytype":"MODE","subject":null,"magic":0}', b'{"mode":"BROKEN"}'),
        _Record(0, b'{"keytype":"NOOP","magic":0}', None),
        _Record(0, b'{"keytype":"CONFIG","subject":"y","magic":0}', b'["a", "list"]'),
        _Record(
            0,
            b'{"keytype":"SCHEMA","subject":7,"version":1,"magic":1}',
            b'{"id": 1, "schema": "x"}',
        ),
    ]
    store = SchemaStore(MemoryTopic(junk + good.records))  # type: ignore[arg-type]
    run(store.load())
    assert store.list_subjects() == ["address", "person-value"]
    assert store.compatibility("x") == "BACKWARD" and store.mode(None) == "READWRITE"


def test_ids_follow_the_largest_ever_seen() -> None:
    topic = MemoryTopic()
    store = SchemaStore(topic)  # type: ignore[arg-type]

    async def scenario() -> tuple[int, int]:
        await store.load()
        _, first = await store.register("a", "AVRO", '"string"', [])
        _, second = await store.register("b", "AVRO", '"int"', [])
        await store.delete_subject("b")
        await store.delete_subject("b", permanent=True)
        return first.id, second.id

    first, second = run(scenario())
    assert store.schema_by_id(second) is None
    reloaded = SchemaStore(MemoryTopic(topic.records))  # type: ignore[arg-type]

    async def after() -> int:
        await reloaded.load()
        _, third = await reloaded.register("c", "AVRO", '"long"', [])
        return third.id

    assert run(after()) == second + 1 > first


def test_write_failure_is_a_store_error() -> None:
    class FailingTopic(MemoryTopic):
        async def append(self, key: bytes | None, value: bytes | None) -> int:
            raise OSError("disk full")

    store = SchemaStore(FailingTopic())  # type: ignore[arg-type]

    async def scenario() -> None:
        await store.load()
        await store.register("a", "AVRO", '"string"', [])

    with pytest.raises(RegistryError) as info:
        run(scenario())
    assert (info.value.status, info.value.code) == (500, 50001)
    assert store.list_subjects() == [] and store.max_id == 0
