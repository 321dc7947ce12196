"""Capture a stack dump of a live process with py-spy.

Blocking on purpose: the agent runs it in a worker thread. Every failure becomes a
``DumpResult`` with ``ok=False`` and a fix the operator can apply, because a dump is
taken at the worst moment (a hung job at 3 AM) and must never take the agent down.

py-spy 0.4 ``dump --json --subprocesses`` prints only the parent's threads, so child
processes (a launcher's ranks) are dumped one by one here, each exactly once.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

MAX_CHILDREN = 32

INSTALL_HINT = (
    "py-spy was not found on PATH nor next to the Python interpreter.\n"
    "Fix: pip install py-spy   (in the agent's environment; the training job needs nothing)"
)

PTRACE_HINT = """\
The kernel refused to let py-spy read the target process (ptrace).
Fix, whichever applies:
  - run the agent as the same user as the training process, or as root;
  - grant the agent CAP_SYS_PTRACE;
  - relax Yama: sysctl kernel.yama.ptrace_scope=0  (1 only allows tracing descendants);
  - Docker: docker run --cap-add SYS_PTRACE ...;
  - Kubernetes sidecar: set `shareProcessNamespace: true` on the pod and
    `securityContext: {capabilities: {add: [SYS_PTRACE]}}` on the rankwatch container."""

_PTRACE_RE = re.compile(r"permission denied|operation not permitted|os error (1|13)\)", re.I)
_GONE_RE = re.compile(r"no such process|os error 3\)|failed to get process executable name", re.I)
_NOT_PYTHON_RE = re.compile(r"failed to find (a )?python|not a python|python version", re.I)


@dataclass
class DumpResult:
    """One py-spy dump; ``threads`` is py-spy's JSON list, every thread carrying its ``pid``."""

    pid: int
    ok: bool
    threads: list[dict[str, Any]]
    text: str
    error: str | None
    duration_s: float
    command: list[str]
    processes: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    captured_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


@dataclass
class _Run:
    rc: int | None
    output: str
    stdout: str = ""
    timed_out: bool = False
    exec_error: str | None = None
    exec_errno: int | None = None


def find_py_spy(name: str = "py-spy") -> str | None:
    """The name on PATH, else the venv's bin next to ``sys.executable`` (agent run without activation)."""
    found = shutil.which(name)
    if found or os.sep in name:
        return found
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def py_spy_missing(name: str) -> tuple[str, str]:
    """(short error, explanation) when ``find_py_spy(name)`` found nothing runnable."""
    if os.sep in name and os.path.exists(name):
        return "py-spy not runnable", (
            f"{name} exists but the agent may not execute it: permission denied (no x bit for the "
            "agent's user, or a filesystem mounted noexec).\nFix: chmod +x it, or point dumps.py_spy at a "
            "py-spy the agent may run."
        )
    if os.sep in name:
        return "py-spy not found", f"{name} (dumps.py_spy) does not exist.\n{INSTALL_HINT}"
    return "py-spy not found", INSTALL_HINT


def _process_info(pid: int) -> dict[str, Any]:
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            # ``started`` orders a launcher's children by their start (torch.multiprocessing.spawn
            # starts process i before i+1): dumps/classify.py numbers them by it.
            return {
                "pid": pid,
                "ppid": proc.ppid(),
                "cmdline": " ".join(proc.cmdline()) or proc.name(),
                "started": proc.create_time(),
            }
    except (psutil.Error, OSError):
        return {"pid": pid, "ppid": None, "cmdline": None}


def _status(pid: int) -> str | None:
    try:
        return psutil.Process(pid).status()
    except (psutil.Error, OSError):
        return None


def _alive(pid: int) -> bool:
    status = _status(pid)
    return status is not None and status != psutil.STATUS_ZOMBIE


def _run(cmd: list[str], timeout: float) -> _Run:
    env = dict(os.environ, RUST_BACKTRACE="0")
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return _Run(rc=None, output="", exec_error=exc.strerror or str(exc), exec_errno=exc.errno)
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.01))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        try:
            out, err = proc.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
        return _Run(rc=None, output=(out + err).decode(errors="replace"), timed_out=True)
    stdout = out.decode(errors="replace")
    return _Run(rc=proc.returncode, output=stdout + err.decode(errors="replace"), stdout=stdout)


def _trim(output: str, limit: int = 20) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    return "\n".join(lines[:limit])


def _classify(pid: int, run: _Run, timeout: float) -> tuple[str, str]:
    """(short error, explanation with a fix) for a failed py-spy run."""
    said = _trim(run.output)
    quoted = f"\npy-spy said:\n{said}" if said else ""
    if run.timed_out:
        state = _status(pid)
        return "timeout", (
            f"py-spy did not finish within {timeout:g}s and was killed"
            f" (process state: {state or 'unknown'}).\n"
            "The target may be in uninterruptible I/O (D state) or the node is overloaded;"
            " retry with a longer timeout or with --nonblocking." + quoted
        )
    if re.search(r"no space left on device|os error 28\)", run.output, re.I):
        return "disk full", "py-spy could not write (ENOSPC: no space left on device)." + quoted
    if run.rc is not None and run.rc < 0:
        try:
            name = signal.Signals(-run.rc).name
        except ValueError:
            name = f"signal {-run.rc}"
        return "py-spy killed", f"py-spy was killed by {name} (the OOM killer? a seccomp policy?)." + quoted
    gone = f"pid {pid} exited before or during the dump." + quoted
    if not _alive(pid):
        return "process gone", gone
    # Checked before "gone": py-spy reports an unreadable /proc/<pid>/exe like a missing one.
    if _PTRACE_RE.search(run.output):
        return "ptrace denied", PTRACE_HINT + quoted
    if _GONE_RE.search(run.output):
        return "process gone", gone
    if _NOT_PYTHON_RE.search(run.output):
        cmd = _process_info(pid).get("cmdline") or "?"
        return "not a python process", (
            f"pid {pid} ({cmd}) does not look like a Python process (nor has a Python process below"
            " it). Point rankwatch at the python rank itself, or at a wrapper that starts it." + quoted
        )
    return "py-spy failed", f"py-spy exited with status {run.rc}." + quoted


def _not_started(exe: str, run: _Run) -> tuple[str, str]:
    """(short error, explanation) for a py-spy that could not be executed: each cause its own."""
    err = run.exec_errno
    if err == errno.ENOENT:
        return "py-spy not found", f"{exe} does not exist (any more).\n{INSTALL_HINT}"
    if err in (errno.EACCES, errno.EPERM):
        return "py-spy not runnable", (
            f"could not execute {exe}: permission denied (not executable by the agent's user, or on a "
            "filesystem mounted noexec).\nFix: chmod +x it, or point dumps.py_spy at a py-spy the agent "
            "may run."
        )
    if err == errno.ENOEXEC:
        return "py-spy not runnable", f"{exe} is not a program this machine can run (wrong architecture?)."
    if err in (errno.ENOMEM, errno.EAGAIN):
        return (
            "py-spy not runnable",
            f"could not start {exe}: {run.exec_error} (the node is out of memory or processes).",
        )
    return "py-spy not runnable", f"could not start {exe}: {run.exec_error}"


def _flags(native: bool, locals_: bool, nonblocking: bool) -> list[str]:
    flags = ["--native"] if native else []
    flags += ["--locals"] if locals_ else []
    flags += ["--nonblocking"] if nonblocking else []
    return flags


def _dump_once(cmd: list[str], pid: int, timeout: float) -> tuple[list[dict[str, Any]] | None, str, str]:
    """(threads, error, explanation); threads is None on failure."""
    run = _run(cmd, timeout)
    if run.exec_error is not None:
        return None, *_not_started(cmd[0], run)
    if run.timed_out or run.rc != 0:
        error, text = _classify(pid, run, timeout)
        return None, error, text
    try:
        threads = json.loads(run.stdout)
    except ValueError:
        return None, "bad py-spy output", "py-spy printed no JSON:\n" + _trim(run.output)
    if not isinstance(threads, list):
        return None, "bad py-spy output", "py-spy JSON is not a list of threads"
    for thread in threads:
        if isinstance(thread, dict):
            thread.setdefault("pid", pid)
    return [t for t in threads if isinstance(t, dict)], "", ""


def _children(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except (psutil.Error, OSError):
        return []


def capture(
    pid: int,
    *,
    py_spy: str = "py-spy",
    native: bool = False,
    locals_: bool = False,
    subprocesses: bool = True,
    nonblocking: bool = False,
    timeout: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    others: frozenset[int] = frozenset(),
) -> DumpResult:
    """Dump ``pid`` (and its python descendants) once each; never raises for expected failures.

    ``timeout`` bounds the whole capture, children included. ``others``: descendants that are
    ranks of their own (a Lightning script's child ranks, each watched and dumped by its own
    pipeline): neither they nor their own descendants are in this dump, or a rank's dump
    would hold another rank's stacks and a cross-rank diff would read the two as one.
    """
    start = clock()
    captured_at = datetime.now(timezone.utc)
    deadline = time.monotonic() + timeout
    exe = find_py_spy(py_spy)
    flags = _flags(native, locals_, nonblocking)
    command = [exe or py_spy, "dump", "--pid", str(pid), "--json", *flags]
    if subprocesses:
        command.append("--subprocesses")

    def result(
        ok: bool, threads: list[dict[str, Any]], text: str, error: str | None, **kw: Any
    ) -> DumpResult:
        return DumpResult(
            pid, ok, threads, text, error, clock() - start, command, captured_at=captured_at, **kw
        )

    if exe is None:
        error, text = py_spy_missing(py_spy)
        return result(False, [], text, error)
    if not _alive(pid):
        return result(
            False, [], f"pid {pid} does not exist (or is a zombie): nothing to dump.", "process gone"
        )

    processes = [_process_info(pid)]
    threads, error, text = _dump_once(command, pid, timeout)
    notes: list[str] = []
    failed: tuple[str, str] | None = None  # the wrapper's own failure, when the pid is not Python
    child_failures: list[tuple[str, str]] = []
    if threads is None:
        # `rankwatch run -- bash train.sh`: the rank is the shell's Python child, not the shell.
        if error != "not a python process" or not subprocesses:
            return result(False, [], text, error, processes=processes)
        cmd = processes[0].get("cmdline") or "?"
        notes.append(f"pid {pid} ({cmd}) is not a Python process: its Python descendants were dumped")
        failed, threads, processes = (text, error), [], []
    if subprocesses:
        kids = _children(pid)
        # Only descendants of ``pid`` are set apart: a launcher's pipeline is another rank's
        # parent, and this rank's own children (its DataLoader workers) stay in its dump.
        apart = {q for o in others if o in kids for q in (o, *_children(o))}
        threads = [t for t in threads if t.get("pid") not in apart]
        seen = {t.get("pid") for t in threads} | apart
        for child in [c for c in kids if c not in seen][:MAX_CHILDREN]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                notes.append("timeout reached before all child processes were dumped")
                break
            child_cmd = [command[0], "dump", "--pid", str(child), "--json", *flags]
            child_threads, child_error, child_text = _dump_once(child_cmd, child, remaining)
            if child_threads is not None:
                threads.extend(child_threads)
                processes.append(_process_info(child))
            elif child_error not in ("not a python process", "process gone"):
                notes.append(f"child pid {child}: {child_error}")
                child_failures.append((child_text, child_error))

    if failed is not None and not threads:
        # A wrapper: say why its Python children were not read (ptrace refused, a timeout) before
        # saying that there were none.
        text, error = child_failures[0] if child_failures else failed
        return result(False, [], text, error, processes=[_process_info(pid)], notes=notes)
    from rankwatch.dumps.show import render_threads  # at the first dump, not in every idle agent

    rendered = render_threads(threads, pid=pid, processes=processes)
    return result(True, threads, rendered, None, processes=processes, notes=notes)
