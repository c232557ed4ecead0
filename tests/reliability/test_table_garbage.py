"""Garbage values in a table topic are refused by the data quality gate or
land in the DLQ table, never lost: after a commit round, the table's rows plus
the DLQ's rows are exactly the records the broker acknowledged, each once."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from typing import Any

import pytest

from spark_jobs.broker_client import http_json
from tests.reliability.rounds import Recorder, avro_body, garbage_value, table_and_dlq
from tests.spark_jobs.conftest import round_broker, spark  # noqa: F401 - fixtures
from tests.spark_jobs.round_support import CLICK_V1, new_topic, run_round
from tests.spark_jobs.test_commit_round import clicks
from tests.support import BrokerProcess

GATE_OFF = {"automq.table.topic.schema.validation": "false"}
SEED = int(os.environ.get("ICEFALL_RELIABILITY_SEED") or random.randrange(1 << 30))


def _schema_id(broker: BrokerProcess, topic: str) -> int:
    got = http_json(
        f"{broker.registry_url}/subjects/{topic}-value/versions",
        "POST",
        {"schema": json.dumps(CLICK_V1)},
    )
    return int(got["id"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("gate", ["on", "off"])
def test_garbage_is_refused_or_in_the_dlq_never_lost(
    gate: str,
    spark: Any,  # noqa: F811
    round_broker: BrokerProcess,  # noqa: F811
) -> None:
    rng = random.Random(SEED)
    topic = new_topic(round_broker, partitions=2, configs=GATE_OFF if gate == "off" else {})
    schema_id = _schema_id(round_broker, topic)
    recorder = Recorder(round_broker, topic)
    kinds: Counter[str] = Counter()
    for n in range(200):
        if rng.random() < 0.5:
            value: bytes | None = (
                b"\x00" + schema_id.to_bytes(4, "big") + avro_body(clicks(n, 1)[0])
            )
        else:
            kind, value = garbage_value(rng, schema_id, n)
            kinds[kind] += 1
        # one record per request: the gate refuses whole batches, so keep them apart
        recorder.send([value], partition=n % 2)
    result = run_round(spark, round_broker, topic)
    assert result.status == "committed", result.message
    rows, dlq = table_and_dlq(round_broker, topic)
    summary = {
        "seed": SEED,
        "gate": gate,
        "acked": len(recorder.acked),
        "refused": len(recorder.refused),
        "rows": len(rows),
        "dlq": len(dlq),
        "kinds": dict(kinds),
    }
    print(summary)
    assert len(recorder.acked) + len(recorder.refused) == 200, summary
    assert sorted(rows + dlq) == sorted(recorder.acked), (
        f"table + DLQ != acknowledged records: {summary}"
    )
    assert not set(rows) & set(dlq), summary
    assert (result.rows, result.dlq_rows) == (len(rows), len(dlq))
    if gate == "on":
        assert recorder.refused and set(recorder.refused) == {"INVALID_RECORD"}, Counter(
            recorder.refused
        )
    else:
        assert (
            not recorder.refused
            and len(dlq) >= kinds["random"] + kinds["wrong-magic"] + kinds["unknown-id"]
        )
