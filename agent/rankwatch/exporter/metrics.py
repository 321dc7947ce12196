"""Prometheus metrics of the live agent: one custom collector that reads it at scrape time.

The hot path (log lines, records, findings) does no metric bookkeeping; a scrape reads
the watchers' rolling windows and counters (see ``view.py``). Concerns, one module each,
node_exporter style:

- ``training``: ``rankwatch_step``, ``_total_steps``, ``_eta_seconds``,
  ``_last_progress_timestamp_seconds``, ``_seconds_since_progress``,
  ``_stall_timeout_seconds``, ``_step_duration_seconds`` (a gauge: median of the last 20
  printed step times, else derived from the step rate), ``_step_time_seconds`` (a
  histogram of every printed step time since start, for means and quantiles), and what
  the framework printed: ``_loss`` (NaN stays NaN), ``_eval_loss``, ``_grad_norm``,
  ``_learning_rate``, ``_loss_scale``,
  ``_tokens_per_second``, ``_samples_per_second``, ``_flops_per_second``, ``_mfu_ratio``,
  ``_framework_memory_bytes``, ``_framework_max_memory_bytes``; only when printed.
- ``findings``: ``rankwatch_findings_total{kind,severity}``, ``rankwatch_active_findings``.
- ``process``: ``rankwatch_process_{up,cpu_ratio,cpu_seconds_total,resident_memory_bytes,
  threads,children,state{state}}`` of the watched process tree.
- ``logs``: ``rankwatch_sources_attached``, ``rankwatch_log_lines_total{result}``,
  ``_log_read_bytes_total``, ``_log_rotations_total``, ``_log_truncations_total``,
  ``_log_open_errors_total``, ``_log_open_refused_total``.
- ``health``: ``rankwatch_build_info{version,python}``, ``_agent_start_time_seconds``,
  ``_world_size``, ``_dumps_captured_total``, ``_internal_errors_total{component}``,
  ``_alerts_{sent,failed,dropped}_total{sink}`` (from ``agent.alert_stats`` if present).

Per-rank series carry ``run``, ``rank``, ``local_rank``, ``node`` (empty string when
unknown); never ``job``, which Prometheus owns, and never a step, message or path.

Room for later concerns: GPU metrics are ``rankwatch_gpu_*`` with ``run``, ``rank``,
``node``, ``gpu``, ``uuid`` labels (``rankwatch.gpu.collector``), checkpoint metrics
``rankwatch_checkpoint_*`` with the per-rank labels. Each is its own Collector, passed
to ``make_registry(agent, extra=[...])``, so one failing concern never empties a scrape.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from rankwatch.exporter.findings import FindingTracker, collect_findings
from rankwatch.exporter.health import collect_agent
from rankwatch.exporter.logs import collect_logs
from rankwatch.exporter.process import collect_process
from rankwatch.exporter.training import collect_training
from rankwatch.exporter.view import identity_labels, labels_for_rank, rank_views

log = logging.getLogger("rankwatch.exporter")


class AgentCollector(Collector):
    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.tracker = FindingTracker.of(agent)
        self.started = time.time()
        self.errors = 0
        self._logged: set[str] = set()

    def describe(self) -> Iterable[Metric]:
        return ()  # no dry-run collect at register time; the names are fixed in this package

    def _failed(self, name: str) -> None:
        self.errors += 1
        if name not in self._logged:
            self._logged.add(name)
            log.exception("metrics of %s failed (further failures only counted)", name)

    def _guard(self, name: str, fn: Callable[[], list[Metric]]) -> list[Metric]:
        try:
            return fn()
        except Exception:
            self._failed(name)
            return []

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        try:
            views = rank_views(list(agent.watchers))
            self.tracker.update(agent.findings)
        except Exception:
            self._failed("ranks")
            views = []
        own = identity_labels(agent)
        parts = [
            self._guard("training", lambda: collect_training(views)),
            self._guard("process", lambda: collect_process(views)),
            self._guard("logs", lambda: collect_logs(views)),
            self._guard(
                "findings", lambda: collect_findings(self.tracker, labels_for_rank(views, agent), own)
            ),
        ]
        # Last, so that a failure above is already in rankwatch_internal_errors_total.
        parts.append(
            self._guard("agent", lambda: collect_agent(agent, views, own, self.started, self.errors))
        )
        for fams in parts:
            for fam in fams:
                if fam.samples:
                    yield fam


def make_registry(agent: Any, *, extra: Iterable[Collector] = (), process: bool = True) -> CollectorRegistry:
    """A fresh registry: the agent's collector, ``extra`` ones (GPU, checkpoints), and the
    standard ``process_*`` series of the agent's own process."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AgentCollector(agent))
    for c in extra:
        reg.register(c)
    if process:
        ProcessCollector(registry=reg)
    return reg


_registries: weakref.WeakKeyDictionary[Any, CollectorRegistry] = weakref.WeakKeyDictionary()
_registries_lock = threading.Lock()


def registry_for(agent: Any) -> CollectorRegistry:
    """One registry per agent, made on first use (``render`` without a registry)."""
    with _registries_lock:
        reg = _registries.get(agent)
        if reg is None:
            reg = _registries[agent] = make_registry(agent)
        return reg


def render(agent: Any, registry: CollectorRegistry | None = None) -> bytes:
    """The text exposition (format 0.0.4) of the agent's metrics."""
    return generate_latest(registry or registry_for(agent))
