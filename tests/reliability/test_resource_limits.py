"""1,000 partitions and 200 concurrent consumers on one broker: every record
read back at its offset, the broker still serves a new client, and its peak
memory stays within a generous multiple of its own baseline measured in the
same test (the figures themselves are in bench/BENCHMARKS.md)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.broker.clients import create_topic, read_partitions
from tests.reliability.resources import produce_values, run_wide
from tests.support import BrokerProcess


@pytest.mark.timeout(300)
def test_1000_partitions_and_200_connections(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(["--segment-flush-ms", "200"])
    run = run_wide(broker, partitions=1000, connections=200, per_partition=10)
    print(run.as_dict())
    assert run.broker_connections_seen >= 200, run
    assert run.peak_rss_mib <= 4 * run.baseline_rss_mib, run
    create_topic(broker.bootstrap, "after", 1)
    produce_values(broker, "after", 1, 100)
    assert len(read_partitions(broker.bootstrap, "after", 1)[0]) == 100
