"""Signal handlers on the running event loop, where the loop can have them, and how the
signals the agent forwards reach the command it launched.

A loop outside the main thread (the agent embedded in another program, or in tests) or
off Unix cannot install them: the agent then runs without, and says so once, rather than
fail to start over a convenience.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("rankwatch.signals")
_told = False


def on_signal(
    loop: asyncio.AbstractEventLoop,
    sig: signal.Signals,
    callback: Callable[..., Any],
    *args: Any,
    errors: dict[str, int] | None = None,
) -> bool:
    """``loop.add_signal_handler``; False (logged once per process, counted under ``signals``
    in ``errors``, the agent's internal errors) where the loop cannot."""
    global _told
    try:
        loop.add_signal_handler(sig, callback, *args)
    except (NotImplementedError, RuntimeError, OSError, ValueError) as e:
        # NotImplementedError off Unix; RuntimeError outside the main thread; OSError or
        # ValueError where the signal cannot be caught here (a sandbox, an embedding program).
        if errors is not None:
            errors["signals"] = errors.get("signals", 0) + 1
        if not _told:
            _told = True
            log.warning(
                "no signal handlers in this event loop (%s): running without %s and others; "
                "further ones only counted",
                e,
                sig.name,
            )
        return False
    return True


# Signals a terminal sends to its whole foreground process group (Ctrl-C, Ctrl-\, a hangup).
# `rankwatch run` starts the command in its own session, out of the terminal's reach, so the
# agent delivers them the same way: to every process of the command's group, as they would
# arrive without the agent. SIGTERM is not one of them: `kill`, systemd and Kubernetes send
# it to one process, and a launcher (torchrun) passes it on to its workers itself.
TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGHUP})
# Exceptions a Python process prints when a stop signal ends it: Python's default SIGINT
# handler, sys.exit from a handler, torchelastic's handler (``SignalException: Process N got
# signal: 15``).
INTERRUPTS = ("KeyboardInterrupt", "SystemExit", "SignalException")


def deliver(pid: int, sig: signal.Signals) -> None:
    """``sig`` to ``pid`` as it would have arrived without the agent in between: a terminal's
    signal to the process group ``pid`` leads (the command's session), any other to ``pid``."""
    if sig in TERMINAL_SIGNALS:
        try:
            os.killpg(pid, sig)
            return
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone or not ours: the process alone, if it is still there
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def ended_by(returncode: int, sent: Sequence[int]) -> int | None:
    """Which of the signals ``sent`` ended a process that returned ``returncode``: killed by
    it (``-N``) or exiting with ``128+N`` from its handler; None when no one of them says so."""
    for sig in reversed(sent):
        if returncode in (-int(sig), 128 + int(sig)):
            return int(sig)
    return None


def is_interrupt(lines: Sequence[str]) -> bool:
    """The traceback ends in the exception a stop signal raises (its last non-empty line)."""
    last = next((str(x).strip() for x in reversed(lines) if str(x).strip()), "")
    return any(last.startswith(name) or f".{name}" in last.split(":", 1)[0] for name in INTERRUPTS)
