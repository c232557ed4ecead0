"""The "Table topics" view: a FastAPI app the Airflow API server mounts at ``/icefall``.

``GET /icefall/api/tables`` is the JSON status of every table topic (lag in
records and seconds, freshness against its SLA, last commit, DLQ rows, last maintenance); ``GET
/icefall/`` renders it as a page the Airflow UI embeds (external view). The
handlers are plain ``def``s: they make blocking HTTP calls to the broker and
the catalog, which FastAPI runs in its thread pool.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from broker.topic_configs import ENABLE
from icefall_airflow import status
from spark_jobs.maintain import summary as maintenance_summary

app = FastAPI(
    title="Icefall table topics", description="Kafka topic -> Iceberg table commit status"
)


@app.get("/api/tables")
def tables() -> dict[str, Any]:
    return status.all_statuses()


@app.get("/api/tables/{topic}")
def table(topic: str) -> dict[str, Any]:
    answer = status.all_statuses()
    for row in answer["tables"]:
        if row["topic"] == topic:
            return dict(row)
    raise HTTPException(
        404, f"{topic} is not a table topic" + (f" ({answer['error']})" if answer["error"] else "")
    )


def _time(ms: int | None) -> str:
    if ms is None:
        return "—"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cell(value: object) -> str:
    return "—" if value is None else html.escape(str(value))


def _maintenance(summary: dict[str, Any] | None) -> str:
    """What the last maintenance run did, under its time (recorded by the job on the table)."""
    if not summary:
        return ""
    return f"<br><small>{html.escape(maintenance_summary.one_line(summary))}</small>"


def _maintainer(t: dict[str, Any]) -> str:
    """Who compacts and expires the table: Icefall's maintenance DAG or S3 Tables itself."""
    return f"<br><small>by {html.escape(t.get('maintained_by') or 'Icefall')}</small>"


def _dlq(t: dict[str, Any]) -> str:
    """The DLQ's row count; when it has rows, a link to the DAG that reprocesses them."""
    if not t.get("dlq_rows") or not t.get("dlq_dag_id"):
        return _cell(t.get("dlq_rows"))
    dag = html.escape(f"../dags/{t['dlq_dag_id']}")
    return f'{_cell(t["dlq_rows"])}<br><small><a href="{dag}" target="_top">reprocess</a></small>'


def _sla(t: dict[str, Any]) -> str:
    """The topic's freshness SLA, and whether the table's freshness is past it now."""
    sla_ms = t.get("freshness_sla_ms")
    if sla_ms is None:
        return "—"
    state = (
        '<small class="error">breached</small>'
        if t.get("freshness_breached")
        else "<small>met</small>"
    )
    return f"{sla_ms / 1000:g} s<br>{state}"


def render(answer: dict[str, Any]) -> str:
    rows = []
    for t in answer["tables"]:
        runs = html.escape(f"../{t['dag_runs_url']}")
        if t["error"]:
            detail = f'<td colspan="8" class="error">{html.escape(t["error"])}</td>'
        else:
            detail = (
                f"<td class=num>{t['lag_records']}</td><td class=num>{t['lag_seconds']:.1f}</td>"
                f"<td class=num>{_sla(t)}</td>"
                f"<td>{_time(t['last_commit_ms'])}</td><td class=mono>{_cell(t['snapshot_id'])}</td>"
                f"<td class=num>{_cell(t['rows'])}</td><td class=num>{_dlq(t)}</td>"
                f"<td>{_time(t['last_maintenance_ms'])}{_maintainer(t)}{_maintenance(t.get('last_maintenance'))}</td>"
            )
        rows.append(
            f"<tr><td><b>{html.escape(t['topic'])}</b></td>"
            f"<td class=mono>{html.escape(t['namespace'])}.{html.escape(t['table'])}</td>{detail}"
            f'<td><a href="{runs}" target="_top">{html.escape(t["dag_id"])}</a></td></tr>'
        )
    body = (
        "\n".join(rows)
        or f'<tr><td colspan="11">No table topics yet: set {ENABLE}=true on a topic.</td></tr>'
    )
    error = f'<p class="error">{html.escape(answer["error"])}</p>' if answer.get("error") else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Icefall table topics</title>
<meta http-equiv="refresh" content="10">
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; color: #1a202c; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ border-bottom: 1px solid #e2e8f0; padding: .45rem .6rem; text-align: left; font-size: 14px; }}
th {{ background: #f7fafc; }} .num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.mono {{ font-family: ui-monospace, monospace; }} .error {{ color: #c53030; }} small {{ color: #718096; }}
</style></head><body>
<h2>Table topics</h2>
<small>broker {html.escape(answer.get("admin_url") or "")} · catalog {html.escape(answer.get("catalog_url") or "—")}
· as of {_time(answer.get("generated_at_ms"))} · refreshes every 10 s
· JSON: <a href="api/tables">api/tables</a></small>
{error}
<table><thead><tr><th>topic</th><th>table</th><th class=num>lag (records)</th><th class=num>lag (s)</th>
<th class=num>freshness SLA</th><th>last commit</th><th>snapshot</th><th class=num>rows</th>
<th class=num>DLQ rows</th><th>last maintenance</th>
<th>DAG runs</th></tr></thead>
<tbody>
{body}
</tbody></table></body></html>"""


@app.get("/", response_class=HTMLResponse)
def page() -> str:
    return render(status.all_statuses())
