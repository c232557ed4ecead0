"""The flags every Icefall Spark job shares (the commit round, maintenance, the DLQ reprocess):
where the broker's admin API is (it names everything else), which Iceberg REST catalog to use
instead of the broker's, and the Spark master when the job is not run by spark-submit.

Declared once so the three jobs, and the Airflow operators that build their command lines,
agree on the names and defaults."""

from __future__ import annotations

import argparse
import os

ADMIN_URL_ENV = "ICEFALL_ADMIN_URL"
DEFAULT_ADMIN_URL = "http://127.0.0.1:8090"
MASTER_HELP = "Spark master when not run by spark-submit (default local[*])"
# the commit round's --in-driver-max-bytes default (0: every round with records runs on Spark);
# the commit task reads it too (``icefall_airflow.commit_operator``)
DRIVER_MAX_BYTES_ENV = "ICEFALL_ROUND_IN_DRIVER_MAX_BYTES"


def add_common_flags(parser: argparse.ArgumentParser, master_help: str = MASTER_HELP) -> None:
    """``--admin-url`` (default ``$ICEFALL_ADMIN_URL``), ``--catalog-url``, ``--master``."""
    parser.add_argument("--admin-url", default=os.environ.get(ADMIN_URL_ENV, DEFAULT_ADMIN_URL))
    parser.add_argument(
        "--catalog-url", default=None, help="Iceberg REST catalog (default: the broker's)"
    )
    parser.add_argument("--master", default=None, help=master_help)
