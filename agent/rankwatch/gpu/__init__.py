"""GPU telemetry through NVML: a narrow backend, a sampler, Xid meanings, metric families.

``GpuConfig`` is the ``gpu`` section of ``config/schema.py``, re-exported here.
The sampler and the collector are imported from their modules (``rankwatch.gpu.sampler``,
``rankwatch.gpu.collector``) so that this package stays import-cycle free.
"""

from __future__ import annotations

from rankwatch.config.schema import GpuConfig
from rankwatch.events import GpuInfo, GpuSample
from rankwatch.gpu.backend import FIELDS, GpuBackend, GpuError, GpuErrorKind, XidEvent

__all__ = [
    "FIELDS",
    "GpuBackend",
    "GpuConfig",
    "GpuError",
    "GpuErrorKind",
    "GpuInfo",
    "GpuSample",
    "XidEvent",
]
