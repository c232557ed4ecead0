"""``automq.table.topic.partition.by`` -> the table's Iceberg partition spec, kept in step.

The config is a list such as ``[month(ts), bucket(id, 16), a.b, truncate(name, 4)]``
(the broker validated its shape). Each item is one partition field: a column
path (nested with dots) and a transform: identity, year, month, day, hour,
bucket[N], truncate[W]. Partition field names follow Spark's: ``ts_month``,
``id_bucket_16``, ``a.b`` -> ``a_b``, ``name_trunc_4``.

A round compares the table's current spec with the config and evolves it
(``update_spec``) before it writes: new fields are added, fields no longer
configured are removed; existing data files keep the spec they were written
with, as Iceberg's partition evolution intends. An empty config leaves the
table unpartitioned (or makes it so).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)

log = logging.getLogger(__name__)
_ITEM = re.compile(
    r"^(?:(?P<fn>year|month|day|hour|bucket|truncate)\(\s*(?P<col>[\w.]+)\s*(?:,\s*(?P<n>\d+)\s*)?\)"
    r"|(?P<ident>[\w.]+))$"
)
ATTEMPTS = 5


@dataclass(frozen=True)
class PartitionField:
    column: str  # dotted path
    transform: Transform[Any, Any]
    name: str


def parse(config: str) -> list[PartitionField]:
    """The partition fields a config value names, in order; raises ValueError on a bad item."""
    text = config.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    fields = []
    for raw in _split(text):
        match = _ITEM.match(raw)
        if match is None:
            raise ValueError(f"bad partition.by item {raw!r}")
        if match["ident"]:
            column = match["ident"]
            fields.append(PartitionField(column, IdentityTransform(), column.replace(".", "_")))
            continue
        fn, column, n = match["fn"], match["col"], match["n"]
        base = column.replace(".", "_")
        if fn in ("bucket", "truncate") and n is None:
            raise ValueError(f"{fn}({column}) needs a width: {fn}({column}, N)")
        transform: Transform[Any, Any]
        if fn == "bucket":
            transform, name = BucketTransform(int(n)), f"{base}_bucket_{n}"
        elif fn == "truncate":
            transform, name = TruncateTransform(int(n)), f"{base}_trunc_{n}"
        else:
            transform = {
                "year": YearTransform(),
                "month": MonthTransform(),
                "day": DayTransform(),
                "hour": HourTransform(),
            }[fn]
            name = f"{base}_{fn}"
        fields.append(PartitionField(column, transform, name))
    return fields


def _split(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        current += ch
    if current.strip():
        items.append(current.strip())
    return items


def _current(table: Table) -> set[tuple[str, str]]:
    schema = table.schema()
    return {
        (schema.find_column_name(f.source_id) or "", str(f.transform)) for f in table.spec().fields
    }


def evolve(table: Table, config: str) -> tuple[Table, list[str]]:
    """Make the table's spec what ``config`` says; the changes made, described."""
    wanted = parse(config)
    for attempt in range(ATTEMPTS):
        current = _current(table)
        wanted_keys = {(f.column, str(f.transform)) for f in wanted}
        if current == wanted_keys:
            return table, []
        changes: list[str] = []
        try:
            with table.update_spec() as update:
                for existing in table.spec().fields:
                    key = (
                        table.schema().find_column_name(existing.source_id) or "",
                        str(existing.transform),
                    )
                    if key not in wanted_keys:
                        update.remove_field(existing.name)
                        changes.append(f"drop partition field {existing.name}")
                for field in wanted:
                    if (field.column, str(field.transform)) not in current:
                        update.add_field(field.column, field.transform, field.name)
                        changes.append(
                            f"add partition field {field.name} = {field.transform}({field.column})"
                        )
            log.info("partition spec of %s: %s", table.name(), "; ".join(changes))
            return table.refresh(), changes
        except CommitFailedException:
            if attempt == ATTEMPTS - 1:
                raise
            table = table.refresh()
    return table, []
