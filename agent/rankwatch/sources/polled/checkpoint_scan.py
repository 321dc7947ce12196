"""Scans of the checkpoint folder (``checkpoints.dir``): what the checkpoint watcher finds
wrong or cleared, each scan's free space and newest good save, and the trainer's own
``log_history`` from HF checkpoints, to the agent's rank.

A scan stats, hashes and verifies files, so it runs off the loop like every polled
source's sample; filesystem events wake it early (``bind``), and the poll is the safety net
where they are silent (NFS, Lustre). The watcher itself is shared through ``ctx.shared``:
the checkpoint activity source reads its state every second, and the agent its last good
checkpoint. Its modules load only when a folder is watched.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rankwatch.events import Event
from rankwatch.sources.polled import SourceContext, register_source

if TYPE_CHECKING:
    from rankwatch.checkpoints.watcher import CheckpointWatcher

SHARED_KEY = "checkpoints"


def checkpoint_watcher(ctx: SourceContext) -> CheckpointWatcher | None:
    """The agent's checkpoint watcher (made on first ask), or None when no folder is watched."""
    c = ctx.cfg.checkpoints
    if not c.dir:
        return None
    watcher: CheckpointWatcher | None = ctx.shared.get(SHARED_KEY)
    if watcher is None:
        from rankwatch.checkpoints.watcher import CheckpointWatcher

        watcher = ctx.shared[SHARED_KEY] = CheckpointWatcher(Path(c.dir), c)
    return watcher


@register_source
class CheckpointScanSource:
    """The agent's checkpoint watcher under the policy of every polled source."""

    name: ClassVar[str] = "checkpoint_scan"

    def __init__(self, watcher: CheckpointWatcher) -> None:
        self.watcher = watcher

    @classmethod
    def create(cls, ctx: SourceContext) -> CheckpointScanSource | None:
        watcher = checkpoint_watcher(ctx)
        return cls(watcher) if watcher is not None else None

    @property
    def interval(self) -> float:
        return self.watcher.interval()

    @property
    def timeout(self) -> float:
        from rankwatch.checkpoints.watcher import SCAN_TIMEOUT_S

        return SCAN_TIMEOUT_S

    @property
    def min_gap(self) -> float:
        return self.watcher.min_gap()

    def bind(self, wake: Callable[[], None]) -> None:
        self.watcher.bind(wake)

    def inputs(self) -> Any:
        return None

    def sample(self, inputs: Any) -> list[Event]:
        return self.watcher.sample()

    def close(self) -> None:
        self.watcher.close()
