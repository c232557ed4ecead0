"""Small charts as inline SVG, drawn on the server in Python.

Why SVG from Python and not a JavaScript chart library: the view is a page the
API server renders (no build step, no React app), the charts are a few dozen
points each, and an inline ``<svg>`` needs nothing downloaded or vendored, works
with scripts off, prints, and is checkable in the DOM by the tests (each chart
is an ``<svg class="chart" data-chart=...>`` with one ``<circle>`` or ``<rect>``
per point). Every number is escaped text or a float we computed.

Two kinds: a line over time (lag in records or seconds, a point per sample) and
bars over time (one bar per commit, linked to the commit's snapshot page).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

WIDTH, HEIGHT = 280, 110
LEFT, RIGHT, TOP, BOTTOM = 46, 8, 18, 18  # room for the axis labels and the title


@dataclass(frozen=True)
class Point:
    at_ms: int
    value: float
    label: str  # the tooltip
    href: str | None = None  # bars only: where clicking the bar goes


def _short(value: float) -> str:
    """1234 -> 1.2k: axis labels fit in the left margin."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M")


def _frame(kind: str, title: str, start_ms: int, end_ms: int, top: float, body: str) -> str:
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    return (
        f'<svg class="chart" data-chart="{html.escape(kind)}" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(title)}">'
        f'<text x="{x0}" y="12" class="title">{html.escape(title)}</text>'
        f'<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" class="axis"/>'
        f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" class="axis"/>'
        f'<text x="{x0 - 4}" y="{y0 + 8}" class="tick" text-anchor="end">{_short(top)}</text>'
        f'<text x="{x0 - 4}" y="{y1}" class="tick" text-anchor="end">0</text>'
        f'<text x="{x0}" y="{HEIGHT - 4}" class="tick">{_clock(start_ms)} UTC</text>'
        f'<text x="{x1}" y="{HEIGHT - 4}" class="tick" text-anchor="end">{_clock(end_ms)}</text>'
        f"{body}</svg>"
    )


def _scales(
    start_ms: int, end_ms: int, top: float
) -> tuple[Callable[[int], float], Callable[[float], float]]:
    span = max(end_ms - start_ms, 1)
    top = top or 1.0

    def x(ms: int) -> float:
        return LEFT + (WIDTH - RIGHT - LEFT) * (ms - start_ms) / span

    def y(value: float) -> float:
        return HEIGHT - BOTTOM - (HEIGHT - BOTTOM - TOP) * value / top

    return x, y


def line(kind: str, title: str, points: Sequence[Point], start_ms: int, end_ms: int) -> str:
    """A line through ``points`` (time-ordered), a dot with a tooltip at each."""
    top = max((p.value for p in points), default=0.0)
    x, y = _scales(start_ms, end_ms, top)
    xy = [(x(p.at_ms), y(p.value)) for p in points]
    path = " ".join(f"{px:.1f},{py:.1f}" for px, py in xy)
    dots = "".join(
        f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2"><title>{html.escape(p.label)}</title></circle>'
        for (px, py), p in zip(xy, points, strict=True)
    )
    body = (f'<polyline points="{path}" class="line"/>' if len(xy) > 1 else "") + dots
    if not points:
        body = f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" class="tick" text-anchor="middle">no data</text>'
    return _frame(kind, title, start_ms, end_ms, top, body)


def bars(kind: str, title: str, points: Sequence[Point], start_ms: int, end_ms: int) -> str:
    """A bar per point at its time, linked to ``href`` when it has one."""
    top = max((p.value for p in points), default=0.0)
    x, y = _scales(start_ms, end_ms, top)
    width = max(2.0, min(12.0, (WIDTH - LEFT - RIGHT) / max(len(points), 1) * 0.6))
    out = []
    for p in points:
        px, py = x(p.at_ms), y(p.value)
        height = max(HEIGHT - BOTTOM - py, 1.0)
        rect = (
            f'<rect x="{px - width / 2:.1f}" y="{HEIGHT - BOTTOM - height:.1f}" width="{width:.1f}" '
            f'height="{height:.1f}"><title>{html.escape(p.label)}</title></rect>'
        )
        out.append(f'<a href="{html.escape(p.href)}">{rect}</a>' if p.href else rect)
    body = "".join(out) or (
        f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" class="tick" text-anchor="middle">no commits</text>'
    )
    return _frame(kind, title, start_ms, end_ms, top, body)


STYLE = """
svg.chart { background: #fff; border: 1px solid #e2e8f0; border-radius: 4px; margin: 0 .5rem .5rem 0; }
svg.chart .title { font-size: 11px; fill: #2d3748; font-weight: 600; }
svg.chart .tick { font-size: 9px; fill: #718096; }
svg.chart .axis { stroke: #cbd5e0; }
svg.chart .line { fill: none; stroke: #3182ce; stroke-width: 1.5; }
svg.chart circle { fill: #3182ce; }
svg.chart rect { fill: #38a169; }
svg.chart a:hover rect { fill: #276749; }
"""
