"""GPU health from NVML samples: heat, throttling, memory pressure and leaks, ECC, Xid, loss.

Pure: fed ``GpuSample`` objects, returns findings, no I/O. One ``GpuDetector`` per rank
keeps one set of rules per GPU (by UUID). Lasting conditions fire once and resolve once;
``evidence`` names the GPU (index and UUID) and ``Finding.subject`` is its UUID, so each GPU
of a rank fires and resolves on its own.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rankwatch.detectors.base import Detector, DetectorContext, Episode, fmt
from rankwatch.detectors.registry import register
from rankwatch.detectors.trend import (
    CLIMB_SEGMENTS,
    LEAK_NOISE,
    CounterWindow,
    FloorHistory,
    staircase_step,
    sustained_climb,
)
from rankwatch.events import Event, GpuRound, GpuSample, NvmlHang
from rankwatch.records import Finding, Severity
from rankwatch.state import RankState
from rankwatch.xid import xid_info

if TYPE_CHECKING:
    from rankwatch.config.schema import Config, GpuConfig

MiB = float(1 << 20)
GiB = float(1 << 30)

# Clock-event reasons that mean "slowed to protect the hardware". sw_power_cap is left out:
# a GPU at its power limit under full load is doing its job, not failing.
SLOWDOWN_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown")
COOL_MARGIN_C = 5.0  # hysteresis: an overheat resolves below threshold minus this
PRESSURE_MARGIN = 0.02

ACTIVITY_BUSY = "busy"
ACTIVITY_SPINNING = "spinning in a collective"
ACTIVITY_IDLE = "idle"
ACTIVITY_AMBIGUOUS = "fully utilised, but no power reading tells compute from a collective's spin"
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

    Only ``busy`` counts as a sign of life for the stall detector, so it must be earned:
    NVML's utilisation is the share of time *a* kernel was resident, and an NCCL kernel
    polling for a peer that never comes keeps it at 100%.

    - ``idle``: utilisation ~0: nothing is launched, the host side is stuck (data loader,
      I/O, a Python deadlock).
    - ``spinning in a collective``: utilisation ~100% with a quiet GPU: power near idle
      (< 30% of the limit) and the memory controller quiet where it is read, or, without a
      power reading, the memory controller quiet: another rank is hung.
    - ``busy``: real work: partial load (kernels come and go, so the host is launching
      them), or full load with power well above idle, or without power, with memory traffic.
    - the ambiguous class: full load and neither power nor memory utilisation to tell
      (NOT_SUPPORTED on some boards, vGPUs): not taken as life.
    - ``unknown``: no utilisation reading.
    """
    live = [s for s in samples if not s.lost and s.utilization is not None]
    if not live:
        return ACTIVITY_UNKNOWN
    util = _mean([s.utilization for s in live if s.utilization is not None])
    if util <= IDLE_UTIL:
        return ACTIVITY_IDLE
    if util < SPIN_UTIL:
        return ACTIVITY_BUSY
    power = [s.power / s.power_limit for s in live if s.power is not None and s.power_limit]
    mem = [s.memory_utilization for s in live if s.memory_utilization is not None]
    quiet_memory = _mean(mem) < SPIN_MEMORY_UTIL if mem else None
    if power:
        if _mean(power) < SPIN_POWER_RATIO and quiet_memory is not False:
            return ACTIVITY_SPINNING
        return ACTIVITY_BUSY
    if quiet_memory is None:
        return ACTIVITY_AMBIGUOUS
    return ACTIVITY_SPINNING if quiet_memory else ACTIVITY_BUSY


class GpuRule(ABC):
    kind: ClassVar[str] = ""

    def __init__(self, cfg: GpuConfig, rank: int | None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.episode = Episode()

    @abstractmethod
    def observe(self, s: GpuSample) -> list[Finding]:
        """Findings this sample of the rule's GPU brings about."""

    def finding(
        self,
        severity: Severity,
        s: GpuSample,
        message: str,
        evidence: dict[str, Any] | None = None,
        *,
        resolved: bool = False,
    ) -> Finding:
        if s.attribution == "unattributed" and not resolved:
            message += (
                f" Note: GPU {s.index} was not tied to this rank's processes (every GPU of the node is "
                "watched), so it may belong to another job; set gpu.devices to watch only this rank's."
            )
        return Finding(
            kind=self.kind,
            severity=severity,
            rank=self.rank,
            message=message,
            time=s.time,
            evidence={"gpu": s.index, "uuid": s.uuid, "attribution": s.attribution, **(evidence or {})},
            resolved=resolved,
            subject=s.uuid or f"gpu{s.index}",
        )


class _Sustained(GpuRule):
    """Fires after ``sustain_samples`` in a row with the condition; resolves after ``clear_samples``."""

    severity: ClassVar[Severity] = Severity.WARNING

    def __init__(self, cfg: GpuConfig, rank: int | None) -> None:
        super().__init__(cfg, rank)
        self.hot = 0
        self.cool = 0

    @abstractmethod
    def present(self, s: GpuSample) -> bool:
        """Whether the sample has the reading at all; a missing one changes nothing."""

    @abstractmethod
    def active(self, s: GpuSample) -> bool | None:
        """True: condition holds; False: clearly gone; None: inside the hysteresis band."""

    @abstractmethod
    def fire(self, s: GpuSample) -> Finding:
        """The finding when the condition has held long enough."""

    @abstractmethod
    def clear(self, s: GpuSample) -> Finding:
        """The resolving finding when it has been gone long enough."""

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
    """Two horizons, because leaks come at two speeds.

    A leak of a tensor per step climbs as a staircase within minutes: the short window.
    A leak of a few MiB per step (a list of losses kept on the GPU, a cache that grows with
    every new shape) hides under the short window's thresholds and still runs out overnight:
    the long horizon watches the memory *floor* (lowest reading per minute) for an hour and
    flags it when it climbs in every quarter of that hour. Warm-up growth, a plateau and a
    one-off allocator jump do not, so healthy runs stay silent.
    """

    kind = "gpu_memory_leak"

    def __init__(self, cfg: GpuConfig, rank: int | None) -> None:
        super().__init__(cfg, rank)
        self.seen = 0
        self.window: deque[tuple[float, float]] = deque(maxlen=max(3, cfg.leak_window))
        self.history = FloorHistory(float(cfg.leak_long_resolution), float(cfg.leak_long_window))
        self.horizon: str | None = None  # which horizon opened the current episode

    def observe(self, s: GpuSample) -> list[Finding]:
        if s.lost or s.memory_used is None:
            return []
        self.seen += 1
        if self.seen <= self.cfg.warmup_samples:  # kept out of both horizons, not just of judgement
            return []
        self.window.append((s.time, float(s.memory_used)))
        new_point = self.history.add(s.time, float(s.memory_used))
        if self.episode.active:
            return self._maybe_resolve(s, new_point)
        out = self._short(s)
        if not out and new_point and self.cfg.leak_long_window > 0 and self.history.full():
            out = self._long(s)
        return out

    def _short(self, s: GpuSample) -> list[Finding]:
        if len(self.window) < (self.window.maxlen or 0):
            return []
        times = [t for t, _ in self.window]
        used = [u for _, u in self.window]
        step = staircase_step(
            used, min_steps=self.cfg.leak_min_steps, min_growth=float(self.cfg.leak_min_growth)
        )
        if step is None or not self.episode.open(None):
            return []
        self.horizon = "short"
        n = len(used) - 1
        growth = used[-1] - used[0]
        per_sample = growth / n
        span = times[-1] - times[0]
        per_min = growth / span * 60 if span > 0 else None
        rate = f", {per_min / MiB:.0f} MiB/min" if per_min else ""
        steps = sum(1 for a, b in itertools.pairwise(used) if b - a > LEAK_NOISE)
        return [
            self.finding(
                Severity.WARNING,
                s,
                f"{where(s)} memory is climbing as a staircase: +{growth / MiB:.0f} MiB over the last "
                f"{n} samples in {steps} steps of ~{step / MiB:.0f} MiB ({per_sample / MiB:.1f} MiB per "
                f"sample{rate}), now {used[-1] / GiB:.1f} GiB{_eta(s, used[-1], per_min)}. A plateau "
                "after warm-up is normal; steady steps mean something keeps tensors alive across steps "
                "(a loss summed without .item()/.detach(), outputs appended to a list, a cache keyed by "
                "shape). Usual fix: take a torch.cuda.memory snapshot and find what holds the references.",
                {
                    "horizon": "short",
                    "growth_bytes": growth,
                    "step_bytes": step,
                    "slope_bytes_per_sample": per_sample,
                    "slope_bytes_per_minute": per_min,
                },
            )
        ]

    def _long(self, s: GpuSample) -> list[Finding]:
        climb = sustained_climb(self.history.points, min_growth=float(self.cfg.leak_long_min_growth))
        if climb is None or not self.episode.open(None):
            return []
        self.horizon = "long"
        floor = self.history.points[-1][1]
        minutes = climb.span / 60
        jump = f" (plus one jump of {climb.jump / MiB:.0f} MiB, left out)" if climb.jump else ""
        return [
            self.finding(
                Severity.WARNING,
                s,
                f"{where(s)} memory has been creeping up for {minutes:.0f} min: its floor rose "
                f"+{climb.growth / MiB:.0f} MiB{jump} in every quarter of that time, "
                f"{climb.per_minute / MiB:.1f} MiB/min, now {floor / GiB:.1f} GiB"
                f"{_eta(s, floor, climb.per_minute)}. Too slow to show within minutes, it is the usual "
                "overnight out-of-memory: a little memory kept alive per step (losses or metrics kept as "
                "GPU tensors, a list that grows, a cache keyed by shape or sequence length). Usual fix: "
                "compare two torch.cuda.memory snapshots an hour apart and find what grew.",
                {
                    "horizon": "long",
                    "growth_bytes": climb.growth,
                    "largest_jump_bytes": climb.jump,
                    "window_seconds": climb.span,
                    "slope_bytes_per_minute": climb.per_minute,
                },
            )
        ]

    def _maybe_resolve(self, s: GpuSample, new_point: bool) -> list[Finding]:
        stopped = self._short_stopped() if self.horizon == "short" else new_point and self._long_stopped()
        if not stopped or not self.episode.close():
            return []
        return [
            self.finding(
                Severity.WARNING,
                s,
                f"{where(s)} memory stopped climbing at {float(s.memory_used or 0) / GiB:.1f} GiB",
                resolved=True,
            )
        ]

    def _short_stopped(self) -> bool:
        used = [u for _, u in self.window]
        tail = used[-max(3, len(used) // 3) :]
        diffs = [b - a for a, b in itertools.pairwise(tail)]
        freed = min(diffs) < -float(self.cfg.leak_min_growth)
        return freed or all(d <= LEAK_NOISE for d in diffs)

    def _long_stopped(self) -> bool:
        """The last quarter of the horizon no longer climbs as the episode's start demanded."""
        pts = self.history.points
        since = pts[-1][0] - self.history.window / CLIMB_SEGMENTS
        tail = [v for t, v in pts if t >= since]
        if len(tail) < 2:
            return False
        freed = min(tail) < tail[0] - float(self.cfg.leak_min_growth)
        return freed or tail[-1] - tail[0] < float(self.cfg.leak_long_min_growth) / (2 * CLIMB_SEGMENTS)


def _eta(s: GpuSample, used: float, per_min: float | None) -> str:
    if not per_min or per_min <= 0 or not s.memory_total:
        return ""
    return f"; at this rate memory is full in about {(s.memory_total - used) / per_min:.0f} min"


ECC_STORM = 10.0  # times the configured corrected-error rate: a storm, worth a warning
_ECC_ADVICE = {
    Severity.CRITICAL: "Uncorrectable errors kill the processes using that memory (Xid 48/94/95). Usual "
    "fix: drain the node and reset the GPU (`nvidia-smi -r`) so the bad rows are remapped; RMA if it "
    "repeats or remapping fails.",
    Severity.WARNING: "The board is retiring or remapping memory, which takes effect at the next GPU "
    "reset. Usual fix: drain the node when the job allows and reset the GPU; RMA if it keeps happening.",
    Severity.INFO: "Nothing fails now, but it is the first place to look if this rank later dies with "
    "Xid 48/63/64/94/95. `nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER` shows the details.",
}


class EccRule(GpuRule):
    """Memory errors, from the board's ECC counters, retired pages and row-remapper flags.

    Severity follows what the error does to the job. An uncorrectable error, or a row that
    could not be remapped, kills the processes using that memory: critical. A retired page
    or a pending remap is the board healing itself at the next reset: warning. A steady
    trickle of corrected errors harms nothing yet but precedes both: info, warning when it
    is a storm. What the board carried before the agent started is a history, told once as
    info. One episode per GPU; it fires again only when its severity rises, so flags that
    stay set until a reset do not repeat. Only samples whose counters were read this round
    count (``health_fresh``; they are read every ``gpu.health_interval``), so a new error is
    seen within one health interval and ``clear_samples`` counts reads, not carried copies.
    """

    kind = "ecc_error"

    def __init__(self, cfg: GpuConfig, rank: int | None) -> None:
        super().__init__(cfg, rank)
        self.first = True
        self.prev_unc: int | None = None
        self.prev_retired: dict[str, int] | None = None
        self.corrected = CounterWindow(float(cfg.ecc_corrected_window))
        self.rate_on = False
        self.quiet = 0
        self.severity = Severity.INFO

    def observe(self, s: GpuSample) -> list[Finding]:
        if s.lost or not s.health_fresh:  # carried-forward counters: nothing new, nor a quiet sample
            return []
        reasons = self._history(s) if self.first else []
        self.first = False
        reasons += self._uncorrected(s) + self._retired(s) + self._flags(s) + self._corrected(s)
        if not reasons:
            return self._maybe_resolve(s)
        self.quiet = 0
        severity = max(sev for _, sev in reasons)
        if self.episode.active and severity <= self.severity:
            return []
        self.episode.open(None)
        self.severity = max(self.severity, severity)
        ecc = s.ecc or {}
        return [
            self.finding(
                severity,
                s,
                f"{where(s)} memory errors: {'; '.join(t for t, _ in reasons)}. {_ECC_ADVICE[severity]}",
                {
                    "uncorrected": self.prev_unc,
                    "corrected": ecc.get(("corrected", "volatile"), ecc.get(("corrected", "aggregate"))),
                    "retired_pages": s.retired_pages,
                    "remapped_rows": s.remapped_rows,
                    "remap_pending": s.remap_pending,
                    "remap_failure": s.remap_failure,
                    "retired_pages_pending": s.retired_pages_pending,
                },
            )
        ]

    def _maybe_resolve(self, s: GpuSample) -> list[Finding]:
        if not self.episode.active:
            return []
        self.quiet += 1
        if self.quiet < self.cfg.clear_samples or not self.episode.close():
            return []
        severity, self.severity = self.severity, Severity.INFO
        return [
            self.finding(
                severity,
                s,
                f"{where(s)}: no new ECC errors or retired pages, nothing pending",
                resolved=True,
            )
        ]

    def _history(self, s: GpuSample) -> list[tuple[str, Severity]]:
        ecc = s.ecc or {}
        facts: list[str] = []
        vol, agg = ecc.get(("uncorrected", "volatile")), ecc.get(("uncorrected", "aggregate"))
        if vol:
            facts.append(f"{vol} uncorrectable ECC errors since the driver loaded")
        if agg and agg != vol:
            facts.append(f"{agg} uncorrectable ECC errors in the board's lifetime")
        pages = sum((s.retired_pages or {}).values())
        if pages:
            facts.append(f"{pages} pages retired")
        rows = sum((s.remapped_rows or {}).values())
        if rows:
            facts.append(f"{rows} rows remapped")
        if not facts:
            return []
        return [(f"before this agent started: {', '.join(facts)}", Severity.INFO)]

    def _uncorrected(self, s: GpuSample) -> list[tuple[str, Severity]]:
        ecc = s.ecc or {}
        unc = ecc.get(("uncorrected", "volatile"), ecc.get(("uncorrected", "aggregate")))
        if unc is None:
            return []
        prev, self.prev_unc = self.prev_unc, unc
        if prev is not None and unc > prev:
            return [(f"uncorrectable ECC errors rose from {prev} to {unc}", Severity.CRITICAL)]
        return []

    def _retired(self, s: GpuSample) -> list[tuple[str, Severity]]:
        if s.retired_pages is None:
            return []
        prev, self.prev_retired = self.prev_retired, dict(s.retired_pages)
        if prev is None:
            return []
        out: list[tuple[str, Severity]] = []
        for cause, n in sorted(s.retired_pages.items()):
            before = prev.get(cause, n)
            if n > before:
                sev = Severity.CRITICAL if cause == "double_bit_ecc" else Severity.WARNING
                out.append((f"{n - before} more page(s) retired ({cause.replace('_', '-')}, now {n})", sev))
        return out

    def _flags(self, s: GpuSample) -> list[tuple[str, Severity]]:
        out: list[tuple[str, Severity]] = []
        if s.remap_failure:
            out.append(("a memory row could not be remapped (remapping failure)", Severity.CRITICAL))
        if s.remap_pending:
            out.append(("row remapping is pending until the GPU is reset", Severity.WARNING))
        if s.retired_pages_pending:
            out.append(("page retirement is pending until the GPU is reset", Severity.WARNING))
        return out

    def _corrected(self, s: GpuSample) -> list[tuple[str, Severity]]:
        """A sustained corrected-error rate, with hysteresis: on at the rate, off below half of it."""
        ecc = s.ecc or {}
        count = ecc.get(("corrected", "volatile"), ecc.get(("corrected", "aggregate")))
        need = self.cfg.ecc_corrected_rate * self.corrected.window / 3600
        if count is None or need <= 0:
            return []
        self.corrected.add(s.time, float(count))
        rise, covered, spread = self.corrected.increase(s.time)
        if rise < need / 2:
            self.rate_on = False
        elif covered and spread and rise >= need:
            self.rate_on = True
        if not self.rate_on:
            return []
        sev = Severity.WARNING if rise >= ECC_STORM * need else Severity.INFO
        per_hour = rise * 3600 / self.corrected.window
        minutes = self.corrected.window / 60
        text = f"corrected ECC errors keep coming: +{rise:.0f} in {minutes:.0f} min ({per_hour:.0f}/h)"
        return [(text, sev)]


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


NVML_HANG_S = 60.0  # NVML unanswered this long (or 3 call timeouts): gpu_unresponsive


@register
class NvmlHangRule(Detector):
    """NVML itself stops answering (a driver call hangs past ``gpu.call_timeout``): no sample
    can say which GPU, yet it is often how a GPU that fell off the bus first shows. Judged on
    how long the hang has lasted, so one slow call is not a page."""

    kind = "gpu_unresponsive"
    kinds = (kind,)
    accepts = (NvmlHang,)
    section = "gpu"

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> NvmlHangRule:
        return cls(max(NVML_HANG_S, 3 * float(cfg.gpu.call_timeout)), ctx.rank)

    def __init__(self, after_s: float, rank: int | None) -> None:
        self.after_s = after_s
        self.rank = rank
        self.episode = Episode()

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        return self.judge(record.hung_for) if isinstance(record, NvmlHang) else []

    def judge(self, hung_for: float | None) -> list[Finding]:
        if hung_for is not None and hung_for >= self.after_s and self.episode.open(None):
            msg = (
                f"NVML has not answered for {hung_for:.0f}s (a driver call hangs): GPU metrics stopped. "
                "After an Xid 79 this is how a GPU that fell off the bus shows; the ranks on this node "
                "will hang or die. Usual fix: check dmesg for Xid lines and `nvidia-smi` on the node; "
                "drain it and resubmit from the last checkpoint if a GPU is gone."
            )
            return [self._finding(msg, {"seconds_unanswered": hung_for})]
        if hung_for is None and self.episode.close():
            return [self._finding("NVML answers again", {}, resolved=True)]
        return []

    def _finding(self, msg: str, evidence: dict[str, Any], resolved: bool = False) -> Finding:
        return Finding(
            kind=self.kind,
            severity=Severity.CRITICAL,
            rank=self.rank,
            message=msg,
            evidence=evidence,
            resolved=resolved,
        )


RULES: tuple[type[GpuRule], ...] = (
    LostRule,
    XidRule,
    EccRule,
    OverheatRule,
    ThrottleRule,
    MemoryPressureRule,
    MemoryLeakRule,
)


@register
class GpuDetector(Detector):
    """All GPU rules for one rank, one instance of each per GPU."""

    kinds: ClassVar[tuple[str, ...]] = tuple(r.kind for r in RULES)
    accepts = (GpuRound,)
    section = "gpu"

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> GpuDetector:
        return cls(cfg.gpu, ctx.rank)

    def __init__(self, cfg: GpuConfig | None = None, rank: int | None = None) -> None:
        self.cfg = cfg or GpuConfig()
        self.rank = rank
        self.rules: dict[str, list[GpuRule]] = {}

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        return self.observe_all(record.samples) if isinstance(record, GpuRound) else []

    def observe_sample(self, sample: GpuSample) -> list[Finding]:
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
            out.extend(self.observe_sample(s))
        return out
