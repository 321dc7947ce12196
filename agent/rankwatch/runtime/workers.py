"""The processes of a launched job: the workers a launcher starts, and what is left when it ends.

``rankwatch run`` starts its command in a new session. Everything the job forks stays in that
session unless it calls ``setsid`` itself: DataLoader workers, a launcher's ranks and their
workers. When a stop was asked for, nothing of the job may outlive it: a DataLoader worker
blocked in ``__getitem__`` has no reason to notice its rank died, and an orphan holding a GPU
blocks the next job. So the whole session goes, not only the process group, and the
descendants seen while it ran go too (one that left the session). A job that ends on its own
keeps what it left running: the agent kills nothing of the job unasked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import re
import signal
import stat
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil

from rankwatch import offloop, safeio
from rankwatch.events import Progress
from rankwatch.identity import LOCAL_RANK_VARS, RANK_VARS, WORLD_VARS, identity_of_process
from rankwatch.records import ErrorRecord, Finding
from rankwatch.sources.process import descendants

log = logging.getLogger("rankwatch.run")

REAP_GRACE_S = 1.0  # between SIGTERM and SIGKILL for what is left of a stopped job


def session_members(sid: int) -> list[int]:
    """Pids whose session id is ``sid`` (from /proc; the caller's own pid never)."""
    out: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    me = os.getpid()
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # comm may hold spaces and parentheses: the fields after the last ")" are fixed.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3 and fields[0] != b"Z" and int(fields[3]) == sid:
            out.append(int(name))
    return out


class Tree:
    """Descendants of the launched command, remembered with their start time (pid reuse)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[int, float] = {}

    def remember(self) -> list[psutil.Process]:
        """The descendants now, noted; from the agent's shared pid table (``descendants``: no
        read of every process's /proc/<pid>/stat at each call)."""
        try:
            kids = descendants(psutil.Process(self.root))
        except psutil.Error:
            return []
        for k in kids:
            with contextlib.suppress(psutil.Error):
                self.seen.setdefault(k.pid, k.create_time())
        return kids

    def leftovers(self) -> list[psutil.Process]:
        """What still runs of the job: its session, and remembered descendants that left it."""
        procs: dict[int, psutil.Process] = {}
        for pid in session_members(self.root):
            with contextlib.suppress(psutil.Error):
                procs[pid] = psutil.Process(pid)
        for pid, started in self.seen.items():
            if pid in procs:
                continue
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if abs(p.create_time() - started) < 0.05:
                    procs[pid] = p
        return [p for p in procs.values() if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(procs: Iterable[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error, OSError):
            p.send_signal(sig)


def reap(tree: Tree, grace: float = REAP_GRACE_S) -> list[int]:
    """End what is left of the job once its command has stopped: SIGTERM, then SIGKILL after
    ``grace`` seconds. Blocking (run it through ``offloop.proc``); returns the pids that had to be ended."""
    left = tree.leftovers()
    if not left:
        return []
    pids = [p.pid for p in left]
    log.warning(
        "the command exited but %d of its processes still run (pids %s: DataLoader workers, a launcher's "
        "ranks): ending them",
        len(pids),
        ", ".join(map(str, pids[:10])),
    )
    _signal(left, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in left):
        time.sleep(0.05)
    _signal([p for p in left if _alive(p)], signal.SIGKILL)
    return pids


def env_int(env: dict[str, str], names: Iterable[str]) -> int | None:
    for name in names:
        v = env.get(name, "").strip()
        if v.isdigit():
            return int(v)
    return None


def output_targets(pid: int) -> tuple[list[Path], bool]:
    """The regular files a process's stdout and stderr go to (``/proc/<pid>/fd/1`` and ``2``),
    in that order, without repeats; and whether both go to regular files."""
    out: list[Path] = []
    both = True
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            both = False
            continue
        if not (target.startswith("/") and os.path.isfile(target)):
            both = False
        elif Path(target) not in out:
            out.append(Path(target))
    return out, both


def _own_outputs() -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                out.add((st.st_dev, st.st_ino))
    return out


def checked_output_files(pid: int) -> tuple[list[Path], list[str]]:
    """The files a watched process's stdout and stderr go to that the agent may follow, and why
    each other one is not followed. The agent may read with more rights than the job: a name is
    followed only when it still holds the very file the process writes (same device and inode
    as ``/proc/<pid>/fd/<n>``), is a regular file reached through no symlink, and is owned by
    the process's own user; a pipe, a terminal or a deleted file is no log to follow."""
    try:
        uids = psutil.Process(pid).uids()
    except psutil.Error as e:
        return [], [f"pid {pid} cannot be looked at ({e.__class__.__name__})"]
    users = {uids.real, uids.effective}
    files: list[Path] = []
    why: list[str] = []
    ours = _own_outputs()
    for fd, name in ((1, "stdout"), (2, "stderr")):
        link = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(link)
            opened = os.stat(link)  # the open file itself, whatever its name is now
        except OSError as e:
            why.append(f"its {name} cannot be read ({e.strerror or e})")
            continue
        if not stat.S_ISREG(opened.st_mode):
            why.append(f"its {name} is {safeio.kind_of(opened.st_mode)}")
            continue
        if not target.startswith("/") or target.endswith(" (deleted)"):
            why.append(f"its {name} is a file no longer under a name ({target[:200]!r})")
            continue
        try:
            st = os.lstat(target)
            real = os.path.realpath(target)
        except OSError as e:
            why.append(f"its {name} file {target[:200]!r} cannot be looked at ({e.strerror or e})")
            continue
        if not stat.S_ISREG(st.st_mode) or real != target:
            what = safeio.kind_of(st.st_mode)
            why.append(f"its {name} file's name {target[:200]!r} is now {what}, or reached through a link")
        elif (st.st_dev, st.st_ino) != (opened.st_dev, opened.st_ino):
            why.append(f"its {name} file's name {target[:200]!r} now holds another file")
        elif st.st_uid not in users:
            why.append(f"its {name} file {target[:200]!r} is owned by UID {st.st_uid}, not by the process's")
        elif (st.st_dev, st.st_ino) in ours:
            # Started from one shell into one file (or srun --overlap beside the step, both into
            # slurm-<job>.out): read, the agent's own reports would come back to it as the rank's.
            why.append(f"its {name} file {target[:200]!r} is where this agent's own output goes")
        elif Path(target) not in files:
            files.append(Path(target))
    return files, why


def started_rank(env: dict[str, str], parent: int, root: int) -> dict[str, str] | None:
    """The environment of a rank that a training script started itself, with its RANK: Lightning's
    ``_SubprocessScriptLauncher`` (lightning/fabric/strategies/launchers/subprocess_script.py)
    runs the script again for local ranks 1..N-1 with ``LOCAL_RANK``, ``NODE_RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` and no RANK; its global rank is
    ``NODE_RANK * N + LOCAL_RANK``, which on node 0 is its LOCAL_RANK (N, the devices per node,
    is in no variable: on another node the rank stays unknown). The script's own process
    (``root``) is local rank 0: it set those variables in its own ``os.environ``, which
    ``/proc/<pid>/environ`` does not show."""
    if parent != root or env_int(env, RANK_VARS) is not None:
        return None
    local = env.get("LOCAL_RANK", "").strip()
    node = env.get("NODE_RANK", env.get("GROUP_RANK", "0")).strip()
    if not local.isdigit() or int(local) < 1 or node != "0" or "MASTER_PORT" not in env:
        return None  # local rank 0 is the script itself (a forked DataLoader worker shows none)
    if env_int(env, WORLD_VARS) is None:
        return None
    return {**env, "RANK": local}


def rank_workers(
    root: int, *, script: bool = False, kids: list[psutil.Process] | None = None
) -> list[tuple[int, dict[str, str]]]:
    """The rank processes under a launcher (``torchrun``): descendants with a RANK in their
    environment whose parent has none (a rank's own DataLoader workers inherit its RANK).
    ``script``: ``root`` is a training script that may start its other ranks itself
    (``started_rank``); once one is found, ``root`` is rank 0 of their world. ``kids``: the
    root's descendants when the caller walked them already."""
    if kids is None:
        try:
            kids = descendants(psutil.Process(root))  # the shared pid table: asked every process sample
        except psutil.Error:
            return []
    envs: dict[int, dict[str, str]] = {}
    for k in kids:
        with contextlib.suppress(psutil.Error):
            envs[k.pid] = k.environ()
    out: list[tuple[int, dict[str, str]]] = []
    if script:
        try:
            if "LOCAL_RANK" in psutil.Process(root).environ():
                return []  # started as a rank by someone else: it starts none (Lightning's rule)
        except psutil.Error:
            return []
        for k in kids:
            env = envs.get(k.pid)
            with contextlib.suppress(psutil.Error):
                started = started_rank(env, k.ppid(), root) if env is not None else None
                if started is not None:
                    out.append((k.pid, started))
        if out:
            world = out[0][1]["WORLD_SIZE"]
            out.insert(0, (root, {"RANK": "0", "LOCAL_RANK": "0", "NODE_RANK": "0", "WORLD_SIZE": world}))
        return out
    for k in kids:
        env = envs.get(k.pid)
        if env is None or env_int(env, RANK_VARS) is None:
            continue
        try:
            parent = k.ppid()
        except psutil.Error:
            continue
        penv = envs.get(parent)
        if penv is not None and env_int(penv, RANK_VARS) is not None:
            continue  # a worker of a rank
        out.append((k.pid, env))
    return out


# --- a launcher's workers, one watcher each ---------------------------------------------------

# What the run's pipeline leaves to the launcher's exit (its state keeps them as the cause).
LAUNCHER_HELD = frozenset({"crash", "oom", "cuda_error", "peer_error", "nccl_error", "nccl_timeout", "xid"})
LAUNCHER_NAMES = frozenset({"torchrun", "deepspeed", "accelerate"})
LAUNCHER_MODULES = frozenset(
    {"torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.runner"}
)


def survey(
    root: int, *, script: bool, look: bool
) -> tuple[tuple[int, list[str]] | None, list[tuple[int, dict[str, str]]]]:
    """One period's look at the job's tree, one walk of it: with ``look``, the launcher it
    runs (``find_launcher``); and its rank processes (``rank_workers``: under that launcher
    once found, else as ``script`` says). Blocking: off the loop."""
    try:
        kids = descendants(psutil.Process(root))  # the shared pid table: asked every process sample
    except psutil.Error:
        return None, []
    launcher = find_launcher(root, kids) if look else None
    return launcher, rank_workers(root, script=script and launcher is None, kids=kids)


def is_launcher(cmd: list[str]) -> bool:
    """``torchrun ...``, ``python -m torch.distributed.run ...``: the ranks are its children."""
    if not cmd:
        return False
    if os.path.basename(cmd[0]) in LAUNCHER_NAMES:
        return True
    return any(a == "-m" and b in LAUNCHER_MODULES for a, b in itertools.pairwise(cmd))


def launcher_process(proc: psutil.Process) -> bool:
    """Whether the process is a launcher by its command line (``torchrun``, ``python -m
    torch.distributed.run``, ``python .../bin/torchrun``): its ranks are its children."""
    with contextlib.suppress(psutil.Error):
        cmd = proc.cmdline()
        script = cmd[1:] if cmd and os.path.basename(cmd[0]).startswith("python") else []
        return is_launcher(cmd) or is_launcher(script)
    return False


def find_launcher(root: int, kids: list[psutil.Process] | None = None) -> tuple[int, list[str]] | None:
    """The launcher the job runs, wherever it is in the tree: ``root`` itself (``bash -c 'exec
    torchrun ...'`` became it) or the first of its descendants that is one (a wrapper script,
    ``bash -c 'cd . && torchrun ...'``); its pid and command line. Blocking: off the loop.
    ``kids``: the root's descendants when the caller walked them already."""
    try:
        top = psutil.Process(root)
        procs = [top, *(descendants(top) if kids is None else kids)]  # the shared pid table
    except psutil.Error:
        return None
    for p in procs:
        if launcher_process(p):
            with contextlib.suppress(psutil.Error):
                return p.pid, p.cmdline()
    return None


def _worker_watcher_class() -> type:
    from rankwatch.runtime.watcher import RankWatcher
    from rankwatch.runtime.watcher import _from as from_stream
    from rankwatch.sources.decorations import strip

    class WorkerWatcher(RankWatcher):
        """One pipeline of a launcher's combined log: a rank's (its own stall clock, process and
        dump file) reads the lines carrying its prefix (torchrun's ``[rankN]:`` from ``--tee 3``,
        or the ``[rankN]:`` PyTorch puts before a rank's traceback); the run's own (``reads``
        None) reads every line with no rank prefix: what the workers print without ``--tee``
        (HF Trainer's loss lines, from rank 0) and the launcher's own lines."""

        reads: int | None = None
        launcher = False  # the run's own pipeline: its failures are judged at the launcher's exit
        own: frozenset[Path] = frozenset()  # files only this worker writes: every line is its own
        # A script's own pipeline before it started ranks of its own (Lightning): every line.
        everything = False
        # Its stdout and stderr both go to its own files: under ``--tee`` the lines with its prefix
        # in the combined log are torchrun's copies of them, and read twice every step would count
        # twice (the detectors would judge a history that is not the log's).
        whole = False

        # The run's pipeline: the lines with no rank prefix it read, with when (bounded): a failed
        # worker that printed nothing with its prefix is quoted from them (``Fleet._lend_cause``).
        unprefixed: deque[tuple[float, str]] | None = None

        # Its stdout file, when its stdout and stderr are two files of its own (torchrun's
        # ``--tee``/``--redirects``): an HF Trainer's dicts (``tqdm.write``) go to stdout, the
        # bar's clearing and redraw that mark each write to stderr. The parser of the stdout file
        # is also given the stderr file's bar segments (``_relay_bars``), as the combined log
        # shows them to ``analyze``: the dicts get the Trainer's step, not a count of records.
        bars_to: Path | None = None
        # The relayed segments not yet given to it: before its format shows (no dict yet), or
        # while this turn's stdout batch is still to come.
        bars_held: deque[tuple[str, int]]

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.bars_held = deque(maxlen=_BARS_HELD)

        def feed_lines(self, stream, batch):  # type: ignore[no-untyped-def]
            if stream.path in self.own or self.everything:
                if self.bars_to is not None and stream.path == self.bars_to:
                    taken = self._bars_first()
                    super().feed_lines(stream, batch)
                    self._relay_bars([])  # what waited for this file's format
                    # Then the stderr batches themselves, after the stdout one as before: an
                    # error's place after the last step record is what makes it the cause.
                    self.relayed = True
                    try:
                        for s, queued in taken:
                            self._feed_read(s, queued)
                    finally:
                        self.relayed = False
                    return None
                if self.bars_to is not None and stream.path in self.own and not self.relayed:
                    self._relay_bars(batch)
                return super().feed_lines(stream, batch)
            if self.whole:
                return None
            mine = [fl for fl in batch if fl.cut or strip(fl.text)[1] == self.reads]
            if mine:
                if self.unprefixed is not None:
                    now = self.wall()
                    self.unprefixed.extend((now, fl.text[:_LENT_CHARS]) for fl in mine if not fl.cut)
                super().feed_lines(stream, mine)

        relayed = False  # the stderr batches being fed had their bars relayed already

        def _bars_first(self) -> list[tuple[Any, list[Any]]]:
            """The stderr file's batches read in the same turn, taken and their bar segments
            relayed before the stdout batch is parsed (tqdm draws the bar and clears it before
            the dict it makes room for is printed); the batches, to be parsed after it."""
            taken: list[tuple[Any, list[Any]]] = []
            for s in self.streams:
                if s.path in self.own and s.path != self.bars_to:
                    while (queued := s.reader.take()) is not None:
                        self._relay_bars(queued)
                        taken.append((s, queued))
            return taken

        def _relay_bars(self, batch: list[Any]) -> None:
            """The bar's segments of a stderr batch (each ``\\r`` redraw and tqdm's clearing, before
            the watcher thins the redraws) fed to the stdout file's parser, with line numbers of
            their own (negative: never taken for a stdout line's); not counted as its lines. Once
            a bar showed, that parser pairs dicts and redraws as through two pipes; with no bar
            (``disable_tqdm``) nothing changes and no dict waits."""
            target = next((s for s in self.streams if s.path == self.bars_to), None)
            held = self.bars_held
            for fl in batch:
                text = fl.text
                if fl.cut or not text or not ("%|" in text or text.isspace()):
                    continue
                held.append((text, -fl.lineno))
                if "%|" in text and target is not None:
                    target.parser.pipes_apart()  # before the first dict makes its parser
            if target is None or target.parser.format != "hf":
                if target is None or target.parser.format is not None:
                    held.clear()  # another format may read a bar as steps: counted twice
                return  # no dict yet: the bars wait for the first (bounded)
            parser = target.parser
            st = parser.stats
            counts = (st.lines, st.parsed, st.unparsed)
            now = self.wall()
            out: list[Any] = []
            while held:
                text, lineno = held.popleft()
                try:
                    out.extend(parser.feed(text, lineno, now=now, clean=True))
                except Exception:
                    self.internal_errors += 1
            st.lines, st.parsed, st.unparsed = counts
            if out:
                self._records(from_stream(out, target))  # type: ignore[no-untyped-call]

        # The run's pipeline: told each step the run's lines reach (``Fleet.share_progress``).
        on_progress: Callable[[float, int], None] | None = None

        def on_exit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            """Dated when the process was first seen dead, not when its end is judged: the
            launcher's word on it may come seconds later, after a restart's new worker began,
            and a record of this end dated after that start would pass for the new attempt's."""
            s = self.last_sample
            if s is None or s.alive:
                return super().on_exit(*args, **kwargs)
            died = self.wall() - max(0.0, self.clock() - s.time)
            wall = self.wall
            self.wall = lambda: died
            try:
                return super().on_exit(*args, **kwargs)
            finally:
                self.wall = wall

        # The run's pipeline: the worker pipeline of a rank, where there is one (``Fleet.by_rank``).
        worker_of: Callable[[int], Any] | None = None

        def _records(self, records):  # type: ignore[no-untyped-def]
            if not self.launcher:
                return super()._records(records)
            if self.worker_of is not None:
                records = self._hand_over(records)
                if not records:
                    return None
            emit = self.emit
            before = self.engine.state.last_step
            # A failure in the run's lines (the launcher's account of a worker, a worker's text
            # before its rank prefix) is the worker pipelines' to report, or the launcher's exit.
            self.emit = lambda f: None if f.kind in LAUNCHER_HELD else emit(f)
            try:
                return super()._records(records)
            finally:
                self.emit = emit
                for r in records:
                    if isinstance(r, ErrorRecord) and r.kind in LAUNCHER_HELD:
                        r.reported = False  # held back, not told: the launcher's exit tells it
                step = self.engine.state.last_step
                if step is not None and step != before and self.on_progress is not None:
                    self.on_progress(self.clock(), step)

        def _hand_over(self, records: list[Any]) -> list[Any]:
            """Without ``--tee`` a worker's step lines reach the run's lines only; one that names
            its rank (``step=11 ... rank=0``) is that worker's, given to its pipeline: its crash
            is then told at its own last step. Errors stay: the launcher's exit tells them."""
            keep = []
            for rec in records:
                w = None
                if rec.rank is not None and not isinstance(rec, ErrorRecord):
                    w = self.worker_of(rec.rank) if self.worker_of is not None else None
                if w is None or w is self or w.exited:
                    keep.append(rec)
                else:
                    w._records([rec])
            return keep

    return WorkerWatcher


def run_watcher(
    cfg: Any,
    identity: Any,
    log_path: Path,
    *,
    emit: Any,
    clock: Any,
    script: bool = False,
    start_at: int | None = None,
    replay: bool = False,
) -> Any:
    """The launcher's own pipeline: the run's lines of its combined log (see WorkerWatcher).
    ``script``: a training script's pipeline, every line its own until it starts ranks of its
    own (``Fleet``, ``started_rank``) or a launcher is found running under it
    (``Fleet.launched_by``); then it reads the run's lines, as a launcher's does. ``replay``: a
    log found mid-run (``watch --pid``) has its recent history read back (``logs.replay``)."""
    w = _worker_watcher_class()(
        cfg, identity, [log_path], emit=emit, clock=clock, from_end=True, start_at=start_at, replay=replay
    )
    w.reads, w.launcher, w.everything = None, not script, script
    w.unprefixed = deque(maxlen=_LENT_LINES)
    return w


# Bar segments of a worker's stderr file kept for its stdout file's reader until the first dict
# shows the format: tqdm redraws at most every 0.1 s (its mininterval), so minutes of them.
_BARS_HELD = 4096
# The run's unprefixed lines kept for a failed worker that printed nothing with its prefix: a
# torchrun teardown (its own traceback and failure box, ~40 lines) still leaves the worker's last
# lines in them. Each line cut to a length a message quotes.
_LENT_LINES = 256
_LENT_CHARS = 4096
# torchrun's own log lines (glog format, from its modules): no worker's output.
_LAUNCHER_LINE = re.compile(r"torch/distributed/(?:elastic/|run\.py|launch)")
_SAID_RANK = re.compile(r"(?<![\w.-])rank=(\d{1,7})(?!\d)|\[RANK (\d{1,7})\] ")


def lent_lines(lines: Iterable[tuple[float, str]], since: float, rank: int) -> list[str]:
    """What a worker printed without its prefix, as far as the run's lines tell: those read
    since it started, up to the launcher's first word on a failure (``Sending process ... closing
    signal``, ``failed (exitcode``: what follows is the teardown), less the launcher's own lines
    and the lines that name another rank (``rank=0``, accelerate's ``[RANK 0]``)."""
    out: list[str] = []
    for t, text in lines:
        if t < since:
            continue
        if _LAUNCHER_LINE.search(text):
            if _FAILED_RE.search(text) or _CLOSING_RE.search(text):
                break
            continue
        said = {int(a or b) for a, b in _SAID_RANK.findall(text)}
        if said and said != {rank}:
            continue
        out.append(text)
    return out


# torchrun's own account of its workers (torch/distributed/elastic/multiprocessing/api.py): each
# failed worker within its monitor interval, and each worker it stops itself.
_FAILED_RE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_CLOSING_RE = re.compile(r"Sending process (\d+) closing signal (SIG[A-Z]+)")
# Its failure box at the end: ``exitcode  : -15 (pid: 17341)`` for every failed worker.
_BOX_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")
_BOX_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: (\d+)\)")  # the line above it
_LAUNCHER_LOG_MAX = 4 << 20  # a backlog larger than this is skipped: those fates stay unknown
MONITOR_INTERVAL_S = 0.1  # torchrun's --monitor-interval default (torch/distributed/run.py)
MAX_UNSEEN = 64  # workers the failure box names that are given a pipeline at the end, at most


def monitor_interval(cmd: list[str]) -> float:
    """The launcher's ``--monitor-interval`` (how soon it notices a worker's end)."""
    for i, a in enumerate(cmd):
        for name in ("--monitor-interval", "--monitor_interval"):
            v = (
                a[len(name) + 1 :]
                if a.startswith(name + "=")
                else (cmd[i + 1] if a == name and i + 1 < len(cmd) else None)
            )
            if v is not None:
                with contextlib.suppress(ValueError):
                    return max(0.0, float(v))
    return MONITOR_INTERVAL_S


_READ_BACK_MAX = 1 << 20  # the end of the run's log a worker seen late reads back
# A worker whose log shows a fatal error and that the launcher has not named waits this many
# graces for the launcher's word before its end is taken for clean. torchrun names one worker
# per attempt, the first failure its poll saw (``_poll`` in torch/distributed/elastic/
# multiprocessing/api.py); a worker that failed in the same poll is told failed only by that
# line, which a launcher slowed by a loaded node writes after the worker's grace (seen in
# tests/test_launch_matrix.py's raise_all cell, 1 run in 5 on two busy cores).
FATAL_SILENCE = 3


def _told_fatal(w: Any) -> bool:
    """``w``'s log showed an error a launcher's failure would follow (held or recorded)."""
    return bool(w.holds_crash) or any(e.kind in LAUNCHER_HELD for e in w.engine.state.errors)


class LauncherLog:
    """What the launcher said of its workers' ends, read from the combined log as it grows:
    ``failed`` pid -> exit status (negative: that signal), ``stopped`` pid -> the signal it
    sent. A non-parent cannot read a worker's exit status; the launcher, its parent, logs it."""

    def __init__(self, path: Path, start: int) -> None:
        self.path = path
        self.offset = start
        self._rest = b""
        self.failed: dict[int, int] = {}
        self.stopped: dict[int, int] = {}
        self.boxed: dict[int, int] = {}  # the failure box: the workers it stopped are there too
        self.ranks: dict[int, tuple[int, int]] = {}  # pid -> (rank, local rank), from the box
        self._box_rank: tuple[int, int] | None = None
        # The box's "Root Cause (first observed failure)": (rank, exit status) of that worker.
        self.root_cause: tuple[int, int] | None = None
        self._in_root = False
        # The pids of each failed attempt: the failure lines torchrun logs together on one poll,
        # a new attempt's after any other line (its new workers' output, its own log lines).
        self.attempts: list[set[int]] = []
        self._gap = False

    def restarts_used(self) -> int:
        """The failed attempts before the last one, whose workers the final failure box names:
        torchelastic restarts a failed group while it has restarts left and prints the box
        (``ChildFailedError``) only when none is left, so with a box these are the restarts it
        allowed, all used (0 while no box is read)."""
        if not self.boxed:
            return 0
        return sum(1 for pids in self.attempts if not pids & self.boxed.keys())

    def fate(self, pid: int) -> tuple[int | None, int | None]:
        """(exit status, stop signal the launcher sent): its failure line first, then a stop
        it logged (the box lists a stopped worker's -15 as a failure), then the box."""
        if pid in self.failed:
            return self.failed[pid], None
        if pid in self.stopped:
            return None, self.stopped[pid]
        return self.boxed.get(pid), None

    def read(self) -> None:
        """Blocking (the log may be on NFS): run it off the loop."""
        try:
            with open(self.path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                if size < self.offset:  # truncated
                    self.offset, self._rest = 0, b""
                if size - self.offset > _LAUNCHER_LOG_MAX:
                    self.offset, self._rest = size - _LAUNCHER_LOG_MAX, b""
                fh.seek(self.offset)
                data = fh.read(size - self.offset)
        except OSError:
            return
        self.offset += len(data)
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()[-4096:]
        for raw in lines:
            self.feed(raw)

    def feed(self, raw: bytes) -> None:
        """One line of the launcher's log (``analyze`` feeds a finished log's lines here)."""
        if b"Root Cause" in raw:
            self._in_root = True
            return
        if b"rank" in raw and (r := _BOX_RANK_RE.search(raw.decode("utf-8", "replace"))) is not None:
            self._box_rank = (int(r.group(1)), int(r.group(2)))
            return
        if b"exitcode" not in raw and b"closing signal" not in raw:
            self._gap = self._gap or bool(raw.strip())
            return
        text = raw.decode("utf-8", "replace")
        m = _FAILED_RE.search(text)
        if m is not None:
            self.failed[int(m.group(3))] = int(m.group(1))
            if self._gap or not self.attempts:
                self.attempts.append(set())
            self.attempts[-1].add(int(m.group(3)))
            self._gap = False
        b = _BOX_RE.search(text)
        if b is not None:
            self.boxed[int(b.group(2))] = int(b.group(1))
            if self._box_rank is not None:
                self.ranks[int(b.group(2))] = self._box_rank
                if self._in_root:
                    self.root_cause = (self._box_rank[0], int(b.group(1)))
            self._box_rank, self._in_root = None, False
        c = _CLOSING_RE.search(text)
        if c is not None:
            with contextlib.suppress(AttributeError):
                self.stopped[int(c.group(1))] = int(getattr(signal, c.group(2)))


class Fleet:
    """The rank workers of a launched launcher (``rankwatch run -- torchrun ...``).

    Each worker found under the launcher gets its own pipeline (watcher), with the rank, local
    rank and world size from its own environment, for the life of the run: a restarted worker
    (torchrun's ``--max-restarts``) is an event in it, after the old worker's end is judged.
    The agent is not a worker's parent, so its exit status comes from the launcher: torchrun
    logs each worker that failed (and each one it stopped) within its monitor interval, and
    lists them again in its failure box: a worker that ended with no such line after a few
    intervals (or by the launcher's own end) ended cleanly.
    """

    def __init__(
        self,
        agent: Any,
        cfg: Any,
        log_path: Any,
        root: int,
        stop_requested: list[Any],
        *,
        start: int = 0,
        cmd: list[str] | None = None,
        run_pipeline: Any = None,
        script: bool = False,
    ) -> None:
        self.agent = agent
        # ``root`` is a training script, not a launcher: the ranks it starts itself (Lightning's)
        # are its workers, and it is rank 0 of their world (``rank_workers``). No launcher logs
        # their ends: a worker's status is unknown to the agent, the script's own is its exit.
        self.script = script
        # The launcher's pid: ``root`` when the command is one; found in the tree when the command
        # runs it (``launched_by``), or None while none is seen.
        self.launcher_pid: int | None = None if script else root
        self.exit_status: dict[int, int] = {}  # pid -> status, of the workers that are our children
        self.cfg = cfg
        self.log_path = log_path
        self.root = root
        self.stop_requested = stop_requested
        self.by_rank: dict[int, Any] = {}
        self.tasks: list[Any] = []
        self._cls = _worker_watcher_class()
        self.launcher_log = LauncherLog(Path(log_path), start)
        self.start = start  # where this run's lines begin in the combined log
        # How long a worker's end may wait for the launcher's word on it: a few monitor intervals,
        # and a second for the log line to be written and read.
        self.grace = 1.0 + 10 * monitor_interval(cmd or [])
        self.restarts: dict[int, int] = {}
        self.run_pipeline = run_pipeline  # the run's own lines: a worker's unprefixed traceback
        self.attached_at: dict[int, float] = {}
        self.crashed: set[int | None] = set()  # ranks whose worker crashed (found held or not)
        # Workers judged clean because the launcher said nothing within the grace: pid -> its
        # pipeline. On a loaded node torchrun's word can come later; then it is judged again.
        self.presumed_clean: dict[int, Any] = {}
        # rank -> how many workers the launcher had named failed when this rank's worker began:
        # one named since then failed in this worker's attempt (``_failed_with_group``).
        self.failed_before: dict[int, int] = {}
        # torchelastic's own count, from its workers' environment: the attempt running now and
        # the restarts it allows (``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS``).
        self.restart_count = 0
        self.max_restarts: int | None = None
        if run_pipeline is not None:
            run_pipeline.on_progress = self.share_progress
            run_pipeline.worker_of = self.by_rank.get

    def _add(self, pid: int, env: dict[str, str], own: list[Path] | None = None, whole: bool = False) -> None:
        """``whole``: ``own`` holds both the worker's stdout and its stderr."""
        rank = env_int(env, RANK_VARS)
        if rank is None:
            return
        count = env_int(env, ("TORCHELASTIC_RESTART_COUNT",))
        self.restart_count = max(self.restart_count, count or 0)
        self.max_restarts = env_int(env, ("TORCHELASTIC_MAX_RESTARTS",)) or self.max_restarts
        w = self.by_rank.get(rank)
        if w is None:
            self.failed_before[rank] = len(self.launcher_log.failed)
        if w is not None:
            if w.prober is None or w.prober.pid != pid:
                # torchrun restarted it: the old worker's end first (its crash, with its traceback),
                # then the same pipeline goes on with the new process (startup grace again).
                if w.prober is not None and not w.exited:
                    self._judge(w, final=True)
                self.failed_before[rank] = len(self.launcher_log.failed)
                self.restarts[rank] = self.restarts.get(rank, 0) + 1
                log.info("launcher worker: rank %d restarted as pid %d", rank, pid)
                new = [p for p in own or [] if p not in w.own]
                if new:
                    # torchelastic gives each attempt a folder of its own (attempt_<n>): the new
                    # worker's output is there, and nothing more comes to the old files.
                    w.follow_instead(list(w.own), new)
                    w.own = frozenset(new)
                    w.whole = whole
                    w.bars_to = new[0] if whole and len(new) == 2 else None
                    log.info("launcher worker: rank %d now writes to %s", rank, ", ".join(map(str, new)))
                w.attach(pid)
                self.attached_at[rank] = time.time()
            return
        # Its identity is its own (issue 28): torchrun's run id (TORCHELASTIC_RUN_ID), world size
        # and local rank from its environment; the run name the user chose wins (run.name,
        # RANKWATCH_RUN). The run's own pipeline then carries the same run.
        ident = dataclasses.replace(
            identity_of_process(self.cfg.run, env, self.agent.identity),
            rank=rank,
            local_rank=env_int(env, LOCAL_RANK_VARS),
            world_size=env_int(env, WORLD_VARS) or self.agent.identity.world_size,
        )
        if self.run_pipeline is not None and self.run_pipeline.identity.run != ident.run:
            self.run_pipeline.identity = dataclasses.replace(self.run_pipeline.identity, run=ident.run)
        from rankwatch.runtime.watcher import Stream

        own = own or []
        w = self._cls(
            self.cfg,
            ident,
            [*own, self.log_path],
            emit=self.agent.emit,
            clock=self.agent.clock,
            from_end=True,
            start_at=self._combined_start(),
        )
        # A worker's own files are new with it: read from their start (the combined log from
        # its end: what is there is the run's and earlier workers'). Its log is its stdout file.
        for s in w.streams[: len(own)]:
            s.reader.close(w.log_io)  # made to be followed from their end: not read, closed
        w.streams[: len(own)] = [Stream(p, self.cfg, rank, False, ident.world_size) for p in own]
        w.own = frozenset(own)
        w.whole = whole and bool(own)
        w.bars_to = own[0] if w.whole and len(own) == 2 else None
        w.reads = rank
        w.attach(pid)
        self.attached_at[rank] = time.time()
        self.agent.adopt(w)
        self.by_rank[rank] = w
        self.tasks.append(asyncio.create_task(w.run(), name=f"rank-{rank}"))
        log.info("launcher worker: rank %d is pid %d", rank, pid)

    def _combined_start(self) -> int:
        """Where a new worker's pipeline starts in the combined log: the run's start, or at
        most ``_READ_BACK_MAX`` before what the run's pipeline has read. A rank's prefixed lines
        since the run began are its own (a restart keeps its pipeline), and a worker found
        after it printed (its first open comes on a thread, later still) loses none of them."""
        run = self.run_pipeline
        read = run.streams[-1].follower.position if run is not None and run.streams else 0
        return max(self.start, read - _READ_BACK_MAX)

    def share_progress(self, now: float, step: int) -> None:
        """The run's lines reached ``step``: progress for every worker with no step line of its
        own. Without ``--tee`` the workers' step lines carry no rank prefix and reach only the
        run's pipeline; the ranks of a synchronous job step together, so the run's step is each
        worker's, and a worker whose clock it keeps stalls as a stepping rank (at the run's last
        step, after its measured step interval), not after the silent-rank timeout."""
        for w in self.by_rank.values():
            if not w.exited and w.engine.state.step_count == 0:
                w.push(Progress(now, step))

    def _new_process(self, pid: int, env: dict[str, str]) -> bool:
        """``pid`` is a rank's first worker, or a restarted one (its own files may be new)."""
        w = self.by_rank.get(env_int(env, RANK_VARS))  # type: ignore[arg-type]
        return w is None or w.prober is None or w.prober.pid != pid

    def _judge(self, w: Any, *, final: bool = False) -> bool:
        """Report the end of ``w``'s process when its status is known; False while it waits for
        the launcher's word (``final``: no more waiting)."""
        s = w.last_sample
        pid = w.prober.pid if w.prober is not None else None
        code = s.exit_code if s is not None else None
        requested = bool(self.stop_requested)
        if code is None and pid is not None and self.script:
            code = self.exit_status.get(pid)
            if code is None and pid == self.root and not final:
                return False  # the script itself: its status comes with its end (``exit_status``)
            if code is None:
                waited = w.clock() - s.time if s is not None else self.grace
                if not final and waited < self.grace:
                    return False  # its traceback may still be on its way into the log
                self._catch_up(w)
                f = w.on_exit(None, None, requested=requested)
                self._note(w, f)
                return True
        if code is None and pid is not None:
            code, stop = self.launcher_log.fate(pid)
            if code is None and stop is not None:
                # The launcher stopped it, after another worker failed: not this worker's failure.
                self._catch_up(w)
                w.on_exit(None, stop, requested=stop, stopped_by="the launcher sent")
                return True
        if code is None:
            waited = w.clock() - s.time if s is not None else self.grace
            if not final and waited < self.grace:
                return False
            if pid is not None and self._failed_with_group(w):
                return True
            if not final and waited < FATAL_SILENCE * self.grace and _told_fatal(w):
                # Its log says it failed: the launcher's silence is taken for a clean end only
                # once its word on the attempt (another worker's ``failed`` line) is overdue.
                return False
            # The launcher, its parent, saw it end (it logs every failed worker within its monitor
            # interval, and the ones it stops) and said nothing: a clean exit.
            code = 0
            if pid is not None:
                self.presumed_clean[pid] = w
        self._catch_up(w)
        if code != 0 and not requested:
            self._lend_cause(w)
        if code < 0:
            f = w.on_exit(None, -code, requested=requested)
        else:
            f = w.on_exit(code, None, requested=requested)
        self._note(w, f)
        return True

    def _failed_with_group(self, w: Any) -> bool:
        """Judged here (True) when ``w`` ended unnamed in an attempt the launcher named another
        worker failed in, and its log holds a fatal error: it failed with that worker, status
        unknown. torchrun logs one ``failed (exitcode`` line per attempt, for the first failure
        of its poll (``_poll`` in torch/distributed/elastic/multiprocessing/api.py): workers
        that failed in the same poll (every rank's gloo connectFullMesh at a restart) get no
        line of their own, and its failure box comes only when it gives up. A worker that ended
        unnamed with no error in its log ended cleanly (a rank that left early), as before."""
        rank = w.rank
        if rank is None or len(self.launcher_log.failed) <= self.failed_before.get(rank, 0):
            return False
        requested = bool(self.stop_requested)
        self._catch_up(w)
        if not requested:
            self._lend_cause(w)
        if not any(e.kind in LAUNCHER_HELD for e in w.engine.state.errors):
            return False
        f = w.on_exit(None, None, requested=requested)
        self._note(w, f)
        return True

    def _catch_up(self, w: Any) -> None:
        """Before ``w``'s end is judged: the run's lines written so far, read. They carry the
        run's step to a worker that prints none (``share_progress``) and the traceback a worker
        printed without its prefix (``_lend_cause``); read on the run pipeline's own turn they
        could come after the end they explain."""
        run = self.run_pipeline
        if run is not None and run is not w and not run.exited:
            run.catch_up()
        if not w.tail and not w.own and w.streams and run is not w:
            # Nothing of its own read: a worker seen after it printed (a mistyped script's
            # "can't open file" on a loaded node) has its prefixed lines before where its
            # pipeline began reading the combined log.
            self._read_back(w)

    def _note(self, w: Any, f: Finding | None) -> None:
        if f is not None and died(f):
            self.crashed.add(w.rank)

    def _lend_cause(self, w: Any) -> None:
        """A failed worker with no error in its own lines: without ``--tee`` (and before
        ``init_process_group``) its traceback carries no rank prefix and went to the run's
        pipeline. The launcher names the worker that failed, so the latest such error printed
        since this worker started is its cause."""
        run = self.run_pipeline
        if run is None or w.rank is None:
            return
        since = self.attached_at.get(w.rank, 0.0) - 1.0
        if not w.tail and run.unprefixed:
            # Nothing with its prefix: its last lines are the run's since it started (never
            # "printed nothing" while the combined log holds its ``ERROR: ...`` line).
            w.tail.extend(lent_lines(run.unprefixed, since, w.rank))
        if w.engine.state.errors:
            return
        mine = [e for e in run.engine.state.errors if (e.time or 0.0) >= since and e.kind in LAUNCHER_HELD]
        mine = [e for e in mine if "torchelastic" not in e.summary]  # the launcher's own account
        if mine:
            w.engine.state.errors.append(dataclasses.replace(mine[-1], rank=w.rank))

    def _late_word(self) -> None:
        """A worker judged clean for the launcher's silence that its log now names failed (its
        ``failed (exitcode`` line or failure box came after the grace): its end is judged again."""
        for pid, w in list(self.presumed_clean.items()):
            code, _ = self.launcher_log.fate(pid)
            if code is None:
                continue
            del self.presumed_clean[pid]
            if code != 0 and w.prober is not None and w.prober.pid == pid:
                w.exited = False
                self._judge(w, final=True)

    def check(self) -> None:
        """Report workers that ended since the last look, once their status is known."""
        self._late_word()
        for w in self.by_rank.values():
            s = w.last_sample
            if s is not None and not s.alive and not w.exited:
                self._judge(w)

    async def _own_files(self, pid: int) -> tuple[list[Path], bool]:
        """A worker's own output files, and whether they hold all it writes: torchrun's
        ``--redirects 3 --log-dir D`` sends each worker's stdout and stderr to files of its own
        (``D/<run>/attempt_<n>/<local rank>/``); ``--tee 3`` copies them to the combined log too."""
        try:
            files, both = await offloop.proc(
                output_targets,
                pid,
                name="rankwatch-proc-workers",
                errors=self.agent.internal_errors_by_component,
            )
        except asyncio.TimeoutError:
            return [], False
        combined = os.path.realpath(self.log_path)
        own = [f for f in files if os.path.realpath(f) != combined]
        return own, both and len(own) == len(files)

    async def _read_launcher_log(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await offloop.proc(
                self.launcher_log.read,
                name="rankwatch-proc-launcher-log",
                errors=self.agent.internal_errors_by_component,
            )

    async def run(self, stop: Any) -> None:
        interval = max(0.25, float(self.cfg.process.sample_interval))
        while not stop.is_set():
            # A command that is no launcher itself may run one (a wrapper script, ``bash -c
            # 'torchrun ...'``, or exec into it): looked for until found or the script starts ranks.
            look = self.script and not self.by_rank
            try:
                launcher, found = await offloop.proc(
                    functools.partial(survey, script=self.script, look=look),
                    self.root,
                    name="rankwatch-proc-workers",
                    errors=self.agent.internal_errors_by_component,
                )
            except asyncio.TimeoutError:
                launcher, found = None, []  # a process in D state (logged and counted by offloop)
            if launcher is not None:
                self.launched_by(*launcher)
            if not self.script:
                await self._read_launcher_log()
            elif found and not self.by_rank:
                self._script_started_ranks()
            for pid, env in found:
                own, whole = await self._own_files(pid) if self._new_process(pid, env) else ([], False)
                self._add(pid, env, own, whole)
            self.check()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    def launched_by(self, pid: int, cmd: list[str]) -> None:
        """The job's launcher is ``pid`` (``cmd`` its command line), found in the process tree:
        from now on the job is read as under ``rankwatch run -- torchrun``: its workers each a
        pipeline of their own with the identity from their environment, the combined log split
        by rank, the launcher's account of their ends used. The run's pipeline reads the lines
        with no rank prefix and holds their failures for the workers; the command's own exit
        (a wrapper's ``exit 0`` after torchrun failed) is never taken for a worker's."""
        self.script, self.launcher_pid = False, pid
        self.grace = 1.0 + 10 * monitor_interval(cmd)
        run = self.run_pipeline
        if run is not None:
            run.everything, run.launcher = False, True
            run.prober = None  # the workers' processes are watched, each by its own pipeline
        what = " ".join(cmd)[:200]
        log.info("the job's launcher is pid %d (%s): its workers get a pipeline each", pid, what)

    def launcher_status(self) -> int | None:
        """The launcher's exit status: ours to read when it is our child; else its failure box
        says it failed (torchrun raises ChildFailedError: status 1), and None when unknown."""
        rc = self.exit_status.get(self.launcher_pid if self.launcher_pid is not None else self.root)
        if rc is None and self.launcher_log.root_cause is not None:
            return 1
        return rc

    def _script_started_ranks(self) -> None:
        """The script started ranks of its own: its pipeline becomes the run's (the lines with
        no rank prefix, as a launcher's), and the script's process is rank 0's, a worker."""
        run = self.run_pipeline
        if run is None:
            return
        run.everything, run.launcher = False, True
        run.prober = None  # rank 0's pipeline watches the process now
        log.info("the command started ranks of its own (Lightning): each gets its own pipeline")

    def _unseen(self) -> None:
        """Workers the launcher's failure box names that ended before a look found them (a rank
        that dies within its first moments on a busy node): each gets its pipeline now, so its
        end is reported on its rank, not as the launcher's unexplained exit."""
        log_ = self.launcher_log
        seen = {w.prober.pid for w in self.by_rank.values() if w.prober is not None}
        for pid, (rank, local) in log_.ranks.items():
            if pid in seen or rank in self.by_rank or log_.boxed.get(pid, 0) == 0:
                continue
            if len(self.by_rank) >= MAX_UNSEEN + len(seen):
                break
            self._add(pid, {"RANK": str(rank), "LOCAL_RANK": str(local)})
            log.info("launcher worker: rank %d (pid %d) ended before it was seen", rank, pid)
            w = self.by_rank.get(rank)
            if w is not None:
                self._read_back(w)

    def _read_back(self, w: Any) -> None:
        """A worker seen only in the launcher's box printed its lines before its pipeline began
        reading the combined log at its end (CPython's "can't open file" of a mistyped script,
        an ImportError): they are read back from the run's start, its own by their prefix."""
        stream = w.streams[-1]  # the combined log: a worker seen late has no files of its own
        fol = stream.follower
        with stream.reader.owned(w._drain_wait()) as mine:
            end = fol.position
            lines = fol.read_back_lines(max(self.start, end - _READ_BACK_MAX), end) if mine else []
        if lines:
            w.feed_lines(stream, lines)

    async def close(self) -> bool:
        """Every worker's end reported, the launcher's last words read; True when one crashed."""
        if not self.script:
            await self._read_launcher_log()
        self._late_word()
        self._unseen()
        for w in self.by_rank.values():
            w.stop()
        for t in self.tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 5.0)
        crashed = False
        for w in self.by_rank.values():
            if not w.exited:
                self._judge(w, final=True)
            crashed = crashed or w.rank in self.crashed
            crashed = crashed or any(died(f) and f.rank == w.rank for f in self.agent.findings)
        self._gave_up()
        for w in self.by_rank.values():
            w.close()
        return crashed

    def _gave_up(self) -> None:
        """The launcher failed with its restarts used up (torchelastic's own count): the job is
        dead. Told once, naming the root cause its failure box gives."""
        from rankwatch.detectors.crash import pick_cause
        from rankwatch.detectors.exit import restarts_exhausted

        rc = self.launcher_status()
        if self.script or not rc or self.stop_requested or not self.max_restarts:
            return
        if self.restart_count < self.max_restarts:
            return  # it ended for another reason (a rendezvous closed, its own error)
        root = self.launcher_log.root_cause
        w = self.by_rank.get(root[0]) if root is not None else None
        cause = pick_cause(w.engine.state)[0] if w is not None else None
        f = restarts_exhausted(
            restarts=self.restart_count,
            max_restarts=self.max_restarts,
            status=rc,
            root_rank=root[0] if root is not None else None,
            root_step=w.engine.state.last_step if w is not None else None,
            cause=cause.summary if cause is not None else None,
            time=time.time(),
        )
        emitter = w if w is not None else self.run_pipeline
        (emitter.emit if emitter is not None else self.agent.emit)(f)


def died(f: Finding) -> bool:
    """A worker's end that is a death: a crash, or the end of one whose fatal error was told
    already (detectors/exit.py: one finding per death)."""
    return f.kind == "crash" or bool(f.evidence.get("cause_reported"))


def last_lines(path: Path, start: int, n: int) -> list[str]:
    """The last ``n`` lines written to ``path`` since ``start`` (a launcher's crash evidence)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(start, size - 64 * 1024))
            data = fh.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-n:]
