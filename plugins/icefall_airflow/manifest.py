"""The table-topic manifest as the DAG factory sees it.

The broker rewrites ``HOME/table_topics.json`` atomically on every topic or
config change; reading that file is the only thing the factory does at parse
time (no network, no database), so the DAG processor stays fast and works
while the broker is down.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker import topic_configs
from icefall_airflow import settings

ENABLE_KEY = topic_configs.ENABLE
COMMIT_TRIGGER_KEY = topic_configs.COMMIT_TRIGGER_BYTES


@dataclass(frozen=True)
class TableTopic:
    """One table topic: what its commit DAG needs to know."""

    topic: str
    namespace: str
    table: str
    partitions: int
    commit_interval_ms: int
    topic_id: str = ""
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def settings(self) -> topic_configs.TableSettings:
        """The topic's ``automq.table.topic.*`` configs, typed (``broker.topic_configs``)."""
        return topic_configs.TableSettings(self.configs)

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    @property
    def dag_id(self) -> str:
        return settings.commit_dag_id(self.topic)

    @property
    def pool(self) -> str:
        return settings.pool_name(self.topic)

    @property
    def asset_name(self) -> str:
        return settings.asset_name(self.namespace, self.table)

    def dag_tags(self, kind: str) -> list[str]:
        """The tags of this topic's ``kind`` DAG (commit, maintenance); ``disabled`` while the flag is off."""
        return ["icefall", kind, f"namespace:{self.namespace}", *([] if self.enabled else ["disabled"])]

    @property
    def disabled_note(self) -> str:
        """What a DAG's docs start with while the topic's table-topic flag is off."""
        return "" if self.enabled else f"**Disabled**: the topic's `{ENABLE_KEY}` is `false`; this DAG is paused.\n\n"

    @property
    def commit_trigger_bytes(self) -> int:
        """``automq.table.topic.commit.trigger.bytes``: 0 (the default) commits on the interval only."""
        return self.settings.commit_trigger_bytes

    @property
    def schedule_ms(self) -> int:
        return max(self.commit_interval_ms, settings.MIN_SCHEDULE_MS)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> TableTopic:
        return cls(
            topic=str(raw["topic"]),
            namespace=str(raw.get("namespace") or "default"),
            table=str(raw["table"]),
            partitions=int(raw.get("partitions", 1)),
            commit_interval_ms=int(raw.get("commit_interval_ms", 60_000)),
            topic_id=str(raw.get("topic_id", "")),
            configs={str(k): str(v) for k, v in (raw.get("configs") or {}).items()},
        )


@dataclass(frozen=True)
class Manifest:
    table_topics: list[TableTopic]
    admin_url: str | None = None
    # Topics whose automq.table.topic.enable was set to false: their DAGs stay, paused.
    disabled_table_topics: list[TableTopic] = field(default_factory=list)


def read(path: Path | None = None) -> Manifest:
    """The manifest at ``path`` (default ``HOME/table_topics.json``); empty when the
    broker never ran. A file that is not a manifest raises, so the DAG processor
    shows an import error instead of silently dropping every DAG."""
    path = path or settings.manifest_path()
    if not path.exists():
        return Manifest([])
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("table_topics"), list):
        raise ValueError(f"{path} is not an Icefall table-topic manifest")  # noqa: TRY004
    return Manifest([TableTopic.from_json(t) for t in raw["table_topics"]], raw.get("admin_url"),
                    [TableTopic.from_json(t) for t in raw.get("disabled_table_topics") or []])


def admin_url(manifest: Manifest | None = None) -> str:
    """The broker admin API: ``$ICEFALL_ADMIN_URL``, else the one the broker wrote
    into its manifest, else the default broker's."""
    import os

    if env := os.environ.get(settings.ADMIN_URL_ENV):
        return env
    if manifest is None:
        manifest = read()
    return manifest.admin_url or settings.default_admin_url()
