"""The alert sinks there are: each sink module registers a builder with ``@register_sink``.

A builder takes the ``alerts`` section and returns the sinks it configures (none when its
settings are empty). ``sinks_from_config`` imports every module of this package first (but
the dispatcher's own, ``MACHINERY``: an agent without sinks never loads them), so a
sink in a new file (``actions/alerts/<name>.py``: a class with ``name`` and
``async send(alert)``, see ``message.AlertSink``, plus its builder) needs no other line;
README's ``file.py`` is the smallest example. Sinks are built in the order their names sort, so
a configuration always yields the same list. A module whose name starts with ``_`` is not a
sink: the built-in sinks keep their code there (``_slack``, ``_webhook``, ``_alertmanager``)
and their module (``slack.py``, ...) holds the settings and a builder that imports it only
when the configuration names the sink, so an agent without sinks loads none of it (nor
``message``).

A sink's settings are a frozen dataclass in its own module, registered with
``@settings("alerts", <key>, <doc>)`` (``config.settings``): the config schema imports the
sink modules (through ``load_all``) to assemble ``alerts``. So a sink module imports
``config.schema`` only under ``TYPE_CHECKING`` (tests/test_settings.py), and its network
stack (aiohttp, asyncio, slack-sdk) on first delivery, so `rankwatch analyze` does not load
it (tests/test_light.py).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rankwatch.config.settings import plugin_modules

if TYPE_CHECKING:  # the schema imports the sinks (their settings) while it is being built
    from rankwatch.actions.alerts.message import AlertSink
    from rankwatch.config.schema import AlertsConfig

SinkBuilder = Callable[["AlertsConfig"], "list[AlertSink]"]

REGISTRY: dict[str, SinkBuilder] = {}
_loaded = False
# The modules of this package that are not sinks.
MACHINERY = frozenset(
    {"board", "delivery", "dispatcher", "message", "peers", "policy", "sinks", "spool", "state", "threads"}
)


def register_sink(kind: str) -> Callable[[SinkBuilder], SinkBuilder]:
    """Decorator: ``fn(alerts_config)`` builds the sinks of ``kind`` for every agent."""

    def add(fn: SinkBuilder) -> SinkBuilder:
        other = REGISTRY.get(kind)
        if other is not None and other is not fn and other.__qualname__ != fn.__qualname__:
            raise TypeError(f"two alert sinks are registered as {kind!r}")
        REGISTRY[kind] = fn
        return fn

    return add


def load_all() -> dict[str, SinkBuilder]:
    """Every module of the package, imported once; the registered builders by kind."""
    global _loaded
    if not _loaded:
        package = __name__.rpartition(".")[0]
        for name in plugin_modules(Path(__file__).parent):
            if name not in MACHINERY and not name.startswith("_"):
                importlib.import_module(f"{package}.{name}")
        _loaded = True
    return dict(REGISTRY)


def sinks_from_config(cfg: AlertsConfig) -> list[AlertSink]:
    """The sinks this configuration names, every registered kind asked in name order."""
    builders = load_all()
    return [sink for kind in sorted(builders) for sink in builders[kind](cfg)]


def sink_name(kind: str, target: str, names: dict[str, str], *, alone: bool) -> str:
    """Named by what it sends to, not by position: the spool routes backlog by this name, so
    reordering the URLs in the config must not send one receiver's alerts to another. The
    only sink of its kind keeps the plain kind name (``sink="alertmanager"`` in dashboards)."""
    given = names.get(target)
    if given:
        return given
    return kind if alone else f"{kind}-{hashlib.sha256(target.encode()).hexdigest()[:8]}"
