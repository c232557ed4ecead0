"""The data quality gate: a table topic whose values are converted
``by_schema_id`` refuses, at produce time, records its commit round could not
decode (no magic byte, an unknown schema id, a value that does not decode), so
bad data is turned away at the door instead of landing in the DLQ later.

The check is per partition batch-set: one bad record refuses that partition's
records in the request (INVALID_RECORD, naming the first bad record); other
partitions in the same request are unaffected.
"""

from __future__ import annotations

import importlib
import io
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from crc32c import crc32c

from broker import avro_program, topic_configs
from broker.kafka import records

log = logging.getLogger(__name__)

_gate: ModuleType | None  # the C validator (broker/_gate.c), built at install time
_import_error = ""
try:
    _gate = importlib.import_module("broker._gate")
except ImportError as exc:  # not built: the gate checks records in Python (fastavro), ~10x slower
    _gate = None
    _import_error = str(exc)
_fallback_logged = False

# an unknown schema id catches the registry up at most this often: the interval at which the
# registry tails _schemas from the index anyway (broker.kafka.internal_topics.INDEX_POLL_S)
REFRESH_INTERVAL_S = 0.25
CONVERT_VALUE = topic_configs.CONVERT_VALUE_TYPE
VALIDATION = topic_configs.SCHEMA_VALIDATION


class RegisteredSchemaLike(Protocol):
    schema_type: str
    parsed: Any


class SchemaLookup(Protocol):
    def schema_by_id(self, schema_id: int) -> RegisteredSchemaLike | None: ...


@dataclass(frozen=True)
class GateRejection:
    batch_index: (
        int  # index of the bad record within the partition's records, as Kafka's record_errors use
    )
    message: str
    rule: str = "gate"  # which check refused: the gate, or a compacted topic's key rule


def gate_applies(configs: dict[str, str]) -> bool:
    if not topic_configs.is_table_topic(configs):
        return False
    view = topic_configs.TableSettings(configs)
    return view.convert_value_type == "by_schema_id" and view.schema_validation


class DataQualityGate:
    """Checks the values of a partition's produce records against their schemas.

    With the ``broker._gate`` extension the records are walked and the Avro values
    validated in C, by programs compiled from each schema (``broker.avro_program``,
    cached per schema id); JSON values, and the rare Avro values a program defers
    (uuid strings that are not plain hex, unusual decimals), are checked here in
    Python as before. Without the extension, everything is checked in Python."""

    def __init__(self, schemas: SchemaLookup, use_extension: bool = True) -> None:
        global _fallback_logged
        self.schemas = schemas
        # cluster mode: catch the registry up with _schemas (a schema registered through
        # another broker a moment ago); set by the broker
        self.refresh: Callable[[], Awaitable[None]] | None = None
        self._missed = False  # the last check met a schema id the registry does not know
        self.refresh_interval = REFRESH_INTERVAL_S
        self._refreshed_at = -float("inf")  # monotonic time of the last refresh
        self._ext = _gate if use_extension else None
        # schema id -> (the registered schema, its parsed form, the program): a program
        # is valid while the registry serves the same objects for the id
        self._programs: dict[int, tuple[Any, Any, bytes | None]] = {}
        if use_extension and _gate is None and not _fallback_logged:
            _fallback_logged = True
            log.warning(
                "broker._gate is not built (%s): the data quality gate checks records in Python",
                _import_error,
            )

    def check(self, records_bytes: records.Buffer) -> GateRejection | None:
        """The first record that would not decode, or None. Batches are assumed
        already framed and CRC-checked (``records.split_batches``)."""
        if self._ext is not None:
            return self._check_c(self._ext, records_bytes)
        return self._check_python(records_bytes)

    async def check_caught_up(self, records_bytes: records.Buffer) -> GateRejection | None:
        """``check``; when a record names a schema id this broker's registry has not read yet
        (cluster mode: registered through another broker within the last poll), once more
        after the registry caught up with ``_schemas``. At most once per ``refresh_interval``
        (the registry's own poll of the index): ids nobody registered, produced again and
        again, must not make every produce a round trip to Postgres."""
        self._missed = False
        rejection = self.check(records_bytes)
        if rejection is None or not self._missed or self.refresh is None:
            return rejection
        now = time.monotonic()
        if now - self._refreshed_at < self.refresh_interval:
            return rejection
        self._refreshed_at = now
        await self.refresh()
        return self.check(records_bytes)

    def _check_c(self, ext: ModuleType, records_bytes: records.Buffer) -> GateRejection | None:
        if not _well_formed(ext, records_bytes):
            return None  # the log refuses it as CORRUPT_MESSAGE, with its own message
        programs = _ProgramTable(self)
        index = 0
        for header, batch in records.iter_batches(records_bytes):
            deferred: list[tuple[int, int, int]] = []
            try:
                body: records.Buffer = batch[records.HEADER_SIZE : header.size]
                if header.compression != records.COMPRESSION_NONE:
                    body = records.decompress(header.compression, bytes(body))
                bad = ext.check_values(body, header.record_count, programs, deferred)
            except (records.CorruptBatchError, ext.FramingError) as exc:
                return GateRejection(index, f"record batch does not decode: {exc}")
            for i, start, end in deferred:  # all before `bad`, in order
                problem = self._problem(bytes(body[start:end]))
                if problem is not None:
                    return _rejection(index + i, problem)
            if bad is not None:
                return _rejection(index + bad[0], bad[1])
            index += header.record_count
        return None

    def program(self, schema_id: int) -> bytes | None:
        """The validator program for a schema id: None hands its values to ``_problem``;
        KeyError if the registry does not know the id."""
        schema = self.schemas.schema_by_id(schema_id)
        if schema is None:
            self._missed = True
            raise KeyError(schema_id)
        cached = self._programs.get(schema_id)
        if cached is not None and cached[0] is schema and cached[1] is schema.parsed:
            return cached[2]
        program: bytes | None
        if schema.schema_type == "AVRO":
            try:
                program = avro_program.compile_schema(schema.parsed)
            except Exception as exc:  # noqa: BLE001 - fastavro judges this schema's values
                log.warning(
                    "schema id %d: no validator program (%s); its values are checked with fastavro",
                    schema_id,
                    exc,
                )
                program = None
        elif schema.schema_type == "JSON":
            program = None
        else:
            program = avro_program.accept_all_program()  # PROTOBUF: not checked
        self._programs[schema_id] = (schema, schema.parsed, program)
        return program

    def _check_python(self, records_bytes: records.Buffer) -> GateRejection | None:
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
                    return _rejection(index, problem)
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
            self._missed = True
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


class _ProgramTable(dict[int, "bytes | None"]):
    """Schema id -> program for one ``check`` call, filled on first use; ``_gate``
    reads it with ``programs[id]`` (a KeyError: an unknown schema id)."""

    def __init__(self, gate: DataQualityGate) -> None:
        super().__init__()
        self.gate = gate

    def __missing__(self, schema_id: int) -> bytes | None:
        program = self.gate.program(schema_id)
        self[schema_id] = program
        return program


def _rejection(index: int, problem: str) -> GateRejection:
    return GateRejection(index, f"record {index} (offset delta {index}) {problem}")


def _well_formed(ext: ModuleType, records_bytes: records.Buffer) -> bool:
    """Whether ``records.split_batches`` accepts the records; the same checks, with
    the per-record framing walk (``check_record_framing``) in C."""
    view = memoryview(records_bytes)
    pos = 0
    try:
        while pos < len(view):
            header = records.read_header(view, pos)
            end = pos + header.size
            if end > len(view):
                return False
            if header.record_count <= 0 or header.record_count != header.last_offset_delta + 1:
                return False
            if crc32c(view[pos + 21 : end]) != header.crc:
                return False
            if (
                header.compression == records.COMPRESSION_NONE
                and ext.record_framing_problem(
                    view[pos + records.HEADER_SIZE : end], header.record_count
                )
                is not None
            ):
                return False
            pos = end
    except records.CorruptBatchError:
        return False
    return True


def _avro_problem(value: bytes, parsed: Any, schema_id: int) -> str | None:
    from fastavro import schemaless_reader

    stream = io.BytesIO(value)
    stream.seek(5)
    try:
        schemaless_reader(stream, parsed, None)
    except Exception as exc:  # noqa: BLE001 - fastavro raises many kinds on garbage
        return f"does not decode with Avro schema id {schema_id}: {type(exc).__name__}: {exc}"
    if stream.tell() != len(value):
        return f"has {len(value) - stream.tell()} bytes left over after decoding with Avro schema id {schema_id}"
    return None
