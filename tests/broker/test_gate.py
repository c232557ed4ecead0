"""The data quality gate on real record batches and real Avro encodings."""

from __future__ import annotations

import io
import struct
import time
from dataclasses import dataclass
from typing import Any

from fastavro import parse_schema, schemaless_writer

from broker.gate import DataQualityGate, gate_applies
from broker.kafka import records

SCHEMA = parse_schema(
    {
        "type": "record",
        "name": "R",
        "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
    }
)


@dataclass
class Registered:
    schema_type: str
    parsed: Any


class Schemas:
    def __init__(self) -> None:
        self.by_id = {7: Registered("AVRO", SCHEMA), 8: Registered("JSON", None)}

    def schema_by_id(self, schema_id: int) -> Registered | None:
        return self.by_id.get(schema_id)


def avro(schema_id: int, value: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", schema_id))
    schemaless_writer(buf, SCHEMA, value)
    return buf.getvalue()


def batch(values: list[bytes | None]) -> bytes:
    return records.encode_batch([(None, v) for v in values], int(time.time() * 1000))


def test_good_records_and_tombstones_pass() -> None:
    gate = DataQualityGate(Schemas())
    good = batch(
        [avro(7, {"id": 1, "name": "a"}), None, b"\x00" + struct.pack(">I", 8) + b'{"x": 1}']
    )
    assert gate.check(good + batch([avro(7, {"id": 2, "name": "b"})])) is None


def test_first_bad_record_is_named() -> None:
    gate = DataQualityGate(Schemas())
    cases = {
        b"plain text": "lacks the Confluent wire format",
        b"\x00" + struct.pack(">I", 99) + b"\x02": "schema id 99",
        avro(7, {"id": 1, "name": "a"})[:-1]: "does not decode",
        avro(7, {"id": 1, "name": "a"}) + b"\x00": "left over",
        b"\x00" + struct.pack(">I", 8) + b"{nope": "is not JSON",
    }
    for bad, fragment in cases.items():
        first = batch([avro(7, {"id": 1, "name": "ok"})])
        rejection = gate.check(first + batch([avro(7, {"id": 2, "name": "ok"}), bad]))
        assert rejection is not None and rejection.batch_index == 2, bad
        assert fragment in rejection.message


def test_gate_applies_only_to_validated_by_schema_id_table_topics() -> None:
    table = {"automq.table.topic.enable": "true"}
    assert gate_applies(table)
    assert not gate_applies({})
    assert not gate_applies({**table, "automq.table.topic.schema.validation": "false"})
    assert not gate_applies({**table, "automq.table.topic.convert.value.type": "raw"})


def test_an_unknown_schema_id_catches_up_at_most_once_per_poll_interval() -> None:
    """Cluster mode: an id this broker's registry has not read makes the gate catch the registry
    up (one look at the index), but not on every produce: a producer sending an id nobody
    registered must not turn each of its requests into Postgres work."""
    import asyncio

    schemas = Schemas()
    gate = DataQualityGate(schemas)
    gate.refresh_interval = 3600.0  # within this test: one catch-up in all
    refreshes: list[float] = []

    async def refresh() -> None:  # what the broker's registry sync does: learns new ids
        refreshes.append(time.monotonic())
        schemas.by_id[9] = Registered("AVRO", SCHEMA)

    gate.refresh = refresh
    unknown = batch([b"\x00" + struct.pack(">I", 4242) + b"\x02"])

    async def produce_many() -> None:
        for _ in range(50):
            rejection = await gate.check_caught_up(unknown)
            assert rejection is not None and "4242" in rejection.message

    asyncio.run(produce_many())
    assert len(refreshes) == 1
    # an id registered meanwhile is known after the one catch-up
    assert asyncio.run(gate.check_caught_up(batch([avro(9, {"id": 1, "name": "a"})]))) is None
    gate.refresh_interval = 0.0  # the interval passed: the next unknown id catches up again
    asyncio.run(gate.check_caught_up(unknown))
    assert len(refreshes) == 2
