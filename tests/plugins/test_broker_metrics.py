"""The broker's Prometheus endpoint shows the log and the same lag as the status view."""

from __future__ import annotations

import re
import time
import urllib.request

from confluent_kafka import Producer

from tests.plugins.test_status_view import make_table_topic
from tests.support import BrokerProcess, wait_for

SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? (-?[0-9.e+]+)$")


def scrape(broker: BrokerProcess) -> dict[str, float]:
    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_]+ ", line), line
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample: {line!r}"
        samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def test_metrics_show_partitions_and_table_lag(broker: BrokerProcess) -> None:
    make_table_topic(broker, "page-views", 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(30):
        producer.produce("page-views", value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(10) == 0
    produced_s = time.time()
    broker.admin("/v1/flush", method="POST")
    wait_for(lambda: time.time() > produced_s + 0.3, 5, what="300 ms to pass")

    samples = scrape(broker)
    table = '{topic="page-views",namespace="default",table="page_views"}'
    assert samples['icefall_partition_high_watermark{topic="page-views",partition="0"}'] == 15
    assert samples['icefall_partition_flushed_offset{topic="page-views",partition="1"}'] == 15
    assert samples["icefall_segments_written_total"] >= 1
    assert samples[f"icefall_table_catalog_up{table}"] == 1
    assert samples[f"icefall_table_lag_records{table}"] == 30
    assert (
        samples[f"icefall_table_lag_bytes{table}"]
        == broker.admin("/v1/topics/page-views/pending")["bytes"]
        > 30 * 2
    )
    assert 0.3 <= samples[f"icefall_table_lag_seconds{table}"] < 60
    assert f"icefall_table_rows{table}" not in samples  # no table before the first commit
