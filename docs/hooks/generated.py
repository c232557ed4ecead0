"""MkDocs hook: reference tables generated from the code at build time, so they cannot drift.

Registered under `hooks:` in mkdocs.yml. A page asks for a table with a marker line
(an HTML comment, e.g. ``<!-- generated: topic-configs -->``); the build fails when a
page listed here lacks its marker, or a marker names no generator.

- ``topic-configs``: every key of ``broker.topic_configs.KEYS`` with its default,
  type, accepted values (read from its validator) and meaning.
- ``broker-flags``: the flags of ``icefall broker`` (``broker.cli._add_broker_flags``).
- ``up-environment``: the variables ``icefall up`` reads for itself
  (``broker.supervisor.up_settings.UpSettings``).
- ``kafka-apis``: the Kafka APIs and versions the broker serves
  (``broker.kafka.handlers.SUPPORTED_VERSIONS``, names from kio).
- ``acl-operations``: the operation each Kafka API needs on its resources
  (``broker.kafka.acl_apis``' tables).
"""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Callable
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)

# DescribeConfigs' type codes (broker.topic_configs.ConfigKey.config_type).
CONFIG_TYPES = {1: "boolean", 2: "string", 3: "int", 4: "short", 5: "long", 6: "double", 7: "list"}
LONG_MAX = 2**63 - 1


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _number(value: Any) -> str:
    if value == LONG_MAX:
        return "2^63-1"
    if value == -(2**63):
        return "-2^63"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _accepted(validate: Callable[[str], str]) -> str:
    """What a validator accepts, read from the closure its factory left (best effort)."""
    name = getattr(validate, "__qualname__", "")
    try:
        nonlocals = inspect.getclosurevars(validate).nonlocals
    except (TypeError, ValueError):
        nonlocals = {}
    if name.startswith("_unset_or"):
        inner = nonlocals.get("check")
        return ("unset, or " + _accepted(inner)) if inner else "unset"
    if name == "_bool":
        return "`true`, `false`"
    if name.startswith(("_choice", "_list_of")):
        choices = ", ".join(f"`{c}`" for c in nonlocals.get("choices", ()))
        return ("a comma-separated list of " + choices) if name.startswith("_list_of") else choices
    if name.startswith("_long"):
        return f"integer in [{_number(nonlocals.get('low'))}, {_number(nonlocals.get('high'))}]"
    if name.startswith("_double"):
        return f"number in [{_number(nonlocals.get('low'))}, {_number(nonlocals.get('high'))}]"
    if name == "_partition_by":
        return "`[t1, t2, ...]` of `col`, `year|month|day|hour(col)`, `bucket(col, N)`, `truncate(col, W)`"
    if name == "_id_columns":
        return "`[col, ...]` (nested columns with dots)"
    if name == "_identifier":
        return "an identifier (letters, digits, `_`)"
    if name == "_cdc_field":
        return "a column name (nested with dots), or empty"
    return ""


def topic_configs() -> str:
    from broker import topic_configs as tc

    def table(keys: list[Any]) -> str:
        rows = ["| key | default | type | accepted values | meaning |", "|---|---|---|---|---|"]
        for key in keys:
            default = "unset" if key.default in ("", None) else _code(key.default)
            if key.default == str(LONG_MAX):
                default = "`9223372036854775807` (2^63-1)"
            rows.append(
                "| "
                + " | ".join(
                    _cell(c)
                    for c in (
                        f"`{key.name}`",
                        default,
                        CONFIG_TYPES.get(key.config_type, str(key.config_type)),
                        _accepted(key.validate),
                        key.doc,
                    )
                )
                + " |"
            )
        return "\n".join(rows)

    keys = list(tc.KEYS.values())
    table_keys = [k for k in keys if k.name.startswith(tc.TABLE_PREFIX)]
    kafka_keys = [k for k in keys if not k.name.startswith(tc.TABLE_PREFIX)]
    return (
        f"### Table topic keys (`{tc.TABLE_PREFIX}*`)\n\n{table(table_keys)}\n\n"
        f"### Kafka's topic keys\n\n{table(kafka_keys)}\n"
    )


def broker_flags() -> str:
    from broker import cli

    parser = argparse.ArgumentParser(prog="icefall broker", add_help=False)
    cli._add_broker_flags(parser)
    rows = ["| flag | value | meaning |", "|---|---|---|"]
    for action in parser._actions:
        flag = ", ".join(action.option_strings)
        value = "" if action.nargs == 0 else "integer" if action.type is int else "text"
        # Defaults read from the environment (e.g. $ICEFALL_METADATA_URI) are the help text's to tell.
        meaning = action.help or (f"default `{action.default}`" if action.default else "")
        rows.append(f"| `{_cell(flag)}` | {value} | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def kafka_apis() -> str:
    from kio.index import api_key_map

    from broker.kafka.handlers import SUPPORTED_VERSIONS

    rows = ["| API | key | versions |", "|---|---|---|"]
    for key, (low, high) in sorted(SUPPORTED_VERSIONS.items()):
        name = "".join(part.capitalize() for part in api_key_map[key].split("_"))
        rows.append(f"| {name} | {key} | {low}-{high} |")
    return "\n".join(rows) + "\n"


def acl_operations() -> str:
    """What each API needs (``broker.kafka.acl_apis``' tables)."""
    from kio.index import api_key_map

    from broker.kafka.acl_apis import GROUP_OPERATION, REQUEST_CHECKS, TOPIC_OPERATION

    rows = ["| API | key | the request | each topic | each group |", "|---|---|---|---|---|"]
    for key in sorted({*REQUEST_CHECKS, *TOPIC_OPERATION, *GROUP_OPERATION}):
        name = "".join(part.capitalize() for part in api_key_map[key].split("_"))
        whole = ", ".join(
            f"{c.operation.name} on {c.resource_type.name}" for c in REQUEST_CHECKS.get(key, ())
        )
        topic = TOPIC_OPERATION[key].name if key in TOPIC_OPERATION else ""
        group = GROUP_OPERATION[key].name if key in GROUP_OPERATION else ""
        rows.append(f"| {name} | {key} | {whole} | {topic} | {group} |")
    return "\n".join(rows) + "\n"


def up_environment() -> str:
    """``icefall up``'s own variables (``broker.supervisor.up_settings.UpSettings``), then the
    commit tasks' (``broker.env_values.TASK_NUMBERS``), which it checks before it starts."""
    from broker.env_values import TASK_NUMBERS
    from broker.supervisor.up_settings import ENV_PREFIX, UpSettings

    rows = ["| variable | default | effect |", "|---|---|---|"]
    for name, field in UpSettings.model_fields.items():
        default = field.default
        shown = "unset" if default is False else _code(str(default))
        rows.append(
            f"| `{ENV_PREFIX}{name.upper()}` | {shown} | {_cell(field.description or '')} |"
        )
    for number in TASK_NUMBERS:  # the commit tasks read these; up checks them first
        rows.append(
            f"| `{number.name}` | {_code(str(number.default))} | {_cell(number.meaning)}: "
            f"{number.accepts()}; read by {number.read_by} |"
        )
    return "\n".join(rows) + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "topic-configs": topic_configs,
    "broker-flags": broker_flags,
    "up-environment": up_environment,
    "kafka-apis": kafka_apis,
    "acl-operations": acl_operations,
}
# The pages that must carry a marker (a moved page would otherwise lose its table quietly).
EXPECTED: dict[str, tuple[str, ...]] = {
    "reference/topic-configs.md": ("topic-configs",),
    "reference/cli.md": ("up-environment", "broker-flags"),
    "compatibility.md": ("kafka-apis",),
    "security-acls.md": ("acl-operations",),
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    names = MARKER.findall(markdown)
    for expected in EXPECTED.get(page.file.src_uri, ()):
        if expected not in names:
            raise PluginError(
                f"{page.file.src_uri} lacks its marker <!-- generated: {expected} -->"
            )
    for name in names:
        if name not in GENERATORS:
            raise PluginError(f"{page.file.src_uri}: no generator for <!-- generated: {name} -->")
    return MARKER.sub(lambda match: GENERATORS[match.group(1)](), markdown)
