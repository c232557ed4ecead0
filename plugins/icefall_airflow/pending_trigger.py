"""Commits triggered by size: an event trigger that fires when enough bytes wait for a table.

A table topic with ``automq.table.topic.commit.trigger.bytes`` > 0 gets a commit
DAG scheduled on its interval *or* on the asset ``icefall/<namespace>/<table>/pending``
(``AssetOrTimeSchedule``). That asset has an ``AssetWatcher`` running this trigger
in Airflow's triggerer: every ``poll_interval_s`` it asks the broker
(``GET /v1/topics/<topic>/pending``) how many bytes the topic holds past the
table's committed offsets, and yields an event when they reach the threshold; the
scheduler then starts a round that commits what was appended up to its creation. A burst that fills the
threshold is committed within a poll and a round's start, instead of waiting out
the interval.

It never fires twice for the same bytes: after an event it counts only what
arrived past the end offsets it fired at (the broker's ``from``), while the round
it started is still committing them. Its memory of those offsets is the trigger's
own: a restarted triggerer starts from the table's committed offsets again, which
may cost one early round, never a lost or duplicated record (rounds are exactly
once whatever starts them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S = 2.0


class PendingBytesTrigger(BaseEventTrigger):
    """Yields an event each time ``threshold_bytes`` more bytes of ``topic`` wait for its table."""

    def __init__(
        self,
        topic: str,
        threshold_bytes: int,
        admin_url: str | None = None,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    ) -> None:
        super().__init__()
        if threshold_bytes <= 0:
            raise ValueError(f"threshold_bytes must be positive, got {threshold_bytes}")
        self.topic = topic
        self.threshold_bytes = threshold_bytes
        self.admin_url = admin_url
        self.poll_interval_s = poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "topic": self.topic,
                "threshold_bytes": self.threshold_bytes,
                "admin_url": self.admin_url,
                "poll_interval_s": self.poll_interval_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from icefall_airflow import manifest
        from icefall_airflow.broker_client import BrokerClient

        admin_url = self.admin_url or manifest.admin_url()
        # off the event loop: the admin API's login may be a connection lookup
        client = await asyncio.to_thread(BrokerClient, admin_url)
        fired: dict[str, int] = {}
        while True:
            try:
                answer = await asyncio.to_thread(client.pending, self.topic, fired)
                waiting, records = answer.bytes, answer.records
                ends = {str(p.partition): p.end_offset for p in answer.partitions}
            except Exception as exc:  # noqa: BLE001 -- a failed poll is retried: the watcher must outlive broker restarts
                log.warning(
                    "could not ask %s what waits for %s's table: %s", admin_url, self.topic, exc
                )
                if getattr(exc, "status", None) == 401:  # the admin API's login changed: anew
                    client = await asyncio.to_thread(BrokerClient, admin_url)
            else:
                if waiting >= self.threshold_bytes:
                    fired = ends
                    log.info(
                        "%d bytes (%d records) of %s wait for its table (threshold %d): a round starts",
                        waiting,
                        records,
                        self.topic,
                        self.threshold_bytes,
                    )
                    yield TriggerEvent(
                        {
                            "topic": self.topic,
                            "pending_bytes": waiting,
                            "pending_records": records,
                            "end_offsets": fired,
                        }
                    )
            await asyncio.sleep(self.poll_interval_s)
