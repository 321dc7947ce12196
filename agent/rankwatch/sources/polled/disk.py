"""Free space of the filesystems holding the agent's folders (the rank's logs, the dumps
folder, the alert spool), one ``DiskSample`` per filesystem, for ``detectors.disk``.

``statvfs`` on a hung network mount never returns: that is why it is a polled source (a
daemon thread with a timeout), never a call on the event loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar

from rankwatch.events import DiskSample, Event
from rankwatch.sources.polled import SourceContext, register_source

TIMEOUT_S = 10.0


def _existing(path: Path) -> Path:
    """The folder itself, or its nearest existing parent (the dumps folder is made on first use)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def disk_samples(folders: Mapping[str, str], clock: Callable[[], float] = time.monotonic) -> list[DiskSample]:
    """Free space of each filesystem holding one of ``folders`` ({path: role}); blocking."""
    by_dev: dict[int, DiskSample] = {}
    for path, role in folders.items():
        p = _existing(Path(path).absolute())
        try:
            dev = os.stat(p).st_dev
            if dev in by_dev:
                by_dev[dev].roles[path] = role
                continue
            v = os.statvfs(p)
        except OSError:
            continue
        by_dev[dev] = DiskSample(
            {path: role}, v.f_bavail * v.f_frsize, v.f_blocks * v.f_frsize, clock(), device=dev
        )
    wall = time.time()
    for s in by_dev.values():
        s.wall = wall
    return list(by_dev.values())


@register_source
class DiskSource:
    name: ClassVar[str] = "disk"

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx

    @classmethod
    def create(cls, ctx: SourceContext) -> DiskSource:
        return cls(ctx)

    @property
    def interval(self) -> float:
        # Ten process samples apart, within [1 s, 30 s]: a filling disk takes minutes.
        return min(30.0, max(1.0, 10 * float(self.ctx.cfg.process.sample_interval)))

    @property
    def timeout(self) -> float:
        return TIMEOUT_S

    def inputs(self) -> dict[str, str]:
        return dict(self.ctx.folders())

    def sample(self, inputs: dict[str, str]) -> list[Event]:
        return list(disk_samples(inputs))
