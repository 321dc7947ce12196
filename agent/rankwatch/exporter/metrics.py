"""Prometheus metrics of the live agent, read from one snapshot per scrape.

The hot path (log lines, records, findings) does no metric bookkeeping; a scrape takes a
snapshot of the agent (``rankwatch.snapshot``, built by the runtime) and hands it to each
registered collector (``collector.py``), one module each, node_exporter style:

- ``training``: ``rankwatch_step``, ``_total_steps``, ``_eta_seconds``,
  ``_last_progress_timestamp_seconds``, ``_seconds_since_progress``,
  ``_stall_timeout_seconds``, ``_step_duration_seconds`` (a gauge: median of the last 20
  printed step times, else derived from the step rate), ``_step_time_seconds`` (a
  histogram of every printed step time since start, for means and quantiles), and what
  the framework printed: ``_loss`` (NaN stays NaN), ``_eval_loss``, ``_grad_norm``,
  ``_learning_rate``, ``_loss_scale``,
  ``_tokens_per_second``, ``_samples_per_second``, ``_flops_per_second``, ``_mfu_ratio``,
  ``_framework_memory_bytes``, ``_framework_max_memory_bytes``; only when printed.
- ``process``: ``rankwatch_process_{up,cpu_ratio,cpu_seconds_total,resident_memory_bytes,
  threads,children,state{state}}`` of the watched process tree.
- ``logs``: ``rankwatch_sources_attached``, ``rankwatch_log_lines_total{result}``,
  ``_log_read_bytes_total``, ``_log_rotations_total``, ``_log_truncations_total``,
  ``_log_open_errors_total``, ``_log_open_refused_total``.
- ``findings``: ``rankwatch_findings_total{kind,severity}``, ``rankwatch_active_findings``.
- ``loop``: ``rankwatch_event_loop_lag_seconds``, ``rankwatch_echo_dropped_bytes_total``,
  ``rankwatch_stderr_dropped_bytes_total``.
- ``gpu`` (GPU monitoring on): ``rankwatch_gpu_*`` with ``run``, ``rank``, ``node``,
  ``gpu``, ``uuid`` labels (``rankwatch.gpu.collector``).
- ``checkpoints`` (a checkpoint directory watched): ``rankwatch_checkpoint_*``.
- ``config`` (hot reload on): ``rankwatch_config_reloads_total{result}``,
  ``rankwatch_config_last_reload_successful``, ``_last_reload_success_timestamp_seconds``.
- ``agent`` (``health.py``, run last): ``rankwatch_build_info{version,python}``,
  ``_agent_start_time_seconds``, ``_world_size``, ``_job_end_timestamp_seconds``,
  ``_dumps_captured_total``, ``_dumps_failed_total{reason}``,
  ``_internal_errors_total{component}``, ``_alerts_{sent,failed,dropped}_total{sink}``,
  ``_alert_groups_total{role}``, ``_http_rejected_total{code}``,
  ``_http_connections_dropped_total{reason}``.

Then, about the collectors themselves: ``rankwatch_collector_success{collector}`` and
``rankwatch_collector_duration_seconds{collector}``; a collector that fails loses its
series for that scrape only, and counts in ``_internal_errors_total``.

Per-rank series carry ``run``, ``rank``, ``local_rank``, ``node`` (empty string when
unknown); never ``job``, which Prometheus owns, and never a step, message or path.
A new concern over what the snapshot already holds is one module of this package with a
``@register``-ed function (found by ``collector.registered``); data the snapshot lacks also
needs a field in ``snapshot.py``, filled in ``runtime/faces.py``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from rankwatch.exporter.collector import Registration, SnapshotCollector, registered
from rankwatch.snapshot import Snapshots, Source


def make_registry(
    source: Source, *, collectors: Sequence[Registration] | None = None, process: bool = True
) -> CollectorRegistry:
    """A fresh registry: the registered collectors (or ``collectors``) over ``source``'s
    snapshots, and the standard ``process_*`` series of the agent's own process."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(source, collectors if collectors is not None else registered()))
    if process:
        ProcessCollector(registry=reg)
    return reg


_registries: weakref.WeakKeyDictionary[Snapshots, CollectorRegistry] = weakref.WeakKeyDictionary()
_registries_lock = threading.Lock()


def registry_for(source: Source) -> CollectorRegistry:
    """One registry per agent, made on first use (``render`` without a registry); a bare
    callable gets a fresh one each time."""
    if not isinstance(source, Snapshots):
        return make_registry(source)
    with _registries_lock:
        reg = _registries.get(source)
        if reg is None:
            reg = _registries[source] = make_registry(source)
        return reg


def render(source: Source, registry: CollectorRegistry | None = None) -> bytes:
    """The text exposition (format 0.0.4) of the agent's metrics."""
    return generate_latest(registry or registry_for(source))
