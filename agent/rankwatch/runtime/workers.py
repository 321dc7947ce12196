"""The processes of a launched job: the workers a launcher starts, and what is left when it ends.

``rankwatch run`` starts its command in a new session. Everything the job forks stays in that
session unless it calls ``setsid`` itself: DataLoader workers, a launcher's ranks and their
workers. When the command ends (a stop, a crash, or a clean exit) nothing of it may outlive it:
a DataLoader worker blocked in ``__getitem__`` has no reason to notice its parent died, and an
orphan holding a GPU blocks the next job. So the whole session goes, not only the process
group, and the descendants seen while it ran go too (one that left the session).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterable

import psutil

log = logging.getLogger("rankwatch.run")

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


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


def reap(tree: Tree, grace: float = 1.0) -> list[int]:
    """End what is left of the job once its command has exited: SIGTERM, then SIGKILL after
    ``grace`` seconds. Blocking (run it in a thread); returns the pids that had to be ended."""
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
