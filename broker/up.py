"""``icefall up``: the whole system on the embedded defaults.

Starts the broker in its own process group, creates the demo table topic
``clicks`` and runs a demo producer until Ctrl-C, then stops every process it
started. (Airflow joins this command with the coordinator work.)
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from broker.config import BrokerConfig

DEMO_TOPIC = "clicks"


def _wait_ready(ready: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            raise SystemExit(f"icefall: the broker exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit("icefall: the broker did not start within 60 s")
        time.sleep(0.1)


def _ensure_demo_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if DEMO_TOPIC in admin.list_topics(timeout=10).topics:
        return
    config = {"automq.table.topic.enable": "true", "automq.table.topic.commit.interval.ms": "60000"}
    for future in admin.create_topics([NewTopic(DEMO_TOPIC, 3, 1, config=config)]).values():
        future.result(10)


DEMO_SCHEMA = json.dumps({
    "type": "record", "name": "Click", "namespace": "icefall.demo",
    "fields": [
        {"name": "user_id", "type": "long"},
        {"name": "page", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
})


def _demo_serializer(registry_url: str) -> Callable[[dict[str, object]], bytes]:
    """Confluent's Avro serializer against the built-in registry (it registers
    ``clicks-value`` on first use), so the demo passes the data quality gate."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(SchemaRegistryClient({"url": registry_url}), DEMO_SCHEMA)
    context = SerializationContext(DEMO_TOPIC, MessageField.VALUE)

    def serialize(event: dict[str, object]) -> bytes:
        data = serializer(event, context)
        assert data is not None
        return data

    return serialize


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


def run_up(config: BrokerConfig, demo_rate: float) -> int:
    from confluent_kafka import Producer

    home = config.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    ready = home / "broker.ready"
    ready.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "broker.cli", "broker", "--home", str(home), "--host", config.host,
           "--kafka-port", str(config.kafka_port), "--admin-port", str(config.admin_port),
           "--registry-port", str(config.registry_port), "--catalog-port", str(config.catalog_port),
           "--ready-file", str(ready)]
    if config.object_store is not None:
        cmd += ["--object-store", config.object_store.url]
    if config.catalog_uri is not None:
        cmd += ["--catalog-uri", config.catalog_uri]
    if config.warehouse is not None:
        cmd += ["--warehouse", config.warehouse]
    proc = subprocess.Popen(cmd, start_new_session=True)
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        _wait_ready(ready, proc)
        bootstrap = f"{config.advertised}:{config.kafka_port}"
        _ensure_demo_topic(bootstrap)
        print(
            f"\nIcefall is up.\n"
            f"  Kafka bootstrap:  {bootstrap}\n"
            f"  Admin API:        {config.admin_url}/v1/table-topics\n"
            f"  Schema registry:  http://{config.advertised}:{config.registry_port}/subjects\n"
            f"  Iceberg catalog:  {config.catalog_url} (REST; warehouse {config.catalog_warehouse})\n"
            f"  Home:             {home}\n"
            f"  Demo producer:    {demo_rate:g} records/s to topic '{DEMO_TOPIC}'\n"
            f"  Try:              kcat -b {bootstrap} -C -t {DEMO_TOPIC} -o -5 -e\n"
            f"Press Ctrl-C to stop everything.\n",
            flush=True,
        )
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 50})
        serialize = _demo_serializer(f"http://{config.advertised}:{config.registry_port}")
        pages = ["/", "/pricing", "/docs", "/blog", "/signup"]
        sent = 0
        next_at = time.monotonic()
        while not stopping:
            if proc.poll() is not None:
                print(f"icefall: the broker exited with code {proc.returncode}", file=sys.stderr)
                return 1
            user = random.randrange(1000)
            event = {"user_id": user, "page": random.choice(pages), "ts": int(time.time() * 1000)}
            producer.produce(DEMO_TOPIC, key=str(user).encode(), value=serialize(event))
            producer.poll(0)
            sent += 1
            next_at += 1 / demo_rate
            time.sleep(max(0.0, next_at - time.monotonic()))
        producer.flush(10)
        print(f"\nstopping (demo producer sent {sent} records)...", flush=True)
        return 0
    finally:
        _stop(proc)
        ready.unlink(missing_ok=True)
