"""Typed events that flow from sources to detectors, and the findings detectors emit.

These are plain data: every layer may import this module, and nothing here does I/O.
Fields a log does not carry stay ``None`` so detectors can tell "absent" from "zero".
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal


def median(values: Iterable[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count), as
    ``statistics.median`` gives it: that module loads ``decimal`` and ``fractions`` (~0.3 MB
    in every agent) for this one function. Raises ValueError on no values."""
    xs = sorted(values)
    n = len(xs)
    if not n:
        raise ValueError("median of no values")
    mid = n // 2
    return xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2


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
    # The file ``line`` counts in (the live reader's stream): a rank may be read from several
    # (torchrun's --redirects: stdout and stderr apart), and line numbers order one file only.
    source: str | None = None


@dataclass(slots=True)
class EvalRecord:
    """An evaluation/validation result."""

    eval_loss: float | None = None
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    rank: int | None = None
    line: int | None = None
    time: float | None = None
    source: str | None = None


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
    source: str | None = None
    # A finding made of it went out (the live reader sets it): the process's death it caused
    # is then told by that finding, not by a second one.
    reported: bool = False


@dataclass(slots=True)
class OverflowRecord:
    """fp16 loss-scaler overflow: the step was skipped and the scale lowered."""

    new_scale: float | None = None
    old_scale: float | None = None
    step: int | None = None
    rank: int | None = None
    line: int | None = None
    time: float | None = None
    source: str | None = None


Record = StepRecord | EvalRecord | ErrorRecord | OverflowRecord

DumpState = Literal["captured", "failed", "off", "unavailable", "error"]
_DUMP_STATES = ("captured", "failed", "off", "unavailable", "error")


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# What a diagnosis read back from a peer's file, the spool or an incident may hold: another
# user can write those, so every text and list is bounded on the way in.
MAX_RANKS = 65536
MAX_TEXT = 4096


def _ints(v: Any) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)):
        return ()
    return tuple(x for x in v[:MAX_RANKS] if _int_or_none(x) is not None)


def _text(v: Any, limit: int = MAX_TEXT) -> str | None:
    return v[:limit] if isinstance(v, str) else None


@dataclass(frozen=True)
class DumpOutcome:
    """What a stack capture did, as data: the agent takes the stacks, the alert dispatcher links
    them, the console and JSONL print the finding. None of them parses another's prose.

    ``captured``: the ranks whose stacks are in ``folder``, as their findings name them
    (``None`` for a watcher of no known rank). ``failed``: rank (as its dump file is named) ->
    why its stack is missing, in the order tried. ``problem``: why dumps cannot work here, known
    before or after trying (py-spy missing, ptrace refused, the folder full)."""

    state: DumpState
    folder: str | None = None
    captured: tuple[int | None, ...] = ()
    failed: Mapping[int, str] = field(default_factory=dict)
    problem: str | None = None

    @classmethod
    def of_capture(
        cls,
        folder: str | None,
        captured: tuple[int | None, ...],
        failed: Mapping[int, str],
        problem: str | None,
    ) -> DumpOutcome:
        ok = folder is not None and bool(captured)
        return cls(
            "captured" if ok else "failed",
            folder,
            captured if ok else (),
            dict(failed),
            None if ok else problem,
        )

    @property
    def link(self) -> str | None:
        """The incident folder to point a human at; None when it holds no stack."""
        return self.folder if self.state == "captured" else None

    def text(self) -> str:
        """The sentence the stall finding ends with."""
        failures = "; ".join(f"rank {r}: {why}" for r, why in self.failed.items())
        if self.state == "captured":
            more = f" Failed for {failures}." if failures else ""
            return f"Stacks captured in {self.folder} (`rankwatch dumps show`).{more}"
        if self.state == "off":
            return "Stack dumps are off (dumps.on_stall: false): no stacks were captured."
        if self.state == "unavailable":
            return f"Stack dumps will fail: {self.problem}" if self.problem else ""
        if self.state == "error":
            return "Stack capture failed inside the agent."
        if failures:
            text = f"Stack dumps failed, no stacks were captured: {failures}."
        else:
            text = "No stacks were captured (no watched process to dump)."
        if self.problem is not None and self.problem not in text:
            text += f" {self.problem}"
        return text

    def to_json(self) -> dict[str, Any]:
        """JSON: rank keys as strings."""
        doc: dict[str, Any] = {
            "state": self.state,
            "folder": self.folder,
            "captured": list(self.captured),
            "failed": {str(r): why for r, why in self.failed.items()},
        }
        if self.problem is not None:
            doc["problem"] = self.problem
        return doc

    @classmethod
    def from_json(cls, d: Any) -> DumpOutcome | None:
        if not isinstance(d, Mapping) or d.get("state") not in _DUMP_STATES:
            return None
        folder = d.get("folder")
        failed = d.get("failed")
        problem = d.get("problem")
        captured = d.get("captured")
        return cls(
            d["state"],
            _text(folder),
            tuple(_int_or_none(x) for x in captured[:MAX_RANKS]) if isinstance(captured, list) else (),
            {
                int(k): str(v)[:MAX_TEXT]
                for k, v in list(failed.items())[:MAX_RANKS]
                if str(k).isdigit() and len(str(k)) < 10
            }
            if isinstance(failed, Mapping)
            else {},
            _text(problem),
        )


@dataclass(frozen=True)
class FirstFailure:
    """The earliest failure of a rank in an incident: the one the others' failures follow."""

    rank: int | None
    kind: str
    time: float | None = None
    how: str = ""
    log: str | None = None
    node: str | None = None

    @classmethod
    def from_json(cls, d: Any) -> FirstFailure | None:
        if not isinstance(d, Mapping):
            return None
        t = d.get("time")
        how, log, node = d.get("how"), d.get("log"), d.get("node")
        kind = d.get("kind")
        return cls(
            _int_or_none(d.get("rank")),
            kind[:64] if isinstance(kind, str) and kind else "crash",
            float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None,
            _text(how, 300) or "",
            _text(log, 1000),
            _text(node, 255),
        )


@dataclass(frozen=True)
class Diagnosis:
    """What the cross-rank judgement found, as data that every face reads the same way: the
    alert's title and payload, the status page, the JSONL line and `dumps diff`.

    ``suspects``: the ranks the others wait for (or that failed first). ``verdict``: the dump
    diff's verdict (or ``first_failure``). ``incident``: the stacks' folder. ``dumps``: what the
    capture did. ``world_size`` and ``missing`` (ranks of the world with no stack): what the
    judgement knew of the world, so a reader of the incident blames the same rank."""

    suspects: tuple[int, ...] = ()
    verdict: str | None = None
    first_failure: FirstFailure | None = None
    incident: str | None = None
    dumps: DumpOutcome | None = None
    world_size: int | None = None
    missing: tuple[int, ...] = ()
    # The processes the others wait for, by pid, where their ranks are unknown to the agent (a
    # launcher's workers whose rank was set inside them): named, never given a rank.
    suspect_pids: tuple[int, ...] = ()

    @property
    def suspect(self) -> int | None:
        """The one rank to point a human at, when there is one."""
        if len(self.suspects) == 1:
            return self.suspects[0]
        if self.verdict == "same_failure":  # the first of ranks failing alike is no suspect
            return None
        if not self.suspects and self.first_failure is not None:
            return self.first_failure.rank
        return None

    @property
    def dump_link(self) -> str | None:
        """The stacks to point to: a captured outcome's folder, else the diagnosed incident."""
        if self.dumps is not None:
            return self.dumps.link
        return self.incident

    def but(self, **changes: Any) -> Diagnosis:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        ff = self.first_failure
        return {
            "suspects": list(self.suspects),
            "suspect": self.suspect,
            "verdict": self.verdict,
            "first_failure": asdict(ff) if ff is not None else None,
            "incident": self.incident,
            "dumps": self.dumps.to_json() if self.dumps is not None else None,
            "world_size": self.world_size,
            "missing": list(self.missing),
            "suspect_pids": list(self.suspect_pids),
        }

    @classmethod
    def from_json(cls, d: Any) -> Diagnosis | None:
        """Tolerant of what a spool or a peer's board file holds: bad fields are dropped."""
        if not isinstance(d, Mapping):
            return None
        verdict, incident = d.get("verdict"), d.get("incident")
        return cls(
            _ints(d.get("suspects")),
            _text(verdict, 64),
            FirstFailure.from_json(d.get("first_failure")),
            _text(incident),
            DumpOutcome.from_json(d.get("dumps")),
            _int_or_none(d.get("world_size")),
            _ints(d.get("missing")),
            _ints(d.get("suspect_pids")),
        )


# Findings after which the run's weights are not trusted: checkpoints saved at or after one
# are suspect, and its alert names the last good checkpoint from before it.
POISON_KINDS = frozenset({"nan_loss", "loss_divergence", "grad_explosion"})


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
    # The cross-rank judgement (suspect, first failure, stacks), typed: see Diagnosis.
    diagnosis: Diagnosis | None = None
    # The job the rank belongs to (the watched process's own run): a node daemon watches many.
    run: str | None = None
    # That job's world size, from the watched process's own environment (WORLD_SIZE, ...).
    world_size: int | None = None
    # Whose process it is (a node daemon watches many users' jobs): every face shows it.
    user: str | None = None

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
        d["diagnosis"] = self.diagnosis.to_json() if self.diagnosis is not None else None
        return d

    def diagnosed(self, **changes: Any) -> Diagnosis:
        """Set (part of) the finding's diagnosis and return it."""
        self.diagnosis = (self.diagnosis or Diagnosis()).but(**changes)
        return self.diagnosis
