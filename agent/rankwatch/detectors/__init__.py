"""Detectors: pure rules over a rank's state and events, one failure family per module.

Adding a detector is one new file in this package: a ``Detector`` subclass that declares
the event types it ``accepts`` (``rankwatch.events``, ``rankwatch.records``), the finding
``kinds`` it emits and its config ``section``, decorated with ``@register``
(``detectors.registry``). ``build_detectors`` imports every module of the package (ordered
as ``registry.py`` says), so the engine of every rank, live or in ``analyze``, builds it and
routes its events to it; a ``create`` classmethod builds it from the configuration (or
returns None to stay out). Its settings are a frozen dataclass in the same module,
registered with ``@settings("detectors", <key>, <doc>)`` (``config.settings``): the schema
adds ``detectors.<key>``; the module imports ``config.schema`` only under ``TYPE_CHECKING``.
It may import ``records``, ``events``, ``state``, ``config`` and other detector modules,
never a source, GPU, checkpoint, runtime, dump or action module. ``host_memory.py`` is a
small example.
"""

from __future__ import annotations

from rankwatch.detectors.base import Detector, DetectorContext
from rankwatch.detectors.registry import REGISTRY, build_detectors, register

__all__ = ["REGISTRY", "Detector", "DetectorContext", "build_detectors", "register"]
