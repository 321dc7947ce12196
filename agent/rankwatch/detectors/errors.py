"""Turns recognised error signatures into findings with the usual fix attached (the fixes are
rows of ``rankwatch.errorkinds``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankwatch.detectors.base import Detector, DetectorContext, RunStep, finding, last_counted_epoch
from rankwatch.detectors.registry import register
from rankwatch.errorkinds import FIXES, INTERRUPTED
from rankwatch.events import Event, ProcessStart, Progress
from rankwatch.records import ErrorRecord, Finding
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.config.schema import Config

MAX_PER_KIND = 20


@register
class ErrorSignatureDetector(Detector):
    """One finding per distinct error; a flood of identical NCCL WARN lines becomes one."""

    kinds = tuple(FIXES)
    # Progress: the step the run reached where the rank prints none of its own (a launcher's
    # worker whose step lines reach the run's pipeline only), to place its error; a restart
    # (ProcessStart of a new pid) has reached none of it yet.
    accepts = (ErrorRecord, Progress, ProcessStart)
    section = None  # every signature is reported; the catalogue decides what is one

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> ErrorSignatureDetector:
        return cls()

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()
        self.per_kind: dict[str, int] = {}
        self.run = RunStep()

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if self.run.observe(record):
            return []
        if not isinstance(record, ErrorRecord):
            return []
        key = (record.kind, record.summary[:200])
        if key in self.seen or self.per_kind.get(record.kind, 0) >= MAX_PER_KIND:
            return []
        self.seen.add(key)
        self.per_kind[record.kind] = self.per_kind.get(record.kind, 0) + 1
        fix = INTERRUPTED if record.details.get("interrupted") else FIXES.get(record.kind, "")
        # An error that names its own step (detectron2's "at iteration=2137") is placed there.
        said = record.details.get("step")
        last = state.last_step if state.last_step is not None else self.run.step
        step = said if isinstance(said, int) else last
        where = f" (last step {last})" if last is not None and step != said else ""
        epoch = last_counted_epoch(state) if last is not None and step != said else None
        if epoch is not None:  # a count of epoch records is no step (base.counted_epoch)
            where, step = f" (last logged epoch {epoch})", None
        msg = f"{record.summary}{where}. {fix}".strip()
        ev = {"lines": record.evidence, **record.details}
        f = finding(record.kind, record.severity, state, msg, record=record, step=step, evidence=ev)
        if record.source:
            f.path = record.source  # the file its line number counts in
        return [f]


# Order of findings of one log record across modules (registry.py): an error line first.
ORDER = 10
