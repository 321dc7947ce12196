"""The host-memory leak that ends in the OOM killer: the rank's RSS climbing steadily.

DataLoader workers that copy a Python list of samples page by page (copy-on-read of
refcounts), a cache keyed by file name, tensors kept on the CPU for logging: the rank's
process tree grows by a few MiB per step until the kernel's OOM killer (or Slurm's cgroup)
sends SIGKILL, and the log says nothing. Warned before the kill, from the process samples:
the lowest RSS of every ``resolution`` (a batch, an eval pass, a checkpoint save come and
go; a leak raises the floor) must climb in every quarter of ``window``, and at that rate
what is still free under the cgroup or host limit must be gone within ``warn_within``.
A flat RSS, a warm-up that levels off and a sawtooth stay silent.

The same rule also watches what the cgroup (or, without one, the node) is charged: its limit
less what is still available. The classic DataLoader case grows there and not in RSS: a
forked worker that reads a Python list writes each object's refcount and so gets its own
copy of every page it touches, but RSS counted those pages in both processes from the fork
on, so the tree's RSS stays flat while the job's memory climbs to the kill
(pytorch/pytorch#5902: "the resident memory size of the python process itself does not grow").
That series is shared: every rank of a node without a cgroup each sees another's growth there,
so its finding names both explanations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rankwatch.config.settings import Duration, Size, climb_problem, opt, settings, settings_of
from rankwatch.detectors.base import Detector, DetectorContext, Episode
from rankwatch.detectors.registry import register
from rankwatch.detectors.trend import CLIMB_SEGMENTS, FloorHistory, sustained_climb
from rankwatch.events import Event, ProcessSample
from rankwatch.records import Finding, Severity
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.config.schema import Config


@settings("detectors", "host_memory", "host memory climbing to the OOM killer")
@dataclass(frozen=True)
class HostMemoryConfig:
    enabled: bool = opt(True, "the rank's RSS climbing steadily towards its cgroup or host memory limit")
    resolution: Duration = opt(Duration(60.0), "one point per this long: the lowest RSS within it", min=1.0)
    window: Duration = opt(Duration(1800.0), "the climb must hold in every quarter of this span", min=60.0)
    min_growth: Size = opt(Size(512 << 20), "and add at least this much RSS over it")
    warn_within: Duration = opt(Duration(3600.0), "warn when the limit is reached within this at that rate")

    def problems(self) -> list[tuple[str, str]]:
        why = climb_problem(float(self.window), float(self.resolution), "window")
        return [("window", why)] if why else []


KIND = "host_memory_growth"
GiB = float(1 << 30)
MiB = float(1 << 20)
CRITICAL_WITHIN_S = 600.0  # the kill is this close: critical


@register
class HostMemoryDetector(Detector):
    kinds = (KIND,)
    accepts = (ProcessSample,)
    section = "detectors.host_memory"

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> HostMemoryDetector:
        return cls(settings_of(cfg.detectors, HostMemoryConfig), ctx.rank, ctx.path)

    def __init__(self, cfg: HostMemoryConfig, rank: int | None = None, path: str | None = None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.path = path
        self.history = FloorHistory(float(cfg.resolution), float(cfg.window))  # the tree's RSS
        self.charged = FloorHistory(float(cfg.resolution), float(cfg.window))  # limit - available
        self.watched = self.history  # the series whose climb opened the episode
        self.episode = Episode()
        self.severity = Severity.WARNING

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, ProcessSample) or not self.cfg.enabled:
            return []
        self.path = state.path or self.path  # the log the rank writes now (a restart may move it)
        s = record
        if not s.alive:
            if self.episode.close():
                return [
                    self._finding(
                        self.severity, "the process exited (its end is reported separately)", s, True
                    )
                ]
            return []
        if s.rss_bytes <= 0:
            return []
        closed = self.history.add(s.time, float(s.rss_bytes))
        if s.memory_limit_bytes is not None and s.memory_available_bytes is not None:
            used = float(max(0, s.memory_limit_bytes - s.memory_available_bytes))
            closed = self.charged.add(s.time, used) or closed
        if not closed:
            return []
        if self.episode.active:
            return self._maybe_resolve(s)
        if s.memory_available_bytes is None:
            return []
        found = [
            (c, h)
            for h in (self.history, self.charged)
            if h.full()
            and (c := sustained_climb(h.points, min_growth=float(self.cfg.min_growth))) is not None
            and c.per_minute > 0
        ]
        if not found:
            return []
        climb = max((c for c, _ in found), key=lambda c: c.per_minute)  # the faster empties it first
        in_rss = any(h is self.history for _, h in found)
        self.watched = self.history if in_rss else self.charged
        eta = s.memory_available_bytes / (climb.per_minute / 60)
        if eta > float(self.cfg.warn_within):
            return []
        self.severity = Severity.CRITICAL if eta <= CRITICAL_WITHIN_S else Severity.WARNING
        self.episode.open(state.last_step)
        limit = f" of its {s.memory_limit_bytes / GiB:.1f} GiB limit" if s.memory_limit_bytes else ""
        what = (
            f"host memory of the rank's processes has been climbing for {climb.span / 60:.0f} min: "
            f"RSS {s.rss_bytes / GiB:.1f} GiB, its floor"
            if in_rss
            else f"memory charged to the rank's cgroup (the node's, without one) has been climbing for "
            f"{climb.span / 60:.0f} min while the rank's RSS ({s.rss_bytes / GiB:.1f} GiB) does not show "
            "it: forked workers copying the pages they read, or another process sharing the cgroup or "
            "node: its floor"
        )
        msg = (
            f"{what} +{climb.growth / MiB:.0f} MiB at "
            f"{climb.per_minute / MiB:.1f} MiB/min; {s.memory_available_bytes / GiB:.1f} GiB{limit} is "
            f"left, gone in about {eta / 60:.0f} min, then the kernel's OOM killer (or the job's cgroup) "
            "kills the rank with SIGKILL and no traceback. Usual causes: DataLoader workers copying a "
            "Python list of samples (use numpy arrays or a memory-mapped dataset), a cache or a list "
            "that grows every step, CPU tensors kept for logging. Usual fix: find what grows "
            "(tracemalloc, memray, py-spy dump of the workers) and checkpoint before the kill."
        )
        evidence = {
            "rss_bytes": s.rss_bytes,
            "growth_bytes": climb.growth,
            "slope_bytes_per_minute": climb.per_minute,
            "window_seconds": climb.span,
            "available_bytes": s.memory_available_bytes,
            "limit_bytes": s.memory_limit_bytes,
            "eta_seconds": eta,
            "series": "rss" if in_rss else "charged",
        }
        return [self._finding(self.severity, msg, s, False, evidence, step=state.last_step)]

    def _maybe_resolve(self, s: ProcessSample) -> list[Finding]:
        """The last quarter of the window no longer climbs (or memory was freed)."""
        pts = self.watched.points
        if not pts:
            return []
        since = pts[-1][0] - self.watched.window / CLIMB_SEGMENTS
        tail = [v for t, v in pts if t >= since]
        if len(tail) < 2:
            return []
        freed = min(tail) < tail[0] - float(self.cfg.min_growth) / CLIMB_SEGMENTS
        flat = tail[-1] - tail[0] < float(self.cfg.min_growth) / (2 * CLIMB_SEGMENTS)
        if not (freed or flat) or not self.episode.close():
            return []
        return [
            self._finding(
                self.severity, f"host memory stopped climbing at {s.rss_bytes / GiB:.1f} GiB", s, True
            )
        ]

    def _finding(
        self,
        severity: Severity,
        message: str,
        s: ProcessSample,
        resolved: bool,
        evidence: Mapping[str, object] | None = None,
        *,
        step: int | None = None,
    ) -> Finding:
        return Finding(
            kind=KIND,
            severity=severity,
            rank=self.rank,
            message=message,
            step=step,
            path=self.path,
            evidence=dict(evidence or {}),
            resolved=resolved,
        )
