"""Offline analysis: the live pipeline's parsers and detectors over finished log files.

One file per rank (rank from the file name, or its torchrun ``--log-dir`` worker folder:
``sources/logfiles.py``) or one file holding many ranks (rank from each line's launcher
prefix); gzip, bzip2 and xz files are read as the text they hold. A log's rotated backups given
with it (``train.log.2 train.log.1 train.log``: Python's RotatingFileHandler, logrotate) are
read as the one stream they were, oldest first.
The output shapes are the ``analyze --json`` contract of DESIGN.md.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import re
import stat
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch.config.schema import Config
from rankwatch.config.settings import settings_of
from rankwatch.detectors.crash import pick_cause
from rankwatch.detectors.crossrank import RankLagConfig, cross_rank
from rankwatch.detectors.exit import restarts_exhausted
from rankwatch.engine import RankEngine
from rankwatch.errorkinds import OWN_FAILURES
from rankwatch.records import Finding, Severity
from rankwatch.runtime.workers import LauncherLog
from rankwatch.sanitize import visible
from rankwatch.sources.compressed import compression_of, open_decompressed, require_readable, stream_text
from rankwatch.sources.lines import NOISE, FollowedLine, read_lines
from rankwatch.sources.logfiles import LogPlace, log_place, places_of
from rankwatch.sources.logparser import LogParser
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.sources.suggest import Diagnosis


@dataclass
class RankReport:
    path: str
    rank: int | None
    format: str | None
    steps: int
    last_step: int | None
    total_steps: int | None
    findings: list[Finding] = field(default_factory=list)
    lines: int = 0
    unparsed: int = 0
    cut_lines: int = 0
    records: int = 0  # of any kind, in this rank's whole file: 0 means nothing was recognised

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "rank": self.rank,
            "format": self.format,
            "steps": self.steps,
            "last_step": self.last_step,
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass
class Analysis:
    ranks: list[RankReport]
    findings: list[Finding]

    @property
    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    def exit_code(self) -> int:
        worst = self.worst
        return 1 if worst is not None and worst >= Severity.WARNING else 0

    @property
    def recognised_any(self) -> bool:
        """False when not one line of any file was understood: a wrong path or an unknown
        format, which must not pass for a healthy run."""
        return any(rep.records > 0 for rep in self.ranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": [r.to_json() for r in self.ranks],
            "findings": [f.to_json() for f in self.findings],
        }


def _sort_key(f: Finding) -> tuple[Any, ...]:
    # Among equally severe findings the lagging rank goes first: it is the answer, the
    # NCCL timeouts on the other ranks are its consequence.
    return (
        -int(f.severity),
        f.kind != "rank_lagging",
        f.rank if f.rank is not None else -1,
        f.step or 0,
        f.line or 0,
    )


@dataclass
class FileResult:
    format: str | None
    lines: int
    unparsed: int
    cut_lines: int
    ranks: list[tuple[RankEngine, list[Finding]]]
    records: int = 0
    said: frozenset[int] = frozenset()  # the ranks the file's own lines named
    fell_back: bool = False  # its one rank is ``fallback_rank``: nothing in it named one


PARALLEL_MIN_BYTES = 64 << 20  # below this a worker's start-up (~0.3 s) costs more than it saves
PREFETCH_MIN_BYTES = 64 << 20  # a file this big is read by a second process (~0.07 s to start)
PREFETCH_COMPRESSED_MIN_BYTES = 1 << 20


def _cores() -> int:
    """The cores this process may run on (a Slurm step or a container may get fewer than the node has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


STDIN = "-"  # ``rankwatch analyze -``: the log on standard input (``kubectl logs pod | ...``)


def _lines(path: str, cfg: Config, prefetch: bool) -> Iterator[FollowedLine]:
    limit, encoding = cfg.logs.max_line_bytes, cfg.logs.encoding
    if path == STDIN:  # read in this process, as it comes (a pipe has no size and no second reader)
        raw = open(os.dup(sys.stdin.fileno()), "rb")  # noqa: SIM115 - closed by read_lines
        text = stream_text(raw, "<stdin>")  # gzip -c log | rankwatch analyze -
        return read_lines(text, max_line_bytes=limit, drop=NOISE, label="<stdin>", encoding=encoding)
    kind = compression_of(path)
    if prefetch and os.name == "posix" and encoding == "utf-8":  # the reading child decodes UTF-8
        st = os.stat(path)
        # A compressed log holds 5 to 100 times its size in text, and decompressing it is more
        # work for the second process to take.
        least = PREFETCH_MIN_BYTES if kind is None else PREFETCH_COMPRESSED_MIN_BYTES
        if stat.S_ISREG(st.st_mode) and st.st_size >= least:
            from rankwatch.sources.prefetch import prefetched_lines

            if kind is not None:
                require_readable(kind, path)  # fails here, not in the child
            return prefetched_lines(path, max_line_bytes=limit, compression=kind)
    if kind is not None:
        return read_lines(
            open_decompressed(path, kind), max_line_bytes=limit, drop=NOISE, label=path, encoding=encoding
        )
    return read_lines(path, max_line_bytes=limit, drop=NOISE, encoding=encoding)


# A rotated backup of a log: ``train.log.1`` (RotatingFileHandler, logrotate), ``train.log.2.gz``
# (logrotate's compress); the higher the number, the older the file.
_ROTATED = re.compile(r"^(?P<base>.+)\.(?P<n>[1-9]\d{0,3})(?:\.(?:gz|bz2|xz))?$")


def rotation_chains(paths: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Each log given, with its rotated backups given too, oldest first: (the log, its
    backups). A numbered file whose log is not given is a file of its own (Slurm's ``-o
    train.%t`` names one file per task ``train.0``, ``train.1``)."""
    given = set(paths)
    older: dict[str, list[tuple[int, str]]] = {}
    for p in paths:
        m = _ROTATED.match(p)
        if m is not None and m["base"] in given and m["base"] != p:
            older.setdefault(m["base"], []).append((int(m["n"]), p))
    backups = {p for group in older.values() for _, p in group}
    return [
        (p, tuple(b for _, b in sorted(older.get(p, []), reverse=True))) for p in paths if p not in backups
    ]


def _chained(
    files: Sequence[str], cfg: Config, prefetch: bool, starts: list[tuple[int, str]]
) -> Iterator[FollowedLine]:
    """The lines of ``files`` as one stream, numbered on across them; ``starts`` gets each
    file's first number, to give every finding its own file and line back."""
    base = 0
    for path in files:
        starts.append((base, path))
        last = 0
        for fl in _lines(path, cfg, prefetch):
            last = fl.lineno
            yield FollowedLine(fl.text, base + fl.lineno, cut=fl.cut, clean=fl.clean) if base else fl
        base += last


def _place_back(found: list[Finding], starts: list[tuple[int, str]]) -> None:
    for f in found:
        if f.line is None:
            continue
        first, path = next((b, p) for b, p in reversed(starts) if f.line > b)
        f.path, f.line = path, f.line - first


def analyze_file(
    path: str, cfg: Config, fallback_rank: int | None, prefetch: bool = False, older: Sequence[str] = ()
) -> FileResult:
    """Run one file through a parser and one engine per rank seen in it. ``prefetch``: a big
    file may be read by a second process while this one parses (a core to spare). ``older``:
    its rotated backups, oldest first, read before it as the one stream they were."""
    place = log_place(path)
    name_rank = place.rank if place.named else None
    parser = LogParser.configured(cfg.logs, default_rank=name_rank, world_size=cfg.run.world_size)
    engines: dict[int | None, tuple[RankEngine, list[Finding]]] = {}

    def feed(records: list[Any]) -> None:
        for rec in records:
            entry = engines.get(rec.rank)
            if entry is None:
                entry = engines[rec.rank] = (RankEngine(cfg.detectors, rec.rank, path), [])
            found = entry[0].feed(rec)
            if found:
                entry[1].extend(found)

    launcher = LauncherLog(Path(path), 0)
    cut = 0
    n_records = 0
    starts: list[tuple[int, str]] = []
    lines = _chained([*older, path], cfg, prefetch, starts) if older else _lines(path, cfg, prefetch)
    for fl in lines:
        cut += fl.cut
        launcher.feed(fl.text.encode("utf-8", "replace"))
        recs = parser.feed(fl.text, fl.lineno, cut=fl.cut, clean=fl.clean)
        if recs:
            n_records += len(recs)
            feed(recs)
    last = parser.finish()
    n_records += len(last)
    feed(last)
    for eng, found in engines.values():
        found.extend(eng.finish())
        if older:
            _place_back(found, starts)
    _merge_launcher_crashes(engines)
    _gave_up(launcher, engines, RankEngine(cfg.detectors, name_rank, path))
    said = frozenset(r for r in engines if r is not None)
    if not engines:
        engines[name_rank] = (RankEngine(cfg.detectors, name_rank, path), [])
    fell_back = None in engines and len(engines) == 1
    if fell_back:
        # No rank in the name and no prefixes: this file is one rank, the one its place says.
        engines[fallback_rank] = _renumbered(engines.pop(None), fallback_rank)
    order = sorted(engines, key=lambda r: (r is None, r if r is not None else 0))
    return FileResult(
        format=parser.framework,
        lines=parser.stats.lines,
        unparsed=parser.stats.unparsed,
        cut_lines=cut,
        ranks=[engines[k] for k in order],
        records=n_records,
        said=said,
        fell_back=fell_back,
    )


def _gave_up(
    launcher: LauncherLog, engines: dict[int | None, tuple[RankEngine, list[Finding]]], spare: RankEngine
) -> None:
    """torchrun's final failure box after failed attempts it restarted: its restarts are used
    up and the job is dead, as the live agent tells it (``restarts_exhausted``), counted from
    the log's failure lines since no worker environment is read here."""
    used = launcher.restarts_used()
    if not used:
        return
    root = launcher.root_cause
    entry = engines.get(root[0]) if root is not None else None
    state = entry[0].state if entry is not None else None
    cause = pick_cause(state)[0] if state is not None else None
    f = restarts_exhausted(
        restarts=used,
        max_restarts=used,  # the box comes only when none is left
        status=1,  # torchrun's own exit on ChildFailedError
        root_rank=root[0] if root is not None else None,
        root_step=state.last_step if state is not None else None,
        cause=cause.summary if cause is not None else None,
    )
    f.path = spare.state.path
    if entry is None:
        entry = engines.get(None) or engines.setdefault(spare.state.rank, (spare, []))
    entry[1].append(f)


def _renumbered(
    entry: tuple[RankEngine, list[Finding]], rank: int | None
) -> tuple[RankEngine, list[Finding]]:
    eng, found = entry
    eng.state.rank = rank
    for f in found:
        f.rank = rank
    return entry


def _worker_ranks(places: Sequence[LogPlace], results: Sequence[FileResult]) -> None:
    """A torchrun worker folder's number is a local rank; when the worker's own lines name its
    rank (``[rank5]:`` in its stderr.log), its files that name none (its stdout.log) are that
    rank too: the log's word over the folder's."""
    said: dict[str, set[int]] = {}
    for place, res in zip(places, results, strict=True):
        if place.worker is not None:
            said.setdefault(place.worker, set()).update(res.said)
    for place, res in zip(places, results, strict=True):
        named = said.get(place.worker or "", set())
        if not res.fell_back or len(named) != 1:
            continue
        (rank,) = named
        if rank != place.rank:
            res.ranks[:] = [_renumbered(entry, rank) for entry in res.ranks]


def _merge_launcher_crashes(engines: dict[int | None, tuple[RankEngine, list[Finding]]]) -> None:
    """torchelastic reports one death twice: its own unprefixed 'failed (exitcode: 1)
    local_rank: 1' line and the ChildFailedError box that names the rank. The first is
    dropped when a ranked crash of the same local rank says it better; an unprefixed part
    left with nothing in it is no rank of its own."""
    if None not in engines or len(engines) == 1:
        return
    eng, found = engines[None]
    ranked = {
        f.evidence.get("local_rank")
        for r, (_, fs) in engines.items()
        if r is not None
        for f in fs
        if f.kind == "crash"
    }
    ranked.discard(None)
    found[:] = [f for f in found if not (f.kind == "crash" and f.evidence.get("local_rank") in ranked)]
    if not found and eng.state.step_count == 0 and not eng.state.evals:
        del engines[None]


_OWN_ERRORS = ("crash", "oom", "cuda_error", "peer_error", "nccl_error", "nccl_timeout")


def _fold_launcher_boxes(reports: list[RankReport], by_rank: dict[int | None, list[Finding]]) -> None:
    """torchrun's failure box names a rank whose own log (the same file under ``--tee``, or
    its own file) already holds the traceback of that death: one event, told best by the
    traceback. The box's exit code joins that finding; the box is no finding of its own."""
    for rank, found in by_rank.items():
        boxes = [f for f in found if f.kind == "crash" and "failed_rank" in f.evidence]
        if rank is None or not boxes:
            continue
        own = [
            f
            for f in found
            if f.kind in _OWN_ERRORS
            and "failed_rank" not in f.evidence
            and ("exception" in f.evidence or "script" in f.evidence)  # a traceback, or no start
        ]
        if not own:
            continue
        first = min(own, key=lambda f: f.line or 0)
        for box in boxes:
            code = box.evidence.get("exitcode")
            if code is not None and "torchrun reported exit code" not in first.message:
                first.message += f" (torchrun reported exit code {code})"
            found.remove(box)
            for rep in reports:
                if box in rep.findings:
                    rep.findings.remove(box)


def _worker_steps(places: Sequence[LogPlace], results: Sequence[FileResult]) -> None:
    """A torchrun worker's steps are in its stdout.log, its traceback in its stderr.log: a
    finding of one file with no step of its own is at the last step of the same process (its
    worker folder, so of its own attempt: a restart's new process has another folder)."""
    last: dict[tuple[str, int | None], int] = {}
    for place, res in zip(places, results, strict=True):
        if place.worker is None:
            continue
        for eng, _ in res.ranks:
            st = eng.state
            if st.last_step is not None:
                key = (place.worker, st.rank)
                last[key] = max(last.get(key, st.last_step), st.last_step)
    for place, res in zip(places, results, strict=True):
        if place.worker is None:
            continue
        for eng, found in res.ranks:
            step = last.get((place.worker, eng.state.rank))
            for f in found:
                if f.step is None and step is not None:
                    f.step = step


def _one_state_per_rank(
    states: Sequence[RankState], by_rank: dict[int | None, list[Finding]], workers: dict[str, str | None]
) -> list[RankState]:
    """The cross-rank judgement weighs ranks, not files: a rank in several files (a torchrun
    worker's stdout.log and stderr.log) is weighed by the steps of the file that has the most,
    and named by the file that holds its first own failure (where its traceback is). A rank
    that failed is weighed by the files of the process that failed (``workers``: file -> its
    worker folder), not by a later attempt's new process."""
    mine: dict[int | None, list[RankState]] = {}
    for st in states:
        mine.setdefault(st.rank, []).append(st)
    out: list[RankState] = []
    for rank, group in mine.items():
        if len(group) == 1:
            out.extend(group)
            continue
        own = [f for f in by_rank.get(rank, []) if f.kind in OWN_FAILURES and f.path is not None]
        first = min(own, key=lambda f: (f.time is None, f.time or 0.0, f.line or 0)).path if own else None
        folder = workers.get(first) if first is not None else None
        same = [s for s in group if folder is not None and workers.get(s.path or "") == folder]
        st = copy.copy(max(same or group, key=lambda s: s.step_count))
        if first is not None:
            st.path = first
        out.append(st)
    return out


def _file_results(
    paths: Sequence[str],
    cfg: Config,
    jobs: int | None,
    fallbacks: Sequence[int | None],
    older: Sequence[tuple[str, ...]],
) -> list[FileResult]:
    """One file per rank is independent until ``cross_rank``: files go to worker processes
    when there are several, they are big, and more than one core is allowed. Files read in
    this process are read by a second one when big and a core is spare (``jobs`` unset)."""
    n = len(paths)
    prefetch = jobs is None and _cores() > 1
    if STDIN in paths:
        jobs = 1  # standard input belongs to this process
    if jobs is None:
        jobs = min(n, _cores())
        total = 0
        for p in itertools.chain(paths, *older):
            with contextlib.suppress(OSError):
                total += os.path.getsize(p)
        if total < PARALLEL_MIN_BYTES:
            jobs = 1
    jobs = max(1, min(jobs, n))
    if jobs == 1:
        return [
            analyze_file(str(p), cfg, r, prefetch, o) for p, r, o in zip(paths, fallbacks, older, strict=True)
        ]
    # Here, not at the top: most calls never start a pool. spawn, not fork: no inherited
    # locks or threads, the same on every platform.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        return list(pool.map(analyze_file, [str(p) for p in paths], [cfg] * n, fallbacks, [False] * n, older))


def analyze(paths: Sequence[str], cfg: Config, *, jobs: int | None = None) -> Analysis:
    """``jobs``: worker processes for several files (None: one per core for inputs over
    ``PARALLEL_MIN_BYTES``, else in this process)."""
    reports: list[RankReport] = []
    states = []
    by_rank: dict[int | None, list[Finding]] = {}
    chains = rotation_chains([str(p) for p in paths])
    paths = [p for p, _ in chains]
    places = places_of(paths)
    results = _file_results(paths, cfg, jobs, [p.rank for p in places], [o for _, o in chains])
    _worker_ranks(places, results)
    _worker_steps(places, results)
    for path, res in zip(paths, results, strict=True):
        for eng, found in res.ranks:
            st = eng.state
            active = [f for f in found if not f.resolved]
            states.append(st)
            by_rank.setdefault(st.rank, []).extend(active)
            reports.append(
                RankReport(
                    path=str(path),
                    rank=st.rank,
                    format=res.format,
                    steps=st.step_count,
                    last_step=st.last_step,
                    total_steps=st.total_steps,
                    findings=active,
                    lines=res.lines,
                    unparsed=res.unparsed,
                    cut_lines=res.cut_lines,
                    records=res.records,
                )
            )
    _fold_launcher_boxes(reports, by_rank)
    workers = {str(p): place.worker for p, place in zip(paths, places, strict=True)}
    extra = cross_rank(
        _one_state_per_rank(states, by_rank, workers), by_rank, settings_of(cfg, RankLagConfig)
    )
    for f in extra:
        for rep in reports:
            if rep.rank == f.rank and rep.path == f.path:
                rep.findings.append(f)
                break
    for rep in reports:
        rep.findings.sort(key=_sort_key)
    reports.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.path))
    everything = sorted((f for rep in reports for f in rep.findings), key=_sort_key)
    return Analysis(ranks=reports, findings=everything)


def diagnose(paths: Sequence[str], cfg: Config) -> list[tuple[str, Diagnosis]]:
    """For logs nothing was read from: the lines that looked like records, why none was taken,
    and a drafted ``logs.regex`` (``sources/suggest.py``)."""
    from rankwatch.sources.suggest import diagnose_lines

    return [(str(p), diagnose_lines(fl.text for fl in _lines(str(p), cfg, False))) for p in paths]


_NOTHING = "no training records recognised"
_COLOURS = {Severity.CRITICAL: "\x1b[1;31m", Severity.WARNING: "\x1b[33m", Severity.INFO: "\x1b[36m"}


TRACEBACK_TAIL = 8


def _traceback_lines(f: Finding) -> list[str]:
    """The end of the Python traceback behind an error finding: the frame that failed is what
    a human reads first (``--json`` keeps the whole of it in no field: the contract is fixed)."""
    frame = f.evidence.get("frame")
    at = (
        [f"    at {visible(frame)} (the innermost frame outside the libraries)"]
        if isinstance(frame, str)
        else []
    )
    lines = f.evidence.get("lines")
    if not isinstance(lines, list) or not lines or not str(lines[0]).startswith("Traceback"):
        return at
    tail = [str(x) for x in lines[-TRACEBACK_TAIL:]]
    more = len(lines) - len(tail)
    head = [f"    | ... {more} more traceback lines above"] if more > 0 else [f"    | {visible(lines[0])}"]
    return at + head + [f"    | {visible(x[:300])}" for x in tail if x is not lines[0]]


def format_human(result: Analysis, *, colour: bool = False) -> str:
    """The report for a terminal: every piece of log text in it shown, never obeyed
    (``rankwatch.sanitize``), and the colour ours alone."""
    out: list[str] = []
    for rep in result.ranks:
        n = len(rep.findings)
        last = "-" if rep.last_step is None else str(rep.last_step)
        if rep.total_steps:
            last += f"/{rep.total_steps}"
        out.append(
            f"rank {rep.rank if rep.rank is not None else '?':>3}  {visible(rep.path)}  "
            f"format={visible(rep.format or '?')}  "
            f"steps={rep.steps}  last_step={last}  findings={n}"
            + (f"  cut_lines={rep.cut_lines}" if rep.cut_lines else "")
            + ("" if rep.records else f"  {_NOTHING}{' (format unknown)' if rep.format is None else ''}")
        )
    out.append("")
    if not result.findings:
        out.append("no findings: the run looks healthy")
        return "\n".join(out)
    for f in result.findings:
        sev = f.severity.label.upper()
        if colour:
            sev = f"{_COLOURS[f.severity]}{sev}\x1b[0m"
        where = f"{f.path}:{f.line}" if f.line is not None else (f.path or "")
        step = f" step {f.step}" if f.step is not None else ""
        out.append(f"{sev:<8} {visible(f.kind):<24} rank {f.rank}{step}  {visible(where)}")
        out.append(f"    {visible(f.message)}")
        out.extend(_traceback_lines(f))
    counts = {s: sum(1 for f in result.findings if f.severity is s) for s in Severity}
    out.append("")
    out.append(
        f"{counts[Severity.CRITICAL]} critical, {counts[Severity.WARNING]} warning, "
        f"{counts[Severity.INFO]} info"
    )
    return "\n".join(out)
