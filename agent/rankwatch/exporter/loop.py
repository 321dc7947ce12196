"""The agent keeping up: its event loop's lag, and output dropped because nobody read it
(run mode's echo of the rank's output, the agent's own stderr)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rankwatch.exporter.collector import register
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot


@register("loop")
def collect_loop(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
    snap.need("loop")
    labels = list(snap.labels)
    out: list[Metric] = []
    if snap.loop is not None:
        lag = GaugeMetricFamily(
            "rankwatch_event_loop_lag_seconds",
            "How late the agent's event loop ran its last periodic tick (detection is that late)",
            labels=RANK_LABELS,
        )
        lag.add_metric(labels, snap.loop.lag)
        out.append(lag)
    if snap.echo_dropped_bytes is not None:
        dropped = CounterMetricFamily(
            "rankwatch_echo_dropped_bytes_total",
            "Bytes of the rank's output not echoed to the agent's stdout because nobody read it "
            "(the log file has them)",
            labels=RANK_LABELS,
        )
        dropped.add_metric(labels, snap.echo_dropped_bytes)
        out.append(dropped)
    if snap.stderr_dropped_bytes is not None:
        lost = CounterMetricFamily(
            "rankwatch_stderr_dropped_bytes_total",
            "Bytes of the agent's own stderr (its log lines, console findings) dropped because nobody "
            "read it",
            labels=RANK_LABELS,
        )
        lost.add_metric(labels, snap.stderr_dropped_bytes)
        out.append(lost)
    return out
