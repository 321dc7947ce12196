"""The "too slow" family as seen in the log: throughput against a learned baseline."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice

from rankwatch.config.settings import opt, settings
from rankwatch.detectors.base import Detector, Episode, finding, fmt, median
from rankwatch.detectors.registry import register
from rankwatch.events import Event
from rankwatch.records import Finding, Severity, StepRecord
from rankwatch.state import RankState


@settings("detectors", "throughput", "throughput drop")
@dataclass(frozen=True)
class ThroughputConfig:
    enabled: bool = opt(True, "step time or tokens/s far worse than the learned baseline")
    drop_ratio: float = opt(0.5, "throughput at or below this fraction of baseline is a drop")
    baseline_steps: int = opt(
        20, "logged steps whose median forms the baseline (the best such median so far)"
    )
    consecutive: int = opt(5, "logged steps in a row below the threshold")


FIRST_BASELINE = 5  # logged rates before a first baseline exists
BASELINE_EVERY = 5  # once the window is full, the baseline is looked at again every this many rates


def _rate(rec: StepRecord, prev: StepRecord | None) -> tuple[str, float] | None:
    """A higher-is-better throughput figure, preferring what the framework printed."""
    v = rec.tokens_per_s
    if v is not None and v - v == 0 and v > 0:  # finite and positive
        return "tokens/s", float(v)
    v = rec.samples_per_s
    if v is not None and v - v == 0 and v > 0:
        return "samples/s", float(v)
    v = rec.step_time_s
    if v is not None and v - v == 0 and v > 0:
        return "steps/s", 1.0 / v
    if (
        prev is not None
        and rec.time is not None
        and prev.time is not None
        and rec.step is not None
        and prev.step is not None
        and rec.step > prev.step
        and rec.time > prev.time
    ):
        return "steps/s", (rec.step - prev.step) / (rec.time - prev.time)
    return None


@register
class ThroughputDetector(Detector):
    """Baseline = the best median of ``baseline_steps`` consecutive logged rates seen so far
    (a median, so a slow first step never sets it; the best, so a baseline first taken at a
    slow moment rises to the run's real speed). A rate at or below ``drop_ratio`` of it for
    ``consecutive`` logged steps in a row is a drop, judged as soon as a first baseline of
    ``FIRST_BASELINE`` rates exists."""

    kinds = ("throughput_drop",)
    accepts = (StepRecord,)
    section = "detectors.throughput"

    def __init__(self, cfg: ThroughputConfig, warmup_steps: int) -> None:
        self.cfg = cfg
        self.unit: str | None = None
        self.samples: deque[float] = deque(maxlen=max(FIRST_BASELINE, cfg.baseline_steps))
        self.baseline: float | None = None
        self.taken = 0
        self.low: list[tuple[int | None, float]] = []
        self.prev: StepRecord | None = None
        self.episode = Episode()

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not self.cfg.enabled or not isinstance(record, StepRecord):
            return []
        prev, self.prev = self.prev, record
        got = _rate(record, prev)
        if got is None:
            return []
        unit, value = got
        if self.unit is None:
            self.unit = unit
        elif unit != self.unit:
            return []
        cfg = self.cfg
        # Exactly ``drop_ratio`` counts: "half the speed" is the rule's own example.
        slow = self.baseline is not None and value <= cfg.drop_ratio * self.baseline * (1 + 1e-9)
        if not slow:
            self.samples.append(value)
            self.taken += 1
            n = len(self.samples)
            if n >= FIRST_BASELINE and (n < cfg.baseline_steps or self.taken % BASELINE_EVERY == 0):
                k = min(n, cfg.baseline_steps)
                if k > 0:
                    # The median of the last k, as statistics.median takes it (inline: every fifth step).
                    window = sorted(self.samples) if k == n else sorted(islice(self.samples, n - k, n))
                    half = k // 2
                    level = window[half] if k % 2 else (window[half - 1] + window[half]) / 2
                else:
                    level = median(list(self.samples)[-k:])
                if self.baseline is None or level > self.baseline:
                    self.baseline = level
        base = self.baseline
        if base is None:
            return []
        if slow:
            self.low.append((record.step, value))
        else:
            if self.low:
                self.low.clear()
            if self.episode.active and value >= 0.8 * base and self.episode.close():
                return [
                    finding(
                        "throughput_drop",
                        Severity.WARNING,
                        state,
                        f"throughput recovered: {fmt(value)} {unit}",
                        record=record,
                        resolved=True,
                    )
                ]
        if len(self.low) >= cfg.consecutive and self.episode.open(record.step):
            cur = median([v for _, v in self.low])
            return [
                finding(
                    "throughput_drop",
                    Severity.WARNING,
                    state,
                    f"throughput dropped to {fmt(cur)} {unit}, {cur / base * 100:.0f}% of its "
                    f"baseline {fmt(base)} {unit} for {len(self.low)} logged steps since step "
                    f"{self.low[0][0]}. Usual causes: a straggler GPU (thermal/power throttling), a slow "
                    "data loader or filesystem, another job on the node, or a network degradation. "
                    "Usual fix: compare this rank's GPU clocks, throttle reasons and data-loader CPU with "
                    "its peers' (Grafana's rank detail board), then drain or fix the slow part.",
                    record=record,
                    step=self.low[0][0],
                    evidence={"baseline": base, "current": cur, "unit": unit},
                )
            ]
        return []


# Order of findings of one log record across modules (registry.py): then the rate.
ORDER = 40
