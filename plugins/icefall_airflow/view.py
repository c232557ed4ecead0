"""The "Table topics" view: a FastAPI app the Airflow API server mounts at ``/icefall``.

``GET /icefall/api/tables`` is the JSON status of every table topic (lag in
records and seconds, freshness against its SLA, last commit, DLQ rows, last maintenance); ``GET
/icefall/`` renders it as a page the Airflow UI embeds (external view), with
per table charts of its lag and commit sizes over the last hours
(``icefall_airflow.history``, drawn by ``icefall_airflow.charts``).
``/icefall/tables/<namespace>.<table>`` lists the table's commits, each linking
to ``.../snapshots/<id>``, that snapshot's numbers (offsets per partition, rows,
files, bytes, round id, DAG run); ``/icefall/api/tables/<topic>/history`` is
the charts' JSON.

Every route needs Airflow's login (``icefall_airflow.auth``) and shows only the
table topics whose commit DAG the user may read. The handlers are plain
``def``s: they make blocking HTTP calls to the broker and the catalog, which
FastAPI runs in its thread pool.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from broker.topic_configs import ENABLE
from icefall_airflow import auth, charts, history, status
from spark_jobs.maintain import summary as maintenance_summary

# No /docs, /redoc or /openapi.json: FastAPI serves those without the routes' dependencies, so
# they would describe the view to anyone who reaches the API server without a login.
app = FastAPI(
    title="Icefall table topics",
    description="Kafka topic -> Iceberg table commit status",
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)
app.add_exception_handler(StarletteHTTPException, auth.not_logged_in)


@app.get("/api/tables")
def tables(user: auth.User) -> dict[str, Any]:
    return auth.visible(user, status.all_statuses())


def _row(user: auth.User, topic: str) -> dict[str, Any]:
    """The status of the table topic ``topic``, 404 when it is none (or the user may not see it)."""
    answer = auth.visible(user, status.all_statuses())
    for row in answer["tables"]:
        if row["topic"] == topic:
            return dict(row)
    raise HTTPException(
        404, f"{topic} is not a table topic" + (f" ({answer['error']})" if answer["error"] else "")
    )


@app.get("/api/tables/{topic}")
def table(user: auth.User, topic: str) -> dict[str, Any]:
    return _row(user, topic)


@app.get("/api/tables/{topic}/history")
def table_history(user: auth.User, topic: str) -> dict[str, Any]:
    """The charts' data: the commits of the last hours and the lag before and after each."""
    _row(user, topic)
    found = history.all_histories({topic}).get(topic)
    if found is None:
        raise HTTPException(404, f"{topic} is not a table topic")
    if isinstance(found, history.Unavailable):
        raise HTTPException(503, found.error)
    return found.model_dump()


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


def _ident(t: dict[str, Any]) -> str:
    return f"{t['namespace']}.{t['table']}"


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def chart_svgs(found: history.TableHistory, snapshots_href: str) -> str:
    """The four charts of a table: lag in records and in seconds, rows and bytes per commit (each
    bar linking to its snapshot's page under ``snapshots_href``)."""
    end = found.lag[-1].at_ms if found.lag else 0
    # the last hours, or less when the history is younger: from a minute before its first point
    first = min([p.at_ms for p in found.lag] + [c.timestamp_ms for c in found.commits], default=end)
    start = max(end - found.window_ms, first - 60_000)
    lag_points = [p for p in found.lag if p.at_ms >= start]
    commits = [c for c in found.commits if c.timestamp_ms >= start]

    def lag(value: str, unit: str) -> list[charts.Point]:
        return [
            charts.Point(
                p.at_ms, getattr(p, value), f"{_time(p.at_ms)}: {getattr(p, value):g} {unit}"
            )
            for p in lag_points
        ]

    def sizes(value: str, label: Any) -> list[charts.Point]:
        return [
            charts.Point(
                c.timestamp_ms,
                getattr(c, value),
                f"snapshot {c.snapshot_id} at {_time(c.timestamp_ms)}: {label(getattr(c, value))}",
                f"{snapshots_href}{c.snapshot_id}",
            )
            for c in commits
        ]

    return "".join(
        [
            charts.line("lag-records", "lag (records)", lag("records", "records"), start, end),
            charts.line("lag-seconds", "lag (s)", lag("seconds", "s"), start, end),
            charts.bars(
                "commit-rows",
                "rows per commit",
                sizes("added_records", "{:,} rows".format),
                start,
                end,
            ),
            charts.bars(
                "commit-bytes", "bytes per commit", sizes("added_bytes", _bytes), start, end
            ),
        ]
    )


def _charts_row(t: dict[str, Any], found: history.TableHistory | history.Unavailable | None) -> str:
    """The row under a table's status: its charts and a link to its commits."""
    if found is None:
        return ""
    page = html.escape(f"tables/{_ident(t)}")
    if isinstance(found, history.Unavailable):
        inner = f'<span class="error">history: {html.escape(found.error)}</span>'
    else:
        inner = chart_svgs(found, f"tables/{_ident(t)}/snapshots/")  # charts escapes it
    hours = WINDOW_HOURS
    return (
        f'<tr class="charts"><td colspan="100">{inner}'
        f'<br><small>up to the last {hours} h · <a href="{page}">commits of {html.escape(_ident(t))}</a>'
        "</small></td></tr>"
    )


WINDOW_HOURS = history.WINDOW_MS // 3_600_000
HEAD = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
{refresh}<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; color: #1a202c; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ border-bottom: 1px solid #e2e8f0; padding: .45rem .6rem; text-align: left; font-size: 14px; }}
th {{ background: #f7fafc; }} .num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.mono {{ font-family: ui-monospace, monospace; }} .error {{ color: #c53030; }} small {{ color: #718096; }}
tr.charts td {{ border-bottom: 2px solid #e2e8f0; }}
{chart_style}
</style></head><body>
"""


def _head(title: str, refresh: bool) -> str:
    return HEAD.format(
        title=html.escape(title),
        refresh='<meta http-equiv="refresh" content="10">\n' if refresh else "",
        chart_style=charts.STYLE,
    )


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


def render(
    answer: dict[str, Any],
    histories: dict[str, history.TableHistory | history.Unavailable] | None = None,
) -> str:
    histories = histories or {}
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
            + _charts_row(t, histories.get(t["topic"]))
        )
    body = (
        "\n".join(rows)
        or f'<tr><td colspan="11">No table topics yet: set {ENABLE}=true on a topic.</td></tr>'
    )
    error = f'<p class="error">{html.escape(answer["error"])}</p>' if answer.get("error") else ""
    hidden = answer.get("hidden_tables")
    if hidden:
        error += f"<p><small>{hidden} table topic(s) not shown: no read access to their DAGs.</small></p>"
    return f"""{_head("Icefall table topics", refresh=True)}
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
def page(user: auth.User) -> str:
    answer = auth.visible(user, status.all_statuses())
    return render(answer, history.all_histories({t["topic"] for t in answer["tables"]}))


def _table_of(user: auth.User, ident: str) -> tuple[dict[str, Any], history.TableHistory]:
    """The status row and the history of the table ``<namespace>.<table>``; 404 if no table topic's."""
    answer = auth.visible(user, status.all_statuses())
    for row in answer["tables"]:
        if _ident(row) == ident:
            found = history.all_histories({row["topic"]}).get(row["topic"])
            if isinstance(found, history.TableHistory):
                return row, found
            raise HTTPException(503, found.error if found else f"{ident}: no history")
    raise HTTPException(404, f"{ident} is not the table of a table topic")


def _dag_run(row: dict[str, Any], round_id: str | None, up: str) -> str:
    """Where the round's DAG run is: a run id in the round id (``topic@run_id``) links to that run;
    a scheduled round (``topic@<interval end ms>``) to the DAG's runs, with its interval's end."""
    runs = html.escape(f"{up}{row['dag_runs_url']}")
    suffix = (round_id or "").rpartition("@")[2]
    if not suffix:
        return f'<a href="{runs}" target="_top">{html.escape(row["dag_id"])}</a>'
    if suffix.isdigit():
        return (
            f'<a href="{runs}" target="_top">{html.escape(row["dag_id"])}</a>'
            f"<br><small>run of the interval ending {_time(int(suffix))}</small>"
        )
    run = html.escape(f"{up}{row['dag_runs_url']}/{suffix}")
    return f'<a href="{run}" target="_top">{html.escape(suffix)}</a>'


def _offsets(before: dict[str, int], after: dict[str, int]) -> str:
    return "<br>".join(
        f"p{html.escape(p)}: {before.get(p, 0)} → {after[p]} (+{after[p] - before.get(p, 0)})"
        for p in sorted(after, key=int)
    )


@app.get("/tables/{ident}", response_class=HTMLResponse)
def table_page(user: auth.User, ident: str) -> str:
    """The table's charts and its commits of the last hours, newest first."""
    row, found = _table_of(user, ident)
    up = "../../"  # from /icefall/tables/<ident> to the Airflow UI's root
    rows = "".join(
        f'<tr><td>{_time(c.timestamp_ms)}</td><td class=mono><a href="{html.escape(ident)}/snapshots/{c.snapshot_id}">'
        f"{c.snapshot_id}</a></td><td class=num>{c.added_records:,}</td><td class=num>{c.added_files}</td>"
        f"<td class=num>{_bytes(c.added_bytes)}</td><td class=mono>{_offsets(c.offsets_before, c.offsets_after)}</td>"
        f"<td>{_dag_run(row, c.round_id, up)}</td></tr>"
        for c in reversed(found.commits)
    )
    return f"""{_head(f"{ident} · Icefall", refresh=False)}
<p><small><a href="../">Table topics</a> · topic <b>{html.escape(row["topic"])}</b></small></p>
<h2 class=mono>{html.escape(ident)}</h2>
<div class="chart-row">{chart_svgs(found, f"{ident}/snapshots/")}</div>
<h3>Commits of the last {WINDOW_HOURS} h</h3>
<table class="commits"><thead><tr><th>committed</th><th>snapshot</th><th class=num>rows</th><th class=num>files</th>
<th class=num>bytes</th><th>offsets per partition</th><th>DAG run</th></tr></thead>
<tbody>{rows or '<tr><td colspan="7">No commits in the window.</td></tr>'}</tbody></table></body></html>"""


@app.get("/tables/{ident}/snapshots/{snapshot_id}", response_class=HTMLResponse)
def snapshot_page(user: auth.User, ident: str, snapshot_id: int) -> str:
    """One commit's numbers: offsets per partition, rows, files, bytes, round id, DAG run, summary."""
    row, found = _table_of(user, ident)
    commit = next((c for c in found.commits if c.snapshot_id == snapshot_id), None)
    if commit is None:
        raise HTTPException(
            404, f"snapshot {snapshot_id} is no commit of {ident} in the last {WINDOW_HOURS} h"
        )
    up = "../../../../"  # from /icefall/tables/<ident>/snapshots/<id> to the Airflow UI's root
    facts = [
        ("committed", _time(commit.timestamp_ms)),
        ("operation", html.escape(commit.operation or "—")),
        ("rows added", f"{commit.added_records:,}"),
        ("data files added", str(commit.added_files)),
        ("bytes added", f"{_bytes(commit.added_bytes)} ({commit.added_bytes:,} B)"),
        ("rows in the table", _cell(commit.total_records)),
        ("offsets per partition", _offsets(commit.offsets_before, commit.offsets_after)),
        ("round id", f"<span class=mono>{_cell(commit.round_id)}</span>"),
        ("DAG run", _dag_run(row, commit.round_id, up)),
    ]
    summary = "".join(
        f"<tr><td class=mono>{html.escape(k)}</td><td class=mono>{html.escape(v)}</td></tr>"
        for k, v in sorted(commit.summary.items())
    )
    name = html.escape(ident)
    return f"""{_head(f"snapshot {snapshot_id} · {ident}", refresh=False)}
<p><small><a href="../../../">Table topics</a> · <a href="../../{name}">{name}</a></small></p>
<h2>Snapshot <span class=mono>{snapshot_id}</span></h2>
<table class="snapshot"><tbody>{"".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)}</tbody></table>
<h3>Snapshot summary</h3>
<table class="summary"><tbody>{summary}</tbody></table></body></html>"""
