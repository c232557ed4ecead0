"""A table topic's last hours: its commits (rows, files, bytes each) and its lag over time.

Commits come from the table's snapshot history: every snapshot on ``main``'s
ancestry that carries a commit checkpoint (``icefall.offsets``, written by the
round) is one commit; its size is the sum of ``added-records`` /
``added-data-files`` / ``added-files-size`` over the round's snapshots since the
previous checkpoint (a round on an upsert table adds more than one; compaction's
``replace`` snapshots add no new rows and are left out).

Lag over time is derived, not sampled. At a past time ``t`` the table held the
offsets of the newest checkpoint committed at or before ``t`` (the snapshot
history), and the topic ended at the first offset appended at or after ``t``
(the broker's plan for ``until_append_ms=t``, from its segment index of append
times, as a round cuts its data interval); the oldest record not yet in the
table was appended when the batch at the committed offset was (the segment
index again). So the lag is known exactly (to batch precision) at any past time
whose records are still retained, and it survives broker and API-server
restarts, which an in-memory ring buffer of samples would not; nor does the
broker keep new state for it. Points are taken just before and just after each
commit in the window (where the lag's saw-tooth turns) and now; the points in
the past never change, so their broker answers are cached.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel

from broker import checkpoint, contracts
from broker.admin_client import AdminClient
from icefall_airflow import lag, manifest, tables
from icefall_airflow.broker_client import TIMEOUT_S, BrokerClient, BrokerError

WINDOW_MS = 6 * 3600 * 1000  # "the last hours" the charts show
MAX_COMMITS = 60  # newest commits in the window that get lag points (two broker reads each)
MAX_ROWS = 200  # newest commits in the window listed (snapshot metadata only)
SETTLED_MS = 300_000  # a past point older than this is stable: its broker answers are cached
ROUND_SKIPPED = ("replace",)  # snapshot operations that add no new rows (compaction)


class Commit(BaseModel):
    """One commit round's snapshot: what it added and the offsets it committed."""

    snapshot_id: int
    timestamp_ms: int
    round_id: str | None
    operation: str | None
    added_records: int
    added_files: int
    added_bytes: int
    offsets_before: dict[str, int]
    offsets_after: dict[str, int]
    total_records: int | None
    summary: dict[str, str]


class LagPoint(BaseModel):
    at_ms: int
    records: int
    seconds: float


class TableHistory(BaseModel):
    topic: str
    namespace: str
    table: str
    window_ms: int
    commits: list[Commit]  # oldest first
    lag: list[LagPoint]  # oldest first


def _int(summary: dict[str, str], key: str) -> int:
    try:
        return int(summary.get(key) or 0)
    except ValueError:
        return 0


def _ancestry(metadata: Any) -> Iterator[Any]:
    """``main``'s snapshots, newest first (until expiry cut the ancestry short)."""
    ref = metadata.refs.get(checkpoint.MAIN)
    snapshot_id = ref.snapshot_id if ref is not None else None
    seen: set[int] = set()
    while snapshot_id is not None and snapshot_id not in seen:
        seen.add(snapshot_id)
        snapshot = metadata.snapshot_by_id(snapshot_id)
        if snapshot is None:
            return
        yield snapshot
        snapshot_id = snapshot.parent_snapshot_id


def commits(metadata: Any, topic_id: str, since_ms: int, limit: int = MAX_ROWS) -> list[Commit]:
    """The commits on ``main`` from ``since_ms`` on (the newest ``limit``), oldest first; each with
    the offsets of the commit before it (the first one's too, when one is older)."""
    # newest first: (checkpoint snapshot, its properties, the round's snapshots since the last one)
    found: list[tuple[Any, dict[str, str], list[Any]]] = []
    pending: list[Any] = []  # snapshots newer than the checkpoint the walk reaches next
    reference = False  # whether the oldest found is the commit before the window, not in it
    for snapshot in _ancestry(metadata):
        props = checkpoint.summary_properties(snapshot)
        if checkpoint.OFFSETS not in props:
            pending.append(snapshot)
            continue
        if found:  # what came after this checkpoint up to the newer one: the newer round's
            found[-1][2].extend(pending)
        pending = []  # (before any checkpoint: maintenance after the last round, nobody's)
        found.append((snapshot, props, [snapshot]))
        if snapshot.timestamp_ms < since_ms or len(found) > limit:
            reference = True
            break
    if found and not reference:
        found[-1][2].extend(pending)  # the first round's earlier snapshots
    found.reverse()
    before: dict[str, int] = {}
    if reference:
        before = _offsets(found.pop(0)[1], topic_id)
    result: list[Commit] = []
    for snapshot, props, round_snapshots in found:
        after = _offsets(props, topic_id)
        summaries = [_summary(s) for s in round_snapshots if _operation(s) not in ROUND_SKIPPED]
        result.append(
            Commit(
                snapshot_id=snapshot.snapshot_id,
                timestamp_ms=snapshot.timestamp_ms,
                round_id=props.get(checkpoint.ROUND_ID),
                operation=_operation(snapshot),
                added_records=sum(_int(s, "added-records") for s in summaries),
                added_files=sum(_int(s, "added-data-files") for s in summaries),
                added_bytes=sum(_int(s, "added-files-size") for s in summaries),
                offsets_before=before,
                offsets_after=after,
                total_records=_int(_summary(snapshot), "total-records"),
                summary=_summary(snapshot),
            )
        )
        before = after
    return result


def _operation(snapshot: Any) -> str | None:
    summary = getattr(snapshot, "summary", None)
    return summary.operation.value if summary is not None else None


def _summary(snapshot: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in checkpoint.summary_properties(snapshot).items()}


def _offsets(props: dict[str, str], topic_id: str) -> dict[str, int]:
    """A checkpoint's offsets, if they are ``topic_id``'s (``Checkpoint.belongs_to``)."""
    recorded = props.get(checkpoint.TOPIC_ID)
    if recorded and topic_id and recorded != topic_id:
        return {}
    return {
        str(p): o for p, o in sorted(checkpoint.decode_offsets(props[checkpoint.OFFSETS]).items())
    }


def _same_login(admin_url: str, user_info: str | None) -> AdminClient:
    """A client of the admin API logged in as the caller's was (no second connection lookup)."""
    return AdminClient(admin_url, TIMEOUT_S, user_info)


@functools.lru_cache(maxsize=4096)
def _settled_end_offsets(
    admin_url: str, user_info: str | None, topic: str, at_ms: int
) -> tuple[tuple[int, int, int], ...]:
    return _end_offsets(_same_login(admin_url, user_info), topic, at_ms)


def _end_offsets(client: AdminClient, topic: str, at_ms: int) -> tuple[tuple[int, int, int], ...]:
    """(partition, log start, end offset) of the records appended before ``at_ms``."""
    plan = client.plan(topic, at_ms)
    return tuple((p.partition, p.log_start_offset, p.end_offset) for p in plan.partitions)


@functools.lru_cache(maxsize=16384)
def _settled_append_ms(
    admin_url: str, user_info: str | None, topic: str, partition: int, offset: int
) -> int | None:
    return _append_ms(_same_login(admin_url, user_info), topic, partition, offset)


def _append_ms(client: AdminClient, topic: str, partition: int, offset: int) -> int | None:
    """Append time of the batch holding ``offset``, from the segment index (None: not flushed yet)."""
    ranges = client.ranges(topic, partition, offset, offset + 1).ranges
    return ranges[0].max_append_ms if ranges else None


def lag_at(
    client: BrokerClient, topic: str, committed: dict[str, int], at_ms: int, now_ms: int
) -> LagPoint:
    """The table's lag at ``at_ms`` had it then held ``committed`` (partition -> next offset)."""
    settled = at_ms < now_ms - SETTLED_MS
    ends = (
        _settled_end_offsets(client.admin_url, client.user_info, topic, at_ms)
        if settled
        else _end_offsets(client, topic, at_ms)
    )

    def append_ms(partition: int) -> Callable[[int], int | None]:
        def at(offset: int) -> int | None:
            if settled:
                found = _settled_append_ms(
                    client.admin_url, client.user_info, topic, partition, offset
                )
                if found is None:  # not flushed when asked: ask again next time
                    _settled_append_ms.cache_clear()
                return found
            return _append_ms(client, topic, partition, offset)

        return at

    measured = contracts.Lag.of(
        [
            contracts.PartitionLag.of(p, log_start, end, committed.get(str(p)), append_ms(p))
            for p, log_start, end in ends
        ],
        at_ms,
    )
    return LagPoint(at_ms=at_ms, records=measured.records, seconds=measured.seconds)


def table_history(
    client: BrokerClient,
    catalog: Any,
    entry: manifest.TableTopic,
    now_ms: int,
    window_ms: int = WINDOW_MS,
) -> TableHistory:
    """The commits of the last ``window_ms`` and the lag just before and after each, and now."""
    since_ms = now_ms - window_ms
    loaded = tables._load(catalog, entry.namespace, entry.table)
    found = commits(loaded.metadata, entry.topic_id, since_ms) if loaded is not None else []
    points: list[LagPoint] = []
    for commit in found[-MAX_COMMITS:]:
        try:
            points.append(
                lag_at(client, entry.topic, commit.offsets_before, commit.timestamp_ms, now_ms)
            )
            points.append(
                lag_at(client, entry.topic, commit.offsets_after, commit.timestamp_ms + 1, now_ms)
            )
        except BrokerError:
            continue  # a time the broker no longer retains: no point there
    current = checkpoint.read_checkpoint(loaded.metadata) if loaded is not None else None
    now = lag.measure_checkpoint(
        client, entry.topic, entry.topic_id, current or checkpoint.NO_CHECKPOINT, now_ms
    )
    points.append(LagPoint(at_ms=now_ms, records=now.records, seconds=now.seconds))
    return TableHistory(
        topic=entry.topic,
        namespace=entry.namespace,
        table=entry.table,
        window_ms=window_ms,
        commits=found,
        lag=points,
    )


class Unavailable(BaseModel):
    """A table topic whose history could not be read (broker or catalog error)."""

    topic: str
    error: str


def all_histories(
    topics: set[str] | None = None, admin_url: str | None = None, now_ms: int | None = None
) -> dict[str, TableHistory | Unavailable]:
    """The history of every table topic (of ``topics`` when given), by topic; a broker or catalog
    error is that table's answer, not the page's."""
    client = BrokerClient(admin_url or manifest.admin_url())
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    try:
        entries = [manifest.TableTopic.from_json(t) for t in client.table_topics().table_topics]
        catalog = tables.open_catalog(client.cluster().tables_catalog)
    except BrokerError as exc:
        return {t: Unavailable(topic=t, error=str(exc)) for t in topics or ()}
    out: dict[str, TableHistory | Unavailable] = {}
    for entry in entries:
        if topics is not None and entry.topic not in topics:
            continue
        try:
            out[entry.topic] = table_history(client, catalog, entry, now_ms)
        except Exception as exc:  # noqa: BLE001 -- one table's error must not take the page down
            out[entry.topic] = Unavailable(topic=entry.topic, error=f"{type(exc).__name__}: {exc}")
    return out
