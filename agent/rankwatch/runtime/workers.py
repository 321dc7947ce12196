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
import itertools
import logging
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from rankwatch import offloop

log = logging.getLogger("rankwatch.run")

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
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
        try:
            kids = psutil.Process(self.root).children(recursive=True)
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


def rank_workers(root: int) -> list[tuple[int, dict[str, str]]]:
    """The rank processes under a launcher (``torchrun``): descendants with a RANK in their
    environment whose parent has none (a rank's own DataLoader workers inherit its RANK)."""
    try:
        kids = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    envs: dict[int, dict[str, str]] = {}
    for k in kids:
        with contextlib.suppress(psutil.Error):
            envs[k.pid] = k.environ()
    out: list[tuple[int, dict[str, str]]] = []
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

LAUNCHER_NAMES = frozenset({"torchrun", "deepspeed", "accelerate"})
LAUNCHER_MODULES = frozenset(
    {"torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.runner"}
)


def is_launcher(cmd: list[str]) -> bool:
    """``torchrun ...``, ``python -m torch.distributed.run ...``: the ranks are its children."""
    if not cmd:
        return False
    if os.path.basename(cmd[0]) in LAUNCHER_NAMES:
        return True
    return any(a == "-m" and b in LAUNCHER_MODULES for a, b in itertools.pairwise(cmd))


def _worker_watcher_class() -> type:
    from rankwatch.runtime.watcher import RankWatcher
    from rankwatch.sources.decorations import strip

    class WorkerWatcher(RankWatcher):
        """One rank of a launcher: its own stall clock, process and dump file. It follows the
        launcher's log but reads only its own lines (torchrun's ``[rankN]:`` prefixes, from
        ``--tee 3``); without prefixes it is judged as a rank that prints no steps."""

        def feed_lines(self, stream, batch):  # type: ignore[no-untyped-def]
            mine = [fl for fl in batch if fl.cut or strip(fl.text)[1] == self.rank]
            if mine:
                super().feed_lines(stream, mine)

    return WorkerWatcher


class Fleet:
    """The rank workers of a launched launcher (``rankwatch run -- torchrun ...``).

    Each worker found under the launcher gets its own watcher, with the rank, local rank and
    world size from its own environment; a restarted worker (torchrun's ``--max-restarts``) is
    attached to its rank's watcher again. A worker that ends is reported by its watcher: as a
    stop when one was asked for, else as a crash with its lines of the log as evidence.
    """

    def __init__(self, agent: Any, cfg: Any, log_path: Any, root: int, stop_requested: list[Any]) -> None:
        self.agent = agent
        self.cfg = cfg
        self.log_path = log_path
        self.root = root
        self.stop_requested = stop_requested
        self.by_rank: dict[int, Any] = {}
        self.tasks: list[Any] = []
        self._cls = _worker_watcher_class()

    def _add(self, pid: int, env: dict[str, str]) -> None:
        rank = env_int(env, RANK_VARS)
        if rank is None:
            return
        w = self.by_rank.get(rank)
        if w is not None:
            if w.prober is None or w.prober.pid != pid:
                w.attach(pid)  # torchrun restarted it: same state and labels, startup grace again
            return
        ident = dataclasses.replace(
            self.agent.identity,
            rank=rank,
            local_rank=env_int(env, LOCAL_RANK_VARS),
            world_size=env_int(env, WORLD_VARS) or self.agent.identity.world_size,
        )
        w = self._cls(
            self.cfg, ident, [self.log_path], emit=self.agent.emit, clock=self.agent.clock, from_end=True
        )
        w.attach(pid)
        self.agent.watchers.append(w)
        self.by_rank[rank] = w
        self.tasks.append(asyncio.create_task(w.run(), name=f"rank-{rank}"))
        log.info("launcher worker: rank %d is pid %d", rank, pid)

    def check(self) -> None:
        """Report workers that ended since the last look."""
        for w in self.by_rank.values():
            s = w.last_sample
            if s is not None and not s.alive and not w.exited:
                w.on_exit(s.exit_code, None, requested=bool(self.stop_requested))

    async def run(self, stop: Any) -> None:
        interval = max(0.25, float(self.cfg.process.sample_interval))
        while not stop.is_set():
            try:
                found = await offloop.proc(
                    rank_workers,
                    self.root,
                    name="rankwatch-proc-workers",
                    errors=self.agent.internal_errors_by_component,
                )
            except asyncio.TimeoutError:
                found = []  # a process in D state (logged and counted by offloop): next period
            for pid, env in found:
                self._add(pid, env)
            self.check()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def close(self) -> bool:
        """Every worker's end reported; True when one of them crashed."""
        for w in self.by_rank.values():
            w.stop()
        for t in self.tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 5.0)
        crashed = False
        for w in self.by_rank.values():
            if not w.exited:
                s = w.last_sample
                w.on_exit(s.exit_code if s is not None else None, None, requested=bool(self.stop_requested))
            crashed = crashed or any(f.kind == "crash" and f.rank == w.rank for f in self.agent.findings)
            w.close()
        return crashed


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
