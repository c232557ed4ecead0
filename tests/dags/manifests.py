"""Writing table-topic manifests the way the broker does (broker.manifest)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from broker import manifest as broker_manifest


def entry(
    topic: str,
    interval_ms: int = 60_000,
    namespace: str = "default",
    partitions: int = 1,
    configs: Mapping[str, str] | None = None,
) -> dict[str, object]:
    return {
        "topic": topic,
        "topic_id": f"id-{topic}",
        "partitions": partitions,
        "namespace": namespace,
        "table": topic.replace(".", "_").replace("-", "_"),
        "commit_interval_ms": interval_ms,
        "configs": {
            "automq.table.topic.enable": "true",
            "automq.table.topic.commit.interval.ms": str(interval_ms),
            **(configs or {}),
        },
    }


def disabled_entry(
    topic: str, interval_ms: int = 60_000, namespace: str = "default"
) -> dict[str, object]:
    """A topic whose ``automq.table.topic.enable`` was set to false."""
    return entry(topic, interval_ms, namespace, configs={"automq.table.topic.enable": "false"})


def write(
    home: Path,
    *entries: dict[str, object],
    admin_url: str = "http://127.0.0.1:1",
    disabled: tuple[dict[str, object], ...] = (),
) -> Path:
    path = home / "table_topics.json"
    broker_manifest.write_atomically(
        path,
        {
            "version": 1,
            "admin_url": admin_url,
            "table_topics": list(entries),
            "disabled_table_topics": list(disabled),
        },
    )
    return path
