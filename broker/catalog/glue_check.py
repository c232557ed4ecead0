"""AWS Glue as the tables' catalog (``automq.table.topic.catalog.type=glue``): one cheap Glue call
that says, naming the setting, why the catalog cannot be used (a wrong ``glue.endpoint``, no
credentials, refused credentials), so the broker's log at start and a round's result say it in
words instead of every later commit failing with a stack trace."""

from __future__ import annotations

import logging
import os

from broker.config import CATALOG_PREFIX
from broker.contracts import CatalogSpec

ENDPOINT = CATALOG_PREFIX + "glue.endpoint"
REFUSED = ("AccessDenied", "AccessDeniedException", "UnrecognizedClientException")


def _region(spec: CatalogSpec) -> str:
    props = spec.properties
    return (
        props.get("glue.region")
        or props.get("client.region")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1"
    )


def glue_problem(spec: CatalogSpec) -> tuple[int, str] | None:
    """None when Glue answers ``GetDatabases`` for these settings, else the log level and a message
    naming the setting (a server that does not answer is an ERROR too: nothing commits without it)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    props = spec.properties
    endpoint = props.get("glue.endpoint")
    where = f"{ENDPOINT}={endpoint}" if endpoint else "AWS Glue (no glue.endpoint set)"
    client = boto3.session.Session().client(  # a fresh session: credentials as they are now
        "glue",
        endpoint_url=endpoint,
        region_name=_region(spec),
        aws_access_key_id=props.get("glue.access-key-id") or props.get("client.access-key-id"),
        aws_secret_access_key=props.get("glue.secret-access-key")
        or props.get("client.secret-access-key"),
        aws_session_token=props.get("glue.session-token") or props.get("client.session-token"),
        config=Config(connect_timeout=3, read_timeout=5, retries={"max_attempts": 1}),
    )
    try:
        client.get_databases(MaxResults=1)
    except NoCredentialsError:
        return logging.ERROR, (
            f"{CATALOG_PREFIX}type=glue: no AWS credentials for {where} (set AWS_ACCESS_KEY_ID "
            f"and AWS_SECRET_ACCESS_KEY, a profile, or {CATALOG_PREFIX}glue.access-key-id and "
            f"{CATALOG_PREFIX}glue.secret-access-key)"
        )
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in REFUSED:
            return logging.ERROR, f"{where} refuses these AWS credentials ({code})"
        return logging.ERROR, f"{where} answered {code}: {exc}"
    except BotoCoreError as exc:
        return logging.ERROR, f"cannot reach the Glue catalog at {where}: {exc}"
    return None
