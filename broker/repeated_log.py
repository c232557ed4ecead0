"""One log line for a run of like events, not one per event.

Some refusals come in floods: a broker that loses its partitions' leases (a stall, a lost
Postgres) refuses every produce in flight to each of them, hundreds in a second, and a client
that keeps sending a record too large is refused on every retry. One line per refusal buries
the rest of the log and costs the event loop a formatted line each. ``RepeatedLog`` logs the
first event of a key (a partition and what happened to it, say) at once, then at most one line
an ``interval_s`` for it, each naming how many like it were left out since the key's last line.
A run that stops is summed up by the key's next event, or by the sweep that the next event of
any key makes once an interval, whichever comes first (it has no timer of its own).

Python's ``logging`` has no such filter, and the rate limiters on PyPI drop what they hold
back without counting it; this is a dict and a clock."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field


@dataclass
class _Seen:
    logged_at: float
    left_out: int = 0
    # the last event left out (when, and its line), to sum the run up with if no event of the
    # key comes again
    last_at: float = 0.0
    last: tuple[str, tuple[object, ...]] = ("", ())


@dataclass
class RepeatedLog:
    """``log(key, msg, *args)`` logs as ``logger.log(level, msg, *args)`` the first event of
    ``key``, then at most one an ``interval_s``; a line after events left out says how many."""

    logger: logging.Logger
    interval_s: float = 10.0
    level: int = logging.INFO
    clock: Callable[[], float] = time.monotonic
    # calls between the code that has the event and ``log`` (a wrapper's 1): its file and line
    # go into the record, not this module's
    wrappers: int = 0
    _seen: dict[Hashable, _Seen] = field(default_factory=dict)
    _swept_at: float = field(default=float("-inf"))

    def log(self, key: Hashable, msg: str, *args: object) -> None:
        now = self.clock()
        if now - self._swept_at >= self.interval_s:
            self._sweep(now, key)
        seen = self._seen.get(key)
        if seen is not None and now - seen.logged_at < self.interval_s:
            seen.left_out += 1
            seen.last_at, seen.last = now, (msg, args)
            return
        self._log(msg, args, seen, 3)
        self._seen[key] = _Seen(now)

    def _log(self, msg: str, args: tuple[object, ...], seen: _Seen | None, depth: int) -> None:
        """The line, with the run it stands for: the events left out since the key's last line
        and the seconds they spanned from it."""
        if seen is not None and seen.left_out:
            msg += " (%d more like it in the %.0f s after the last such line)"
            args = (*args, seen.left_out, seen.last_at - seen.logged_at)
        self.logger.log(self.level, msg, *args, stacklevel=depth + self.wrappers)

    def _sweep(self, now: float, spared: Hashable) -> None:
        """Sum up the runs that ended (no line for an interval) and forget their keys; the
        key being logged is summed up by its own line."""
        self._swept_at = now
        for key, seen in list(self._seen.items()):
            if key == spared or now - seen.logged_at < self.interval_s:
                continue
            del self._seen[key]
            if seen.left_out:
                msg, args = seen.last
                before = _Seen(seen.logged_at, seen.left_out - 1, seen.last_at)
                self._log(msg, args, before, 4)
