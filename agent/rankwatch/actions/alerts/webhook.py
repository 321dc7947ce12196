"""Generic JSON webhook sink: its settings (``alerts.webhook``) and its builder.

The sink itself is in ``_webhook``, imported when the configuration names a URL: the schema
imports this module for its settings in every agent, the sink's code only an agent that
sends to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rankwatch.actions.alerts.sinks import register_sink, sink_name
from rankwatch.config.settings import Duration, has_userinfo, opt, settings, settings_of, url_problem

if TYPE_CHECKING:
    from rankwatch.actions.alerts.message import AlertSink
    from rankwatch.config.schema import AlertsConfig


@settings("alerts", "webhook", "generic JSON webhook")
@dataclass(frozen=True)
class WebhookConfig:
    urls: tuple[str, ...] = opt((), "generic JSON webhooks (POST)", url=True)
    names: dict[str, str] = opt(
        {}, "URL -> sink name (sink label, spool routing); default webhook (-<URL hash> if several)", url=True
    )
    headers: dict[str, str] = opt(
        {}, "extra headers, e.g. Authorization: Bearer ${HOOK_TOKEN}", secret_headers="HOOK_TOKEN"
    )
    timeout: Duration = opt(Duration(10.0), "per-request timeout", min=0.1)

    def problems(self) -> list[tuple[str, str]]:
        out = [(f"urls[{i}]", why) for i, u in enumerate(self.urls) if (why := url_problem(u))]
        if any(k.strip().lower() == "authorization" for k in self.headers):
            out += [
                (
                    f"urls[{i}]",
                    "holds user:password@ and alerts.webhook.headers sets Authorization: an HTTP "
                    "request carries one or the other; keep the header (Bearer ${HOOK_TOKEN}) or the "
                    "URL's credentials, not both",
                )
                for i, u in enumerate(self.urls)
                if has_userinfo(u)
            ]
        return out


@register_sink("webhook")
def webhook_sinks(cfg: AlertsConfig) -> list[AlertSink]:
    wh = settings_of(cfg, WebhookConfig)
    urls = list(dict.fromkeys(wh.urls))
    if not urls:
        return []  # the sink's code is not loaded
    from rankwatch.actions.alerts._webhook import WebhookSink

    return [
        WebhookSink(
            url,
            headers=wh.headers,
            timeout=wh.timeout,
            name=sink_name("webhook", url, wh.names, alone=len(urls) == 1),
        )
        for url in urls
    ]
