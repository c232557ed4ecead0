"""The schema registry's state and its durability.

Everything is kept in the broker's own compacted topic ``_schemas`` (one
partition) with the reference registry's record formats, so the topic can be read
by any Kafka client and replayed by a Confluent registry:

- schema version: key ``{"keytype":"SCHEMA","subject":S,"version":V,"magic":1}``,
  value ``{"subject":S,"version":V,"id":ID,"schemaType":T,"schema":TEXT,
  "references":[...],"deleted":B}`` (``schemaType`` omitted for AVRO); a
  permanent delete is a tombstone (null value) for the key;
- compatibility: key ``{"keytype":"CONFIG","subject":S|null,"magic":0}``, value
  ``{"compatibilityLevel":L}``; mode: ``{"keytype":"MODE",...}`` -> ``{"mode":M}``.
  A null value removes the setting.

Writes append one record, wait until it is durable and then apply it to the
in-memory state; at start the whole topic is read back and applied in order, so
the state after a restart is the state before it. Ids are never reused: the next
id is one more than the largest id in any record ever read.

The topic is also tailed while the broker runs, as Confluent's KafkaStoreReaderThread
does: a record another writer appends (another registry instance, a restore with a
plain Kafka producer) is applied within moments, and every write first catches up, so
its id and version are chosen knowing everything in the log before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from broker.kafka.internal_topics import InternalTopic
from broker.registry import api_errors as errors
from broker.registry.api_errors import COMPATIBILITY_LEVELS, MODES
from broker.registry.errors import InvalidSchemaError
from broker.registry.schemas import (
    ParsedSchema,
    Reference,
    ResolvedReference,
    fingerprint,
    flatten_references,
    parse_avro_with_refs,
    parse_schema,
    references_from_json,
)
from broker.storage.failures import StorageFailureLog, is_storage_failure
from broker.storage.logstore import ProduceError

log = logging.getLogger(__name__)


def _storage_cannot_write(exc: BaseException) -> bool:
    """The append failed because the broker's storage cannot write: the disk's own error, or
    the log's KAFKA_STORAGE_ERROR refusal while its WAL cannot write."""
    if isinstance(exc, ProduceError):
        return exc.code == ErrorCode.kafka_storage_error
    return is_storage_failure(exc)


TOPIC = "_schemas"
TOPIC_CONFIGS: dict[str, str | None] = {"cleanup.policy": "compact"}
DEFAULT_COMPATIBILITY = "BACKWARD"
DEFAULT_MODE = "READWRITE"
MAX_VERSION = 2**31 - 1
LATEST = -1
_MAX_REFERENCE_DEPTH = 32


@dataclass
class RegisteredSchema:
    """A schema by id: what the produce-time data quality gate looks up.

    ``parsed`` is fastavro's parsed schema for AVRO (references resolved), the
    loaded document for JSON, compat_protobuf's model for PROTOBUF; None when it
    could not be built (the schema text is still served).
    """

    id: int
    schema_type: str
    schema: str
    references: list[Reference]
    fingerprint: str
    parsed: Any = None


@dataclass
class SubjectVersion:
    subject: str
    version: int
    schema_id: int
    deleted: bool


@dataclass
class _Subject:
    versions: dict[int, SubjectVersion] = field(default_factory=dict)

    def included(self, deleted: bool = False, deleted_only: bool = False) -> list[SubjectVersion]:
        out = []
        for v in sorted(self.versions):
            sv = self.versions[v]
            if deleted_only:
                if sv.deleted:
                    out.append(sv)
            elif deleted or not sv.deleted:
                out.append(sv)
        return out


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def schema_key(subject: str, version: int) -> dict[str, Any]:
    return {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1}


def schema_value(sv: SubjectVersion, rs: RegisteredSchema) -> dict[str, Any]:
    value: dict[str, Any] = {"subject": sv.subject, "version": sv.version, "id": rs.id}
    if rs.schema_type != "AVRO":
        value["schemaType"] = rs.schema_type
    value["schema"] = rs.schema
    value["references"] = [r.to_json() for r in rs.references]
    value["deleted"] = sv.deleted
    return value


def _is_read_only(mode: str) -> bool:
    return mode in ("READONLY", "READONLY_OVERRIDE")


class SchemaStore:
    def __init__(self, topic: InternalTopic) -> None:
        self.topic = topic
        self.subjects: dict[str, _Subject] = {}
        self.schemas: dict[int, RegisteredSchema] = {}
        self._id_users: dict[int, set[tuple[str, int]]] = {}
        self._by_fingerprint: dict[str, int] = {}
        self._referrers: dict[tuple[str, int], set[tuple[str, int]]] = {}
        self.max_id = 0
        self.global_config: dict[str, Any] | None = None
        self.subject_configs: dict[str, dict[str, Any]] = {}
        self.global_mode: str | None = None
        self.subject_modes: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self.next_offset = 0  # the first offset of _schemas not applied yet
        self._tail: asyncio.Task[None] | None = None
        self.storage_failures = StorageFailureLog(log)  # a full disk: a line a minute

    # ------------------------------------------------------------------ loading

    async def load(self) -> None:
        """Read ``_schemas`` from the start and rebuild the state. The topic is
        created by the first write, so a broker that never sees a schema has none."""
        records: list[Any] = []
        if self.topic.name in self.topic.cluster.topics:
            records, self.next_offset = await self.topic.read_from(0)
        for record in records:
            self._apply_raw(record.key, record.value, record.offset)
        for rs in self.schemas.values():
            if rs.parsed is None:
                rs.parsed = self._build_parsed(rs)
        live = sum(1 for s in self.subjects.values() for v in s.versions.values() if not v.deleted)
        log.info(
            "schema registry: %d records read from %s, %d subjects, %d live versions, %d schemas, max id %d",
            len(records),
            TOPIC,
            len(self.subjects),
            live,
            len(self.schemas),
            self.max_id,
        )

    def start_tailing(self, interval: float = 0.5) -> None:
        """Apply records other writers append to ``_schemas`` while the broker runs."""
        self._tail = asyncio.create_task(self._tail_loop(interval), name="schemas-tail")

    async def close(self) -> None:
        if self._tail is not None:
            self._tail.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tail
            self._tail = None

    async def _tail_loop(self, interval: float) -> None:
        while True:
            await self.topic.wait_for_data(interval)
            end = self.topic.end_offset()
            if end is None or end <= self.next_offset:
                continue
            try:
                async with self._lock:
                    await self._catch_up()
            except Exception:  # keep tailing: the next record may be readable
                log.exception("schema registry: reading %s from offset %d", TOPIC, self.next_offset)

    async def _catch_up(self) -> None:
        """Apply every record from ``next_offset`` to the end of the log (lock held)."""
        end = self.topic.end_offset()
        if end is None or end <= self.next_offset:
            return
        before = set(self.schemas)
        records, self.next_offset = await self.topic.read_from(self.next_offset)
        for record in records:
            self._apply_raw(record.key, record.value, record.offset)
        for schema_id in set(self.schemas) - before:
            rs = self.schemas[schema_id]
            if rs.parsed is None:
                rs.parsed = self._build_parsed(rs)
        if records:
            log.info(
                "schema registry: %d records applied from %s up to offset %d",
                len(records),
                TOPIC,
                self.next_offset,
            )

    async def sync(self) -> None:
        """Catch up with everything acknowledged in the log now (after a write another broker
        made for this one: ``broker.registry.forward``)."""
        await self.topic.refresh()
        async with self._lock:
            await self._catch_up()

    @contextlib.asynccontextmanager
    async def _writing(self) -> AsyncIterator[None]:
        """The write lock, with the state caught up with the log first."""
        async with self._lock:
            try:
                await self._catch_up()
            except Exception as exc:
                log.exception("schema registry: reading %s failed", TOPIC)
                raise errors.store_error(f"Error while reading the Kafka store: {exc}") from None
            yield

    def _apply_raw(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        try:
            k = json.loads(key) if key else None
            v = json.loads(value) if value is not None else None
        except ValueError:
            log.warning("%s offset %d: key or value is not JSON; skipped", TOPIC, offset)
            return
        if not isinstance(k, dict):
            log.warning("%s offset %d: key is not a JSON object; skipped", TOPIC, offset)
            return
        try:
            self._apply(k, v)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            log.warning(
                "%s offset %d: malformed %s record skipped: %s",
                TOPIC,
                offset,
                k.get("keytype"),
                exc,
            )

    def _apply(self, key: dict[str, Any], value: Any) -> None:  # noqa: C901 (one branch per record keytype of the _schemas topic)
        """Apply one record to the in-memory state (the single place state changes)."""
        keytype = key.get("keytype")
        if keytype == "SCHEMA":
            subject, version = key["subject"], int(key["version"])
            if not isinstance(subject, str):
                raise TypeError("subject must be a string")
            if value is None:
                self._remove_version(subject, version)
            else:
                self._put_version(subject, version, value)
        elif keytype == "CONFIG":
            subject = key.get("subject")
            if value is None:
                if subject is None:
                    self.global_config = None
                else:
                    self.subject_configs.pop(subject, None)
            else:
                level = value.get("compatibilityLevel") or value.get("compatibility")
                if level is not None and str(level).upper() not in COMPATIBILITY_LEVELS:
                    raise ValueError(f"unknown compatibility level {level!r}")
                config = dict(value)
                if subject is None:
                    self.global_config = config
                else:
                    self.subject_configs[subject] = config
        elif keytype == "MODE":
            subject = key.get("subject")
            if value is None:
                if subject is None:
                    self.global_mode = None
                else:
                    self.subject_modes.pop(subject, None)
            else:
                mode = str(value["mode"]).upper()
                if mode not in MODES:
                    raise ValueError(f"unknown mode {mode!r}")
                if subject is None:
                    self.global_mode = mode
                else:
                    self.subject_modes[subject] = mode
        elif keytype == "DELETE_SUBJECT" and value is not None:
            # the reference registry's soft delete of a whole subject (read, never written here)
            subject, upto = value["subject"], int(value["version"])
            for sv in self.subjects.get(subject, _Subject()).versions.values():
                if sv.version <= upto:
                    sv.deleted = True
        elif keytype == "CLEAR_SUBJECT" and value is not None:
            subject = value["subject"]
            for sv in list(self.subjects.get(subject, _Subject()).versions.values()):
                if sv.deleted:
                    self._remove_version(subject, sv.version)
        # NOOP and unknown key types carry no state

    def _put_version(self, subject: str, version: int, value: dict[str, Any]) -> None:
        schema_id = int(value["id"])
        text = value["schema"]
        if not isinstance(text, str):
            raise TypeError("schema must be a string")
        schema_type = str(value.get("schemaType") or "AVRO").upper()
        refs = references_from_json(value.get("references"))
        deleted = bool(value.get("deleted", False))
        self.max_id = max(self.max_id, schema_id)
        sub = self.subjects.setdefault(subject, _Subject())
        old = sub.versions.get(version)
        if old is not None and old.schema_id != schema_id:
            self._remove_version(subject, version)
            sub = self.subjects.setdefault(subject, _Subject())
        sub.versions[version] = SubjectVersion(subject, version, schema_id, deleted)
        if schema_id not in self.schemas:
            fp = fingerprint(schema_type, text, refs)
            self.schemas[schema_id] = RegisteredSchema(schema_id, schema_type, text, refs, fp)
            self._by_fingerprint.setdefault(fp, schema_id)
        self._id_users.setdefault(schema_id, set()).add((subject, version))
        for ref in refs:
            self._referrers.setdefault((ref.subject, ref.version), set()).add((subject, version))

    def _remove_version(self, subject: str, version: int) -> None:
        sub = self.subjects.get(subject)
        if sub is None or version not in sub.versions:
            return
        sv = sub.versions.pop(version)
        if not sub.versions:
            del self.subjects[subject]
        users = self._id_users.get(sv.schema_id, set())
        users.discard((subject, version))
        rs = self.schemas.get(sv.schema_id)
        if rs is not None:
            for ref in rs.references:
                referrers = self._referrers.get((ref.subject, ref.version))
                if referrers is not None:
                    referrers.discard((subject, version))
                    if not referrers:
                        del self._referrers[(ref.subject, ref.version)]
        if not users:
            self._id_users.pop(sv.schema_id, None)
            if rs is not None:
                del self.schemas[sv.schema_id]
                if self._by_fingerprint.get(rs.fingerprint) == sv.schema_id:
                    del self._by_fingerprint[rs.fingerprint]

    def _build_parsed(self, rs: RegisteredSchema) -> Any:
        try:
            refs = self.resolve(rs.references)
            if rs.schema_type == "AVRO":
                return parse_avro_with_refs(rs.schema, refs)
            if rs.schema_type == "JSON":
                return json.loads(rs.schema)
            return parse_schema(rs.schema_type, rs.schema, refs).parsed
        except Exception as exc:  # served as text all the same  # noqa: BLE001
            log.warning("schema id %d (%s) could not be parsed: %s", rs.id, rs.schema_type, exc)
            return None

    # ------------------------------------------------------------------ writing

    async def _write(self, key: dict[str, Any], value: dict[str, Any] | None, what: str) -> None:
        """Append one record durably, then apply it."""
        try:
            offset = await self.topic.append(_dumps(key), None if value is None else _dumps(value))
            if offset != self.next_offset:  # another writer's records came first: apply in order
                await self._catch_up()
        except Exception as exc:
            if _storage_cannot_write(exc):  # a full disk: a line a minute, not a traceback each
                self.storage_failures.refused(f"schema registry: {what}", exc, "50001")
            else:
                log.exception("schema registry: writing to %s failed", TOPIC)
            raise errors.store_error(
                f"{what} operation failed while writing to the Kafka store: {exc}"
            ) from None
        if self.next_offset <= offset:
            self._apply(key, value)
            self.next_offset = offset + 1

    # ------------------------------------------------------------------ lookups

    def schema_by_id(self, schema_id: int) -> RegisteredSchema | None:
        """The schema with this id (also when its versions are soft-deleted), from memory."""
        return self.schemas.get(schema_id)

    def _subject(self, subject: str) -> _Subject:
        return self.subjects.get(subject) or _Subject()

    def live_versions(self, subject: str) -> list[SubjectVersion]:
        """The subject's versions not deleted, oldest first ([] for an unknown subject)."""
        return self._subject(subject).included()

    def has_subject(self, subject: str, deleted: bool = False) -> bool:
        return bool(self._subject(subject).included(deleted))

    def list_subjects(
        self, deleted: bool = False, deleted_only: bool = False, prefix: str = ""
    ) -> list[str]:
        return sorted(
            name
            for name, sub in self.subjects.items()
            if name.startswith(prefix) and sub.included(deleted, deleted_only)
        )

    def list_versions(
        self, subject: str, deleted: bool = False, deleted_only: bool = False
    ) -> list[int]:
        if not self.has_subject(subject, deleted or deleted_only):
            raise errors.subject_not_found(subject)
        return [sv.version for sv in self._subject(subject).included(deleted, deleted_only)]

    def get_version(self, subject: str, version: int, deleted: bool = False) -> SubjectVersion:
        included = self._subject(subject).included(deleted)
        found: SubjectVersion | None = None
        if version == LATEST:
            found = included[-1] if included else None
        else:
            found = next((sv for sv in included if sv.version == version), None)
        if found is None:
            if not included:
                raise errors.subject_not_found(subject)
            raise errors.version_not_found(version)
        return found

    def schema_of(self, sv: SubjectVersion) -> RegisteredSchema:
        rs = self.schemas.get(sv.schema_id)
        if rs is None:  # cannot happen: a version keeps its schema alive
            raise errors.store_error(
                f"schema id {sv.schema_id} of {sv.subject} version {sv.version} is missing"
            )
        return rs

    def versions_of_id(
        self, schema_id: int, deleted: bool = False, subject: str | None = None
    ) -> list[SubjectVersion]:
        if schema_id not in self.schemas:
            raise errors.schema_not_found(schema_id)
        out = []
        for name, version in sorted(self._id_users.get(schema_id, set())):
            sv = self.subjects[name].versions[version]
            if (deleted or not sv.deleted) and (subject is None or subject == name):
                out.append(sv)
        return out

    def referenced_by(self, sv: SubjectVersion) -> list[int]:
        ids = {
            self.subjects[s].versions[v].schema_id
            for s, v in self._referrers.get((sv.subject, sv.version), set())
        }
        return sorted(ids)

    def resolve(self, refs: list[Reference], depth: int = 0) -> list[ResolvedReference]:
        """The referenced schemas (soft-deleted versions count), recursively."""
        if depth > _MAX_REFERENCE_DEPTH:
            raise InvalidSchemaError("Invalid schema: references nest too deeply (a cycle?)")
        out = []
        for ref in refs:
            sub = self.subjects.get(ref.subject)
            sv = None
            if sub is not None:
                version = (
                    max(sub.versions) if ref.version == LATEST and sub.versions else ref.version
                )
                sv = sub.versions.get(version)
            if sv is None:
                raise InvalidSchemaError(
                    f"Invalid schema: reference '{ref.name}' to subject '{ref.subject}' "
                    f"version {ref.version} not found"
                )
            rs = self.schemas[sv.schema_id]
            out.append(
                ResolvedReference(
                    ref.name,
                    ref.subject,
                    sv.version,
                    rs.schema_type,
                    rs.schema,
                    self.resolve(rs.references, depth + 1),
                )
            )
        return out

    def parse(
        self,
        schema_type: str,
        text: Any,
        refs: list[Reference],
        subject: str | None = None,
        normalize: bool = False,
    ) -> tuple[ParsedSchema, list[ResolvedReference], str]:
        """Validate a schema from a request: (parsed, resolved references, fingerprint),
        normalized when asked or when the subject's config says so (as Confluent does).
        Raises RegistryError 42201 with Confluent's "Invalid schema ... details:" message."""
        normalize = normalize or self.normalizes(subject)

        def invalid(detail: str) -> errors.RegistryError:
            return errors.invalid_schema_of(subject, schema_type, text, refs, detail)

        if not isinstance(text, str) or not text.strip():
            raise invalid("Empty schema")
        try:
            resolved = self.resolve(refs)
            parsed = parse_schema(schema_type, text, resolved, normalize)
        except InvalidSchemaError as exc:
            raise invalid(str(exc) or "Invalid schema") from None
        except RecursionError:
            raise invalid("Invalid schema: nested too deeply") from None
        return parsed, resolved, fingerprint(schema_type, parsed.canonical, refs)

    def lookup(
        self,
        subject: str,
        schema_type: str,
        text: Any,
        refs: list[Reference],
        deleted: bool = False,
        normalize: bool = False,
    ) -> tuple[SubjectVersion, RegisteredSchema]:
        _, _, fp = self.parse(schema_type, text, refs, subject)
        fps = {fp}
        if schema_type == "PROTOBUF" and (normalize or self.normalizes(subject)):
            # a version registered without normalizing is found by its own text too
            fps.add(self.parse(schema_type, text, refs, subject, True)[2])
        included = self._subject(subject).included(deleted)
        matches = [sv for sv in included if self.schemas[sv.schema_id].fingerprint in fps]
        if not matches:
            if not included:
                raise errors.subject_not_found(subject)
            raise errors.schema_not_found()
        live = [sv for sv in matches if not sv.deleted]
        sv = (live or matches)[-1]
        return sv, self.schemas[sv.schema_id]

    # ------------------------------------------------------------------ config and mode

    def normalizes(self, subject: str | None) -> bool:
        """The ``normalize`` config of the subject, else the global one (default false)."""
        for config in (
            self.subject_configs.get(subject) if subject is not None else None,
            self.global_config,
        ):
            if config and isinstance(config.get("normalize"), bool):
                return bool(config["normalize"])
        return False

    def compatibility(self, subject: str | None) -> str:
        for config in (
            self.subject_configs.get(subject) if subject is not None else None,
            self.global_config,
        ):
            if config and (config.get("compatibilityLevel") or config.get("compatibility")):
                return str(config.get("compatibilityLevel") or config.get("compatibility")).upper()
        return DEFAULT_COMPATIBILITY

    def get_config(self, subject: str | None, default_to_global: bool = False) -> dict[str, Any]:
        if subject is None:
            out = dict(self.global_config or {})
            out["compatibilityLevel"] = self.compatibility(None)
            out.pop("compatibility", None)
            return out
        config = self.subject_configs.get(subject)
        if config is None:
            if not default_to_global:
                raise errors.compatibility_not_configured(subject)
            return self.get_config(None)
        out = dict(config)
        out["compatibilityLevel"] = self.compatibility(subject)
        out.pop("compatibility", None)
        return out

    async def set_config(self, subject: str | None, body: dict[str, Any]) -> dict[str, Any]:
        level = body.get("compatibility", body.get("compatibilityLevel"))
        if not isinstance(level, str) or level.upper() not in COMPATIBILITY_LEVELS:
            raise errors.invalid_compatibility_level(level)
        value: dict[str, Any] = {"compatibilityLevel": level.upper()}
        normalize = body.get("normalize")
        if isinstance(normalize, bool):
            value["normalize"] = normalize
        async with self._writing():
            await self._write(
                {"keytype": "CONFIG", "subject": subject, "magic": 0}, value, "Update config"
            )
        answer: dict[str, Any] = {"compatibility": level.upper()}
        if "normalize" in value:
            answer["normalize"] = value["normalize"]
        return answer

    async def delete_config(self, subject: str | None) -> dict[str, Any]:
        async with self._writing():
            if subject is None:
                previous = self.get_config(None)
                await self._write(
                    {"keytype": "CONFIG", "subject": None, "magic": 0}, None, "Delete config"
                )
                return previous
            if subject not in self.subject_configs:
                raise errors.subject_not_found(subject)
            previous = self.get_config(subject)
            await self._write(
                {"keytype": "CONFIG", "subject": subject, "magic": 0}, None, "Delete config"
            )
            return previous

    def mode(self, subject: str | None) -> str:
        if subject is not None and subject in self.subject_modes:
            return self.subject_modes[subject]
        return self.global_mode or DEFAULT_MODE

    def get_mode(self, subject: str | None, default_to_global: bool = False) -> str:
        if subject is None or subject in self.subject_modes or default_to_global:
            return self.mode(subject)
        raise errors.mode_not_configured(subject)

    async def set_mode(self, subject: str | None, mode: Any, force: bool = False) -> str:
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise errors.invalid_mode(mode)
        mode = mode.upper()
        async with self._writing():
            if mode == "IMPORT" and not force:
                existing = (
                    self.has_subject(subject) if subject is not None else bool(self.list_subjects())
                )
                if existing:
                    raise errors.not_permitted("Cannot import since found existing subjects")
            await self._write(
                {"keytype": "MODE", "subject": subject, "magic": 0}, {"mode": mode}, "Update mode"
            )
        return mode

    async def delete_mode(self, subject: str | None) -> str:
        async with self._writing():
            if subject is None:
                previous = self.mode(None)
                await self._write(
                    {"keytype": "MODE", "subject": None, "magic": 0}, None, "Delete mode"
                )
                return previous
            if subject not in self.subject_modes:
                raise errors.subject_not_found(subject)
            previous = self.subject_modes[subject]
            await self._write(
                {"keytype": "MODE", "subject": subject, "magic": 0}, None, "Delete mode"
            )
            return previous

    # ------------------------------------------------------------------ compatibility

    def _previous_for_level(self, subject: str, level: str) -> list[SubjectVersion]:
        live = self._subject(subject).included()
        if level == "NONE" or not live:
            return []
        return live if level.endswith("_TRANSITIVE") else live[-1:]

    def compatibility_errors(
        self,
        schema_type: str,
        parsed: ParsedSchema,
        resolved: list[ResolvedReference],
        previous: Iterable[SubjectVersion],
        level: str,
    ) -> list[str]:
        """Why ``parsed`` may not follow ``previous`` (oldest first) under ``level``; [] when it may."""
        previous = list(previous)
        if level == "NONE" or not previous:
            return []
        olds = [self.schemas[sv.schema_id] for sv in previous]
        if any(rs.schema_type != schema_type for rs in olds):
            return ["Incompatible because of different schema type"]
        refs: dict[str, str] = {}
        for rs in olds:
            with contextlib.suppress(InvalidSchemaError):
                refs.update(flatten_references(self.resolve(rs.references)))
        refs.update(flatten_references(resolved))
        new_text, old_texts = parsed.canonical, [rs.schema for rs in olds]
        if schema_type == "PROTOBUF":
            from broker.registry.protobuf import text as proto_text

            new_text, old_texts = (
                proto_text.as_text(new_text),
                [proto_text.as_text(t) for t in old_texts],
            )
            refs = {name: proto_text.as_text(text) for name, text in refs.items()}
        from broker.registry import compat

        try:
            messages = compat.check_compatibility(
                schema_type, new_text, old_texts, level, references=refs or None
            )
        except InvalidSchemaError as exc:
            raise errors.invalid_schema(str(exc)) from None
        return [str(m) for m in messages]

    def test_compatibility(
        self,
        subject: str,
        version: int | None,
        schema_type: str,
        text: Any,
        refs: list[Reference],
        normalize: bool = False,
    ) -> list[str]:
        """POST /compatibility/...: against one version (LATEST allowed) or, with
        version None, against the versions the subject's level names.

        As Confluent's CompatibilityResource: a version that does not exist is 40402
        even when the subject does not exist either (``latest`` of no subject is
        compatible), and is looked up before the schema is parsed."""
        level = self.compatibility(subject)
        if version is None:
            previous = self._previous_for_level(subject, level)
        else:
            live = self._subject(subject).included()
            if version == LATEST:
                previous = live[-1:]
            else:
                previous = [sv for sv in live if sv.version == version]
                if not previous:
                    raise errors.version_not_found(version)
            level = level.replace("_TRANSITIVE", "")
        parsed, resolved, _ = self.parse(schema_type, text, refs, subject, normalize)
        return self.compatibility_errors(schema_type, parsed, resolved, previous, level)

    # ------------------------------------------------------------------ register and delete

    async def register(  # noqa: C901 (the registry's register rules in their documented order)
        self,
        subject: str,
        schema_type: str,
        text: Any,
        refs: list[Reference],
        schema_id: int | None = None,
        version: int | None = None,
        normalize: bool = False,
    ) -> tuple[SubjectVersion, RegisteredSchema]:
        async with self._writing():
            mode = self.mode(subject)
            if _is_read_only(mode):
                raise errors.not_permitted(f"Subject {subject} is in read-only mode")
            if schema_id is not None and mode != "IMPORT":
                raise errors.not_permitted(f"Subject {subject} is not in import mode")
            parsed, resolved, fp = self.parse(schema_type, text, refs, subject, normalize)
            sub = self._subject(subject)
            # already registered (and not deleted) under this subject: the same answer again
            if schema_id is None:
                for sv in reversed(sub.included()):
                    if self.schemas[sv.schema_id].fingerprint == fp:
                        return sv, self.schemas[sv.schema_id]
            existing_id = self._by_fingerprint.get(fp)
            if mode == "IMPORT":
                if schema_id is not None:
                    if existing_id is not None and existing_id != schema_id:
                        raise errors.id_does_not_match(
                            f"Schema already registered with id {existing_id} instead of input id {schema_id}"
                        )
                    taken = self.schemas.get(schema_id)
                    if taken is not None and taken.fingerprint != fp:
                        raise errors.not_permitted(
                            f"Overwrite new schema with id {schema_id} is not permitted."
                        )
                    if schema_id < 1:
                        raise errors.invalid_schema(f"Invalid schema id {schema_id}")
                new_id = schema_id if schema_id is not None else existing_id or self.max_id + 1
                if version is not None:
                    if not 1 <= version <= MAX_VERSION:
                        raise errors.invalid_version(str(version))
                    if version in sub.versions and sub.versions[version].schema_id != new_id:
                        raise errors.not_permitted(
                            f"Overwrite new schema with version {version} is not permitted."
                        )
                new_version = version if version is not None else max(sub.versions, default=0) + 1
            else:
                level = self.compatibility(subject)
                problems = self.compatibility_errors(
                    schema_type, parsed, resolved, self._previous_for_level(subject, level), level
                )
                if problems:
                    raise errors.incompatible(
                        f'Schema being registered is incompatible with an earlier schema for subject "{subject}", '
                        f"details: [{', '.join(problems)}, {{compatibility: '{level}'}}]"
                    )
                new_version = max(sub.versions, default=0) + 1
                if version is not None and version != new_version:
                    raise errors.invalid_schema(
                        f"Version {version} is not one more than previous version {new_version - 1}"
                    )
                new_id = existing_id if existing_id is not None else self.max_id + 1
            rs = self.schemas.get(new_id) or RegisteredSchema(
                new_id, schema_type, parsed.canonical, list(refs), fp, parsed.parsed
            )
            sv = SubjectVersion(subject, new_version, new_id, False)
            await self._write(
                schema_key(subject, new_version), schema_value(sv, rs), "Register schema"
            )
            stored = self.schemas[new_id]
            if stored.parsed is None:
                stored.parsed = parsed.parsed
            return self.subjects[subject].versions[new_version], stored

    def _check_not_referenced(self, sv: SubjectVersion) -> None:
        if self._referrers.get((sv.subject, sv.version)):
            raise errors.reference_exists(
                f"One or more references exist to the schema {{magic=1,keytype=SCHEMA,subject={sv.subject},"
                f"version={sv.version}}}."
            )

    async def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        async with self._writing():
            if _is_read_only(self.mode(subject)):
                raise errors.not_permitted(f"Subject {subject} is in read-only mode")
            sub = self._subject(subject)
            if not sub.versions:
                raise errors.subject_not_found(subject)
            if permanent:
                versions = sub.included(deleted=True)
                if any(not sv.deleted for sv in versions):
                    raise errors.subject_not_soft_deleted(subject)
                for sv in versions:
                    self._check_not_referenced(sv)
                for sv in versions:
                    await self._write(schema_key(subject, sv.version), None, "Delete subject")
                return [sv.version for sv in versions]
            versions = sub.included()
            if not versions:
                raise errors.subject_soft_deleted(subject)
            for sv in versions:
                self._check_not_referenced(sv)
            for sv in versions:
                gone = SubjectVersion(subject, sv.version, sv.schema_id, True)
                await self._write(
                    schema_key(subject, sv.version),
                    schema_value(gone, self.schemas[sv.schema_id]),
                    "Delete subject",
                )
            await self._forget_subject_settings(subject)
            return [sv.version for sv in versions]

    async def _forget_subject_settings(self, subject: str) -> None:
        if subject in self.subject_modes:
            await self._write(
                {"keytype": "MODE", "subject": subject, "magic": 0}, None, "Delete mode"
            )
        if subject in self.subject_configs:
            await self._write(
                {"keytype": "CONFIG", "subject": subject, "magic": 0}, None, "Delete config"
            )

    async def delete_version(self, subject: str, version: int, permanent: bool = False) -> int:
        async with self._writing():
            if _is_read_only(self.mode(subject)):
                raise errors.not_permitted(f"Subject {subject} is in read-only mode")
            sub = self._subject(subject)
            label = "latest" if version == LATEST else str(version)
            if not sub.versions:
                raise errors.subject_not_found(subject)
            if version == LATEST:
                everything = sub.included(deleted=True)
                live = sub.included()
                if not permanent and not live:
                    raise errors.version_soft_deleted(subject, label)
                sv = (everything if permanent else live)[-1]
            else:
                found = sub.versions.get(version)
                if found is None:
                    raise errors.version_not_found(version)
                sv = found
                if not permanent and sv.deleted:
                    raise errors.version_soft_deleted(subject, label)
            if permanent and not sv.deleted:
                raise errors.version_not_soft_deleted(subject, label)
            self._check_not_referenced(sv)
            if permanent:
                await self._write(schema_key(subject, sv.version), None, "Delete Schema Version")
            else:
                gone = SubjectVersion(subject, sv.version, sv.schema_id, True)
                await self._write(
                    schema_key(subject, sv.version),
                    schema_value(gone, self.schemas[sv.schema_id]),
                    "Delete Schema Version",
                )
                if not self._subject(subject).included():
                    await self._forget_subject_settings(subject)
            return sv.version
