"""The flags every Icefall Spark job shares (the commit round, maintenance, the DLQ reprocess):
where the broker's admin API is (it names everything else), which Iceberg REST catalog to use
instead of the broker's, and the Spark master when the job is not run by spark-submit.

Declared once so the three jobs, and the Airflow operators that build their command lines,
agree on the names and defaults."""

from __future__ import annotations

import argparse
import os

from broker.env_values import ROUND_IN_DRIVER_MAX_BYTES, EnvValueError

ADMIN_URL_ENV = "ICEFALL_ADMIN_URL"
DEFAULT_ADMIN_URL = "http://127.0.0.1:8090"
MASTER_HELP = "Spark master when not run by spark-submit (default local[*])"
# the commit round's --in-driver-max-bytes default (0: every round with records runs on Spark);
# the commit task reads it too (``icefall_airflow.commit_operator``)
DRIVER_MAX_BYTES_ENV = ROUND_IN_DRIVER_MAX_BYTES.name


def add_common_flags(parser: argparse.ArgumentParser, master_help: str = MASTER_HELP) -> None:
    """``--admin-url`` (default ``$ICEFALL_ADMIN_URL``), ``--catalog-url``, ``--master``."""
    parser.add_argument("--admin-url", default=os.environ.get(ADMIN_URL_ENV, DEFAULT_ADMIN_URL))
    parser.add_argument(
        "--catalog-url", default=None, help="Iceberg REST catalog (default: the broker's)"
    )
    parser.add_argument("--master", default=None, help=master_help)


def add_in_driver_max_bytes(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--in-driver-max-bytes``, its default ``$ICEFALL_ROUND_IN_DRIVER_MAX_BYTES`` (else 1 GiB);
    a bad value of the variable is a usage error naming it (exit 2), as a bad flag would be."""
    try:
        default = ROUND_IN_DRIVER_MAX_BYTES.read()
    except EnvValueError as exc:
        parser.error(str(exc))
    parser.add_argument(
        "--in-driver-max-bytes", type=int, metavar="BYTES", default=default, help=help_text
    )
