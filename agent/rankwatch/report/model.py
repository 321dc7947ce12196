"""One incident, read once into the data a report shows: verdict, timeline, merged stacks, evidence.

The judgement is ``dumps.diff``'s (which rank the others wait for, or the collective
mismatch) and ``dumps.flight``'s (which rank never entered collective N); this module only
gathers what surrounds it: the time each rank stopped, failed or was dumped, the ranks'
stacks merged into one tree, the failure records of the run (``.ranks/failed-<r>.json``), and
what the agent recorded beside each dump at capture time (``meta``: recent steps, log tail,
findings, process and GPU readings, the settings that judged the stall). Whatever an incident
does not hold is named as "not recorded", never guessed.

Everything is read through the store (``safeio``: no symlink below the root is followed, only
regular files, size caps), so the same model serves the CLI and the token-protected page.
At 4,096 ranks the stacks are bucketed before they are merged, so the tree costs one walk per
distinct stack, not per rank.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rankwatch import runfolder, safeio
from rankwatch.dumps import flight
from rankwatch.dumps.classify import COLLECTIVE, Activity, collective_text, describe, main_thread
from rankwatch.dumps.diff import MISMATCH, DiffResult, diff_incident
from rankwatch.dumps.show import basename, group_by_process, is_main_thread
from rankwatch.dumps.store import DumpStore, IncidentInfo
from rankwatch.ranksets import describe_ranks

# A failure record of the run this far from the incident's time belongs to another incident
# (the window the live agents use to name a first failure: runtime.diagnose.FAILURE_WINDOW_S).
FAILURE_WINDOW_S = 600.0
PER_RANK_ROWS = 32  # up to this many ranks, one timeline row each; beyond, one per group
MAX_ROWS = 40
LOG_TAIL_LINES = 40
FINDINGS_SHOWN = 200
MAX_FAILURE_RECORDS = 4096
_ADDR_RE = re.compile(r"0x[0-9a-fA-F]+")
# A failure record as the agents write it (runtime/diagnose.py: ``failed-r<r>-<us>-<f|c|x>``),
# or as agents before that wrote it (``failed-<r>``, kept by incidents already on disk).
_RECORD_RE = re.compile(r"^failed-(?:\d+|r\d{1,9}-\d{1,20}-[fcx])\.json$")
_EXTRA_RE = re.compile(r"^(flight-recorder-rank-(\d+)(?:\.pkl|\.json)?|extras-rank-(\d+)\.txt)$")
RECORD_MAX_BYTES = 64 << 10


def _epoch(text: Any) -> float | None:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def utc(t: float | None, *, date: bool = False) -> str:
    if t is None:
        return "?"
    fmt = "%Y-%m-%d %H:%M:%S UTC" if date else "%H:%M:%S UTC"
    return datetime.fromtimestamp(t, timezone.utc).strftime(fmt)


@dataclass
class Failure:
    """A rank's process died or reported a fatal error (the run's ``failed-<r>.json``)."""

    rank: int
    kind: str
    time: float
    how: str
    consequence: bool
    log: str | None = None
    node: str | None = None


@dataclass
class Side:
    """One side of a collective mismatch: these ranks wait in this collective, called from there."""

    ranks: list[int]
    collective: str
    call_site: str


@dataclass
class Verdict:
    headline: str  # "suspect: rank 2" / "no suspect"
    why: str  # dumps.diff's reason, as it says it
    kind: str  # dumps.diff's verdict ("not_in_collective", "collective_mismatch", ...)
    suspects: list[int]
    first_failure: Failure | None = None
    mismatch: list[Side] = field(default_factory=list)
    consequences: list[str] = field(default_factory=list)
    suspect_doing: str | None = None
    suspect_worker: str | None = None
    flight: str | None = None
    flight_suspects: list[int] = field(default_factory=list)
    not_dumped: list[int] = field(default_factory=list)  # of the world, no stack in the incident


@dataclass
class Row:
    """A timeline row: one rank, or ranks whose stack, step and fate are the same."""

    ranks: list[int]
    label: str
    doing: str
    state: str  # "suspect", "waiting", "failed", "no dump", "other"
    last_step: int | None
    steps: list[tuple[int, float]]  # (step, wall time) of its last steps, where recorded
    dumped_at: float | None
    failed_at: float | None
    failure: str | None = None
    collective: int | None = None  # the last collective it entered, from its Flight Recorder trace


@dataclass(slots=True)
class StackNode:
    """A function in the merged tree: how many ranks passed through it, and where they part.

    Frames merge by (function, file), as a flame graph does: ranks that stopped on different
    lines of one function share the node, which names each line with its count (a few; the
    rest counted), so 4,096 ranks on 4,096 lines are one node, not 4,096 branches."""

    name: str
    native: bool = False
    count: int = 0
    suspects: int = 0
    children: dict[str, StackNode] = field(default_factory=dict)
    ranks_sample: list[int] = field(default_factory=list)  # the first few, for the tooltip
    lines: dict[int, int] = field(default_factory=dict)  # line -> ranks, at most LINES_KEPT
    other_lines: int = 0  # ranks on lines beyond those

    @property
    def divergent(self) -> bool:
        return len(self.children) > 1

    @property
    def label(self) -> str:
        if not self.lines:
            return self.name
        if len(self.lines) == 1 and not self.other_lines:
            return f"{self.name[:-1]}:{next(iter(self.lines))})"
        shown = sorted(self.lines.items(), key=lambda kv: (-kv[1], kv[0]))
        text = ", ".join(f"{line} ({n})" for line, n in shown)
        if self.other_lines:
            text += f", {self.other_lines} more on other lines"
        return f"{self.name[:-1]}: lines {text})"


LINES_KEPT = 6


@dataclass
class Report:
    run: str
    incident: str
    reason: str
    time: float
    path: str
    ranks: list[int]
    world_size: int | None
    verdict: Verdict
    rows: list[Row]
    rows_grouped: bool
    tree: StackNode
    workers: StackNode | None
    failures: list[Failure]
    findings: list[dict[str, Any]]
    findings_source: str | None
    log_tail: list[str] | None
    log_tail_rank: int | None
    readings: dict[int, dict[str, Any]]
    judged_by: dict[str, Any] | None
    flight_ranks: list[int]
    missing: list[int]
    notes: list[str]
    diff: DiffResult


# --- reading -----------------------------------------------------------------------------
def _incident_files(store: DumpStore, info: IncidentInfo) -> list[str]:
    """Names of the regular files of the incident folder (symlinks and the rest skipped)."""
    return _list_files(store.root, list(info.parts)) if info.parts else _list_files(info.path, [])


def _list_files(root: Any, parts: list[str], pattern: re.Pattern[str] | None = None) -> list[str]:
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return []
    try:
        fd = safeio.open_dir_beneath(root_fd, parts, label=str(root))
    except OSError:
        return []
    finally:
        os.close(root_fd)
    try:
        with os.scandir(fd) as entries:
            return sorted(
                e.name
                for e in entries
                if (pattern is None or pattern.match(e.name)) and e.is_file(follow_symlinks=False)
            )
    except OSError:
        return []
    finally:
        os.close(fd)


def _failure_records(store: DumpStore, info: IncidentInfo, world: int | None = None) -> list[Failure]:
    """The run's failure records within the incident's window."""
    if not info.parts:
        base: list[str] = []
        root = info.path.parent
    else:
        base, root = [info.parts[0]], store.root
    names = _list_files(root, [*base, ".ranks"], _RECORD_RE)
    out: list[Failure] = []
    t0 = info.time.timestamp()
    for name in sorted(names)[:MAX_FAILURE_RECORDS]:
        try:
            doc = json.loads(safeio.read_beneath(root, [*base, ".ranks", name], limit=RECORD_MAX_BYTES))
        except (OSError, ValueError, TypeError):
            continue
        if not isinstance(doc, dict):
            continue
        # Believed only as the agents believe a peer's record (runfolder.check_record): a rank
        # outside the world or a time from the future is another user's forgery.
        if runfolder.check_record(doc, run=None, world=world, now=time.time()) is not None:
            continue
        rank, when = doc["rank"], doc["time"]
        if abs(float(when) - t0) > FAILURE_WINDOW_S:
            continue
        out.append(
            Failure(
                rank=rank,
                kind=str(doc.get("kind") or "failure"),
                time=float(when),
                how=str(doc.get("how") or "failed")[:300],
                consequence=bool(doc.get("consequence")),
                log=str(doc["log"]) if isinstance(doc.get("log"), str) else None,
                node=str(doc["node"]) if isinstance(doc.get("node"), str) else None,
            )
        )
    return sorted(out, key=lambda f: (f.time, f.rank))


def _flight(store: DumpStore, info: IncidentInfo, names: list[str]) -> dict[int, dict[str, Any]]:
    traces: dict[int, dict[str, Any]] = {}
    for name in names:
        m = _EXTRA_RE.match(name)
        if not m or m.group(2) is None:
            continue
        try:
            data = store.read_file(info, name)
        except OSError:
            continue
        if len(data) <= flight.MAX_BYTES and (doc := flight.load_trace(data)) is not None:
            traces[int(m.group(2))] = doc
    return traces


def read_findings(
    path: str | os.PathLike[str], run: str, t0: float, *, max_bytes: int = 64 << 20
) -> list[dict[str, Any]]:
    """Findings of ``run`` within the incident's window from a findings JSONL file."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    try:
        root_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        try:
            fd, st = safeio.open_file_beneath(root_fd, [name], label=folder, sibling_link=True)
        finally:
            os.close(root_fd)
        try:
            # The newest findings are at the end: past the cap, the head (and a cut line) go.
            start = max(0, st.st_size - max_bytes)
            os.lseek(fd, start, os.SEEK_SET)
            chunks, left = [], max_bytes
            while left > 0 and (chunk := os.read(fd, min(1 << 20, left))):
                chunks.append(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
    except OSError:
        return []
    data = b"".join(chunks)
    if start:
        data = data.partition(b"\n")[2]
    return findings_in_window(_jsonl(data), run, t0)


def _jsonl(data: bytes) -> Iterable[dict[str, Any]]:
    for line in data.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            yield doc


def findings_in_window(docs: Iterable[Mapping[str, Any]], run: str | None, t0: float) -> list[dict[str, Any]]:
    out = []
    for d in docs:
        t = _epoch(d.get("time"))
        if run is not None and d.get("run") not in (None, run):
            continue
        if t is not None and abs(t - t0) > FAILURE_WINDOW_S:
            continue
        out.append(dict(d))
    out.sort(key=lambda d: (_epoch(d.get("time")) or 0.0, str(d.get("rank"))))
    return out[-FINDINGS_SHOWN:]


# --- the merged tree ---------------------------------------------------------------------
def _frame_key(f: Mapping[str, Any]) -> str:
    """The function a frame is in: ``name (file)``, native addresses masked."""
    name = _ADDR_RE.sub("0x?", str(f.get("name") or "?"))
    return f"{name} ({basename(f.get('filename') or f.get('short_filename'))})"


def _stack_key(frames: list[dict[str, Any]]) -> tuple[Any, ...]:
    return tuple((_frame_key(f), f.get("line")) for f in frames)


def _is_native(f: Mapping[str, Any]) -> bool:
    return not str(f.get("filename") or "").endswith(".py")


def _insert(root: StackNode, frames: list[dict[str, Any]], ranks: list[int], suspects: set[int]) -> None:
    """Add one stack (innermost first, as py-spy gives it) for ``ranks``, outermost frame at the top."""
    n, s = len(ranks), sum(1 for r in ranks if r in suspects)
    node = root
    node.count += n
    node.suspects += s
    for f in reversed(frames):
        key = _frame_key(f)
        child = node.children.get(key)
        if child is None:
            child = node.children[key] = StackNode(key, native=_is_native(f))
        child.count += n
        child.suspects += s
        line = f.get("line")
        if isinstance(line, int) and not isinstance(line, bool):
            if line in child.lines or len(child.lines) < LINES_KEPT:
                child.lines[line] = child.lines.get(line, 0) + n
            else:
                child.other_lines += n
        if len(child.ranks_sample) < 8:
            child.ranks_sample.extend(ranks[: 8 - len(child.ranks_sample)])
        node = child


def _worker_stacks(dump: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The main-thread frames of each DataLoader worker process in a rank's dump."""
    threads = [t for t in dump.get("threads") or [] if isinstance(t, dict)]
    pid_ = dump.get("pid")
    root = pid_ if isinstance(pid_, int) else -1
    out = []
    for _pid, proc_threads in group_by_process(threads, root).items():
        main = next((t for t in proc_threads if is_main_thread(t)), None)
        frames = [f for f in (main or {}).get("frames") or [] if isinstance(f, dict)]
        if any(str(f.get("name") or "").rsplit(".", 1)[-1] == "_worker_loop" for f in frames):
            out.append(frames)
    return out


def _tree(dumps: dict[int, dict[str, Any]], suspects: set[int]) -> tuple[StackNode, StackNode | None]:
    main_buckets: dict[tuple[Any, ...], tuple[list[dict[str, Any]], list[int]]] = {}
    worker_buckets: dict[tuple[Any, ...], tuple[list[dict[str, Any]], list[int]]] = {}
    for rank in sorted(dumps):
        dump = dumps[rank]
        if not dump.get("ok"):
            continue
        thread = main_thread(dump)
        frames = [f for f in (thread or {}).get("frames") or [] if isinstance(f, dict)]
        if frames:
            key = _stack_key(frames)
            main_buckets.setdefault(key, (frames, []))[1].append(rank)
        for wf in _worker_stacks(dump):
            key = _stack_key(wf)
            worker_buckets.setdefault(key, (wf, []))[1].append(rank)
    root = StackNode("main thread of every dumped rank")
    for frames, ranks in main_buckets.values():
        _insert(root, frames, ranks, suspects)
    workers = None
    if worker_buckets:
        workers = StackNode("DataLoader worker processes")
        for frames, ranks in worker_buckets.values():
            _insert(workers, frames, ranks, suspects)
    return root, workers


# --- the verdict -------------------------------------------------------------------------
def _first_failure(failures: list[Failure]) -> Failure | None:
    causes = [f for f in failures if not f.consequence]
    pool = causes or failures  # records are sorted by time
    return pool[0] if pool else None


def _mismatch(result: DiffResult) -> list[Side]:
    if result.verdict != MISMATCH:
        return []
    by: dict[tuple[str, str | None, str], list[int]] = {}
    for r, act in sorted(result.activities.items()):
        if act.kind == COLLECTIVE:
            by.setdefault(act.key, []).append(r)
    sides = sorted(by.values(), key=lambda rs: (len(rs), rs[0]))
    out = []
    for rs in sides:
        act = result.activities[rs[0]]
        out.append(Side(rs, collective_text(act), act.call_site or act.frame))
    return out


def _verdict(
    result: DiffResult,
    failures: list[Failure],
    fr: flight.FrVerdict | None,
    missing: list[int],
) -> Verdict:
    first = _first_failure(failures)
    suspects = list(result.suspects)
    why = result.reason
    kind = result.verdict
    if not result.activities and not result.failed and fr is not None:
        suspects, why, kind = list(fr.suspects), fr.reason, "flight_recorder"
    if first is not None:
        # A rank that died first is the answer, whatever the stacks of the rest say (as live).
        suspects, kind = [first.rank], "first_failure"
        why = f"rank {first.rank} failed first: {first.how} at {utc(first.time)}"
    if suspects:
        headline = f"suspect: {describe_ranks(suspects)}"
    elif result.suspect_pids:  # a launcher's workers, named by pid (no rank learned for them)
        headline = f"suspect: {result.peer_names(result.suspect_pids)}"
    elif fr is not None and fr.suspects:
        headline = f"suspect: {describe_ranks(fr.suspects)} (flight recorder)"
    else:
        headline = "no single suspect"
    v = Verdict(headline, why, kind, suspects, first_failure=first, mismatch=_mismatch(result))
    if fr is not None:
        v.flight, v.flight_suspects = fr.reason, list(fr.suspects)
    acts = result.activities
    if len(suspects) == 1 and suspects[0] in acts:
        act = acts[suspects[0]]
        v.suspect_doing, v.suspect_worker = describe(act), act.worker
    waiting = [r for r, a in acts.items() if a.kind == COLLECTIVE and r not in suspects]
    if waiting and suspects and kind != MISMATCH:
        ops = sorted({collective_text(acts[r]) for r in waiting})
        v.consequences.append(
            f"{describe_ranks(waiting)} wait for it in {'; '.join(ops)}: a consequence, nothing to fix there"
        )
    for f in failures:
        if f is not first and (f.consequence or first is not None):
            v.consequences.append(
                f"rank {f.rank}'s {f.kind} at {utc(f.time)} ({f.how}): a consequence of "
                + (f"rank {first.rank}'s failure" if first is not None else "a peer's failure")
            )
    v.not_dumped = list(missing)
    return v


# --- rows --------------------------------------------------------------------------------
def _meta(dump: Mapping[str, Any]) -> dict[str, Any]:
    m = dump.get("meta")
    return m if isinstance(m, dict) else {}


def _steps(meta: Mapping[str, Any]) -> list[tuple[int, float]]:
    out = []
    for x in meta.get("recent_steps") or []:
        if (
            isinstance(x, (list, tuple))
            and len(x) == 2
            and isinstance(x[0], int)
            and isinstance(x[1], (int, float))
        ):
            out.append((int(x[0]), float(x[1])))
    return out[-32:]


def _state(rank: int, suspects: set[int], act: Activity | None, failed: bool) -> str:
    if rank in suspects:
        return "suspect"
    if failed:
        return "failed"
    if act is None:
        return "no dump"
    return "waiting" if act.kind == COLLECTIVE else "other"


def _doing(act: Activity | None, error: str | None) -> str:
    if act is not None:
        return describe(act)
    if error and error.startswith("not dumped"):
        return error
    return f"no stacks: {error}" if error else "no stack dump"


def _rows(
    dumps: dict[int, dict[str, Any]],
    result: DiffResult,
    verdict: Verdict,
    failures: list[Failure],
    missing: list[int],
    traced: list[int],
    entered: Mapping[int, int] | None = None,
) -> tuple[list[Row], bool]:
    suspects = set(verdict.suspects) | set(verdict.flight_suspects)
    failed_at = {f.rank: f for f in failures}
    sig_of: dict[int, int] = {}
    for i, g in enumerate(result.groups):
        for r in g.ranks:
            sig_of[r] = i
    every = sorted(set(dumps) | set(missing) | set(failed_at) | set(traced))
    grouped = len(every) > PER_RANK_ROWS
    buckets: dict[tuple[Any, ...], list[int]] = {}
    for r in every:
        dump = dumps.get(r) or {}
        meta = _meta(dump)
        act = result.activities.get(r)
        f = failed_at.get(r)
        state = _state(r, suspects, act, f is not None)
        key: tuple[Any, ...] = (r,)
        if grouped:
            key = (
                state,
                sig_of.get(r, -1),
                result.failed.get(r),
                meta.get("last_step"),
                f.kind if f else None,
            )
        buckets.setdefault(key, []).append(r)
    rows = []
    for ranks in buckets.values():
        r0 = ranks[0]
        dump = dumps.get(r0) or {}
        meta = _meta(dump)
        act = result.activities.get(r0)
        f = failed_at.get(r0)
        last = meta.get("last_step")
        rows.append(
            Row(
                ranks=ranks,
                label=describe_ranks(ranks, limit=6),
                doing=_doing(act, result.failed.get(r0) if dump else _absent(r0, traced)),
                state=_state(r0, suspects, act, f is not None),
                last_step=last if isinstance(last, int) and not isinstance(last, bool) else None,
                steps=_steps(meta),
                dumped_at=_epoch(dump.get("captured_at")),
                failed_at=f.time if f else None,
                failure=f"{f.kind}: {f.how}" if f else None,
                collective=(entered or {}).get(r0),
            )
        )
    order = {"suspect": 0, "failed": 1, "other": 2, "no dump": 3, "waiting": 4}
    rows.sort(key=lambda x: (order.get(x.state, 9), x.ranks[0]) if grouped else (x.ranks[0],))
    if len(rows) > MAX_ROWS:
        rest = rows[MAX_ROWS - 1 :]
        merged = sorted(r for row in rest for r in row.ranks)
        other = Row(merged, describe_ranks(merged, limit=6), "in various other places (see the stacks)",
                    "other", None, [], None, None)  # fmt: skip
        rows = [*rows[: MAX_ROWS - 1], other]
    return rows, grouped


def _absent(rank: int, traced: list[int]) -> str:
    return "not dumped (its Flight Recorder trace is in the folder)" if rank in traced else "not dumped"


# What a report reads of a dump: the rest (the py-spy text that repeats ``threads``, the
# command line) is dropped as each rank is loaded, which keeps 4,096 ranks in memory small.
_KEEP = ("rank", "pid", "ok", "error", "captured_at", "meta", "threads", "processes")


_FRAME_KEYS = ("name", "filename", "short_filename", "line")
_THREAD_KEYS = ("pid", "thread_name", "os_thread_id", "thread_id", "active", "owns_gil")


def _frame(f: Any) -> Any:
    if not isinstance(f, dict):
        return f
    # Thousands of ranks repeat the same few hundred names and paths: one string object each.
    return {k: sys.intern(v) if isinstance(v, str) else v for k, v in f.items() if k in _FRAME_KEYS}


def _slim(doc: dict[str, Any]) -> dict[str, Any]:
    out = {k: doc[k] for k in _KEEP if k in doc}
    threads = out.get("threads")
    if isinstance(threads, list):
        out["threads"] = [
            {
                **{k: t[k] for k in _THREAD_KEYS if k in t},
                "frames": [_frame(f) for f in t.get("frames") or []],
            }
            if isinstance(t, dict)
            else t
            for t in threads
        ]
    if not out.get("ok") and not out.get("threads") and doc.get("text"):
        out["text"] = doc["text"]  # a failed dump: its text says why
    return out


# --- the whole -----------------------------------------------------------------------------
def build_report(
    store: DumpStore,
    info: IncidentInfo,
    *,
    findings: Iterable[Mapping[str, Any]] | None = None,
    findings_source: str | None = None,
    world_size: int | None = None,
) -> Report:
    """Read the incident (blocking: the CLI, or a thread of the server) and assemble the report."""
    dumps = {r: _slim(store.load_rank(info, r)) for r in info.ranks}
    metas = [_meta(d) for d in dumps.values()]
    if world_size is None:
        sizes = [int(m["world_size"]) for m in metas if isinstance(m.get("world_size"), int)]
        world_size = max(sizes) if sizes else None
    result = diff_incident(dumps, world_size=world_size)
    names = _incident_files(store, info)
    traces = _flight(store, info, names)
    fr = flight.analyze(traces) if traces else None
    failures = _failure_records(store, info, world_size)
    missing = sorted(set(range(world_size)) - set(dumps)) if world_size else []
    verdict = _verdict(result, failures, fr, missing)
    entered = fr.last_entered if fr is not None else None
    rows, grouped = _rows(dumps, result, verdict, failures, missing, sorted(traces), entered)
    tree, workers = _tree(dumps, set(verdict.suspects))
    notes: list[str] = []
    found: list[dict[str, Any]] = []
    for m in metas:
        for x in m.get("findings") or []:
            if isinstance(x, dict):
                found.append(x)
    if findings is not None:
        found.extend(dict(x) for x in findings)
    t0 = info.time.timestamp()
    seen: set[str] = set()
    unique = []
    for d in findings_in_window(found, None, t0):
        k = json.dumps([d.get("kind"), d.get("rank"), d.get("time"), d.get("message")], default=str)
        if k not in seen:
            seen.add(k)
            unique.append(d)
    last_seen: dict[int, int] = {}
    for d in unique:
        r, st = d.get("rank"), d.get("step")
        if isinstance(r, int) and isinstance(st, int) and not isinstance(st, bool):
            last_seen[r] = max(st, last_seen.get(r, st))
    for row in rows:  # a rank that died before the dump: its findings still name its step
        if row.last_step is None and len(row.ranks) == 1 and row.ranks[0] in last_seen:
            row.last_step = last_seen[row.ranks[0]]
    tail_rank = next(iter(verdict.suspects or verdict.flight_suspects), None)
    tail = None
    if tail_rank is not None:
        lines = _meta(dumps.get(tail_rank) or {}).get("log_tail")
        if isinstance(lines, list):
            tail = [str(x) for x in lines][-LOG_TAIL_LINES:]
    readings: dict[int, dict[str, Any]] = {}
    judged: dict[str, Any] | None = None
    for r, d in dumps.items():
        m = _meta(d)
        got = {k: m[k] for k in ("process", "gpu") if isinstance(m.get(k), (dict, list))}
        if got:
            readings[r] = got
        if judged is None and isinstance(m.get("judged_by"), dict):
            judged = m["judged_by"]
    return Report(
        run=info.run,
        incident=info.name,
        reason=info.reason,
        time=t0,
        path=str(info.path),
        ranks=sorted(set(dumps) | set(traces)),
        world_size=world_size,
        verdict=verdict,
        rows=rows,
        rows_grouped=grouped,
        tree=tree,
        workers=workers,
        failures=failures,
        findings=unique,
        findings_source=findings_source,
        log_tail=tail,
        log_tail_rank=tail_rank,
        readings=readings,
        judged_by=judged,
        flight_ranks=sorted(traces),
        missing=missing,
        notes=notes,
        diff=result,
    )


def verdict_lines(rep: Report, *, limit: int = 5) -> list[str]:
    """The verdict in a few plain lines (Markdown and chat add their own escaping)."""
    v = rep.verdict
    out = [f"{v.headline}: {v.why}" if v.why else v.headline]
    if v.suspect_doing:
        out.append(f"it is {v.suspect_doing}")
    if v.suspect_worker:
        out.append(v.suspect_worker)
    for s in v.mismatch:
        out.append(f"{describe_ranks(s.ranks)} in {s.collective} called from {s.call_site}")
    if v.flight and v.kind != "flight_recorder":
        out.append(f"flight recorder: {v.flight}")
    if v.not_dumped:
        out.append(f"not dumped: {describe_ranks(v.not_dumped)}")
    out.extend(v.consequences)
    return out[:limit]
