"""Which ``automq.table.topic.catalog.<property>`` keys the broker passes through to Iceberg.

Every such key becomes an Iceberg catalog property of pyiceberg's catalog (rounds, the Airflow
view, the broker's lag) and of Spark's (``spark.sql.catalog.<name>.<property>``). Neither
library refuses a property it does not know: a misspelt ``glue.endpiont`` is silently ignored
and the round then talks to AWS's real endpoint. So the broker checks each key at start against
the properties Iceberg's catalogs and FileIOs read (pyiceberg 0.12's and Iceberg Java 1.10's,
written out here because neither library exports one list of them), and refuses an unknown one
naming it and the nearest known key.

Families whose members are open by design (HTTP headers, table defaults, S3 access points,
tags, other clouds' FileIOs) are accepted by prefix.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

# Catalog-level properties of pyiceberg's and Iceberg Java's catalogs (REST, Glue, Nessie, S3 Tables).
CATALOG_KEYS = frozenset(
    {
        "warehouse",
        "uri",
        "prefix",
        "io-impl",
        "py-io-impl",
        "py-catalog-impl",
        "catalog-impl",
        "cache-enabled",
        "cache.expiration-interval-ms",
        "cache.case-sensitive",
        "metrics-reporter-impl",
        "client.pool.cache.eviction-interval-ms",
        "clients",
        "lock-impl",
        "namespace-separator",
        "snapshot-loading-mode",
        "scan-planning-mode",
        "view-endpoints-supported",
        "rest-page-size",
        "rest-metrics-reporting-enabled",
        "encryption.kms-impl",
        "downcast-ns-timestamp-to-us-on-write",
        # REST auth (OAuth2, SigV4) and TLS
        "credential",
        "token",
        "scope",
        "audience",
        "resource",
        "oauth2-server-uri",
        "token-refresh-enabled",
        "token-exchange-enabled",
        "token-expires-in-ms",
        "auth.manager",
        "vended-credentials",
        "ssl.client.cert",
        "ssl.client.key",
        "ssl.cabundle",
        "rest.sigv4-enabled",
        "rest.sigv4.max-retries",
        "rest.signing-name",
        "rest.signing-region",
        "rest.access-key-id",
        "rest.secret-access-key",
        "rest.session-token",
        # Nessie
        "ref",
        "ref.hash",
        "nessie.ref",
        "nessie.ref.hash",
        "nessie.client-api-version",
        "nessie.client-builder-impl",
        # AWS clients (Glue, S3 Tables, S3FileIO)
        "client.region",
        "client.access-key-id",
        "client.secret-access-key",
        "client.session-token",
        "client.profile-name",
        "client.role-arn",
        "client.role-session-name",
        "client.factory",
        "client.credentials-provider",
        "glue.id",
        "glue.account-id",
        "glue.catalog-arn",
        "glue.endpoint",
        "glue.region",
        "glue.access-key-id",
        "glue.secret-access-key",
        "glue.session-token",
        "glue.profile-name",
        "glue.max-retries",
        "glue.retry-mode",
        "glue.skip-archive",
        "glue.skip-name-validation",
        "glue.lakeformation-enabled",
        "glue.dynamodb-lock-table",
        "s3tables.endpoint",
        "s3tables.region",
        "s3.endpoint",
        "s3.region",
        "s3.access-key-id",
        "s3.secret-access-key",
        "s3.session-token",
        "s3.profile-name",
        "s3.role-arn",
        "s3.role-session-name",
        "s3.anonymous",
        "s3.path-style-access",
        "s3.force-virtual-addressing",
        "s3.resolve-region",
        "s3.proxy-uri",
        "s3.connect-timeout",
        "s3.request-timeout",
        "s3.retry-strategy-impl",
        "s3.signer",
        "s3.signer.uri",
        "s3.signer.endpoint",
        "s3.remote-signing-enabled",
        "s3.server-side-encryption",
        "s3.sse-kms-key-id",
        "s3.acl",
        "s3.staging-dir",
        "s3.checksum-enabled",
        "s3.delete-enabled",
        "s3.preload-client-enabled",
        "s3.use-arn-region-enabled",
        "s3.dualstack-enabled",
        "s3.cross-region-access-enabled",
        "s3.acceleration-enabled",
        "s3.chunked-encoding-enabled",
    }
)

# Families whose members are open by design.
OPEN_PREFIXES = (
    "header.",  # REST: HTTP headers sent with every request
    "table-default.",
    "table-override.",
    "view-default.",
    "view-override.",
    "rest.auth.",
    "lock.",
    "http-client.",
    "s3.access-points.",
    "s3.write.",
    "s3.delete.",
    "s3.sse.",
    "s3.multipart.",
    "s3.retry.",
    "s3.crt.",
    "s3.analytics-accelerator.",
    "s3.tags.",
    "client.assume-role.",
    "adls.",
    "gcs.",
    "hdfs.",
    "oss.",
    "hf.",
    "authentication.",  # Nessie's client (Spark's NessieCatalog): authentication.type, .token, ...
    "nessie.authentication.",
    "io.manifest.cache",  # Iceberg Java: io.manifest.cache-enabled, io.manifest.cache.*
)


def unknown_property_problem(keys: Iterable[str], setting_prefix: str) -> str | None:
    """A message naming every catalog property key that no Iceberg catalog reads, with the
    nearest known key; None when all are known. ``setting_prefix``: how the user spelt the
    keys' common beginning (``automq.table.topic.catalog.``)."""
    problems = []
    for key in sorted(keys):
        if key in CATALOG_KEYS or key.startswith(OPEN_PREFIXES):
            continue
        near = difflib.get_close_matches(key, CATALOG_KEYS, n=1)
        hint = f" (did you mean {setting_prefix}{near[0]}?)" if near else ""
        problems.append(f"{setting_prefix}{key}{hint}")
    if not problems:
        return None
    return (
        "unknown Iceberg catalog propert"
        + ("y " if len(problems) == 1 else "ies ")
        + ", ".join(problems)
        + "; no Iceberg catalog or FileIO reads it (the known ones: docs/operations.md)"
    )


# A property is secret when its name says it holds one: matched by pattern rather than listed,
# since the open families (``header.Authorization``, ``adls.sas-token.<account>``,
# ``gcs.oauth2.token``, ``authentication.token``, ...) have members no list can name ahead.
_SECRET = re.compile(r"token|key|secret|password|credential|authorization|sas", re.IGNORECASE)
# ... except settings named after a secret that are no secret: flags, durations, identifiers,
# class names and endpoints (``token-refresh-enabled``, ``client.access-key-id``, ...).
_NOT_SECRET = re.compile(r"(-enabled|-in-ms|-id|-impl|-provider|-endpoint|-uri|-url)$")


def is_secret(key: str) -> bool:
    """A catalog property holding a secret (OAuth2 credential or token, keys, passwords, SAS
    tokens, an Authorization header): never served by the admin API (docs/security-http.md)."""
    return bool(_SECRET.search(key)) and not _NOT_SECRET.search(key)
