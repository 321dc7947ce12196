"""Checkpoint health of the rank: can the run resume, from what, and will the next save fit.

Read from the checkpoint watcher's numbers in the snapshot; a value the watcher does not
know yet (no checkpoint seen, free space not read) gives no series rather than 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rankwatch.exporter.collector import register
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot

# metric name (after rankwatch_checkpoint_), help, snapshot key
_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("last_step", "Step of the newest checkpoint judged (any status)", "last_checkpoint_step"),
    (
        "last_timestamp_seconds",
        "Unix time the newest judged checkpoint finished writing",
        "last_checkpoint_timestamp_seconds",
    ),
    ("last_size_bytes", "Size of the newest judged checkpoint", "last_checkpoint_bytes"),
    (
        "last_save_duration_seconds",
        "How long the newest checkpoint took to write",
        "last_save_duration_seconds",
    ),
    ("last_good_step", "Step of the newest checkpoint that verified good", "last_good_step"),
    (
        "last_good_timestamp_seconds",
        "Unix time of the newest good checkpoint: the point a restart resumes from",
        "last_good_timestamp_seconds",
    ),
    (
        "seconds_since_last_good",
        "Seconds since the newest good checkpoint was saved",
        "seconds_since_last_good",
    ),
    ("max_age_seconds", "No new good checkpoint for longer than this is stale", "max_age_seconds"),
    (
        "next_size_bytes",
        "Expected size of the next checkpoint (from the previous ones)",
        "next_checkpoint_bytes",
    ),
    ("fs_free_bytes", "Free space on the checkpoint filesystem (for this user)", "fs_free_bytes"),
    ("fs_size_bytes", "Size of the checkpoint filesystem", "fs_size_bytes"),
    (
        "poisoned_from_step",
        "Checkpoints from this step on were saved after a NaN/divergence",
        "poisoned_from_step",
    ),
)


def checkpoint_families(snap: Mapping[str, Any] | None, labels: Sequence[str]) -> list[Metric]:
    up = GaugeMetricFamily(
        "rankwatch_checkpoint_dir_present", "1 when the checkpoint directory exists", labels=RANK_LABELS
    )
    if snap is None:
        return []
    base = list(labels)
    up.add_metric(base, 1.0 if snap.get("dir_exists") else 0.0)
    out: list[Metric] = [up]
    for name, doc, key in _GAUGES:
        v = snap.get(key)
        if v is None:
            continue
        g = GaugeMetricFamily(f"rankwatch_checkpoint_{name}", doc, labels=RANK_LABELS)
        g.add_metric(base, float(v))
        out.append(g)
    writing = GaugeMetricFamily(
        "rankwatch_checkpoint_writing", "1 while a checkpoint save looks in progress", labels=RANK_LABELS
    )
    writing.add_metric(base, 1.0 if snap.get("writing") else 0.0)
    count = GaugeMetricFamily(
        "rankwatch_checkpoints", "Checkpoints in the directory by status", labels=[*RANK_LABELS, "status"]
    )
    for status, n in sorted((snap.get("checkpoints") or {}).items()):
        count.add_metric([*base, status], float(n))
    scans = CounterMetricFamily(
        "rankwatch_checkpoint_scans", "Scans of the checkpoint directory", labels=RANK_LABELS
    )
    scans.add_metric(base, float(snap.get("scans_total") or 0))
    errors = CounterMetricFamily(
        "rankwatch_checkpoint_scan_errors", "Scans that failed (I/O errors)", labels=RANK_LABELS
    )
    errors.add_metric(base, float(snap.get("errors_total") or 0))
    return [*out, writing, count, scans, errors]


def _watched(snap: AgentSnapshot) -> bool:
    return snap.checkpoints is not None or "checkpoints" in snap.broken


@register("checkpoints", component="checkpoints", applies=_watched)
def collect_checkpoints(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
    snap.need("checkpoints")
    return checkpoint_families(snap.checkpoints, snap.labels)
