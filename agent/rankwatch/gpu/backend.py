"""The one narrow interface to GPU telemetry, and its real implementation over pynvml.

Everything above this module sees plain numbers in base units and one error type,
``GpuError``, whose ``kind`` says what the caller should do: ``not_supported`` (skip that
field on that GPU for good), ``gone`` (the GPU fell off the bus: a ``gpu_lost`` finding),
``unknown`` (NVML's catch-all error 999: what a dying GPU often answers, but also a
transient driver hiccup, so it means lost only when it persists) or ``failed`` (anything
else: skip this reading, try again next sample). That keeps
pynvml's error zoo and ctypes structs out of the sampler, and lets a scripted fake
stand in for a driver in tests.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rankwatch.events import GpuInfo

GpuErrorKind = Literal["not_supported", "gone", "unknown", "failed"]

# The per-GPU readings, in the order the sampler takes them; each is a backend method
# taking the GPU index. NOT_SUPPORTED on one of them skips only that one.
FIELDS = (
    "memory",
    "utilization",
    "temperature",
    "memory_temperature",
    "power",
    "power_limit",
    "clocks",
    "throttle_reasons",
    "ecc_errors",
    "retired_pages",
    "remapped_rows",
    "pcie_replays",
    "memory_detail",
    "energy",
    "pcie_throughput",
    "violations",
    "nvlink",
    "gpm",
)

# Readings that change on the order of events, not seconds: ECC counters, retired pages,
# row-remapper state, PCIe replays, the clock-event (violation) time counters and the
# enforced power limit (changed by an administrator). The sampler reads them every
# ``gpu.health_interval`` and carries the last values forward in between (16 of the ~35
# NVML calls per GPU and round).
HEALTH_FIELDS = frozenset(
    {"power_limit", "ecc_errors", "retired_pages", "remapped_rows", "pcie_replays", "violations"}
)

# NVML's performance policies whose violation (clock-event) time dcgm-exporter exports as
# DCGM_FI_DEV_*_VIOLATION; the key is our ``reason`` label.
VIOLATION_POLICIES = {
    "power": 0,
    "thermal": 1,
    "sync_boost": 2,
    "board_limit": 3,
    "low_utilization": 4,
    "reliability": 5,
}

# NVML field ids (nvml.h), kept here so this module imports without pynvml.
_FI_NVLINK_LINK_COUNT = 91
_FI_NVLINK_TX_DATA_KIB = 138
_FI_NVLINK_RX_DATA_KIB = 139
NVLINK_ERROR_FIELDS = {"crc_flit": 38, "crc_data": 45, "replay": 52, "recovery": 59}
_ALL_SCOPES = 0xFFFFFFFF
# NVLink read summed over links (scopeId UINT_MAX): data moved each way, then the error counters.
_NVLINK_SUM_IDS: tuple[Any, ...] = (
    (_FI_NVLINK_TX_DATA_KIB, _ALL_SCOPES),
    (_FI_NVLINK_RX_DATA_KIB, _ALL_SCOPES),
    *NVLINK_ERROR_FIELDS.values(),
)

# GPM metric ids (Hopper and later) -> GpuSample attribute; NVML reports them in percent.
GPM_METRICS = {2: "sm_active", 3: "sm_occupancy", 5: "tensor_active", 10: "dram_active"}

THROTTLE_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


class GpuError(Exception):
    def __init__(self, kind: GpuErrorKind, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.kind: GpuErrorKind = kind
        self.code = code


@dataclass(frozen=True, slots=True)
class XidEvent:
    gpu: int | None  # NVML index; None when the event could not be tied to a device
    xid: int
    time: float


class GpuBackend(Protocol):
    """Every method returns plain values in base units or raises ``GpuError``."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def device_info(self, index: int) -> GpuInfo: ...
    def memory(self, index: int) -> tuple[int, int]: ...  # used, total bytes
    def utilization(self, index: int) -> tuple[float, float]: ...  # gpu, memory ratio
    def temperature(self, index: int) -> float: ...
    def memory_temperature(self, index: int) -> float: ...
    def power(self, index: int) -> float: ...  # watts
    def power_limit(self, index: int) -> float: ...
    def clocks(self, index: int) -> tuple[float, float]: ...  # sm, memory hertz
    def throttle_reasons(self, index: int) -> dict[str, bool]: ...
    def ecc_errors(self, index: int) -> dict[tuple[str, str], int]: ...
    def retired_pages(self, index: int) -> tuple[dict[str, int], bool]: ...  # by cause, pending
    def remapped_rows(self, index: int) -> tuple[int, int, bool, bool]: ...  # corr, unc, pending, fail
    def pcie_replays(self, index: int) -> int: ...
    def memory_detail(self, index: int) -> tuple[int, int | None]: ...  # free, reserved bytes
    def energy(self, index: int) -> float: ...  # joules
    def pcie_throughput(self, index: int) -> tuple[float, float]: ...  # tx, rx bytes/s
    def violations(self, index: int) -> dict[str, float]: ...  # policy -> seconds
    def nvlink(self, index: int) -> tuple[float, float, dict[str, int]]: ...  # tx, rx bytes; errors
    def gpm(self, index: int) -> dict[str, float]: ...  # GpuSample attribute -> ratio
    def compute_pids(self, index: int) -> list[int]: ...
    def xid_events(self, timeout_s: float) -> list[XidEvent]: ...


# NVML return codes (nvml.h); kept here so this module imports without pynvml.
_NOT_SUPPORTED = {3, 4, 13, 25, 26}  # not supported, no permission, function not found, version, deprecated
_GONE = {15, 16, 28}  # GPU is lost, reset required, GPU not found
_GONE_TEXT = ("gpu is lost", "fallen off the bus")
_UNKNOWN = 999


def error_kind(code: int | None, text: str = "") -> GpuErrorKind:
    if code in _NOT_SUPPORTED:
        return "not_supported"
    if code in _GONE or any(t in text.lower() for t in _GONE_TEXT):
        return "gone"
    if code == _UNKNOWN or (code is None and "unknown error" in text.lower()):
        return "unknown"
    return "failed"


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class NvmlBackend:
    """pynvml behind ``GpuBackend``. Handles are cached; every call maps NVMLError to GpuError."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._events: Any = None
        self._event_indices: dict[int, int] = {}
        # Per GPU: the last GPM sample, a spare one the next is taken into, and the metrics
        # request, one for all GPUs (its metric ids set once): two NVML calls a round instead
        # of four, and no request struct built per GPU and round.
        self._gpm: dict[int, list[Any]] = {}
        self._gpm_request: Any = None
        self._driver: str | None = None
        # What a board supports does not change while the driver is loaded: asked once per GPU
        # (16 of the ~300 NVML calls a second of 8 GPUs at 1 s).
        self._supported_reasons: dict[int, int] = {}
        self._nvlink_links: dict[int, int] = {}
        # How each GPU's NVLink throughput is read: "sum" (scopeId UINT_MAX), "links" (one
        # value per link: a driver that does not sum), "none" (neither answers: 0, as before).
        self._nvlink_mode: dict[int, str] = {}
        # Free and reserved framebuffer from the memory record ``memory`` read this round, for
        # ``memory_detail``: one NVML call a GPU and round gives all four numbers (three on v1).
        self._memory_detail: dict[int, tuple[int, int | None]] = {}
        self._memory_v1_only: set[int] = set()  # drivers before r510: no v2 record
        # NVLink counters read in ``memory_temperature``'s field request this round, for ``nvlink``.
        self._nvlink_kept: dict[int, list[float | None]] = {}

    def _call(self, fn: Any, *args: Any) -> Any:
        nv = self._nvml
        try:
            return fn(*args)
        except nv.NVMLError as e:
            code = getattr(e, "value", None)
            raise GpuError(error_kind(code, str(e)), str(e), code=code) from e

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
            raise GpuError("failed", f"pynvml not importable ({e})") from e
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            code = getattr(e, "value", None)
            raise GpuError("failed", str(e), code=code) from e
        except OSError as e:
            raise GpuError("failed", str(e)) from e
        self._setup_events()

    def _setup_events(self) -> None:
        nv = self._nvml
        try:
            self._events = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            self._events = None
            return
        try:
            count = self.device_count()
        except GpuError:
            return
        for i in range(count):
            try:
                h = self._handle(i)
                supported = nv.nvmlDeviceGetSupportedEventTypes(h)
                if supported & nv.nvmlEventTypeXidCriticalError:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
                    self._event_indices[i] = i
            except (nv.NVMLError, GpuError):
                continue

    @property
    def xid_supported(self) -> bool:
        return bool(self._event_indices)

    def shutdown(self) -> None:
        nv = self._nvml
        if nv is None:
            return
        try:
            for prev, spare, _req in self._gpm.values():
                nv.nvmlGpmSampleFree(prev)
                nv.nvmlGpmSampleFree(spare)
            self._gpm.clear()
            self._gpm_request = None
            self._memory_detail.clear()
            self._nvlink_kept.clear()
            if self._events is not None:
                nv.nvmlEventSetFree(self._events)
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
        self._events = None
        self._handles.clear()
        self._supported_reasons.clear()
        self._nvlink_links.clear()
        self._nvlink_mode.clear()

    def _handle(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = h
        return h

    def _index_of(self, device: Any) -> int | None:
        """The index of a handle we opened earlier, matched by address, without asking NVML."""
        want = _address(device)
        if want is None:
            return None
        for index, h in self._handles.items():
            if _address(h) == want:
                return index
        return None

    def device_count(self) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetCount))

    def device_info(self, index: int) -> GpuInfo:
        nv, h = self._nvml, self._handle(index)
        uuid = _text(self._call(nv.nvmlDeviceGetUUID, h))
        name = _text(self._call(nv.nvmlDeviceGetName, h))
        try:
            bus = _text(self._call(nv.nvmlDeviceGetPciInfo, h).busId)
        except GpuError as e:
            if e.kind == "gone":
                raise
            bus = None
        cc: str | None = None
        try:
            major, minor = self._call(nv.nvmlDeviceGetCudaComputeCapability, h)
            cc = f"{int(major)}.{int(minor)}"
        except GpuError as e:
            if e.kind == "gone":
                raise
        if self._driver is None:
            try:
                self._driver = _text(self._call(nv.nvmlSystemGetDriverVersion))
            except GpuError:
                self._driver = ""
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=name,
            pci_bus_id=bus,
            driver_version=self._driver or None,
            compute_capability=cc,
        )

    def memory(self, index: int) -> tuple[int, int]:
        """Used (allocated and reserved, as the v1 record counts it) and total framebuffer.

        Read from the v2 record where the driver has one: ``total - free`` is v1's ``used``
        (nvml.h: v1 ``used`` is reserved plus allocated, and ``free`` is the same in both), and
        the record's free and reserved are kept for ``memory_detail`` of the same round.
        """
        nv, h = self._nvml, self._handle(index)
        self._memory_detail.pop(index, None)
        if index not in self._memory_v1_only:
            try:
                m = self._call(nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2)
            except GpuError as e:
                if e.kind != "not_supported":
                    raise
                self._memory_v1_only.add(index)
            else:
                total, free = int(m.total), int(m.free)
                self._memory_detail[index] = (free, int(m.reserved))
                return total - free, total
        m = self._call(nv.nvmlDeviceGetMemoryInfo, h)
        self._memory_detail[index] = (int(m.free), None)
        return int(m.used), int(m.total)

    def utilization(self, index: int) -> tuple[float, float]:
        u = self._call(self._nvml.nvmlDeviceGetUtilizationRates, self._handle(index))
        return u.gpu / 100.0, u.memory / 100.0

    def temperature(self, index: int) -> float:
        nv = self._nvml
        return float(self._call(nv.nvmlDeviceGetTemperature, self._handle(index), nv.NVML_TEMPERATURE_GPU))

    def memory_temperature(self, index: int) -> float:
        """HBM temperature. On a GPU whose NVLink counters are asked for summed, their fields ride
        in the same field request and are kept for ``nvlink`` of this round (one call, not two)."""
        nv = self._nvml
        self._nvlink_kept.pop(index, None)
        ids: list[Any] = [nv.NVML_FI_DEV_MEMORY_TEMP]
        rider = self._nvlink_mode.get(index) in ("sum", "none")  # the summed request, each round
        if rider:
            ids += _NVLINK_SUM_IDS  # one request; the values after the first are NVLink's
        values = self._call(nv.nvmlDeviceGetFieldValues, self._handle(index), ids)
        if rider:
            self._nvlink_kept[index] = self._field_values(values[1:])
        v = values[0]
        if v.nvmlReturn != nv.NVML_SUCCESS:
            raise GpuError(error_kind(v.nvmlReturn), f"memory temperature: NVML code {v.nvmlReturn}")
        value = _field_value(nv, v)
        if value <= 0:  # boards without an HBM sensor answer 0 rather than NOT_SUPPORTED
            raise GpuError("not_supported", "memory temperature reads 0")
        return value

    def power(self, index: int) -> float:
        return float(self._call(self._nvml.nvmlDeviceGetPowerUsage, self._handle(index))) / 1000.0

    def power_limit(self, index: int) -> float:
        return float(self._call(self._nvml.nvmlDeviceGetEnforcedPowerLimit, self._handle(index))) / 1000.0

    def clocks(self, index: int) -> tuple[float, float]:
        nv, h = self._nvml, self._handle(index)
        sm = self._call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        mem = self._call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        return sm * 1e6, mem * 1e6

    def throttle_reasons(self, index: int) -> dict[str, bool]:
        nv, h = self._nvml, self._handle(index)
        try:
            current = self._call(nv.nvmlDeviceGetCurrentClocksEventReasons, h)
        except GpuError as e:
            if e.kind != "not_supported":
                raise
            current = self._call(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)  # drivers < 535
        supported = self._supported_reasons.get(index)
        if supported is None:
            try:
                supported = self._supported_reasons[index] = int(
                    self._call(nv.nvmlDeviceGetSupportedClocksEventReasons, h)
                )
            except GpuError as e:
                if e.kind == "gone":
                    raise
                supported = sum(THROTTLE_BITS.values())  # asked again next time
        return {name: bool(current & bit) for name, bit in THROTTLE_BITS.items() if supported & bit}

    def ecc_errors(self, index: int) -> dict[tuple[str, str], int]:
        nv, h = self._nvml, self._handle(index)
        out: dict[tuple[str, str], int] = {}
        for tname, t in (
            ("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            for sname, s in (("volatile", nv.NVML_VOLATILE_ECC), ("aggregate", nv.NVML_AGGREGATE_ECC)):
                try:
                    out[(tname, sname)] = int(self._call(nv.nvmlDeviceGetTotalEccErrors, h, t, s))
                except GpuError as e:
                    if e.kind != "not_supported":
                        raise
        if not out:
            raise GpuError("not_supported", "ECC counters not supported (ECC off or not on this board)")
        return out

    def retired_pages(self, index: int) -> tuple[dict[str, int], bool]:
        nv, h = self._nvml, self._handle(index)
        counts = {
            "single_bit_ecc": len(
                self._call(
                    nv.nvmlDeviceGetRetiredPages,
                    h,
                    nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                )
            ),
            "double_bit_ecc": len(
                self._call(
                    nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
                )
            ),
        }
        pending = bool(self._call(nv.nvmlDeviceGetRetiredPagesPendingStatus, h))
        return counts, pending

    def remapped_rows(self, index: int) -> tuple[int, int, bool, bool]:
        corr, unc, pending, failure = self._call(self._nvml.nvmlDeviceGetRemappedRows, self._handle(index))
        return int(corr), int(unc), bool(pending), bool(failure)

    def pcie_replays(self, index: int) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetPcieReplayCounter, self._handle(index)))

    def memory_detail(self, index: int) -> tuple[int, int | None]:
        """Free and driver-reserved framebuffer; drivers before r510 lack v2 and give free only."""
        kept = self._memory_detail.pop(index, None)
        if kept is not None:  # read by ``memory`` a moment ago, in the same call
            return kept
        nv, h = self._nvml, self._handle(index)
        if index not in self._memory_v1_only:
            try:
                m = self._call(nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2)
                return int(m.free), int(m.reserved)
            except GpuError as e:
                if e.kind != "not_supported":
                    raise
                self._memory_v1_only.add(index)
        m = self._call(nv.nvmlDeviceGetMemoryInfo, h)
        return int(m.free), None

    def energy(self, index: int) -> float:
        return float(self._call(self._nvml.nvmlDeviceGetTotalEnergyConsumption, self._handle(index))) / 1000.0

    def pcie_throughput(self, index: int) -> tuple[float, float]:
        nv, h = self._nvml, self._handle(index)
        tx = self._call(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._call(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES)
        return tx * 1024.0, rx * 1024.0  # NVML counts KiB/s

    def violations(self, index: int) -> dict[str, float]:
        nv, h = self._nvml, self._handle(index)
        out: dict[str, float] = {}
        for reason, policy in VIOLATION_POLICIES.items():
            try:
                v = self._call(nv.nvmlDeviceGetViolationStatus, h, policy)
            except GpuError as e:
                if e.kind != "not_supported":
                    raise
                continue
            out[reason] = int(v.violationTime) / 1e9
        if not out:
            raise GpuError("not_supported", "no clock-event violation counter is supported")
        return out

    def _fields(self, index: int, ids: list[Any]) -> list[float | None]:
        return self._field_values(self._call(self._nvml.nvmlDeviceGetFieldValues, self._handle(index), ids))

    def _field_values(self, values: Any) -> list[float | None]:
        """Each field's value, None where NVML answered it with an error; a GPU gone raises."""
        nv = self._nvml
        out: list[float | None] = []
        for v in values:
            if v.nvmlReturn != nv.NVML_SUCCESS:
                if error_kind(v.nvmlReturn) == "gone":
                    raise GpuError("gone", f"field {v.fieldId}: NVML code {v.nvmlReturn}", code=v.nvmlReturn)
                out.append(None)
            else:
                out.append(_field_value(nv, v))
        return out

    def nvlink(self, index: int) -> tuple[float, float, dict[str, int]]:
        """Data bytes moved over all links (counters) and the error counters summed over links.

        nvml.h: a scopeId of UINT_MAX returns the throughput counters summed over all links,
        so one request of 6 values instead of 2 per link (36 on an 18-link H100); a driver
        that answers the sum with an error is read link by link from then on.
        """
        n = self._nvlink_links.get(index, 0)
        if not n:
            (links,) = self._fields(index, [_FI_NVLINK_LINK_COUNT])
            if not links:
                raise GpuError("not_supported", "no NVLink on this GPU")
            n = self._nvlink_links[index] = int(links)
        errors_ids: list[Any] = list(NVLINK_ERROR_FIELDS.values())
        mode = self._nvlink_mode.get(index)
        kept = self._nvlink_kept.pop(index, None)  # read with the memory temperature just now
        if mode != "links":
            got = kept if kept is not None else self._fields(index, list(_NVLINK_SUM_IDS))
            if got[0] is not None or got[1] is not None or mode == "none":
                self._nvlink_mode[index] = "sum" if mode is None else mode
                return (got[0] or 0.0) * 1024.0, (got[1] or 0.0) * 1024.0, _nvlink_errors(got[2:])
        pair = (_FI_NVLINK_TX_DATA_KIB, _FI_NVLINK_RX_DATA_KIB)
        ids: list[Any] = [(f, link) for link in range(n) for f in pair]
        got = self._fields(index, ids + errors_ids)
        if mode is None:
            self._nvlink_mode[index] = "links" if any(v is not None for v in got[: 2 * n]) else "none"
        tx = sum(v or 0.0 for v in got[0 : 2 * n : 2]) * 1024.0
        rx = sum(v or 0.0 for v in got[1 : 2 * n : 2]) * 1024.0
        return tx, rx, _nvlink_errors(got[2 * n :])

    def gpm(self, index: int) -> dict[str, float]:
        """SM, tensor and DRAM activity from GPM: two samples one interval apart, no DCGM needed.

        The first call only takes the baseline sample and returns nothing.
        """
        nv, h = self._nvml, self._handle(index)
        kept = self._gpm.get(index)
        if kept is None:
            if not self._call(nv.nvmlGpmQueryDeviceSupport, h).isSupportedDevice:
                raise GpuError("not_supported", "GPM not supported (Hopper or later only)")
            first = self._call(nv.nvmlGpmSampleAlloc)
            try:
                self._call(nv.nvmlGpmSampleGet, h, first)
                spare = self._call(nv.nvmlGpmSampleAlloc)
            except GpuError:
                self._call(nv.nvmlGpmSampleFree, first)
                raise
            if self._gpm_request is None:
                # One request for every GPU (~19 KB in pynvml), filled and read in turn on the
                # sampling thread: the GPUs' calls differ only in the two samples.
                req = nv.c_nvmlGpmMetricsGet_t()
                req.version = nv.NVML_GPM_METRICS_GET_VERSION
                req.numMetrics = len(GPM_METRICS)
                for i, metric in enumerate(GPM_METRICS):
                    req.metrics[i].metricId = metric
                self._gpm_request = req
            self._gpm[index] = [first, spare, self._gpm_request]
            return {}
        prev, cur, req = kept
        self._call(nv.nvmlGpmSampleGet, h, cur)
        req.sample1, req.sample2 = prev, cur
        self._call(nv.nvmlGpmMetricsGet, req)
        kept[0], kept[1] = cur, prev  # the older sample is overwritten next round
        out: dict[str, float] = {}
        for i, attr in enumerate(GPM_METRICS.values()):
            m = req.metrics[i]
            if m.nvmlReturn == nv.NVML_SUCCESS:
                out[attr] = max(0.0, min(1.0, float(m.value) / 100.0))
        return out

    def compute_pids(self, index: int) -> list[int]:
        procs = self._call(self._nvml.nvmlDeviceGetComputeRunningProcesses, self._handle(index))
        return [int(p.pid) for p in procs]

    def xid_events(self, timeout_s: float) -> list[XidEvent]:
        """Drain the event set: wait up to ``timeout_s`` for the first, then take what is queued."""
        nv = self._nvml
        if self._events is None or not self._event_indices:
            return []
        out: list[XidEvent] = []
        wait_ms = max(0, int(timeout_s * 1000))
        for _ in range(64):
            try:
                data = self._call(nv.nvmlEventSetWait_v2, self._events, wait_ms)
            except GpuError as e:
                if e.code == nv.NVML_ERROR_TIMEOUT:
                    break
                raise
            wait_ms = 0
            if not data.eventType & nv.nvmlEventTypeXidCriticalError:
                continue
            try:
                gpu: int | None = int(nv.nvmlDeviceGetIndex(data.device))
            except nv.NVMLError:
                gpu = self._index_of(data.device)  # a GPU that fell off the bus no longer answers
            out.append(XidEvent(gpu=gpu, xid=int(data.eventData), time=time.time()))
        return out


def _nvlink_errors(values: list[float | None]) -> dict[str, int]:
    return {k: int(v) for k, v in zip(NVLINK_ERROR_FIELDS, values, strict=True) if v is not None}


def _address(handle: Any) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _field_value(nv: Any, v: Any) -> float:
    t = v.valueType
    if t == nv.NVML_VALUE_TYPE_DOUBLE:
        return float(v.value.dVal)
    if t == nv.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(v.value.ulVal)
    if t == nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return float(v.value.ullVal)
    if t == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.value.sllVal)
    if t == nv.NVML_VALUE_TYPE_SIGNED_INT:
        return float(v.value.siVal)
    return float(v.value.uiVal)
