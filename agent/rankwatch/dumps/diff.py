"""Group the ranks of one incident by where their main thread is, and name the odd one out.

In a collective hang every healthy rank sits in the same ``all_reduce``; the rank that
never arrived is somewhere else. Stacks are compared by (function, file) so line
numbers and native addresses, which differ between builds, do not split groups.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from rankwatch.dumps.show import basename, group_by_process, is_main_thread, is_training_frame

_COLLECTIVE_RE = re.compile(
    r"(?:^|_)(all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all)(?:_|$)", re.I
)
_DIST_PATH_RE = re.compile(r"torch[/\\]distributed|deepspeed[/\\]comm")
_WAIT_NAMES = frozenset({"wait", "wait_all", "wait_tensor"})
# Thin wrappers that say nothing about where a rank is.
_BORING_FILES = frozenset(
    {
        "threading.py",
        "queue.py",
        "selectors.py",
        "c10d_logger.py",
        "contextlib.py",
        "_contextlib.py",
        "functools.py",
    }
)
_LAUNCHER_RE = re.compile(
    r"torch[/\\]distributed[/\\](elastic|run\.py)|deepspeed[/\\]launcher|accelerate[/\\]commands"
)
_HELPER_LOOPS = frozenset({"_worker_loop", "_pin_memory_loop"})
_ADDR_RE = re.compile(r"0x[0-9a-fA-F]+")

Frame = dict[str, Any]


@dataclass
class StackGroup:
    ranks: list[int]
    signature: list[tuple[str, str]]
    where: str  # innermost interesting frame, "func (file:line)"
    caller: str | None  # innermost training-code frame below it
    in_collective: bool
    stack: list[str] = field(default_factory=list)


@dataclass
class DiffResult:
    groups: list[StackGroup]
    failed: dict[int, str]
    suspects: list[int]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": [asdict(g) | {"signature": [list(s) for s in g.signature]} for g in self.groups],
            "failed": {str(k): v for k, v in self.failed.items()},
            "suspects": self.suspects,
            "reason": self.reason,
        }


def _short_name(frame: Frame) -> str:
    return str(frame.get("name") or "").rsplit(".", 1)[-1]


def is_collective_frame(frame: Frame) -> bool:
    name = _short_name(frame)
    filename = str(frame.get("filename") or "")
    if "numpy" in filename:
        return False
    if name in _WAIT_NAMES:
        return bool(_DIST_PATH_RE.search(filename))
    return bool(_COLLECTIVE_RE.search(name))


def _label(frame: Frame) -> str:
    line = frame.get("line")
    file = basename(frame.get("filename") or frame.get("short_filename"))
    return f"{frame.get('name') or '?'} ({file}:{line})" if line else f"{frame.get('name') or '?'} ({file})"


def _main_thread(threads: list[Frame]) -> Frame | None:
    for thread in threads:
        if is_main_thread(thread):
            return thread
    return threads[0] if threads else None


def _score(frames: list[Frame]) -> int:
    """How much a process looks like the training rank rather than a launcher or worker."""
    for frame in frames:
        if _LAUNCHER_RE.search(str(frame.get("filename") or "")) or _short_name(frame) in _HELPER_LOOPS:
            return -1
    return sum(1 for f in frames if is_training_frame(f))


def main_stack(dump: dict[str, Any]) -> list[Frame]:
    """The main thread's frames (innermost first) of the process that runs the training code."""
    threads = [t for t in dump.get("threads") or [] if isinstance(t, dict)]
    root = dump.get("pid") if isinstance(dump.get("pid"), int) else -1
    best: list[Frame] = []
    best_score: int | None = None
    for pid, proc_threads in group_by_process(threads, root).items():
        main = _main_thread(proc_threads)
        frames = [f for f in (main or {}).get("frames") or [] if isinstance(f, dict)]
        score = _score(frames)
        # The watched process wins ties: it is usually the rank itself.
        if best_score is None or score > best_score or (score == best_score and pid == root):
            best, best_score = frames, score
    return best


def signature(frames: list[Frame]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (
            _ADDR_RE.sub("0x?", str(f.get("name") or "?")),
            basename(f.get("filename") or f.get("short_filename")),
        )
        for f in frames
    )


def _describe(frames: list[Frame]) -> tuple[str, str | None]:
    # Native frames (--native) and thin wrappers name no place a human would look first.
    python = [i for i, f in enumerate(frames) if str(f.get("filename") or "").endswith(".py")]
    candidates = python or list(range(len(frames)))
    if not candidates:
        return "no python frames", None
    start = next(
        (i for i in candidates if basename(frames[i].get("filename")) not in _BORING_FILES), candidates[0]
    )
    where_frame = frames[start]
    caller = next((f for f in frames[start:] if is_training_frame(f)), None)
    if caller is None or caller is where_frame:
        return _label(where_frame), None
    return _label(where_frame), _label(caller)


def format_ranks(ranks: list[int]) -> str:
    """``0,1,3`` and ``0-7,9``: runs of three or more are collapsed."""
    parts: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts.extend(str(r) for r in ranks[i : j + 1])
        i = j + 1
    return ",".join(parts)


def _suspects(groups: list[StackGroup], total: int) -> tuple[list[int], str]:
    if len(groups) < 2:
        if groups and total > 1:
            return [], "all ranks share one stack: the cause is likely outside the dumped ranks"
        return [], ""
    waiting = [r for g in groups if g.in_collective for r in g.ranks]
    elsewhere = sorted(r for g in groups if not g.in_collective for r in g.ranks)
    if waiting and elsewhere:
        if len(elsewhere) <= len(waiting):
            noun = "rank" if len(elsewhere) == 1 else "ranks"
            return elsewhere, f"the only {noun} not waiting in a collective"
        noun = "rank" if len(waiting) == 1 else "ranks"
        return sorted(waiting), f"the only {noun} in a collective the others never entered"
    largest = groups[0]
    if len(largest.ranks) * 2 > total:
        others = sorted(r for g in groups[1:] for r in g.ranks)
        noun = "rank" if len(others) == 1 else "ranks"
        return others, f"the only {noun} whose stack differs from the majority"
    return [], "no clear odd one out"


def diff_incident(ranks: dict[int, dict[str, Any]]) -> DiffResult:
    failed: dict[int, str] = {}
    buckets: dict[tuple[tuple[str, str], ...], list[int]] = {}
    stacks: dict[int, list[Frame]] = {}
    for rank in sorted(ranks):
        dump = ranks[rank]
        frames = main_stack(dump) if dump.get("ok") else []
        if not frames:
            failed[rank] = str(dump.get("error") or "no stacks in dump")
            continue
        stacks[rank] = frames
        buckets.setdefault(signature(frames), []).append(rank)
    groups: list[StackGroup] = []
    for sig, members in buckets.items():
        frames = stacks[members[0]]
        where, caller = _describe(frames)
        groups.append(
            StackGroup(
                ranks=members,
                signature=list(sig),
                where=where,
                caller=caller,
                in_collective=any(is_collective_frame(f) for f in frames),
                stack=[_label(f) for f in frames],
            )
        )
    groups.sort(key=lambda g: (-len(g.ranks), g.ranks[0]))
    suspects, reason = _suspects(groups, sum(len(g.ranks) for g in groups))
    return DiffResult(groups, failed, suspects, reason)


def format_diff(result: DiffResult) -> str:
    lines: list[str] = []
    for group in result.groups:
        who = f"ranks {format_ranks(group.ranks)}" if len(group.ranks) > 1 else f"rank {group.ranks[0]}"
        line = f"{who}: in {group.where}"
        if group.caller:
            line += f" <- {group.caller}"
        lines.append(line)
    for rank, error in sorted(result.failed.items()):
        lines.append(f"rank {rank}: no dump ({error})")
    if result.suspects:
        noun = "rank" if len(result.suspects) == 1 else "ranks"
        lines.append(f"suspect: {noun} {format_ranks(result.suspects)} ({result.reason})")
    elif result.reason:
        lines.append(f"no suspect: {result.reason}")
    if not lines:
        lines.append("no dumps")
    return "\n".join(lines) + "\n"
