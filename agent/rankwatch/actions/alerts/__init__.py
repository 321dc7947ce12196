"""Alert routing and delivery: dedup, grouping, rate limits, retries, an on-disk spool, and sinks
for Slack, Prometheus Alertmanager and generic webhooks. See ``dispatcher`` for the policy."""

from rankwatch.actions.alerts.dispatcher import AlertDispatcher, sinks_from_config
from rankwatch.actions.alerts.message import AlertMember, AlertMessage, AlertSink, DeliveryError

__all__ = [
    "AlertDispatcher",
    "AlertMember",
    "AlertMessage",
    "AlertSink",
    "DeliveryError",
    "sinks_from_config",
]
