"""How late the event loop runs: the liveness that ``/healthz`` reports.

An open socket proves little: the kernel accepts connections for a loop that has not run
for a minute. A tick scheduled every ``interval`` on the loop itself measures how late it
ran (its lag); every detection, ``/metrics`` and ``/healthz`` wait as long as it did. The
agent is unhealthy while the largest lag of the last ``window`` seconds is over ``limit``:
long enough for a liveness probe to see it, short enough that one hiccup does not restart
a sidecar.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

TICK_S = 1.0
LAG_LIMIT_S = 5.0
WINDOW_S = 30.0


class LoopMonitor:
    def __init__(
        self,
        *,
        interval: float = TICK_S,
        limit: float = LAG_LIMIT_S,
        window: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.limit = limit
        self.window = window
        self.clock = clock
        self.lag = 0.0  # of the last tick
        self.max_lag = 0.0  # since start
        self.ticks = 0
        self._due: float | None = None
        self._recent: deque[tuple[float, float]] = deque()

    def tick(self, now: float) -> None:
        """One tick ran at ``now``; it was due at ``self._due``."""
        if self._due is not None:
            self.lag = max(0.0, now - self._due)
            self.max_lag = max(self.max_lag, self.lag)
            if self.lag > 0.1 * self.interval:  # only lags worth remembering
                self._recent.append((now, self.lag))
        while self._recent and now - self._recent[0][0] > self.window:
            self._recent.popleft()
        self.ticks += 1
        self._due = now + self.interval

    def recent_lag(self, now: float | None = None) -> float:
        """The largest lag of the last ``window`` seconds, the one running now included."""
        now = self.clock() if now is None else now
        late_now = max(0.0, now - self._due) if self._due is not None else 0.0
        seen = max((lag for t, lag in self._recent if now - t <= self.window), default=0.0)
        return max(seen, late_now)

    def health(self, now: float | None = None) -> tuple[bool, str]:
        lag = self.recent_lag(now)
        if lag <= self.limit:
            return True, "ok"
        return False, (
            f"event loop lagging: a {self.interval:g}s tick ran {lag:.1f}s late within the last "
            f"{self.window:g}s (limit {self.limit:g}s); detection, /metrics and alerts are that late"
        )

    async def run(self, stop: asyncio.Event) -> None:
        self.tick(self.clock())
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
            self.tick(self.clock())
