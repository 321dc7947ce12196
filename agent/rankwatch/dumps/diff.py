"""Group the ranks of one incident by where their main thread is, and name the rank at fault.

In a collective hang the healthy ranks wait for their peers — in ``all_reduce``, in DDP's
gradient reduction inside ``backward``, in DDP's buffer broadcast before forward — and the
rank that never arrived is somewhere else: loading data, in I/O, computing. Healthy ranks may
wait in *different* collectives (the root of a broadcast finishes its sends and moves on to
backward's all-reduce), so the suspect is the rank that is not waiting at all. When every rank
waits, but not in the same collective, the ranks disagree on what comes next: a collective
mismatch, reported with each side's call site.

Stacks are grouped by (function, file) so line numbers and native addresses, which differ
between builds of a library, do not split groups; the innermost frame of the training code
(the call site) keeps its line, since every rank runs the same code: ranks waiting in
all-reduces of different process groups, called from two lines of one function, are two
groups with two call sites.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rankwatch import ranksets
from rankwatch.dumps.classify import (
    COLLECTIVE,
    INIT_OP,
    KIND_TEXT,
    Activity,
    Peer,
    classify_dump,
    collective_text,
    describe,
    label,
    launcher_peers,
    main_thread,
)
from rankwatch.dumps.show import basename, is_training_frame
from rankwatch.records import Diagnosis

_ADDR_RE = re.compile(r"0x[0-9a-fA-F]+")
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

Frame = dict[str, Any]

# Verdicts, in ``DiffResult.verdict``.
NOT_IN_COLLECTIVE = "not_in_collective"  # the suspect is the rank that is not waiting for the others
ONLY_IN_COLLECTIVE = "only_in_collective"  # a few ranks wait in a collective the others never entered
MISMATCH = "collective_mismatch"  # every rank waits, in different collectives
SAME_COLLECTIVE = "same_collective"  # every dumped rank waits in one collective
MISSING = "missing_ranks"  # every dumped rank waits; the ranks without a dump are the suspects
MAJORITY = "majority"  # no collective: the stack that differs from the majority
UNCLEAR = "unclear"


@dataclass
class StackGroup:
    ranks: list[int]
    signature: list[tuple[str, str]]
    where: str  # the frame that says where the rank is, "func (file:line)"
    caller: str | None  # innermost training-code frame below it
    in_collective: bool
    stack: list[str] = field(default_factory=list)
    activity: dict[str, Any] = field(default_factory=dict)


@dataclass
class DiffResult:
    groups: list[StackGroup]
    failed: dict[int, str]
    suspects: list[int]
    reason: str
    verdict: str = UNCLEAR
    activities: dict[int, Activity] = field(default_factory=dict)
    world_size: int | None = None
    missing: list[int] = field(default_factory=list)  # ranks of the world with no usable stack
    # A launcher's workers found inside a rank's dump (their ranks unknown to the agent), by the
    # dump's rank; and, when the ranks name no suspect, the workers the others wait for.
    peers: dict[int, list[Peer]] = field(default_factory=dict)
    suspect_pids: list[int] = field(default_factory=list)

    def peer_names(self, pids: list[int]) -> str:
        """``pid 7167 (spawn process 1)``: how the faces name a launcher's workers."""
        names = {p.pid: p.name() for ps in self.peers.values() for p in ps}
        return ", ".join(names.get(pid, f"pid {pid}") for pid in pids)

    def diagnosis(self, incident: str | None = None) -> Diagnosis:
        """The judgement as the typed data every face reads (the alert, the page, the CLI)."""
        return Diagnosis(
            suspects=tuple(self.suspects),
            verdict=self.verdict,
            incident=incident,
            world_size=self.world_size,
            missing=tuple(self.missing),
            suspect_pids=tuple(self.suspect_pids),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "missing": self.missing,
            "groups": [asdict(g) | {"signature": [list(s) for s in g.signature]} for g in self.groups],
            "failed": {str(k): v for k, v in self.failed.items()},
            "suspects": self.suspects,
            "reason": self.reason,
            "verdict": self.verdict,
            "ranks": {str(r): a.to_dict() for r, a in sorted(self.activities.items())},
            "peers": {
                str(r): [{"pid": p.pid, "index": p.index, "activity": p.activity.to_dict()} for p in ps]
                for r, ps in sorted(self.peers.items())
            },
            "suspect_pids": self.suspect_pids,
        }

    def summary(self) -> str:
        """One sentence for a finding or an alert: the suspect and why, or why there is none."""
        if self.suspects:
            noun = "rank" if len(self.suspects) == 1 else "ranks"
            return f"suspect: {noun} {format_ranks(self.suspects)} ({self.reason})"
        if self.suspect_pids:
            return f"suspect: {self.peer_names(self.suspect_pids)} ({self.reason})"
        return f"no suspect: {self.reason}" if self.reason else "no suspect"


def main_stack(dump: dict[str, Any]) -> list[Frame]:
    """The main thread's frames (innermost first) of the process that runs the training code."""
    thread = main_thread(dump)
    return [f for f in (thread or {}).get("frames") or [] if isinstance(f, dict)]


def signature(frames: list[Frame]) -> tuple[tuple[str, str], ...]:
    site = next((i for i, f in enumerate(frames) if is_training_frame(f)), None)
    return tuple(
        (
            _ADDR_RE.sub("0x?", str(f.get("name") or "?")),
            basename(f.get("filename") or f.get("short_filename"))
            + (f":{f.get('line')}" if i == site and f.get("line") else ""),
        )
        for i, f in enumerate(frames)
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
        return label(where_frame), None
    return label(where_frame), label(caller)


def format_ranks(ranks: list[int]) -> str:
    """``0,1,3``, ``0-7,9``, ``odd 1-4095``: runs of three or more collapsed, strides named."""
    return ranksets.format_ranks(ranks)


# A group line names at most this many items of its rank set; the JSON keeps every rank.
WHO_ITEMS = 16


def _who(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    body = ranksets.format_ranks(ranks, limit=WHO_ITEMS)
    if len(ranks) <= 16 and " " not in body:
        return f"ranks {body}"
    return ranksets.describe_ranks(ranks, limit=WHO_ITEMS)


def _at(act: Activity) -> str:
    return act.call_site or act.frame


def _ops(acts: dict[int, Activity], ranks: list[int]) -> str:
    seen: list[str] = []
    for r in ranks:
        if str(acts[r].op) not in seen:
            seen.append(str(acts[r].op))
    return ", ".join(seen)


def judge(
    acts: dict[int, Activity],
    failed: list[int],
    world_size: int | None = None,
    *,
    who: Callable[[list[int]], str] = _who,
    nouns: tuple[str, str] = ("rank", "ranks"),
) -> tuple[list[int], str, str]:
    """(suspects, reason, verdict) from each rank's activity (``who`` and ``nouns`` name them:
    a launcher's peers are judged by pid the same way)."""
    ranks = sorted(acts)
    missing = sorted(set(failed) | ({r for r in range(world_size) if r not in acts} if world_size else set()))
    if not ranks:
        return [], "no rank could be dumped", UNCLEAR
    waiting = [r for r in ranks if acts[r].kind == COLLECTIVE]
    elsewhere = [r for r in ranks if acts[r].kind != COLLECTIVE]
    if waiting and elsewhere:
        if len(elsewhere) <= len(waiting):
            kinds = sorted({KIND_TEXT.get(acts[r].kind, acts[r].kind) for r in elsewhere})
            noun = nouns[0] if len(elsewhere) == 1 else nouns[1]
            # The others wait inside init_process_group: the job hangs at startup because these
            # never got there (a slow import, a rank-dependent branch before init).
            never = (
                f"; {who(elsewhere)} never reached {INIT_OP}"
                if all(acts[r].op == INIT_OP for r in waiting)
                else ""
            )
            return (
                elsewhere,
                f"the only {noun} not waiting in a collective: {' / '.join(kinds)}; "
                f"{who(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for it "
                f"({_ops(acts, waiting)}){never}",
                NOT_IN_COLLECTIVE,
            )
        noun = nouns[0] if len(waiting) == 1 else nouns[1]
        return (
            waiting,
            f"the only {noun} in a collective the others never entered: {_ops(acts, waiting)} "
            f"called from {_at(acts[waiting[0]])}",
            ONLY_IN_COLLECTIVE,
        )
    if waiting:  # every dumped rank waits for its peers
        if missing:
            return (
                missing,
                f"every dumped rank waits in a collective; {who(missing)} could not be dumped and "
                "may be the one that never arrived",
                MISSING,
            )
        # Ranks in one collective from different call sites wait in different collectives
        # (another process group, another step): not one group.
        by_op: dict[tuple[str | None, str, str | None], list[int]] = {}
        for r in waiting:
            by_op.setdefault((acts[r].op, acts[r].detail, acts[r].call_site), []).append(r)
        if len(by_op) == 1:
            return (
                [],
                f"all ranks wait in the same collective ({_ops(acts, waiting)}): the cause is outside "
                "the dumped ranks (a rank not watched here, the network, or a peer's process group)",
                SAME_COLLECTIVE,
            )
        sides = sorted(by_op.values(), key=lambda rs: (len(rs), rs[0]))
        text = "; ".join(
            f"{who(rs)} in {collective_text(acts[rs[0]])} called from {_at(acts[rs[0]])}" for rs in sides
        )
        smallest = sides[0]
        unique = len(sides) > 1 and len(smallest) < len(sides[1])
        reason = f"collective mismatch: {text}"
        return (smallest if unique else []), reason, MISMATCH
    return [], "", UNCLEAR


def diff_incident(ranks: dict[int, dict[str, Any]], world_size: int | None = None) -> DiffResult:
    failed: dict[int, str] = {}
    buckets: dict[tuple[tuple[str, str], ...], list[int]] = {}
    stacks: dict[int, list[Frame]] = {}
    acts: dict[int, Activity] = {}
    for rank in sorted(ranks):
        dump = ranks[rank]
        frames = main_stack(dump) if dump.get("ok") else []
        if not frames:
            failed[rank] = str(
                dump.get("error")
                or (
                    "no Python frames in its main thread (exiting, or inside native code)"
                    if dump.get("ok")
                    else ""
                )
                or "no stacks in dump"
            )
            continue
        stacks[rank] = frames
        acts[rank] = classify_dump(dump)
        buckets.setdefault(signature(frames), []).append(rank)
    groups: list[StackGroup] = []
    for sig, members in buckets.items():
        frames = stacks[members[0]]
        act = acts[members[0]]
        where, caller = _describe(frames)
        if act.kind != "unknown":
            where, caller = act.frame, (act.call_site if act.call_site != act.frame else None)
        groups.append(
            StackGroup(
                ranks=members,
                signature=list(sig),
                where=where,
                caller=caller,
                in_collective=act.kind == COLLECTIVE,
                stack=[label(f) for f in frames],
                activity=act.to_dict(),
            )
        )
    groups.sort(key=lambda g: (-len(g.ranks), g.ranks[0]))
    suspects, reason, verdict = judge(acts, sorted(failed), world_size)
    if verdict == UNCLEAR and len(groups) >= 2:
        total = sum(len(g.ranks) for g in groups)
        largest = groups[0]
        if len(largest.ranks) * 2 > total:
            suspects = sorted(r for g in groups[1:] for r in g.ranks)
            noun = "rank" if len(suspects) == 1 else "ranks"
            reason, verdict = f"the only {noun} whose stack differs from the majority", MAJORITY
        else:
            reason = "no clear odd one out"
    elif verdict == UNCLEAR and groups and sum(len(g.ranks) for g in groups) > 1:
        reason = "all ranks share one stack: the cause is likely outside the dumped ranks"
    never = {r for r in range(world_size) if r not in ranks} if world_size else set()
    missing = sorted(set(failed) | never)
    result = DiffResult(groups, failed, suspects, reason, verdict, acts, world_size, missing)
    result.peers = {r: ps for r in sorted(ranks) if ranks[r].get("ok") and (ps := launcher_peers(ranks[r]))}
    if result.peers and not suspects:
        _judge_peers(result)
    return result


def _judge_peers(result: DiffResult) -> None:
    """The ranks the agent knows name no suspect, and a launcher's workers sit inside a rank's
    dump: they are the job's ranks as far as their stacks tell, so they are judged as peers
    (by pid: their ranks were set inside them), and the worker the others wait for is named."""
    peers = [p for ps in result.peers.values() for p in ps]
    if len({p.pid for p in peers}) != len(peers):  # one pid in two dumps (two nodes): no telling
        return
    acts = {p.pid: p.activity for p in peers}
    suspects, reason, verdict = judge(
        acts, [], who=result.peer_names, nouns=("worker process", "worker processes")
    )
    result.suspect_pids, result.reason, result.verdict = suspects, reason, verdict


def format_diff(result: DiffResult) -> str:
    lines: list[str] = []
    for rank, peers in sorted(result.peers.items()):
        lines.append(
            f"rank {rank}: a launcher waiting for {len(peers)} worker processes, whose ranks were set "
            "inside them (unknown to the agent):"
        )
        for p in peers:
            lines.append(f"  {p.name()}: {describe(p.activity)}")
    for group in result.groups:
        if all(r in result.peers for r in group.ranks):
            continue  # said process by process above
        act = result.activities.get(group.ranks[0])
        if act is not None and act.kind != "unknown":
            lines.append(f"{_who(group.ranks)}: {describe(act)}")
            if act.worker:
                lines.append(f"    {act.worker}")
            continue
        line = f"{_who(group.ranks)}: in {group.where}"
        if group.caller:
            line += f" <- {group.caller}"
        lines.append(line)
    by_error: dict[str, list[int]] = {}
    for rank, error in sorted(result.failed.items()):
        by_error.setdefault(error, []).append(rank)
    for error, ranks in by_error.items():
        lines.append(f"{_who(ranks)}: no dump ({error})")
    if result.suspects or result.reason:
        lines.append(result.summary())
    if result.verdict == MISMATCH:
        lines.append(
            "    a collective mismatch is a code path taken on some ranks only (a rank-dependent if, an "
            "early exit, an uneven last batch): compare the call sites above"
        )
    if not lines:
        lines.append("no dumps")
    return "\n".join(lines) + "\n"
