"""Config hot reload, named as Prometheus names its own (``prometheus_config_last_reload_successful``),
so one alert rule catches a bad edit that the agent is quietly surviving."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rankwatch.exporter.collector import register
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot


def _reloading(snap: AgentSnapshot) -> bool:
    return snap.config_reload is not None or "config" in snap.broken


@register("config", component="config", applies=_reloading)
def collect_config(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
    snap.need("config")
    c = snap.config_reload
    if c is None:
        return []
    labels = list(snap.labels)
    reloads = CounterMetricFamily(
        "rankwatch_config_reloads_total",
        "Reloads of the edited --config file by result (error: invalid, the last good config is kept)",
        labels=[*RANK_LABELS, "result"],
    )
    for result in ("ok", "error"):
        reloads.add_metric([*labels, result], int(c.reloads.get(result, 0)))
    ok = GaugeMetricFamily(
        "rankwatch_config_last_reload_successful",
        "1 when the config file on disk is the one in effect; 0 after an invalid edit",
        labels=RANK_LABELS,
    )
    ok.add_metric(labels, 1.0 if c.last_success else 0.0)
    when = GaugeMetricFamily(
        "rankwatch_config_last_reload_success_timestamp_seconds",
        "Unix time the config in effect was loaded",
        labels=RANK_LABELS,
    )
    when.add_metric(labels, c.last_success_time)
    return [reloads, ok, when]
