"""Each watched rank's process, every ``process.sample_interval``: one ``ProcessSample``
(alive or not, CPU, RSS, state, threads, the exit status of our own child) for that rank's
engine, from the prober the rank's pipeline attached last (a restart attaches a new one;
after the exit, or before the first attach, nothing is sampled).

A sample reads /proc of the process tree: milliseconds, unless a process sits in
uninterruptible sleep (D state) or holds its memory map lock, and then a read of its
cmdline, environ or smaps blocks for minutes. So while a sample given up on has not
returned, every period fails at once (no second thread on the stuck process, no period
waiting out the timeout again) and is counted: no sample means no verdict, so stall and
exit are judged from real samples only. The thread is named per process
(``RankContext.io``): a restarted rank's new process is sampled at once.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rankwatch import offloop
from rankwatch.events import Event
from rankwatch.sources.polled import RankContext, register_source

# A sample is given up after five periods, and never before this: a /proc walk of a busy node
# takes a second.
SAMPLE_TIMEOUT_MIN_S = 2.0


@register_source
class ProcessSource:
    name: ClassVar[str] = "process"
    scope: ClassVar[str] = "rank"
    when_stuck: ClassVar[str] = "fail"
    count_hung: ClassVar[str] = "period"
    hint: ClassVar[str] = offloop.PROC_HINT

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx

    @classmethod
    def create(cls, ctx: RankContext) -> ProcessSource:
        return cls(ctx)

    @property
    def interval(self) -> float:
        return float(self.ctx.cfg.process.sample_interval)

    @property
    def timeout(self) -> float:
        return max(SAMPLE_TIMEOUT_MIN_S, self.interval * 5)

    @property
    def thread(self) -> str:
        return self.ctx.io()

    def inputs(self) -> Any:
        return self.ctx.prober()

    def sample(self, prober: Any) -> list[Event]:
        return [] if prober is None else [prober.sample()]
