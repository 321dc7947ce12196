"""Signal handlers on the running event loop, where the loop can have them.

A loop outside the main thread (the agent embedded in another program, or in tests) or
off Unix cannot install them: the agent then runs without, and says so once, rather than
fail to start over a convenience.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
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
