"""The agent itself: build, start time, dumps, alert delivery and its own failures.

Every component that can fail is listed with 0 from the start (a polled source, under its
own name, from when it is built), so ``increase(rankwatch_internal_errors_total[1h]) > 0``
sees the first error: a counter series born at 1 has no increase to Prometheus.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from rankwatch import __version__
from rankwatch.exporter.collector import register
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot

COMPONENTS = (
    "parser",
    "watcher",
    "detector",
    "logs",
    "sink",
    "exporter",
    "server",
    "dumps",
    "alerts",
    "gpu",
    "checkpoints",
    "config",
    "deadline",
    "enrich",
    "hold",
    "io",
    "process",
    "process_env",
    "signals",
    "sources",
    "runfolder",
)  # tests/test_metrics.py checks that every name the agent counts under is here
ALERT_COUNTS = (
    ("sent", "delivered to the sink"),
    ("failed", "failed delivery attempts"),
    ("dropped", "given up or dropped"),
)


def internal_errors(snap: AgentSnapshot, failures: Mapping[str, int]) -> dict[str, int]:
    """By component: what the runtime counted (watchers, sinks, server, ...) and the
    collectors' own failures."""
    out = dict.fromkeys(COMPONENTS, 0)
    for source in (snap.internal_errors, failures):
        for name, n in source.items():
            out[str(name)] = out.get(str(name), 0) + int(n)
    return out


@register("agent", last=True)
def collect_agent(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
    labels = list(snap.labels)
    info = InfoMetricFamily("rankwatch_build", "Version of the agent and of its Python")
    info.add_metric([], {"version": __version__, "python": platform.python_version()})
    start = GaugeMetricFamily(
        "rankwatch_agent_start_time_seconds", "Unix time the agent started", labels=RANK_LABELS
    )
    start.add_metric(labels, snap.started_at)
    out: list[Metric] = [info, start]
    world = snap.identity.world_size
    if world is not None:
        ws = GaugeMetricFamily("rankwatch_world_size", "Number of ranks of the run", labels=RANK_LABELS)
        ws.add_metric(labels, world)
        out.append(ws)
    job_end = snap.identity.job_end
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
    dumps.add_metric(labels, snap.dumps.captured)
    failed = CounterMetricFamily(
        "rankwatch_dumps_failed_total",
        "Stack dumps that could not read the stacks (the rank's file says why), by reason",
        labels=[*RANK_LABELS, "reason"],
    )
    for reason, n in sorted(snap.dumps.failed.items()):
        failed.add_metric([*labels, reason], n)
    out.append(failed)
    errors = CounterMetricFamily(
        "rankwatch_internal_errors_total",
        "Failures inside the agent, isolated and survived, by component",
        labels=[*RANK_LABELS, "component"],
    )
    for comp, n in sorted(internal_errors(snap, failures).items()):
        errors.add_metric([*labels, comp], n)
    out += [dumps, errors]
    stats = snap.alerts
    if stats is not None:
        for key, doc in ALERT_COUNTS:
            fam = CounterMetricFamily(
                f"rankwatch_alerts_{key}_total", f"Alerts {doc}, by sink", labels=[*RANK_LABELS, "sink"]
            )
            for sink, counts in sorted(stats.items()):
                fam.add_metric([*labels, str(sink)], int(counts.get(key, 0)))
            out.append(fam)
    peers = snap.alert_groups
    if peers is not None:
        fam = CounterMetricFamily(
            "rankwatch_alert_groups_total",
            "Cross-agent grouped alerts by this agent's role: led (sent for its peers too), took_over "
            "(a silent sender's), grouped_by_peer (a peer sent it), fallback (board unusable, sent alone)",
            labels=[*RANK_LABELS, "role"],
        )
        for role, n in sorted(peers.items()):
            fam.add_metric([*labels, role], int(n))
        out.append(fam)
    rejected = snap.http_rejected
    if rejected is not None:
        fam = CounterMetricFamily(
            "rankwatch_http_rejected_total",
            "Malformed or oversized HTTP requests refused before routing, by status code",
            labels=[*RANK_LABELS, "code"],
        )
        for code, n in sorted(rejected.items()):
            fam.add_metric([*labels, str(code)], int(n))
        out.append(fam)
    dropped = snap.http_dropped
    if dropped is not None:
        fam = CounterMetricFamily(
            "rankwatch_http_connections_dropped_total",
            "HTTP connections the server closed to stay within server.max_connections and its file "
            "descriptors: idle_evicted, all_busy, shed_on_emfile; accept_failed counts failed accept() calls",
            labels=[*RANK_LABELS, "reason"],
        )
        for reason in ("idle_evicted", "all_busy", "shed_on_emfile", "accept_failed"):
            fam.add_metric([*labels, reason], int(dropped.get(reason, 0)))
        out.append(fam)
    return out
