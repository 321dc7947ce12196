"""Shared pieces of the detectors: the interface and robust statistics.

A detector is created once per rank (``create``, from the registry) and sees every event
of the types it ``accepts``: log records after they were added to the rank's state, and
the live agent's process, GPU, disk, checkpoint and timer events. It returns findings of
the ``kinds`` it declares and does no I/O, so the live agent and ``analyze`` run the very
same code.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any, ClassVar, cast

from rankwatch.events import Event, ProcessStart, Progress
from rankwatch.records import ErrorRecord, EvalRecord, Finding, OverflowRecord, Record, Severity, StepRecord
from rankwatch.records import median as _median
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.config.schema import Config


@dataclass(frozen=True, slots=True)
class DetectorContext:
    """What a detector may know of its rank when it is built, besides the configuration."""

    rank: int | None
    path: str | None = None
    started: float = 0.0  # monotonic: when watching this rank began (the startup grace runs from it)
    job_end: float | None = None  # wall: when the scheduler ends the job (Slurm's time limit)


def config_section(cfg: Config, section: str) -> Any:
    """The section named by a dotted path (``"detectors.nan"``, ``"gpu"``)."""
    node: Any = cfg
    for part in section.split("."):
        node = getattr(node, part)
    return node


class Detector(ABC):
    # The finding kinds it emits; the engine counts a finding of another kind as its bug.
    kinds: ClassVar[tuple[str, ...]] = ()
    # The event types observe() can act on; the engine hands it no others.
    accepts: ClassVar[tuple[type, ...]] = (StepRecord, EvalRecord, ErrorRecord, OverflowRecord)
    # The config section it reads (a dotted path into ``Config``), None when it reads none.
    section: ClassVar[str | None] = None

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> Detector | None:
        """A fresh instance for one rank, or None where it has nothing to judge.

        The default suits the log rules: ``cls(section, warmup_steps)``.
        """
        assert cls.section is not None
        det: Detector = cast(Any, cls)(config_section(cfg, cls.section), cfg.detectors.warmup_steps)
        return det

    @abstractmethod
    def observe(self, state: RankState, record: Event) -> list[Finding]:
        """Findings this event brings about (a record is already added to ``state``)."""

    def finish(self, state: RankState) -> list[Finding]:
        """Called once when a finished log is exhausted (analyze) or a rank ends."""
        return []


def median(xs: Sequence[float]) -> float:
    return _median(xs) if xs else math.nan


def mad(xs: Sequence[float]) -> float:
    """Median absolute deviation: a spread that one wild value cannot inflate."""
    if not xs:
        return math.nan
    m = _median(xs)
    return _median([abs(x - m) for x in xs])


def step_noise(xs: Sequence[float]) -> float:
    """Robust standard deviation of a series' noise, from its step-to-step differences.

    Differences cancel a trend (a falling loss curve would inflate a plain MAD), and the
    median absolute deviation ignores the odd outlier; /sqrt(2) undoes the differencing.
    """
    if len(xs) < 3:
        return 0.0
    diffs = [b - a for a, b in pairwise(xs)]
    return 1.4826 * mad(diffs) / math.sqrt(2)


def fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    if not math.isfinite(x):
        return str(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.3g}"
    return f"{x:.4g}"


COUNTED_NOTE = (
    " (Step numbers are counted log records: this log prints none, so the trainer's step is "
    "about logging_steps times this.)"
)
# A counted record that carries a whole epoch: HF's logging_strategy="epoch" logs once per epoch
# (trainer_callback.DefaultFlowCallback.on_epoch_end), so the logging_steps rule is wrong there;
# the epoch is what the log says.
EPOCH_NOTE = (
    " (This log prints no step number: this is its logged record {n}, which says epoch {epoch}; the "
    "trainer's step is the epoch times its steps per epoch.)"
)


def counted_epoch(record: object) -> int | None:
    """The whole epoch a record with a counted step carries (HF's ``'epoch': '2'`` under
    ``logging_strategy="epoch"``), else None. A fractional epoch (``logging_strategy="steps"``,
    ``'epoch': '1.5'``) is None: there the count times ``logging_steps`` is the step."""
    if not isinstance(record, StepRecord) or not record.step_inferred:
        return None
    e = record.epoch
    if e is None or not math.isfinite(e) or e < 1 or e > 1e9 or abs(e - round(e)) > 1e-6 * e:
        return None
    return round(e)


def last_counted_epoch(state: RankState) -> int | None:
    """``counted_epoch`` of the rank's last step record: its "last step" is then only a count."""
    if not state.steps or state.last_step is None or state.steps[-1].step != state.last_step:
        return None
    return counted_epoch(state.steps[-1])


def at_step(record: StepRecord | EvalRecord, step: int | None = None) -> str:
    """Where a record is, in a message: ``step 16``, or ``epoch 2`` for a record whose step is
    only its count in a log that logs whole epochs (``counted_epoch``)."""
    epoch = counted_epoch(record)
    if epoch is not None:
        return f"epoch {epoch}"
    s = record.step if step is None else step
    return f"step {s}" if s is not None else "an unknown step"


def finding(
    kind: str,
    severity: Severity,
    state: RankState,
    message: str,
    *,
    record: Record | None = None,
    step: int | None = None,
    evidence: dict[str, Any] | None = None,
    resolved: bool = False,
    subject: str | None = None,
) -> Finding:
    line = getattr(record, "line", None) if record is not None else None
    if step is None and record is not None:
        step = getattr(record, "step", None)
    t = getattr(record, "time", None) if record is not None else None
    epoch = counted_epoch(record) if step is not None and step == getattr(record, "step", None) else None
    if epoch is not None:
        # The record count is no step of the trainer's, and none is known: the finding has no
        # step (a wrong one would mislead the alert, the checkpoints judged bad, the reader).
        if not resolved:
            message += EPOCH_NOTE.format(n=step, epoch=epoch)
        evidence = {**(evidence or {}), "step_counted": True, "epoch": epoch, "logged_record": step}
        step = None
    elif step is not None and getattr(record, "step_inferred", False) and not resolved:
        # HF prints no step number without its progress bar: the N-th logged record is "step N".
        message += COUNTED_NOTE
        evidence = {**(evidence or {}), "step_counted": True}
    return Finding(
        kind=kind,
        severity=severity,
        rank=state.rank,
        message=message,
        step=step,
        line=line,
        path=state.path,
        time=t,
        evidence=evidence or {},
        resolved=resolved,
        subject=subject,
    )


class Episode:
    """Open/closed bookkeeping so a lasting condition fires once and resolves once."""

    __slots__ = ("active", "since_step")

    def __init__(self) -> None:
        self.active = False
        self.since_step: int | None = None

    def open(self, step: int | None) -> bool:
        if self.active:
            return False
        self.active = True
        self.since_step = step
        return True

    def close(self) -> bool:
        if not self.active:
            return False
        self.active = False
        return True


class RunStep:
    """The step the run reached, for a rank that prints none of its own (a launcher's worker
    whose step lines reach the run's pipeline only), to place its error or its end. A restarted
    process (a new pid) has reached none of it yet: its failure at start-up is not "after step N"
    of the attempt before."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.pid: int | None = None

    def observe(self, record: Event) -> bool:
        """True when ``record`` was one of this tracker's (a Progress or a ProcessStart)."""
        if isinstance(record, Progress):
            self.step = record.step
            return True
        if isinstance(record, ProcessStart):
            if self.pid is not None and record.pid != self.pid:
                self.step = None
            self.pid = record.pid
            return True
        return False
