"""The incident report as one self-contained HTML page: inline CSS and SVG, no script, no fetch.

It opens from a ``file://`` URL on a laptop and from the agent's token-protected route alike
(whose CSP allows nothing but inline style), so everything it shows is in the page: the
verdict first, a timeline drawn in SVG, the ranks' stacks merged into one tree, then the
evidence. Every string that came from a log, a stack or the environment goes through
``escape.h``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from rankwatch.ranksets import describe_ranks
from rankwatch.report.escape import h
from rankwatch.report.model import Report, StackNode, utc

# Past this many frames in a row that every rank shares and nobody wrote (bootstrap,
# threading, multiprocessing), the middle ones fold away.
FOLD_LIBRARY_RUN = 4
TREE_MAX_LINES = 600
READINGS_SHOWN = 16
_HIT_RE = re.compile(
    r"Traceback|Error|error:|Exception|NCCL|Watchdog|timed? ?out|Killed|SIGKILL|SIGTERM|OOM|out of memory|"
    r"Connection (closed|reset)",
    re.I,
)

_STYLE = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#1d1d1f;background:#fff}
main{max-width:1180px;margin:0 auto;padding:16px;overflow-wrap:break-word}
h1{font-size:20px;margin:.2em 0}h2{font-size:17px;margin:1.4em 0 .4em;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:1em 0 .3em}
.muted{color:#6b6b6b}.mono,pre,code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.wrap{overflow-wrap:anywhere;word-break:break-word}
.verdict{border:2px solid #c62828;border-radius:8px;padding:10px 14px;background:#fff5f5}
.verdict.none{border-color:#8a6d00;background:#fffbea}
.verdict .headline{font-size:20px;font-weight:700;color:#b71c1c;margin:.1em 0 .3em}
.verdict.none .headline{color:#6b5300}
.verdict ul{margin:.3em 0;padding-left:1.2em}.verdict li{margin:.15em 0}
.tag{display:inline-block;font-size:11px;font-weight:700;text-transform:uppercase;border-radius:3px;
 padding:0 5px;margin-right:4px;vertical-align:1px}
.tag.sus{background:#c62828;color:#fff}.tag.con{background:#e0e0e0;color:#333}.tag.fail{background:#6a1b9a;color:#fff}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;max-width:100%}
table{border-collapse:collapse;margin:.4em 0 1em;width:100%}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f4f4f4;font-weight:600}td:not(.wrap),th{white-space:nowrap}
tr.suspect td{background:#ffe3e3;font-weight:600}tr.failed td{background:#f3e5f5}
td.num{text-align:right;white-space:nowrap}#ranks td:first-child{white-space:nowrap}
svg.timeline{display:block;font:12px system-ui,sans-serif}
.tree{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.tree .n{display:flex;align-items:center;gap:6px;padding:1px 0;min-width:0}
.tree .bar{flex:0 0 64px;height:10px;background:#e8e8e8;border-radius:2px;overflow:hidden}
.tree .bar i{display:block;height:100%;background:#7a8ca5}
.tree .sus .bar i{background:#c62828}
.tree .c{flex:0 0 auto;min-width:3.2em;text-align:right;color:#555}
.tree .l{min-width:0;overflow-wrap:anywhere}
.tree .sus>.l{color:#b71c1c;font-weight:600}
.tree .div{background:#fff3c4;border-radius:3px}
.tree .nat>.l{color:#777;font-style:italic}
.tree .br{margin-left:14px;padding-left:8px;border-left:2px solid #e2e2e2}
.tree .br.sus{border-left-color:#e57373}
.tree details>summary{cursor:pointer;color:#666;font-style:italic;list-style-position:inside}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f7f7f7;border:1px solid #e4e4e4;
 padding:6px 8px;max-height:28em;overflow:auto;margin:.3em 0}
pre .hit{background:#ffe0e0;display:block}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:.3em 0}
dl.kv dt{color:#555}dl.kv dd{margin:0;overflow-wrap:anywhere}
.legend span{margin-right:14px;white-space:nowrap;display:inline-block}
@media (max-width:600px){main{padding:10px}
 table.cards,table.cards tbody,table.cards tr,table.cards td{display:block;width:auto}
 table.cards tr:first-child{display:none}
 table.cards tr{border:1px solid #ddd;margin:0 0 6px;border-radius:4px}
 table.cards td{border:0;padding:1px 8px;text-align:left;white-space:normal}
 table.cards td[data-label]::before{content:attr(data-label) ": ";color:#666}
 table.cards td:empty{display:none}.verdict .headline{font-size:18px}
 .tree .bar{flex-basis:36px}.tree .br{margin-left:6px;padding-left:5px}}
"""


def _ul(items: list[str], cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<ul{attr}>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else ""


# --- verdict -----------------------------------------------------------------------------
def _verdict(rep: Report) -> str:
    v = rep.verdict
    none = "" if v.suspects or v.flight_suspects else " none"
    suspects = v.suspects or v.flight_suspects
    items: list[str] = []
    if v.suspect_doing:
        items.append(f'<strong>What it was doing:</strong> <span class="wrap">{h(v.suspect_doing)}</span>')
    if v.suspect_worker:
        items.append(
            f'<strong>Its DataLoader worker:</strong> <span class="wrap">{h(v.suspect_worker)}</span>'
        )
    row = next((r for r in rep.rows if set(v.suspects) & set(r.ranks)), None)
    if row is not None and row.last_step is not None:
        items.append(f"<strong>Last step:</strong> {row.last_step}")
    f = v.first_failure
    if f is not None:
        items.append(
            f"<strong>First failure across ranks:</strong> rank {f.rank}, {h(f.kind)} at "
            f'<span class="mono">{h(utc(f.time, date=True))}</span>: <span class="wrap">{h(f.how)}</span>'
            + (f' (log <span class="mono wrap">{h(f.log)}</span>)' if f.log else "")
        )
    else:
        items.append(
            '<strong>First failure across ranks:</strong> <span class="muted">none recorded (no rank of '
            "this run reported a crash, OOM or fatal error in the incident's window)</span>"
        )
    if v.mismatch:
        rows = "".join(
            f'<tr><td>{h(describe_ranks(s.ranks, limit=8))}</td><td class="wrap">{h(s.collective)}</td>'
            f'<td class="mono wrap">{h(s.call_site)}</td></tr>'
            for s in v.mismatch
        )
        items.append(
            "<strong>Collective mismatch:</strong> the ranks called different collectives; "
            "compare the call sites"
            '<div class="scroll"><table><tr><th>ranks</th><th>collective</th><th>called from</th></tr>'
            f"{rows}</table></div>"
        )
    if v.not_dumped:
        items.append(f"<strong>No stack dump from:</strong> {h(describe_ranks(v.not_dumped, limit=8))}")
    if v.flight and v.kind != "flight_recorder":  # else it is the verdict's own line above
        items.append(f'<strong>Flight Recorder:</strong> <span class="wrap">{h(v.flight)}</span>')
    cons = [
        f'<span class="tag con">consequence</span><span class="wrap">{h(c)}</span>' for c in v.consequences
    ]
    return (
        f'<section id="verdict" class="verdict{none}" data-suspects="{h(",".join(map(str, suspects)))}">'
        f'<div class="headline">{h(v.headline[:1].upper() + v.headline[1:])}</div>'
        + (f'<div class="why wrap">{h(v.why)}</div>' if v.why else "")
        + _ul(items)
        + (f"<h3>Consequences, not causes</h3>{_ul(cons)}" if cons else "")
        + "</section>"
    )


# --- timeline ----------------------------------------------------------------------------
def _ticks(t0: float, t1: float) -> list[float]:
    span = t1 - t0
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if span / step <= 8:
            break
    first = (int(t0 // step) + 1) * step
    return [float(x) for x in range(int(first), int(t1) + 1, step)]


def _timeline(rep: Report) -> str:
    rows = rep.rows
    times = [t for r in rows for t in ([s[1] for s in r.steps] + [r.dumped_at, r.failed_at]) if t is not None]
    if not rows:
        return '<p class="muted">no rank in this incident</p>'
    untimed = not times
    if untimed:  # rows and states still show the odd rank; there is no axis to draw
        times = [0.0]
    t0, t1 = min(times), max(times)
    if t1 - t0 < 10:
        mid = (t0 + t1) / 2
        t0, t1 = mid - 5, mid + 5
    pad = (t1 - t0) * 0.04
    t0, t1 = t0 - pad, t1 + pad
    label_w, plot_w, right_w, row_h, top = 170, 640, 150, 24, 26
    width = label_w + plot_w + right_w
    height = top + row_h * len(rows) + 8

    def x(t: float) -> float:
        return round(label_w + (t - t0) / (t1 - t0) * plot_w, 1)

    parts = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="timeline of the ranks">'
    ]
    for t in [] if untimed else _ticks(t0, t1):
        parts.append(
            f'<line x1="{x(t)}" y1="{top - 4}" x2="{x(t)}" y2="{height - 4}" stroke="#eee"/>'
            f'<text x="{x(t)}" y="{top - 8}" text-anchor="middle" fill="#777">'
            f"{h(utc(t).replace(' UTC', ''))}</text>"
        )
    colour = {
        "suspect": "#c62828",
        "failed": "#6a1b9a",
        "waiting": "#5c6f8a",
        "other": "#8a6d00",
        "no dump": "#999",
    }
    for i, r in enumerate(rows):
        y = top + i * row_h
        mid = y + row_h / 2
        c = colour.get(r.state, "#555")
        ranks_attr = h(",".join(map(str, r.ranks[:64])))
        parts.append(f'<g class="row {h(r.state)}" data-ranks="{ranks_attr}" data-state="{h(r.state)}">')
        if r.state == "suspect":
            parts.append(f'<rect x="0" y="{y}" width="{width}" height="{row_h}" fill="#ffe3e3"/>')
        elif i % 2:
            parts.append(f'<rect x="0" y="{y}" width="{width}" height="{row_h}" fill="#fafafa"/>')
        weight = ' font-weight="700"' if r.state == "suspect" else ""
        parts.append(f'<text x="6" y="{mid + 4}" fill="{c}"{weight}>{h(_short(r.label, 24))}</text>')
        if r.steps:
            xs = [x(t) for _, t in r.steps]
            parts.append(
                f'<line x1="{xs[0]}" y1="{mid}" x2="{xs[-1]}" y2="{mid}" stroke="#9fb3cf" stroke-width="3"/>'
            )
            for (step, _t), px in zip(r.steps, xs, strict=True):
                parts.append(
                    f'<circle cx="{px}" cy="{mid}" r="2.6" fill="#3d5a80"><title>step {step}</title></circle>'
                )
            last_x = xs[-1]
            end = r.failed_at or r.dumped_at
            if end is not None and x(end) > last_x:
                parts.append(
                    f'<line x1="{last_x}" y1="{mid}" x2="{x(end)}" y2="{mid}" stroke="{c}" '
                    'stroke-width="2" stroke-dasharray="4 3"/>'
                )
        if r.failed_at is not None:
            fx = x(r.failed_at)
            parts.append(
                f'<path d="M{fx - 5},{mid - 5}L{fx + 5},{mid + 5}M{fx - 5},{mid + 5}L{fx + 5},{mid - 5}" '
                f'stroke="#6a1b9a" stroke-width="2.5"><title>{h(r.failure or "failed")}</title></path>'
            )
        if r.dumped_at is not None:
            dx = x(r.dumped_at)
            parts.append(
                f'<path d="M{dx},{mid - 6}L{dx + 6},{mid}L{dx},{mid + 6}L{dx - 6},{mid}Z" fill="{c}">'
                f"<title>stacks dumped {h(utc(r.dumped_at))}</title></path>"
            )
        if r.last_step is not None:
            step_text = f"step {r.last_step}"
        elif r.collective is not None:
            step_text = f"entered collective #{r.collective}"
        else:
            step_text = "step not recorded"
        parts.append(f'<text x="{label_w + plot_w + 10}" y="{mid + 4}" fill="#444">{h(step_text)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    legend = (
        '<p class="legend muted"><span>● a step (where its time was recorded)</span> '
        "<span>- - - silent until</span> <span>◆ stacks dumped</span> <span>✕ failed</span> "
        '<span style="color:#c62828">red: suspect</span></p>'
    )
    grouped = (
        f'<p class="muted">{len(rep.ranks):,} ranks: one row per group of ranks with the same stack, '
        "step and fate</p>"
        if rep.rows_grouped
        else ""
    )
    no_steps = (
        '<p class="muted">step times: not recorded (these dumps hold no <code>recent_steps</code>: '
        "only the dump moments are drawn)</p>"
        if not any(r.steps for r in rows)
        else ""
    )
    if untimed:
        no_steps = '<p class="muted">times: not recorded for any rank (no dump, step or failure time)</p>'
    return grouped + f'<div class="scroll">{"".join(parts)}</div>' + legend + no_steps


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _rank_table(rep: Report, link: Callable[[int], str] | None) -> str:
    out = []
    for r in rep.rows:
        tag = {
            "suspect": '<span class="tag sus">suspect</span>',
            "failed": '<span class="tag fail">failed</span>',
        }
        links = ""
        if link is not None and len(r.ranks) <= 4:
            links = " ".join(
                f'<a href="{h(link(rk))}">stacks</a>'
                for rk in r.ranks
                if rk in rep.diff.activities or rk in rep.diff.failed
            )
        dumped = utc(r.dumped_at) if r.dumped_at is not None else "–"
        step = str(r.last_step) if r.last_step is not None else "–"
        ranks_attr = h(",".join(map(str, r.ranks[:64])))
        first = r.ranks[0]
        out.append(
            f'<tr class="{h(r.state.replace(" ", "-"))}" data-rank="{first}" data-ranks="{ranks_attr}" '
            f'data-state="{h(r.state)}"><td>{tag.get(r.state, "")}{h(r.label)}</td>'
            f'<td class="num" data-label="last step">{h(step)}</td><td class="wrap">{h(r.doing)}'
            + (f'<br><span class="muted">{h(r.failure)}</span>' if r.failure else "")
            + (
                f'<br><span class="muted">last collective entered: #{r.collective} (Flight Recorder)</span>'
                if r.collective is not None
                else ""
            )
            + f'</td><td class="num" data-label="dumped">{h(dumped)}</td><td>{links}</td></tr>'
        )
    return (
        '<div class="scroll"><table id="ranks" class="cards"><tr><th>rank</th><th>last step</th>'
        "<th>where it is</th>"
        f"<th>dumped</th><th></th></tr>{''.join(out)}</table></div>"
    )


# --- merged stacks -----------------------------------------------------------------------
class _Tree:
    def __init__(self, total: int, has_suspects: bool) -> None:
        self.total = max(1, total)
        self.has_suspects = has_suspects
        self.lines = 0
        self.cut = False

    def line(self, node: StackNode) -> str:
        self.lines += 1
        cls = ["n"]
        own = bool(node.suspects) and self.has_suspects and node.count < self.total
        if own:
            cls.append("sus")
        if node.divergent:
            cls.append("div")
        if node.native:
            cls.append("nat")
        pct = max(1.0, 100.0 * node.count / self.total)
        sample = ", ".join(map(str, node.ranks_sample)) + ("…" if node.count > len(node.ranks_sample) else "")
        mark = "▶ " if own else ""
        why = " (ranks part here)" if node.divergent else ""
        return (
            f'<div class="{" ".join(cls)}" title="ranks {h(sample)}{why}"><span class="bar">'
            f'<i style="width:{pct:.1f}%"></i></span><span class="c">{node.count:,}</span>'
            f'<span class="l">{h(mark)}{h(node.label)}</span></div>'
        )

    def chain(self, node: StackNode) -> str:
        """The frames below ``node`` until the ranks part (or the stack ends), then each branch."""
        run: list[StackNode] = []
        cur = node
        while len(cur.children) == 1:
            (nxt,) = cur.children.values()
            run.append(nxt)
            cur = nxt
        out = self._fold(run)
        if self.lines > TREE_MAX_LINES:
            self.cut = True
            return out
        kids = sorted(cur.children.values(), key=lambda n: (-n.suspects, -n.count, n.name))
        for i, kid in enumerate(kids):
            if self.lines > TREE_MAX_LINES:
                rest = kids[i:]
                self.cut = True
                out += (
                    f'<div class="br muted">… {len(rest):,} more branches '
                    f"({sum(k.count for k in rest):,} ranks)</div>"
                )
                break
            sus = " sus" if kid.suspects and self.has_suspects and kid.count < self.total else ""
            out += f'<div class="br{sus}">{self.line(kid)}{self.chain(kid)}</div>'
        return out

    def _fold(self, run: list[StackNode]) -> str:
        out: list[str] = []
        i = 0
        while i < len(run):
            j = i
            while j < len(run) - 1 and _library(run[j]) and not run[j].divergent:
                j += 1
            if j - i > FOLD_LIBRARY_RUN:
                out.append(self.line(run[i]))
                inner = "".join(self.line(n) for n in run[i + 1 : j - 1])
                out.append(f"<details><summary>{j - i - 2} library frames</summary>{inner}</details>")
                out.append(self.line(run[j - 1]))
                i = j
                continue
            out.append(self.line(run[i]))
            i += 1
        return "".join(out)


_LIB_RE = re.compile(r"\((threading|selectors|queues?|connection|process|popen_fork|context|socket|"
                     r"dataloader|fetch|worker|module|distributed|distributed_c10d|c10d_logger|"
                     r"_contextlib|contextlib|functools|graph|__init__|_tensor|module)\.py:")  # fmt: skip


def _library(node: StackNode) -> bool:
    return node.native or bool(_LIB_RE.search(node.label))


def _stacks(rep: Report) -> str:
    total = rep.tree.count
    if not total:
        return '<p class="muted">no rank has a Python stack in this incident</p>'
    t = _Tree(total, bool(rep.verdict.suspects))
    body = t.line(rep.tree) + t.chain(rep.tree)
    workers = ""
    if rep.workers is not None and rep.workers.count:
        tw = _Tree(rep.workers.count, bool(rep.verdict.suspects))
        workers = (
            "<h3>DataLoader worker processes</h3>"
            f'<div class="tree">{tw.line(rep.workers)}{tw.chain(rep.workers)}</div>'
        )
    cut = f'<p class="muted">cut at {TREE_MAX_LINES} frames</p>' if t.cut else ""
    native = _has_native(rep.tree)
    note = (
        ""
        if native
        else '<p class="muted">native frames: not captured (dumps taken without <code>--native</code>)</p>'
    )
    return (
        '<p class="muted">Outermost frame first. Bar and number: how many ranks passed through the frame; '
        '<span class="div">highlighted</span>: where ranks part; red ▶: the suspect\'s path.</p>'
        f'<div class="tree">{body}</div>{cut}{workers}{note}'
    )


def _has_native(node: StackNode) -> bool:
    stack = list(node.children.values())
    while stack:
        n = stack.pop()
        if n.native:
            return True
        stack.extend(n.children.values())
    return False


# --- evidence ----------------------------------------------------------------------------
def _findings(rep: Report) -> str:
    if not rep.findings:
        src = f" in {h(rep.findings_source)}" if rep.findings_source else ""
        return f'<p class="muted">findings: not recorded{src} for this incident\'s window</p>'
    rows = []
    for f in rep.findings:
        t = f.get("time")
        when = utc(float(t)) if isinstance(t, (int, float)) else str(t or "–")
        sev = str(f.get("severity") or "")
        cls = ' class="suspect"' if f.get("rank") in rep.verdict.suspects else ""
        rows.append(
            f'<tr{cls}><td class="num">{h(when)}</td><td data-label="rank">{h(f.get("rank"))}</td>'
            f"<td>{h(f.get('kind'))}</td><td>{h(sev)}</td>"
            f'<td class="num" data-label="step">{h(f.get("step") if f.get("step") is not None else "–")}</td>'
            f'<td class="wrap">{h(_short(str(f.get("message") or ""), 1200))}</td></tr>'
        )
    return (
        '<div class="scroll"><table class="cards"><tr><th>time</th><th>rank</th><th>kind</th>'
        "<th>severity</th><th>step</th>"
        f"<th>message</th></tr>{''.join(rows)}</table></div>"
    )


def _log_tail(rep: Report) -> str:
    if rep.log_tail_rank is None:
        return '<p class="muted">no suspect, so no log tail picked</p>'
    if rep.log_tail is None:
        return f'<p class="muted">rank {rep.log_tail_rank}\'s log tail: not recorded in this incident</p>'
    lines = []
    for line in rep.log_tail:
        cls = ' class="hit"' if _HIT_RE.search(line) else ""
        lines.append(f"<span{cls}>{h(line.rstrip())}</span>" if cls else h(line.rstrip()))
    return f"<h3>Rank {rep.log_tail_rank}'s log, last lines</h3><pre>" + "\n".join(lines) + "</pre>"


def _readings(rep: Report) -> str:
    if not rep.readings:
        return '<p class="muted">GPU and host readings: not recorded in this incident</p>'
    order = [r for r in rep.verdict.suspects if r in rep.readings] + [
        r for r in sorted(rep.readings) if r not in rep.verdict.suspects
    ]
    rows = []
    for r in order[:READINGS_SHOWN]:
        got = rep.readings[r]
        p, g = got.get("process"), got.get("gpu")
        proc: dict[str, Any] = p if isinstance(p, dict) else {}
        gpus: list[Any] = g if isinstance(g, list) else []
        gtext = "; ".join(_gpu_text(g) for g in gpus if isinstance(g, dict)) or "not recorded"
        cpu = proc.get("cpu_percent")
        rss = proc.get("rss_bytes")
        cls = ' class="suspect"' if r in rep.verdict.suspects else ""
        rows.append(
            f"<tr{cls}><td>{r}</td>"
            f'<td class="num">{h(f"{cpu:.0f}%" if isinstance(cpu, (int, float)) else "–")}</td>'
            f'<td class="num">{h(f"{rss / 2**20:,.0f} MiB" if isinstance(rss, (int, float)) else "–")}</td>'
            f'<td>{h(proc.get("state") or "–")}</td><td class="wrap">{h(gtext)}</td></tr>'
        )
    more = len(order) - READINGS_SHOWN
    tail = f"<p class=\"muted\">{more:,} more ranks' readings in the dumps' meta</p>" if more > 0 else ""
    return (
        '<div class="scroll"><table><tr><th>rank</th><th>CPU</th><th>RSS</th><th>process</th>'
        "<th>GPU</th></tr>"
        f"{''.join(rows)}</table></div>{tail}"
    )


def _gpu_text(g: dict[str, Any]) -> str:
    parts = [f"GPU{g.get('index', '?')}"]
    if isinstance(g.get("utilization"), (int, float)):
        parts.append(f"{g['utilization'] * 100:.0f}% util")
    if isinstance(g.get("memory_used"), (int, float)) and isinstance(g.get("memory_total"), (int, float)):
        parts.append(f"{g['memory_used'] / 2**30:.1f}/{g['memory_total'] / 2**30:.0f} GiB")
    if isinstance(g.get("temperature"), (int, float)):
        parts.append(f"{g['temperature']:.0f}°C")
    if g.get("lost"):
        parts.append("LOST")
    return " ".join(parts)


def _flight_section(rep: Report) -> str:
    if not rep.flight_ranks:
        return (
            '<p class="muted">Flight Recorder: not recorded (no <code>flight-recorder-rank-*</code> '
            "trace in the folder)</p>"
        )
    v = rep.verdict
    text = v.flight or "every rank entered the same collectives"
    return f'<p>traces of {h(describe_ranks(rep.flight_ranks))}: <span class="wrap">{h(text)}</span></p>'


def _config(rep: Report) -> str:
    if not rep.judged_by:
        return '<p class="muted">the settings that judged it: not recorded in this incident</p>'
    items = "".join(
        f'<dt>{h(k)}</dt><dd class="mono">{h(v if isinstance(v, str) else json.dumps(v, default=str))}</dd>'
        for k, v in sorted(rep.judged_by.items())
    )
    return f'<dl class="kv">{items}</dl>'


def render_html(rep: Report, *, link: Callable[[int], str] | None = None) -> str:
    """The page. ``link(rank)``: where one rank's stacks open (relative), or None for no links."""
    v = rep.verdict
    title = f"rankwatch: {rep.run}/{rep.incident}"
    world = f" of {rep.world_size:,}" if rep.world_size else ""
    head = (
        f'<p class="muted wrap">run <strong>{h(rep.run)}</strong> · {h(rep.reason)} · '
        f"{h(utc(rep.time, date=True))} · {len(rep.ranks):,} ranks{world} · "
        f'<span class="mono">{h(rep.path)}</span></p>'
    )
    notes = _ul([h(n) for n in rep.notes], "muted")
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{h(title)}: {h(v.headline)}</title><style>{_STYLE}</style></head><body><main>"
        f'<h1 class="wrap">Incident {h(rep.incident)}</h1>{head}'
        + _verdict(rep)
        + "<h2>Timeline</h2>"
        + _timeline(rep)
        + _rank_table(rep, link)
        + "<h2>Stacks, merged across ranks</h2>"
        + _stacks(rep)
        + '<h2 id="evidence">Evidence</h2>'
        + "<h3>Findings in the incident's window</h3>"
        + _findings(rep)
        + _log_tail(rep)
        + "<h3>GPU and host readings</h3>"
        + _readings(rep)
        + "<h3>Flight Recorder</h3>"
        + _flight_section(rep)
        + "<h3>The settings that judged it</h3>"
        + _config(rep)
        + notes
        + '<p class="muted">rankwatch report · this page loads nothing from the network</p>'
        + "</main></body></html>\n"
    )
