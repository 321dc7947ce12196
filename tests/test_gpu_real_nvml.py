"""The real pynvml backend: sane readings on a GPU node, the degraded path anywhere else."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

import pytest

from gpufake import exposition
from rankwatch.gpu import GpuConfig, GpuSample
from rankwatch.gpu.backend import NvmlBackend
from rankwatch.gpu.collector import gpu_metric_families
from rankwatch.gpu.sampler import GpuSampler

pytestmark = pytest.mark.tool  # NVML and promtool: real tools

LABELS = {"run": "real", "rank": "0", "local_rank": "0", "node": "this-node"}
GiB = 1 << 30


def _up_value(families: list) -> float:
    (up,) = [f for f in families if f.name == "rankwatch_gpu_collector_up"]
    return up.samples[0].value


def _nvml_absent() -> str | None:
    """Why NVML cannot start here (no library, no driver, no device), or None when it starts."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        if isinstance(
            e,
            (
                pynvml.NVMLError_LibraryNotFound,
                pynvml.NVMLError_DriverNotLoaded,
                pynvml.NVMLError_NoPermission,
                pynvml.NVMLError_NotFound,
            ),
        ):
            return f"NVML not available: {e}"
        raise
    try:
        return None if pynvml.nvmlDeviceGetCount() > 0 else "NVML not available: no device"
    finally:
        pynvml.nvmlShutdown()


def test_real_nvml_backend(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rankwatch.gpu")
    backend = NvmlBackend()
    sampler = GpuSampler(GpuConfig(call_timeout=30.0), backend=backend)

    def go() -> tuple[bool, bool, list[GpuSample], list[GpuSample], dict[int, int | None], list]:
        ok = sampler.open()
        first = sampler.sample()
        watched = sampler.map([(0, [os.getpid()], {})]) if ok else {}
        second = sampler.sample()
        up = sampler.up
        xids = backend.xid_events(0.01) if ok else []  # a healthy GPU: the wait times out cleanly
        sampler.shutdown()
        return ok, up, first, second, watched, xids

    ok, up, first, second, watched, xids = go()
    families = gpu_metric_families({0: second}, LABELS, up=up)

    if not ok:
        lines = [r.getMessage() for r in caplog.records if "NVML" in r.getMessage()]
        assert lines == [f"NVML not available: {sampler.reason}; GPU metrics disabled"]
        assert first == [] and second == []
        assert _up_value(families) == 0.0 and len(families) == 1
        # Only a node where NVML itself says there is no GPU may skip: where NVML starts, a
        # backend that failed is a failure, not "no GPU here".
        absent = _nvml_absent()
        assert absent is not None, f"NVML starts on this node but the backend failed: {sampler.reason}"
        pytest.skip(f"no GPU here: {absent}")

    assert up and _up_value(families) == 1.0
    assert len(first) == len(sampler.devices) >= 1
    # this test process holds no GPU context: nothing is tied to it, so every GPU is watched
    assert watched == {} and sampler.watched is None and len(second) == len(sampler.devices)
    for a, b in zip(first, second, strict=True):
        for s in (a, b):
            assert not s.lost, s.lost_reason
            assert s.uuid and s.uuid.startswith(("GPU-", "MIG-")) and s.name
            assert s.memory_total is not None and s.memory_total > 1 * GiB
            assert s.memory_used is not None and 0 <= s.memory_used <= s.memory_total
            if s.utilization is not None:
                assert 0.0 <= s.utilization <= 1.0
                assert s.memory_utilization is not None and 0.0 <= s.memory_utilization <= 1.0
            if s.temperature is not None:
                assert 5.0 < s.temperature < 120.0
            if s.memory_temperature is not None:
                assert 5.0 < s.memory_temperature < 130.0
            if s.power is not None:
                assert 0.0 < s.power < 2000.0
            if s.power_limit is not None:
                assert 10.0 < s.power_limit < 2000.0
            if s.sm_clock is not None:
                assert 0.0 < s.sm_clock < 5e9 and s.memory_clock is not None and 0.0 < s.memory_clock < 2e10
            if s.throttle is not None:
                assert s.throttle and all(isinstance(v, bool) for v in s.throttle.values())
            if s.ecc is not None:
                assert all(v >= 0 for v in s.ecc.values())
            if s.pcie_replays is not None:
                assert s.pcie_replays >= 0
            if s.memory_free is not None:
                assert 0 <= s.memory_free <= s.memory_total
                assert s.memory_reserved is None or 0 <= s.memory_reserved < s.memory_total
            if s.energy is not None:
                assert s.energy > 0.0  # joules since the driver loaded
            if s.pcie_tx is not None:
                assert s.pcie_tx >= 0.0 and s.pcie_rx is not None and s.pcie_rx >= 0.0
            for secs in (s.violations or {}).values():
                assert secs >= 0.0
            for ratio in (s.sm_active, s.sm_occupancy, s.tensor_active, s.dram_active):
                assert ratio is None or 0.0 <= ratio <= 1.0
            assert s.driver_version and s.compute_capability and "." in s.compute_capability
        for key, n in (a.ecc or {}).items():  # NVML counters never go down between two samples
            assert (b.ecc or {}).get(key, n) >= n
        assert b.time >= a.time
        if a.energy is not None and b.energy is not None:
            assert b.energy >= a.energy  # a counter
    assert xids == []

    text = exposition({0: second}, LABELS, True)
    assert "rankwatch_gpu_memory_total_bytes{" in text and 'local_rank="0"' in text
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if os.path.exists(promtool):
        res = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
        )
        assert res.returncode == 0, res.stdout + res.stderr


def test_xid_of_a_gpu_that_no_longer_answers_is_tied_to_its_cached_handle() -> None:
    """After an Xid 79 NVML may refuse nvmlDeviceGetIndex for that GPU; the event must still
    land on it (matched to the handle opened at start), not be dropped as 'not watched'."""
    import ctypes

    import pynvml

    structs = [pynvml.struct_c_nvmlDevice_t() for _ in range(2)]
    handles = [ctypes.cast(ctypes.pointer(s), pynvml.c_nvmlDevice_t) for s in structs]
    queued = [pynvml.c_nvmlEventData_t() for _ in range(2)]
    for ev, gpu, xid in zip(queued, (1, 0), (79, 13), strict=True):
        ev.device = ctypes.cast(ctypes.pointer(structs[gpu]), pynvml.c_nvmlDevice_t)  # a fresh pointer object
        ev.eventType = pynvml.nvmlEventTypeXidCriticalError
        ev.eventData = xid

    def wait(_events: object, _ms: int) -> object:
        if not queued:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return queued.pop(0)

    def index(h: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    fake = type(pynvml)("fake_pynvml")
    for name in ("NVMLError", "NVML_ERROR_TIMEOUT", "nvmlEventTypeXidCriticalError"):
        setattr(fake, name, getattr(pynvml, name))
    fake.nvmlEventSetWait_v2 = wait  # type: ignore[attr-defined]
    fake.nvmlDeviceGetIndex = index  # type: ignore[attr-defined]
    b = NvmlBackend()
    b._nvml, b._events, b._event_indices = fake, object(), {0: 0, 1: 1}
    b._handles = dict(enumerate(handles))
    got = b.xid_events(0.0)
    assert [(e.gpu, e.xid) for e in got] == [(1, 79), (0, 13)]
