"""The "too slow" case the log alone cannot explain: the rank steps, but its GPU waits for input.

A data loader that cannot keep up shows as a GPU mostly idle while the rank's processes
(the loader workers are its children) burn CPU. The log only shows slow steps; the step
time says *that* it is slow, this says *why*. Judged over a long window, because short
idle stretches (an eval, a checkpoint, a logging barrier) are normal.

Pure: the agent passes monotonic ``now`` and the readings in.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from rankwatch.detectors.base import Detector, DetectorContext, Episode
from rankwatch.detectors.registry import register
from rankwatch.events import Event, GpuRound, ProcessSample, Progress
from rankwatch.records import Finding, Severity
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.config.schema import Config, GpuConfig

COVERAGE = 0.9  # readings must span this share of the window before it is judged
MIN_STEPS = 3  # a rank that stopped stepping is a stall, judged elsewhere
RECOVER_MARGIN = 0.1  # resolves once utilisation is this far above the threshold


def _mean(xs: deque[tuple[float, float]]) -> float:
    return sum(v for _, v in xs) / len(xs)


@register
class DataloaderStallDetector(Detector):
    kinds = ("dataloader_stall",)
    accepts = (Progress, ProcessSample, GpuRound)
    section = "gpu"
    path: str | None  # the log the rank writes now

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> DataloaderStallDetector:
        return cls(cfg.gpu, ctx.rank, ctx.path)

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        self.path = state.path or self.path  # the log the rank writes now (a restart may move it)
        e = record
        if isinstance(e, Progress):
            self.on_step(e.now, e.step)
        elif isinstance(e, ProcessSample):
            if e.alive:
                self.on_cpu(e.time, e.cpu_percent)
        elif isinstance(e, GpuRound):
            utils = [s.utilization for s in e.samples if not s.lost and s.utilization is not None]
            return self.on_gpu(e.now, sum(utils) / len(utils) if utils else None)
        return []

    def __init__(self, cfg: GpuConfig, rank: int | None, path: str | None = None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.path = path
        self.gpu: deque[tuple[float, float]] = deque()
        self.cpu: deque[tuple[float, float]] = deque()
        self.steps: deque[float] = deque()
        self.last_step: int | None = None
        self.episode = Episode()

    def _prune(self, now: float) -> None:
        start = now - float(self.cfg.dataloader_window)
        for q in (self.gpu, self.cpu):
            while q and q[0][0] < start:
                q.popleft()
        while self.steps and self.steps[0] < start:
            self.steps.popleft()

    def on_step(self, now: float, step: int | None) -> None:
        self.last_step = step
        if self.cfg.dataloader_window:
            self.steps.append(now)
            self._prune(now)  # bounded even when no GPU reading ever comes (no NVML)

    def on_cpu(self, now: float, cpu_percent: float) -> None:
        if self.cfg.dataloader_window:
            self.cpu.append((now, cpu_percent))
            self._prune(now)

    def on_gpu(self, now: float, utilization: float | None) -> list[Finding]:
        """One reading of the rank's GPUs (mean utilisation, 0..1); judged here."""
        if not self.cfg.dataloader_window or utilization is None:
            return []
        self.gpu.append((now, utilization))
        self._prune(now)
        window = float(self.cfg.dataloader_window)
        covered = bool(self.gpu) and now - self.gpu[0][0] >= COVERAGE * window
        if not covered or not self.cpu:
            return []
        util, cpu = _mean(self.gpu), _mean(self.cpu)
        limit = float(self.cfg.dataloader_max_util)
        if self.episode.active:
            if util >= limit + RECOVER_MARGIN or len(self.steps) < MIN_STEPS:
                self.episode.close()
                return [self._finding(util, cpu, resolved=True)]
            return []
        starved = util < limit and cpu >= float(self.cfg.dataloader_min_cpu_percent)
        if starved and len(self.steps) >= MIN_STEPS and self.episode.open(self.last_step):
            return [self._finding(util, cpu)]
        return []

    def _finding(self, util: float, cpu: float, *, resolved: bool = False) -> Finding:
        minutes = float(self.cfg.dataloader_window) / 60
        if resolved:
            msg = f"the GPU is fed again: utilisation {util:.0%} over the last {minutes:g} min"
        else:
            msg = (
                f"the GPU waits for input: utilisation averaged {util:.0%} over the last {minutes:g} min "
                f"while the rank kept stepping ({len(self.steps)} steps) and its processes used "
                f"{cpu:.0f}% CPU. Usual fix: more DataLoader workers (num_workers), pin_memory and a "
                "larger prefetch_factor, cheaper decoding/augmentation (pre-process offline or on the "
                "GPU), or faster storage. (With CPU offload, e.g. ZeRO-Offload, the optimizer step on "
                "the CPU looks the same: then it is the offload that bounds the step.)"
            )
        return Finding(
            kind="dataloader_stall",
            severity=Severity.WARNING,
            rank=self.rank,
            message=msg,
            step=self.last_step,
            path=self.path,
            evidence={"gpu_utilization": util, "cpu_percent": cpu, "steps_in_window": len(self.steps)},
            resolved=resolved,
        )
