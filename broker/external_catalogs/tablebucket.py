"""What ``automq.table.topic.catalog.type=tablebucket`` (AWS S3 Tables) means to each client.

Standard library only: ``broker.contracts`` calls it to build the pyiceberg and Spark catalog
properties of a table bucket, and the broker's config to check the ARN, both of which must
import without pyiceberg or boto3 (Airflow parses DAGs with them).

- pyiceberg: ``broker.external_catalogs.s3tables.S3TablesCatalog`` (Icefall's, through
  pyiceberg's ``py-catalog-impl``);
- Spark: AWS's ``software.amazon.s3tables.iceberg.S3TablesCatalog`` (the
  ``software.amazon.s3tables:s3-tables-catalog-for-iceberg`` jar pinned in spark_jobs/jvm) as
  the ``catalog-impl`` of Iceberg's ``SparkCatalog``.

Both take ``warehouse`` = the table bucket's ARN and ``s3tables.endpoint`` (an S3 Tables API
endpoint other than AWS's, e.g. moto's server); the other catalog properties (``s3.endpoint``,
``s3.path-style-access``, ``client.region``, ...) pass through to the FileIO.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping

TYPE = "tablebucket"
PY_CATALOG_IMPL = "broker.external_catalogs.s3tables.S3TablesCatalog"
SPARK_CATALOG_IMPL = "software.amazon.s3tables.iceberg.S3TablesCatalog"
WAREHOUSE_KEY = "automq.table.topic.catalog.warehouse"
ENDPOINT = "s3tables.endpoint"
ENDPOINT_KEY = "automq.table.topic.catalog." + ENDPOINT
# arn:aws:s3tables:us-east-1:111122223333:bucket/name (aws-cn, aws-us-gov partitions too)
ARN = re.compile(
    r"^arn:aws[a-z-]*:s3tables:(?P<region>[a-z0-9-]+):(?P<account>\d{12}):bucket/(?P<bucket>[a-z0-9_-]{3,63})$"
)


class TableBucketSettingError(ValueError):
    """A setting of the tablebucket catalog that cannot be used; the message names the key."""


def region_of(arn: str | None) -> str:
    """The region in a table bucket ARN, or an error naming the setting."""
    match = ARN.match(arn or "")
    if match is None:
        raise TableBucketSettingError(
            f"{WAREHOUSE_KEY}={arn!r} is not a table bucket ARN "
            "(arn:aws:s3tables:<region>:<account>:bucket/<name>)"
        )
    return match.group("region")


def endpoint(properties: Mapping[str, str]) -> str | None:
    """The S3 Tables API endpoint: the catalog property, else boto3's own variables."""
    return (
        properties.get(ENDPOINT)
        or os.environ.get("AWS_ENDPOINT_URL_S3TABLES")
        or os.environ.get("AWS_ENDPOINT_URL")
        or None
    )


def _common(arn: str, properties: Mapping[str, str]) -> dict[str, str]:
    region = region_of(arn)
    out = {"client.region": region, "s3.region": region, **properties, "warehouse": arn}
    if (api := endpoint(properties)) is not None:
        out[ENDPOINT] = api
    return out


def pyiceberg_properties(arn: str, properties: Mapping[str, str]) -> dict[str, str]:
    """``load_catalog(name, **these)``: Icefall's pyiceberg catalog on the S3 Tables API."""
    return {**_common(arn, properties), "py-catalog-impl": PY_CATALOG_IMPL}


def spark_properties(arn: str, properties: Mapping[str, str]) -> dict[str, str]:
    """``spark.sql.catalog.<name>.<key>`` of a ``SparkCatalog`` over AWS's S3 Tables catalog."""
    return {**_common(arn, properties), "catalog-impl": SPARK_CATALOG_IMPL}


def check(arn: str, properties: Mapping[str, str]) -> tuple[int, str] | None:
    """At broker start: the table bucket answers at its endpoint. A (log level, message)
    naming the setting when it does not; None when it does."""
    try:
        from broker.external_catalogs.s3tables import S3TablesCatalog

        S3TablesCatalog("check", **pyiceberg_properties(arn, properties)).check_bucket()
    except Exception as exc:  # noqa: BLE001 -- logged at start; every round reports it too
        return (logging.ERROR, f"tables catalog (tablebucket): {exc}")
    return None
