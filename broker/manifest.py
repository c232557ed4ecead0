"""The table-topic manifest: the file the Airflow DAG factory reads at parse
time (no network or database calls there), rewritten atomically on every
topic or config change that changes it (``write_if_changed``).

Its shape is ``broker.contracts.Manifest``, the model the DAG factory and the
Spark jobs parse it with."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from broker import contracts, names, topic_configs
from broker.storage.metadata import TopicRecord

MANIFEST_VERSION = contracts.MANIFEST_VERSION


def render(topics: Iterable[TopicRecord], admin_url: str) -> dict[str, object]:
    """``table_topics``: the table topics; ``disabled_table_topics``: topics whose
    ``automq.table.topic.enable`` is set to ``false`` (turned off, so their DAGs stay
    in Airflow, paused, with their history, until the flag comes back)."""
    tables = []
    disabled = []
    for topic in topics:
        if topic_configs.is_table_topic(topic.configs):
            tables.append(_entry(topic))
        elif topic.configs.get(topic_configs.ENABLE) == "false":
            disabled.append(_entry(topic))
    return contracts.Manifest(
        version=MANIFEST_VERSION,
        admin_url=admin_url,
        table_topics=tables,
        disabled_table_topics=disabled,
    ).to_json()


def _entry(topic: TopicRecord) -> contracts.TableTopic:
    view = topic_configs.TableSettings(topic_configs.effective(topic.configs))
    return contracts.TableTopic(
        topic=topic.name,
        topic_id=str(topic.topic_id),
        partitions=topic.partitions,
        namespace=view.namespace,
        table=names.table_name(topic.name),
        commit_interval_ms=view.commit_interval_ms,
        configs=view.table_keys(),
        created_ms=topic.created_ms,
    )


def write_if_changed(path: Path, content: dict[str, object]) -> bool:
    """``write_atomically`` unless the file already holds ``content``; True if it wrote.

    Airflow re-parses the DAG files of a manifest it sees changed (by its time stamp), and
    ``icefall up`` then re-syncs pools and paused DAGs (an Airflow start, ~1 CPU-second):
    a topic or config change that leaves the table topics as they were (a plain topic, a
    consumer group's or a Connect worker's internal topic) leaves the file untouched."""
    text = _text(content)
    try:
        if path.read_text() == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    _write_text(path, text)
    return True


def _text(content: dict[str, object]) -> str:
    return json.dumps(content, indent=2, sort_keys=True) + "\n"


def write_atomically(path: Path, content: dict[str, object]) -> None:
    """tmp file + fsync + rename + directory fsync: a reader sees the old or the new file, never half."""
    _write_text(path, _text(content))


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read(path: Path) -> dict[str, object]:
    if not path.exists():
        return {"version": MANIFEST_VERSION, "table_topics": []}
    data: dict[str, object] = json.loads(path.read_text())
    return data
