"""The agent's own folders running out of space: the rank's log, the dumps, the alert spool.

In ``run`` mode the child's stdout *is* the log file: when that filesystem fills, the
child's next print fails and it dies, and the traceback it would print cannot be written
either. So low space is said before it happens (``disk_low``), from free-space samples the
agent takes off its loop; and a death while the log's filesystem is full is named as such
(``full``, used by the crash finding).

Pure: samples in, findings out.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from rankwatch.detectors.base import Detector, DetectorContext
from rankwatch.detectors.registry import register
from rankwatch.events import DiskSample, Event
from rankwatch.records import Finding, Severity
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.config.schema import Config

LOW_RATIO = 0.10  # of the filesystem ...
LOW_BYTES_CAP = 5 << 30  # ... but never asks for more than this free
FULL_BYTES = 1 << 20  # less than this available: a write of a few lines fails
ETA_WARN_S = 1800.0  # filling at the recent rate, full within this: warn now
RATE_WINDOW_S = 60.0
FILL_SPAN_S = 10.0
FILL_RATIO = 0.25
RESOLVE_MARGIN = 1.2


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def low_threshold(total: int) -> float:
    return min(LOW_RATIO * total, LOW_BYTES_CAP)


def is_full(s: DiskSample) -> bool:
    return s.error is None and s.total > 0 and s.free < min(FULL_BYTES, 0.01 * s.total + 1)


def _where(roles: dict[str, str]) -> str:
    return ", ".join(f"{role} folder {path}" for path, role in roles.items())


@register
class DiskDetector(Detector):
    """One ``disk_low`` episode per filesystem (its roles name it in the message, and the
    first of its folders is the finding's subject)."""

    kinds = ("disk_low",)
    accepts = (DiskSample,)
    section = None  # thresholds are fixed: a nearly full disk is news whatever the job

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> DiskDetector:
        return cls(ctx.rank)

    def __init__(self, rank: int | None) -> None:
        self.rank = rank
        self.history: dict[str, deque[tuple[float, int]]] = {}
        self.active: dict[str, Severity] = {}

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        return self.judge(record, wall=record.wall) if isinstance(record, DiskSample) else []

    def judge(self, s: DiskSample, *, wall: float | None = None) -> list[Finding]:
        if s.error is not None or s.total <= 0:
            return []
        key = ",".join(sorted(s.roles))
        hist = self.history.setdefault(key, deque())
        hist.append((s.time, s.free))
        while len(hist) > 2 and s.time - hist[1][0] >= RATE_WINDOW_S:
            hist.popleft()
        threshold = low_threshold(s.total)
        eta = None
        t0, f0 = hist[0]
        if s.time - t0 > 0 and s.free < f0:
            eta = s.free / ((f0 - s.free) / (s.time - t0))
        full = is_full(s)
        # A sustained fill, not one checkpoint save's burst: a rate over FILL_SPAN_S at least,
        # on a filesystem already three-quarters used.
        filling = (
            eta is not None
            and eta < ETA_WARN_S
            and s.time - t0 >= FILL_SPAN_S
            and s.free < FILL_RATIO * s.total
        )
        if full or s.free < threshold or filling:
            sev = Severity.CRITICAL if full else Severity.WARNING
            if key in self.active and sev <= self.active[key]:
                return []
            self.active[key] = sev
            pct = 100.0 * s.free / s.total
            why = [f"{human(s.free)} free of {human(s.total)} ({pct:.1f}%)"]
            if filling and eta is not None:
                rate = human((f0 - s.free) / (s.time - t0))
                why.append(f"filling at {rate}/s, full in about {eta / 60:.0f} min")
            if "log" in s.roles.values():
                what = (
                    "When it is full the rank's own writes to its log (its stdout in run mode) fail and it "
                    "dies, with no traceback (that cannot be written either)."
                )
            else:
                what = "When it is full stack dumps and queued alerts cannot be written."
            msg = (
                f"{'disk full' if full else 'disk space low'} on the filesystem of the {_where(s.roles)}: "
                f"{'; '.join(why)}. {what} Fix: free space there, or move runner.log_dir / dumps.dir / "
                "alerts.spool_dir to a larger filesystem."
            )
            return [
                Finding(
                    kind="disk_low",
                    severity=sev,
                    rank=self.rank,
                    message=msg,
                    path=next(iter(s.roles)),
                    subject=key,
                    time=wall,
                    evidence={
                        "roles": dict(s.roles),
                        "free_bytes": s.free,
                        "total_bytes": s.total,
                        "eta_seconds": eta,
                    },
                )
            ]
        if key in self.active and s.free >= RESOLVE_MARGIN * threshold and not filling:
            sev = self.active.pop(key)
            return [
                Finding(
                    kind="disk_low",
                    severity=sev,
                    rank=self.rank,
                    message=f"the filesystem of the {_where(s.roles)} has {human(s.free)} free again",
                    path=next(iter(s.roles)),
                    subject=key,
                    time=wall,
                    resolved=True,
                )
            ]
        return []
