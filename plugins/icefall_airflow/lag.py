"""How far a table is behind its topic: in records and in seconds of append time.

Records: per partition, the broker's high watermark minus the next offset the
table holds (its checkpoint). Seconds: how long ago the oldest record not yet
in the table was appended (to batch precision: the broker indexes append
times per record batch), 0 when the table is caught up.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from icefall_airflow.broker_client import BrokerClient, BrokerError


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    log_start_offset: int
    end_offset: int  # the broker's high watermark
    committed_offset: int  # the next offset the table would take
    lag_records: int
    oldest_uncommitted_append_ms: int | None


@dataclass(frozen=True)
class Lag:
    partitions: list[PartitionLag]
    measured_at_ms: int

    @property
    def records(self) -> int:
        return sum(p.lag_records for p in self.partitions)

    @property
    def seconds(self) -> float:
        oldest = [p.oldest_uncommitted_append_ms for p in self.partitions
                  if p.lag_records > 0 and p.oldest_uncommitted_append_ms is not None]
        return max(0.0, (self.measured_at_ms - min(oldest)) / 1000) if oldest else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "seconds": round(self.seconds, 3), "measured_at_ms": self.measured_at_ms,
                "partitions": [asdict(p) for p in self.partitions]}


def _oldest_append_ms(client: BrokerClient, topic: str, row: dict[str, Any], start: int) -> int | None:
    """Append time of the batch holding offset ``start``: from the segment index
    when it is flushed, else the partition's newest append (an underestimate of
    the lag, by at most the broker's flush interval)."""
    if start < int(row["flushed_offset"]):
        try:
            ranges = client.ranges(topic, int(row["partition"]), start, start + 1)["ranges"]
        except BrokerError:
            ranges = []
        if ranges:
            return int(ranges[0]["max_append_ms"])
    last = row.get("last_append_ms")
    return int(last) if last is not None else None


def measure(client: BrokerClient, topic: str, committed: dict[int, int], now_ms: int) -> Lag:
    """Lag of a table whose checkpoint is ``committed`` (partition -> next offset; absent = nothing yet)."""
    answer = client.offsets(topic)
    partitions = []
    for row in answer["partitions"]:
        p = int(row["partition"])
        log_start, end = int(row["log_start_offset"]), int(row["high_watermark"])
        start = max(committed.get(p, log_start), log_start)  # records before the log start are gone for good
        behind = max(end - start, 0)
        oldest = _oldest_append_ms(client, topic, row, start) if behind else None
        partitions.append(PartitionLag(p, log_start, end, committed.get(p, log_start), behind, oldest))
    return Lag(partitions, now_ms)
