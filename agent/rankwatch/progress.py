"""A progress line for ``rankwatch analyze`` on a terminal.

A gigabyte of logs takes tens of seconds; without a sign of life that reads as a hang. The
line counts the bytes read so far by this process and its children (worker processes, the
second reading process of a big file) from the kernel's per-process I/O counters, so it needs
no hook in the parsing loop and costs it nothing. It goes to stderr, only when stderr is a
terminal, and is erased when the analysis ends.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

DELAY = 0.5  # no flicker for a quick run
INTERVAL = 0.25


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def render(done: int, total: int, elapsed: float) -> str:
    """``analyze: 412.0 MiB of 1.0 GiB (40%), 12 s``; never 100% before the end."""
    done = max(0, min(done, total))
    pct = min(99, int(100 * done / total)) if total else 0
    return f"analyze: {_size(done)} of {_size(total)} ({pct}%), {elapsed:.0f} s"


class _ReadCounter:
    """Bytes read (``rchar``) by this process and its descendants since it was made; a child
    that has exited keeps the last count seen."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self._base = self._chars(self._me)
        self._seen: dict[int, int] = {}

    @staticmethod
    def _chars(p: object) -> int:
        try:
            return int(p.io_counters().read_chars)  # type: ignore[attr-defined]
        except Exception:
            return 0

    def __call__(self) -> int:
        try:
            children = self._me.children(recursive=True)
        except Exception:
            children = []
        for c in children:
            n = self._chars(c)
            if n:
                self._seen[c.pid] = max(n, self._seen.get(c.pid, 0))
        return self._chars(self._me) - self._base + sum(self._seen.values())


class Progress:
    """Context manager drawing :func:`render` every ``interval`` after ``delay``."""

    def __init__(
        self,
        paths: Sequence[str],
        stream: TextIO,
        *,
        read_bytes: Callable[[], int] | None = None,
        delay: float = DELAY,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        total = 0
        for p in paths:
            try:
                total += os.path.getsize(p)
            except OSError:
                pass
        self.total = total
        self.stream = stream
        self.read_bytes = read_bytes or _ReadCounter()
        self.delay = delay
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self.drawn = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="analyze-progress", daemon=True)

    def frame(self) -> None:
        line = render(self.read_bytes(), self.total, self.clock() - self.started)
        try:
            self.stream.write(f"\r\x1b[K{line}")
            self.stream.flush()
            self.drawn = True
        except (OSError, ValueError):
            self._stop.set()

    def _run(self) -> None:
        if self._stop.wait(self.delay):
            return
        while not self._stop.is_set():
            self.frame()
            self._stop.wait(self.interval)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if self.drawn:
            try:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            except (OSError, ValueError):
                pass
