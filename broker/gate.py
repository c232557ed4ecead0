"""The data quality gate: a table topic whose values are converted
``by_schema_id`` refuses, at produce time, records its commit round could not
decode (no magic byte, an unknown schema id, a value that does not decode), so
bad data is turned away at the door instead of landing in the DLQ later.

The check is per partition batch-set: one bad record refuses that partition's
records in the request (INVALID_RECORD, naming the first bad record); other
partitions in the same request are unaffected.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from broker import records, topic_configs

CONVERT_VALUE = topic_configs.TABLE_PREFIX + "convert.value.type"
VALIDATION = topic_configs.TABLE_PREFIX + "schema.validation"


class RegisteredSchemaLike(Protocol):
    schema_type: str
    parsed: Any


class SchemaLookup(Protocol):
    def schema_by_id(self, schema_id: int) -> RegisteredSchemaLike | None: ...


@dataclass(frozen=True)
class GateRejection:
    batch_index: int  # index of the bad record within the partition's records, as Kafka's record_errors use
    message: str


def gate_applies(configs: dict[str, str]) -> bool:
    return (
        topic_configs.is_table_topic(configs)
        and configs.get(CONVERT_VALUE, topic_configs.KEYS[CONVERT_VALUE].default) == "by_schema_id"
        and configs.get(VALIDATION, topic_configs.KEYS[VALIDATION].default) == "true"
    )


class DataQualityGate:
    def __init__(self, schemas: SchemaLookup) -> None:
        self.schemas = schemas

    def check(self, records_bytes: records.Buffer) -> GateRejection | None:
        """The first record that would not decode, or None. Batches are assumed
        already framed and CRC-checked (``records.split_batches``)."""
        try:
            records.split_batches(records_bytes)
        except records.CorruptBatchError:
            return None  # the log refuses it as CORRUPT_MESSAGE, with its own message
        index = 0
        for _, batch in records.iter_batches(records_bytes):
            try:
                _, decoded = records.decode_batch(batch)
            except records.CorruptBatchError as exc:
                return GateRejection(index, f"record batch does not decode: {exc}")
            for record in decoded:
                problem = self._problem(record.value)
                if problem is not None:
                    return GateRejection(index, f"record {index} (offset delta {index}) {problem}")
                index += 1
        return None

    def _problem(self, value: bytes | None) -> str | None:
        if value is None:
            return None  # a tombstone deletes in upsert tables
        if len(value) < 5 or value[0] != 0:
            return "lacks the Confluent wire format (magic byte 0 + 4-byte schema id)"
        (schema_id,) = struct.unpack_from(">I", value, 1)
        schema = self.schemas.schema_by_id(schema_id)
        if schema is None:
            return f"names schema id {schema_id}, which the registry does not know"
        if schema.schema_type == "AVRO":
            return _avro_problem(value, schema.parsed, schema_id)
        if schema.schema_type == "JSON":
            import json

            try:
                json.loads(value[5:])
            except ValueError as exc:
                return f"is not JSON (schema id {schema_id}): {exc}"
        return None


def _avro_problem(value: bytes, parsed: Any, schema_id: int) -> str | None:
    from fastavro import schemaless_reader

    stream = io.BytesIO(value)
    stream.seek(5)
    try:
        schemaless_reader(stream, parsed, None)
    except Exception as exc:  # fastavro raises many kinds on garbage
        return f"does not decode with Avro schema id {schema_id}: {type(exc).__name__}: {exc}"
    if stream.tell() != len(value):
        return f"has {len(value) - stream.tell()} bytes left over after decoding with Avro schema id {schema_id}"
    return None
