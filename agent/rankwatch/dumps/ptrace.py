"""Whether py-spy will be allowed to attach, known before a hang rather than during one.

Yama (Ubuntu, DGX OS and most containers' hosts default to ``ptrace_scope=1``) lets a
process trace only its descendants unless it holds CAP_SYS_PTRACE. py-spy runs as the
agent's child, so it is never the rank's ancestor: in ``run`` mode the rank names the
agent as its tracer (``PR_SET_PTRACER``), which covers the agent's descendants; in
``watch`` mode only the capability or a relaxed sysctl helps, and the stall finding says so.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

YAMA_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
PR_SET_PTRACER = 0x59616D61  # "Yama"
CAP_SYS_PTRACE = 19


def yama_scope(path: Path = YAMA_SCOPE) -> int | None:
    """0-3, or None where the kernel has no Yama (nothing restricts same-user ptrace)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def has_cap_sys_ptrace(status: Path = Path("/proc/self/status")) -> bool:
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def ptrace_problem(*, launched: bool, scope: int | None, cap: bool, wrapper: bool = False) -> str | None:
    """Why py-spy will be refused, or None. ``launched``: the agent started the rank itself
    and the rank named the agent as its tracer (run mode). ``wrapper``: what the agent started
    is not the Python rank (a shell, torchrun): the exception covers only that process, since
    Yama does not pass it on to children."""
    if scope is None or scope == 0:
        return None
    if scope >= 3:
        return (
            "kernel.yama.ptrace_scope=3 forbids ptrace for everyone until reboot. "
            "Fix: boot with ptrace_scope <= 1 on training nodes."
        )
    if cap:
        return None
    if scope == 2:
        return (
            "kernel.yama.ptrace_scope=2 allows ptrace only with CAP_SYS_PTRACE, which the agent lacks. "
            "Fix: grant it (Kubernetes: capabilities add [SYS_PTRACE]; docker --cap-add SYS_PTRACE)."
        )
    if launched and not wrapper:
        return None
    if launched:
        return (
            "kernel.yama.ptrace_scope=1: the command rankwatch started named the agent its tracer, but "
            "it is not the Python rank, and Yama does not pass that on to its children. Fix: "
            "`rankwatch run -- python train.py` (one agent per rank), grant the agent CAP_SYS_PTRACE, "
            "or sysctl kernel.yama.ptrace_scope=0."
        )
    return (
        "kernel.yama.ptrace_scope=1 lets a process trace only its descendants, and this agent did not "
        "start the ranks it watches. Fix: grant the agent CAP_SYS_PTRACE (Kubernetes: capabilities add "
        "[SYS_PTRACE]), use `rankwatch run`, or sysctl kernel.yama.ptrace_scope=0."
    )


def tracer_preexec(
    tracer: int, *, scope: int | None = None, cap: bool | None = None
) -> Callable[[], None] | None:
    """A ``preexec_fn`` that names ``tracer`` (the agent) as the child's ptracer, or None where
    Yama would not stop the agent anyway. Everything is looked up before the fork, so the
    child runs one foreign call and nothing that could take a lock."""
    scope = yama_scope() if scope is None else scope
    cap = has_cap_sys_ptrace() if cap is None else cap
    if scope != 1 or cap:
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # libc is already mapped; no ldconfig run
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    option, pid = PR_SET_PTRACER, ctypes.c_ulong(tracer)
    zero = ctypes.c_ulong(0)

    def preexec() -> None:
        prctl(option, pid, zero, zero, zero)  # a failure only means dumps will be refused, as before

    return preexec
