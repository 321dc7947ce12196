"""Slack sink (slack-sdk): its settings (``alerts.slack``) and its builder.

The sink itself (``_slack``: Block Kit message, resolve threaded under the original) and
slack-sdk are imported when the configuration names Slack: the schema imports this module
for its settings in every agent, the sink's code only an agent that sends to Slack.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rankwatch.actions.alerts.sinks import register_sink
from rankwatch.config.settings import Duration, opt, settings, settings_of, url_problem

if TYPE_CHECKING:
    from rankwatch.actions.alerts.message import AlertSink
    from rankwatch.config.schema import AlertsConfig


@settings("alerts", "slack", "Slack (slack-sdk)")
@dataclass(frozen=True)
class SlackConfig:
    token: str | None = opt(None, "bot token (xoxb-...), from ${SLACK_BOT_TOKEN}", secret="SLACK_BOT_TOKEN")
    channel: str | None = opt(None, "channel id or name for chat.postMessage")
    webhook_url: str | None = opt(
        None, "incoming-webhook URL, instead of token + channel", secret="SLACK_WEBHOOK_URL"
    )
    base_url: str | None = opt(None, "Slack Web API base URL (tests, proxies); default slack-sdk's", url=True)
    timeout: Duration = opt(Duration(10.0), "per-request timeout", min=0.1)

    def problems(self) -> list[tuple[str, str]]:
        out = []
        for key in ("webhook_url", "base_url"):
            url = getattr(self, key)
            why = url_problem(url) if url else None
            if why:
                out.append((key, why))
        # chat.postMessage answers channel_not_specified without a channel: a bot token alone
        # sends nothing, so it is refused. A channel alone is not: its token usually comes from
        # the environment (token: ${SLACK_BOT_TOKEN}) of the node that runs the agent, not of the
        # one that checks the file; without it Slack is off and the agent says so once.
        if self.token and not self.channel and not self.webhook_url:
            out.append(
                ("token", "a bot token needs alerts.slack.channel (chat.postMessage: channel_not_specified)")
            )
        return out


log = logging.getLogger("rankwatch.alerts.slack")


@register_sink("slack")
def slack_sinks(cfg: AlertsConfig) -> list[AlertSink]:
    s = settings_of(cfg, SlackConfig)
    if (s.token and s.channel) or s.webhook_url:
        from rankwatch.actions.alerts._slack import SlackSink

        return [SlackSink(s)]  # one Slack sink at most: "slack" is already stable
    if s.token or s.channel:
        log.warning("alerts.slack: set both token and channel (or webhook_url); Slack alerts are off")
    return []
