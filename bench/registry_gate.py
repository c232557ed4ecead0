"""Schema registry lookups by id, and the produce-time data quality gate's cost.

1. Lookups: GET /schemas/ids/{id} per second on one keep-alive connection,
   against GET / of the same server (the HTTP floor) in the same run.
2. Gate: acks=all produce of the same pre-serialized Avro records (Confluent
   wire format, ~500 B, 16 fields) into two table topics, one with
   `automq.table.topic.schema.validation=true`, one with it off.

    .venv/bin/python bench/registry_gate.py [--records 300000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import struct
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import BrokerProcess

SCHEMA = {
    "type": "record",
    "name": "Click",
    "namespace": "bench",
    "fields": [{"name": f"s{i}", "type": "string"} for i in range(8)]
    + [{"name": f"l{i}", "type": "long"} for i in range(6)]
    + [{"name": "d0", "type": "double"}, {"name": "b0", "type": "boolean"}],
}


def requests_per_second(url: str, seconds: float) -> float:
    import http.client
    from urllib.parse import urlparse

    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    count = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        conn.request("GET", parsed.path)
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status
        count += 1
    conn.close()
    return count / (time.perf_counter() - start)


def register(registry_url: str) -> int:
    body = json.dumps({"schema": json.dumps(SCHEMA)}).encode()
    req = urllib.request.Request(
        f"{registry_url}/subjects/clicks-value/versions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        schema_id: int = json.loads(resp.read())["id"]
        return schema_id


def encoded_records(schema_id: int, count: int) -> list[bytes]:
    from fastavro import parse_schema, schemaless_writer

    parsed = parse_schema(SCHEMA)
    out = []
    for i in range(count):
        buf = io.BytesIO()
        buf.write(b"\x00" + struct.pack(">I", schema_id))
        record = {f"s{j}": f"value-{i}-{j}-" + "x" * 40 for j in range(8)}
        record |= {f"l{j}": i * j for j in range(6)} | {"d0": i / 3, "b0": i % 2 == 0}
        schemaless_writer(buf, parsed, record)
        out.append(buf.getvalue())
    return out


def produce_mib_s(bootstrap: str, topic: str, values: list[bytes]) -> float:
    from confluent_kafka import Producer

    failures: list[object] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1024 * 1024,
            "queue.buffering.max.kbytes": 1024 * 1024,
            "queue.buffering.max.messages": 10_000_000,
            "on_delivery": lambda err, msg: err and failures.append(err),
        }
    )
    start = time.perf_counter()
    for i, value in enumerate(values):
        producer.produce(topic, value)
        if i % 10000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0
    elapsed = time.perf_counter() - start
    assert not failures, failures[:3]
    return sum(map(len, values)) / 1024 / 1024 / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    from confluent_kafka.admin import AdminClient, NewTopic

    with tempfile.TemporaryDirectory(prefix="icefall-bench-") as tmp:
        broker = BrokerProcess(Path(tmp) / "home").start()
        try:
            schema_id = register(broker.registry_url)
            floor = requests_per_second(broker.registry_url + "/", args.seconds)
            lookups = requests_per_second(
                f"{broker.registry_url}/schemas/ids/{schema_id}", args.seconds
            )
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            table = {"automq.table.topic.enable": "true"}
            topics = [
                NewTopic(
                    "gate-on",
                    4,
                    1,
                    config={**table, "automq.table.topic.schema.validation": "true"},
                ),
                NewTopic(
                    "gate-off",
                    4,
                    1,
                    config={**table, "automq.table.topic.schema.validation": "false"},
                ),
            ]
            for f in admin.create_topics(topics).values():
                f.result(10)
            values = encoded_records(schema_id, args.records)
            results = {}
            for topic in ("gate-off", "gate-on", "gate-off", "gate-on"):  # interleaved, best of two
                results[topic] = max(
                    results.get(topic, 0.0), produce_mib_s(broker.bootstrap, topic, values)
                )
        except BaseException:
            print(broker.log_text()[-4000:], file=sys.stderr)
            raise
        finally:
            broker.stop(60)
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{platform.node()} {os.cpu_count()} cores",
                "lookups_per_s": round(lookups),
                "http_floor_per_s": round(floor),
                "lookups_vs_floor": round(lookups / floor, 2),
                "records": args.records,
                "record_bytes": len(values[0]),
                "produce_gate_off_mib_s": round(results["gate-off"], 1),
                "produce_gate_on_mib_s": round(results["gate-on"], 1),
                "gate_on_vs_off": round(results["gate-on"] / results["gate-off"], 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
