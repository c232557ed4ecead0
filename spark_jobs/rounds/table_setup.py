"""The round's table: created from the topic's schema on first use, evolved before each write.

Schema changes are committed on their own, before the data: adding optional
columns or widening types is harmless if the round then dies, and the data
commit's own requirements would fail anyway if the schema moved under it.
Two rounds evolving at once: the catalog refuses the second (assert-current-
schema-id), which reloads and plans again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from broker import names
from broker.contracts import CatalogSpec, ClusterInfo
from broker.topic_configs import CONVERT_VALUE_TYPE, TableSettings
from spark_jobs.broker_client import BrokerRequestError, RegistryClient, TableTopic
from spark_jobs.decode import avro_schema
from spark_jobs.rounds import evolution

log = logging.getLogger(__name__)
EVOLVE_ATTEMPTS = 5


class SchemaUnavailable(RuntimeError):
    """The topic's records are Avro by schema id but the registry has no schema to build the table from."""


@dataclass
class TableOptions:
    """The ``automq.table.topic.*`` settings that shape the table's schema."""

    key_type: str
    value_type: str
    transform: str
    format_version: int

    @classmethod
    def of(cls, topic: TableTopic) -> TableOptions:
        return cls.of_settings(topic.settings)

    @classmethod
    def of_settings(cls, settings: TableSettings) -> TableOptions:
        return cls(
            settings.convert_key_type,
            settings.convert_value_type,
            settings.transform_value_type,
            settings.format_version,
        )


@dataclass
class Evolution:
    applied: list[str] = field(default_factory=list)
    refused: dict[int, str] = field(
        default_factory=dict
    )  # schema id -> why the table cannot take it


value_subject = names.value_subject
key_subject = names.key_subject


def _latest(registry: RegistryClient, subject: str) -> str | None:
    versions = registry.subject_versions(subject)
    return versions[-1][1] if versions else None


def load_or_create(
    catalog: Catalog,
    topic: TableTopic,
    registry: RegistryClient,
    options: TableOptions,
    first_value_schema_id: Callable[[], int | None],
) -> Table:
    """The table, created (with its namespace) if missing, from the schema of the round's
    first record (``first_value_schema_id``; it also covers producers that register under
    another subject, RecordNameStrategy), else the value subject's latest schema."""
    try:
        return catalog.load_table(topic.identifier)
    except NoSuchTableError:
        pass
    value_schema: str | None = None
    if options.value_type in ("by_schema_id", "by_latest_schema"):
        if (schema_id := first_value_schema_id()) is not None:
            try:
                value_schema = registry.avro_schema(
                    schema_id
                )  # what the data starts with; evolve() adds the rest
            except (
                BrokerRequestError,
                ValueError,
            ) as exc:  # a bad first record: the DLQ's business
                log.warning("the first record names schema id %d: %s", schema_id, exc)
        if value_schema is None:
            value_schema = _latest(registry, value_subject(topic.topic))
        if value_schema is None:
            raise SchemaUnavailable(
                f"no Avro schema for the values of {topic.topic}: register one under subject "
                f"{value_subject(topic.topic)!r} (or set {CONVERT_VALUE_TYPE}=raw/string)"
            )
    key_schema = (
        _latest(registry, key_subject(topic.topic)) if options.key_type == "by_schema_id" else None
    )
    schema = avro_schema.table_schema(
        value_schema,
        key_type=options.key_type,
        value_type=options.value_type,
        transform=options.transform,
        key_schema=key_schema,
        format_version=options.format_version,
    )
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(topic.namespace)
    properties = {
        "format-version": str(options.format_version),
        "write.parquet.compression-codec": "zstd",
        "icefall.topic": topic.topic,
    }
    try:
        table = catalog.create_table(topic.identifier, schema, properties=properties)
    except TableAlreadyExistsError:  # a concurrent round created it first
        return catalog.load_table(topic.identifier)
    log.info(
        "created table %s.%s with %d columns", topic.namespace, topic.table, len(schema.fields)
    )
    return table


BASE_PROPERTY, BASE_NOTE = "icefall.base", "empty table created for the first round"


def ensure_base_snapshot(table: Table) -> Table:
    """Give an empty table (no snapshot yet) an empty one on ``main``: a round
    branches from ``main``, and Iceberg cannot branch from nothing. Harmless
    when two rounds race: the catalog takes one (``main`` must not exist yet)."""
    if table.metadata.refs.get("main") is not None:
        return table
    try:
        with (
            table.transaction() as tx,
            tx.update_snapshot(snapshot_properties={BASE_PROPERTY: BASE_NOTE}).fast_append(),
        ):
            pass
    except CommitFailedException:
        pass
    return table.refresh()


def plan(current: Schema, text: str, options: TableOptions) -> list[evolution.SchemaChange]:
    """What ``current`` must change to take records of one Avro value schema (the key column is the
    key subject's, never evolved from a value schema); raises ``IncompatibleSchemaChange`` or
    ``UnsupportedAvroSchema`` when it cannot. The one planning step of the round and of the
    registry's check at registration (``broker.registry.table_check``)."""
    changes = evolution.plan_evolution(
        current,
        text,
        key_type="raw" if options.key_type == "by_schema_id" else options.key_type,
        value_type=options.value_type,
        transform=options.transform,
        format_version=options.format_version,
    )
    return [c for c in changes if c.path[:1] != (avro_schema.KAFKA_KEY,)]


def evolve(table: Table, schemas: Iterable[tuple[int, str]], options: TableOptions) -> Evolution:
    """Evolve the table for every value schema, oldest first, so records of any of
    them fit; a schema the table cannot take is recorded, not raised: the round
    fails only if records of it are in the range."""
    result = Evolution()
    for schema_id, text in schemas:
        if options.value_type not in ("by_schema_id", "by_latest_schema"):
            break
        for attempt in range(EVOLVE_ATTEMPTS):
            try:
                changes = plan(table.schema(), text, options)
            except (
                evolution.IncompatibleSchemaChange,
                avro_schema.UnsupportedAvroSchema,
                ValueError,
            ) as exc:
                result.refused[schema_id] = str(exc)
                break
            if not changes:
                break
            try:
                with table.update_schema() as update:
                    evolution.apply_schema_changes(update, changes)
                described = evolution.describe(changes)
                log.info(
                    "evolved %s for schema id %d: %s", table.name(), schema_id, "; ".join(described)
                )
                result.applied.extend(described)
                break
            except CommitFailedException:
                if attempt == EVOLVE_ATTEMPTS - 1:
                    raise
                table = table.refresh()
    return result


def would_evolve(
    table: Table, earlier: Iterable[str], text: str, options: TableOptions
) -> list[str]:
    """A dry run of ``evolve``: the changes the next round would make for the value schema ``text``
    after the subject's ``earlier`` versions (oldest first) have had theirs, staged on a transaction
    that is never committed. Raises as ``plan`` does when the table could not take ``text``; an
    earlier version the table cannot take is skipped, as the round skips it."""
    staged = table.transaction()
    for old in earlier:
        try:
            changes = plan(staged.table_metadata.schema(), old, options)
        except ValueError:  # IncompatibleSchemaChange and UnsupportedAvroSchema are ValueErrors
            continue
        if changes:
            with staged.update_schema() as update:  # staged on the transaction only
                evolution.apply_schema_changes(update, changes)
    return evolution.describe(plan(staged.table_metadata.schema(), text, options))


def value_schemas(
    registry: RegistryClient, topic: str, extra_ids: Iterable[int] = ()
) -> list[tuple[int, str]]:
    """The value subject's versions, then any other ids the records named."""
    found = registry.subject_versions(value_subject(topic))
    have = {i for i, _ in found}
    for schema_id in sorted(set(extra_ids) - have):
        found.append((schema_id, registry.avro_schema(schema_id)))
    return found


def catalog_for(catalog: str | CatalogSpec, name: str = "icefall", **properties: Any) -> Catalog:
    """pyiceberg's client of the tables' catalog: a REST catalog URL, or the broker's spec of it."""
    from pyiceberg.catalog import load_catalog

    spec = CatalogSpec.rest(catalog) if isinstance(catalog, str) else catalog
    return load_catalog(name, **{**spec.pyiceberg_properties(), **properties})


def job_catalog(catalog_url: str | None, cluster: ClusterInfo) -> CatalogSpec:
    """The catalog a job writes to: its ``--catalog-url`` (a REST catalog), else the broker's."""
    return CatalogSpec.rest(catalog_url) if catalog_url else cluster.tables_catalog
