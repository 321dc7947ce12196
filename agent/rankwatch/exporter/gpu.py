"""``rankwatch_gpu_*``: the GPU sampler's latest samples in the snapshot, rendered by
``rankwatch.gpu.collector`` (which names and documents the series)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import Metric

from rankwatch.exporter.collector import register
from rankwatch.gpu.collector import gpu_metric_families
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot


def _monitored(snap: AgentSnapshot) -> bool:
    return snap.gpu is not None


@register("gpu", component="gpu", applies=_monitored)
def collect_gpu(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
    snap.need("gpu")
    g = snap.gpu
    if g is None:
        return []
    return gpu_metric_families(
        g.by_rank, dict(zip(RANK_LABELS, snap.labels, strict=True)), up=g.up, local_ranks=snap.local_ranks
    )
