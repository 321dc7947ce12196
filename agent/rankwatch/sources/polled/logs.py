"""Each watched rank's logs, every ``logs.poll_interval`` (at once when a read stopped at
``logs.read_bytes_per_turn`` with more waiting, or, with ``logs.watch``, when the folder's
watch saw the file created, moved or closed after a write): one read of each file the rank
follows now.

A read is an ``fstat``, a ``read`` and, at the end of a file, an ``lstat`` of its name (a
rotation), each of which blocks for as long as a dead NFS or Lustre mount does; so do the
first open (with the count of the lines before the end and the history read back for the
replay, ``LogReader.attach``) and the close. So all of them run on the rank's own thread,
never on the loop, and while one given up on has not
returned every period fails at once: one hang is logged once and counted, the rank's lines
wait, and every other rank, /healthz, stall detection and dumps go on. The thread is
named per set of files (``RankContext.log_io``): after torchelastic restarts a rank into
new attempt files they are read at once, even while a read of the old ones is stuck.

The sample hands on no events: its lines wait in each reader's queue (``LogReader.ready``)
and the rank's pipeline takes them on the loop, in slices, after the sample returns. Lines
read by a sample that was given up on are taken with the next ones: never lost.

While nothing is new the sample does not return after one read: under the poller
(``bind``) it reads again every ``logs.poll_interval`` on its thread, for at most
``HOLD_S`` (and a third of its timeout), and returns as soon as a read queued anything
(lines, history, a sign of life), stopped with more waiting, a reader was closed or the
rank's set of logs changed (``renew``), or the poller stops (``stopping``). A followed log
is still read every ``poll_interval``; an idle rank costs the loop one wake-up per hold
instead of one per period (four a second by default), and a thread that sleeps in between.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from rankwatch import offloop
from rankwatch.sources.follower import LogReader
from rankwatch.sources.polled import RankContext, register_source

LOG_HINT = "a hung filesystem under the log (NFS, Lustre)?"
# Longest one idle sample reads on its thread before it returns to the loop: the loop then
# learns that the reads still return (a hang is judged from the sample's start, so a read that
# hangs during a hold is given up on within its timeout, never later).
HOLD_S = 5.0


@register_source
class LogSource:
    name: ClassVar[str] = "logs"
    scope: ClassVar[str] = "rank"
    when_stuck: ClassVar[str] = "fail"
    hint: ClassVar[str] = LOG_HINT

    def __init__(self, ctx: RankContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.clock = clock
        self._wake: Callable[[], None] | None = None
        self._news = threading.Event()  # a watch event, new inputs or the stop: a hold ends
        self._paced = False  # under the poller (``bind``) and not stopping: idle samples hold
        self._sets = 0  # sets of logs the rank has followed (``renew``), read with the inputs

    @classmethod
    def create(cls, ctx: RankContext) -> LogSource:
        return cls(ctx)

    @property
    def interval(self) -> float:
        return float(self.ctx.cfg.logs.poll_interval)

    @property
    def timeout(self) -> float:
        return offloop.FS_TIMEOUT_S  # a healthy disk answers in milliseconds, a dead mount never

    @property
    def thread(self) -> str:
        return self.ctx.log_io()

    def bind(self, wake: Callable[[], None]) -> None:
        news = self._news

        def both() -> None:
            news.set()
            wake()

        self._wake = both
        self._paced = True

    def renew(self) -> None:
        """The rank's set of logs changed (on the loop): a held sample returns, so the next
        one reads the new set."""
        self._sets += 1
        self._news.set()

    def stopping(self) -> None:
        """The poller stops (any thread): no sample holds from now on."""
        self._paced = False
        self._news.set()

    def inputs(self) -> Any:
        return self._sets, tuple(self.ctx.logs())

    def _hold(self) -> float:
        return min(HOLD_S, self.timeout / 3) if self._paced else 0.0

    def sample(self, inputs: tuple[int, Sequence[LogReader]]) -> list[Any]:
        sets, readers = inputs
        until = self.clock() + self._hold()
        while True:
            behind = False
            for r in readers:
                behind = r.fill(self._wake) or behind
            if behind and self._wake is not None:
                self._wake()  # a reader far behind reads on at once
            if behind or not self._paced or self._sets != sets or any(r.pending() for r in readers):
                return []
            left = until - self.clock()
            if left <= 0:
                return []
            if self._news.wait(min(self.interval, left)):
                self._news.clear()
                until = 0.0  # one more read (a watch event: what it told of), then back
