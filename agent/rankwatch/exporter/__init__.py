"""Prometheus metrics of the live agent (see ``metrics`` for the list)."""

from rankwatch.exporter.collector import Registration, SnapshotCollector, register, registered
from rankwatch.exporter.findings import FindingTracker
from rankwatch.exporter.metrics import make_registry, registry_for, render

__all__ = [
    "FindingTracker",
    "Registration",
    "SnapshotCollector",
    "make_registry",
    "register",
    "registered",
    "registry_for",
    "render",
]
