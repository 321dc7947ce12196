"""Sampling the watched process tree with psutil.

Blocking code: the agent runs ``ProcessProber.sample`` in a thread. A training process
can vanish, turn into a zombie or belong to another user at any moment, so every psutil
call is guarded and a sample degrades to ``alive=False`` or partial data instead of
raising. CPU time includes the reaped children's share (``children_user``/
``children_system``), so DataLoader workers that exit do not make the counter drop.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psutil

from rankwatch.events import ProcessSample

__all__ = ["ProcessProber", "ProcessSample", "descendants", "find_processes", "memory_headroom", "state_name"]

_T = TypeVar("_T")
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, ProcessLookupError, OSError)

_Z = psutil.STATUS_ZOMBIE
_STATES = {
    psutil.STATUS_RUNNING: "running",
    psutil.STATUS_SLEEPING: "sleeping",
    psutil.STATUS_DISK_SLEEP: "disk-wait",
    psutil.STATUS_STOPPED: "stopped",
    psutil.STATUS_ZOMBIE: "zombie",
    psutil.STATUS_DEAD: "dead",
}


def state_name(psutil_status: str) -> str:
    """psutil's status in the agent's words; unknown statuses pass through unchanged.

    ``tracing-stop`` stays as it is on purpose: py-spy pauses its target with ptrace
    while dumping, and that must not read as a SIGSTOP.
    """
    return _STATES.get(psutil_status, psutil_status)


def _safe(fn: Callable[[], _T], default: _T) -> _T:
    try:
        return fn()
    except _GONE:
        return default


def _rss(p: psutil.Process) -> int:
    return int(p.memory_info().rss)


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)


TREE_RESCAN = 10
# The local ends of a rank's TCP sockets (its gloo pairs, listening or connected; rank 0's c10d
# store): a peer's gloo error names the remote end it lost (``Connection closed by peer
# [10.0.0.2]:41632``), and these say which rank that was once it is gone. Read every LISTEN_EARLY
# samples for the first EARLY_SAMPLES (a job connects its process groups at start), then every
# LISTEN_RESCAN (a read walks the process's fds and the namespace's TCP table); at most
# MAX_ADDRESSES kept, the first ones (the default process group's).
LISTEN_RESCAN = 40
LISTEN_EARLY = 4
EARLY_SAMPLES = 600
MAX_ADDRESSES = 256
CGROUP_ROOT = "/sys/fs/cgroup"
_CGROUP_DEPTH = 16


def started_at(pid: int, proc: str = "/proc") -> float | None:
    """Wall-clock time ``pid`` started, to the clock tick: ``starttime`` in its ``stat`` is in
    ticks since boot, and ``/proc/uptime`` says how long ago that was. (psutil's
    ``create_time`` adds the boot time in whole seconds, up to a second early.) None when the
    process is gone or its ``stat`` is unreadable."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            stat = fh.read(4096)
        with open(f"{proc}/uptime", "rb") as fh:
            uptime = float(fh.read(64).split()[0])
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])  # field 22, after comm and state
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _read_int(path: str) -> int | None:
    """An integer file of cgroupfs; None for "max", absent or unreadable."""
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def _inactive_file(path: str, key: str) -> int:
    """Page cache the kernel drops before it OOM-kills (memory.stat ``inactive_file``)."""
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + " "):
                    return int(line.split()[1])
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        pass
    return 0


def memory_headroom(pid: int, root: str = CGROUP_ROOT) -> tuple[int | None, int | None]:
    """(limit, available) bytes for ``pid`` before the OOM killer: its memory cgroup's and
    their ancestors' limits (the tightest headroom wins; a Slurm job's limit sits on a parent
    of the step's cgroup), else the host's RAM and available memory. (None, None) when unknown."""
    vm = _safe(psutil.virtual_memory, None)
    limit: int | None = vm.total if vm is not None else None
    avail: int | None = vm.available if vm is not None else None
    v2 = v1 = None
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii") as fh:
            for ln in fh:
                parts = ln.strip().split(":", 2)
                if len(parts) == 3 and parts[0] == "0" and not parts[1]:
                    v2 = parts[2]
                elif len(parts) == 3 and "memory" in parts[1].split(","):
                    v1 = parts[2]
    except (OSError, UnicodeDecodeError):
        pass
    if v1 is not None:
        top, rel = os.path.join(root, "memory"), v1
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    elif v2 is not None:
        top, rel = root, v2
        files = ("memory.max", "memory.current", "inactive_file")
    else:
        return limit, avail
    path = os.path.normpath(os.path.join(top, rel.lstrip("/")))
    for _ in range(_CGROUP_DEPTH):
        if not path.startswith(top):
            break
        cap = _read_int(os.path.join(path, files[0]))
        if cap is not None and (limit is None or cap < limit):  # v1 says "no limit" with a huge number
            used = _read_int(os.path.join(path, files[1])) or 0
            free = max(0, cap - used + _inactive_file(os.path.join(path, "memory.stat"), files[2]))
            if avail is None or free < avail:
                limit, avail = cap, free
        if path == top:
            break
        path = os.path.dirname(path)
    return limit, avail


class PidTable:
    """Parent of every process on the node, read from /proc a little at a time.

    psutil's ``children(recursive=True)`` reads /proc/<pid>/stat of every process on the node
    at each call (~3 ms for 100 processes, more on a busy node); run mode asked for it every
    5 s to remember the job's descendants and every 10th process sample. Here a walk lists
    /proc (one directory read) and reads the stat of only the pids it has not seen and of the
    last tree's members: a process that is not a descendant of the root cannot become one
    (the kernel re-parents an orphan to init or to a subreaper above it, never sideways), so
    its parent need not be read again while its pid stays listed. A pid that left the listing
    and came back is read again like a new one; one that ended and was handed out again between
    two walks (the kernel hands pids out in turn, so ``pid_max`` forks in between) is caught
    by a full read every ``FULL_READ_S`` seconds (by the clock, not by walks: the walkers'
    cadences add up, run mode's worker search alone walks at every process sample). What a
    walk returns is what psutil's returns for the same /proc: the same re-parenting, the same
    children older than their parent dropped. One table per agent, shared by every walk (each
    rank's prober, the job's tree, the worker search), behind a lock: the walks run on
    offloop threads.
    """

    FULL_READ_S = 60.0

    def __init__(self, proc: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc
        self.stat_reads = 0  # for tests and benchmarks: /proc/<pid>/stat files read
        self._clock = clock
        self._full_read_at = clock() + self.FULL_READ_S  # the first walk reads everything anyway
        self._ppid: dict[int, int] = {}
        self._trees: dict[int, set[int]] = {}  # root -> its last walk's members, re-read each walk
        self._lock = threading.Lock()

    def _read_ppid(self, pid: int) -> int | None:
        self.stat_reads += 1
        try:
            with open(f"{self.proc}/{pid}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        # comm may hold spaces and parentheses: the fields after the last ")" are fixed.
        fields = data[data.rfind(b")") + 2 :].split(None, 2)
        try:
            return int(fields[1])
        except (IndexError, ValueError):
            return None

    def walk(self, root: int, admit: Callable[[int], bool] = lambda pid: True) -> list[int] | None:
        """Pids below ``root``, parents before children; a pid ``admit`` refuses is left out
        with what lies below it. None when /proc cannot be listed."""
        with self._lock:
            try:
                listed = {int(n) for n in os.listdir(self.proc) if n.isdigit()}
            except OSError:
                return None
            now = self._clock()
            if now >= self._full_read_at:
                self._ppid.clear()
                self._full_read_at = now + self.FULL_READ_S
            ppid = self._ppid
            for gone in ppid.keys() - listed:
                del ppid[gone]
            for r in [r for r in self._trees if r not in listed]:
                del self._trees[r]
            again = set().union(*self._trees.values()) & listed if self._trees else set()
            for pid in (listed - ppid.keys()) | again:
                parent = self._read_ppid(pid)
                if parent is None:
                    ppid.pop(pid, None)
                else:
                    ppid[pid] = parent
            kids: dict[int, list[int]] = {}
            for pid, parent in ppid.items():
                kids.setdefault(parent, []).append(pid)
            out: list[int] = []
            seen = {root}
            stack = [root]
            while stack:
                for k in kids.get(stack.pop(), ()):
                    if k not in seen:
                        seen.add(k)
                        if admit(k):
                            out.append(k)
                            stack.append(k)
            if root in listed:
                self._trees[root] = set(out)
            return out


_TABLE = PidTable()


def descendants(p: psutil.Process, table: PidTable | None = None) -> list[psutil.Process]:
    """What ``p.children(recursive=True)`` returns, from the agent's shared ``PidTable``
    (psutil's own walk where /proc cannot be listed)."""
    born = p.create_time()
    found: dict[int, psutil.Process] = {}

    def admit(pid: int) -> bool:
        try:
            child = psutil.Process(pid)
            if born <= child.create_time():  # older than its parent: a reused pid (as psutil)
                found[pid] = child
                return True
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
        return False

    pids = (table or _TABLE).walk(p.pid, admit)
    if pids is None:
        return p.children(recursive=True)
    return [found[pid] for pid in pids]


class ProcessProber:
    """Samples one process and its descendants; remembers enough to compute CPU %.

    ``returncode`` is for our own child: a callable that reads its exit status without
    reaping it (``lambda: proc.returncode`` of an asyncio process, or ``Popen.poll``
    when nothing else waits for it).
    """

    def __init__(
        self,
        pid: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        returncode: Callable[[], int | None] | None = None,
    ) -> None:
        self.pid = pid
        self.clock = clock
        self.returncode = returncode
        self._proc: psutil.Process | None = _safe(lambda: psutil.Process(pid), None)
        self._cmdline: list[str] = []
        self._last_cpu = 0.0
        self._last_time = clock()
        self._kids: list[psutil.Process] = []
        self._samples = 0
        self.addresses: tuple[str, ...] = ()  # "host:port" of its sockets' local ends, kept after it died
        # When this process (this incarnation of the rank) started, wall clock: records of the run
        # dated before it are an earlier job's or attempt's (runtime/diagnose.py).
        self.started: float | None = started_at(pid)
        if self._proc is not None:
            self._cmdline = _safe(self._proc.cmdline, [])
            self._kids = self._descendants(self._proc)
            self._last_cpu = self._tree_cpu(self._proc, self._kids)

    @staticmethod
    def _descendants(p: psutil.Process) -> list[psutil.Process]:
        return _safe(lambda: descendants(p), [])

    def _tree(self, p: psutil.Process) -> list[psutil.Process]:
        """Descendants, re-walked every ``TREE_RESCAN`` samples: a walk lists /proc and reads
        the stat of the processes new since the last one (``PidTable``), the costliest thing a
        sample does. In between the known ones are reused (a new data-loader worker shows up
        within a rescan)."""
        if self._samples % TREE_RESCAN == 0:
            self._kids = self._descendants(p)
        else:
            self._kids = [k for k in self._kids if _safe(k.is_running, False)]
        self._samples += 1
        return self._kids

    @staticmethod
    def _tree_cpu(p: psutil.Process, kids: list[psutil.Process]) -> float:
        return sum(_safe(functools.partial(_cpu, q), 0.0) for q in [p, *kids])

    def _exit_code(self) -> int | None:
        if self.returncode is None:
            return None
        try:
            return self.returncode()
        except Exception:
            return None

    def _dead(self, now: float, state: str) -> ProcessSample:
        self._last_time = now
        return ProcessSample(
            time=now,
            pid=self.pid,
            alive=False,
            exit_code=self._exit_code(),
            cpu_time_s=self._last_cpu,
            state=state,
            cmdline=list(self._cmdline),
        )

    def sample(self) -> ProcessSample:
        now = self.clock()
        p = self._proc
        if p is None or not _safe(p.is_running, False):
            return self._dead(now, "dead")
        status = _safe(p.status, psutil.STATUS_DEAD)
        if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return self._dead(now, state_name(status))
        if self._samples % (LISTEN_EARLY if self._samples < EARLY_SAMPLES else LISTEN_RESCAN) == 1:
            self._addresses(p)
        kids = [k for k in self._tree(p) if _safe(k.status, _Z) != _Z]
        cpu = self._tree_cpu(p, kids)
        dt = now - self._last_time
        pct = max(0.0, cpu - self._last_cpu) / dt * 100.0 if dt > 0 else 0.0
        self._last_cpu, self._last_time = cpu, now
        rss = threads = 0
        for q in [p, *kids]:
            rss += _safe(functools.partial(_rss, q), 0)
            threads += _safe(q.num_threads, 0)
        if not self._cmdline:
            self._cmdline = _safe(p.cmdline, [])
        limit, avail = memory_headroom(self.pid)
        return ProcessSample(
            time=now,
            pid=self.pid,
            alive=True,
            exit_code=None,
            cpu_time_s=cpu,
            cpu_percent=pct,
            rss_bytes=rss,
            threads=threads,
            state=state_name(status),
            children=len(kids),
            cmdline=list(self._cmdline),
            memory_limit_bytes=limit,
            memory_available_bytes=avail,
        )

    def _addresses(self, p: psutil.Process) -> None:
        if len(self.addresses) >= MAX_ADDRESSES:
            return
        read = getattr(p, "net_connections", None) or p.connections  # psutil < 6
        none: list[Any] = []
        conns: list[Any] = _safe(lambda: list(read(kind="tcp")), none)
        found = [
            f"{c.laddr.ip}:{c.laddr.port}"
            for c in conns
            if c.laddr and c.status in (psutil.CONN_LISTEN, psutil.CONN_ESTABLISHED)
        ]
        self.addresses = tuple(dict.fromkeys([*self.addresses, *found]))[:MAX_ADDRESSES]

    def pids(self) -> list[int]:
        """The process and its live descendants, e.g. for py-spy."""
        p = self._proc
        if p is None or not _safe(p.is_running, False):
            return []
        return [self.pid, *(k.pid for k in self._descendants(p))]

    def known_pids(self) -> list[int]:
        """The process and the descendants the last sample knew (``TREE_RESCAN``): what a
        periodic caller asks for, as a fresh walk reads /proc/*/stat of every process on the
        node. ``pids`` walks anew, for a dump that must not miss a worker started since."""
        p = self._proc
        if p is None or not _safe(p.is_running, False):
            return []
        return [self.pid, *(k.pid for k in self._kids)]


def _ancestors(pid: int) -> set[int]:
    out = {pid}
    p = _safe(lambda: psutil.Process(pid), None)
    if p is not None:
        none: list[psutil.Process] = []
        out.update(q.pid for q in _safe(p.parents, none))
    return out


def find_processes(pattern: str, *, exclude_self: bool = True) -> list[int]:
    """PIDs whose space-joined cmdline matches ``pattern`` (``re.search``).

    The agent's own command line names the pattern (``--match train.py``), and so may
    the shell or ``srun`` that started it: the agent and its ancestors never match.
    A malformed pattern raises ``re.error``.
    """
    rx = re.compile(pattern)
    skip = _ancestors(os.getpid()) if exclude_self else set()
    found: list[int] = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        info = p.info
        pid = info.get("pid")
        cmd = info.get("cmdline") or []
        if pid is None or pid in skip or not cmd:
            continue
        if rx.search(" ".join(cmd)):
            found.append(pid)
    return sorted(found)
