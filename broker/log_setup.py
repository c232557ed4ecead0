"""Logging of Icefall's own processes: the broker, the warm round driver and the Spark jobs.

One format for all of them, and three libraries' per-call INFO lines held back to WARNING
unless the process runs at DEBUG:

- ``pyiceberg.io`` logs "Loaded FileIO: …" each time a catalog makes a table's FileIO, which
  pyiceberg does on every ``load_table`` and commit: ~23 lines a commit round on the console
  of ``icefall up`` (the broker's catalog) and ~8 in the warm driver's log, every interval,
  with nothing in them a reader can act on;
- ``httpx`` (and ``httpx2``, confluent-kafka's schema registry client) logs every HTTP request
  it makes;
- ``py4j.clientserver`` logs "Closing down clientserver connection" each time PySpark's
  gateway closes a connection: after every round in the warm driver.

Their warnings and errors still show; ``--log-level DEBUG`` shows everything.
"""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Loggers whose INFO is one line per call (see the module docstring).
PER_CALL_LOGGERS = ("pyiceberg.io", "httpx", "httpx2", "py4j.clientserver")


def level_of(name: str | int) -> int:
    """``"info"``, ``"INFO"`` or ``logging.INFO`` as the number; ValueError for an unknown name."""
    if isinstance(name, int):
        return name
    level = logging.getLevelNamesMapping().get(name.upper())
    if level is None:
        raise ValueError(f"unknown log level {name!r} (DEBUG, INFO, WARNING, ERROR, CRITICAL)")
    return level


def configure(level: str | int = logging.INFO) -> None:
    """The root logger at ``level`` with Icefall's format (as ``logging.basicConfig``: a handler
    already on the root logger is kept), and the per-call loggers at WARNING above DEBUG."""
    number = level_of(level)
    logging.basicConfig(level=number, format=FORMAT)
    for name in PER_CALL_LOGGERS:
        logging.getLogger(name).setLevel(
            logging.NOTSET if number <= logging.DEBUG else max(number, logging.WARNING)
        )
