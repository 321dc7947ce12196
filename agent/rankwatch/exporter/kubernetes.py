"""Node mode on Kubernetes: which pod each watched rank is, as info series to join on.

``rankwatch_pod_info{run,rank,local_rank,node,namespace,pod,container} 1`` and one
``rankwatch_pod_gpu_info{...,uuid} 1`` per GPU the kubelet gave the container (kube-state-metrics'
``kube_pod_info`` pattern): ``rankwatch_gpu_utilization_ratio * on(run,rank) group_left(namespace,pod)
rankwatch_pod_info`` puts the pod on any rankwatch series.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from rankwatch.exporter.collector import register
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot

POD_LABELS = (*RANK_LABELS, "namespace", "pod", "container")


@register("kubernetes", applies=lambda s: s.pods is not None)
def collect_pods(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
    info = GaugeMetricFamily(
        "rankwatch_pod_info",
        "The pod and container of a watched rank (node mode on Kubernetes)",
        labels=POD_LABELS,
    )
    gpus = GaugeMetricFamily(
        "rankwatch_pod_gpu_info",
        "A GPU the kubelet's pod-resources API assigns to a watched rank's container",
        labels=[*POD_LABELS, "uuid"],
    )
    for p in snap.pods or ():
        labels = [*p.labels, p.namespace, p.pod, p.container]
        info.add_metric(labels, 1.0)
        for uuid in p.gpus:
            gpus.add_metric([*labels, uuid], 1.0)
    return [info, gpus]
