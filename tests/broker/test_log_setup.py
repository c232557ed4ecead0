"""broker.log_setup: the per-call INFO lines of pyiceberg, httpx and py4j stay out of Icefall's
logs above DEBUG (a broker whose catalog loads tables logs none), Icefall's own INFO stays in,
and an unknown level is a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from broker.log_setup import PER_CALL_LOGGERS
from tests.support import REPO, BrokerProcess, icefall_cli

EMIT = """
import logging, sys
from broker import log_setup
log_setup.configure(sys.argv[1])
for name in sys.argv[2:]:
    logging.getLogger(name).info("info from %s", name)
    logging.getLogger(name).warning("warning from %s", name)
"""


def emitted(level: str, *loggers: str) -> str:
    """What a process configured at ``level`` writes when each logger logs an INFO and a WARNING."""
    done = subprocess.run(
        [sys.executable, "-c", EMIT, level, *loggers],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stderr


@pytest.mark.parametrize("level", ["INFO", "info"])
def test_per_call_loggers_keep_their_warnings_only(level: str) -> None:
    out = emitted(level, "icefall.commit_round", *PER_CALL_LOGGERS)
    assert "INFO icefall.commit_round: info from icefall.commit_round" in out, out
    for name in PER_CALL_LOGGERS:
        assert f"info from {name}" not in out, out
        assert f"WARNING {name}: warning from {name}" in out, out


def test_debug_shows_every_logger() -> None:
    out = emitted("DEBUG", *PER_CALL_LOGGERS)
    for name in PER_CALL_LOGGERS:
        assert f"INFO {name}: info from {name}" in out, out


def test_an_unknown_level_is_named() -> None:
    done = icefall_cli("broker", "--log-level", "LOUD")
    assert done.returncode == 2, done
    assert "--log-level: unknown log level 'LOUD'" in done.stderr, done.stderr


def test_a_broker_whose_catalog_loads_tables_does_not_log_each_fileio(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "home").start()
    try:
        catalog = load_catalog("t", type="rest", uri=broker.catalog_url)
        catalog.create_namespace("quiet")
        schema = Schema(NestedField(1, "id", LongType(), required=False))
        catalog.create_table("quiet.t", schema)
        for _ in range(3):
            assert catalog.load_table("quiet.t").schema() == schema
    finally:
        broker.stop()
    log = broker.log_path.read_text()
    assert "INFO broker.app: icefall broker up" in log, log[-2000:]
    assert "Loaded FileIO" not in log, log[-2000:]
