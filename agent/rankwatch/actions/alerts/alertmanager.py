"""Prometheus Alertmanager sink: its settings (``alerts.alertmanager``) and its builder.

The sink itself is in ``_alertmanager``, imported when the configuration names a URL: the schema
imports this module for its settings in every agent, the sink's code only an agent that
sends to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rankwatch.actions.alerts.sinks import register_sink, sink_name
from rankwatch.config.settings import Duration, opt, settings, settings_of, url_problem

if TYPE_CHECKING:
    from rankwatch.actions.alerts.message import AlertSink
    from rankwatch.config.schema import AlertsConfig


@settings("alerts", "alertmanager", "Prometheus Alertmanager v2 API")
@dataclass(frozen=True)
class AlertmanagerConfig:
    urls: tuple[str, ...] = opt((), "Alertmanager base URLs; alerts go to <url>/api/v2/alerts", url=True)
    names: dict[str, str] = opt(
        {},
        "URL -> sink name (sink label, spool routing); default alertmanager (-<URL hash> if several)",
        url=True,
    )
    timeout: Duration = opt(Duration(10.0), "per-request timeout", min=0.1)

    def problems(self) -> list[tuple[str, str]]:
        return [(f"urls[{i}]", why) for i, u in enumerate(self.urls) if (why := url_problem(u))]


@register_sink("alertmanager")
def alertmanager_sinks(cfg: AlertsConfig) -> list[AlertSink]:
    am = settings_of(cfg, AlertmanagerConfig)
    urls = list(dict.fromkeys(am.urls))
    if not urls:
        return []  # the sink's code is not loaded
    from rankwatch.actions.alerts._alertmanager import AlertmanagerSink

    return [
        AlertmanagerSink(
            url, timeout=am.timeout, name=sink_name("alertmanager", url, am.names, alone=len(urls) == 1)
        )
        for url in urls
    ]
