"""The watched process ended: a crash, a stop we asked for, or a run that finished.

Judged from the ``ProcessExit`` event and what the rank printed (its state): a crash
finding unless it ended cleanly, on the stop signal the agent forwarded, or nothing tells.
One finding per death: when the error that killed it already went out as a finding (an
``oom`` the moment it was printed), the end is an info ``process_exit`` naming that error.
``requested``: the agent forwarded a stop (SIGTERM, SIGINT, SIGHUP; the number when known).
However the child then ends (killed by it, or exiting non-zero from its handler, with a
KeyboardInterrupt traceback) it did what it was told: no critical crash. Only an error of
its own in the log makes it a ``crash``, and then a warning.
"""

from __future__ import annotations

import re
import signal as _signal
from typing import TYPE_CHECKING

from rankwatch.detectors.base import Detector, DetectorContext, RunStep
from rankwatch.detectors.crash import crash_finding, how_it_ended, pick_cause
from rankwatch.detectors.registry import register
from rankwatch.events import Event, ProcessExit, ProcessStart, Progress
from rankwatch.records import ErrorRecord, Finding, Severity
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.config.schema import Config


# multiprocessing's line before a worker's traceback: "Process SpawnProcess-1:".
_MP_HEADER = re.compile(r"^Process \S+:$")
# torchelastic's handler in the launcher (torch/distributed/elastic/multiprocessing/api.py):
# the launcher itself got a stop signal, from outside the job (``timeout``, scancel, kill, a
# pod's deletion); it stops its workers and re-raises.
_LAUNCHER_SIGNALLED = re.compile(r"SignalException: Process \d+ got signal: (\d+)")
_STOP_SIGNALS = frozenset({_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP})


@register
class ExitDetector(Detector):
    kinds = ("process_exit", "crash", "restarts_exhausted")  # the last: restarts_exhausted() below
    # Progress: the run's step, for a launcher's worker that prints none of its own.
    accepts = (ProcessExit, Progress, ProcessStart)
    section = "process"  # process.tail_lines: the output kept for the crash's evidence

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> ExitDetector:
        return cls(ctx.rank, ctx.path)

    def __init__(self, rank: int | None, path: str | None) -> None:
        self.rank = rank
        self.path = path
        self.run = RunStep()

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if self.run.observe(record):
            return []
        if not isinstance(record, ProcessExit):
            return []
        f = self.judge(state, record)
        return [f] if f is not None else []

    def judge(self, state: RankState, e: ProcessExit) -> Finding | None:
        exit_code, signal, requested = e.exit_code, e.signal, e.requested
        status = f"signal {signal}" if signal else f"exit code {exit_code}"
        if requested:
            cause, _ = pick_cause(state)
            interrupted = cause is not None and (
                _interrupt(cause.summary) or _only_interrupts(cause.evidence)
            )
            if cause is None or interrupted or cause.severity < Severity.CRITICAL:
                how = (
                    f"{_signame(requested)} {e.stopped_by}"
                    if requested is not True
                    else "forwarded stop signal"
                )
                return self._exit(state, f"process stopped on the {how} ({status})", e.wall)
        if exit_code is None and signal is None and not any(isinstance(x, ErrorRecord) for x in state.errors):
            msg = "watched process exited (exit status unknown: not this agent's child; no error in its log)"
            found = self._exit(state, msg, e.wall)
            found.evidence = {"status_known": False}  # a possible first failure (runtime/diagnose.py)
            return found
        cause, _ = pick_cause(state)
        clean = exit_code == 0 and signal is None
        stopped = (
            _LAUNCHER_SIGNALLED.search(cause.summary) if cause is not None and self.rank is None else None
        )
        if stopped is not None and int(stopped[1]) in _STOP_SIGNALS:
            # A stop someone asked for (``timeout 3600 torchrun``, ``kill``): the workers the
            # launcher stopped say so; no rank failed, so the job's end is no crash.
            sig = _signame(int(stopped[1]))
            msg = (
                f"the launcher was stopped from outside the agent: it got {sig} (a `timeout`, scancel, "
                f"kill, a pod's deletion), stopped its workers and ended ({status})"
            )
            return self._exit(state, msg, e.wall)
        # A warning told first (an NCCL WARN, gloo's lost peer) does not say the rank died: the
        # crash does (a lost peer's, named after the rank that failed first). A rank the launcher
        # stopped after its own critical error went out (every rank's OOM at once) ended of that
        # error: no second finding naming another rank's as the first failure.
        if (
            cause is not None
            and cause.reported
            and cause.severity >= Severity.CRITICAL
            and not (clean or e.disk_full is not None)
        ):
            return self._told(state, e, cause)
        crash = crash_finding(
            state,
            exit_code=exit_code,
            signal=signal,
            tail=list(e.tail),
            rank=self.rank,
            path=state.path or self.path,  # the log it writes now (a restart may move it)
            disk_full=e.disk_full,
            run_step=self.run.step,
        )
        if crash is not None:
            crash.time = crash.time or e.wall
            if requested:
                crash.severity = Severity.WARNING
                crash.message = f"after the stop signal {e.stopped_by}: {crash.message}"
                # A death by a stop signal (the launcher's, after a peer failed; the user's) is
                # never a first failure: the cross-rank judgement reads this (runtime/diagnose.py).
                crash.evidence = {**crash.evidence, "stopped_by": e.stopped_by}
        return crash

    def _told(self, state: RankState, e: ProcessExit, cause: ErrorRecord) -> Finding:
        """The death of a process whose fatal error already went out as a critical finding (an
        ``oom``, a ``cuda_error``): one finding per death, so its end is the record of how it
        ended, tied to that error, not a second critical finding."""
        where = f" (line {cause.line})" if cause.line is not None else ""
        how = how_it_ended(state, e.exit_code, e.signal, self.run.step)
        if e.requested:
            how = f"{how}, on the stop signal {e.stopped_by}"
        # A launching script's end after its worker's error (mp.spawn re-raises it): that rank's.
        whose = "its" if cause.rank is None or cause.rank == self.rank else f"rank {cause.rank}'s"
        msg = f"{how}: {whose} {cause.kind} finding above{where} is the cause: {cause.summary[:300]}"
        found = self._exit(state, msg, e.wall)
        found.evidence = {
            "exit_code": e.exit_code,
            "signal": e.signal,
            "cause_kind": cause.kind,
            "cause_reported": True,  # a death all the same (runtime/workers.py counts it)
        }
        return found

    def _exit(self, state: RankState, message: str, wall: float | None) -> Finding:
        return Finding(
            kind="process_exit",
            severity=Severity.INFO,
            rank=self.rank,
            message=message,
            step=state.last_step if state.last_step is not None else self.run.step,
            path=state.path or self.path,  # the log it writes now (a restart may move it)
            time=wall,
        )


def _signame(sig: int | bool) -> str:
    try:
        return _signal.Signals(int(sig)).name
    except ValueError:
        return f"signal {sig}"


def _interrupt(summary: str) -> bool:
    """The traceback a stop signal itself prints (Python's default SIGINT handler, sys.exit,
    torchelastic's handler: ``SignalException: Process N got signal: 15``)."""
    return "KeyboardInterrupt" in summary or "SystemExit" in summary or "SignalException" in summary


def _only_interrupts(lines: object) -> bool:
    """A traceback with no exception line but interrupts: the tracebacks that the processes of
    one process group print together on one Ctrl-C (a launcher's workers) interleave into pieces
    with no final line of their own, or only a KeyboardInterrupt; after a stop that is the stop's
    doing, not an error of the process's own."""
    if not isinstance(lines, (list, tuple)) or not lines or not str(lines[0]).startswith("Traceback ("):
        return False
    raised = [
        x
        for x in map(str, lines)
        if x.strip() and not x[0].isspace() and not x.startswith("Traceback (") and not _MP_HEADER.match(x)
    ]
    return all(_interrupt(x) for x in raised)


def restarts_exhausted(
    *,
    restarts: int,
    max_restarts: int,
    status: int,
    root_rank: int | None,
    root_step: int | None,
    cause: str | None,
    time: float | None = None,
) -> Finding:
    """The launcher gave up: its last attempt failed with no restart left (torchrun's
    ``--max-restarts``), so the job is dead, whatever alert its first failure already raised.
    Each attempt's failure is told by the ranks' own findings; this is the end of the job, a
    problem of its own (kind ``restarts_exhausted``), naming the launcher's root cause (its
    failure box's "Root Cause (first observed failure)") as the suspect."""
    how = f"exit status {status}" if status >= 0 else f"signal {-status} ({_signame(-status)})"
    root = ""
    if root_rank is not None:
        at = f" at step {root_step}" if root_step is not None else ""
        root = f"; root cause rank {root_rank}{at}"
        if cause:
            root += f": {cause[:300]}"
    f = Finding(
        kind="restarts_exhausted",
        severity=Severity.CRITICAL,
        rank=root_rank,
        message=(
            f"the launcher gave up: restarts exhausted ({restarts} of {max_restarts}), every attempt "
            f"failed and the job is dead ({how}){root}. Restarting cannot help while the cause is "
            "there: fix it, then start the job again."
        ),
        step=root_step,
        time=time,
        evidence={"restarts": restarts, "max_restarts": max_restarts, "exit_code": status},
    )
    if root_rank is not None:
        f.diagnosed(suspects=(root_rank,))
    return f
