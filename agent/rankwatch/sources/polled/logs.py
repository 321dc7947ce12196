"""Each watched rank's logs, every ``logs.poll_interval`` (at once when a read stopped at
``logs.read_bytes_per_turn`` with more waiting, or when the folder's watch saw the file
created, moved or closed after a write): one read of each file the rank follows now.

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from rankwatch import offloop
from rankwatch.sources.follower import LogReader
from rankwatch.sources.polled import RankContext, register_source

LOG_HINT = "a hung filesystem under the log (NFS, Lustre)?"


@register_source
class LogSource:
    name: ClassVar[str] = "logs"
    scope: ClassVar[str] = "rank"
    when_stuck: ClassVar[str] = "fail"
    hint: ClassVar[str] = LOG_HINT

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self._wake: Callable[[], None] | None = None

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
        self._wake = wake

    def inputs(self) -> Any:
        return tuple(self.ctx.logs())

    def sample(self, readers: Sequence[LogReader]) -> list[Any]:
        behind = False
        for r in readers:
            behind = r.fill(self._wake) or behind
        if behind and self._wake is not None:
            self._wake()  # a reader far behind reads on at once
        return []
