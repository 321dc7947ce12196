"""Generates the rankwatch Grafana dashboards and their Kubernetes ConfigMap.

One script keeps the three dashboards consistent (same variables, datasource wiring,
label selectors and tags); the generated JSON and ConfigMap are committed so nobody
needs Python to import them. ``python grafana/build_dashboards.py`` rewrites them,
``--check`` exits 1 when the committed files are out of date (a test runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DASHBOARDS_DIR = HERE / "dashboards"
CONFIGMAP = HERE / "kubernetes" / "dashboards-configmap.yaml"
SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["rankwatch"]

# Label selectors. Per-rank series carry run, rank, local_rank, node; agent-level series
# (checkpoints, dumps, internal errors) carry rank="" when one agent watches several ranks,
# so they are never filtered by rank.
RANK_SEL = 'run=~"$run", node=~"$node", rank=~"$rank"'
AGENT_SEL = 'run=~"$run", node=~"$node"'
RUN_SEL = 'run=~"$run"'

Json = dict[str, Any]


# --- template variables -----------------------------------------------------------------
def _datasource_var() -> Json:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }


def _query_var(
    name: str, label: str, query: str, *, multi: bool, include_all: bool, default_all: bool = False
) -> Json:
    v: Json = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": f"rankwatch-{name}"},
        "refresh": 2,
        "sort": 3,
        "multi": multi,
        "includeAll": include_all,
        "regex": "",
        "hide": 0,
        "options": [],
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if default_all else {},
    }
    if include_all:
        v["allValue"] = ".*"
    return v


def _run_var(multi: bool = False) -> Json:
    return _query_var(
        "run",
        "Run",
        "label_values(rankwatch_agent_start_time_seconds, run)",
        multi=multi,
        include_all=multi,
        default_all=multi,
    )


def _node_var() -> Json:
    return _query_var(
        "node",
        "Node",
        'label_values(rankwatch_agent_start_time_seconds{run=~"$run"}, node)',
        multi=True,
        include_all=True,
        default_all=True,
    )


def _rank_var(*, single: bool = False, metric: str = "rankwatch_step") -> Json:
    return _query_var(
        "rank",
        "Rank",
        f'label_values({metric}{{run=~"$run", node=~"$node"}}, rank)',
        multi=not single,
        include_all=not single,
        default_all=not single,
    )


# --- panels -------------------------------------------------------------------------------
class Layout:
    """Places panels left to right in a 24-column grid and numbers them."""

    def __init__(self) -> None:
        self.panels: list[Json] = []
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self) -> int:
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "id": self._id(),
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def add(self, panel: Json, w: int, h: int) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def target(
    expr: str, legend: str = "", *, ref: str = "A", instant: bool = False, table: bool = False
) -> Json:
    t: Json = {
        "datasource": DS,
        "expr": expr,
        "legendFormat": legend or "__auto",
        "refId": ref,
        "range": not instant,
        "instant": instant,
        "editorMode": "code",
    }
    if table:
        t["format"] = "table"
    return t


def _refs(targets: list[Json]) -> list[Json]:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    return targets


def timeseries(
    title: str,
    targets: list[Json],
    *,
    unit: str = "short",
    description: str = "",
    decimals: int | None = None,
    min0: bool = False,
    max1: bool = False,
    overrides: list[Json] | None = None,
) -> Json:
    defaults: Json = {
        "unit": unit,
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 0,
            "showPoints": "never",
            "spanNulls": True,
        },
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    if min0:
        defaults["min"] = 0
    if max1:
        defaults["max"] = 1
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": _refs(targets),
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {
                "displayMode": "table",
                "placement": "right",
                "calcs": ["lastNotNull"],
                "showLegend": True,
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(
    title: str,
    expr: str,
    *,
    unit: str = "short",
    description: str = "",
    thresholds: list[tuple[float | None, str]] | None = None,
    legend: str = "",
) -> Json:
    steps = [{"color": c, "value": v} for v, c in (thresholds or [(None, "green")])]
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target(expr, legend, instant=True)],
        "fieldConfig": {
            "defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}},
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "auto",
        },
    }


def table(title: str, targets: list[Json], *, description: str = "", hide: list[str] | None = None) -> Json:
    """An instant table of several queries joined on their labels (one row per series)."""
    excluded = dict.fromkeys(["Time", "__name__", "job", "instance", *(hide or [])], True)
    transforms: list[Json] = []
    if len(targets) > 1:
        transforms.append({"id": "merge", "options": {}})
    transforms.append({"id": "organize", "options": {"excludeByName": excluded, "renameByName": {}}})
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": _refs(targets),
        "transformations": transforms,
        "fieldConfig": {"defaults": {"custom": {"align": "auto", "filterable": True}}, "overrides": []},
        "options": {"showHeader": True, "footer": {"show": False}},
    }


def state_timeline(title: str, targets: list[Json], *, description: str = "", mappings: list[Json]) -> Json:
    return {
        "type": "state-timeline",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": _refs(targets),
        "fieldConfig": {"defaults": {"mappings": mappings, "custom": {"fillOpacity": 80}}, "overrides": []},
        "options": {"showValue": "never", "mergeValues": True, "rowHeight": 0.9},
    }


def heatmap(title: str, targets: list[Json], *, description: str = "", unit: str = "s") -> Json:
    """Ranks down, time across: a rank drifting away from the others shows as its own band."""
    return {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": _refs(targets),
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5},
            "yAxis": {"axisPlacement": "left"},
            "rowsFrame": {"layout": "auto"},
            "legend": {"show": True},
            "tooltip": {"show": True, "yHistogram": False},
        },
    }


def annotation(name: str, expr: str, title: str, text: str, color: str, tags: str) -> Json:
    return {
        "name": name,
        "datasource": DS,
        "enable": True,
        "iconColor": color,
        "expr": expr,
        "step": "30s",
        "titleFormat": title,
        "textFormat": text,
        "tagKeys": tags,
        "useValueForTime": False,
    }


def _builtin_annotation() -> Json:
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }


def dashboard(
    uid: str, title: str, description: str, variables: list[Json], layout: Layout, annotations: list[Json]
) -> Json:
    links = [
        {
            "type": "dashboards",
            "tags": TAGS,
            "asDropdown": True,
            "title": "rankwatch",
            "includeVars": True,
            "keepTime": True,
        }
    ]
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": TAGS,
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": links,
        "templating": {"list": [_datasource_var(), *variables]},
        "annotations": {"list": [_builtin_annotation(), *annotations]},
        "panels": layout.panels,
    }


RANK_LEGEND = "rank {{rank}}"


def _finding_annotations(sel: str) -> list[Json]:
    return [
        annotation(
            "Findings",
            f'rankwatch_active_findings{{{sel}, severity=~"warning|critical"}} > 0',
            "{{kind}} ({{severity}})",
            "rank {{rank}} on {{node}}",
            "red",
            "kind,severity,rank",
        ),
        annotation(
            "Checkpoints",
            f"changes(rankwatch_checkpoint_last_good_step{{{sel}}}[2m]) > 0",
            "good checkpoint",
            "node {{node}} rank {{rank}}",
            "green",
            "node",
        ),
        annotation(
            "Stack dumps",
            f"increase(rankwatch_dumps_captured_total{{{sel}}}[2m]) > 0",
            "stack dumps captured",
            "node {{node}} rank {{rank}}",
            "purple",
            "node",
        ),
    ]


# --- Run overview ---------------------------------------------------------------------------
def run_overview() -> Json:
    s, a = RANK_SEL, AGENT_SEL
    L = Layout()
    L.row("Progress")
    L.add(stat("Ranks reporting steps", f"count(rankwatch_step{{{s}}})"), 4, 4)
    L.add(stat("Step (furthest rank)", f"max(rankwatch_step{{{s}}})"), 4, 4)
    L.add(
        stat(
            "Step spread (max - min)",
            f"max(rankwatch_step{{{s}}}) - min(rankwatch_step{{{s}}})",
            description="Steps between the furthest and the slowest rank; a rank falling behind grows it.",
            thresholds=[(None, "green"), (10, "orange"), (100, "red")],
        ),
        4,
        4,
    )
    L.add(
        stat(
            "ETA",
            f"max(rankwatch_eta_seconds{{{s}}})",
            unit="s",
            description="Time to the last step at the recent rate (only when the log states the total).",
        ),
        4,
        4,
    )
    L.add(
        stat(
            "Ranks stalled",
            f"count(rankwatch_seconds_since_progress{{{s}}} > rankwatch_stall_timeout_seconds{{{s}}})"
            " or vector(0)",
            thresholds=[(None, "green"), (1, "red")],
        ),
        4,
        4,
    )
    L.add(
        stat(
            "Active findings (warning+)",
            f'sum(rankwatch_active_findings{{{s}, severity=~"warning|critical"}}) or vector(0)',
            thresholds=[(None, "green"), (1, "red")],
        ),
        4,
        4,
    )
    L.add(timeseries("Step", [target(f"rankwatch_step{{{s}}}", RANK_LEGEND)]), 12, 8)
    L.add(
        timeseries(
            "Step rate",
            [target(f"rate(rankwatch_step{{{s}}}[$__rate_interval])", RANK_LEGEND)],
            unit="short",
            description="Steps per second from the step counter (a resume from a checkpoint is a reset).",
            min0=True,
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Step time",
            [
                target(f"rankwatch_step_duration_seconds{{{s}}}", RANK_LEGEND),
                target(f"quantile(0.5, rankwatch_step_duration_seconds{{{s}}})", "run median"),
            ],
            unit="s",
            description="Median of the last printed step times per rank; a straggler sits above the median.",
        ),
        12,
        8,
    )
    L.add(
        heatmap(
            "Seconds since progress per rank",
            [target(f"max by (rank) (rankwatch_seconds_since_progress{{{s}}})", "{{rank}}")],
            description="Each row a rank; hot cells are ranks without a new step (see the stall timeout).",
        ),
        12,
        8,
    )
    L.add(
        table(
            "Ranks",
            [
                target(f"rankwatch_step{{{s}}}", instant=True, table=True),
                target(f"rankwatch_seconds_since_progress{{{s}}}", instant=True, table=True),
                target(f"rankwatch_stall_timeout_seconds{{{s}}}", instant=True, table=True),
                target(f"rankwatch_step_duration_seconds{{{s}}}", instant=True, table=True),
            ],
            description="Value #A step, #B seconds since progress, #C stall timeout, #D step time.",
        ),
        24,
        8,
    )
    L.row("Loss")
    L.add(timeseries("Training loss", [target(f"rankwatch_loss{{{s}}}", RANK_LEGEND)]), 12, 8)
    L.add(timeseries("Eval loss", [target(f"rankwatch_eval_loss{{{s}}}", RANK_LEGEND)]), 12, 8)
    L.add(timeseries("Grad norm", [target(f"rankwatch_grad_norm{{{s}}}", RANK_LEGEND)]), 8, 8)
    L.add(
        timeseries("Learning rate", [target(f"rankwatch_learning_rate{{{s}}}", RANK_LEGEND)], decimals=6),
        8,
        8,
    )
    L.add(timeseries("Loss scale (fp16)", [target(f"rankwatch_loss_scale{{{s}}}", RANK_LEGEND)]), 8, 8)
    L.row("Throughput")
    L.add(
        timeseries(
            "Tokens per second",
            [
                target(f"rankwatch_tokens_per_second{{{s}}}", RANK_LEGEND),
            ],
            description="As the framework printed it (some print per GPU, some for the whole job).",
            min0=True,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "MFU", [target(f"rankwatch_mfu_ratio{{{s}}}", RANK_LEGEND)], unit="percentunit", min0=True
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "FLOP/s per GPU",
            [target(f"rankwatch_flops_per_second{{{s}}}", RANK_LEGEND)],
            unit="flops",
            min0=True,
        ),
        8,
        8,
    )
    L.row("Findings, checkpoints, dumps")
    L.add(
        table(
            "Active findings",
            [target(f"rankwatch_active_findings{{{s}}} > 0", instant=True, table=True)],
            description="Fired and not resolved; details and the message are in the agent's /api/findings.",
            hide=["Value"],
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Findings fired",
            [
                target(
                    f"sum by (kind, severity) (increase(rankwatch_findings_total{{{s}}}[$__rate_interval]))",
                    "{{kind}} ({{severity}})",
                )
            ],
            min0=True,
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Checkpoints",
            [
                target(
                    f"max by (node) (rankwatch_checkpoint_last_good_step{{{a}}})", "last good step {{node}}"
                ),
                target(f"max by (node) (rankwatch_checkpoint_last_step{{{a}}})", "last step {{node}}"),
            ],
            description="Step of the newest checkpoint judged and of the newest that verified good.",
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Checkpoints by status",
            [target(f"sum by (status) (rankwatch_checkpoints{{{a}}})", "{{status}}")],
            min0=True,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Stack dumps captured",
            [target(f"sum by (node) (rankwatch_dumps_captured_total{{{a}}})", "{{node}}")],
            description="One per rank per incident; list them with `rankwatch dumps list`.",
            min0=True,
        ),
        8,
        8,
    )
    L.row("Agents")
    L.add(
        stat("Agents reporting", f"count(rankwatch_agent_start_time_seconds{{{a}}})"),
        6,
        4,
    )
    L.add(
        stat(
            "Processes down",
            f"count(rankwatch_process_up{{{s}}} == 0) or vector(0)",
            thresholds=[(None, "green"), (1, "red")],
        ),
        6,
        4,
    )
    L.add(
        timeseries(
            "Agent internal errors",
            [
                target(
                    f"sum by (component) "
                    f"(increase(rankwatch_internal_errors_total{{{a}}}[$__rate_interval]))",
                    "{{component}}",
                )
            ],
            min0=True,
        ),
        12,
        4,
    )
    variables = [_run_var(), _node_var(), _rank_var()]
    return dashboard(
        "rankwatch-run",
        "rankwatch / Run overview",
        "All ranks of one training run: progress, loss, throughput, stalls, findings, checkpoints.",
        variables,
        L,
        _finding_annotations(RUN_SEL),
    )


# --- Rank detail ----------------------------------------------------------------------------
def rank_detail() -> Json:
    r = 'run=~"$run", rank=~"$rank"'
    g = 'run=~"$run", rank=~"$rank"'
    L = Layout()
    L.row("Rank")
    L.add(stat("Step", f"max(rankwatch_step{{{r}}})"), 4, 4)
    L.add(
        stat(
            "Behind the furthest rank",
            f'max(rankwatch_step{{run=~"$run"}}) - max(rankwatch_step{{{r}}})',
            thresholds=[(None, "green"), (10, "orange"), (100, "red")],
        ),
        4,
        4,
    )
    L.add(stat("Seconds since progress", f"max(rankwatch_seconds_since_progress{{{r}}})", unit="s"), 4, 4)
    L.add(stat("Stall timeout", f"max(rankwatch_stall_timeout_seconds{{{r}}})", unit="s"), 4, 4)
    L.add(
        stat(
            "Process",
            f"min(rankwatch_process_up{{{r}}})",
            thresholds=[(None, "red"), (1, "green")],
        ),
        4,
        4,
    )
    L.add(
        stat(
            "Active findings",
            f"sum(rankwatch_active_findings{{{r}}}) or vector(0)",
            thresholds=[(None, "green"), (1, "red")],
        ),
        4,
        4,
    )
    L.add(
        timeseries(
            "Step and planned total",
            [
                target(f"rankwatch_step{{{r}}}", "step"),
                target(f"rankwatch_total_steps{{{r}}}", "total"),
            ],
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Step time against the run",
            [
                target(f"rankwatch_step_duration_seconds{{{r}}}", "this rank"),
                target('quantile(0.5, rankwatch_step_duration_seconds{run=~"$run"})', "run median"),
                target(
                    '1.25 * quantile(0.5, rankwatch_step_duration_seconds{run=~"$run"})', "straggler line"
                ),
                target(
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(rankwatch_step_time_seconds_bucket{{{r}}}[$__rate_interval])))",
                    "this rank p99",
                ),
            ],
            unit="s",
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Seconds since progress",
            [
                target(f"rankwatch_seconds_since_progress{{{r}}}", "since progress"),
                target(f"rankwatch_stall_timeout_seconds{{{r}}}", "stall timeout"),
            ],
            unit="s",
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "ETA",
            [target(f"rankwatch_eta_seconds{{{r}}}", "eta")],
            unit="s",
        ),
        12,
        8,
    )
    L.row("Loss")
    L.add(
        timeseries(
            "Loss",
            [target(f"rankwatch_loss{{{r}}}", "train"), target(f"rankwatch_eval_loss{{{r}}}", "eval")],
        ),
        12,
        8,
    )
    L.add(timeseries("Grad norm", [target(f"rankwatch_grad_norm{{{r}}}", "grad norm")]), 12, 8)
    L.add(timeseries("Learning rate", [target(f"rankwatch_learning_rate{{{r}}}", "lr")], decimals=6), 12, 8)
    L.add(timeseries("Loss scale", [target(f"rankwatch_loss_scale{{{r}}}", "loss scale")]), 12, 8)
    L.row("Throughput and memory")
    L.add(
        timeseries(
            "Tokens per second", [target(f"rankwatch_tokens_per_second{{{r}}}", "tokens/s")], min0=True
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "MFU and FLOP/s",
            [
                target(f"rankwatch_mfu_ratio{{{r}}}", "MFU"),
                target(f"rankwatch_flops_per_second{{{r}}}", "FLOP/s"),
            ],
            unit="flops",
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "MFU"},
                    "properties": [
                        {"id": "unit", "value": "percentunit"},
                        {"id": "custom.axisPlacement", "value": "right"},
                    ],
                }
            ],
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Framework peak memory",
            [target(f"rankwatch_framework_max_memory_bytes{{{r}}}", "peak")],
            unit="bytes",
            min0=True,
        ),
        8,
        8,
    )
    L.row("Process")
    L.add(
        timeseries("CPU (cores)", [target(f"rankwatch_process_cpu_ratio{{{r}}}", "cpu")], min0=True),
        8,
        8,
    )
    L.add(
        timeseries(
            "Resident memory",
            [target(f"rankwatch_process_resident_memory_bytes{{{r}}}", "rss")],
            unit="bytes",
            min0=True,
        ),
        8,
        8,
    )
    L.add(
        state_timeline(
            "Process state",
            [target(f"max by (state) (rankwatch_process_state{{{r}}}) == 1", "{{state}}")],
            description="Sleeping while stalled: blocked in a collective or I/O; running: a spin.",
            mappings=[{"type": "value", "options": {"1": {"text": "current", "color": "blue"}}}],
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Threads and children",
            [
                target(f"rankwatch_process_threads{{{r}}}", "threads"),
                target(f"rankwatch_process_children{{{r}}}", "children"),
            ],
            min0=True,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Log lines",
            [
                target(
                    f"sum by (result) (rate(rankwatch_log_lines_total{{{r}}}[$__rate_interval]))",
                    "{{result}}",
                )
            ],
            unit="short",
            description="Lines per second by outcome; many unparsed lines: the format was not recognised.",
            min0=True,
        ),
        8,
        8,
    )
    L.add(
        table(
            "Findings of this rank",
            [target(f"rankwatch_findings_total{{{r}}}", instant=True, table=True)],
            description="Fired since the agent started, by kind and severity.",
        ),
        8,
        8,
    )
    L.row("GPU of this rank")
    L.add(
        timeseries(
            "GPU utilisation",
            [target(f"rankwatch_gpu_utilization_ratio{{{g}}}", "gpu {{gpu}}")],
            unit="percentunit",
            min0=True,
            max1=True,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "GPU memory used",
            [
                target(f"rankwatch_gpu_memory_used_bytes{{{g}}}", "used gpu {{gpu}}"),
                target(f"rankwatch_gpu_memory_total_bytes{{{g}}}", "total gpu {{gpu}}"),
            ],
            unit="bytes",
            min0=True,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "GPU power and temperature",
            [
                target(f"rankwatch_gpu_power_watts{{{g}}}", "power gpu {{gpu}}"),
                target(f"rankwatch_gpu_temperature_celsius{{{g}}}", "temp gpu {{gpu}}"),
            ],
            overrides=[
                {
                    "matcher": {"id": "byRegexp", "options": "temp.*"},
                    "properties": [
                        {"id": "unit", "value": "celsius"},
                        {"id": "custom.axisPlacement", "value": "right"},
                    ],
                }
            ],
            unit="watt",
        ),
        8,
        8,
    )
    variables = [_run_var(), _node_var(), _rank_var(single=True)]
    return dashboard(
        "rankwatch-rank",
        "rankwatch / Rank detail",
        "One rank of a run: progress against its peers, loss, throughput, its process and its GPU.",
        variables,
        L,
        _finding_annotations('run=~"$run", rank=~"$rank|"'),
    )


# --- GPU fleet ------------------------------------------------------------------------------
def gpu_fleet() -> Json:
    g = RANK_SEL
    by = "sum by (node, gpu, uuid)"
    ecc = f'rankwatch_gpu_ecc_errors_total{{{g}, scope="aggregate"}}'
    leg = "{{node}} gpu {{gpu}}"
    L = Layout()
    L.row("Fleet")
    L.add(stat("GPUs reporting", f"count(rankwatch_gpu_utilization_ratio{{{g}}})"), 4, 4)
    L.add(
        stat(
            "Collectors without NVML",
            f"sum(1 - rankwatch_gpu_collector_up{{{g}}})",
            thresholds=[(None, "green"), (1, "orange")],
            description="Agents whose NVML is missing or failing: their GPUs are not in this dashboard.",
        ),
        4,
        4,
    )
    L.add(
        stat("GPUs lost", f"sum(rankwatch_gpu_lost{{{g}}})", thresholds=[(None, "green"), (1, "red")]),
        4,
        4,
    )
    L.add(
        stat(
            "Mean utilisation",
            f"avg(rankwatch_gpu_utilization_ratio{{{g}}})",
            unit="percentunit",
            thresholds=[(None, "red"), (0.5, "orange"), (0.8, "green")],
        ),
        4,
        4,
    )
    L.add(
        stat(
            "Hottest GPU",
            f"max(rankwatch_gpu_temperature_celsius{{{g}}})",
            unit="celsius",
            thresholds=[(None, "green"), (80, "orange"), (85, "red")],
        ),
        4,
        4,
    )
    L.add(
        stat(
            "Xid events (range)",
            f"sum(increase(rankwatch_gpu_xid_errors_total{{{g}}}[$__range])) or vector(0)",
            thresholds=[(None, "green"), (1, "red")],
        ),
        4,
        4,
    )
    L.add(
        timeseries(
            "Utilisation",
            [target(f"rankwatch_gpu_utilization_ratio{{{g}}}", leg)],
            unit="percentunit",
            min0=True,
            max1=True,
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Memory used",
            [
                target(
                    f"rankwatch_gpu_memory_used_bytes{{{g}}} / rankwatch_gpu_memory_total_bytes{{{g}}}", leg
                )
            ],
            unit="percentunit",
            min0=True,
            max1=True,
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Temperature",
            [
                target(f"rankwatch_gpu_temperature_celsius{{{g}}}", leg),
                target(f"rankwatch_gpu_memory_temperature_celsius{{{g}}}", "{{node}} gpu {{gpu}} memory"),
            ],
            unit="celsius",
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Power",
            [
                target(f"rankwatch_gpu_power_watts{{{g}}}", leg),
                target(f"max(rankwatch_gpu_power_limit_watts{{{g}}})", "power limit (max)"),
            ],
            unit="watt",
            min0=True,
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "SM clock",
            [target(f"rankwatch_gpu_sm_clock_hertz{{{g}}}", leg)],
            unit="hertz",
            description="A drop at full utilisation is throttling; see the reasons beside it.",
        ),
        12,
        8,
    )
    L.add(
        state_timeline(
            "Throttle reasons",
            [
                target(
                    f"max by (node, gpu, reason) (rankwatch_gpu_throttle_reason{{{g}}})",
                    "{{node}} gpu {{gpu}} {{reason}}",
                )
            ],
            mappings=[
                {
                    "type": "value",
                    "options": {
                        "0": {"text": "off", "color": "transparent"},
                        "1": {"text": "active", "color": "orange"},
                    },
                }
            ],
        ),
        12,
        8,
    )  # fmt: skip
    L.row("Errors")
    L.add(
        timeseries(
            "ECC errors (volatile, new)",
            [
                target(
                    "sum by (node, gpu, type) "
                    f'(increase(rankwatch_gpu_ecc_errors_total{{{g}, scope="volatile"}}[$__rate_interval]))',
                    "{{node}} gpu {{gpu}} {{type}}",
                )
            ],
            min0=True,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Xid events",
            [
                target(
                    "sum by (node, gpu, xid) "
                    f"(increase(rankwatch_gpu_xid_errors_total{{{g}}}[$__rate_interval]))",
                    "{{node}} gpu {{gpu}} Xid {{xid}}",
                )
            ],
            description="Xid 79: fallen off the bus; 48/63/64/94/95: memory errors; 13/31/43: the program.",
            min0=True,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "PCIe replays",
            [target(f"increase(rankwatch_gpu_pcie_replay_total{{{g}}}[$__rate_interval])", leg)],
            min0=True,
        ),
        8,
        8,
    )
    L.row("Activity, links and energy (dcgm-exporter's counters, from NVML)")
    L.add(
        timeseries(
            "SM and tensor-core activity",
            [
                target(f"rankwatch_gpu_sm_active_ratio{{{g}}}", "{{node}} gpu {{gpu}} SM"),
                target(f"rankwatch_gpu_tensor_active_ratio{{{g}}}", "{{node}} gpu {{gpu}} tensor"),
                target(f"rankwatch_gpu_dram_active_ratio{{{g}}}", "{{node}} gpu {{gpu}} DRAM"),
            ],
            unit="percentunit",
            min0=True,
            max1=True,
            description="NVML GPM (Hopper and later). Utilisation says a kernel ran; this says how busy "
            "the SMs were: a rank spinning in NCCL shows high utilisation and low tensor activity.",
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Time with clocks held back",
            [
                target(
                    f"sum by (node, gpu, reason) (rate(rankwatch_gpu_clock_event_seconds_total{{{g}}}"
                    "[$__rate_interval]))",
                    "{{node}} gpu {{gpu}} {{reason}}",
                )
            ],
            unit="percentunit",
            min0=True,
            description="Share of time the clocks were limited, by cause (NVML violation counters).",
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "PCIe throughput",
            [
                target(
                    f"rankwatch_gpu_pcie_throughput_bytes_per_second{{{g}}}",
                    "{{node}} gpu {{gpu}} {{direction}}",
                )
            ],
            unit="Bps",
            min0=True,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "NVLink throughput",
            [
                target(
                    f"rate(rankwatch_gpu_nvlink_data_bytes_total{{{g}}}[$__rate_interval])",
                    "{{node}} gpu {{gpu}} {{direction}}",
                ),
                target(
                    "sum by (node, gpu) "
                    f"(increase(rankwatch_gpu_nvlink_errors_total{{{g}}}[$__rate_interval]))",
                    "{{node}} gpu {{gpu}} errors",
                ),
            ],
            unit="Bps",
            min0=True,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Energy",
            [target(f"increase(rankwatch_gpu_energy_joules_total{{{g}}}[$__rate_interval]) / 3.6e6", leg)],
            unit="kwatth",
            min0=True,
            description="kWh per interval, from NVML's total-energy counter.",
        ),
        8,
        8,
    )
    L.add(
        table(
            "Memory health per GPU",
            [
                target(f"{by} ({ecc})", instant=True, table=True),
                target(f"{by} (rankwatch_gpu_retired_pages_total{{{g}}})", instant=True, table=True),
                target(f"{by} (rankwatch_gpu_remapped_rows_total{{{g}}})", instant=True, table=True),
                target(
                    f"max by (node, gpu, uuid) (rankwatch_gpu_remapped_rows_pending{{{g}}}"
                    f" + rankwatch_gpu_retired_pages_pending{{{g}}})",
                    instant=True,
                    table=True,
                ),
            ],
            description="Value #A lifetime ECC errors, #B retired pages, #C remapped rows, #D reset pending.",
        ),
        24,
        8,
    )  # fmt: skip
    variables = [_run_var(multi=True), _node_var(), _rank_var(metric="rankwatch_gpu_collector_up")]
    ann = [
        annotation(
            "GPU findings",
            f'rankwatch_active_findings{{{RUN_SEL}, kind=~"gpu_.*|xid|ecc_error"}} > 0',
            "{{kind}}",
            "rank {{rank}} on {{node}}",
            "red",
            "kind,node",
        ),
        annotation(
            "Xid",
            f"changes(rankwatch_gpu_xid_errors_total{{{RUN_SEL}}}[2m]) > 0",
            "Xid {{xid}}",
            "{{node}} gpu {{gpu}}",
            "orange",
            "xid,node",
        ),
    ]
    return dashboard(
        "rankwatch-gpu",
        "rankwatch / GPU fleet",
        "Every GPU the agents sample through NVML: utilisation, memory, heat, power, throttling, ECC, Xid.",
        variables,
        L,
        ann,
    )


DASHBOARDS = {
    "rankwatch-run.json": run_overview,
    "rankwatch-rank.json": rank_detail,
    "rankwatch-gpu.json": gpu_fleet,
}


def render_dashboards() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2, sort_keys=False) + "\n" for name, build in DASHBOARDS.items()}


def render_configmap(files: dict[str, str]) -> str:
    """A ConfigMap that kube-prometheus-stack's Grafana sidecar picks up by its label."""
    lines = [
        "# Generated by grafana/build_dashboards.py from grafana/dashboards/*.json; do not edit.",
        '# kube-prometheus-stack\'s Grafana sidecar loads every ConfigMap labelled grafana_dashboard: "1".',
        "apiVersion: v1",
        "kind: ConfigMap",
        "metadata:",
        "  name: rankwatch-dashboards",
        "  labels:",
        '    grafana_dashboard: "1"',
        "    app.kubernetes.io/name: rankwatch",
        "    app.kubernetes.io/component: dashboards",
        "  annotations:",
        "    grafana_folder: rankwatch",
        "data:",
    ]
    for name, text in sorted(files.items()):
        # Compact JSON: kubectl apply keeps the whole object in an annotation limited to 256 KiB.
        lines.append(f"  {name}: |-")
        lines.append("    " + json.dumps(json.loads(text), separators=(",", ":")))
    return "\n".join(lines) + "\n"


def expected_files() -> dict[Path, str]:
    dashboards = render_dashboards()
    out = {DASHBOARDS_DIR / name: text for name, text in dashboards.items()}
    out[CONFIGMAP] = render_configmap(dashboards)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the committed files differ")
    args = p.parse_args(argv)
    stale = []
    for path, text in expected_files().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(HERE.parent)}")
    for path in stale:
        print(
            f"out of date: {path.relative_to(HERE.parent)} (run python grafana/build_dashboards.py)",
            file=sys.stderr,
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
