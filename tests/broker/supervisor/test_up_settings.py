"""broker.supervisor.up_settings: ``icefall up``'s own variables are read once and checked before
it starts anything; a bad one exits 2 naming it, with no broker left running (one used to run
on after the traceback of ``int('abc')``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.config import ConfigError
from broker.supervisor.up_settings import UpSettings, load_up_settings
from tests.support import free_port, icefall_cli

VARIABLES = (
    "ICEFALL_NO_AIRFLOW",
    "ICEFALL_AIRFLOW_PORT",
    "ICEFALL_DEMO_COMMIT_INTERVAL_MS",
    "ICEFALL_NO_WARM_DRIVER",
    "ICEFALL_WARM_DRIVER_PORT",
    "ICEFALL_WARM_DRIVER_MASTER",
    "ICEFALL_PLAN_DEADLINE_S",
    "ICEFALL_ROUND_IN_DRIVER_MAX_BYTES",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults_and_values(clean_env: pytest.MonkeyPatch) -> None:
    assert load_up_settings() == UpSettings(
        no_airflow=False,
        airflow_port=8080,
        demo_commit_interval_ms=60_000,
        no_warm_driver=False,
        warm_driver_port=0,
        warm_driver_master="local[*]",
    )
    for name, value in (
        ("ICEFALL_NO_AIRFLOW", "yes"),
        ("ICEFALL_AIRFLOW_PORT", "18080"),
        ("ICEFALL_DEMO_COMMIT_INTERVAL_MS", "20000"),
        ("ICEFALL_NO_WARM_DRIVER", "1"),
        ("ICEFALL_WARM_DRIVER_PORT", "17070"),
        ("ICEFALL_WARM_DRIVER_MASTER", "spark://127.0.0.1:7077"),
    ):
        clean_env.setenv(name, value)
    settings = load_up_settings()
    assert settings.no_airflow and settings.no_warm_driver
    assert (settings.airflow_port, settings.warm_driver_port) == (18080, 17070)
    assert settings.demo_commit_interval_ms == 20_000
    assert settings.warm_driver_master == "spark://127.0.0.1:7077"
    clean_env.setenv("ICEFALL_NO_AIRFLOW", "")  # empty: unset
    assert not load_up_settings().no_airflow


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("ICEFALL_AIRFLOW_PORT", "abc", "valid integer"),
        ("ICEFALL_AIRFLOW_PORT", "70000", "less than or equal to 65535"),
        ("ICEFALL_WARM_DRIVER_PORT", "-1", "greater than or equal to 0"),
        # the topic setting's own bounds (it used to fail creating the topic, the broker up)
        ("ICEFALL_DEMO_COMMIT_INTERVAL_MS", "500", "outside [1000, 900000]"),
        ("ICEFALL_DEMO_COMMIT_INTERVAL_MS", "3600000", "outside [1000, 900000]"),
        ("ICEFALL_NO_AIRFLOW", "maybe", "valid boolean"),
        ("ICEFALL_PLAN_DEADLINE_S", "-5", "expected a number > 0.0"),  # the commit tasks' own
        ("ICEFALL_ROUND_IN_DRIVER_MAX_BYTES", "1GB", "expected an integer >= 0"),
    ],
)
def test_a_bad_value_is_named(
    clean_env: pytest.MonkeyPatch, name: str, value: str, why: str
) -> None:
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        load_up_settings()
    [line] = [line for line in str(refused.value).splitlines() if name in line]
    assert why in line and repr(value) in line, line


def test_icefall_up_with_a_bad_variable_starts_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    done = icefall_cli(
        "up",
        "--home",
        str(home),
        "--kafka-port",
        str(free_port()),
        "--admin-port",
        str(free_port()),
        env={**env, "ICEFALL_AIRFLOW_PORT": "abc"},
    )
    assert done.returncode == 2, done
    assert "icefall: bad environment:\n  ICEFALL_AIRFLOW_PORT: " in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not home.exists()  # nothing was started: no broker, no WAL, no Airflow home
