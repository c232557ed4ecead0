"""Bring Airflow's database in line with the broker's manifest: pools, and paused DAGs.

DAG files may not touch the database, so what the manifest implies for the
database is applied here, outside parsing: ``icefall up`` runs ``python -m
icefall_airflow.sync`` at start and whenever the manifest changes (and again
while it reports DAGs the DAG processor has not parsed yet); other deployments
run the same command after changing table topics (a cron or a sidecar).

- every table topic gets its one-slot pool (``pools.sync_pools``);
- the DAG files built from the manifest get a priority parsing request
  (``reparse``): the DAG processor parses them within a second, so a table topic's
  DAG appears (or goes stale) without waiting for the periodic parse;
- a topic whose ``automq.table.topic.enable`` was set to ``false`` gets its
  writer DAGs (commit, maintenance) paused; the names paused this way are kept
  in the Airflow Variable ``icefall_paused_dags``, so turning the flag back on
  unpauses exactly those and never a DAG an operator paused by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from icefall_airflow import manifest, pools, reparse, settings

PAUSED_VARIABLE = "icefall_paused_dags"
EXIT_PENDING = 3  # some disabled topic's DAG is not in the database yet: run again later


@dataclass
class SyncReport:
    pools_created: list[str] = field(default_factory=list)
    parse_requested: list[str] = field(default_factory=list)  # DAG files, relative
    paused: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    pending: list[str] = field(
        default_factory=list
    )  # DAGs to pause that Airflow has not parsed yet


def sync(path: Path | None = None, request_parse: bool = True) -> SyncReport:
    from airflow.models.dag import DagModel
    from airflow.models.variable import Variable
    from airflow.utils.session import create_session

    current = manifest.read(path)
    report = SyncReport(pools_created=pools.sync_pools(path))
    stored = Variable.get(PAUSED_VARIABLE, default_var=None)
    ours: set[str] = set(json.loads(stored)) if stored else set()
    with create_session() as session:
        if request_parse:
            report.parse_requested = reparse.request_parse(session)
        before = set(ours)
        for entry in current.disabled_table_topics:
            commit_id, *others = settings.writer_dag_ids(entry.topic)
            for dag_id in (commit_id, *others):
                model = DagModel.get_dagmodel(dag_id, session=session)
                if model is None:
                    if (
                        dag_id == commit_id
                    ):  # the factory makes it; the DAG processor has not parsed it yet
                        report.pending.append(dag_id)
                    continue
                if not model.is_paused:
                    model.is_paused = True
                    ours.add(dag_id)
                    report.paused.append(dag_id)
        for entry in current.table_topics:
            for dag_id in settings.writer_dag_ids(entry.topic):
                if dag_id not in ours:
                    continue
                model = DagModel.get_dagmodel(dag_id, session=session)
                if model is not None:
                    model.is_paused = False
                    report.resumed.append(dag_id)
                ours.discard(dag_id)
        if ours != before:
            Variable.set(
                PAUSED_VARIABLE,
                json.dumps(sorted(ours)),
                description="Icefall: DAGs paused because their topic's table-topic flag is off",
                session=session,
            )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="create Icefall's table pools and pause the DAGs of disabled "
        "table topics in the Airflow database"
    )
    parser.add_argument(
        "--manifest", type=Path, default=None, help="default: $ICEFALL_HOME/table_topics.json"
    )
    parser.add_argument(
        "--no-parse-request",
        action="store_true",
        help="file no parsing requests (icefall up filed them itself)",
    )
    args = parser.parse_args(argv)
    report = sync(args.manifest, request_parse=not args.no_parse_request)
    for name in report.pools_created:
        print(f"created pool {name}")
    for rel in report.parse_requested:
        print(f"asked the DAG processor to re-parse {rel}")
    for dag_id in report.paused:
        print(f"paused {dag_id} (table topic disabled)")
    for dag_id in report.resumed:
        print(f"unpaused {dag_id} (table topic enabled again)")
    for dag_id in report.pending:
        print(f"{dag_id} is not parsed yet: will pause it on the next run")
    return EXIT_PENDING if report.pending else 0


if __name__ == "__main__":
    sys.exit(main())
