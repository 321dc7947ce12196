"""GPU health from NVML samples: heat, throttling, memory pressure and leaks, ECC, Xid, loss.

Pure: fed ``GpuSample`` objects, returns findings, no I/O. One ``GpuDetector`` per rank
keeps one set of rules per GPU (by UUID). Lasting conditions fire once and resolve once;
``evidence`` always names the GPU (index and UUID), since ``Finding.key`` does not.
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from rankwatch.detectors.base import Episode, fmt
from rankwatch.gpu import GpuConfig, GpuSample
from rankwatch.gpu.xid import xid_info
from rankwatch.records import Finding, Severity

MiB = float(1 << 20)
GiB = float(1 << 30)

# Clock-event reasons that mean "slowed to protect the hardware". sw_power_cap is left out:
# a GPU at its power limit under full load is doing its job, not failing.
SLOWDOWN_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown")
COOL_MARGIN_C = 5.0  # hysteresis: an overheat resolves below threshold minus this
PRESSURE_MARGIN = 0.02
LEAK_NOISE = 1 * MiB  # a steady training job's NVML "used" does not move by a byte between steps
LEAK_STEP_SPREAD = 3.0  # steps of one staircase are within this factor of their median

ACTIVITY_BUSY = "busy"
ACTIVITY_SPINNING = "spinning in a collective"
ACTIVITY_IDLE = "idle"
ACTIVITY_UNKNOWN = "unknown"
IDLE_UTIL = 0.05
SPIN_UTIL = 0.9
SPIN_POWER_RATIO = 0.3
SPIN_MEMORY_UTIL = 0.1


def where(s: GpuSample) -> str:
    return f"GPU {s.index}" + (f" ({s.uuid})" if s.uuid else "")


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def gpu_activity(samples: Sequence[GpuSample]) -> str:
    """What the GPU(s) of a stalled rank are doing, from their last few samples.

    - ``idle``: utilisation ~0: nothing is launched, the host side is stuck (data loader,
      I/O, a Python deadlock).
    - ``spinning in a collective``: utilisation ~100% (NVML counts a resident kernel as
      busy) while power stays near idle (< 30% of the limit) and the memory controller is
      quiet: NCCL kernels polling for a peer that never arrives, i.e. another rank hung.
    - ``busy``: anything else with work on it: real compute (power well above idle) or
      partial load.
    - ``unknown``: no utilisation reading.
    """
    live = [s for s in samples if not s.lost and s.utilization is not None]
    if not live:
        return ACTIVITY_UNKNOWN
    util = _mean([s.utilization for s in live if s.utilization is not None])
    if util <= IDLE_UTIL:
        return ACTIVITY_IDLE
    power = [s.power / s.power_limit for s in live if s.power is not None and s.power_limit]
    mem = [s.memory_utilization for s in live if s.memory_utilization is not None]
    if (
        util >= SPIN_UTIL
        and power
        and _mean(power) < SPIN_POWER_RATIO
        and (not mem or _mean(mem) < SPIN_MEMORY_UTIL)
    ):
        return ACTIVITY_SPINNING
    return ACTIVITY_BUSY


def staircase_step(values: Sequence[float], *, min_steps: int, min_growth: float) -> float | None:
    """The median step when ``values`` climb as a staircase over the whole window, else None.

    A staircase: at least ``min_steps`` rises of similar size (within ``LEAK_STEP_SPREAD``
    of their median), no fall, at least ``min_growth`` in all, and rises in the first and
    the last third of the window. That rules out a warm-up ramp that levels off into a
    plateau, a sawtooth (allocate/free) and one big allocation.
    """
    if len(values) < 3:
        return None
    diffs = [b - a for a, b in itertools.pairwise(values)]
    if any(d < -LEAK_NOISE for d in diffs) or values[-1] - values[0] < min_growth:
        return None
    rises = [(i, d) for i, d in enumerate(diffs) if d > LEAK_NOISE]
    if len(rises) < min_steps:
        return None
    sizes = [d for _, d in rises]
    med = statistics.median(sizes)
    if any(d > med * LEAK_STEP_SPREAD or d < med / LEAK_STEP_SPREAD for d in sizes):
        return None
    third = max(1, len(diffs) // 3)
    if rises[0][0] >= third or rises[-1][0] < len(diffs) - third:
        return None
    return med


class GpuRule:
    kind: ClassVar[str] = ""

    def __init__(self, cfg: GpuConfig, rank: int | None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.episode = Episode()

    def observe(self, s: GpuSample) -> list[Finding]:
        raise NotImplementedError

    def finding(
        self,
        severity: Severity,
        s: GpuSample,
        message: str,
        evidence: dict[str, Any] | None = None,
        *,
        resolved: bool = False,
    ) -> Finding:
        return Finding(
            kind=self.kind,
            severity=severity,
            rank=self.rank,
            message=message,
            time=s.time,
            evidence={"gpu": s.index, "uuid": s.uuid, **(evidence or {})},
            resolved=resolved,
        )


class _Sustained(GpuRule):
    """Fires after ``sustain_samples`` in a row with the condition; resolves after ``clear_samples``."""

    severity: ClassVar[Severity] = Severity.WARNING

    def __init__(self, cfg: GpuConfig, rank: int | None) -> None:
        super().__init__(cfg, rank)
        self.hot = 0
        self.cool = 0

    def present(self, s: GpuSample) -> bool:
        """Whether the sample has the reading at all; a missing one changes nothing."""
        raise NotImplementedError

    def active(self, s: GpuSample) -> bool | None:
        """True: condition holds; False: clearly gone; None: inside the hysteresis band."""
        raise NotImplementedError

    def fire(self, s: GpuSample) -> Finding:
        raise NotImplementedError

    def clear(self, s: GpuSample) -> Finding:
        raise NotImplementedError

    def observe(self, s: GpuSample) -> list[Finding]:
        if s.lost or not self.present(s):
            return []
        state = self.active(s)
        if state is None:
            self.hot = self.cool = 0
            return []
        if state:
            self.hot, self.cool = self.hot + 1, 0
            if self.hot >= self.cfg.sustain_samples and self.episode.open(None):
                return [self.fire(s)]
            return []
        self.hot, self.cool = 0, self.cool + 1
        if self.cool >= self.cfg.clear_samples and self.episode.close():
            return [self.clear(s)]
        return []


class OverheatRule(_Sustained):
    kind = "gpu_overheat"

    def present(self, s: GpuSample) -> bool:
        return s.temperature is not None

    def active(self, s: GpuSample) -> bool | None:
        assert s.temperature is not None
        if s.temperature >= self.cfg.overheat_celsius:
            return True
        return False if s.temperature < self.cfg.overheat_celsius - COOL_MARGIN_C else None

    def fire(self, s: GpuSample) -> Finding:
        mem = f", memory {s.memory_temperature:.0f} C" if s.memory_temperature is not None else ""
        slowed = [r for r, on in (s.throttle or {}).items() if on and r in SLOWDOWN_REASONS]
        thr = f"; clocks already slowed ({', '.join(slowed)})" if slowed else ""
        return self.finding(
            self.severity,
            s,
            f"{where(s)} is overheating: {s.temperature:.0f} C{mem}, at or above "
            f"{self.cfg.overheat_celsius:.0f} C for {self.hot} samples{thr}. A hot GPU throttles and "
            "turns its rank into a straggler for the whole job. Usual fix: ask the operators to check "
            "the node's cooling (fans, airflow, inlet temperature); drain the node if it persists.",
            {"temperature_c": s.temperature, "memory_temperature_c": s.memory_temperature},
        )

    def clear(self, s: GpuSample) -> Finding:
        return self.finding(
            self.severity, s, f"{where(s)} cooled down to {s.temperature:.0f} C", resolved=True
        )


class ThrottleRule(_Sustained):
    kind = "gpu_throttle"

    def present(self, s: GpuSample) -> bool:
        return s.throttle is not None

    def active(self, s: GpuSample) -> bool | None:
        return any((s.throttle or {}).get(r) for r in SLOWDOWN_REASONS)

    def fire(self, s: GpuSample) -> Finding:
        reasons = [r for r in SLOWDOWN_REASONS if (s.throttle or {}).get(r)]
        clock = f"SM clock {s.sm_clock / 1e6:.0f} MHz, " if s.sm_clock is not None else ""
        temp = f"{s.temperature:.0f} C, " if s.temperature is not None else ""
        power = f"{s.power:.0f} W" if s.power is not None else "power n/a"
        return self.finding(
            self.severity,
            s,
            f"{where(s)} clocks are slowed by {', '.join(reasons)} for {self.hot} samples "
            f"({clock}{temp}{power}). Thermal or hardware slowdown makes this rank a straggler. "
            "Usual fix: check cooling and the power supply/brake signal with the operators; "
            "`nvidia-smi -q -d PERFORMANCE` shows the active reasons.",
            {"reasons": reasons, "sm_clock_hz": s.sm_clock, "temperature_c": s.temperature},
        )

    def clear(self, s: GpuSample) -> Finding:
        return self.finding(self.severity, s, f"{where(s)} clocks no longer slowed", resolved=True)


class MemoryPressureRule(_Sustained):
    kind = "gpu_memory_pressure"

    def present(self, s: GpuSample) -> bool:
        return s.memory_ratio is not None

    def active(self, s: GpuSample) -> bool | None:
        r = s.memory_ratio or 0.0
        if r > self.cfg.memory_pressure_ratio:
            return True
        return False if r < self.cfg.memory_pressure_ratio - PRESSURE_MARGIN else None

    def fire(self, s: GpuSample) -> Finding:
        used, total = s.memory_used or 0, s.memory_total or 1
        return self.finding(
            self.severity,
            s,
            f"{where(s)} memory is nearly full: {used / GiB:.1f} of {total / GiB:.1f} GiB used "
            f"({used / total:.0%}) for {self.hot} samples: out-of-memory risk. PyTorch's caching "
            "allocator keeps freed blocks, so a steady high level can be normal; a longer batch or "
            "an eval pass is what tips it over. Usual fix: smaller micro-batch, activation "
            "checkpointing, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation.",
            {"memory_used_bytes": used, "memory_total_bytes": total},
        )

    def clear(self, s: GpuSample) -> Finding:
        ratio = s.memory_ratio or 0.0
        return self.finding(self.severity, s, f"{where(s)} memory back to {ratio:.0%} used", resolved=True)


class MemoryLeakRule(GpuRule):
    kind = "gpu_memory_leak"

    def __init__(self, cfg: GpuConfig, rank: int | None) -> None:
        super().__init__(cfg, rank)
        self.seen = 0
        self.window: deque[tuple[float, float]] = deque(maxlen=max(3, cfg.leak_window))

    def observe(self, s: GpuSample) -> list[Finding]:
        if s.lost or s.memory_used is None:
            return []
        self.seen += 1
        self.window.append((s.time, float(s.memory_used)))
        if self.seen <= self.cfg.warmup_samples or len(self.window) < self.window.maxlen:  # type: ignore[operator]
            return []
        times = [t for t, _ in self.window]
        used = [u for _, u in self.window]
        if self.episode.active:
            return self._maybe_resolve(s, used)
        step = staircase_step(
            used, min_steps=self.cfg.leak_min_steps, min_growth=float(self.cfg.leak_min_growth)
        )
        if step is None or not self.episode.open(None):
            return []
        n = len(used) - 1
        growth = used[-1] - used[0]
        per_sample = growth / n
        span = times[-1] - times[0]
        per_min = growth / span * 60 if span > 0 else None
        rate = f", {per_min / MiB:.0f} MiB/min" if per_min else ""
        eta = ""
        if per_min and s.memory_total:
            minutes = (s.memory_total - used[-1]) / per_min
            eta = f"; at this rate memory is full in about {minutes:.0f} min"
        steps = sum(1 for a, b in itertools.pairwise(used) if b - a > LEAK_NOISE)
        return [
            self.finding(
                Severity.WARNING,
                s,
                f"{where(s)} memory is climbing as a staircase: +{growth / MiB:.0f} MiB over the last "
                f"{n} samples in {steps} steps of ~{step / MiB:.0f} MiB ({per_sample / MiB:.1f} MiB per "
                f"sample{rate}), now {used[-1] / GiB:.1f} GiB{eta}. A plateau after warm-up is normal; "
                "steady steps mean something keeps tensors alive across steps (a loss summed without "
                ".item()/.detach(), outputs appended to a list, a cache keyed by shape). Usual fix: "
                "take a torch.cuda.memory snapshot and find what holds the references.",
                {
                    "growth_bytes": growth,
                    "step_bytes": step,
                    "slope_bytes_per_sample": per_sample,
                    "slope_bytes_per_minute": per_min,
                },
            )
        ]

    def _maybe_resolve(self, s: GpuSample, used: list[float]) -> list[Finding]:
        tail = used[-max(3, len(used) // 3) :]
        diffs = [b - a for a, b in itertools.pairwise(tail)]
        freed = min(diffs) < -float(self.cfg.leak_min_growth)
        if (freed or all(d <= LEAK_NOISE for d in diffs)) and self.episode.close():
            return [
                self.finding(
                    Severity.WARNING,
                    s,
                    f"{where(s)} memory stopped climbing at {used[-1] / GiB:.1f} GiB",
                    resolved=True,
                )
            ]
        return []


class EccRule(GpuRule):
    kind = "ecc_error"

    def __init__(self, cfg: GpuConfig, rank: int | None) -> None:
        super().__init__(cfg, rank)
        self.prev: int | None = None
        self.quiet = 0
        self.severity = Severity.WARNING

    def observe(self, s: GpuSample) -> list[Finding]:
        if s.lost:
            return []
        reasons: list[str] = []
        severity = Severity.WARNING
        ecc = s.ecc or {}
        unc = ecc.get(("uncorrected", "volatile"), ecc.get(("uncorrected", "aggregate")))
        if unc is not None:
            if self.prev is not None and unc > self.prev:
                reasons.append(f"uncorrectable ECC errors rose from {self.prev} to {unc}")
                severity = Severity.CRITICAL
            self.prev = unc
        if s.remap_failure:
            reasons.append("a memory row could not be remapped (remapping failure)")
            severity = Severity.CRITICAL
        if s.remap_pending:
            reasons.append("row remapping is pending until the GPU is reset")
        if s.retired_pages_pending:
            reasons.append("page retirement is pending until the GPU is reset")
        if not reasons:
            if self.episode.active:
                self.quiet += 1
                if self.quiet >= self.cfg.clear_samples and self.episode.close():
                    return [
                        self.finding(
                            self.severity,
                            s,
                            f"{where(s)}: no new uncorrectable ECC errors and nothing pending",
                            resolved=True,
                        )
                    ]
            return []
        self.quiet = 0
        if self.episode.active and severity <= self.severity:
            return []
        self.episode.open(None)
        self.severity = max(self.severity, severity)
        return [
            self.finding(
                severity,
                s,
                f"{where(s)} memory errors: {'; '.join(reasons)}. Uncorrectable errors kill the "
                "processes using that memory (Xid 48/94/95). Usual fix: drain the node and reset the GPU "
                "(`nvidia-smi -r`) so the bad rows are remapped; RMA if it repeats or remapping fails.",
                {
                    "uncorrected": unc,
                    "remap_pending": s.remap_pending,
                    "remap_failure": s.remap_failure,
                    "retired_pages_pending": s.retired_pages_pending,
                },
            )
        ]


class XidRule(GpuRule):
    kind = "xid"

    def __init__(self, cfg: GpuConfig, rank: int | None) -> None:
        super().__init__(cfg, rank)
        self.seen: set[int] = set()
        self.last: float | None = None

    def observe(self, s: GpuSample) -> list[Finding]:
        out: list[Finding] = []
        for x in s.xids:
            self.last = s.time
            if x in self.seen:
                continue
            self.seen.add(x)
            self.episode.open(None)
            info = xid_info(x)
            out.append(
                self.finding(
                    info.severity,
                    s,
                    f"Xid {x} on {where(s)}: {info.meaning}. Usual fix: {info.action}.",
                    {"xid": x, "meaning": info.meaning, "count": s.xid_counts.get(x)},
                )
            )
        if (
            not s.xids
            and self.last is not None
            and s.time - self.last >= self.cfg.xid_quiet
            and self.episode.close()
        ):
            worst = max(xid_info(x).severity for x in self.seen)
            seen, self.seen, self.last = sorted(self.seen), set(), None
            out.append(
                self.finding(
                    worst,
                    s,
                    f"no new Xid on {where(s)} for {fmt(self.cfg.xid_quiet)} s "
                    f"(had {', '.join(map(str, seen))})",
                    {"xids": seen},
                    resolved=True,
                )
            )
        return out


class LostRule(GpuRule):
    kind = "gpu_lost"

    def observe(self, s: GpuSample) -> list[Finding]:
        if s.lost and self.episode.open(None):
            return [
                self.finding(
                    Severity.CRITICAL,
                    s,
                    f"{where(s)} is lost: NVML says '{s.lost_reason or 'GPU is lost'}'. The GPU fell off "
                    "the bus or stopped answering; the process on it is dead or will hang. Usual fix: "
                    "drain the node, reboot it (a GPU reset rarely suffices), check dmesg for Xid 79 and "
                    "the power/PCIe path; resubmit the job from its last checkpoint elsewhere.",
                    {"reason": s.lost_reason},
                )
            ]
        if not s.lost and self.episode.close():
            return [self.finding(Severity.CRITICAL, s, f"{where(s)} answers NVML again", resolved=True)]
        return []


RULES: tuple[type[GpuRule], ...] = (
    LostRule,
    XidRule,
    EccRule,
    OverheatRule,
    ThrottleRule,
    MemoryPressureRule,
    MemoryLeakRule,
)


class GpuDetector:
    """All GPU rules for one rank, one instance of each per GPU."""

    kinds: ClassVar[tuple[str, ...]] = tuple(r.kind for r in RULES)

    def __init__(self, cfg: GpuConfig | None = None, rank: int | None = None) -> None:
        self.cfg = cfg or GpuConfig()
        self.rank = rank
        self.rules: dict[str, list[GpuRule]] = {}

    def observe(self, sample: GpuSample) -> list[Finding]:
        key = sample.uuid or f"index-{sample.index}"
        rules = self.rules.get(key)
        if rules is None:
            rules = self.rules[key] = [r(self.cfg, self.rank) for r in RULES]
        out: list[Finding] = []
        for rule in rules:
            out.extend(rule.observe(sample))
        return out

    def observe_all(self, samples: Iterable[GpuSample]) -> list[Finding]:
        out: list[Finding] = []
        for s in samples:
            out.extend(self.observe(s))
        return out
