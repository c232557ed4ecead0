"""The broker-level configs that ``kafka-configs --entity-type brokers --alter`` may change at
run time (Kafka's dynamic broker configs), stored in the metadata database.

Icefall keeps one copy of each partition, so Kafka's replication throttles have nothing to
throttle; they are still accepted, stored and described, because Kafka's own tools set and
clear them (``kafka-reassign-partitions --verify`` deletes the throttle rates on every broker
and fails if the broker refuses). Every other key is refused naming it: a setting that would
silently do nothing is worse than an error. Static settings (``listeners``, ``log.dirs``, ...)
come from the broker's configuration and are described read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.topic_configs import InvalidConfigError

LONG_MAX = 2**63 - 1


@dataclass(frozen=True)
class DynamicKey:
    name: str
    default: str
    doc: str

    def validate(self, value: str) -> str:
        try:
            number = int(value.strip())
        except ValueError:
            raise InvalidConfigError(
                f"Invalid value {value!r} for configuration {self.name}: expected a long"
            ) from None
        if number < 0:
            raise InvalidConfigError(
                f"Invalid value {value!r} for configuration {self.name}: must be at least 0"
            )
        return str(number)


KEYS: dict[str, DynamicKey] = {
    k.name: k
    for k in (
        DynamicKey(
            "leader.replication.throttled.rate",
            str(LONG_MAX),
            "replication throttle (no effect: one replica per partition)",
        ),
        DynamicKey(
            "follower.replication.throttled.rate",
            str(LONG_MAX),
            "replication throttle (no effect: one replica per partition)",
        ),
        DynamicKey(
            "replica.alter.log.dirs.io.max.bytes.per.second",
            str(LONG_MAX),
            "log-dir move throttle (no effect: one log dir)",
        ),
    )
}


def validate_all(configs: Mapping[str, str | None]) -> dict[str, str]:
    """The normalized dynamic broker configs; an unknown or read-only key, or a bad value, is
    an ``InvalidConfigError`` naming it."""
    out: dict[str, str] = {}
    for name, value in configs.items():
        key = KEYS.get(name)
        if key is None:
            raise InvalidConfigError(
                f"Cannot update broker config {name}: it is not a dynamic broker config of "
                f"Icefall (dynamic: {', '.join(sorted(KEYS))}; set the others in "
                "server.properties)"
            )
        if value is not None:
            out[name] = key.validate(value)
    return out
