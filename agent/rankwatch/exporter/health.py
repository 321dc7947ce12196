"""The agent itself: build, start time, dumps, alert delivery and its own failures.

Every component that can fail is listed with 0 from the start, so
``increase(rankwatch_internal_errors_total[1h]) > 0`` works without a prior error.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from rankwatch import __version__
from rankwatch.exporter.view import RANK_LABELS, RankView

COMPONENTS = (
    "parser",
    "watcher",
    "detector",
    "sampler",
    "sink",
    "exporter",
    "server",
    "dumps",
    "alerts",
    "gpu",
)
ALERT_COUNTS = (
    ("sent", "delivered to the sink"),
    ("failed", "failed delivery attempts"),
    ("dropped", "given up or dropped"),
)


def internal_errors(agent: Any, views: Sequence[RankView], exporter_errors: int = 0) -> dict[str, int]:
    """By component: watcher-level counters, sink failures and whatever the agent adds
    under ``internal_errors_by_component`` (the HTTP server counts there)."""
    out = dict.fromkeys(COMPONENTS, 0)
    for v in views:
        if not v.own:
            continue
        w = v.watcher
        out["parser"] += sum(s.parser.stats.errors for s in w.streams)
        out["watcher"] += w.internal_errors
        out["sampler"] += w.sample_errors
        out["detector"] += sum(e.internal_errors for e in list(w.engines.values()))
    out["sink"] += sum(getattr(agent, "sink_errors", {}).values())
    out["exporter"] += exporter_errors
    extra: Mapping[str, int] = getattr(agent, "internal_errors_by_component", None) or {}
    for name, n in list(extra.items()):
        out[str(name)] = out.get(str(name), 0) + int(n)
    return out


def collect_agent(
    agent: Any, views: Sequence[RankView], agent_labels: Sequence[str], started: float, exporter_errors: int
) -> list[Metric]:
    labels = list(agent_labels)
    info = InfoMetricFamily("rankwatch_build", "Version of the agent and of its Python")
    info.add_metric([], {"version": __version__, "python": platform.python_version()})
    start = GaugeMetricFamily(
        "rankwatch_agent_start_time_seconds", "Unix time the agent started", labels=RANK_LABELS
    )
    start.add_metric(labels, float(getattr(agent, "started_at", None) or started))
    out: list[Metric] = [info, start]
    world = getattr(agent.identity, "world_size", None)
    if world is not None:
        ws = GaugeMetricFamily("rankwatch_world_size", "Number of ranks of the run", labels=RANK_LABELS)
        ws.add_metric(labels, world)
        out.append(ws)
    job_end = getattr(agent.identity, "job_end", None)
    if job_end is not None:
        je = GaugeMetricFamily(
            "rankwatch_job_end_timestamp_seconds",
            "Unix time the job's allocation ends (Slurm time limit)",
            labels=RANK_LABELS,
        )
        je.add_metric(labels, float(job_end))
        out.append(je)
    dumps = CounterMetricFamily(
        "rankwatch_dumps_captured_total",
        "Stack dumps written (one per rank per incident)",
        labels=RANK_LABELS,
    )
    dumps.add_metric(labels, getattr(agent, "dumps_captured", 0))
    failed = CounterMetricFamily(
        "rankwatch_dumps_failed_total",
        "Stack dumps that could not read the stacks (the rank's file says why), by reason",
        labels=[*RANK_LABELS, "reason"],
    )
    for reason, n in sorted(getattr(agent, "dumps_failed", {}).items()):
        failed.add_metric([*labels, reason], n)
    out.append(failed)
    errors = CounterMetricFamily(
        "rankwatch_internal_errors_total",
        "Failures inside the agent, isolated and survived, by component",
        labels=[*RANK_LABELS, "component"],
    )
    for comp, n in sorted(internal_errors(agent, views, exporter_errors).items()):
        errors.add_metric([*labels, comp], n)
    out += [dumps, errors]
    stats: Mapping[str, Mapping[str, int]] | None = getattr(agent, "alert_stats", None)
    if stats is not None:
        for key, doc in ALERT_COUNTS:
            fam = CounterMetricFamily(
                f"rankwatch_alerts_{key}_total", f"Alerts {doc}, by sink", labels=[*RANK_LABELS, "sink"]
            )
            for sink, counts in sorted(dict(stats).items()):
                fam.add_metric([*labels, str(sink)], int(counts.get(key, 0)))
            out.append(fam)
    peers: Mapping[str, int] | None = getattr(agent, "alert_peer_stats", None)
    if peers is not None:
        fam = CounterMetricFamily(
            "rankwatch_alert_groups_total",
            "Cross-agent grouped alerts by this agent's role: led (sent for its peers too), took_over "
            "(a silent sender's), grouped_by_peer (a peer sent it), fallback (board unusable, sent alone)",
            labels=[*RANK_LABELS, "role"],
        )
        for role, n in sorted(dict(peers).items()):
            fam.add_metric([*labels, role], int(n))
        out.append(fam)
    rejected: Mapping[int, int] | None = getattr(agent, "http_rejected", None)
    if rejected is not None:
        fam = CounterMetricFamily(
            "rankwatch_http_rejected_total",
            "Malformed or oversized HTTP requests refused before routing, by status code",
            labels=[*RANK_LABELS, "code"],
        )
        for code, n in sorted(dict(rejected).items()):
            fam.add_metric([*labels, str(code)], int(n))
        out.append(fam)
    dropped: Mapping[str, int] | None = getattr(agent, "http_connections_dropped", None)
    if dropped is not None:
        fam = CounterMetricFamily(
            "rankwatch_http_connections_dropped_total",
            "HTTP connections the server closed to stay within server.max_connections and its file "
            "descriptors: idle_evicted, all_busy, shed_on_emfile; accept_failed counts failed accept() calls",
            labels=[*RANK_LABELS, "reason"],
        )
        for reason in ("idle_evicted", "all_busy", "shed_on_emfile", "accept_failed"):
            fam.add_metric([*labels, reason], int(dict(dropped).get(reason, 0)))
        out.append(fam)
    return out
