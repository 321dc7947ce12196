"""Alert routing and delivery: dedup, grouping, rate limits, retries, an on-disk spool, and sinks
for Slack, Prometheus Alertmanager and generic webhooks. See ``dispatcher`` for the policy.

The names below are imported on first use: an agent whose configuration names no sink
loads the sinks (``sinks``) to learn that, never the dispatcher and its board, peers,
policy and spool (~0.8 MB of the agent's memory).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankwatch.actions.alerts.dispatcher import AlertDispatcher
    from rankwatch.actions.alerts.message import AlertMember, AlertMessage, AlertSink, DeliveryError
    from rankwatch.actions.alerts.sinks import sinks_from_config

_WHERE = {
    "AlertDispatcher": "dispatcher",
    "AlertMember": "message",
    "AlertMessage": "message",
    "AlertSink": "message",
    "DeliveryError": "message",
    "sinks_from_config": "sinks",
}

__all__ = [
    "AlertDispatcher",
    "AlertMember",
    "AlertMessage",
    "AlertSink",
    "DeliveryError",
    "sinks_from_config",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
