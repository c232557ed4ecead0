"""Schemathesis against the schema registry the broker serves, from an OpenAPI
document of Confluent's Schema Registry API written for these tests
(schema-registry-openapi.yaml beside this file): whatever it generates, valid or
not, the registry answers without a 5xx, and a real client still works after."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from tests.support import BrokerProcess

SPEC = Path(__file__).with_name("schema-registry-openapi.yaml")
ORDER = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}


@pytest.mark.timeout(420)
def test_schemathesis_finds_no_server_errors(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory(["--segment-flush-ms", "200"])
    client = SchemaRegistryClient({"url": broker.registry_url})
    seeded = client.register_schema("orders-value", Schema(json.dumps(ORDER), "AVRO"))
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        str(SPEC),
        "--url",
        broker.registry_url,
        "--checks",
        "not_a_server_error",
        "--max-examples",
        "8",
        "--seed",
        "20261124",
        "--no-shrink",
        "--workers",
        "1",  # schemathesis' threads trip a CPython 3.11 ast bug
        "--request-timeout",
        "30",
        "--output-truncate",
        "false",
    ]
    result = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=400, check=False
    )
    assert result.returncode == 0, result.stdout[-15000:] + result.stderr[-3000:]
    assert "Tested: " in result.stdout and " passed" in result.stdout, result.stdout[-3000:]
    print(result.stdout[-1200:])
    # The run may have deleted subjects and switched the mode (all legal calls). Back to
    # READWRITE, the registry still serves a real client: register, then read back by id.
    put = urllib.request.Request(
        broker.registry_url + "/mode?force=true",
        method="PUT",
        data=b'{"mode": "READWRITE"}',
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(put, timeout=10) as resp:
        assert resp.status == 200
    after = SchemaRegistryClient({"url": broker.registry_url})
    schema_id = after.register_schema("after-fuzz-value", Schema(json.dumps(ORDER), "AVRO"))
    schema_str = after.get_schema(schema_id).schema_str
    assert schema_str is not None and json.loads(schema_str) == ORDER
    assert schema_id >= seeded, "an id was reused"
