"""What a stack capture did, as data: the agent takes the stacks, the alert dispatcher links
them, the console and JSONL print the finding. None of them parses another's prose.

A stall finding carries it as ``evidence["dumps"]`` (``to_evidence``) and, when stacks came,
``evidence["dump_path"]`` (the incident folder: the link every sink shows). Its sentence for
humans is composed here, from the outcome, once the outcome is known: a finding never
promises stacks that did not come.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

DumpState = Literal["captured", "failed", "off", "unavailable", "error"]


@dataclass(frozen=True)
class DumpOutcome:
    """``captured``: the ranks whose stacks are in ``folder``, as their findings name them
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

    def to_evidence(self) -> dict[str, Any]:
        """The finding's evidence entries (JSON: rank keys as strings)."""
        doc: dict[str, Any] = {
            "state": self.state,
            "folder": self.folder,
            "captured": list(self.captured),
            "failed": {str(r): why for r, why in self.failed.items()},
        }
        if self.problem is not None:
            doc["problem"] = self.problem
        out: dict[str, Any] = {"dumps": doc}
        if self.link is not None:
            out["dump_path"] = self.link
        return out


def dump_link(evidence: Mapping[str, Any]) -> str | None:
    """The stacks a finding points to: its ``dump_path``, else a captured outcome's folder."""
    path = evidence.get("dump_path")
    if isinstance(path, str) and path:
        return path
    doc = evidence.get("dumps")
    if isinstance(doc, Mapping) and doc.get("state") == "captured" and isinstance(doc.get("folder"), str):
        return str(doc["folder"])
    return None
