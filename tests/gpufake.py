"""Test double (not shipped in the package): a scripted ``GpuBackend``, GPUs whose
readings follow a script over sample ticks.

A script maps the tick (advanced by the test, one per sample) to a value, so a heat-up,
a leak staircase, a throttle window, an Xid 79, a lost GPU, a transient Unknown Error or a
board that answers NOT_SUPPORTED play out deterministically without a driver. Builders at the bottom give
the usual scenarios; ``hang`` makes a reading block until an event is set.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from rankwatch.events import GpuInfo
from rankwatch.gpu.backend import FIELDS, GpuError, XidEvent

Script = Callable[[int], Any]
GiB = 1 << 30
MiB = 1 << 20
H100_TOTAL = 81_559 * MiB


def const(value: Any) -> Script:
    return lambda t: value


def ramp(start: float, end: float, over: int, *, begin: int = 0) -> Script:
    """Linear from ``start`` at tick ``begin`` to ``end`` ``over`` ticks later, then held."""

    def f(t: int) -> float:
        if t <= begin:
            return start
        if t >= begin + over:
            return end
        return start + (end - start) * (t - begin) / over

    return f


def staircase(base: int, step: int, *, every: int = 1, begin: int = 0, end: int | None = None) -> Script:
    """``base`` plus one ``step`` every ``every`` ticks from ``begin`` (until ``end``)."""

    def f(t: int) -> int:
        last = t if end is None else min(t, end)
        return base + step * ((last - begin) // every) if last >= begin else base

    return f


def seq(values: Sequence[Any]) -> Script:
    """The values in turn, the last one held."""
    return lambda t: values[min(t, len(values) - 1)]


def switch(at: int, before: Script, after: Script) -> Script:
    return lambda t: before(t) if t < at else after(t)


def _healthy_fields(total: int = H100_TOTAL) -> dict[str, Script]:
    return {
        "memory": const((int(total * 0.6), total)),
        "utilization": const((0.98, 0.45)),
        "temperature": const(62.0),
        "memory_temperature": const(70.0),
        "power": const(610.0),
        "power_limit": const(700.0),
        "clocks": const((1.98e9, 2.619e9)),
        "throttle_reasons": const({"gpu_idle": False, "sw_power_cap": False, "hw_slowdown": False,
                                   "sw_thermal_slowdown": False, "hw_thermal_slowdown": False}),
        "ecc_errors": const({("corrected", "volatile"): 0, ("uncorrected", "volatile"): 0,
                             ("corrected", "aggregate"): 3, ("uncorrected", "aggregate"): 0}),
        "retired_pages": const(({"single_bit_ecc": 0, "double_bit_ecc": 0}, False)),
        "remapped_rows": const((0, 0, False, False)),
        "pcie_replays": const(0),
        "memory_detail": const((total - int(total * 0.6) - (528 << 20), 528 << 20)),
        "energy": ramp(1.0e6, 1.0e6 + 610.0 * 3600, 3600),
        "pcie_throughput": const((2.0e9, 1.5e9)),
        "violations": const({"power": 0.0, "thermal": 0.0}),
        "nvlink": const((0.0, 0.0, {"crc_flit": 0, "crc_data": 0, "replay": 0, "recovery": 0})),
        "gpm": const({"sm_active": 0.82, "sm_occupancy": 0.41, "tensor_active": 0.55, "dram_active": 0.38}),
        "compute_pids": const([]),
    }  # fmt: skip


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str | None = None
    fields: dict[str, Script] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    lost_at: int | None = None
    back_at: int | None = None
    unknown_at: set[int] = field(default_factory=set)  # ticks on which every call fails with error 999
    xids: dict[int, list[int]] = field(default_factory=dict)  # tick -> Xid numbers
    hang: dict[str, threading.Event] = field(default_factory=dict)  # field -> released when set

    def __post_init__(self) -> None:
        self.fields = {**_healthy_fields(), **self.fields}

    def lost(self, tick: int) -> bool:
        return (
            self.lost_at is not None
            and tick >= self.lost_at
            and (self.back_at is None or tick < self.back_at)
        )


class FakeBackend:
    """``GpuBackend`` over ``FakeGpu`` scripts. ``calls`` counts every method call by name."""

    def __init__(
        self, gpus: Iterable[FakeGpu], *, init_error: str | None = None, xid_supported: bool = True
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.xid_supported = xid_supported
        self.tick = 0
        self.calls: Counter[str] = Counter()
        self.initialised = False
        self._xid_done: set[tuple[int, int]] = set()

    def advance(self, n: int = 1) -> None:
        self.tick += n

    def init(self) -> None:
        self.calls["init"] += 1
        if self.init_error is not None:
            raise GpuError("failed", self.init_error, code=12)
        self.initialised = True

    def shutdown(self) -> None:
        self.calls["shutdown"] += 1
        self.initialised = False

    def device_count(self) -> int:
        self.calls["device_count"] += 1
        return len(self.gpus)

    def device_info(self, index: int) -> GpuInfo:
        self.calls["device_info"] += 1
        g = self._gpu(index)
        bus = g.pci_bus_id or f"00000000:{0x18 + index:02X}:00.0"
        return GpuInfo(index=index, uuid=g.uuid, name=g.name, pci_bus_id=bus)

    def _gpu(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise GpuError("failed", f"Invalid Argument: no GPU {index}", code=2)
        g = self.gpus[index]
        if g.lost(self.tick):
            raise GpuError("gone", "GPU is lost", code=15)
        if self.tick in g.unknown_at:
            raise GpuError("unknown", "Unknown Error", code=999)
        return g

    def _read(self, name: str, index: int) -> Any:
        self.calls[name] += 1
        g = self._gpu(index)
        ev = g.hang.get(name)
        if ev is not None:
            ev.wait(30.0)
        if name in g.unsupported:
            raise GpuError("not_supported", "Not Supported", code=3)
        value = g.fields[name](self.tick)
        if isinstance(value, GpuError):
            raise value
        return value

    def memory(self, index: int) -> tuple[int, int]:
        return cast("tuple[int, int]", self._read("memory", index))

    def utilization(self, index: int) -> tuple[float, float]:
        return cast("tuple[float, float]", self._read("utilization", index))

    def temperature(self, index: int) -> float:
        return cast("float", self._read("temperature", index))

    def memory_temperature(self, index: int) -> float:
        return cast("float", self._read("memory_temperature", index))

    def power(self, index: int) -> float:
        return cast("float", self._read("power", index))

    def power_limit(self, index: int) -> float:
        return cast("float", self._read("power_limit", index))

    def clocks(self, index: int) -> tuple[float, float]:
        return cast("tuple[float, float]", self._read("clocks", index))

    def throttle_reasons(self, index: int) -> dict[str, bool]:
        return cast("dict[str, bool]", self._read("throttle_reasons", index))

    def ecc_errors(self, index: int) -> dict[tuple[str, str], int]:
        return cast("dict[tuple[str, str], int]", self._read("ecc_errors", index))

    def retired_pages(self, index: int) -> tuple[dict[str, int], bool]:
        return cast("tuple[dict[str, int], bool]", self._read("retired_pages", index))

    def remapped_rows(self, index: int) -> tuple[int, int, bool, bool]:
        return cast("tuple[int, int, bool, bool]", self._read("remapped_rows", index))

    def pcie_replays(self, index: int) -> int:
        return cast("int", self._read("pcie_replays", index))

    def memory_detail(self, index: int) -> tuple[int, int | None]:
        return cast("tuple[int, int | None]", self._read("memory_detail", index))

    def energy(self, index: int) -> float:
        return cast("float", self._read("energy", index))

    def pcie_throughput(self, index: int) -> tuple[float, float]:
        return cast("tuple[float, float]", self._read("pcie_throughput", index))

    def violations(self, index: int) -> dict[str, float]:
        return cast("dict[str, float]", self._read("violations", index))

    def nvlink(self, index: int) -> tuple[float, float, dict[str, int]]:
        return cast("tuple[float, float, dict[str, int]]", self._read("nvlink", index))

    def gpm(self, index: int) -> dict[str, float]:
        return cast("dict[str, float]", self._read("gpm", index))

    def compute_pids(self, index: int) -> list[int]:
        return cast("list[int]", self._read("compute_pids", index))

    def xid_events(self, timeout_s: float) -> list[XidEvent]:
        """Each scripted Xid is delivered once, at the first wait on or after its tick."""
        self.calls["xid_events"] += 1
        if not self.xid_supported:
            raise GpuError("not_supported", "Not Supported", code=3)
        out: list[XidEvent] = []
        for i, g in enumerate(self.gpus):
            for tick, numbers in sorted(g.xids.items()):
                if tick <= self.tick and (i, tick) not in self._xid_done:
                    self._xid_done.add((i, tick))
                    out.extend(XidEvent(gpu=i, xid=x, time=float(self.tick)) for x in numbers)
        return out


# --- scenarios ------------------------------------------------------------------------------


def _uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-444455556666"


def healthy(i: int = 0, **kw: Any) -> FakeGpu:
    return FakeGpu(uuid=_uuid(i), **kw)


def heat_up(
    i: int = 0, *, start: float = 65.0, peak: float = 92.0, over: int = 5, cool_at: int = 20
) -> FakeGpu:
    """Temperature climbs to ``peak``, stays, and drops back at ``cool_at``."""
    temp = switch(cool_at, ramp(start, peak, over), const(start))
    return healthy(i, fields={"temperature": temp})


def leak(
    i: int = 0,
    *,
    base: int = 40 * GiB,
    step: int = 96 * MiB,
    every: int = 2,
    begin: int = 0,
    end: int | None = None,
) -> FakeGpu:
    """Used memory climbs by ``step`` every ``every`` ticks: the staircase of a leak."""
    stairs = staircase(base, step, every=every, begin=begin, end=end)
    return healthy(i, fields={"memory": lambda t: (min(stairs(t), H100_TOTAL), H100_TOTAL)})


def throttle(i: int = 0, *, begin: int = 3, end: int = 15, reason: str = "hw_thermal_slowdown") -> FakeGpu:
    base = _healthy_fields()["throttle_reasons"](0)
    hot = {**base, reason: True}
    return healthy(
        i,
        fields={
            "throttle_reasons": lambda t: hot if begin <= t < end else base,
            "clocks": lambda t: (1.1e9 if begin <= t < end else 1.98e9, 2.619e9),
        },
    )


def xid(i: int = 0, number: int = 79, *, at: int = 3) -> FakeGpu:
    return healthy(i, xids={at: [number]})


def lost(i: int = 0, *, at: int = 3, back_at: int | None = None) -> FakeGpu:
    return healthy(i, lost_at=at, back_at=back_at)


def flaky(i: int = 0, *, ticks: Iterable[int] = (3,)) -> FakeGpu:
    """Every call fails with NVML's Unknown Error (999) on these ticks, and answers otherwise."""
    return healthy(i, unknown_at=set(ticks))


def unsupported(
    i: int = 0, names: Iterable[str] = ("memory_temperature", "ecc_errors", "retired_pages")
) -> FakeGpu:
    bad = set(names)
    unknown = bad - set(FIELDS) - {"compute_pids"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    return healthy(i, unsupported=bad)


def exposition(samples_by_rank: Mapping[Any, Sequence[Any]], labels: Mapping[str, str], up: bool) -> str:
    """The text /metrics serves for these samples: the families ``exporter/gpu.py`` renders
    (``gpu_metric_families``), through a real prometheus-client registry."""
    from prometheus_client import CollectorRegistry, generate_latest

    from rankwatch.gpu.collector import gpu_metric_families

    class _Families:
        def collect(self) -> Iterable[Any]:
            return gpu_metric_families(samples_by_rank, dict(labels), up=up)

        def describe(self) -> Iterable[Any]:
            return []

    registry = CollectorRegistry()
    registry.register(_Families())  # type: ignore[arg-type]
    return generate_latest(registry).decode()
