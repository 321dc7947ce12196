"""``rankwatch top``: a live terminal view of a run's ranks, the rank in trouble first.

Two sources give the same rows. Agents (``rankwatch top http://node1:9478 ...``): each
agent's ``/api/status`` (with the token: ``--token``, ``server.token`` or the one the agents
of this user keep in the runtime folder) for steps, rates, loss, stalls and findings, and
its ``/metrics`` (open) for GPU utilisation and memory. Prometheus (``--prometheus URL``):
one instant query over the ``rankwatch_*`` series, for a run whose agents are anywhere.

The frame is plain text: ANSI colour only on a terminal without ``NO_COLOR``, the width of
``COLUMNS`` / the terminal (columns are dropped, least useful first, and the findings cut to
fit), and a redraw by moving the cursor home and clearing — no curses. ``--once`` prints one
frame and exits (scripts, tests). Everything that came from a log (finding text, kinds,
node names) is shown with its control characters made visible: a log line must not be able
to drive the operator's terminal.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TextIO

from prometheus_client.parser import text_string_to_metric_families

from rankwatch.config.units import format_age
from rankwatch.sanitize import visible

# Prometheus series ``top`` reads, in one query.
SERIES = (
    "rankwatch_step",
    "rankwatch_step_duration_seconds",
    "rankwatch_loss",
    "rankwatch_seconds_since_progress",
    "rankwatch_stall_timeout_seconds",
    "rankwatch_active_findings",
    "rankwatch_gpu_utilization_ratio",
    "rankwatch_gpu_memory_used_bytes",
    "rankwatch_gpu_memory_total_bytes",
)
MAX_BODY = 16 << 20  # an agent's /metrics is ~100 KB; a Prometheus answer for 1,024 ranks a few MB
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def clean(text: object, limit: int = 400) -> str:
    """``text`` for one line of the terminal: every control shown, not obeyed
    (``rankwatch.sanitize``), at most ``limit`` characters."""
    return visible(str(text)[: limit * 2])[:limit]


@dataclasses.dataclass
class Row:
    """One rank as ``top`` shows it; None: not known."""

    run: str
    rank: int | None
    node: str = ""
    step: float | None = None
    steps_per_s: float | None = None
    loss: float | None = None
    gpu_util: float | None = None  # 0..1, the mean over the rank's GPUs
    gpu_mem_used: float | None = None
    gpu_mem_total: float | None = None
    since_progress: float | None = None
    stall_timeout: float | None = None
    stalled: bool = False
    findings: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (severity, kind)

    def trouble(self) -> tuple[Any, ...]:
        """Sort key: critical findings, then stalled, then warnings, then the nearest to its
        stall timeout; ties by rank."""
        worst = min((SEVERITY_ORDER.get(s, 3) for s, _ in self.findings), default=3)
        near = 0.0
        if self.since_progress is not None and self.stall_timeout:
            near = self.since_progress / self.stall_timeout
        return (
            worst > 0,
            not self.stalled,
            worst > 1,
            -near,
            self.run,
            self.rank if self.rank is not None else -1,
        )


@dataclasses.dataclass
class Frame:
    rows: list[Row]
    errors: list[str]
    sources: int
    when: float


# --- fetching ------------------------------------------------------------------------------
def _get(url: str, token: str | None, timeout: float, tls: ssl.SSLContext | None = None) -> bytes:
    headers = {"Accept": "application/json, text/plain"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout, context=tls) as r:
        body: bytes = r.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise ValueError(f"answer over {MAX_BODY >> 20} MiB")
    return body


def _why(url: str, e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        hint = (
            " (no or wrong token: --token, server.token or `rankwatch url`)" if e.code in (401, 403) else ""
        )
        return f"{url}: HTTP {e.code}{hint}"
    if isinstance(e, urllib.error.URLError):
        return f"{url}: {e.reason}"
    return f"{url}: {e}"


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        return None
    try:
        return float(x)
    except ValueError:
        return None


def rows_from_status(doc: Mapping[str, Any]) -> list[Row]:
    """Rows from an agent's ``/api/status``."""
    out = []
    for r in doc.get("ranks") or []:
        rates = r.get("rates") or {}
        sps = _num(rates.get("steps_per_s"))
        if sps is None and (st := _num(rates.get("step_time_s"))):
            sps = 1.0 / st if st > 0 else None
        rank = r.get("rank")
        out.append(
            Row(
                run=str(r.get("run") or doc.get("run") or ""),
                rank=rank if isinstance(rank, int) else None,
                node=str(r.get("node") or doc.get("node") or ""),
                step=_num(r.get("step")),
                steps_per_s=sps,
                loss=_num(r.get("loss")),
                since_progress=_num(r.get("seconds_since_progress")),
                stall_timeout=_num(r.get("stall_timeout_s")),
                stalled=bool(r.get("stalled")),
                findings=[
                    (str(f.get("severity", "")), str(f.get("kind", "")))
                    for f in r.get("active_findings") or []
                    if isinstance(f, Mapping)
                ],
            )
        )
    return out


Sample = tuple[str, Mapping[str, str], float]


def samples_from_metrics(text: str) -> list[Sample]:
    """The ``SERIES`` samples of a /metrics exposition."""
    out: list[Sample] = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in SERIES:
                out.append((s.name, s.labels, float(s.value)))
    return out


def rows_from_samples(samples: Iterable[Sample], rows: list[Row] | None = None) -> list[Row]:
    """Rows from Prometheus samples (labels run, rank, node), added to ``rows`` when given
    (an agent's GPU series next to its /api/status)."""
    by_key: dict[tuple[str, int | None], Row] = {(r.run, r.rank): r for r in rows or []}
    gpu: dict[tuple[str, int | None], dict[str, list[float]]] = {}
    for name, labels, value in samples:
        run = labels.get("run", "")
        rank_s = labels.get("rank", "")
        rank = int(rank_s) if rank_s.isdigit() else None
        key = (run, rank)
        if name.startswith("rankwatch_gpu_"):
            gpu.setdefault(key, {}).setdefault(name, []).append(value)
            continue
        row = by_key.get(key)
        if row is None:
            if rows is not None:
                continue  # an agent's own series for a rank /api/status did not list
            row = by_key[key] = Row(run=run, rank=rank, node=labels.get("node", ""))
        if name == "rankwatch_step":
            row.step = value
        elif name == "rankwatch_step_duration_seconds":
            row.steps_per_s = 1.0 / value if value > 0 else None
        elif name == "rankwatch_loss":
            row.loss = value
        elif name == "rankwatch_seconds_since_progress":
            row.since_progress = value
        elif name == "rankwatch_stall_timeout_seconds":
            row.stall_timeout = value
        elif name == "rankwatch_active_findings" and value > 0:
            finding = (labels.get("severity", ""), labels.get("kind", ""))
            if finding not in row.findings:
                row.findings.append(finding)
    for key, series in gpu.items():
        row = by_key.get(key)
        if row is None:
            continue
        util = series.get("rankwatch_gpu_utilization_ratio")
        used = series.get("rankwatch_gpu_memory_used_bytes")
        total = series.get("rankwatch_gpu_memory_total_bytes")
        row.gpu_util = sum(util) / len(util) if util else None
        row.gpu_mem_used = sum(used) if used else None
        row.gpu_mem_total = sum(total) if total else None
    for row in by_key.values():
        if row.since_progress is not None and row.stall_timeout:
            row.stalled = row.stalled or row.since_progress > row.stall_timeout
    return list(by_key.values())


def from_agent(url: str, token: str | None, timeout: float, tls: ssl.SSLContext | None = None) -> list[Row]:
    base = url.rstrip("/")
    doc = json.loads(_get(base + "/api/status", token, timeout, tls))
    rows = rows_from_status(doc)
    try:
        text = _get(base + "/metrics", None, timeout, tls).decode("utf-8", "replace")
    except (OSError, ValueError):
        return rows  # the GPU columns stay empty; the rest is what matters
    return rows_from_samples(samples_from_metrics(text), rows)


def from_prometheus(
    url: str, timeout: float, run: str | None = None, tls: ssl.SSLContext | None = None
) -> list[Row]:
    names = "|".join(SERIES)
    selector = f'__name__=~"{names}"' + (f',run="{_promql_string(run)}"' if run else "")
    query = urllib.parse.urlencode({"query": "{" + selector + "}"})
    doc = json.loads(_get(url.rstrip("/") + "/api/v1/query?" + query, None, timeout, tls))
    if doc.get("status") != "success":
        raise ValueError(f"query failed: {doc.get('error') or doc.get('status')}")
    samples: list[Sample] = []
    for item in doc.get("data", {}).get("result") or []:
        labels = item.get("metric") or {}
        value = _num((item.get("value") or [None, None])[1])
        if value is not None and isinstance(labels, dict):
            samples.append((str(labels.get("__name__", "")), labels, value))
    return rows_from_samples(samples)


def _promql_string(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def fetch(
    agents: Sequence[str],
    tokens: Mapping[str, str | None],
    *,
    prometheus: str | None = None,
    run: str | None = None,
    timeout: float = 3.0,
    tls: ssl.SSLContext | None = None,
    clock: Callable[[], float] = time.time,
) -> Frame:
    """One frame from every source; a source that fails is a line under the table."""
    rows: list[Row] = []
    errors: list[str] = []
    if prometheus:
        try:
            rows = from_prometheus(prometheus, timeout, run, tls)
        except (OSError, ValueError) as e:
            errors.append(_why(prometheus, e))
        n = 1
    else:
        n = len(agents)
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, max(1, n))) as pool:
            futures = [pool.submit(from_agent, u, tokens.get(u), timeout, tls) for u in agents]
            for u, fut in zip(agents, futures, strict=True):
                try:
                    rows.extend(fut.result())
                except (OSError, ValueError) as e:
                    errors.append(_why(u, e))
        if run:
            rows = [r for r in rows if r.run == run]
    rows.sort(key=Row.trouble)
    return Frame(rows, errors, n, clock())


# --- rendering -----------------------------------------------------------------------------
def _fmt_num(x: float | None) -> str:
    if x is None:
        return "–"
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e9:
        return str(int(x))
    return f"{x:.4g}"


def _fmt_bytes(x: float | None) -> str:
    if x is None:
        return "–"
    for div, unit in ((1 << 40, "T"), (1 << 30, "G"), (1 << 20, "M")):
        if x >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x / 1024:.0f}K"


# (header, width, right-aligned, cell); dropped from the end of DROP_ORDER first when narrow.
Column = tuple[str, int, bool, Callable[[Row], str]]
COLUMNS: tuple[Column, ...] = (
    ("RANK", 5, True, lambda r: "–" if r.rank is None else str(r.rank)),
    ("NODE", 12, False, lambda r: clean(r.node, 12)),
    ("STEP", 9, True, lambda r: _fmt_num(r.step)),
    ("STEP/S", 7, True, lambda r: "–" if r.steps_per_s is None else f"{r.steps_per_s:.3g}"),
    ("LOSS", 8, True, lambda r: _fmt_num(r.loss)),
    ("GPU%", 5, True, lambda r: "–" if r.gpu_util is None else f"{100 * r.gpu_util:.0f}"),
    (
        "GPU MEM",
        11,
        True,
        lambda r: (
            "–"
            if r.gpu_mem_used is None
            else _fmt_bytes(r.gpu_mem_used) + ("/" + _fmt_bytes(r.gpu_mem_total) if r.gpu_mem_total else "")
        ),
    ),
    ("SINCE", 6, True, lambda r: format_age(r.since_progress)),
)
# Least useful first: what goes when the terminal is narrow.
DROP_ORDER = ("NODE", "GPU MEM", "LOSS", "STEP/S", "GPU%")
FINDINGS_MIN = 12
_COLOUR = {"critical": "\x1b[1;31m", "warning": "\x1b[33m", "stalled": "\x1b[1;31m"}
_RESET = "\x1b[0m"


def _findings_text(r: Row) -> str:
    parts = (["STALLED"] if r.stalled else []) + [
        clean(kind, 40) for _, kind in sorted(r.findings, key=lambda f: (SEVERITY_ORDER.get(f[0], 3), f[1]))
    ]
    return " ".join(parts) or "ok"


def render(frame: Frame, *, width: int = 100, colour: bool = False, title: str = "") -> str:
    """The frame as text lines of at most ``width`` characters (colour codes aside)."""
    cols = list(COLUMNS)
    for name in DROP_ORDER:
        if sum(c[1] + 1 for c in cols) + FINDINGS_MIN <= width:
            break
        cols = [c for c in cols if c[0] != name]
    room = max(4, width - sum(c[1] + 1 for c in cols))

    def line(cells: list[str], findings: str) -> str:
        out = []
        for (_, w, right, _), cell in zip(cols, cells, strict=True):
            cell = cell[:w]
            out.append(cell.rjust(w) if right else cell.ljust(w))
        return " ".join(out) + " " + findings[:room]

    stalled = sum(r.stalled for r in frame.rows)
    troubled = sum(
        1 for r in frame.rows if r.stalled or any(s in ("critical", "warning") for s, _ in r.findings)
    )
    runs = sorted({r.run for r in frame.rows})
    # A launcher's own pipeline (rank "–": torchrun's lines) is shown, but is no rank of the job.
    ranks = sum(1 for r in frame.rows if r.rank is not None) or len(frame.rows)
    head = (
        f"rankwatch top  {title}  run {clean(', '.join(runs) or '–', 40)}  {ranks} rank(s)  "
        f"{troubled} in trouble  {stalled} stalled  {time.strftime('%H:%M:%S', time.localtime(frame.when))}"
    )
    lines = [head[:width], line([c[0] for c in cols], "FINDINGS")]
    for r in frame.rows:
        text = line([c[3](r) for c in cols], _findings_text(r))
        if colour:
            worst = (
                "stalled"
                if r.stalled
                else min((s for s, _ in r.findings), key=lambda s: SEVERITY_ORDER.get(s, 3), default="")
            )
            if worst in _COLOUR:
                text = _COLOUR[worst] + text + _RESET
        lines.append(text)
    if not frame.rows and not frame.errors:
        lines.append("(no ranks yet)")
    for e in frame.errors:
        lines.append(clean("! " + e, width))
    return "\n".join(lines) + "\n"


def tls_context(cacert: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """For agents (or a Prometheus) behind the web config's TLS: a CA to trust, and the client
    certificate a ``RequireAndVerifyClientCert`` agent asks for. None: the system's defaults."""
    if not (cacert or cert):
        return None
    ctx = ssl.create_default_context(cafile=cacert)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def use_colour(stream: TextIO, env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return stream.isatty() and not env.get("NO_COLOR") and env.get("TERM", "") != "dumb"


def terminal_width(stream: TextIO) -> int:
    """``COLUMNS`` when set, else the terminal's, else 100."""
    return max(20, shutil.get_terminal_size((100, 24)).columns)


def run_top(
    agents: Sequence[str],
    tokens: Mapping[str, str | None],
    *,
    prometheus: str | None,
    run: str | None,
    interval: float,
    once: bool,
    stream: TextIO | None = None,
    timeout: float = 3.0,
    tls: ssl.SSLContext | None = None,
) -> int:
    """Print frames until interrupted (or one with ``once``). Exit 0; 1 when ``once`` and
    no source answered."""
    out = stream or sys.stdout
    colour = use_colour(out)
    title = prometheus or (agents[0] if len(agents) == 1 else f"{len(agents)} agents")
    redraw = out.isatty() and not once
    while True:
        frame = fetch(agents, tokens, prometheus=prometheus, run=run, timeout=timeout, tls=tls)
        text = render(frame, width=terminal_width(out), colour=colour, title=clean(title, 60))
        out.write(("\x1b[H\x1b[2J" if redraw else "") + text)
        out.flush()
        if once:
            return 1 if frame.errors and not frame.rows else 0
        time.sleep(interval)
