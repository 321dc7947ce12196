"""Findings to a terminal (stderr) and to a JSON-lines file for other tools."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from rankwatch.identity import Identity
from rankwatch.records import Finding, Severity
from rankwatch.sanitize import visible

_COLOURS = {Severity.CRITICAL: "\x1b[1;31m", Severity.WARNING: "\x1b[33m", Severity.INFO: "\x1b[36m"}


class ConsoleSink:
    def __init__(
        self, identity: Identity, stream: TextIO | None = None, min_severity: Severity = Severity.INFO
    ):
        self.identity = identity
        self.stream = stream or sys.stderr
        self.min_severity = min_severity
        # https://no-color.org: any non-empty NO_COLOR turns colour off.
        self.colour = self.stream.isatty() and not os.environ.get("NO_COLOR")

    def send(self, f: Finding) -> None:
        if f.severity < self.min_severity:
            return
        sev = "RESOLVED" if f.resolved else f.severity.label.upper()
        if self.colour and not f.resolved:
            sev = f"{_COLOURS[f.severity]}{sev}\x1b[0m"
        step = f" step {f.step}" if f.step is not None else ""
        rank = f.rank if f.rank is not None else self.identity.rank
        run = f.run or self.identity.run
        # One line per finding; log text in it is shown, never obeyed (rankwatch.sanitize).
        text = visible(_where(run, rank)) + f"{sev} " + visible(f"{f.kind}{step}: {f.message}")
        try:
            self.stream.write(f"rankwatch: {text}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass


def _where(run: str, rank: int | None) -> str:
    """``[run=R rank=N] `` with only what is known: an unnamed run on an unranked process (a
    plain ``rankwatch run -- python train.py``) is not worth ``[run=default rank=None]``."""
    parts = ([f"run={run}"] if run and run != "default" else []) + (
        [f"rank={rank}"] if rank is not None else []
    )
    return f"[{' '.join(parts)}] " if parts else ""


class JsonlSink:
    """One JSON object per finding, appended and flushed, so a crash of the agent loses nothing written."""

    def __init__(self, path: str | Path, identity: Identity) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.identity = identity

    def send(self, f: Finding) -> None:
        doc = {
            **f.to_json(),
            "resolved": f.resolved,
            "time": f.time,
            "run": f.run or self.identity.run,
            "world_size": f.world_size if f.world_size is not None else self.identity.world_size,
            "user": f.user or self.identity.user,
            "node": self.identity.node,
            "evidence": f.evidence,
            "diagnosis": f.diagnosis.to_json() if f.diagnosis is not None else None,
        }
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(_strict(doc), allow_nan=False) + "\n")


def _strict(obj: Any) -> Any:
    """JSON has no NaN: a non-finite number is written as ``"NaN"``, ``"Infinity"`` or
    ``"-Infinity"`` (as ``/api/findings`` does), so a NaN loss still reads as one and every
    line parses with a strict reader (jq, JSON.parse, Go)."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {str(k): _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_strict(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)
