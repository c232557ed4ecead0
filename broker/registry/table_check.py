"""Registration checked against the Iceberg table: a schema change can never stall a table.

The registry's own compatibility levels say whether consumers of the subject can
read the new schema; they know nothing of the table a table topic's round
writes. Without this check a value schema the table cannot evolve to (a column
``string`` -> ``int``) is accepted, producers write records of it, and the next
commit round fails on them. So when a new version of a table topic's value
subject (``<topic>-value``, TopicNameStrategy) is registered and the table
exists, the registry asks the round's own planner
(``spark_jobs.rounds.table_setup.would_evolve``: the same code, not a restatement
of its rules) what the next round would do to the table, after the subject's
earlier versions have had their changes, and refuses with 409 naming the column
and both types when the answer is "cannot". ``automq.table.topic.schema.evolution.check=false``
turns it off for a topic.

What is checked: Avro schemas of topics converting values ``by_schema_id`` or
``by_latest_schema`` (the only schemas a round evolves a table for; JSON Schema
and Protobuf values are not decoded by rounds). Not checked: a schema already
registered under the subject (re-registering answers the same id, as before),
one the registry's compatibility level refuses anyway (that 409 comes first),
IMPORT mode, key subjects (the key column is never evolved), subjects of other
naming strategies (the round still refuses their records).

A catalog that does not answer (within ``TIMEOUT_S``, or with an error) does not
block registration: producers must start while the table side is down, as
produce itself never waits for the catalog. The schema is accepted with a
warning in the broker log naming the catalog, and the round remains the last
line: it refuses a schema it cannot take and fails only if records of it
arrive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker import names, topic_configs
from broker.registry import api_errors as errors
from broker.registry.api_errors import RegistryError
from broker.registry.schemas import Reference

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from broker.cluster import Cluster
    from broker.registry.store import SchemaStore

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
CHECKED_VALUE_TYPES = ("by_schema_id", "by_latest_schema")
# (namespace, table) -> the table, None when it does not exist; raises when the catalog cannot answer
TableLoader = Callable[[str, str], "Table | None"]


def table_topic_of(cluster: Cluster, subject: str) -> Any | None:
    """The table topic whose value subject ``subject`` is (TopicNameStrategy), when the check applies to it."""
    if not subject.endswith(names.VALUE_SUBJECT_SUFFIX):
        return None
    topic = cluster.topics.get(subject.removesuffix(names.VALUE_SUBJECT_SUFFIX))
    if topic is None or not topic_configs.is_table_topic(topic.configs):
        return None
    settings = topic_configs.TableSettings(topic.configs)
    if (
        not settings.schema_evolution_check
        or settings.convert_value_type not in CHECKED_VALUE_TYPES
    ):
        return None
    return topic


class TableCheck:
    """Called by the registry before a new version is written; raises 409 when the table could not take it."""

    def __init__(
        self,
        cluster: Cluster,
        store: SchemaStore,
        load_table: TableLoader,
        catalog_name: str,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.cluster = cluster
        self.store = store
        self.load_table = load_table
        self.catalog_name = catalog_name
        self.timeout_s = timeout_s

    def _is_new_version(
        self, subject: str, schema_type: str, text: Any, refs: list[Reference], normalize: bool
    ) -> bool:
        """Whether registering would write a version the registry itself accepts (else the store answers)."""
        if self.store.mode(subject) != "READWRITE":
            return False
        try:
            self.store.lookup(subject, schema_type, text, refs, False, normalize)
        except RegistryError as exc:
            if exc.code == 42201:  # invalid: the store's 422 says why
                return False
        else:
            return False  # already registered: the same answer again
        try:
            return not self.store.test_compatibility(
                subject, None, schema_type, text, refs, normalize
            )
        except RegistryError:
            return False

    async def check(
        self,
        subject: str,
        schema_type: str,
        text: Any,
        refs: list[Reference],
        normalize: bool = False,
    ) -> None:
        if schema_type != "AVRO":
            return
        topic = table_topic_of(self.cluster, subject)
        if topic is None or not self._is_new_version(subject, schema_type, text, refs, normalize):
            return
        parsed, _, _ = self.store.parse(schema_type, text, refs, subject, normalize)
        earlier = [self.store.schema_of(sv) for sv in self.store.live_versions(subject)]
        earlier_texts = [rs.schema for rs in earlier if rs.schema_type == "AVRO"]
        settings = topic_configs.TableSettings(topic.configs)
        namespace, table = settings.namespace, names.table_name(topic.name)
        try:
            changes = await asyncio.wait_for(
                asyncio.to_thread(
                    self._plan, namespace, table, settings, earlier_texts, parsed.canonical
                ),
                self.timeout_s,
            )
        except RegistryError:
            raise
        except TimeoutError:
            log.warning(
                "schema registry: %s registered without the table check: catalog %s did not "
                "answer for %s.%s within %.0f s",
                subject,
                self.catalog_name,
                namespace,
                table,
                self.timeout_s,
            )
            return
        except Exception as exc:  # noqa: BLE001 -- the catalog's failure must not block producers
            log.warning(
                "schema registry: %s registered without the table check: catalog %s failed for "
                "%s.%s: %s: %s",
                subject,
                self.catalog_name,
                namespace,
                table,
                type(exc).__name__,
                exc,
            )
            return
        if changes:
            log.info(
                "schema registry: %s: the next round evolves %s.%s: %s",
                subject,
                namespace,
                table,
                "; ".join(changes),
            )

    def _plan(
        self,
        namespace: str,
        table_name: str,
        settings: topic_configs.TableSettings,
        earlier: list[str],
        text: str,
    ) -> list[str] | None:
        """The changes the next round would make (None: no table yet, nothing to check against);
        RegistryError 409 when it could not make them. Blocking: runs in a thread."""
        from spark_jobs.decode.avro_schema import UnsupportedAvroSchema
        from spark_jobs.rounds import table_setup
        from spark_jobs.rounds.evolution import IncompatibleSchemaChange

        table = self.load_table(namespace, table_name)
        if table is None:
            return None
        try:
            return table_setup.would_evolve(
                table, earlier, text, table_setup.TableOptions.of_settings(settings)
            )
        except (IncompatibleSchemaChange, UnsupportedAvroSchema) as exc:
            raise incompatible_with_table(namespace, table_name, str(exc)) from None


def incompatible_with_table(namespace: str, table: str, why: str) -> RegistryError:
    """Confluent's 409 for an incompatible schema, naming the table and the column."""
    return errors.incompatible(
        f"Schema being registered is incompatible with the Iceberg table {namespace}.{table}: {why} "
        f"(the commit round could not evolve the table to it; set "
        f"{topic_configs.SCHEMA_EVOLUTION_CHECK}=false on the topic to register it anyway)"
    )
