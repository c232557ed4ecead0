"""Counts of logins and TLS handshakes per listener (and SASL mechanism), shown on
``/metrics`` (broker/metrics.py): failed logins are what an operator alerts on."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class AuthStats:
    successes: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: Counter[tuple[str, str]] = field(default_factory=Counter)
    reauthentications: Counter[tuple[str, str]] = field(default_factory=Counter)
    tls_failures: Counter[str] = field(default_factory=Counter)
    expired_sessions: Counter[str] = field(default_factory=Counter)

    def success(self, listener: str, mechanism: str, reauth: bool = False) -> None:
        self.successes[(listener, mechanism)] += 1
        if reauth:
            self.reauthentications[(listener, mechanism)] += 1

    def failure(self, listener: str, mechanism: str) -> None:
        self.failures[(listener, mechanism)] += 1
