"""What ``icefall up`` reads from its environment besides the broker's settings, checked
before it starts anything.

These variables used to be read where each was needed, with ``int()``: an
``ICEFALL_AIRFLOW_PORT=abc`` ended ``icefall up`` in a traceback after the broker had started,
and that broker (a process group of its own) ran on with nobody to stop it. Now a bad value
is refused up front, naming the variable, and nothing is started (``broker.cli``: exit 2).

The broker's own settings are ``BrokerConfig`` (``broker.config``, ``ICEFALL_*`` too); these
are the run's: which processes ``icefall up`` starts besides the broker, on which ports.
"""

from __future__ import annotations

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from broker import topic_configs
from broker.config import ConfigError, Port
from broker.env_values import TASK_NUMBERS, EnvValueError

ENV_PREFIX = "ICEFALL_"


class UpSettings(BaseSettings):
    """``ICEFALL_<FIELD>`` for each field (``ICEFALL_NO_AIRFLOW=1``, ``ICEFALL_AIRFLOW_PORT=8081``…);
    an empty variable counts as unset."""

    model_config = SettingsConfigDict(
        frozen=True, env_prefix=ENV_PREFIX, extra="ignore", env_ignore_empty=True
    )

    no_airflow: bool = Field(default=False, description="run without Airflow")
    airflow_port: Port = Field(default=8080, description="the Airflow UI and API port")
    demo_commit_interval_ms: int = Field(
        default=60_000, description="the demo topic's commit interval (1000 to 900000)"
    )
    no_warm_driver: bool = Field(
        default=False,
        description="no warm round driver: each commit round runs as a Python process, "
        "spark-submitted when it needs Spark",
    )
    warm_driver_port: Port = Field(
        default=0, description="the warm round driver's loopback port (0: a free one)"
    )
    warm_driver_master: str = Field(
        default="local[*]", min_length=1, description="the warm round driver's Spark master"
    )

    @field_validator("demo_commit_interval_ms")
    @classmethod
    def _a_commit_interval(cls, value: int) -> int:
        """The bounds of the topic setting it becomes (``topic_configs``), checked here rather
        than when the demo topic is created, after the broker has started."""
        try:
            topic_configs.validate(topic_configs.COMMIT_INTERVAL_MS, str(value))
        except topic_configs.InvalidConfigError as exc:
            raise ValueError(str(exc)) from None
        return value


def load_up_settings() -> UpSettings:
    """The run's settings from the environment; ConfigError naming each bad variable, the
    commit tasks' own (``broker.env_values.TASK_NUMBERS``: Airflow hands them this environment)
    included, so that a bad one stops the run before it starts, not every round after."""
    lines = []
    settings = None
    try:
        settings = UpSettings()
    except ValidationError as exc:
        lines = [
            f"{ENV_PREFIX}{str(error['loc'][0]).upper()}: {error['msg']} "
            f"(got {error.get('input')!r})"
            for error in exc.errors()
        ]
    for number in TASK_NUMBERS:
        try:
            number.read()
        except EnvValueError as exc:
            lines.append(str(exc))
    if lines or settings is None:
        raise ConfigError("bad environment:\n  " + "\n  ".join(lines))
    return settings
