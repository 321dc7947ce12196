"""The checkpoint folder's activity, every second, for every watched rank's stall rule: a save
in progress (and when its files last changed) or one just finished is progress, and the save
cadence tells when the next one is due (the job's time-limit rule).

The checkpoint watcher scans the folder off the loop (``checkpoint_scan``); this reads what
it found (on the loop: ``inputs``), so the sample itself blocks on nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rankwatch.events import CheckpointStatus, Event
from rankwatch.sources.polled import EveryRank, SourceContext, register_source
from rankwatch.sources.polled.checkpoint_scan import checkpoint_watcher

INTERVAL_S = 1.0


@register_source
class CheckpointActivity(EveryRank):
    name: ClassVar[str] = "checkpoints"
    interval = INTERVAL_S

    def __init__(self, read: Callable[[], CheckpointStatus | None]) -> None:
        self.read = read

    @classmethod
    def create(cls, ctx: SourceContext) -> CheckpointActivity | None:
        if ctx.checkpoints is not None:
            return cls(ctx.checkpoints)
        watcher = checkpoint_watcher(ctx)
        return cls(watcher.status) if watcher is not None else None

    def inputs(self) -> CheckpointStatus | None:
        return self.read()

    def sample(self, inputs: CheckpointStatus | None) -> list[Event]:
        return [inputs] if inputs is not None else []
