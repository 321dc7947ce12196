"""Trends in GPU series: the fast staircase of a leak, the slow climb of an overnight one, and
the sustained rate of a cumulative counter.

Pure arithmetic over bounded buffers, no I/O, so ``detectors.gpu`` stays free of it and the
rules can be tested with plain numbers. Times are seconds, memory is bytes.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from rankwatch.records import median

MiB = float(1 << 20)
LEAK_NOISE = 1 * MiB  # a steady training job's NVML "used" does not move by a byte between steps
LEAK_STEP_SPREAD = 3.0  # steps of one staircase are within this factor of their median
CLIMB_SEGMENTS = 4  # the long horizon must climb in each quarter, not just somewhere in it
CLIMB_DROP_SHARE = 0.1  # falls along the way may undo at most this share of the climb
COUNTER_POINTS = 4096  # change points a counter window keeps; a storm beyond it only coarsens


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
    med = median(sizes)
    if any(d > med * LEAK_STEP_SPREAD or d < med / LEAK_STEP_SPREAD for d in sizes):
        return None
    third = max(1, len(diffs) // 3)
    if rises[0][0] >= third or rises[-1][0] < len(diffs) - third:
        return None
    return med


class FloorHistory:
    """A long, cheap memory history: one point per ``resolution`` seconds, its lowest reading.

    The floor rather than the mean or the last value: activations, an eval pass or a
    fragmentation peak come and go, while a leak raises the level memory falls back to.
    Points older than ``window`` are dropped; a pause in sampling leaves a gap in time
    rather than invented points. The first interval is seen only in part, so its floor is
    not comparable with the others and is never kept.
    """

    def __init__(self, resolution: float, window: float) -> None:
        self.resolution = max(1.0, float(resolution))
        self.window = max(self.resolution * CLIMB_SEGMENTS, float(window))
        self.points: deque[tuple[float, float]] = deque()
        self._bucket: int | None = None
        self._floor = 0.0
        self._partial = True

    def add(self, t: float, value: float) -> bool:
        """Take one reading; True when it closed a point (at most once per ``resolution``)."""
        bucket = int(t // self.resolution)
        if self._bucket is None or bucket < self._bucket:  # first reading, or the clock went back
            self._bucket, self._floor, self._partial = bucket, value, True
            return False
        if bucket == self._bucket:
            self._floor = min(self._floor, value)
            return False
        partial, self._partial = self._partial, False
        closed = (self._bucket * self.resolution, self._floor)
        self._bucket, self._floor = bucket, value
        if partial:
            return False
        self.points.append(closed)
        while self.points and self.points[0][0] < self.points[-1][0] - self.window:
            self.points.popleft()
        return True

    def full(self) -> bool:
        """Covers the whole window, with at most a quarter of its points missing."""
        if len(self.points) < 2:
            return False
        span = self.points[-1][0] - self.points[0][0]
        enough = len(self.points) >= 0.75 * self.window / self.resolution
        return enough and span >= self.window - self.resolution


@dataclass(frozen=True, slots=True)
class Climb:
    growth: float  # bytes over the span, a one-off jump left out (one allocation makes no leak)
    jump: float  # that one rise of over 1/segments of the climb (0.0: there was none)
    span: float  # seconds
    segment_rises: tuple[float, ...]

    @property
    def per_minute(self) -> float:
        return self.growth / self.span * 60 if self.span > 0 else 0.0


def sustained_climb(
    points: Sequence[tuple[float, float]], *, min_growth: float, segments: int = CLIMB_SEGMENTS
) -> Climb | None:
    """The climb when ``points`` rise throughout their span, else None.

    Throughout: every one of ``segments`` equal stretches of time rises by at least
    ``1 / (2 * segments)`` of the whole climb, so a warm-up that levels off, a plateau and a
    single allocator jump (a rise of more than ``1 / segments`` of the climb is left out of the
    sums) all fail; falls along the way undo at most ``CLIMB_DROP_SHARE`` of it, so a sawtooth
    fails too.
    """
    if len(points) < 2 * segments:
        return None
    t0, t1 = points[0][0], points[-1][0]
    span = t1 - t0
    if span <= 0:
        return None
    diffs = [(b[0], b[1] - a[1]) for a, b in itertools.pairwise(points)]
    big = max(range(len(diffs)), key=lambda i: diffs[i][1])
    jump = diffs[big][1] if diffs[big][1] > (points[-1][1] - points[0][1]) / segments else 0.0
    kept = [(t, 0.0 if i == big and jump else d) for i, (t, d) in enumerate(diffs)]
    growth = sum(d for _, d in kept)
    if growth < min_growth:
        return None
    drops = sum(-d for _, d in kept if d < -LEAK_NOISE)
    if drops > CLIMB_DROP_SHARE * growth:
        return None
    rises = [0.0] * segments
    for t, d in kept:
        rises[min(segments - 1, int((t - t0) / span * segments - 1e-9))] += d
    if min(rises) < growth / (2 * segments):
        return None
    return Climb(growth=growth, jump=jump, span=span, segment_rises=tuple(rises))


class CounterWindow:
    """The increase of a cumulative counter over the last ``window`` seconds.

    Only change points are kept (a healthy board's ECC counters never move), so the memory
    is bounded by the rate, not the sampling interval; past ``COUNTER_POINTS`` the oldest
    are folded into the baseline, which can only under-count. A counter that goes down
    (driver reload) starts over.
    """

    def __init__(self, window: float) -> None:
        self.window = float(window)
        self.changes: deque[tuple[float, float]] = deque()
        self.base: float | None = None  # the value at the window's start (or the oldest known)
        self.last: float | None = None
        self.started: float | None = None

    def add(self, t: float, value: float) -> None:
        if self.last is None or self.started is None or value < self.last:
            self.base, self.last, self.started = value, value, t
            self.changes.clear()
            return
        if value > self.last:
            self.changes.append((t, value))
            self.last = value
        while self.changes and (self.changes[0][0] <= t - self.window or len(self.changes) > COUNTER_POINTS):
            self.base = self.changes.popleft()[1]

    def increase(self, now: float) -> tuple[float, bool, bool]:
        """(increase over the window, window fully observed, rises in both of its halves)."""
        if self.base is None or self.last is None or self.started is None:
            return 0.0, False, False
        half = now - self.window / 2
        early = any(t <= half for t, _ in self.changes)
        late = any(t > half for t, _ in self.changes)
        return self.last - self.base, now - self.window >= self.started, early and late
