"""The status page: server-rendered HTML with inline SVG sparklines, no scripts, no external assets.

It must work from a login node through an SSH tunnel with nothing but a browser, so it
refreshes itself with a meta tag, draws its charts as inline SVG (the page's CSP forbids
fetching anything), and escapes every value: findings, evidence, paths and node names come
from logs and the environment, so they are attacker-controllable text. Each value goes
through ``rankwatch.sanitize`` before HTML escaping: control characters and escape
sequences are shown, and bidi overrides cannot reorder what the reader sees (a copied
line pasted into a terminal carries no escape either).

``render_page(doc)`` needs only the ``/api/status`` document. What that document lacks —
the step history behind the sparklines, the dump store listing behind the dump links, GPU
samples — comes in an optional ``PageExtras``, gathered by ``load_page_extras(snapshot)``
(the store listing is disk I/O, so it runs in a thread). Dump links are relative URLs of
the JSON API (``api/dumps/<incident>/<rank>?format=text``): they sit under the same bearer
token rule as the page itself, so whoever can read the page can follow them, and the page
never needs — or shows — the token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape as _html
from typing import Any
from urllib.parse import quote

from rankwatch import offloop
from rankwatch.config.units import format_age
from rankwatch.events import GpuSample
from rankwatch.ranksets import describe_ranks
from rankwatch.records import StepRecord
from rankwatch.sanitize import visible, visible_lines
from rankwatch.server.sparkline import sparkline
from rankwatch.server.status import incident_doc
from rankwatch.snapshot import AgentSnapshot

log = logging.getLogger("rankwatch.server.page")


def escape(text: object) -> str:
    """One line of the job's text for HTML: shown (``rankwatch.sanitize``), then escaped."""
    return _html(visible(text))


def escape_lines(text: object) -> str:
    """As ``escape``, newlines kept (a ``<pre>`` block)."""
    return _html(visible_lines(text))


REFRESH_S = 10
SPARK_POINTS = 120  # step lines per sparkline: about one per pixel
INCIDENTS_SHOWN = 8
RANK_LINKS = 8  # per incident: the report has the rest (4,096 links would be the page)
LIST_TIMEOUT_S = 5.0
EVIDENCE_CHARS = 4000
EVIDENCE_LINES = 40

# Throughput as the log prints it, best first; "steps/s" from the step time is the fallback
# every format has (Megatron prints no tokens/s but does print the iteration time).
THROUGHPUT_FIELDS = (("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s"), ("tflops", "TFLOP/s"))

_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right;vertical-align:top}
th{background:#f3f3f3}td.l,th.l{text-align:left}
tr.critical td{background:#fde2e2}tr.warning td{background:#fff4d6}
td.state{font-weight:600}td.state-stalled,td.state-exited{color:#b00}
td.spark{white-space:nowrap}svg.spark{display:block;margin-top:2px}
td.msg{max-width:60em;text-align:left}
details pre{white-space:pre-wrap;margin:.3em 0;font-size:12px;max-height:24em;overflow:auto}
.muted{color:#777}
"""


@dataclass
class Series:
    """One sparkline: the last step lines' values, oldest first (None: not printed)."""

    label: str
    values: list[float | None]


@dataclass
class PageExtras:
    """What the page shows beyond the status document; every part may be missing."""

    history: dict[int | None, dict[str, Series]] = field(default_factory=dict)
    incidents: list[dict[str, Any]] | None = None  # incident_doc() shape, newest first
    incidents_error: str | None = None
    gpus: dict[Any, list[GpuSample]] | None = None  # rank ("" when unknown) -> samples; None: no source
    gpu_up: bool = False
    gpu_error: str | None = None


# --- gathering ---------------------------------------------------------------------------
def _value(x: float | None) -> float | None:
    return None if x is None else float(x)


def rank_history(recs: Sequence[StepRecord], points: int = SPARK_POINTS) -> dict[str, Series]:
    """Loss and throughput series from the rank's newest step lines (oldest first)."""
    recs = recs[-points:]
    out: dict[str, Series] = {}
    loss = [_value(r.loss) for r in recs]
    if any(v is not None for v in loss):
        out["loss"] = Series("loss", loss)
    for name, label in THROUGHPUT_FIELDS:
        vals = [_value(getattr(r, name)) for r in recs]
        if any(v is not None for v in vals):
            out["throughput"] = Series(label, vals)
            break
    else:
        rate = [1.0 / r.step_time_s if r.step_time_s and r.step_time_s > 0 else None for r in recs]
        if any(v is not None for v in rate):
            out["throughput"] = Series("steps/s", rate)
    return out


def page_extras(
    snap: AgentSnapshot, incidents: list[dict[str, Any]] | None = None, incidents_error: str | None = None
) -> PageExtras:
    """The step history and GPU samples of the snapshot (one consistent moment of the loop)."""
    history: dict[int | None, dict[str, Series]] = {}
    for v in snap.ranks:
        if v.rank not in history and v.recent_steps:
            history[v.rank] = rank_history(v.recent_steps)
    g = snap.gpu
    gpus: dict[Any, list[GpuSample]] | None = None
    if g is not None:
        gpus = {k: list(samples) for k, samples in g.by_rank.items()}
    return PageExtras(
        history=history,
        incidents=incidents,
        incidents_error=incidents_error,
        gpus=gpus,
        gpu_up=g.up if g is not None else False,
        gpu_error=g.error if g is not None else None,
    )


async def load_page_extras(snap: AgentSnapshot) -> PageExtras:
    """The page's extras; the dump store is listed in a thread, bounded."""
    incidents: list[dict[str, Any]] | None = None
    error: str | None = None
    store = snap.dumps.store
    if store is not None:
        try:
            infos = await offloop.fs(
                store.list_incidents, name="rankwatch-dumps-list", timeout=LIST_TIMEOUT_S
            )
            incidents = [incident_doc(i) for i in infos]
        except asyncio.TimeoutError:
            error = f"listing the dump store took over {LIST_TIMEOUT_S:.0f}s"
        except Exception as e:
            log.debug("listing dumps for the page failed", exc_info=True)
            error = f"cannot list the dump store ({type(e).__name__})"
    return page_extras(snap, incidents, error)


# --- formatting --------------------------------------------------------------------------
def _num(x: Any, fmt: str = "{:.4g}") -> str:
    if x is None:
        return "–"
    if isinstance(x, str):
        return x  # "NaN" / "Infinity" from json_safe
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    try:
        return fmt.format(x)
    except (ValueError, TypeError):
        return str(x)


def _bytes(x: float | None) -> str:
    if x is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024:
            return f"{x:.0f} {unit}"
        x /= 1024
    return f"{x:.1f} TiB"


def _rate(x: float | None) -> str:
    if x is None:
        return "–"
    if not math.isfinite(x):
        return str(x)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _row(cells: list[str], cls: str = "", attrs: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<tr{attr}{attrs}>" + "".join(cells) + "</tr>"


def _td(text: str, left: bool = False) -> str:
    return f'<td class="l">{escape(text)}</td>' if left else f"<td>{escape(text)}</td>"


def _sev(s: str) -> int:
    return {"info": 0, "warning": 1, "critical": 2}.get(s, -1)


def _rank_text(rank: Any) -> str:
    return str(rank) if rank is not None else "?"


def _dump_href(incident: str, rank: int) -> str:
    """Relative, so it works behind a reverse proxy's path prefix; quoted, then escaped."""
    return escape(f"api/dumps/{quote(incident, safe='')}/{int(rank)}?format=text")


# --- sections ----------------------------------------------------------------------------
def _state(r: dict[str, Any]) -> str:
    proc = r.get("process") or {}
    if r.get("stalled"):
        return "stalled"
    if proc.get("exited"):
        return "exited"
    if r.get("step") is None:
        return "starting"
    return "running"


def _spark_cell(series: Series | None, latest: str) -> str:
    svg = sparkline(series.values[-SPARK_POINTS:], title=series.label) if series is not None else ""
    return f'<td class="spark">{escape(latest)}{svg}</td>'


def _gpu_line(s: GpuSample) -> str:
    idx = s.index
    if s.lost:
        return f"GPU{idx} LOST"
    parts = [f"GPU{idx}"]
    util = s.utilization
    if util is not None:
        parts.append(f"{util * 100:.0f}%")
    used, total = s.memory_used, s.memory_total
    if used is not None and total:
        parts.append(f"{used / 2**30:.1f}/{total / 2**30:.0f} GiB")
    temp = s.temperature
    if temp is not None:
        parts.append(f"{temp:.0f}°C")
    return " ".join(parts)


def _rank_row(r: dict[str, Any], extras: PageExtras | None, dumps: dict[int, dict[str, Any]]) -> str:
    rank = r["rank"]
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
    state = _state(r)
    rates = r["rates"]
    hist = (extras.history.get(rank) if extras is not None else None) or {}
    thr = hist.get("throughput")
    if thr is not None:
        last = next((v for v in reversed(thr.values) if v is not None), None)
        thr_text = f"{_rate(last)} {thr.label}"
    else:  # no history yet: the latest rate the log gave, else steps/s from the step times
        known = [(rates.get(k), unit) for k, unit in (*THROUGHPUT_FIELDS, ("steps_per_s", "steps/s"))]
        value, unit = next(((v, u) for v, u in known if v is not None), (None, ""))
        thr_text = f"{_rate(value)} {unit}" if value is not None else "–"
    cells = [
        _td(_rank_text(rank), left=True),
        _td(r["node"], left=True),
        f'<td class="l state state-{state}">{escape(state.upper() if state == "stalled" else state)}</td>',
        _td(step),
        _td(format_age(r["seconds_since_progress"])),
        _td(format_age(r["stall_timeout_s"])),
        _spark_cell(hist.get("loss"), _num(r["loss"])),
        _spark_cell(thr, thr_text),
        _td(_num(rates["step_time_s"], "{:.3g}s")),
        _td(format_age(rates["eta_s"])),
        _td(pstate, left=True),
        _td(_num(proc.get("cpu_percent"), "{:.0f}%")),
        _td(_bytes(proc.get("rss_bytes"))),
    ]
    if extras is not None and extras.gpus is not None:
        lines = [_gpu_line(s) for s in extras.gpus.get(rank, [])]
        cells.append('<td class="l">' + ("<br>".join(escape(x) for x in lines) or "–") + "</td>")
    kinds = sorted({f["kind"] for f in r["active_findings"]})
    cells.append(_td(", ".join(kinds) or "–", left=True))
    inc = dumps.get(rank) if isinstance(rank, int) else None
    if inc is not None:
        text = f"{inc['reason']} {inc['time'][11:19]}" if len(inc["time"]) >= 19 else inc["reason"]
        href = _dump_href(inc["incident"], rank)
        cells.append(f'<td class="l"><a class="dump" href="{href}">{escape(text)}</a></td>')
    else:
        cells.append(_td("–", left=True))
    rid = escape(_rank_text(rank))
    attrs = f' id="rank-{rid}" data-rank="{rid}" data-state="{state}"'
    return _row(cells, " ".join(x for x in (worst, "rank") if x), attrs)


def _ranks_table(doc: dict[str, Any], extras: PageExtras | None) -> str:
    heads = ["rank", "node", "state", "step", "since&nbsp;progress", "stall&nbsp;timeout", "loss"]
    heads += ["throughput", "step&nbsp;time", "ETA", "process", "CPU", "RSS"]
    if extras is not None and extras.gpus is not None:
        heads.append("GPU")
    heads += ["active", "stack&nbsp;dump"]
    left = {"rank", "node", "state", "process", "GPU", "active", "stack&nbsp;dump"}
    th = "".join(f'<th class="l">{h}</th>' if h in left else f"<th>{h}</th>" for h in heads)
    dumps: dict[int, dict[str, Any]] = {}
    for inc in (extras.incidents or []) if extras is not None else []:
        for rk in inc["ranks"]:
            dumps.setdefault(rk, inc)  # newest first: the first one seen is the latest
    rows = "".join(_rank_row(r, extras, dumps) for r in doc["ranks"]) or (
        f'<tr><td class="l muted" colspan="{len(heads)}">no rank watched yet</td></tr>'
    )
    return f"<table><tr>{th}</tr>{rows}</table>"


def _evidence_text(ev: Mapping[Any, Any]) -> str:
    lines: list[str] = []
    for k, v in ev.items():
        if isinstance(v, (list, tuple)):
            if v and all(isinstance(x, str) for x in v):
                lines.append(f"{k}:")
                lines.extend("  " + x.rstrip("\n") for x in v[:EVIDENCE_LINES])
                if len(v) > EVIDENCE_LINES:
                    lines.append(f"  … {len(v) - EVIDENCE_LINES} more line(s)")
            else:
                shown = ", ".join(_num(x) for x in v[:32]) + (", …" if len(v) > 32 else "")
                lines.append(f"{k}: [{shown}]")
        elif isinstance(v, Mapping):
            lines.append(f"{k}: {json.dumps(v, default=str)}")
        else:
            lines.append(f"{k}: {_num(v)}")
    text = "\n".join(lines)
    if len(text) > EVIDENCE_CHARS:
        text = text[:EVIDENCE_CHARS] + f"\n… ({len(text) - EVIDENCE_CHARS} more characters)"
    return text


def _diagnosis_text(d: Any) -> str:
    """The cross-rank judgement in the words of the alert title: the same typed data."""
    if not isinstance(d, Mapping):
        return ""
    parts: list[str] = []
    if isinstance(d.get("suspect"), int):
        parts.append(f"suspect rank {d['suspect']}")
    ff = d.get("first_failure")
    if isinstance(ff, Mapping) and isinstance(ff.get("rank"), int):
        parts.append(f"first failure: rank {ff['rank']} ({ff.get('kind')})")
    missing = d.get("missing")
    if isinstance(missing, list) and missing:
        ranks = [x for x in missing if isinstance(x, int) and not isinstance(x, bool)]
        parts.append("no stack from " + describe_ranks(ranks))
    if isinstance(d.get("world_size"), int):
        parts.append(f"world size {d['world_size']}")
    return "; ".join(parts)


def _message_cell(f: dict[str, Any]) -> str:
    ev = f.get("evidence") or {}
    diag = _diagnosis_text(f.get("diagnosis"))
    details = f'<div class="diag">{escape(diag)}</div>' if diag else ""
    if isinstance(ev, Mapping) and ev:
        opened = " open" if f["severity"] == "critical" else ""
        text = escape_lines(_evidence_text(ev))
        details += f"<details{opened}><summary>evidence</summary><pre>{text}</pre></details>"
    return f'<td class="msg">{escape(str(f["message"]))}{details}</td>'


def _findings_table(doc: dict[str, Any]) -> str:
    rows = []
    for f in doc["active_findings"]:
        where = f.get("path") or ""
        if where and f.get("line") is not None:
            where += f":{f['line']}"
        cells = [
            _td(f["severity"], left=True),
            _td(f["kind"], left=True),
            _td(_rank_text(f["rank"])),
            _td(_num(f["step"], "{}")),
            _td(f["time_iso"] or "–", left=True),
            _td(where or "–", left=True),
            _message_cell(f),
        ]
        rows.append(_row(cells, f["severity"]))
    if not rows:
        return '<p class="muted">none</p>'
    return (
        '<table><tr><th class="l">severity</th><th class="l">kind</th><th>rank</th><th>step</th>'
        '<th class="l">time</th><th class="l">log</th><th class="l">message</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def _dumps_section(doc: dict[str, Any], extras: PageExtras | None) -> str:
    if extras is None or (extras.incidents is None and extras.incidents_error is None):
        return f'<p class="muted">dumps captured by this agent: {int(doc.get("dumps_captured") or 0)}</p>'
    if extras.incidents_error:
        return f'<p class="muted">{escape(extras.incidents_error)}</p>'
    incidents = extras.incidents or []
    if not incidents:
        return '<p class="muted">none</p>'
    rows = []
    for inc in incidents[:INCIDENTS_SHOWN]:
        ranks = list(inc["ranks"])
        links = " · ".join(
            f'<a href="{_dump_href(inc["incident"], rk)}">rank {int(rk)}</a>' for rk in ranks[:RANK_LINKS]
        )
        if len(ranks) > RANK_LINKS:
            links += f" · … ({escape(describe_ranks(ranks))}: all in the report)"
        report = escape(f"incidents/{quote(inc['incident'], safe='')}?run={quote(inc['run'], safe='')}")
        cells = [
            f'<td class="l"><a class="report" href="{report}">{escape(inc["incident"])}</a></td>',
            _td(inc["run"], left=True),
            _td(inc["reason"], left=True),
            _td(inc["time"], left=True),
            f'<td class="l">{links or "–"}</td>',
        ]
        rows.append(_row(cells))
    more = len(incidents) - INCIDENTS_SHOWN
    tail = f'<p class="muted">{more} older incident(s): see api/dumps</p>' if more > 0 else ""
    return (
        '<table><tr><th class="l">incident (report)</th><th class="l">run</th><th class="l">reason</th>'
        '<th class="l">time</th><th class="l">stacks (text)</th></tr>' + "".join(rows) + "</table>" + tail
    )


def _gpu_section(extras: PageExtras | None) -> str:
    if extras is None or extras.gpus is None:
        return ""
    head = "<h2>GPUs</h2>"
    if extras.gpu_error:
        return head + f'<p class="muted">{escape(extras.gpu_error)}</p>'
    samples = [(rank, s) for rank, ss in extras.gpus.items() for s in ss]
    if not samples:
        why = "no GPU sampled yet" if extras.gpu_up else "GPU sampler down"
        return head + f'<p class="muted">{why}</p>'
    rows = []
    for rank, s in sorted(samples, key=lambda rs: rs[1].index):
        used, total = s.memory_used, s.memory_total
        power, limit = s.power, s.power_limit
        util = s.utilization
        throttle = s.throttle or {}
        active = ", ".join(k for k, on in throttle.items() if on and k != "gpu_idle")
        xids = s.xid_counts or {}
        lost = s.lost
        cells = [
            _td(_rank_text(rank if rank != "" else None), left=True),
            _td(str(s.index)),
            _td(s.name or "–", left=True),
            _td("LOST: " + str(s.lost_reason or "") if lost else "ok", left=True),
            _td(f"{util * 100:.0f}%" if util is not None else "–"),
            _td(f"{_bytes(used)} / {_bytes(total)}" if used is not None and total else "–"),
            _td(_num(s.temperature, "{:.0f}°C")),
            _td(f"{_num(power, '{:.0f}')} / {_num(limit, '{:.0f}')} W" if power is not None else "–"),
            _td(active or "–", left=True),
            _td(", ".join(f"{x}×{n}" for x, n in sorted(xids.items())) or "–", left=True),
        ]
        rows.append(_row(cells, "critical" if lost else ""))
    th = (
        '<tr><th class="l">rank</th><th>GPU</th><th class="l">name</th><th class="l">state</th><th>util</th>'
        '<th>memory</th><th>temp</th><th>power</th><th class="l">throttling</th><th class="l">Xid</th></tr>'
    )
    return head + f"<table>{th}{''.join(rows)}</table>"


def render_page(doc: dict[str, Any], extras: PageExtras | None = None) -> str:
    """The whole page from a ``status_doc`` (and, when given, the extras)."""
    ready = "ready" if doc["ready"] else "not ready: " + "; ".join(doc["ready_detail"])
    title = f"rankwatch: {doc['run']} on {doc['node']}"
    stalled = [r["rank"] for r in doc["ranks"] if r.get("stalled")]
    known = [r for r in stalled if isinstance(r, int)]
    who = describe_ranks(known) if known else "rank ?"
    banner = f'<p class="state-stalled"><strong>STALLED: {escape(who)}</strong></p>' if stalled else ""
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH_S}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        f'<p class="muted">rankwatch {escape(doc["version"])} · {escape(doc["time"] or "")} · '
        f"up {format_age(doc['uptime_s'])} · {escape(ready)} · "
        f"dumps captured: {int(doc['dumps_captured'] or 0)}"
        + (f" (last: {escape(doc['last_incident'])})" if doc["last_incident"] else "")
        + "</p>"
        + banner
        + f"<h2>Ranks</h2>{_ranks_table(doc, extras)}"
        f"<h2>Active findings</h2>{_findings_table(doc)}"
        + _gpu_section(extras)
        + f"<h2>Stack dumps</h2>{_dumps_section(doc, extras)}"
        '<p class="muted">JSON: <a href="api/status">api/status</a> · <a href="api/findings">api/findings</a>'
        ' · <a href="api/dumps">api/dumps</a> · <a href="metrics">metrics</a></p>'
        "</body></html>\n"
    )
