"""The security settings of a configuration, checked as a whole at load time (so a bad one
fails at start naming its key), and read per listener: the SASL mechanisms a listener offers,
its PLAIN users (Kafka's JAAS text), its re-authentication period."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.security.listeners import MECHANISMS, Listener, ListenerError, check_per_listener

if TYPE_CHECKING:
    from broker.config import BrokerConfig

LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_JAAS_TOKEN = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|([^\s=;"]+)|(=)|(;))', re.S)


@dataclass(frozen=True)
class Jaas:
    """One login module of a ``sasl.jaas.config`` value."""

    module: str
    flag: str
    options: dict[str, str]


def parse_jaas(key: str, text: str) -> Jaas:
    """``Module flag k="v" ...;`` as Kafka reads ``sasl.jaas.config`` (exactly one module)."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _JAAS_TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            # the position only: the text around it may be a password
            raise ListenerError(f"{key}: cannot read the JAAS text at character {pos}")
        quoted, word, equals, semi = match.groups()
        if quoted is not None:
            tokens.append(("value", re.sub(r"\\(.)", r"\1", quoted)))
        elif word is not None:
            tokens.append(("word", word))
        elif equals:
            tokens.append(("=", "="))
        elif semi:
            tokens.append((";", ";"))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    shape = "LoginModule required|requisite|sufficient|optional key=value ...;"
    if len(tokens) < 3 or tokens[0][0] != "word" or tokens[1][0] != "word" or tokens[-1][0] != ";":
        raise ListenerError(f"{key}: expected {shape}")
    module, flag = tokens[0][1], tokens[1][1]
    if flag not in ("required", "requisite", "sufficient", "optional"):
        raise ListenerError(f"{key}: {flag!r} is not a JAAS control flag; expected {shape}")
    body = tokens[2:-1]
    if any(kind == ";" for kind, _ in body):
        raise ListenerError(f"{key}: must hold exactly one login module")
    options: dict[str, str] = {}
    if len(body) % 3:
        raise ListenerError(f"{key}: options must be key=value pairs; expected {shape}")
    for i in range(0, len(body), 3):
        (k_kind, k), (eq, _), (_, value) = body[i : i + 3]
        if k_kind != "word" or eq != "=":
            raise ListenerError(f"{key}: options must be key=value pairs; expected {shape}")
        options[k] = value
    return Jaas(module, flag, options)


def mechanisms(config: BrokerConfig, listener: Listener) -> list[str]:
    raw = config.listener_setting(listener, "sasl.enabled.mechanisms") or ""
    return [m.strip().upper() for m in raw.split(",") if m.strip()]


def jaas(config: BrokerConfig, listener: Listener, mechanism: str) -> Jaas | None:
    key = f"{listener.name.lower()}.{mechanism.lower()}.sasl.jaas.config"
    text = config.per_listener.get(key)
    return None if text is None else parse_jaas("listener.name." + key, text)


def plain_users(config: BrokerConfig, listener: Listener) -> dict[str, str]:
    """PLAIN's users of a listener: Kafka's ``user_<name>="<password>"`` JAAS options."""
    found = jaas(config, listener, "PLAIN")
    if found is None:
        return {}
    return {k.removeprefix("user_"): v for k, v in found.options.items() if k.startswith("user_")}


def reauth_ms(config: BrokerConfig, listener: Listener) -> int:
    return int(config.listener_setting(listener, "connections.max.reauth.ms") or 0)


def check_security(config: BrokerConfig) -> None:
    """Every listener setting readable; raises ``ValueError`` starting with the key at fault."""
    listeners = config.listener_list()
    check_per_listener({"listener.name." + k: v for k, v in config.per_listener.items()}, listeners)
    for listener in listeners:
        prefix = (
            listener.prefix
            if any(k.startswith(listener.name.lower() + ".") for k in config.per_listener)
            else ""
        )
        reauth = config.listener_setting(listener, "connections.max.reauth.ms") or "0"
        if not reauth.isdigit():
            raise ListenerError(
                f"{prefix}connections.max.reauth.ms: not a number of ms: {reauth!r}"
            )
        for key, allowed in (
            ("ssl.client.auth", ("required", "requested", "none")),
            ("ssl.keystore.type", ("PEM",)),
            ("ssl.truststore.type", ("PEM",)),
        ):
            value = config.listener_setting(listener, key)
            if value is not None and value not in allowed:
                raise ListenerError(
                    f"{prefix}{key}: {value!r} is not one of {', '.join(allowed)}"
                    + (" (Icefall reads PEM files only)" if key.endswith("type") else "")
                )
        if listener.tls:
            location = config.listener_setting(listener, "ssl.keystore.location")
            chain = config.listener_setting(listener, "ssl.keystore.certificate.chain")
            key_pem = config.listener_setting(listener, "ssl.keystore.key")
            if not location and not (chain and key_pem):
                raise ListenerError(
                    f"ssl.keystore.location: listener {listener.name} ({listener.protocol}) needs a "
                    "certificate: ssl.keystore.location (a PEM file with key and chain) or "
                    "ssl.keystore.certificate.chain with ssl.keystore.key"
                )
            if location and (chain or key_pem):
                raise ListenerError(
                    f"ssl.keystore.location: listener {listener.name} has both a keystore file and "
                    "ssl.keystore.certificate.chain/ssl.keystore.key; give one"
                )
        if listener.sasl:
            enabled = mechanisms(config, listener)
            unknown = [m for m in enabled if m not in MECHANISMS]
            if unknown or not enabled:
                raise ListenerError(
                    f"sasl.enabled.mechanisms: {', '.join(unknown) or 'none'} not supported on "
                    f"listener {listener.name}; Icefall offers {', '.join(MECHANISMS)}"
                )
            for mechanism in enabled:
                found = jaas(config, listener, mechanism)
                if found is not None and found.module != LOGIN_MODULES[mechanism]:
                    raise ListenerError(
                        f"listener.name.{listener.name.lower()}.{mechanism.lower()}.sasl.jaas.config: "
                        f"{mechanism} takes {LOGIN_MODULES[mechanism]}, not {found.module}"
                    )
