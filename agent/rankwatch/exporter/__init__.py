"""Prometheus metrics of the live agent (see ``metrics`` for the list)."""

from rankwatch.exporter.findings import FindingTracker
from rankwatch.exporter.metrics import AgentCollector, make_registry, registry_for, render

__all__ = ["AgentCollector", "FindingTracker", "make_registry", "registry_for", "render"]
