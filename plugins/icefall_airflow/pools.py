"""The one-slot pool per table (``icefall_table__<topic>``) that commit and maintenance share.

Airflow does not schedule a task whose pool does not exist, and DAG files may
not touch the database, so pools are created outside parsing, by
``python -m icefall_airflow.sync`` (which ``icefall up`` runs whenever the
manifest changes) or this module's own command (or ``airflow pools set``). Existing pools are left alone, so an operator
who resized one keeps their size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from icefall_airflow import manifest

DESCRIPTION = (
    "Icefall: serialises the writers (commit rounds, maintenance) of topic {topic}'s table"
)


def sync_pools(path: Path | None = None) -> list[str]:
    """Create the missing pools for every table topic in the manifest; return the names created."""
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    created = []
    with create_session() as session:
        for entry in manifest.read(path).table_topics:
            if Pool.get_pool(entry.pool, session=session) is None:
                Pool.create_or_update_pool(
                    entry.pool, 1, DESCRIPTION.format(topic=entry.topic), False, session=session
                )
                created.append(entry.pool)
    return created


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="create the Icefall table pools in the Airflow database"
    )
    parser.add_argument(
        "--manifest", type=Path, default=None, help="default: $ICEFALL_HOME/table_topics.json"
    )
    args = parser.parse_args(argv)
    for name in sync_pools(args.manifest):
        print(f"created pool {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
