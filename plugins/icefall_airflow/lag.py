"""How far a table is behind its topic: in records and in seconds of append time.

Records: per partition, the broker's high watermark minus the next offset the
table holds (its checkpoint). Seconds: how long ago the oldest record not yet
in the table was appended (to batch precision: the broker indexes append
times per record batch), 0 when the table is caught up.

The figures are ``broker.contracts.Lag``'s, computed by the same code as the
broker's ``icefall_table_lag_*`` metrics; this module only gathers the inputs
over the admin API (the broker reads its log directly).
"""

from __future__ import annotations

import functools

from broker.checkpoint import Checkpoint
from broker.contracts import Lag, PartitionLag, PartitionOffsets
from icefall_airflow.broker_client import BrokerClient, BrokerError

__all__ = ["Lag", "PartitionLag", "measure", "measure_checkpoint"]


def _oldest_append_ms(
    client: BrokerClient, topic: str, row: PartitionOffsets, start: int
) -> int | None:
    """Append time of the batch holding offset ``start``: from the segment index
    when it is flushed, else the partition's newest append (an underestimate of
    the lag, by at most the broker's flush interval)."""
    if start < row.flushed_offset:
        try:
            ranges = client.ranges(topic, row.partition, start, start + 1).ranges
        except BrokerError:
            ranges = []
        if ranges:
            return ranges[0].max_append_ms
    return row.last_append_ms


def measure(client: BrokerClient, topic: str, committed: dict[int, int], now_ms: int) -> Lag:
    """Lag of a table whose checkpoint is ``committed`` (partition -> next offset; absent = nothing yet)."""
    answer = client.offsets(topic)
    return Lag.of(
        [
            PartitionLag.of(
                row.partition,
                row.log_start_offset,
                row.high_watermark,
                committed.get(row.partition),
                functools.partial(_oldest_append_ms, client, topic, row),
            )
            for row in answer.partitions
        ],
        now_ms,
    )


def measure_checkpoint(
    client: BrokerClient, topic: str, topic_id: str, checkpoint: Checkpoint, now_ms: int
) -> Lag:
    """Lag of a table whose checkpoint is ``checkpoint``: its offsets count only if they are
    ``topic_id``'s (``Checkpoint.offsets_for``), as for the broker's metrics and retention."""
    return measure(client, topic, checkpoint.offsets_for(topic_id), now_ms)
