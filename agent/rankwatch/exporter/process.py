"""The watched training process (tree), from the last psutil sample of each rank.

Named ``rankwatch_process_*`` so they never collide with the standard ``process_*``
series that describe the agent itself. A dead process reports only ``up`` = 0 and its
state: the zeros a dead sample carries are not measurements.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rankwatch.exporter.collector import register
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot

# Fixed so the state label stays bounded; anything else psutil reports is "other".
STATES = ("running", "sleeping", "disk-wait", "stopped", "tracing-stop", "zombie", "dead", "idle", "other")


@register("process")
def collect_process(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
    snap.need("ranks")
    snap.need("process")
    up = GaugeMetricFamily(
        "rankwatch_process_up", "1 if the watched process is alive, 0 once it is gone", labels=RANK_LABELS
    )
    cpu = GaugeMetricFamily(
        "rankwatch_process_cpu_ratio",
        "CPU use of the process tree between the last two samples, in cores (1.0 = one core busy)",
        labels=RANK_LABELS,
    )
    cpu_total = CounterMetricFamily(
        "rankwatch_process_cpu_seconds_total",
        "User and system CPU time of the process tree, reaped children included",
        labels=RANK_LABELS,
    )
    rss = GaugeMetricFamily(
        "rankwatch_process_resident_memory_bytes",
        "Resident memory of the process tree",
        labels=RANK_LABELS,
    )
    threads = GaugeMetricFamily(
        "rankwatch_process_threads", "Threads of the process tree", labels=RANK_LABELS
    )
    children = GaugeMetricFamily(
        "rankwatch_process_children",
        "Live descendant processes (e.g. data-loader workers)",
        labels=RANK_LABELS,
    )
    state = GaugeMetricFamily(
        "rankwatch_process_state",
        "1 for the current scheduler state of the main process, 0 for the others",
        labels=[*RANK_LABELS, "state"],
    )
    for v in snap.ranks:
        s = v.process.sample if v.process is not None else None
        if s is None:
            continue
        labels = list(v.labels)
        up.add_metric(labels, 1.0 if s.alive else 0.0)
        current = s.state if s.state in STATES else "other"
        for name in STATES:
            state.add_metric([*labels, name], 1.0 if name == current else 0.0)
        if not s.alive:
            continue
        cpu.add_metric(labels, s.cpu_percent / 100.0)
        cpu_total.add_metric(labels, s.cpu_time_s)
        rss.add_metric(labels, s.rss_bytes)
        threads.add_metric(labels, s.threads)
        children.add_metric(labels, s.children)
    return [up, cpu, cpu_total, rss, threads, children, state]
