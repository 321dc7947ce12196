"""The process ended badly: say how, and why, from what the rank printed before it died.

The cause comes from the error signatures already in the rank's state. An error the run
survived (an OOM caught by a batch-size finder, an early NCCL WARN) is not the cause, so
only errors at or after the last step line count.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Sequence

from rankwatch.detectors.base import last_counted_epoch
from rankwatch.errorkinds import CRASH_PRIORITY, FIXES
from rankwatch.records import ErrorRecord, Finding, Severity
from rankwatch.state import RankState

TAIL = 20
_PRIORITY = CRASH_PRIORITY  # which error names a crash best: rankwatch.errorkinds

_SIGNAL_HINTS = {
    _signal.SIGKILL: "SIGKILL with no traceback usually means the host OOM killer: check `dmesg -T | "
    "grep -i 'killed process'` or Slurm's `slurmstepd: ... oom_kill event`; otherwise a scheduler or "
    "launcher killed it (time limit, preemption, a peer rank failed).",
    _signal.SIGABRT: "After an NCCL timeout this is the PyTorch NCCL watchdog tearing the process down "
    "(TORCH_NCCL_ASYNC_ERROR_HANDLING): the rank that stopped first holds the real error. Otherwise a "
    "C++ exception or assertion (std::terminate).",
    _signal.SIGSEGV: "A segmentation fault in native code (an extension, the driver, a corrupted "
    "install): rerun with PYTHONFAULTHANDLER=1 to get the Python stack.",
    _signal.SIGBUS: "A bus error: often /dev/shm too small for DataLoader workers (docker --shm-size, "
    "a Kubernetes emptyDir medium: Memory) or a file mmapped under the process was truncated.",
    _signal.SIGTERM: "Terminated: a scheduler (Slurm time limit, preemption, Kubernetes eviction) or a "
    "launcher that tore the job down after another rank failed.",
    _signal.SIGINT: "Interrupted (Ctrl-C or a launcher forwarding SIGINT).",
}


def _signame(n: int) -> str:
    try:
        return _signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _after_last_step(state: RankState, errors: list[ErrorRecord]) -> list[ErrorRecord]:
    """Line numbers order the lines of one file only: a rank read from two (torchrun's
    ``--redirects`` puts its steps in stdout and its traceback in stderr) is ordered by the
    time each line was read."""
    if not state.steps:
        return errors
    last = state.steps[-1]
    out = []
    for e in errors:
        if e.line is not None and last.line is not None and e.source == last.source:
            keep = e.line >= last.line
        elif e.time is not None and last.time is not None:
            keep = e.time >= last.time
        else:
            keep = True
        if keep:
            out.append(e)
    return out


def _is_traceback(e: ErrorRecord) -> bool:
    return len(e.evidence) > 1 and any("Traceback" in x for x in e.evidence[:3])


def pick_cause(state: RankState) -> tuple[ErrorRecord | None, list[str]]:
    """The most telling recent error and the fullest traceback that goes with it."""
    errors = _after_last_step(state, list(state.errors))
    critical = [e for e in errors if e.severity >= Severity.CRITICAL] or errors
    ranked = [e for e in critical if e.kind in _PRIORITY] or critical
    if not ranked:
        return None, []
    best = min(_PRIORITY.get(e.kind, len(_PRIORITY)) for e in ranked)
    same = [e for e in ranked if _PRIORITY.get(e.kind, len(_PRIORITY)) == best]
    with_tb = [e for e in same if _is_traceback(e)]
    cause = (with_tb or same)[-1]
    if _is_traceback(cause):
        return cause, list(cause.evidence)
    tbs = [e for e in errors if _is_traceback(e)]
    return cause, list(tbs[-1].evidence if tbs else cause.evidence)


def _shell_signal(exit_code: int | None) -> int | None:
    return exit_code - 128 if exit_code is not None and 128 < exit_code < 128 + 65 else None


def how_it_ended(state: RankState, exit_code: int | None, signal: int | None, step: int | None = None) -> str:
    """``killed by signal 9 (SIGKILL) after step 40``, ``process exited with code 1``...
    ``step``: the run's, for a rank that prints no step of its own."""
    if signal is None and exit_code is not None and exit_code < 0:
        signal = -exit_code
    shell_sig = _shell_signal(exit_code)
    if signal is not None:
        how = f"killed by signal {signal} ({_signame(signal)})"
    elif exit_code is not None:
        how = f"process exited with code {exit_code}"
        if shell_sig is not None:
            how += f" (128+{shell_sig}: {_signame(shell_sig)})"
    else:
        how = "process exited (exit status unknown: not our child)"
    epoch = last_counted_epoch(state)
    step = state.last_step if state.last_step is not None else step
    if epoch is not None:  # a count of epoch records is no step (base.counted_epoch)
        how += f" after epoch {epoch}"
    elif step is not None:
        how += f" after step {step}"
    return how


def crash_finding(
    state: RankState,
    *,
    exit_code: int | None,
    signal: int | None,
    tail: Sequence[str],
    rank: int | None,
    path: str | None,
    disk_full: str | None = None,
    run_step: int | None = None,
) -> Finding | None:
    """A finding for a process that ended, or None for a clean exit.

    ``disk_full``: the agent found the log's filesystem full when the process died (what it
    says about it). In run mode the log is the child's stdout: its writes fail with ENOSPC,
    and the traceback of that failure cannot be written either, so the log alone shows nothing.

    ``run_step``: the run's step, for a rank that prints none of its own.

    ``exit_code`` follows subprocess: negative means killed by that signal. A shell or
    launcher reports 128+N instead; both are decoded. Unknown status (a sidecar cannot
    read a stranger's exit code) with nothing wrong in the log and the run at its last
    step is a finished run, not a crash.
    """
    if signal is None and exit_code is not None and exit_code < 0:
        signal = -exit_code
    if exit_code == 0 and signal is None:
        return None
    cause, traceback = pick_cause(state)
    last_lines = [x.rstrip("\n") for x in list(tail)[-TAIL:]]
    severity = Severity.CRITICAL
    shell_sig = _shell_signal(exit_code)
    if signal is None and exit_code is None:
        done = state.total_steps is not None and state.last_step is not None
        if cause is None and done and state.last_step >= state.total_steps:  # type: ignore[operator]
            return None
        if cause is None:
            severity = Severity.WARNING
    parts = [how_it_ended(state, exit_code, signal, run_step) + "."]
    if disk_full is not None and (
        cause is None or "No space left" in cause.summary or "ENOSPC" in cause.summary
    ):
        parts.append(
            f"Cause (disk full): the log's filesystem is full (ENOSPC): {disk_full}. The rank's writes "
            "to its log (its stdout) failed, which kills a Python process, and the error could not be "
            "written to the log either. Fix: free space there, or move the log (runner.log_dir) to a "
            "larger filesystem."
        )
    elif cause is not None:
        parts.append(f"Cause ({cause.kind}): {cause.summary}.")
        fix = FIXES.get(cause.kind)
        if fix and cause.kind != "crash":
            parts.append(fix)
    elif last_lines:
        parts.append(f"No error was recognised in the log; last line: {last_lines[-1].strip()[:300]}")
    else:
        parts.append("No error was recognised in the log and it printed nothing.")
    sig = signal if signal is not None else shell_sig
    hint = _SIGNAL_HINTS.get(sig) if sig is not None else None  # type: ignore[call-overload]
    if hint and not (sig == _signal.SIGKILL and cause is not None and cause.kind == "oom"):
        parts.append(hint)
    return Finding(
        kind="crash",
        severity=severity,
        rank=rank if rank is not None else state.rank,
        message=" ".join(parts),
        step=None
        if last_counted_epoch(state) is not None
        else state.last_step
        if state.last_step is not None
        else run_step,
        line=cause.line if cause is not None else None,
        path=cause.source if cause is not None and cause.source else path if path is not None else state.path,
        time=cause.time if cause is not None else None,
        evidence={
            "exit_code": exit_code,
            "signal": signal,
            "cause_kind": "disk_full"
            if disk_full is not None and cause is None
            else (cause.kind if cause else None),
            "disk_full": disk_full,
            "traceback": traceback,
            "tail": last_lines,
        },
    )
