"""Shared pieces of the detectors: the interface and robust statistics.

A detector is created once per rank and sees every record of that rank after it was
added to the rank's state. It returns findings and does no I/O, so the live agent and
``analyze`` run the very same code.
"""

from __future__ import annotations

import math
import statistics
from abc import ABC, abstractmethod
from collections.abc import Sequence
from itertools import pairwise
from typing import Any, ClassVar

from rankwatch.records import ErrorRecord, EvalRecord, Finding, OverflowRecord, Record, Severity, StepRecord
from rankwatch.state import RankState


class Detector(ABC):
    kinds: ClassVar[tuple[str, ...]] = ()
    # The record types observe() can act on; the engine hands it no others.
    accepts: ClassVar[tuple[type, ...]] = (StepRecord, EvalRecord, ErrorRecord, OverflowRecord)

    @abstractmethod
    def observe(self, state: RankState, record: Record) -> list[Finding]:
        """Findings this record (already added to ``state``) brings about."""

    def finish(self, state: RankState) -> list[Finding]:
        """Called once when a finished log is exhausted (analyze) or a rank ends."""
        return []


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def mad(xs: Sequence[float]) -> float:
    """Median absolute deviation: a spread that one wild value cannot inflate."""
    if not xs:
        return math.nan
    m = statistics.median(xs)
    return statistics.median([abs(x - m) for x in xs])


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
    if step is not None and getattr(record, "step_inferred", False) and not resolved:
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
