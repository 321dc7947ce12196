"""Typed events that flow from sources to detectors, and the findings detectors emit.

These are plain data: every layer may import this module, and nothing here does I/O.
Fields a log does not carry stay ``None`` so detectors can tell "absent" from "zero".
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    CRITICAL = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.strip().upper()]


@dataclass(slots=True)
class StepRecord:
    """One training step (or logging interval) as a framework printed it."""

    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    grad_norm: float | None = None
    learning_rate: float | None = None
    loss_scale: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    step_time_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None  # ratio 0..1, never percent
    memory_bytes: float | None = None
    max_memory_bytes: float | None = None
    epoch: float | None = None
    skipped_iters: int | None = None
    nan_iters: int | None = None
    # Set by parsers that cannot see a step number (HF dicts): the step was inferred.
    step_inferred: bool = False
    rank: int | None = None
    line: int | None = None
    time: float | None = None  # seconds since epoch, from a log timestamp or the clock


@dataclass(slots=True)
class EvalRecord:
    """An evaluation/validation result."""

    eval_loss: float | None = None
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    rank: int | None = None
    line: int | None = None
    time: float | None = None


@dataclass(slots=True)
class ErrorRecord:
    """A recognised error signature (OOM, NCCL timeout, traceback...).

    ``kind`` uses the finding vocabulary of DESIGN.md (``oom``, ``nccl_timeout``,
    ``nccl_error``, ``cuda_error``, ``xid``, ``crash``) so detectors can pass it on.
    ``evidence`` keeps the raw lines (the whole traceback for ``crash``).
    """

    kind: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    severity: Severity = Severity.CRITICAL
    details: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    line: int | None = None
    time: float | None = None


@dataclass(slots=True)
class OverflowRecord:
    """fp16 loss-scaler overflow: the step was skipped and the scale lowered."""

    new_scale: float | None = None
    old_scale: float | None = None
    step: int | None = None
    rank: int | None = None
    line: int | None = None
    time: float | None = None


Record = StepRecord | EvalRecord | ErrorRecord | OverflowRecord


@dataclass(slots=True)
class Finding:
    """Something a human should know about one rank.

    ``key`` groups repeated observations of the same condition so an action layer
    can dedup and resolve; ``resolved`` marks the end of such a condition. ``subject``
    names the thing within the rank the condition is about (a GPU's UUID, a checkpoint,
    a peer rank), so two GPUs of one rank overheating are two conditions, and the first
    to cool resolves only its own.
    """

    kind: str
    severity: Severity
    rank: int | None
    message: str
    step: int | None = None
    line: int | None = None
    path: str | None = None
    time: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    resolved: bool = False
    subject: str | None = None

    @property
    def key(self) -> tuple[str, int | None, str | None]:
        return (self.kind, self.rank, self.subject)

    def to_json(self) -> dict[str, Any]:
        """The `analyze --json` contract of DESIGN.md: exactly these keys."""
        return {
            "kind": self.kind,
            "severity": self.severity.label,
            "rank": self.rank,
            "path": self.path,
            "step": self.step,
            "line": self.line,
            "message": self.message,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.label
        return d
