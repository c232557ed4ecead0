"""Kafka's listener settings, parsed and checked once: ``listeners``,
``advertised.listeners`` and ``listener.security.protocol.map``.

A listener is ``NAME://host:port``; its name maps to one of the four security
protocols (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) through the protocol map,
whose default maps each of those names to itself; a map that is given replaces
the default, as in Kafka. Unset ``listeners`` means the single plaintext
listener on ``host``/``kafka_port`` the broker always had, so nothing changes
for a configuration that never mentions them.

Settings may be given per listener with Kafka's prefix
``listener.name.<name in lower case>.<key>`` (``ssl.*``, ``sasl.enabled.mechanisms``,
``connections.max.reauth.ms``, ``<mechanism>.sasl.jaas.config``); a prefixed
key wins over the plain one for that listener only.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in PROTOCOLS)
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# Keys that may carry the listener prefix (besides <mechanism>.sasl.jaas.config).
PER_LISTENER_KEYS = frozenset(
    {
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.keystore.certificate.chain",
        "ssl.keystore.key",
        "ssl.key.password",
        "ssl.truststore.type",
        "ssl.truststore.location",
        "ssl.truststore.certificates",
        "ssl.client.auth",
        "sasl.enabled.mechanisms",
        "connections.max.reauth.ms",
    }
)
_LISTENER = re.compile(r"^([A-Za-z0-9_\-.]+)://\[?([0-9A-Za-z\-%._:]*?)\]?:(-?[0-9]+)$")


class ListenerError(ValueError):
    """A listener setting that cannot be used; the message starts with the key."""


@dataclass(frozen=True)
class Listener:
    """One endpoint the broker listens on, and what it tells clients to connect to."""

    name: str
    protocol: str
    host: str  # "" binds every interface
    port: int
    advertised_host: str
    advertised_port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def prefix(self) -> str:
        """Kafka's per-listener key prefix (the name in lower case)."""
        return f"listener.name.{self.name.lower()}."

    def __str__(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"


def _endpoints(key: str, value: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        match = _LISTENER.match(item)
        if match is None:
            raise ListenerError(
                f"{key}: {item!r} is not NAME://host:port (e.g. SASL_SSL://0.0.0.0:9093)"
            )
        name, host, port = match.group(1).upper(), match.group(2), int(match.group(3))
        if not 0 <= port <= 65535:
            raise ListenerError(f"{key}: port {port} of {item!r} is not in 0..65535")
        if any(name == seen for seen, _, _ in out):
            raise ListenerError(f"{key}: listener name {name} appears twice")
        out.append((name, host, port))
    if not out:
        raise ListenerError(f"{key}: no listener in {value!r}")
    return out


def protocol_map(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name:
            raise ListenerError(
                f"listener.security.protocol.map: {item!r} is not NAME:PROTOCOL (e.g. EXTERNAL:SASL_SSL)"
            )
        if protocol not in PROTOCOLS:
            raise ListenerError(
                f"listener.security.protocol.map: unknown security protocol {protocol!r} for "
                f"{name}; one of {', '.join(PROTOCOLS)}"
            )
        out[name] = protocol
    return out


def parse_listeners(
    listeners: str | None,
    advertised: str | None,
    security_map: str,
    host: str,
    port: int,
    advertised_host: str | None,
) -> list[Listener]:
    """The listeners of a configuration, or ``ListenerError`` naming the key at fault."""
    if listeners is None:
        if advertised is not None:
            raise ListenerError("advertised.listeners: needs listeners to be set too")
        return [Listener("PLAINTEXT", "PLAINTEXT", host, port, advertised_host or host, port)]
    mapping = protocol_map(security_map)
    bound = _endpoints("listeners", listeners)
    ports: dict[int, str] = {}
    for name, _, listen_port in bound:
        if name not in mapping:
            raise ListenerError(
                f"listeners: listener name {name} is not in listener.security.protocol.map "
                f"({', '.join(f'{k}:{v}' for k, v in mapping.items())}); "
                f"add {name}:<protocol>, the protocol one of {', '.join(PROTOCOLS)}"
            )
        if listen_port in ports and listen_port != 0:
            raise ListenerError(
                f"listeners: {name} and {ports[listen_port]} both use port {listen_port}; "
                "each listener needs its own port"
            )
        ports[listen_port] = name
    told: dict[str, tuple[str, int]] = {}
    if advertised is not None:
        for name, adv_host, adv_port in _endpoints("advertised.listeners", advertised):
            if name not in {n for n, _, _ in bound}:
                raise ListenerError(
                    f"advertised.listeners: {name} is not one of the listeners "
                    f"({', '.join(n for n, _, _ in bound)})"
                )
            if adv_host in ("0.0.0.0", "::", "") or adv_port == 0:
                raise ListenerError(
                    f"advertised.listeners: {name} must name a host and port clients can reach, "
                    f"not {adv_host or '(empty)'}:{adv_port}"
                )
            told[name] = (adv_host, adv_port)
    out = []
    for name, listen_host, listen_port in bound:
        if name in told:
            adv_host, adv_port = told[name]
        else:
            wildcard = listen_host in ("", "0.0.0.0", "::")
            adv_host = (advertised_host or socket.getfqdn()) if wildcard else listen_host
            adv_port = listen_port
        out.append(Listener(name, mapping[name], listen_host, listen_port, adv_host, adv_port))
    return out


def check_per_listener(keys: Mapping[str, str], listeners: list[Listener]) -> None:
    """Each ``listener.name.<name>.<key>`` names a listener and a key that may be prefixed."""
    names = {listener.name.lower(): listener for listener in listeners}
    for full in keys:
        rest = full.removeprefix("listener.name.")
        name, _, key = rest.partition(".")
        if name not in names:
            raise ListenerError(
                f"{full}: no listener named {name.upper()} (listeners: "
                f"{', '.join(listener.name for listener in listeners)})"
            )
        mechanism, _, jaas = key.partition(".")
        if jaas == "sasl.jaas.config":
            if mechanism.upper() not in MECHANISMS:
                raise ListenerError(
                    f"{full}: unknown SASL mechanism {mechanism!r}; one of {', '.join(m.lower() for m in MECHANISMS)}"
                )
            continue
        if key not in PER_LISTENER_KEYS:
            raise ListenerError(
                f"{full}: {key!r} cannot be set per listener; known: "
                f"{', '.join(sorted(PER_LISTENER_KEYS))}, <mechanism>.sasl.jaas.config"
            )
