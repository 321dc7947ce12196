"""The log pipeline of each watched rank: what was read, parsed, cut, rotated.

Counted per watcher (one rank's log files together); a path is never a label.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rankwatch.exporter.view import RANK_LABELS, RankView, sources_status


def collect_logs(views: Sequence[RankView]) -> list[Metric]:
    attached = GaugeMetricFamily(
        "rankwatch_sources_attached",
        "1 when the rank has something to watch: a process attached or a log file present",
        labels=RANK_LABELS,
    )
    lines = CounterMetricFamily(
        "rankwatch_log_lines_total",
        "Log lines by outcome: parsed (gave a record), unparsed, cut (longer than max_line_bytes)",
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
    for v in views:
        if not v.own:
            continue
        w = v.watcher
        labels = list(v.labels)
        ok, _ = sources_status(w)
        attached.add_metric(labels, 1.0 if ok else 0.0)
        parsed = unparsed = cut = nbytes = rot = trunc = errs = refusals = 0
        for s in w.streams:
            ps, fs = s.parser.stats, s.follower.stats
            parsed, unparsed, cut = parsed + ps.parsed, unparsed + ps.unparsed, cut + ps.cut
            nbytes, rot, trunc = nbytes + fs.bytes_read, rot + fs.rotations, trunc + fs.truncations
            errs += fs.reopen_errors
            refusals += fs.refused_opens
        for result, n in (("parsed", parsed), ("unparsed", unparsed), ("cut", cut)):
            lines.add_metric([*labels, result], n)
        read.add_metric(labels, nbytes)
        rotations.add_metric(labels, rot)
        truncations.add_metric(labels, trunc)
        reopen.add_metric(labels, errs)
        refused.add_metric(labels, refusals)
    return [attached, lines, read, rotations, truncations, reopen, refused]
