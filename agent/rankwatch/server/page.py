"""The status page: one server-rendered table, no scripts, no external assets.

It must work from a login node through an SSH tunnel with nothing but a browser, so it
refreshes itself with a meta tag and every value is escaped (log text reaches it).
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

REFRESH_S = 10

_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}
tr.critical td{background:#fde2e2}tr.warning td{background:#fff4d6}
.muted{color:#777}
"""


def _num(x: Any, fmt: str = "{:.4g}") -> str:
    if x is None:
        return "–"
    if isinstance(x, str):
        return x  # "NaN" / "Infinity" from json_safe
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return fmt.format(x)


def _secs(x: float | None) -> str:
    if x is None:
        return "–"
    if x < 120:
        return f"{x:.0f}s"
    if x < 7200:
        return f"{x / 60:.0f}m"
    return f"{x / 3600:.1f}h"


def _bytes(x: float | None) -> str:
    if x is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024:
            return f"{x:.0f} {unit}"
        x /= 1024
    return f"{x:.1f} TiB"


def _row(cells: list[str], cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<tr{attr}>" + "".join(cells) + "</tr>"


def _td(text: str, left: bool = False) -> str:
    return f'<td class="l">{escape(text)}</td>' if left else f"<td>{escape(text)}</td>"


def _rank_row(r: dict[str, Any]) -> str:
    step = _num(r["step"], "{}")
    if r["total_steps"]:
        step += f" / {r['total_steps']}"
    proc = r.get("process") or {}
    if not proc:
        pstate = "not attached"
    elif not proc.get("sampled"):
        pstate = f"pid {proc['pid']}"
    else:
        pstate = f"{proc.get('state', '?')} (pid {proc['pid']})"
    worst = max((f["severity"] for f in r["active_findings"]), key=_sev, default="")
    stalled = " STALLED" if r.get("stalled") else ""
    rates = r["rates"]
    cells = [
        _td(str(r["rank"]) if r["rank"] is not None else "?", left=True),
        _td(r["node"], left=True),
        _td(step),
        _td(_num(r["loss"])),
        _td(_num(rates["tokens_per_s"], "{:.0f}")),
        _td(_num(rates["step_time_s"], "{:.3g}s")),
        _td(_secs(rates["eta_s"])),
        _td(_secs(r["seconds_since_progress"]) + stalled),
        _td(_secs(r["stall_timeout_s"])),
        _td(pstate, left=True),
        _td(_num(proc.get("cpu_percent"), "{:.0f}%")),
        _td(_bytes(proc.get("rss_bytes"))),
        _td(", ".join(sorted({f["kind"] for f in r["active_findings"]})) or "–", left=True),
    ]
    return _row(cells, worst)


def _sev(s: str) -> int:
    return {"info": 0, "warning": 1, "critical": 2}.get(s, -1)


def render_page(doc: dict[str, Any]) -> str:
    heads = ["rank", "node", "step", "loss", "tokens/s", "step&nbsp;time", "ETA"]
    heads += ["since&nbsp;progress", "stall&nbsp;timeout", "process", "CPU", "RSS", "active"]
    left = {"rank", "node", "process", "active"}
    th = "".join(f'<th class="l">{h}</th>' if h in left else f"<th>{h}</th>" for h in heads)
    ranks = "".join(_rank_row(r) for r in doc["ranks"]) or (
        f'<tr><td class="l muted" colspan="{len(heads)}">no rank watched yet</td></tr>'
    )
    findings = "".join(
        _row(
            [
                _td(f["severity"], left=True),
                _td(f["kind"], left=True),
                _td(str(f["rank"]) if f["rank"] is not None else "?"),
                _td(_num(f["step"], "{}")),
                _td(f["time_iso"] or "–", left=True),
                _td(f["message"], left=True),
            ],
            f["severity"],
        )
        for f in doc["active_findings"]
    )
    findings_table = (
        '<table><tr><th class="l">severity</th><th class="l">kind</th><th>rank</th><th>step</th>'
        f'<th class="l">time</th><th class="l">message</th></tr>{findings}</table>'
        if findings
        else '<p class="muted">none</p>'
    )
    ready = "ready" if doc["ready"] else "not ready: " + "; ".join(doc["ready_detail"])
    title = f"rankwatch: {doc['run']} on {doc['node']}"
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH_S}">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        f'<p class="muted">rankwatch {escape(doc["version"])} · {escape(doc["time"] or "")} · '
        f"up {_secs(doc['uptime_s'])} · {escape(ready)} · dumps captured: {doc['dumps_captured']}"
        + (f" (last: {escape(doc['last_incident'])})" if doc["last_incident"] else "")
        + "</p>"
        f"<h2>Ranks</h2><table><tr>{th}</tr>{ranks}</table>"
        f"<h2>Active findings</h2>{findings_table}"
        '<p class="muted">JSON: <a href="api/status">api/status</a> · <a href="api/findings">api/findings</a>'
        ' · <a href="api/dumps">api/dumps</a> · <a href="metrics">metrics</a></p>'
        "</body></html>\n"
    )
