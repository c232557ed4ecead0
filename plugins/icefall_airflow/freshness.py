"""The commit DAG's freshness deadline: an Airflow Deadline Alert per commit run.

A topic with ``automq.table.topic.freshness.sla.ms`` promises that no record
waits longer than the SLA to be in its table (``broker.contracts.Freshness``).
Airflow's deadlines are set per DAG run, from a reference time of the run, so
the promise is put on the runs: each scheduled run for the interval [a, b)
must finish by ``a + SLA`` (reference ``DAGRUN_LOGICAL_DATE``: a data-interval
timetable's logical date is the interval's start). Why that is the promise:
the run for [a, b) commits every record appended before b; until it finishes,
records appended since a (and before, if earlier runs failed) are not in the
table, so a record appended at a has waited ``now - a``. The deadline passes
exactly when such a record would have waited longer than the SLA.

What it cannot see, and the broker's ``icefall_table_freshness_*`` gauges and
the view's breach flag (computed from the records themselves) do: a DAG that
is paused or has no run at all (nothing to set a deadline on), and runs
without a logical date (asset-triggered by ``commit.trigger.bytes``, manual
runs without one), on which Airflow sets no deadline. It may also fire when no
record arrived at the start of the interval (the promise was at risk, not
broken). An SLA shorter than the commit interval cannot be kept by interval
runs: every run misses it.

The callback runs in the triggerer (``AsyncCallback``): it logs the breach
and, when ``ICEFALL_FRESHNESS_WEBHOOK_URL`` is set in the triggerer's
environment, POSTs it there as JSON (Slack-style incoming webhooks, an alert
manager's generic receiver...).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from datetime import timedelta
from typing import Any

from broker import contracts

log = logging.getLogger(__name__)

WEBHOOK_ENV = "ICEFALL_FRESHNESS_WEBHOOK_URL"
WEBHOOK_TIMEOUT_S = 10.0


def deadline_alert(entry: contracts.TableTopic) -> Any | None:
    """The commit DAG's ``deadline=`` for a topic with a freshness SLA, else None."""
    sla_ms = entry.settings.freshness_sla_ms
    if sla_ms is None:
        return None
    from airflow.sdk.definitions.callback import AsyncCallback
    from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_LOGICAL_DATE,
        interval=timedelta(milliseconds=sla_ms),
        callback=AsyncCallback(
            freshness_deadline_missed,
            kwargs={
                "topic": entry.topic,
                "namespace": entry.namespace,
                "table": entry.table,
                "sla_ms": sla_ms,
            },
        ),
        name=f"freshness of {entry.namespace}.{entry.table}",
    )


def breach(
    topic: str, namespace: str, table: str, sla_ms: int, context: dict[str, Any] | None
) -> dict[str, Any]:
    """What the alert says: the table, its SLA, the run that missed it and when."""
    dag_run = (context or {}).get("dag_run") or {}
    deadline = (context or {}).get("deadline") or {}
    return {
        "event": "icefall.freshness.sla_missed",
        "topic": topic,
        "table": f"{namespace}.{table}",
        "sla_ms": sla_ms,
        "dag_id": dag_run.get("dag_id"),
        "run_id": dag_run.get("dag_run_id") or dag_run.get("run_id"),
        "data_interval_start": dag_run.get("data_interval_start"),
        "deadline": str(deadline.get("deadline_time")) if deadline else None,
        "text": (
            f"Icefall: table {namespace}.{table} (topic {topic}) missed its freshness SLA of "
            f"{sla_ms / 1000:g} s: the commit run for the interval starting "
            f"{dag_run.get('data_interval_start')} had not finished by its deadline"
        ),
    }


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as response:
        return int(response.status)


def _why(exc: OSError) -> str:
    """Why a webhook call failed, without the URL: the HTTP status, else the socket's reason."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return f"{type(reason).__name__}: {getattr(reason, 'strerror', None) or reason}"


async def freshness_deadline_missed(
    topic: str,
    namespace: str,
    table: str,
    sla_ms: int,
    context: dict[str, Any] | None = None,
    **_: Any,
) -> str:
    """The deadline callback (the triggerer awaits it with the kwargs above and Airflow's context).
    Returns the event as JSON text: Airflow stores a callback's result in a Text column
    (``callback.output``), and a dict there crashed the triggerer (SQLite cannot bind it)."""
    event = breach(topic, namespace, table, sla_ms, context)
    log.warning("%s", event["text"])
    url = os.environ.get(WEBHOOK_ENV)
    if url:
        try:
            status = await asyncio.to_thread(_post, url, event)
            log.info("freshness alert for %s posted to the webhook: HTTP %d", topic, status)
        except ValueError:  # urllib: "unknown url type"; the URL is not echoed (it may be a secret)
            log.warning(
                "freshness alert for %s: %s is not an http(s) URL; nothing posted",
                topic,
                WEBHOOK_ENV,
            )
        except OSError as exc:  # the alert is logged either way; a webhook down must not hide it
            # the host only: a webhook URL's path often is its secret (Slack, Teams)
            log.warning(
                "freshness alert for %s: webhook on %s failed: %s",
                topic,
                urllib.parse.urlsplit(url).hostname,
                _why(exc),
            )
    return json.dumps(event)
