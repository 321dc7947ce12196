"""The live agent: watchers in, findings out to sinks, stack dumps when a rank hangs.

One asyncio loop. Blocking work (psutil, py-spy, file writes of dumps) runs in threads
with timeouts. A sink that raises is logged once and counted; detection goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psutil

from rankwatch import offloop, runfolder, safeio
from rankwatch.actions.dump_outcome import DumpOutcome
from rankwatch.config.schema import Config
from rankwatch.detectors.disk import human, is_full
from rankwatch.dumps.capture import DumpResult, capture, find_py_spy, py_spy_missing
from rankwatch.dumps.ptrace import has_cap_sys_ptrace, ptrace_problem, yama_scope
from rankwatch.dumps.store import DumpStore, IncidentInfo, incident_name, sanitise_reason, sanitise_run
from rankwatch.events import DiskSample, Event
from rankwatch.identity import Identity
from rankwatch.records import Finding
from rankwatch.runtime.faces import SnapshotBuilder
from rankwatch.runtime.signals import is_interrupt, on_signal
from rankwatch.runtime.watcher import RankWatcher
from rankwatch.snapshot import AgentSnapshot, HttpCounters, PodView

T = TypeVar("T")
# offloop's names for calls into the (shared) dumps folder, one per kind: a call stuck on a hung
# mount (or on whatever the job planted there) blocks later calls of its own kind only.
DUMPS_IO = "rankwatch-dumps"  # writing stacks
INCIDENT_IO = "rankwatch-dumps-incident"  # listing and opening incidents (joining peers)

log = logging.getLogger("rankwatch.agent")
# Findings a forwarded stop's own interrupt makes (runtime/signals.py ``is_interrupt``): the
# traceback itself, and the lost peer of a rank whose peer the same stop ended first.
STOP_TRACEBACKS = frozenset({"traceback", "peer_error"})

# Agents of the ranks of one job each see the same hang within a sample interval or two of
# each other; joining a recent incident of the same reason keeps their dumps in one folder.
JOIN_WINDOW_S = 120.0
LAUNCHERS = frozenset(
    {"torchrun", "torch.distributed.run", "torch.distributed.launch", "deepspeed", "accelerate", "mpirun"}
)
NCCL_RAS_PORT = 28028
# py-spy runs under its own ``timeout`` (killed past it); around it the capture reads /proc of
# the process and its children (cmdline, status), which a process in D state blocks for ever.
CAPTURE_SLACK_S = 10.0


async def capture_off_loop(
    pid: int, *, timeout: float, errors: dict[str, int] | None = None, **kw: Any
) -> DumpResult:
    """``capture(pid, timeout=timeout, **kw)`` on a daemon thread of its own (``offloop.proc``),
    never the loop's executor: one stuck on an unreadable process would be joined at exit. One
    that does not return within ``timeout + CAPTURE_SLACK_S`` is a failed dump that says why
    (counted under ``dumps``); until it returns, the next capture of ``pid`` fails at once."""
    try:
        return await offloop.proc(
            functools.partial(capture, pid, timeout=timeout, **kw),
            name=f"rankwatch-pyspy-pid{pid}",
            errors=errors,
            component="dumps",
            timeout=timeout + CAPTURE_SLACK_S,
        )
    except asyncio.TimeoutError:
        return DumpResult(
            pid,
            False,
            [],
            f"the capture of pid {pid} did not return within {timeout + CAPTURE_SLACK_S:g}s: reading its "
            "/proc entries blocks (a process in uninterruptible I/O, D state, or holding its memory map "
            "lock). Check the filesystem or driver it waits on (`dmesg`, the NFS/Lustre servers).",
            "timeout",
            timeout + CAPTURE_SLACK_S,
            [str(kw.get("py_spy", "py-spy")), "dump", "--pid", str(pid)],
        )


# What a dump's meta keeps for ``rankwatch report``: bounded, a few KB per rank.
REPORT_STEPS = 20
REPORT_TAIL = 40
REPORT_LINE = 500
REPORT_FINDINGS = 30
REPORT_MESSAGE = 2000
REPORT_WINDOW_S = 600.0


def first_line(text: str) -> str:
    return next((x.strip() for x in (text or "").splitlines() if x.strip()), "")[:300]


def with_outcome(f: Finding, outcome: DumpOutcome) -> None:
    """The stall finding says what its stacks came to, and carries it as data for the sinks."""
    text = outcome.text()
    if text:
        f.message = f"{f.message} {text}"
    f.diagnosed(dumps=outcome)


class Sink(Protocol):
    def send(self, f: Finding) -> None: ...


class AlertSink(Sink, Protocol):
    """The alert dispatcher, as the agent uses it: findings in, and the stacks a capture took."""

    def dumps_taken(self, outcome: DumpOutcome) -> None: ...


def multi_rank(agent: Any) -> bool:
    """The agent watches ranks of a job of more than one (its own world size, or several
    watched ranks): what the cross-rank diagnosis needs before it has anything to do."""
    world = agent.identity.world_size
    return bool(world and world > 1) or len(agent.watchers) > 1


class CrossRankJudge(Protocol):
    """The cross-rank diagnosis (runtime/diagnose.py), as the agent uses it."""

    def hold(self, f: Finding) -> bool:
        """True when it takes ``f`` and emits it itself, completed, a little later."""
        ...

    def clean_exit(self, rank: int | None, step: int | None, t: float, run: str | None = None) -> None:
        """A watched rank exited with status 0 (rank, last step, wall time, its run)."""
        ...

    async def launcher_workers(self, f: Finding, folder: Path) -> bool:
        """A stall of one pipeline whose stacks hold a launcher's workers: completed as their
        peers' hang (the worker the others wait for named); False when they hold none."""
        ...


class Agent:
    def __init__(
        self,
        cfg: Config,
        identity: Identity,
        *,
        sinks: Sequence[Sink] = (),
        clock: Callable[[], float] = time.monotonic,
        fr_prefix: tuple[str, str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.identity = identity
        self.sinks = list(sinks)
        self.clock = clock
        self.watchers: list[RankWatcher] = []
        self.store = DumpStore(Path(cfg.dumps.dir))
        self.findings: list[Finding] = []
        self.sink_errors: dict[str, int] = {}
        self.internal_errors_by_component: dict[str, int] = {}
        # pid -> why a matched process could not be attached (e.g. its environment is unreadable);
        # /readyz is not ready while any is left.
        self.attach_problems: dict[int, str] = {}
        # Node mode on Kubernetes: the pods of the watched ranks, read into every snapshot.
        self.pods: Callable[[], tuple[PodView, ...]] | None = None
        self.alert_stats: dict[str, dict[str, int]] | None = None
        self.alert_peer_stats: dict[str, int] | None = None  # cross-agent grouping, by role
        self.http = HttpCounters()  # the HTTP server's own counts, read into every snapshot
        self.started_at = time.time()
        # Wired once by the services (``wire``): what a finding meets between its detector and
        # the sinks. None until then (an agent in a test, ``analyze``): findings go straight out.
        self.cross_rank: CrossRankJudge | None = None
        self.enrich: Callable[[Finding], Finding] | None = None
        self.alerts: AlertSink | None = None
        self.dumps_captured = 0
        self.dumps_failed: dict[str, int] = {}  # by DumpResult.error: a small fixed vocabulary
        # Set by the GPU service: () -> ({rank: [GpuSample]}, sampler up); read by the status page.
        self.gpu_latest: Callable[[], tuple[Any, bool]] | None = None
        self.last_incident: Path | None = None
        self.last_dump_problem: str | None = None
        self.launched = False  # run mode: the rank is our child and named us its ptracer
        # The stop signals the agent forwarded to what it launched (the user's Ctrl-C, a SIGTERM).
        self.stops_sent: list[int] = []
        self.fr_prefix = fr_prefix  # (pipe prefix, trace file prefix) for PyTorch's flight recorder
        self._dump_lock = asyncio.Lock()
        self._joined: set[str] = set()  # incidents this agent dumped into or decided to leave
        self._peer_pending: set[str] = set()  # peers' incidents with no rank file yet
        self._run_mtime: int | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.last_capture = DumpOutcome("failed")  # what the last stack capture did
        self._held_stalls: dict[int | None, list[Finding]] = {}  # stalls waiting for their stacks
        # The last good sample of each polled source (sources/polled), by its name.
        self.sampled: dict[str, tuple[Event, ...]] = {}
        self.stderr_guard: Any = None  # runtime.stdio.StderrGuard (its dropped bytes are a metric)
        self.echo: Any = None  # run mode: runtime.echo.Echo (its dropped bytes are a metric)
        self.loop_monitor: Any = None  # runtime.loopmon.LoopMonitor, set by Services (/healthz)
        self.faces = SnapshotBuilder(self)  # what the exporter and the server read (snapshot())

    def add_watcher(
        self,
        logs: list[Path],
        identity: Identity | None = None,
        *,
        from_end: bool = False,
        replay: bool = False,
    ) -> RankWatcher:
        w = RankWatcher(
            self.cfg,
            identity or self.identity,
            logs,
            emit=self.emit,
            clock=self.clock,
            from_end=from_end,
            replay=replay,
        )
        self.adopt(w)
        return w

    def adopt(self, w: RankWatcher) -> None:
        """A watcher made elsewhere (a launcher's worker, the run's own pipeline) joins the agent."""
        w.on_clean_exit = lambda rank, step, wall: self.clean_exit(rank, step, wall, w.identity.run)
        w.on_replayed = self._replayed
        if w not in self.watchers:
            self.watchers.append(w)

    def _replayed(self, found: list[Finding]) -> None:
        """A watcher's replayed history, read after the alerts started (before, they take it
        from ``replayed`` as they start)."""
        hook = getattr(self.alerts, "replayed", None)
        if hook is not None:
            hook(found)

    def wire(
        self,
        *,
        cross_rank: CrossRankJudge | None = None,
        enrich: Callable[[Finding], Finding] | None = None,
        alerts: AlertSink | None = None,
    ) -> None:
        """The path of a finding, declared in one call: ``cross_rank`` may hold it (a stall waits
        for its peers' stacks, a failure for the first failure's record) and is told of clean
        exits; ``enrich`` adds what the agent knows (the last good checkpoint for a NaN); the
        sinks, then ``alerts`` (the dispatcher), receive it."""
        self.cross_rank = cross_rank
        self.enrich = enrich
        self.alerts = alerts

    def clean_exit(self, rank: int | None, step: int | None, wall: float, run: str | None = None) -> None:
        if self.cross_rank is None:
            return
        try:
            self.cross_rank.clean_exit(rank, step, wall, run)
        except Exception:
            errs = self.internal_errors_by_component
            errs["hold"] = errs.get("hold", 0) + 1
            log.exception("an exit hook failed")

    @property
    def disk_latest(self) -> list[DiskSample]:
        """Free space of the log, dumps and spool folders, as last sampled (off the loop)."""
        return [e for events in self.sampled.values() for e in events if isinstance(e, DiskSample)]

    def snapshot(self) -> AgentSnapshot:
        """What the exporter and the server show, now (built on the loop: runtime/faces.py)."""
        return self.faces.build()

    # --- findings ----------------------------------------------------------------------
    def emit(self, f: Finding) -> None:
        if f.time is None:
            f.time = time.time()  # when the agent saw it (a stall has no log line to date it)
        if self._own_stop(f):
            return
        if self.cross_rank is not None:
            try:
                if self.cross_rank.hold(f):
                    return
            except Exception:
                errs = self.internal_errors_by_component
                errs["hold"] = errs.get("hold", 0) + 1
                log.exception("holding a finding failed; it goes out as it is")
        if f.kind == "stall" and not f.resolved and not self.cfg.dumps.on_stall:
            # Say so, so nobody goes looking for stacks that were never taken.
            with_outcome(f, DumpOutcome("off"))
        elif f.kind == "stall" and not f.resolved and f.diagnosis is not None:
            # Completed by the cross-rank diagnosis (runtime/diagnose.py), which took the stacks and
            # names them in its own words: the outcome goes with it as data (the alert's link to
            # the stacks), and in words only if they did not come.
            outcome = self._outcome()
            if outcome.state == "captured":
                f.diagnosed(dumps=outcome)
            else:
                with_outcome(f, outcome)
        elif f.kind == "stall" and not f.resolved:
            if self._spawn(self._stall_with_dumps(f)):
                # Sent once the stacks are taken (seconds), saying where they are or why they
                # are not: a stall alert never promises stacks that did not come.
                self._held_stalls.setdefault(f.rank, [])
                return
            problem = self.dump_problem()  # no loop to capture on: say what is known
            if problem is not None:
                with_outcome(f, DumpOutcome("unavailable", problem=problem))
        elif f.kind == "stall" and f.resolved and f.rank in self._held_stalls:
            self._held_stalls[f.rank].append(f)  # after the stall it ends, never before
            return
        self._publish(f)

    def _own_stop(self, f: Finding) -> bool:
        """A ``traceback`` from a process still running that is the interrupt the agent's own
        forwarded stop raised (a Ctrl-C's KeyboardInterrupt in a launcher waiting for its workers):
        the user's stop, which the escalation (``runner.term_grace``) ends, not a finding. Without
        a stop from the agent, an interrupt in a rank that goes on running stays a finding: someone
        else stopped it, and it did not end. A rank whose peer died first on the same stop gets
        the lost connection with the interrupt chained on it (``During handling of the above
        exception``): a ``peer_error`` that ends in the interrupt is the stop too."""
        if f.kind not in STOP_TRACEBACKS or f.resolved or not self.stops_sent:
            return False
        lines = [str(x) for x in (f.evidence.get("lines") or [])]
        if not is_interrupt(lines):
            return False
        log.info(
            "rank %s: the %s the forwarded %s raised (log line %s) is the stop, not a finding",
            f.rank,
            next((x.strip() for x in reversed(lines) if x.strip()), "interrupt")[:80],
            _signame(self.stops_sent[0]),
            f.line,
        )
        return True

    def _publish(self, f: Finding) -> None:
        if self.enrich is not None:
            try:
                f = self.enrich(f)
            except Exception:
                self.internal_errors_by_component["enrich"] = (
                    self.internal_errors_by_component.get("enrich", 0) + 1
                )
                log.debug("finding enricher failed", exc_info=True)
        self.findings.append(f)
        if len(self.findings) > 10_000:
            del self.findings[:5_000]
        sinks: list[Sink] = [*self.sinks, self.alerts] if self.alerts is not None else self.sinks
        for sink in sinks:
            try:
                sink.send(f)
            except Exception:
                name = type(sink).__name__
                self.sink_errors[name] = self.sink_errors.get(name, 0) + 1
                if self.sink_errors[name] == 1:
                    log.exception("sink %s failed (further failures only counted)", name)

    async def _stall_with_dumps(self, f: Finding) -> None:
        try:
            if self._dump_lock.locked():  # a capture is running (a peer's incident, SIGUSR1): its stacks
                async with self._dump_lock:
                    pass
            else:
                stacks = asyncio.Event()
                capture = asyncio.ensure_future(self.capture_dumps("stall", on_stacks=stacks.set, run=f.run))
                self._tasks.add(capture)  # runs on (extras) after the finding is out
                capture.add_done_callback(self._tasks.discard)
                waiting = asyncio.ensure_future(stacks.wait())
                await asyncio.wait({capture, waiting}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
            outcome = self._outcome()
            judged = False
            if outcome.link is not None and self.cross_rank is not None:
                try:  # a launcher's workers in the stacks (mp.spawn): judged as peers
                    judged = await self.cross_rank.launcher_workers(f, Path(outcome.link))
                except (asyncio.TimeoutError, OSError) as e:  # the folder: the finding goes as it is
                    log.warning(
                        "cannot read the stacks back from %s: %s", outcome.link, e or type(e).__name__
                    )
                except Exception:
                    log.exception("judging a launcher's workers failed")
            if judged:
                f.diagnosed(dumps=outcome)  # the judgement names the folder in its own words
            else:
                with_outcome(f, outcome)
        except Exception:
            log.exception("stall dumps failed")
            with_outcome(f, DumpOutcome("error"))
        finally:
            held = self._held_stalls.pop(f.rank, [])
            self._publish(f)
            for h in held:
                self._publish(h)

    def _outcome(self) -> DumpOutcome:
        """The last capture's outcome; when no stack came, with why dumps cannot work here."""
        outcome = self.last_capture
        if outcome.state == "captured":
            return outcome
        return dataclasses.replace(outcome, problem=self.dump_problem())

    def dump_problem(self) -> str | None:
        """Why a py-spy dump cannot work here, known before trying (or from the last try)."""
        if find_py_spy(self.cfg.dumps.py_spy) is None:
            error, text = py_spy_missing(self.cfg.dumps.py_spy)
            return f"{error}: {' '.join(text.split())}"
        full = self.dumps_disk_full()
        if full is not None:
            return full
        if self.last_dump_problem is not None:
            return self.last_dump_problem
        scope = yama_scope()
        if scope is None or scope == 0:
            return None
        wrapper = self.launched and not self._child_is_python()
        return ptrace_problem(launched=self.launched, scope=scope, cap=has_cap_sys_ptrace(), wrapper=wrapper)

    def dumps_disk_full(self) -> str | None:
        """From the last free-space sample (taken off the loop): the dumps folder is full."""
        for sample in self.disk_latest:
            if "dumps" in sample.roles.values() and is_full(sample):
                return (
                    f"the dumps folder {self.store.root} is full ({human(sample.free)} free of "
                    f"{human(sample.total)}): no stack file can be written. Fix: free space there or set "
                    "dumps.dir to a larger filesystem."
                )
        return None

    def log_disk_full(self, w: RankWatcher) -> str | None:
        """The watcher's log is on a filesystem the last free-space sample found full."""
        folders = {str(s.path.parent) for s in w.streams}
        for sample in self.disk_latest:
            if is_full(sample) and folders & {p for p, role in sample.roles.items() if role == "log"}:
                return f"{', '.join(sorted(folders))} has {human(sample.free)} free of {human(sample.total)}"
        return None

    def _child_is_python(self) -> bool:
        pids = self.watchers[0].pids() if self.watchers else []
        if not pids:
            return True  # nothing known to say otherwise
        try:
            proc = psutil.Process(pids[0])
            argv = [os.path.basename(a) for a in proc.cmdline()[:3]]
            names = [proc.name(), *argv[:1]]
        except (psutil.Error, OSError):
            return True
        if any(a in LAUNCHERS for a in argv):  # a Python launcher: the ranks are its children
            return False
        return any(n.startswith("python") for n in names)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> bool:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()
            return False
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    # --- dumps -------------------------------------------------------------------------
    def _joinable(self, reason: str, now: datetime, run: str | None = None) -> list[IncidentInfo]:
        """This run's incidents of ``reason`` within the join window, oldest first: every agent
        sorts them the same way, so agents that name one at the same moment agree on it."""
        why = sanitise_reason(reason)
        since = now - timedelta(seconds=JOIN_WINDOW_S)
        found = [
            i
            for i in self.store.list_incidents(run or self.identity.run, since=since)  # not older than it
            if i.reason == why and (i.time - now).total_seconds() <= JOIN_WINDOW_S  # nor far ahead (skew)
        ]
        return sorted(found, key=lambda i: (i.time, i.name))

    def job_run(self) -> str:
        """The run of what the agent watches when that is one job (``run -- torchrun``: the
        workers' run id), else the agent's own: where a capture of every rank goes (SIGUSR1)."""
        runs = {w.identity.run for w in self.watchers if w.rank is not None}
        return runs.pop() if len(runs) == 1 else self.identity.run

    def run_folder(self, run: str | None = None) -> runfolder.RunFolder:
        """``<dumps.dir>/<run>``: made 0700 (0750 with ``dumps.group``) and refused when anyone
        else owns it or may write to it (another user can pre-create a run's folder on /scratch).
        ``run``: a watched job's own run (a node daemon watches many), else the agent's."""
        return runfolder.RunFolder(
            self.cfg.dumps.dir,
            sanitise_run(run or self.identity.run),
            group=runfolder.resolve_group(getattr(self.cfg.dumps, "group", None)),
            errors=self.internal_errors_by_component,
        )

    def _incident(self, reason: str, run: str | None = None) -> str:
        now = datetime.now(timezone.utc)
        refused = self.run_folder(run).check()
        if refused is not None:
            raise refused  # no stack goes where another user can read or swap it
        try:
            if found := self._joinable(reason, now, run):
                return found[0].name
            # Create it now, not when the first dump lands: an agent firing a second later
            # (another UTC second) must find it, or one hang splits into two folders.
            name = incident_name(reason, now)
            mine = self.store.incident_dir(run or self.identity.run, name)
            first = self._joinable(reason, now, run)[0]
            if first.name != name:  # a peer named one at the same moment: the oldest wins
                with contextlib.suppress(OSError):
                    mine.rmdir()
            return first.name
        except Exception:
            log.debug("could not list or create incidents", exc_info=True)
        return incident_name(reason, now)

    def peer_incident(self) -> str | None:
        """A stall incident of this run, opened by another agent within the join window, that
        holds none of this agent's live ranks yet. A rank that logs no step lines is judged
        stalled minutes after the one that logs; without this its stack would be missing from
        the incident that the alert points to, and ``dumps diff`` could not name the suspect."""
        if self._dump_lock.locked():
            return None
        ranks = {w.rank if w.rank is not None else 0 for w in self.watchers if w.known_pids()}
        if not ranks:
            return None
        if self.run_folder().check(create=False) is not None:
            return None  # another user's folder: never join (or write) an incident there
        # One stat per poll while nothing happens: a new incident changes the run folder's
        # mtime; one still being written (no rank file yet) is looked at again until it has one.
        try:
            mtime = self.store.run_dir(self.identity.run).stat().st_mtime_ns
        except OSError:
            return None
        settled = time.time() - mtime / 1e9 > 2.0  # coarse mtimes (NFS): a second may hide a change
        if mtime == self._run_mtime and settled and not self._peer_pending:
            return None
        self._run_mtime = mtime
        now = datetime.now(timezone.utc)
        pending: set[str] = set()
        found = None
        for info in self._joinable("stall", now):
            if info.name in self._joined:
                continue
            if not info.ranks or found is not None:  # its author is still dumping, or next poll
                pending.add(info.name)
                continue
            self._joined.add(info.name)
            if not ranks & set(info.ranks):
                found = info.name
        self._peer_pending = pending
        return found

    async def capture_dumps(
        self,
        reason: str,
        incident: str | None = None,
        on_stacks: Callable[[], None] | None = None,
        run: str | None = None,
    ) -> Path | None:
        """py-spy every watched process into one incident folder; never raises. ``on_stacks``
        is called once the stacks are written, before the slower extras (flight recorder).
        ``run``: only that job's processes, into that job's folder (a node daemon watches many
        jobs and users: one job's hang never dumps another's stacks)."""
        if self._dump_lock.locked():
            return self.last_incident
        async with self._dump_lock:
            try:
                return await self._capture(reason, incident, on_stacks, run)
            except Exception:
                log.exception("dump capture failed")
                return None

    async def dumps_io(
        self, fn: Callable[..., T], *args: Any, name: str = DUMPS_IO, timeout: float | None = None
    ) -> T:
        """A call into the (shared) dumps folder off the loop (``offloop.fs``: a daemon thread, a
        timeout, one stuck call per ``name``), its failures counted under ``dumps``."""
        return await offloop.fs(
            fn,
            *args,
            name=name,
            timeout=timeout,
            errors=self.internal_errors_by_component,
            component="dumps",
        )

    def other_ranks(self, w: RankWatcher) -> frozenset[int]:
        """The processes of the ranks other than ``w``'s: a script's dump leaves out the ranks it
        started itself (Lightning), each a rank of its own, dumped by its own pipeline."""
        return frozenset(
            o.prober.pid for o in self.watchers if o is not w and o.prober is not None and not o.exited
        )

    async def _capture(
        self,
        reason: str,
        incident: str | None = None,
        on_stacks: Callable[[], None] | None = None,
        run: str | None = None,
    ) -> Path | None:
        c = self.cfg.dumps
        store_run = run or self.job_run()
        if incident is None:
            try:
                incident = await self.dumps_io(self._incident, reason, store_run, name=INCIDENT_IO)
            except (asyncio.TimeoutError, OSError) as e:
                self._no_incident(e)
                return None
        self._joined.add(incident)
        folder: Path | None = None
        captured: list[int | None] = []  # as the findings name the ranks
        failures: dict[int, str] = {}  # as the dump files name them
        dumped: list[int] = []
        self.last_capture = DumpOutcome("failed")
        for w in self.watchers:
            pids = w.pids()
            if not pids or (run is not None and w.identity.run != run):
                continue
            rank = w.rank if w.rank is not None else 0
            result = await capture_off_loop(
                pids[0],
                errors=self.internal_errors_by_component,
                py_spy=c.py_spy,
                native=c.native,
                locals_=c.locals,
                subprocesses=True,
                nonblocking=c.nonblocking,
                timeout=c.timeout,
                others=self.other_ranks(w),
            )
            meta = {
                "run": w.identity.run,
                "user": w.identity.user,
                "world_size": w.identity.world_size,
                "node": self.identity.node,
                "reason": reason,
                "last_step": w.engine.state.last_step,
                "local_rank": w.identity.local_rank,
                **self._report_context(w, rank),
            }
            try:
                txt = await self.dumps_io(self.store.write_rank, store_run, incident, rank, result, meta)
            except asyncio.TimeoutError:
                failures[rank] = f"the dumps folder {self.store.root} does not answer (hung filesystem?)"
                continue
            except OSError as e:
                self._store_failed(e)
                failures[rank] = self._store_problem(e)
                continue
            folder = txt.parent
            self.dumps_captured += 1
            if result.ok:
                captured.append(w.rank)
                self.last_dump_problem = None
            else:
                why = result.error or "unknown"
                failures[rank] = f"{why}: {first_line(result.text)}"
                self.dumps_failed[why] = self.dumps_failed.get(why, 0) + 1
                log.warning("rank %s: stack dump failed: %s (see %s)", rank, result.error, txt)
                if result.error == "ptrace denied":
                    self.last_dump_problem = (
                        "the kernel refused ptrace on the last try. Fix: CAP_SYS_PTRACE for the agent, "
                        "kernel.yama.ptrace_scope=0, or on Kubernetes shareProcessNamespace plus SYS_PTRACE "
                        f"(details in {txt})."
                    )
            dumped.append(rank)
        outcome = DumpOutcome.of_capture(str(folder) if folder else None, tuple(captured), failures, None)
        self.last_capture = outcome
        if folder is not None:
            self.last_incident = folder
            log.warning("stack dumps written to %s", folder)
        if outcome.link is not None and self.alerts is not None:  # failure notes are no link to stacks
            with contextlib.suppress(Exception):
                self.alerts.dumps_taken(outcome)  # the alerts link them
        if on_stacks is not None:
            on_stacks()  # the stall finding goes out now; the extras below can take seconds
        for rank in dumped:
            try:
                extras = await self.dumps_io(self._extras, rank, name="rankwatch-extras")
            except asyncio.TimeoutError:
                continue
            for name, data in extras.items():
                try:
                    await self.dumps_io(self.store.write_extra, store_run, incident, name, data)
                except asyncio.TimeoutError:
                    break
                except OSError as e:
                    self._store_failed(e)
        return folder

    def _report_context(self, w: RankWatcher, rank: int) -> dict[str, Any]:
        """What ``rankwatch report`` shows beside the stacks, as the agent knows it at capture
        time: the rank's last steps with their times, its log tail, its recent findings, its
        process and GPU readings, the world size and the settings that judged the stall.
        Bounded (a few KB per rank) and best effort: a part that fails is left out."""
        out: dict[str, Any] = {}
        now = time.time()
        with contextlib.suppress(Exception):
            world = getattr(w.identity, "world_size", None) or self.identity.world_size
            if world:
                out["world_size"] = int(world)
        with contextlib.suppress(Exception):
            steps = [s for s in list(w.engine.state.steps)[-REPORT_STEPS:] if s.step is not None and s.time]
            out["recent_steps"] = [[int(s.step or 0), round(float(s.time or 0.0), 3)] for s in steps]
        with contextlib.suppress(Exception):
            out["log_tail"] = [line[:REPORT_LINE] for line in list(w.tail)[-REPORT_TAIL:]]
        with contextlib.suppress(Exception):
            mine = [
                f
                for f in self.findings[-2000:]
                if f.rank == w.rank and f.time is not None and now - f.time <= REPORT_WINDOW_S
            ][-REPORT_FINDINGS:]
            out["findings"] = [
                {
                    "kind": f.kind,
                    "severity": f.severity.label,
                    "rank": f.rank,
                    "step": f.step,
                    "time": f.time,
                    "message": f.message[:REPORT_MESSAGE],
                    "resolved": f.resolved,
                }
                for f in mine
            ]
        with contextlib.suppress(Exception):
            ps = w.last_sample
            if ps is not None:
                out["process"] = {
                    "cpu_percent": round(ps.cpu_percent, 1),
                    "rss_bytes": ps.rss_bytes,
                    "threads": ps.threads,
                    "state": ps.state,
                }
        with contextlib.suppress(Exception):
            if self.gpu_latest is not None:
                by_rank, _up = self.gpu_latest()
                keep = ("index", "name", "lost", "utilization", "memory_used", "memory_total", "temperature")
                out["gpu"] = [{k: getattr(g, k, None) for k in keep} for g in list(by_rank.get(rank, []))[:8]]
        with contextlib.suppress(Exception):
            st = self.cfg.stall
            judged: dict[str, Any] = {
                f"stall.{k}": float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                for k, v in dataclasses.asdict(st).items()
            }
            with contextlib.suppress(Exception):
                timeout = w.liveness().timeout
                if timeout is not None:
                    judged["stall timeout now (s)"] = round(timeout, 1)
            out["judged_by"] = judged
        return out

    def _no_incident(self, e: BaseException) -> None:
        """The incident folder could not be opened: the outcome says why for every watched rank
        (a hung or refused folder, never "no watched process to dump")."""
        if isinstance(e, asyncio.TimeoutError):
            why = f"the dumps folder {self.store.root} did not answer (hung filesystem?): no stack written"
        elif isinstance(e, safeio.Refused):
            why = f"the run folder is refused: {e}; no stack was written there"
        else:
            assert isinstance(e, OSError)
            self._store_failed(e)
            why = self._store_problem(e)
        ranks = sorted({w.rank if w.rank is not None else 0 for w in self.watchers if w.pids()})
        self.last_capture = DumpOutcome("failed", failed={r: why for r in ranks or [0]})

    def _store_problem(self, e: OSError) -> str:
        if e.errno == errno.ENOSPC:
            why = f"the dumps folder {self.store.root} is full (ENOSPC: no space left on device)"
            self.last_dump_problem = f"{why}. Fix: free space there or set dumps.dir to a larger filesystem."
            self.dumps_failed["disk full"] = self.dumps_failed.get("disk full", 0) + 1
            return why
        reason = "dumps folder not writable"
        self.dumps_failed[reason] = self.dumps_failed.get(reason, 0) + 1
        return f"cannot write under {self.store.root}: {e.strerror or e}"

    def _store_failed(self, e: OSError) -> None:
        """A full or read-only dumps dir loses these stacks, not the agent: said once, then counted."""
        errs = self.internal_errors_by_component
        errs["dumps"] = errs.get("dumps", 0) + 1
        if errs["dumps"] == 1:
            log.error(
                "cannot write stack dumps under %s: %s; monitoring goes on (further failures only counted)",
                self.store.root,
                e.strerror or e,
            )

    def _extras(self, rank: int) -> dict[str, str | bytes]:
        """Best effort: PyTorch's flight recorder and NCCL's RAS report, or why they are absent."""
        out: dict[str, str | bytes] = {}
        notes: list[str] = []
        if self.fr_prefix is not None:
            pipe_prefix, trace_prefix = self.fr_prefix
            pipe = Path(f"{pipe_prefix}{rank}.pipe")
            trace = Path(f"{trace_prefix}{rank}")
            try:
                if pipe.exists() and stat.S_ISFIFO(pipe.stat().st_mode):
                    before = _mtime(trace)  # a trace left by an earlier stall is not this one's
                    fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
                    try:
                        os.write(fd, b"1\n")
                    finally:
                        os.close(fd)
                    deadline = time.monotonic() + 5.0
                    while time.monotonic() < deadline and not _fresh(trace, before):
                        time.sleep(0.1)
                    if _fresh(trace, before):
                        time.sleep(0.2)  # PyTorch writes then renames; let a slow write finish
                        out[f"flight-recorder-rank-{rank}.pkl"] = trace.read_bytes()
                    else:
                        notes.append(f"flight recorder: asked via {pipe}, no new trace at {trace} within 5s")
                else:
                    notes.append(
                        f"flight recorder: absent (no pipe at {pipe}: needs PyTorch >= 2.5 with an NCCL "
                        "process group and TORCH_NCCL_TRACE_BUFFER_SIZE > 0)"
                    )
            except OSError as e:
                notes.append(f"flight recorder: failed: {e}")
        else:
            notes.append(
                "flight recorder: not configured (watch mode, or TORCH_NCCL_DEBUG_INFO_PIPE_FILE unset)"
            )
        try:
            with socket.create_connection(("127.0.0.1", NCCL_RAS_PORT), timeout=1.0) as s:
                s.settimeout(3.0)
                s.sendall(b"CLIENT PROTOCOL 2\nSTATUS\n")
                chunks = []
                with contextlib.suppress(OSError):
                    while data := s.recv(65536):
                        chunks.append(data)
                out[f"nccl-ras-rank-{rank}.txt"] = b"".join(chunks)
        except OSError as e:
            notes.append(f"NCCL RAS: absent (127.0.0.1:{NCCL_RAS_PORT}: {e.strerror or e})")
        out[f"extras-rank-{rank}.txt"] = "\n".join(notes) + "\n"
        return out

    # --- lifecycle ---------------------------------------------------------------------
    def install_dump_signal(self) -> None:
        """SIGUSR1 to the agent captures stacks now (never forwarded: it would kill an unprepared child)."""
        loop = asyncio.get_running_loop()
        on_signal(
            loop,
            signal.SIGUSR1,
            lambda: self._spawn(self.capture_dumps("manual")),
            errors=self.internal_errors_by_component,
        )

    async def settle(self, timeout: float = 30.0) -> None:
        """Wait for dump captures in flight (bounded)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)


def _mtime(path: Path) -> float | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime if st.st_size > 0 else None


def _fresh(path: Path, before: float | None) -> bool:
    m = _mtime(path)
    return m is not None and (before is None or m > before)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
