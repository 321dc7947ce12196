"""`rankwatch run` (launch the rank) and `rankwatch watch` (attach as a sidecar).

In run mode the child writes straight into a log file that the agent follows: there is
no pipe between them, so a crash or SIGKILL of the agent never blocks or kills the child
and the file always holds all of its output.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import functools
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import psutil

from rankwatch import offloop, safeio, slurm
from rankwatch.config.schema import Config
from rankwatch.dumps.ptrace import tracer_preexec
from rankwatch.identity import RANK_VARS, Identity, identity_of_process
from rankwatch.runtime import lifecycle, sharedlog, workers
from rankwatch.runtime.agent import Agent, Sink
from rankwatch.runtime.echo import Echo
from rankwatch.runtime.services import Services
from rankwatch.runtime.signals import deliver, ended_by, on_signal
from rankwatch.runtime.stdio import StderrGuard
from rankwatch.runtime.watcher import RankWatcher
from rankwatch.sources.logfiles import LogPlace, log_identity, places_of
from rankwatch.sources.process import ProcessProber, find_processes, started_at

log = logging.getLogger("rankwatch.run")

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2)
# Forwarded, they ask the command to end (SIGINT, SIGHUP, SIGQUIT to its whole process group,
# as a terminal sends them: runtime/signals.py).
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# How a child ends when asked to stop: killed by the signal, or exiting with 128+N itself.
STOP_STATUSES = frozenset({-s for s in STOPS} | {128 + s for s in STOPS})
# Run ids a node daemon remembers the users of (a node runs a few jobs at a time; the ids come
# and go): the oldest is forgotten past this.
MAX_RUNS = 4096


def default_log_dir(run: str, env: dict[str, str] | None = None) -> Path:
    """``runner.log_dir`` when unset: ``$XDG_STATE_HOME/rankwatch/logs/<run>`` (else
    ``~/.local/state/...``), where the XDG spec keeps logs, one folder per run, never a new
    ``./rankwatch-logs`` in whatever folder the job happens to start in."""
    env = dict(os.environ) if env is None else env
    state = env.get("XDG_STATE_HOME", "")
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    name = re.sub(r"[^A-Za-z0-9._-]", "_", run)[:128].lstrip(".") or "default"
    return base / "rankwatch" / "logs" / name


def child_log_path(cfg: Config, identity: Identity) -> Path:
    if cfg.runner.log_file:
        return Path(cfg.runner.log_file)
    rank = identity.rank if identity.rank is not None else 0
    folder = Path(cfg.runner.log_dir) if cfg.runner.log_dir else default_log_dir(identity.run)
    return folder / f"rank-{rank}.log"


# O_NOFOLLOW: a symlink put at the log's name (a shared runner.log_dir) must not make the agent
# append the job's output to a file the link names; O_NONBLOCK: a FIFO put there fails the open
# instead of hanging it (and is refused as no regular file).
_LOG_FLAGS = (
    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
)


class _Taken(Exception):
    """Another live job writes this log: its agent (or the child it gave the file to) holds it."""


def _claim(path: Path) -> BinaryIO:
    """``path`` opened for appending and held: an exclusive ``flock`` on the file, which the
    child inherits with its stdout (the lock belongs to the open file, so it lasts while any of
    the job's processes or the agent still hold it). Two jobs on one host with the same run name
    would otherwise append to one file and each read and echo the other's lines as its own."""
    try:
        fd = os.open(path, _LOG_FLAGS, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise safeio.Refused(path, "is a symlink, not a regular file") from None
        if e.errno == errno.ENXIO:
            raise safeio.Refused(path, "is a FIFO, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise safeio.Refused(path, f"is {safeio.kind_of(st.st_mode)}, not a regular file")
        if st.st_uid != os.geteuid():
            raise safeio.Refused(path, f"is owned by uid {st.st_uid}, not uid {os.geteuid()}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _Taken(path) from None
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


def _other_name(path: Path) -> Path:
    """The log's name when another job holds the usual one: the agent's pid before the suffix
    (``rank-0.4242.log``), which still names its rank for ``analyze``."""
    return path.with_name(f"{path.stem}.{os.getpid()}{path.suffix}")


def open_child_log(path: Path) -> tuple[BinaryIO | None, Path]:
    """The child's output file, opened for appending and held by this job alone (``_claim``):
    when another job on the host holds ``path``, the same name with this agent's pid in it.
    A folder the agent cannot write (a read-only home, a typo in runner.log_dir) must not keep
    the trainer from starting: the output then goes to a private temporary folder (0700), said
    on stderr. When even that fails, (None, path): the child inherits the agent's stdout and
    only its process is watched."""
    why = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = f"{e.filename or path}: {e.strerror or e}"
    if not why:
        for i, name in enumerate((path, _other_name(path))):
            try:
                fh = _claim(name)
            except _Taken:
                why = f"{name} is written by another running job"
                if i == 0:
                    continue
                break
            except OSError as e:
                why = str(e) if isinstance(e, safeio.Refused) else f"{e.filename or name}: {e.strerror or e}"
                if i == 0 and isinstance(e, safeio.Refused):
                    continue
                break
            if i:
                print(f"rankwatch: {why}: this job's output goes to {name}", file=sys.stderr)
            return fh, name
    try:
        fallback = Path(tempfile.mkdtemp(prefix="rankwatch-logs-")) / path.name
        fh = open(fallback, "ab")  # noqa: SIM115 - the caller holds it for the child
    except OSError as e:
        print(
            f"rankwatch: cannot write the child's log ({why}; {e.strerror or e} in the temporary folder "
            "too): starting it with its output on this terminal, its log unread",
            file=sys.stderr,
        )
        return None, path
    print(f"rankwatch: cannot write the child's log ({why}): its output goes to {fallback}", file=sys.stderr)
    return fh, fallback


# PyTorch reads the TORCH_NCCL_* names (ProcessGroupNCCL); newer builds and other backends the
# TORCH_FR_* ones. The pipe exists only while the trace buffer is on.
_PIPE_VARS = ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DEBUG_INFO_PIPE_FILE")
_TRACE_VARS = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")
_BUFFER_VARS = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
FR_BUFFER_ENTRIES = "2000"


def fr_state_dir() -> Path:
    """Where run mode puts the flight recorder's pipe and trace; removed when the child is done."""
    return Path(tempfile.gettempdir()) / f"rankwatch-{os.getpid()}"


def child_env(
    cfg: Config, identity: Identity, base: dict[str, str] | None = None
) -> tuple[dict[str, str], tuple[str, str] | None]:
    env = dict(os.environ if base is None else base)
    if cfg.runner.unbuffered:
        env.setdefault("PYTHONUNBUFFERED", "1")
    fr: tuple[str, str] | None = None
    if cfg.dumps.flight_recorder:
        pipe = next((env[v] for v in _PIPE_VARS if env.get(v)), "")
        trace = next((env[v] for v in _TRACE_VARS if env.get(v)), "")
        if not pipe:
            state = fr_state_dir()
            state.mkdir(parents=True, exist_ok=True)
            pipe, trace = str(state / "fr_pipe_rank_"), trace or str(state / "fr_trace_rank_")
            for v in _PIPE_VARS:
                env[v] = pipe
            for v in _TRACE_VARS:
                env.setdefault(v, trace)
            size = next((env[v] for v in _BUFFER_VARS if env.get(v)), FR_BUFFER_ENTRIES)
            for v in _BUFFER_VARS:
                env.setdefault(v, size)
        fr = (pipe, trace or "/tmp/nccl_trace_rank_")
    return env, fr


def _stdout_echo(path: Path, start: int) -> Echo | None:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return None  # no real stdout (closed, or replaced by a test)
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stdout.flush()
    return Echo(path, start, fd)


async def _remember(tree: workers.Tree, interval: float, errors: dict[str, int] | None = None) -> None:
    """Note the job's descendants as they come (one that leaves the session is still ended)."""
    while True:
        with contextlib.suppress(asyncio.TimeoutError):  # a process in D state: next time
            await offloop.proc(tree.remember, name="rankwatch-proc-tree", errors=errors)
        await asyncio.sleep(max(1.0, 5 * interval))


async def _wait_exit(child: subprocess.Popen[bytes]) -> None:
    """Wake only when the child exits (a pidfd turns readable), not on a timer: a 50 ms poll
    meant 20 wake-ups a second taken from the rank's CPU."""
    try:
        fd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        while child.poll() is None:
            await asyncio.sleep(0.1)
        return
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    try:
        loop.add_reader(fd, exited.set)
        try:
            while child.poll() is None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(exited.wait(), 5.0)  # a belt for a lost wake-up
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


def lower_priority(nice: int) -> None:
    """The agent yields the CPU to the ranks it watches. Linux keeps a nice value per thread
    and new threads inherit their creator's, so this runs on the main thread before the
    agent starts its own threads (and, in run mode, after the child is started)."""
    if nice <= 0:
        return
    try:
        os.nice(nice)
    except OSError as e:
        log.debug("cannot lower the agent's priority: %s", e)


def _remove_handlers(loop: asyncio.AbstractEventLoop) -> None:
    for sig in FORWARDED:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(sig)


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


async def run_command(
    cfg: Config,
    identity: Identity,
    cmd: Sequence[str],
    *,
    sinks: Sequence[Sink],
    services: dict[str, Any] | None = None,
    nice: int = 0,
) -> int:
    guard = StderrGuard()
    guard.install()  # a stderr nobody reads (srun stalled) must not stall the loop either
    try:
        out, path = open_child_log(child_log_path(cfg, identity))
        env, fr = child_env(cfg, identity)
        agent = Agent(cfg, identity, sinks=sinks, fr_prefix=fr)
        agent.launched = True
        agent.stderr_guard = guard
        return await _run_child(agent, cmd, out, path, env, services=services, nice=nice)
    finally:
        guard.restore()


class _Launch:
    """``rankwatch run``: the child started in its own session, writing into the log file the
    agent follows; the agent's stop signals forwarded to it as a terminal would deliver them
    (SIGINT, SIGHUP, SIGQUIT to its whole process group; SIGTERM to the child), and SIGKILL to
    its process group when it still runs ``runner.term_grace`` after the first stop; its end
    judged, and what a stop left of the job reaped."""

    def __init__(self, cfg: Config, identity: Identity, cmd: Sequence[str], agent: Agent) -> None:
        self.cfg = cfg
        self.identity = identity
        self.cmd = list(cmd)
        self.agent = agent
        self.loop = asyncio.get_running_loop()
        self.child: subprocess.Popen[bytes] | None = None
        self.kill_handle: list[asyncio.TimerHandle] = []
        self.stop_requested: list[signal.Signals] = []
        self.killed = False  # term_grace ran out and the process group got SIGKILL
        # Under a launcher (torchrun) every worker is a rank of its own, with its own watcher (and
        # stall clock, dump file, identity); the run's watcher only stands for the launcher's exit.
        # A command that runs one (a wrapper script, ``bash -c 'torchrun ...'``) gets the same
        # once the launcher shows in its process tree (``workers.Fleet.launched_by``).
        self.launcher = workers.is_launcher(self.cmd)

    # --- signals ------------------------------------------------------------------------
    def forward_signals(self) -> None:
        """Before the child starts: a SIGTERM in the seconds the agent needs to come up (server,
        GPU, checkpoints) would otherwise kill the agent and leave the child running unwatched.
        The handlers run from the loop, so none fires before the child is there."""
        for sig in FORWARDED:
            on_signal(self.loop, sig, self._forward, sig, errors=self.agent.internal_errors_by_component)

    def _forward(self, sig: signal.Signals) -> None:
        if sig in STOPS:
            self.stop_requested.append(sig)
            self.agent.stops_sent.append(int(sig))
        child = self.child
        assert child is not None
        if child.poll() is not None:  # srun/scancel signal the whole step: the child may be gone already
            return
        deliver(child.pid, sig)
        if sig in STOPS and not self.kill_handle:
            self.kill_handle.append(self.loop.call_later(self.cfg.runner.term_grace, self._kill))

    def _kill(self) -> None:
        child = self.child
        assert child is not None
        if child.poll() is None:
            log.warning(
                "child did not exit %.0fs after %s: sending SIGKILL to its process group",
                self.cfg.runner.term_grace,
                self.stop_requested[0].name if self.stop_requested else "the stop",
            )
            self.killed = True
            # The child leads its own session: its workers and launcher children go with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                child.kill()

    def stop_forwarding(self) -> None:
        _remove_handlers(self.loop)
        for h in self.kill_handle:
            h.cancel()

    # --- start --------------------------------------------------------------------------
    def watcher_for(self, path: Path, logged: bool, start: int = 0) -> RankWatcher:
        """``start``: the log's size before the child starts writing (its lines begin there)."""
        if logged:  # the run's own lines of the combined log (no rank prefix): see workers.Fleet
            w: RankWatcher = workers.run_watcher(
                self.cfg,
                self.identity,
                path,
                emit=self.agent.emit,
                clock=self.agent.clock,
                script=not self.launcher,
                start_at=start,
            )
            self.agent.adopt(w)
            return w
        # no log file: the child's output goes where the agent's does, unread
        return self.agent.add_watcher([] if self.launcher or not logged else [path], from_end=True)

    def start_child(self, fh: BinaryIO | None, env: dict[str, str]) -> int | None:
        """The child started, writing into ``fh`` (None: the agent's own stdout); else the exit
        status that says why it could not start."""
        try:
            self.child = subprocess.Popen(
                self.cmd,
                stdout=fh,
                stderr=subprocess.STDOUT if fh is not None else None,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=tracer_preexec(os.getpid()),
            )
        except OSError as e:
            _remove_handlers(self.loop)
            print(f"rankwatch: cannot start {self.cmd[0]!r}: {e.strerror or e}", file=sys.stderr)
            return 127 if isinstance(e, FileNotFoundError) else 126
        return None

    # --- the end ------------------------------------------------------------------------
    async def wait(self) -> int:
        """The child's return code, once it exited (and a stop signal on its way to us is in)."""
        child = self.child
        assert child is not None
        await _wait_exit(child)
        if child.returncode in STOP_STATUSES and not self.stop_requested:
            # The same signal may be on its way to us (a Slurm step stop): let it be recorded,
            # or a time-limit stop reads as a crash.
            await asyncio.sleep(0.2)
        return child.returncode

    def requested(self, rc: int) -> bool | int:
        """After a stop we forwarded, any way the child ends (its handler's exit code, the
        signal, our SIGKILL after term_grace) is the stop: a clean exit is no finding at all.
        The number is the signal that ended it: our SIGKILL, the forwarded one it died of or
        exited 128+N on, else the last one forwarded."""
        if not self.stop_requested or rc == 0:
            return False
        if self.killed and rc == -signal.SIGKILL:
            return int(signal.SIGKILL)
        return ended_by(rc, self.stop_requested) or int(self.stop_requested[-1])

    def stopped_by(self, rc: int) -> str:
        """Who sent the signal ``requested`` names, for the exit finding's words."""
        if self.killed and rc == -signal.SIGKILL:
            first = self.stop_requested[0].name if self.stop_requested else "the stop"
            return f"we sent {self.cfg.runner.term_grace:.0f}s (runner.term_grace) after forwarding {first}"
        return "we forwarded"

    async def judge(self, rc: int, watcher: RankWatcher, extras: Services, worker_crashed: bool) -> None:
        disk_full = None
        if rc != 0:
            # In run mode the log is the child's stdout: a full disk kills it without a word.
            with contextlib.suppress(Exception):
                await extras.sample_disks(2.0)
            disk_full = self.agent.log_disk_full(watcher)
        if not worker_crashed:  # else the launcher ended because a worker failed: that worker's crash says so
            died_of = -rc if rc < 0 else None
            watcher.on_exit(
                rc if rc >= 0 else None,
                died_of,
                requested=self.requested(rc),
                disk_full=disk_full,
                stopped_by=self.stopped_by(rc),
            )

    async def reap(self, tree: workers.Tree) -> None:
        """Nothing of the job outlives a stop: a DataLoader worker blocked in __getitem__ never
        notices its rank is gone. (A job that ends on its own keeps what it left running.)"""
        if not self.stop_requested:
            return
        with contextlib.suppress(asyncio.TimeoutError):  # logged and counted by offloop
            await offloop.proc(
                workers.reap,
                tree,
                name="rankwatch-proc-reap",
                errors=self.agent.internal_errors_by_component,
                timeout=workers.REAP_GRACE_S + offloop.PROC_TIMEOUT_S,
            )


async def _close_fleet(
    fleet: workers.Fleet,
    task: asyncio.Task[Any],
    stop: asyncio.Event,
    watcher: RankWatcher,
    path: Path,
    start: int,
) -> bool:
    """The launcher's workers judged at its end; True when one of them crashed."""
    stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, 5.0)
    # The command is gone: the run's lines are all written. Read them to their end, and what the
    # parsers hold (a progress bar Rich draws once, at its stop), before the workers' ends are
    # judged on what they relay (the run's step, a traceback printed without its rank prefix).
    watcher.drain()
    fleet.check()
    worker_crashed = await fleet.close()
    if not watcher.tail:  # the run's pipeline read none of it (every line had a rank prefix)
        watcher.tail.extend(workers.last_lines(path, start, watcher.tail.maxlen or 50))
    return worker_crashed


async def _run_child(
    agent: Agent,
    cmd: Sequence[str],
    out: BinaryIO | None,
    path: Path,
    env: dict[str, str],
    *,
    services: dict[str, Any] | None,
    nice: int,
) -> int:
    """Start ``cmd`` writing into ``out`` (the log at ``path``), watch it until it exits, then
    judge its end; its exit status."""
    cfg = agent.cfg
    launch = _Launch(cfg, agent.identity, cmd, agent)
    launch.forward_signals()
    # The log stays claimed (``open_child_log``) until this agent has read its last line, not
    # only while the child holds it: a job started meanwhile must not append to it.
    claim = os.dup(out.fileno()) if out is not None else None
    try:
        return await _run_claimed(agent, launch, out, path, env, services=services, nice=nice)
    finally:
        if claim is not None:
            os.close(claim)


async def _run_claimed(
    agent: Agent,
    launch: _Launch,
    out: BinaryIO | None,
    path: Path,
    env: dict[str, str],
    *,
    services: dict[str, Any] | None,
    nice: int,
) -> int:
    cfg = agent.cfg
    with out if out is not None else contextlib.nullcontext() as fh:
        start = fh.tell() if fh is not None else 0
        watcher = launch.watcher_for(path, fh is not None, start)
        failed = launch.start_child(fh, env)
        if failed is not None:
            return failed
    child = launch.child
    assert child is not None
    if not launch.launcher:
        watcher.attach(child.pid)
    tree = workers.Tree(child.pid)
    fleet = (
        workers.Fleet(
            agent,
            cfg,
            path,
            child.pid,
            launch.stop_requested,
            start=start,
            cmd=launch.cmd,
            run_pipeline=watcher,
            script=not launch.launcher,  # a script that starts its own ranks (Lightning)
        )
        if launch.launcher or out is not None
        else None
    )
    lower_priority(nice)
    echo = _stdout_echo(path, start) if cfg.runner.echo and out is not None else None
    agent.echo = echo
    if echo is not None:
        echo.start()
    try:
        extras = await lifecycle.start(agent, cfg, services)  # its signals are forwarded above
    except BaseException:
        _remove_handlers(launch.loop)
        raise

    watch_task = asyncio.create_task(watcher.run())
    fleet_stop = asyncio.Event()
    fleet_task = asyncio.create_task(fleet.run(fleet_stop)) if fleet is not None else None
    remember = asyncio.create_task(
        _remember(tree, cfg.process.sample_interval, agent.internal_errors_by_component)
    )
    try:
        rc = await launch.wait()
    finally:
        remember.cancel()
        fleet_stop.set()
        launch.stop_forwarding()
    watcher.stop()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(watch_task, 5.0)
    worker_crashed = False
    if fleet is not None and fleet_task is not None:
        fleet.exit_status[child.pid] = rc
        worker_crashed = await _close_fleet(fleet, fleet_task, fleet_stop, watcher, path, start)
    await launch.judge(rc, watcher, extras, worker_crashed)
    await launch.reap(tree)
    if echo is not None:
        await echo.close()
    await agent.settle()
    await extras.close()
    watcher.close()
    shutil.rmtree(fr_state_dir(), ignore_errors=True)
    return exit_status(rc)


def _read_process_env(pid: int) -> tuple[dict[str, str], str | None]:
    """The process's environment, and why it could not be read when the reason matters: a
    sidecar or daemon running as another user than the ranks (the chart's UID 10001 next to a
    root trainer) sees the processes but not their RANK, so it cannot tell them apart."""
    import psutil

    try:
        return psutil.Process(pid).environ(), None
    except psutil.AccessDenied:
        try:
            owner = psutil.Process(pid).uids().effective
        except Exception:
            owner = None
        whose = f"owned by UID {owner}" if owner is not None else "of another user"
        return {}, (
            f"cannot read the environment of pid {pid} ({whose}; this agent runs as UID {os.geteuid()}), "
            "so its RANK is unknown and no rank was attached to it: run the agent as the ranks' user "
            "(Kubernetes: sidecar.securityContext.runAsUser / the trainer's runAsUser), or give it "
            "CAP_SYS_PTRACE"
        )
    except Exception:
        return {}, None


def _note_unreadable(agent: Agent, pid: int, problem: str | None) -> None:
    """Say it loudly, once per process: an error in the log, rankwatch_internal_errors_total
    {component="process_env"} and /readyz not ready until the process is attached or gone."""
    problems = agent.attach_problems
    if problem is None:
        problems.pop(pid, None)
        return
    if pid not in problems:
        log.error("%s", problem)
        errs = agent.internal_errors_by_component
        errs["process_env"] = errs.get("process_env", 0) + 1
    problems[pid] = problem


def _env_int(env: dict[str, str], names: Sequence[str]) -> int | None:
    for name in names:
        v = env.get(name, "")
        if v.isdigit():
            return int(v)
    return None


def _leaves(pids: Sequence[int]) -> list[int]:
    """The rank processes among the matches. A launcher above them (`torchrun train.py`, the
    shell that runs `python train.py`) matches too and is dropped; so is a rank's own forked
    child that matches with the same RANK (a DataLoader worker has its parent's command line and
    environment), which would otherwise be a second pipeline on the same stdout."""
    import psutil

    found = set(pids)
    parents: dict[int, list[int]] = {}
    ranks: dict[int, int | None] = {}
    for pid in found:
        try:
            proc = psutil.Process(pid)
            parents[pid] = [p.pid for p in proc.parents()]
        except Exception:
            continue
        try:
            ranks[pid] = _env_int(proc.environ(), RANK_VARS)
        except Exception:
            ranks[pid] = None
    keep: list[int] = []
    for pid in sorted(found):
        rank = ranks.get(pid)
        above = [a for a in parents.get(pid, []) if a in found]
        if rank is not None and any(ranks.get(a) == rank for a in above):
            continue  # a worker of that rank
        below = [d for d in found if pid in parents.get(d, [])]
        if below and not (rank is not None and all(ranks.get(d) == rank for d in below)):
            continue  # a launcher or shell above the ranks
        keep.append(pid)
    return keep


@dataclasses.dataclass(frozen=True)
class _Found:
    """What attaching a found process takes, read off the loop: its environment (or why it is
    unreadable), its output files, and a prober that has read its command line. A process in D
    state or holding its memory map lock blocks those reads (environ, cmdline) for minutes."""

    env: dict[str, str]
    problem: str | None
    logs: tuple[Path, ...]  # its stdout and stderr files (torchrun --redirects: two), checked
    prober: ProcessProber
    pod: str | None = None  # namespace/pod/container when the log is the kubelet's
    user: str | None = None  # the process's owner
    cgroup: str | None = None  # /proc/<pid>/cgroup: a Kubernetes pod names the run
    born: float | None = None  # its start, wall clock (psutil's create_time)
    launcher: bool = False  # torchrun and the like, by its command line
    srun: bool = False  # a Slurm step's launcher: its tasks are slurmstepd's children, not its own
    task: int | None = None  # its Slurm task id, when its log is its srun's output


def _is_launcher(pid: int) -> tuple[bool, bool]:
    """Whether the process is a launcher (its ranks are its children, it is none itself), and
    whether it is ``srun`` (a Slurm step's launcher, whose tasks are slurmstepd's children)."""
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        return workers.launcher_process(proc), slurm.is_srun(proc.cmdline())
    return False, False


def _srun_output(pid: int, env: dict[str, str]) -> tuple[tuple[Path, ...], int | None]:
    """A Slurm task's log when its own output is no file: its stdout and stderr are pipes to
    slurmstepd, which sends them to the step's srun; when that srun runs on this node, as the
    task's user, with its output in files, those files hold this task's lines (and srun's word
    on its end), as the user reads them. And the task's id, which srun's lines name."""
    with contextlib.suppress(psutil.Error):
        uid = psutil.Process(pid).uids().real
        srun = slurm.srun_of_task(env, uid)
        if srun is not None:
            files, _ = workers.checked_output_files(srun)
            if files:
                return tuple(files), workers.env_int(env, ("SLURM_PROCID",))
    return (), None


def _owner_and_cgroup(pid: int) -> tuple[str | None, str | None]:
    import psutil

    user: str | None = None
    with contextlib.suppress(Exception):
        user = psutil.Process(pid).username()
    cgroup: str | None = None
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cgroup", "rb") as fh:
        cgroup = fh.read(64 * 1024).decode("utf-8", "replace")
    return user, cgroup


def _look(
    found: Sequence[int], *, per_process: bool, attached: set[int], first_only: bool, clock: Any
) -> tuple[list[int], dict[int, _Found]]:
    """The processes to consider (the leaves of a node daemon's matches), and what attaching
    each one not yet attached takes. Blocking: run it through ``offloop.proc``."""
    pids = _leaves(found) if per_process else list(found)
    new = [p for p in pids if p not in attached]
    if first_only:
        new = new[:1]
    out: dict[int, _Found] = {}
    for p in new:
        env, problem = _read_process_env(p)
        # A rank's log is every file its output goes to: with torchrun's --redirects its
        # traceback and its peer's gloo error are in stderr.log, its steps in stdout.log.
        files, _ = workers.checked_output_files(p)
        logs, pod, task = tuple(files), None, None
        if not logs and "SLURM_SRUN_COMM_PORT" in env:
            logs, task = _srun_output(p, env)
        if not logs:
            from rankwatch.sources import kubepods  # only for a process whose output is no file

            pc = kubepods.container_log(p)  # a pod's process: its stdout is the kubelet's log file
            if pc is not None:
                logs, pod = (pc.log,), str(pc)
        user, cgroup = _owner_and_cgroup(p)
        # To the clock tick: psutil's create_time is up to a second early, which took a rank
        # restarted within that second of its predecessor's last sample for a left-behind child.
        born = started_at(p)
        launcher, srun = _is_launcher(p)
        out[p] = _Found(
            env, problem, logs, ProcessProber(p, clock=clock), pod=pod, user=user, cgroup=cgroup,
            born=born, launcher=launcher, srun=srun, task=task,
        )  # fmt: skip
    return pids, out


async def watch_processes(
    cfg: Config,
    identity: Identity,
    *,
    pids: Sequence[int],
    match: str | None,
    logs: Sequence[Path],
    sinks: Sequence[Sink],
    stop: asyncio.Event | None = None,
    services: dict[str, Any] | None = None,
    nice: int = 0,
) -> int:
    guard = StderrGuard()
    guard.install()  # a stderr nobody reads must not stall the loop
    try:
        problem = _usage_problem(pids, logs)
        if problem is not None:
            print(f"rankwatch: {problem}", file=sys.stderr)
            return 2
        lower_priority(nice)
        agent = Agent(cfg, identity, sinks=sinks)
        agent.stderr_guard = guard
        session = _ProcessWatch(cfg, identity, agent, pids, match, logs)
        return await session.run(stop or asyncio.Event(), services)
    finally:
        guard.restore()


def notify_ready() -> None:
    """Tell systemd the agent is watching (sd_notify(3), ``Type=notify`` in the unit): its first
    look at the node's processes is done and each rank it found is being read. Until then a
    rank's step lines are written with nobody reading them, and the ones read later arrive in
    one burst that measures no step interval (the stall rule keeps its startup grace). Units
    ordered after rankwatch.service (slurmd, a job's prolog) start once this is sent, not once
    the agent's Python has been exec'd. Nothing is sent outside systemd (no ``NOTIFY_SOCKET``);
    the datagram is never waited on."""
    addr = os.environ.get("NOTIFY_SOCKET", "")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            s.connect(addr)
            s.send(b"READY=1")
    except OSError as e:
        log.warning("cannot tell systemd the agent is ready (NOTIFY_SOCKET=%s): %s", addr[:200], e)


def _usage_problem(pids: Sequence[int], logs: Sequence[Path]) -> str | None:
    """What in ``watch``'s arguments cannot work, said before anything starts."""
    missing = [p for p in pids if not psutil.pid_exists(p)]
    if missing:
        return f"no process with pid {', '.join(map(str, missing))}"
    if len(pids) > 1 and len(logs) == 1:
        return (
            "one --log for several --pid: give one --log per rank (rank-<r>.log), or none "
            "to follow each process's own stdout file"
        )
    return None


@dataclasses.dataclass
class _ProcessWatch:
    """``rankwatch watch``: ranks found by pid or by a command-line match, attached to watchers.

    A node daemon (``--match`` with no pid, or several ``--pid``, and no ``--log``) gives each
    rank process a watcher of its own, with the identity read from its environment and the
    files its stdout and stderr go to followed, each a stream of that one pipeline
    (``per_process``). Otherwise the watchers come from
    the logs (one, or one per ``--log`` with the rank in its name) and a found process is
    attached to the free watcher of its rank."""

    cfg: Config
    identity: Identity
    agent: Agent
    pids: Sequence[int]
    match: str | None
    logs: dataclasses.InitVar[Sequence[Path]]
    watchers: list[RankWatcher] = dataclasses.field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = dataclasses.field(default_factory=list)
    started: bool = False  # watchers added from now on start running at once
    per_process: bool = False
    own_output: bool = False  # one --pid and no --log: the files its stdout and stderr go to
    # The users whose processes said each run id, with the first pid of each (bounded).
    claims: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    told: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # (run, user) said once
    launchers: set[int] = dataclasses.field(default_factory=set)  # matched launchers, never ranks
    shared: sharedlog.SharedLogs = dataclasses.field(default_factory=sharedlog.SharedLogs)
    # One --pid that is a launcher or runs one (``watch --pid $!`` on ``torchrun ... > job.log``):
    # its workers, as under ``rankwatch run -- torchrun`` (``_follow_launcher``).
    fleet: workers.Fleet | None = None
    fleet_stop: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    fleet_task: asyncio.Task[Any] | None = None
    root: psutil.Process | None = None  # the watched pid, while the fleet's

    def __post_init__(self, logs: Sequence[Path]) -> None:
        self.per_process = not logs and ((bool(self.match) and not self.pids) or len(self.pids) > 1)
        self.own_output = not self.per_process and not logs and len(self.pids) == 1
        if not self.per_process and not self.own_output:
            self._watch_logs(logs)

    async def _watch_output(self, pid: int) -> None:
        """``watch --pid P`` with no ``--log``: P's log is where its output goes, when that is a
        file the agent may follow (``workers.checked_output_files``); a log line says which
        files are followed, and why none is when none is (a pipe, a terminal, another user's
        file)."""
        try:
            files, why = await offloop.proc(
                workers.checked_output_files,
                pid,
                name="rankwatch-proc-attach",
                errors=self.agent.internal_errors_by_component,
            )
        except asyncio.TimeoutError:
            files, why = [], ["its /proc entries did not answer"]
        if files:
            log.info("pid %d: no --log given: following its output in %s", pid, ", ".join(map(str, files)))
        if why:
            log.log(
                logging.INFO if files else logging.WARNING,
                "pid %d: %s: %s (give --log PATH to follow its log)",
                pid,
                "; ".join(why),
                "not followed" if files else "no log followed, only its process is watched",
            )
        self.watchers.append(self.agent.add_watcher(files, from_end=True, replay=True))

    def _watch_logs(self, logs: Sequence[Path]) -> None:
        if len(logs) <= 1:
            ident = log_identity(self.identity, self.cfg.run, logs)  # a rank-1.log is rank 1
            self.watchers.append(self.agent.add_watcher(list(logs), ident, from_end=True, replay=True))
            return
        # Whose each file is: the rule analyze uses (sources/logfiles.py); a torchrun worker's
        # stdout.log and stderr.log are one process, so one pipeline.
        by_worker: dict[str | Path, tuple[int, LogPlace, list[Path]]] = {}
        for i, (p, place) in enumerate(zip(logs, places_of(logs), strict=True)):
            by_worker.setdefault(place.worker or p, (i, place, []))[2].append(p)
        for i, place, files in by_worker.values():
            local = place.local_rank if place.local_rank is not None else i
            ident = dataclasses.replace(self.identity, rank=place.rank, local_rank=local)
            self.watchers.append(self.agent.add_watcher(files, ident, from_end=True, replay=True))

    # --- finding the ranks --------------------------------------------------------------
    def _identity_of(self, seen: _Found, pid: int) -> Identity:
        """A node daemon watches many jobs and users: each process's identity (run, rank, local
        rank, world size, node, user) is its own, read from its environment and cgroup."""
        ident = identity_of_process(self.cfg.run, seen.env, self.identity, user=seen.user, cgroup=seen.cgroup)
        return self._scoped(ident, pid)

    def _scoped(self, ident: Identity, pid: int) -> Identity:
        """Two users' processes are never one job, whatever their environment says: any user can
        put a run id read from ``ps`` (torchrun's ``--rdzv-id``, a Slurm job id) and a RANK into
        a process of their own. Once a second user's process says a run id, each user's
        processes of it are watched as run ``<id>@<user>`` (the ones already watched renamed):
        their own pipelines, alerts, cross-rank judgement and incidents, never one another's.
        None is dropped and none keeps the bare id: which one is genuine is not for the daemon
        to guess (the first to be seen may be the impostor), and dropping one would let another
        user blind the watch of a real rank. Said once per user, naming both pids and users."""
        if ident.user is None:
            return ident
        users = self.claims.setdefault(ident.run, {})
        users.setdefault(ident.user, pid)
        while len(self.claims) > MAX_RUNS:
            del self.claims[next(iter(self.claims))]
        if len(users) == 1:
            return ident
        for w in self.watchers:  # the first user's pipelines: renamed from now on
            if w.identity.run == ident.run and w.identity.user is not None:
                w.identity = dataclasses.replace(w.identity, run=f"{ident.run}@{w.identity.user}")
        scoped = dataclasses.replace(ident, run=f"{ident.run}@{ident.user}")
        if (ident.run, ident.user) not in self.told:
            if len(self.told) >= MAX_RUNS:
                self.told.clear()
            self.told.add((ident.run, ident.user))
            others = ", ".join(f"pid {p} (user {u})" for u, p in users.items() if u != ident.user)
            log.log(
                logging.INFO if ident.run == "default" else logging.WARNING,
                "pid %d (user %s) says it is rank %s of run %s, as %s does: two users' processes are "
                "never one job, so each user's are watched apart, this one as run %s (another user "
                "posing as a rank, or two users who gave their jobs the same id)",
                pid, ident.user, ident.rank, ident.run, others, scoped.run,
            )  # fmt: skip
        return scoped

    def _add_process(self, pid: int, seen: _Found) -> None:
        _note_unreadable(self.agent, pid, seen.problem)
        ident = self._identity_of(seen, pid)
        if _env_int(seen.env, RANK_VARS) is None and pid in self.pids and len(self.pids) > 1:
            # several --pid without RANK: their order on the command line
            ident = dataclasses.replace(ident, rank=list(self.pids).index(pid))
        # One pipeline, one stream per file, as a launcher's worker with its own files is read;
        # of a file other ranks write too (``torchrun ... > job.log``), only this rank's lines.
        w = sharedlog.make_watcher(
            self.cfg, ident, list(seen.logs), emit=self.agent.emit, clock=self.agent.clock, shared=self.shared
        )
        w.task = seen.task
        self.agent.adopt(w)
        w.attach(pid, seen.prober)
        self.watchers.append(w)
        if self.started:
            self.tasks.append(asyncio.create_task(w.run()))
        pod = f" (pod {seen.pod})" if seen.pod else ""
        following = f", following {', '.join(map(str, seen.logs))}" if seen.logs else ", no log file"
        log.info("rank %s: pid %d%s%s", ident.rank, pid, pod, following)

    def _restarted(self, ident: Identity) -> RankWatcher | None:
        """The pipeline of the same rank of the same job, its process gone (a restart goes on
        in it); the same rank number of another job (the next one on the node) is not it."""
        if ident.rank is None:
            return None
        return next(
            (
                w
                for w in self.watchers
                if w.exited
                and w.rank == ident.rank
                and w.identity.run == ident.run
                and w.identity.user == ident.user
            ),
            None,
        )

    def _follow_new_files(self, w: RankWatcher, logs: Sequence[Path]) -> None:
        """A restarted rank's output goes where its new process's does: torchelastic gives each
        attempt its own files (``--log-dir D --redirects``: ``D/<run>/attempt_<n>/<local
        rank>/``), so the new ones are followed from their start in the same pipeline and the
        old ones, nothing more coming to them, are read to their end and closed. A file both
        processes write (``torchrun ... > job.log``) is followed on."""
        new = [p for p in logs if p not in {Path(s.path) for s in w.streams}]
        if not new:
            return
        old = [Path(s.path) for s in w.streams if Path(s.path) not in set(logs)]
        w.follow_instead(old, new)
        self.shared.add(w, new)
        log.info("rank %s restarted: following %s", w.rank, ", ".join(map(str, new)))

    def _left_behind(self, found: _Found, ident: Identity) -> bool:
        """A rank's own child that outlives it (its DataLoader worker after a SIGKILL, with the
        rank's command line and RANK) is no restart of the rank: it was born while the rank was
        still seen alive, and a restarted rank only after its predecessor ended. Such a child is
        its rank's user's: another user's process is never taken for one."""
        if found.born is None:
            return False
        now_wall, now = time.time(), self.agent.clock()
        return any(
            w.alive_at is not None
            and w.rank == ident.rank
            and w.identity.run == ident.run
            and w.identity.user == ident.user
            and found.born < now_wall - (now - w.alive_at)
            for w in self.watchers
        )

    def _assign_per_process(self, found: Sequence[int], seen: dict[int, _Found], attached: set[int]) -> None:
        self.launchers &= set(found)
        for pid in found:
            if pid in attached or pid in self.launchers:
                continue
            if seen[pid].srun or (seen[pid].launcher and _env_int(seen[pid].env, RANK_VARS) is None):
                # torchrun matches too (the script's arguments are in its command line): before it
                # has started its workers, and after they have ended, it is a leaf, yet no rank;
                # as one it would be a second pipeline (run "default") saying its workers' ends.
                # So does srun, always a leaf (its tasks are slurmstepd's), even when a batch
                # script's SLURM_PROCID is in its environment: its output is its tasks' log.
                self.launchers.add(pid)
                continue
            ident = self._identity_of(seen[pid], pid)
            if self._left_behind(seen[pid], ident):
                continue
            again = self._restarted(ident)
            if again is not None:
                self._follow_new_files(again, seen[pid].logs)
                again.attach(pid, seen[pid].prober)  # the rank restarted: same state and labels
            else:
                self._add_process(pid, seen[pid])

    def _assign_by_rank(self, found: Sequence[int], seen: dict[int, _Found], free: list[RankWatcher]) -> None:
        if len(self.watchers) == 1:
            only = self.watchers[0]
            if found[0] in seen and not self._left_behind(seen[found[0]], only.identity):
                self._attach_found(only, found[0], seen[found[0]])
            return
        by_rank = {w.rank: w for w in free}
        for pid in found:
            if pid not in seen:
                continue  # attached to a watcher that is not free
            _note_unreadable(self.agent, pid, seen[pid].problem)
            rank = _env_int(seen[pid].env, RANK_VARS)
            w = by_rank.get(rank)
            if w is not None and not self._left_behind(seen[pid], w.identity):
                del by_rank[w.rank]
                self._attach_found(w, pid, seen[pid])

    def _attach_found(self, w: RankWatcher, pid: int, seen: _Found) -> None:
        """Attach a process found for a log's watcher (``--match`` with ``--log``, ``--pid`` with
        ``--log``): what the log and the config do not say of the job's identity (its world size,
        its user) is the process's own, as a node daemon reads it (``_identity_of``)."""
        own = identity_of_process(self.cfg.run, seen.env, w.identity, user=seen.user, cgroup=seen.cgroup)
        w.identity = dataclasses.replace(
            w.identity,
            world_size=w.identity.world_size if w.identity.world_size is not None else own.world_size,
            user=w.identity.user if w.identity.user is not None else own.user,
        )
        w.attach(pid, seen.prober)

    async def assign(self, found: Sequence[int]) -> None:
        """Attach what ``found`` holds that no watcher has yet (read off the loop: ``_look``)."""
        for gone in set(self.agent.attach_problems) - set(found):
            self.agent.attach_problems.pop(gone, None)
        attached = {w.prober.pid for w in self.watchers if w.prober is not None and not w.exited}
        attached |= self.launchers  # looked at once
        free = [w for w in self.watchers if w.prober is None or w.exited]
        if not self.per_process and (not free or not found):
            return
        try:
            found, seen = await offloop.proc(
                functools.partial(
                    _look, found, per_process=self.per_process, attached=attached,
                    first_only=not self.per_process and len(self.watchers) == 1, clock=self.agent.clock,
                ),
                name="rankwatch-proc-attach",
                errors=self.agent.internal_errors_by_component,
            )  # fmt: skip
        except asyncio.TimeoutError:
            return  # logged and counted by offloop; tried again next period
        if self.per_process:
            self._assign_per_process(found, seen, attached)
        else:
            self._assign_by_rank(found, seen, free)

    async def matching(self) -> list[int] | None:
        """``find_processes`` reads every process's cmdline: off the loop, bounded; None when
        it did not answer (logged and counted by offloop; tried again next period)."""
        assert self.match
        try:
            return await offloop.proc(
                find_processes,
                self.match,
                name="rankwatch-proc-match",
                errors=self.agent.internal_errors_by_component,
            )
        except asyncio.TimeoutError:
            return None

    async def _follow_launcher(self, pid: int) -> bool:
        """``pid`` is a launcher (torchrun), or runs one (a wrapper script): the job is watched as
        ``rankwatch run -- torchrun`` watches it, when the launcher's output goes to one file the
        agent may follow (``> job.log 2>&1``): its workers found as its children with their
        identity from their environment, each a pipeline reading its lines of that combined log,
        and the launcher's account of their ends used. False: not so (no launcher, or its output
        is no such file): the pid is followed as any process."""
        errors = self.agent.internal_errors_by_component
        try:
            got = await offloop.proc(workers.find_launcher, pid, name="rankwatch-proc-attach", errors=errors)
            if got is None:
                return False
            files, why = await offloop.proc(
                workers.checked_output_files, got[0], name="rankwatch-proc-attach", errors=errors
            )
            root = psutil.Process(pid)
        except (asyncio.TimeoutError, psutil.Error):
            return False
        if len(files) != 1:
            why = why or [f"its stdout and stderr are two files ({', '.join(map(str, files))})"]
            log.warning(
                "pid %d: the launcher pid %d's output is not one file the agent may follow (%s): its "
                "workers are not told apart",
                pid, got[0], "; ".join(why),
            )  # fmt: skip
            return False
        path = files[0]
        run = workers.run_watcher(
            self.cfg, self.identity, path, emit=self.agent.emit, clock=self.agent.clock,
            script=True, replay=True,
        )  # fmt: skip
        self.agent.adopt(run)
        self.fleet = workers.Fleet(
            self.agent, self.cfg, path, pid, [], cmd=got[1], run_pipeline=run, script=True
        )
        self.fleet.launched_by(*got)
        self.root = root
        self.watchers.append(run)
        log.info("pid %d: following the launcher's combined log %s", pid, path)
        return True

    async def _launcher_of_the_log(self) -> None:
        """The sidecar form on a pod whose command is ``torchrun ... > pod.log`` (``watch --match
        P --log pod.log``): the pattern matches torchrun too (the script is in its command line).
        When a matched launcher writes the one ``--log`` given, its workers are told apart as
        ``watch --pid <torchrun>`` tells them (``_follow_launcher``): each a rank of its own with
        its identity from its environment, not one rank-less tree of pids."""
        found = await self.matching()
        if not found:
            return
        [log_watcher] = self.watchers
        wanted = {os.path.realpath(s.path) for s in log_watcher.streams}
        errors = self.agent.internal_errors_by_component
        for pid in found:
            try:
                if not await offloop.proc(_is_launcher, pid, name="rankwatch-proc-attach", errors=errors):
                    continue
                files, _ = await offloop.proc(
                    workers.checked_output_files, pid, name="rankwatch-proc-attach", errors=errors
                )
            except asyncio.TimeoutError:
                continue
            if len(files) != 1 or os.path.realpath(files[0]) not in wanted:
                continue
            if await self._follow_launcher(pid):  # else it went meanwhile: the log as given
                self.watchers.remove(log_watcher)
                if log_watcher in self.agent.watchers:
                    self.agent.watchers.remove(log_watcher)
                log_watcher.close()
            return

    async def close_fleet(self) -> None:
        """The launcher is gone: its workers' ends judged (one that crashed says why the job
        ended), else the launcher's own end, its status from its failure box when it printed
        one (a non-parent reads no exit status)."""
        fleet = self.fleet
        if fleet is None or self.fleet_task is None:
            return
        if not self._root_gone():
            # The agent was stopped, the job goes on: no worker's end to judge (a live worker
            # judged "final" would pass for a clean exit); its pipelines stop with the others.
            self.fleet_stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.fleet_task, 5.0)
            self.watchers.extend(fleet.by_rank.values())
            self.tasks.extend(fleet.tasks)
            self.fleet_task = None
            return
        run = self.watchers[0]
        run.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.tasks[0], 5.0)
        for w in fleet.by_rank.values():  # each worker's end seen, before its last is judged
            with contextlib.suppress(Exception):
                await w.sample_once()
        ended = bool(fleet.by_rank) and all(
            w.exited or (w.last_sample is not None and not w.last_sample.alive)
            for w in fleet.by_rank.values()
        )
        crashed = await _close_fleet(fleet, self.fleet_task, self.fleet_stop, run, fleet.log_path, 0)
        self.fleet_task = None
        if not crashed:
            status = fleet.launcher_status()
            said = fleet.launcher_log
            if status is None and ended and not (said.failed or said.stopped or said.boxed):
                # torchrun returns 0 when its workers all did, and names each one that did not
                # (its failure lines, its stops, its box): every worker seen to end, none named.
                status = 0
            run.on_exit(status, None)

    def _root_gone(self) -> bool:
        root = self.root
        try:
            return root is None or not root.is_running() or root.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    async def first_look(self) -> None:
        if self.own_output and not self.watchers and not await self._follow_launcher(self.pids[0]):
            await self._watch_output(self.pids[0])
        if self.fleet is None and self.match and not self.per_process and len(self.watchers) == 1:
            await self._launcher_of_the_log()
        if self.fleet is not None:
            return
        await self.assign(list(self.pids) or ((await self.matching() or []) if self.match else []))

    # --- the loop -----------------------------------------------------------------------
    def all_gone(self) -> bool:
        """Every --pid has exited, and nothing can bring one back (no --match to find a restart)."""
        if self.fleet is not None:
            return self._root_gone()
        attached = [w for w in self.watchers if w.prober is not None]
        return bool(self.pids) and not self.match and bool(attached) and all(w.exited for w in attached)

    def wants_match(self) -> bool:
        """A match is looked for again: a node daemon always (new jobs), else while a watcher is
        free; never while a matched launcher's fleet tells its workers apart (its run pipeline
        has no process of its own to be given)."""
        return (
            bool(self.match)
            and self.fleet is None
            and (self.per_process or any(w.prober is None or w.exited for w in self.watchers))
        )

    def start(self) -> None:
        self.tasks.extend(asyncio.create_task(w.run()) for w in self.watchers)
        if self.fleet is not None:
            self.fleet_task = asyncio.create_task(self.fleet.run(self.fleet_stop))
        self.started = True

    async def run(self, stop: asyncio.Event, services: dict[str, Any] | None) -> int:
        await self.first_look()
        extras = await lifecycle.start(self.agent, self.cfg, services, stop=stop)
        self.start()
        notify_ready()
        try:
            while not stop.is_set():
                lifecycle.judge_exits(self.agent, self.watchers)
                if self.all_gone():
                    log.info("every watched pid has exited; stopping")
                    break
                if self.wants_match():
                    found = await self.matching()
                    if found is not None:
                        await self.assign(found)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.cfg.process.sample_interval)
        finally:
            await self.last_look()
            await self.close_fleet()
            await lifecycle.stop_watchers(self.agent, extras, self.watchers, self.tasks)
        return 0

    async def last_look(self) -> None:
        """Kubernetes stops a native sidecar as soon as the trainer has exited: a process that
        ended since the last sample is judged before the agent goes, not lost with it."""
        for w in self.watchers:
            with contextlib.suppress(Exception):
                await w.sample_once()
        lifecycle.judge_exits(self.agent, self.watchers)
