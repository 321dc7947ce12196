"""Collectors as node_exporter has them: each registers itself, reads one snapshot, and
is reported on by name.

A collector is a function ``(snapshot, failures) -> metric families`` registered with
``@register(name)`` in its own module of this package; ``registered()`` imports every module
of the package, which is the whole wiring. Per scrape, ``SnapshotCollector`` takes one
snapshot, runs every collector that applies to it, and says how each went:
``rankwatch_collector_success{collector}`` (0: it raised, its series are missing this
scrape) and ``rankwatch_collector_duration_seconds{collector}``. A failing collector is
logged once and counted under its component in ``rankwatch_internal_errors_total``; the
rest of the scrape stays.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rankwatch.config.settings import plugin_modules
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot, Source, snapshot_fn

log = logging.getLogger("rankwatch.exporter")

# failures: collector failures so far by component, this scrape's included (the health
# collector, run last, exports them).
CollectFn = Callable[[AgentSnapshot, Mapping[str, int]], Iterable[Metric]]


def _always(snap: AgentSnapshot) -> bool:
    return True


@dataclass(frozen=True)
class Registration:
    name: str  # the ``collector`` label
    collect: CollectFn
    component: str = "exporter"  # where its failures count in rankwatch_internal_errors_total
    applies: Callable[[AgentSnapshot], bool] = _always  # else skipped, and not reported on
    last: bool = False  # runs after all others (it exports their failures)


_REGISTERED: dict[str, Registration] = {}


def register(
    name: str,
    *,
    component: str = "exporter",
    applies: Callable[[AgentSnapshot], bool] = _always,
    last: bool = False,
) -> Callable[[CollectFn], CollectFn]:
    """Decorator: add ``fn`` to the collectors every new registry runs."""

    def add(fn: CollectFn) -> CollectFn:
        _REGISTERED[name] = Registration(name, fn, component, applies, last)
        return fn

    return add


_loaded = False


def _load_all() -> None:
    """Every module of the package, imported once (in name order), so a collector in a new
    file registers itself with no import line anywhere else."""
    global _loaded
    if not _loaded:
        package = __name__.rpartition(".")[0]
        for name in plugin_modules(Path(__file__).parent):
            importlib.import_module(f"{package}.{name}")
        _loaded = True


def registered() -> list[Registration]:
    """In registration order (module name order), the ``last`` ones at the end."""
    _load_all()
    regs = list(_REGISTERED.values())
    return [r for r in regs if not r.last] + [r for r in regs if r.last]


class SnapshotCollector(Collector):
    """The prometheus-client collector of the agent: one snapshot per scrape, fed to each
    registered collector in turn."""

    def __init__(self, source: Source, collectors: Sequence[Registration] | None = None) -> None:
        self.snapshot = snapshot_fn(source)
        self.collectors = list(collectors) if collectors is not None else registered()
        self.failures: Counter[str] = Counter()  # by component, since start
        self._logged: set[str] = set()

    def describe(self) -> Iterable[Metric]:
        return ()  # no dry-run collect at register time; the names are fixed in this package

    def _failed(self, what: str, component: str) -> None:
        self.failures[component] += 1
        if what not in self._logged:
            self._logged.add(what)
            log.exception("metrics of %s failed (further failures only counted)", what)

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self.snapshot()
        except Exception:
            self._failed("the agent's snapshot", "exporter")
            return
        labels = list(snap.labels)
        success = GaugeMetricFamily(
            "rankwatch_collector_success",
            "1 when the collector's last run succeeded; 0: it failed and its series are missing",
            labels=[*RANK_LABELS, "collector"],
        )
        duration = GaugeMetricFamily(
            "rankwatch_collector_duration_seconds",
            "How long the collector took in the last scrape",
            labels=[*RANK_LABELS, "collector"],
        )
        for reg in self.collectors:
            started = time.perf_counter()
            try:
                if not reg.applies(snap):
                    continue
                fams = [f for f in reg.collect(snap, self.failures) if f.samples]
                ok = True
            except Exception:
                self._failed(reg.name, reg.component)
                fams, ok = [], False
            success.add_metric([*labels, reg.name], 1.0 if ok else 0.0)
            duration.add_metric([*labels, reg.name], time.perf_counter() - started)
            yield from fams
        yield success
        yield duration
