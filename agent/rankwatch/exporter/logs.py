"""The log pipeline of each watched rank: what was read, parsed, cut, rotated.

Counted per watcher (one rank's log files together); a path is never a label.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rankwatch.exporter.collector import register
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot


@register("logs")
def collect_logs(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
    snap.need("ranks")
    snap.need("logs")
    attached = GaugeMetricFamily(
        "rankwatch_sources_attached",
        "1 when the rank has something to watch: a process attached or a log file present",
        labels=RANK_LABELS,
    )
    lines = CounterMetricFamily(
        "rankwatch_log_lines_total",
        "Log lines by outcome: parsed (gave a record), unparsed, cut (longer than max_line_bytes), "
        "rank_refused (naming a rank outside the world or past logs.max_ranks: dropped), shed "
        "(passed over unparsed while the agent was far behind: logs.shed_backlog)",
        labels=[*RANK_LABELS, "result"],
    )
    read = CounterMetricFamily(
        "rankwatch_log_read_bytes_total", "Bytes read from the rank's log files", labels=RANK_LABELS
    )
    rotations = CounterMetricFamily(
        "rankwatch_log_rotations_total",
        "Log files replaced under the same name (rotation)",
        labels=RANK_LABELS,
    )
    truncations = CounterMetricFamily(
        "rankwatch_log_truncations_total", "Log files truncated in place (copytruncate)", labels=RANK_LABELS
    )
    reopen = CounterMetricFamily(
        "rankwatch_log_open_errors_total", "Failed attempts to open a log file", labels=RANK_LABELS
    )
    refused = CounterMetricFamily(
        "rankwatch_log_open_refused_total",
        "Log files the agent refused to open: a symlink, FIFO, device or another user's file "
        "where the log was (counted once per change, never opened)",
        labels=RANK_LABELS,
    )
    for v in snap.ranks:
        lv = v.logs
        if lv is None or v.sources is None:
            continue
        labels = list(v.labels)
        attached.add_metric(labels, 1.0 if v.sources.attached else 0.0)
        outcomes = (("parsed", lv.parsed), ("unparsed", lv.unparsed), ("cut", lv.cut))
        for result, n in (*outcomes, ("rank_refused", lv.rank_refused), ("shed", lv.shed)):
            lines.add_metric([*labels, result], n)
        read.add_metric(labels, lv.bytes_read)
        rotations.add_metric(labels, lv.rotations)
        truncations.add_metric(labels, lv.truncations)
        reopen.add_metric(labels, lv.open_errors)
        refused.add_metric(labels, lv.open_refused)
    return [attached, lines, read, rotations, truncations, reopen, refused]
