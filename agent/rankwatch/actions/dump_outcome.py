"""What a stack capture did, as data (:class:`rankwatch.records.DumpOutcome`): a stall finding
carries it in its :class:`~rankwatch.records.Diagnosis` (``dumps``), and every sink links the
stacks through :func:`dump_link`. Its sentence for humans is composed from the outcome once
the outcome is known: a finding never promises stacks that did not come.
"""

from __future__ import annotations

from rankwatch.records import DumpOutcome, DumpState, Finding

__all__ = ["DumpOutcome", "DumpState", "dump_link"]


def dump_link(f: Finding) -> str | None:
    """The stacks a finding points to: its diagnosis's captured folder or incident."""
    return f.diagnosis.dump_link if f.diagnosis is not None else None
