"""Config hot reload, named as Prometheus names its own (``prometheus_config_last_reload_successful``),
so one alert rule catches a bad edit that the agent is quietly surviving."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rankwatch.exporter.view import RANK_LABELS


class ConfigReloadCollector:
    def __init__(self, snapshot: Callable[[], Mapping[str, Any]], labels: Sequence[str]) -> None:
        self.snapshot = snapshot
        self.labels = list(labels)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot()
        reloads = CounterMetricFamily(
            "rankwatch_config_reloads_total",
            "Reloads of the edited --config file by result (error: invalid, the last good config is kept)",
            labels=[*RANK_LABELS, "result"],
        )
        for result in ("ok", "error"):
            reloads.add_metric([*self.labels, result], int(snap["reloads"].get(result, 0)))
        ok = GaugeMetricFamily(
            "rankwatch_config_last_reload_successful",
            "1 when the config file on disk is the one in effect; 0 after an invalid edit",
            labels=RANK_LABELS,
        )
        ok.add_metric(self.labels, 1.0 if snap["last_success"] else 0.0)
        when = GaugeMetricFamily(
            "rankwatch_config_last_reload_success_timestamp_seconds",
            "Unix time the config in effect was loaded",
            labels=RANK_LABELS,
        )
        when.add_metric(self.labels, float(snap["last_success_time"]))
        return [reloads, ok, when]
