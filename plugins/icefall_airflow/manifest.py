"""The table-topic manifest as the DAG factory sees it.

The broker rewrites ``HOME/table_topics.json`` atomically on every topic or
config change; reading that file is the only thing the factory does at parse
time (no network, no database), so the DAG processor stays fast and works
while the broker is down. The file's shape is ``broker.contracts.Manifest``
(pydantic only: cheap enough for parse time); this module adds what the DAGs
show of an entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker import contracts, topic_configs
from icefall_airflow import settings

ENABLE_KEY = topic_configs.ENABLE
COMMIT_TRIGGER_KEY = topic_configs.COMMIT_TRIGGER_BYTES
# TableTopic's positional order (the fields of the dataclass it used to be)
_POSITIONAL = (
    "topic",
    "namespace",
    "table",
    "partitions",
    "commit_interval_ms",
    "topic_id",
    "configs",
)


class TableTopic(contracts.TableTopic):
    """One table topic: the manifest entry (``broker.contracts.TableTopic``), and what its DAGs
    show of it (schedule, tags, docs)."""

    def __init__(self, *args: Any, **fields: Any) -> None:
        fields.update(zip(_POSITIONAL, args, strict=False))
        super().__init__(**fields)

    def dag_tags(self, kind: str) -> list[str]:
        """The tags of this topic's ``kind`` DAG (commit, maintenance); ``disabled`` while the flag is off."""
        return [
            "icefall",
            kind,
            f"namespace:{self.namespace}",
            *([] if self.enabled else ["disabled"]),
        ]

    @property
    def disabled_note(self) -> str:
        """What a DAG's docs start with while the topic's table-topic flag is off."""
        return (
            ""
            if self.enabled
            else f"**Disabled**: the topic's `{ENABLE_KEY}` is `false`; this DAG is paused.\n\n"
        )

    @property
    def schedule_ms(self) -> int:
        return max(self.commit_interval_ms, settings.MIN_SCHEDULE_MS)

    @classmethod
    def from_json(cls, raw: Any) -> TableTopic:
        """An entry of the manifest file, or one the admin API answered (a ``contracts.TableTopic``)."""
        if isinstance(raw, contracts.TableTopic):
            raw = raw.model_dump()
        return cls.model_validate(raw)


class Manifest(contracts.Manifest):
    """The manifest, with the DAGs' view of each entry."""

    table_topics: list[TableTopic]
    # Topics whose automq.table.topic.enable was set to false: their DAGs stay, paused.
    disabled_table_topics: list[TableTopic] = []

    def to_build(self, dag_id_of: Callable[[str], str]) -> list[TableTopic]:
        """The entries (enabled, then disabled) a DAG file builds a DAG for (``dag_id_of(topic)``
        names it): all of them, but in a task process, which parses the file only for its own
        DAG (Airflow's parsing context names it), that one alone: a task need not build every
        table topic's DAG."""
        from airflow.sdk import get_parsing_context

        entries = [*self.table_topics, *self.disabled_table_topics]
        only = get_parsing_context().dag_id
        return entries if only is None else [e for e in entries if dag_id_of(e.topic) == only]


def read(path: Path | None = None) -> Manifest:
    """The manifest at ``path`` (default ``HOME/table_topics.json``); empty when the
    broker never ran. A file that is not a manifest raises, so the DAG processor
    shows an import error instead of silently dropping every DAG."""
    path = path or settings.manifest_path()
    if not path.exists():
        return Manifest(table_topics=[])
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("table_topics"), list):
        raise ValueError(f"{path} is not an Icefall table-topic manifest")  # noqa: TRY004
    return Manifest.model_validate(raw)


def admin_url(manifest: Manifest | None = None) -> str:
    """The broker admin API: ``$ICEFALL_ADMIN_URL``, else the one the broker wrote
    into its manifest, else the default broker's."""
    import os

    if env := os.environ.get(settings.ADMIN_URL_ENV):
        return env
    if manifest is None:
        manifest = read()
    return manifest.admin_url or settings.default_admin_url()
