"""Tiny inline SVG sparklines for the status page.

Inline ``<svg>`` rather than images or a chart library: the page's Content-Security-Policy
(``default-src 'none'``) forbids fetching anything, and the page must work through an SSH
tunnel with nothing but a browser. A NaN or infinite value is the news (a NaN loss), so it
is drawn as a red tick where it happened instead of being silently dropped; a value the log
did not print (``None``) is a gap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

WIDTH = 120
HEIGHT = 28
PAD = 2.0


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def summary(values: Sequence[float | None]) -> str:
    """A one-line text summary (min, max, last), for the tooltip and for screen readers."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    bad = sum(1 for v in values if v is not None and not math.isfinite(v))
    if not finite:
        return f"{bad} non-finite value(s)" if bad else "no data"
    last = next((v for v in reversed(values) if v is not None), None)
    last_s = _fmt(last) if last is not None and math.isfinite(last) else str(last)
    text = f"min {_fmt(min(finite))}, max {_fmt(max(finite))}, last {last_s}"
    return text + (f", {bad} non-finite" if bad else "")


def sparkline(
    values: Sequence[float | None],
    *,
    title: str = "",
    width: int = WIDTH,
    height: int = HEIGHT,
    stroke: str = "#2a62c9",
) -> str:
    """An ``<svg>`` element, or ``""`` when there is nothing to draw.

    ``values`` are oldest first. The caller chooses how many (about one per pixel reads
    best); ``title`` becomes the tooltip and the accessible name, with the summary appended.
    """
    n = len(values)
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if n == 0 or (not finite and all(v is None for v in values)):
        return ""
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    span = hi - lo
    inner_w, inner_h = width - 2 * PAD, height - 2 * PAD

    def x_at(i: int) -> float:
        return PAD + (inner_w * i / (n - 1) if n > 1 else inner_w)

    def y_at(v: float) -> float:
        if span <= 0:
            return PAD + inner_h / 2  # a flat series is a line through the middle
        return PAD + inner_h * (1.0 - (v - lo) / span)

    segments: list[list[tuple[float, float]]] = [[]]
    ticks: list[float] = []
    for i, v in enumerate(values):
        if v is None or not math.isfinite(v):
            if v is not None:
                ticks.append(x_at(i))
            if segments[-1]:
                segments.append([])
            continue
        segments[-1].append((x_at(i), y_at(v)))
    parts: list[str] = []
    for seg in segments:
        if len(seg) >= 2:
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in seg)
            parts.append(f'<polyline points="{pts}" fill="none" stroke="{stroke}" stroke-width="1.3"/>')
        elif len(seg) == 1:
            x, y = seg[0]
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="1.2" fill="{stroke}"/>')
    for x in ticks:
        parts.append(
            f'<line class="nonfinite" x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height}" '
            'stroke="#d11" stroke-width="1.5"/>'
        )
    last = next(((i, v) for i, v in reversed(list(enumerate(values))) if v is not None), None)
    if last is not None and math.isfinite(last[1]):
        parts.append(f'<circle cx="{x_at(last[0]):.1f}" cy="{y_at(last[1]):.1f}" r="1.8" fill="{stroke}"/>')
    label = escape(f"{title}: {summary(values)}" if title else summary(values))
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{label}"><title>{label}</title>{"".join(parts)}</svg>'
    )
