"""Where a table keeps the Kafka offsets it has committed: the exactly-once checkpoint.

A commit round writes, in the snapshot summary of the snapshot it adds:

- ``icefall.offsets``: JSON ``{"<partition>": next offset}`` for every
  partition of the topic (the end of the committed range, exclusive), i.e.
  where the next round starts;
- ``icefall.round-id``, ``icefall.topic``, ``icefall.topic-id``.

and moves the tag ``icefall-checkpoint`` to that snapshot in the same atomic
catalog commit. The offsets live in the snapshot summary (DESIGN: no second
store that could disagree with the table); other writers (compaction,
``rewrite_manifests``) add snapshots without them, so readers walk back along
``main`` to the newest snapshot that has them. The tag protects that snapshot
from ``expire_snapshots`` (tags are never expired by age), so when expiry has
cut ``main``'s ancestry short the tag still answers.

The broker (segment retention), the commit round and the DAGs all read the
checkpoint through this module. It needs only table metadata (pyiceberg's
``TableMetadata``), so the broker can call it on its own catalog without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

OFFSETS = "icefall.offsets"
ROUND_ID = "icefall.round-id"
TOPIC = "icefall.topic"
TOPIC_ID = "icefall.topic-id"
CHECKPOINT_TAG = "icefall-checkpoint"
ROUND_BRANCH_PREFIX = "icefall-round-"
MAIN = "main"
# A DLQ reprocess's snapshots: how many DLQ records decode now, and (on the DLQ's deletion) which
# offsets of which topic left the DLQ, so the deletion can be made again after a crash.
REPROCESSED = "icefall.dlq-reprocessed"
DLQ_MOVED = "icefall.dlq-moved"


@dataclass(frozen=True)
class Checkpoint:
    """The offsets a table holds, and the snapshot that recorded them."""

    offsets: dict[int, int]
    snapshot_id: int | None
    round_id: str | None = None
    topic_id: str | None = None
    timestamp_ms: int | None = None

    @property
    def empty(self) -> bool:
        return self.snapshot_id is None

    def belongs_to(self, topic_id: str) -> bool:
        """Whether these offsets are the topic ``topic_id``'s: a topic deleted and created again
        under the same name is another topic, whose table starts with nothing committed. Offsets
        recorded without an id (and a caller that knows none, an old manifest) are taken as the topic's."""
        return self.topic_id is None or not topic_id or self.topic_id == topic_id

    def offsets_for(self, topic_id: str) -> dict[int, int]:
        """The committed offsets if they belong to the topic ``topic_id``, else none (``belongs_to``).
        Every reader of a checkpoint applies this one rule: the round's plan, segment retention,
        the admin API's pending answer, the metrics and the status view."""
        return dict(self.offsets) if self.belongs_to(topic_id) else {}


NO_CHECKPOINT = Checkpoint({}, None)


def encode_offsets(offsets: Mapping[int, int]) -> str:
    return json.dumps({str(p): int(o) for p, o in sorted(offsets.items())}, separators=(",", ":"))


def decode_offsets(text: str) -> dict[int, int]:
    """The summary's offsets; a value that is not a JSON object of int -> int is refused, not guessed."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError(f"{OFFSETS} must be a JSON object, got {text!r}")  # noqa: TRY004 - bad data, not a bad call
    return {int(p): int(o) for p, o in raw.items()}


def summary_properties(snapshot: Any) -> dict[str, str]:
    """A pyiceberg snapshot's summary as a plain dict (operation excluded)."""
    summary = getattr(snapshot, "summary", None)
    return dict(summary.additional_properties) if summary is not None else {}


def _from_snapshot(snapshot: Any) -> Checkpoint | None:
    props = summary_properties(snapshot)
    text = props.get(OFFSETS)
    if text is None:
        return None
    return Checkpoint(
        decode_offsets(text),
        snapshot.snapshot_id,
        props.get(ROUND_ID),
        props.get(TOPIC_ID),
        snapshot.timestamp_ms,
    )


def _ancestry(metadata: Any, snapshot_id: int | None, whole: bool = False) -> Iterator[Any]:
    """The snapshots from ``snapshot_id`` back along their parents, newest first, until the
    ancestry ends or is cut short by ``expire_snapshots``. ``whole``: the caller may walk all
    of it, so look snapshots up in a dict (pyiceberg's ``snapshot_by_id`` is a linear scan)."""
    by_id = {s.snapshot_id: s for s in metadata.snapshots} if whole else None
    seen: set[int] = set()
    while snapshot_id is not None and snapshot_id not in seen:
        seen.add(snapshot_id)
        snapshot = (
            by_id.get(snapshot_id) if by_id is not None else metadata.snapshot_by_id(snapshot_id)
        )
        if snapshot is None:
            return
        yield snapshot
        snapshot_id = snapshot.parent_snapshot_id


@dataclass(frozen=True)
class CommittedRound:
    """A round's snapshot found on ``main``, and the checkpoint it started from."""

    snapshot: Any  # pyiceberg ``Snapshot``
    checkpoint: Checkpoint
    before: Checkpoint


def find_round(metadata: Any, round_id: str, branch: str = MAIN) -> CommittedRound | None:
    """The newest snapshot on ``branch``'s ancestry that a round ``round_id`` committed, if any.

    A round's task can die after its catalog commit (the process killed, the worker lost)
    and be tried again under the same round id: its plan is then empty, and this is how the
    retry learns that the commit was its own, to report it rather than ``nothing_new``
    (``spark_jobs/commit_round.py``). ``before`` is the checkpoint the round started from
    (none when the ancestry ends or was expired below it: a first round, or unknown)."""
    ref = metadata.refs.get(branch)
    ancestry = _ancestry(metadata, ref.snapshot_id if ref is not None else None, whole=True)
    for snapshot in ancestry:
        found = _from_snapshot(snapshot)
        if found is None or found.round_id != round_id:
            continue
        before = next((c for s in ancestry if (c := _from_snapshot(s)) is not None), NO_CHECKPOINT)
        return CommittedRound(snapshot, found, before)
    return None


def read_checkpoint(metadata: Any, branch: str = MAIN) -> Checkpoint:
    """The newest checkpoint on ``branch``'s ancestry, else the tag's, else none.

    ``metadata`` is a pyiceberg ``TableMetadata`` (``table.metadata``).
    """
    refs = metadata.refs
    ref = refs.get(branch)
    for snapshot in _ancestry(metadata, ref.snapshot_id if ref is not None else None):
        found = _from_snapshot(snapshot)
        if found is not None:
            return found
    tag = refs.get(CHECKPOINT_TAG)
    if tag is not None:
        snapshot = metadata.snapshot_by_id(tag.snapshot_id)
        if snapshot is not None and (found := _from_snapshot(snapshot)) is not None:
            return found
    return NO_CHECKPOINT
