"""Step time from a tqdm bar's elapsed clock rather than its smoothed rate.

tqdm's ``it/s`` is an exponential moving average: after an evaluation pause it is
dominated by the pause and needs about nine updates to recover, which reads as a
throughput drop after every evaluation. The ``[mm:ss<...`` elapsed clock is exact but
whole seconds only, so the time per step is taken over a window of at least
``MIN_SPAN_S`` (error under 1 s / MIN_SPAN_S) between two bar updates, and the window
restarts after a pause, so that time spent outside training steps is never spread over
them.
"""

from __future__ import annotations

import re
from collections import deque

from ._common import rate_to_step_time

# ``00:21<01:48, ...``, ``1:02:03<...`` or, without a total, ``00:21, 3.61it/s``.
_ELAPSED = re.compile(r"\s*(?:(\d{1,6}):)?(\d{1,2}):(\d\d)(?=[<,\]]|$)")
MIN_SPAN_S = 10


def elapsed_s(info: str) -> int | None:
    """Whole seconds of tqdm's elapsed field, the first thing inside the brackets."""
    m = _ELAPSED.match(info)
    if m is None:
        return None
    h = int(m.group(1)) if m.group(1) else 0
    return h * 3600 + int(m.group(2)) * 60 + int(m.group(3))


class BarClock:
    """One bar's position and the time per step over its latest window of updates."""

    __slots__ = ("_points", "n", "step_time")

    def __init__(self) -> None:
        self.n = 0
        self.step_time: float | None = None
        # (n, elapsed) of the first update seen in each whole second of the window.
        self._points: deque[tuple[int, int]] = deque()

    def update(self, n: int, info: str) -> None:
        e = elapsed_s(info)
        if e is None:
            # A custom bar format without the clock: the smoothed rate beats nothing.
            st = rate_to_step_time(info)
            if st is not None:
                self.step_time = st
            self.n = n
            return
        pts = self._points
        if pts and (e < pts[-1][1] or n < pts[-1][0]):
            pts.clear()  # a new bar with the same total (a second train() call)
        if not pts or e > pts[-1][1]:
            pts.append((n, e))
        while len(pts) > 1 and e - pts[1][1] >= MIN_SPAN_S:
            pts.popleft()
        n0, e0 = pts[0]
        if e - e0 >= MIN_SPAN_S and n > n0:
            self.step_time = (e - e0) / (n - n0)
        self.n = n

    def pause(self) -> None:
        """Time passes outside training steps (an evaluation): start a new window.

        The last figure stays until the new window is long enough: the steps after an
        evaluation run as fast as those before it far more often than not, and a gap
        would make a consumer fall back to timing the records, evaluation included.
        """
        self._points.clear()
