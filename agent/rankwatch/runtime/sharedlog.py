"""One log file written by several ranks, each rank its own pipeline (the node daemon).

``torchrun --nproc-per-node 4 train.py > job.log 2>&1`` (no ``--tee``): every worker's stdout
and stderr are the one file, and so is the launcher's. Each worker the daemon attaches follows
that file; were every line every rank's, torchrun's account of the one failed worker (its
``failed (exitcode: 1) local_rank: 3 (pid: N)`` line, its failure box) would be a crash on
every rank, and the first rank judged the first failure. So in a shared file each rank's
pipeline takes:

- the lines carrying its own prefix (``[rank3]:``, what PyTorch puts before a rank's traceback);
- the launcher's lines that name its process (torchrun logs the pid of each worker it failed or
  stopped, and its failure box names each one's pid; srun names the task ids whose end it tells:
  ``srun: error: n01: task 1: Aborted``); the launcher's other lines are no rank's;
- any other unprefixed line (the workers' own prints) is parsed by one pipeline only, the
  lowest live rank's. A record of it that names another rank of the file (``step=39 ... rank=1``,
  each piece of two ranks' records glued into one line) is handed to that rank's pipeline, so
  each rank's steps are its own wherever the agent began reading (``_hand_over``); the steps of
  records that name no rank are shared as progress with the ranks that read none of their own
  (the ranks of a synchronous job step together).
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankwatch import slurm
from rankwatch.events import Progress
from rankwatch.records import ErrorRecord, Finding, Record
from rankwatch.runtime.watcher import RankWatcher, Stream
from rankwatch.sources.decorations import strip

# PyTorch's glog-style line (c10 logging, and torch.distributed's Python logging under torchrun):
# ``W1128 12:41:35.600000 6252 torch/distributed/elastic/multiprocessing/api.py:1028] ...``; the
# number after the time is the writing process's pid.
_GLOG_RE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+(\d+) \S+:\d+\]")
# The pid of the worker a launcher line is about (torch/distributed/elastic/multiprocessing/
# api.py: its failure line and the stop it sends; its failure box's ``exitcode : N (pid: P)``).
_NAMED_PID_RE = re.compile(r"\(pid: (\d+)\)|Sending process (\d+) closing signal")
# The launcher's failure line: what follows (its traceback, the failure box) is the launcher's.
_CLOSING_RE = re.compile(r"Sending process \d+ closing signal (SIG[A-Z]+)")
_FAILED_RE = re.compile(r"failed \(exitcode: -?\d+\) local_rank: \d+ \(pid: \d+\)")


class SharedLogs:
    """Which pipelines follow each file, and whose each line of a shared one is."""

    def __init__(self) -> None:
        self.by_path: dict[Path, list[RankWatcher]] = {}

    def add(self, w: RankWatcher, paths: list[Path]) -> None:
        for p in paths:
            ws = self.by_path.setdefault(p, [])
            ws[:] = [x for x in ws if x is not w][-63:]  # bounded: the ranks of a node
            ws.append(w)

    def sharers(self, path: Path) -> list[RankWatcher]:
        return self.by_path.get(path, [])

    def owner(self, path: Path) -> RankWatcher | None:
        """The pipeline that takes the unprefixed lines nobody is named in: the lowest live rank."""
        ws = self.sharers(path)
        live = [w for w in ws if not w.exited] or ws
        return min(live, key=lambda w: (w.rank is None, w.rank or 0), default=None)


class SharedLogWatcher(RankWatcher):
    """A node daemon's rank pipeline: its lines of a file other ranks write too (``SharedLogs``)."""

    shared: SharedLogs | None = None
    task: int | None = None  # the Slurm task id, when the file is its srun's output

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Per shared file: (whether its last line was this rank's, the launcher's block under way).
        self.routing: dict[Path, tuple[bool, bool]] = {}
        self.traced: set[Path] = set()  # files where this rank's own traceback has begun
        self.stopped_by_launcher: int | None = None  # the signal the launcher said it sent us
        super().__init__(*args, **kwargs)

    def _mine(self, path: Path, batch: list[Any]) -> list[Any]:
        assert self.shared is not None
        ws = self.shared.sharers(path)
        if len(ws) < 2:
            return batch
        me = self.prober.pid if self.prober is not None else None
        pids = {w.prober.pid for w in ws if w.prober is not None}
        owner = self.shared.owner(path) is self
        state = self.routing
        last, block = state.get(path, (owner, False))
        out = []
        for fl in batch:
            if fl.cut:  # the rest of a long line: whose its start was
                if last:
                    out.append(fl)
                continue
            text, rank, _ = strip(fl.text)
            if rank is not None:
                last, block = rank == self.rank, False
                if last and text.startswith("Traceback"):
                    self.traced.add(path)
            else:
                g = _GLOG_RE.match(text)
                named = _NAMED_PID_RE.search(text)
                tasks = slurm.named_tasks(text) if self.task is not None else None
                if tasks is not None:
                    last, block = self.task in tasks, False  # srun's word on the tasks it names
                elif named is not None:
                    pid = int(named.group(1) or named.group(2))
                    failed = _FAILED_RE.search(text) is not None
                    # The launcher's word on a rank whose own traceback is in: that is its
                    # cause, and one death is one finding.
                    last = pid == me and not (failed and (path in self.traced or self.engine.state.errors))
                    stop = _CLOSING_RE.search(text)
                    if pid == me and stop is not None:
                        with contextlib.suppress(AttributeError):
                            self.stopped_by_launcher = int(getattr(signal, stop.group(1)))
                    if failed and pid == me:
                        self.traced.discard(path)
                    block = block or failed
                elif g is not None:
                    writer = int(g.group(1))
                    last = writer == me if writer in pids else False  # the launcher's own chatter
                    block = block and writer not in pids
                else:
                    last = owner and not block
            if last:
                out.append(fl)
        state[path] = (last, block)
        return out

    def feed_lines(self, stream: Stream, batch: list[Any]) -> None:
        if self.shared is not None:
            batch = self._mine(Path(stream.path), batch)  # none: the file's activity still counts
        super().feed_lines(stream, batch)

    def on_exit(
        self,
        exit_code: int | None,
        signal: int | None,
        *,
        requested: bool | int = False,
        disk_full: str | None = None,
        stopped_by: str = "we forwarded",
    ) -> Finding | None:
        """A worker the launcher stopped (after another one failed) did what it was told: the
        launcher's word in the shared log, read to its end first, says so; not a failure."""
        if not self.exited and self.shared is not None:
            self._owners_catch_up()
        if not self.exited and self.shared is not None and exit_code is None and signal is None:
            self.drain()
            if self.stopped_by_launcher is not None:
                sig = self.stopped_by_launcher
                return super().on_exit(
                    None, sig, requested=sig, disk_full=disk_full, stopped_by="the launcher sent"
                )
        return super().on_exit(
            exit_code, signal, requested=requested, disk_full=disk_full, stopped_by=stopped_by
        )

    def _owners_catch_up(self) -> None:
        """What the owner of each shared file has not read yet, read now: this rank's step lines
        reach it through the owner (``_hand_over``), and its end is told at its last step."""
        assert self.shared is not None
        for s in self.streams:
            owner = self.shared.owner(Path(s.path))
            if owner is not None and owner is not self and not owner.exited:
                owner.catch_up()

    def _records(self, records: list[Record]) -> None:
        if self.shared is not None:
            records = self._hand_over(records)
            if not records:
                return
        before = self.engine.state.last_step
        super()._records(records)
        step = self.engine.state.last_step
        if self.shared is None or step is None or step == before:
            return
        for path in [Path(s.path) for s in self.streams]:
            if self.shared.owner(path) is not self:
                continue
            for w in self.shared.sharers(path):
                if w is not self and not w.exited and w.engine.state.step_count == 0:
                    w.push(Progress(self.clock(), step))

    def _replays(self, stream: Stream, rec: Record) -> bool:
        """Each record of a shared file's history replayed once, where its live twin goes: a
        rank's own in its pipeline (its steps known before its live lines), one that names no
        rank of the file in the owner's."""
        if self.shared is None:
            return True
        path = Path(stream.path)
        ws = self.shared.sharers(path)
        if len(ws) < 2 or rec.rank == self.rank:
            return True
        if rec.rank is not None and any(w is not self and w.rank == rec.rank for w in ws):
            return False
        return self.shared.owner(path) is self

    def _hand_over(self, records: list[Record]) -> list[Record]:
        """The records that are this pipeline's; each one that names another rank of the same job
        following the same file (the rank the parser read in its text) is given to that rank's
        live pipeline (never to another user's or job's that writes the same path).
        Errors stay: a launcher's account of a worker is routed by its pid (``_mine``) and a
        rank's traceback by its prefix."""
        assert self.shared is not None
        keep: list[Record] = []
        given: dict[int, tuple[RankWatcher, list[Record]]] = {}
        for rec in records:
            taker = self._taker(rec)
            if taker is None:
                keep.append(rec)
            else:
                given.setdefault(id(taker), (taker, []))[1].append(rec)
        for taker, recs in given.values():
            taker._records(recs)
        return keep

    def _taker(self, rec: Record) -> RankWatcher | None:
        assert self.shared is not None
        if rec.rank is None or rec.rank == self.rank or rec.source is None or isinstance(rec, ErrorRecord):
            return None
        return next(
            (
                w
                for w in self.shared.sharers(Path(rec.source))
                if w is not self
                and w.rank == rec.rank
                and not w.exited
                and (w.identity.run, w.identity.user) == (self.identity.run, self.identity.user)
            ),
            None,
        )


def make_watcher(
    cfg: Any,
    identity: Any,
    logs: list[Path],
    *,
    emit: Callable[[Any], None],
    clock: Callable[[], float],
    shared: SharedLogs,
) -> SharedLogWatcher:
    w = SharedLogWatcher(cfg, identity, logs, emit=emit, clock=clock, from_end=True, replay=True)
    w.shared = shared
    shared.add(w, logs)
    return w
