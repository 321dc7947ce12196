"""A timer for the rules judged on time alone: every watched rank asks, twice a minute, whether
its run will end after the job's time limit with no checkpoint due before it. On only when
the scheduler set a limit (Slurm's end time)."""

from __future__ import annotations

import time
from typing import ClassVar

from rankwatch.events import Event, Tick
from rankwatch.sources.polled import EveryRank, SourceContext, register_source

INTERVAL_S = 30.0


@register_source
class JobClock(EveryRank):
    name: ClassVar[str] = "deadline"
    interval = INTERVAL_S

    @classmethod
    def create(cls, ctx: SourceContext) -> JobClock | None:
        return cls() if ctx.job_end is not None else None

    def inputs(self) -> float:
        return time.time()

    def sample(self, inputs: float) -> list[Event]:
        return [Tick(0.0, inputs)]  # ``now``: each rank's own clock, set as it is handed over
