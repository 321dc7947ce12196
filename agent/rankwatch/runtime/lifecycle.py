"""What every live mode does around its watchers: start, judge exits, stop.

``rankwatch run``, ``watch`` and ``watch --k8s`` differ in how they find their ranks; once a
rank has a watcher the rest is the same: the agent's signals (the mode's stop, SIGUSR1 for a
stack dump), the services started once, a dead process judged by its last sample, and at the
end every watcher stopped, drained and closed after the alerts are flushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterable
from typing import Any

from rankwatch.config.schema import Config
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.services import Services
from rankwatch.runtime.signals import on_signal
from rankwatch.runtime.watcher import RankWatcher

# SIGHUP too: a terminal that closes hangs up on the agent it started, whose default end
# (killed, no handler) would leave its service-discovery file and unsent alerts behind.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


async def start(
    agent: Agent, cfg: Config, services: dict[str, Any] | None, *, stop: asyncio.Event | None = None
) -> Services:
    """``stop`` (when given) set on SIGTERM, SIGINT and SIGHUP, SIGUSR1 captures stacks, and the
    services (alerts, GPUs, checkpoints, polled sources, server) started."""
    if stop is not None:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            on_signal(loop, sig, stop.set, errors=agent.internal_errors_by_component)
    agent.install_dump_signal()
    extras = Services(agent, cfg, **(services or {}))
    await extras.start()
    return extras


def judge_exits(agent: Agent, watchers: Iterable[RankWatcher]) -> None:
    """A watched process that the last sample found dead, and not judged yet: its exit now
    (an agent that is not its parent knows no exit status)."""
    for w in watchers:
        s = w.last_sample
        if s is not None and not s.alive and not w.exited:
            w.on_exit(s.exit_code, None, disk_full=agent.log_disk_full(w))


async def stop_watchers(
    agent: Agent, extras: Services, watchers: list[RankWatcher], tasks: Iterable[asyncio.Task[Any]]
) -> None:
    """Stop every watcher, read what is left of its logs, hand out what it held, wait for the
    stack captures in flight, flush the alerts, then close the logs."""
    for w in watchers:
        w.stop()
    for t in tasks:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(t, 5.0)
    for w in watchers:
        w.drain()
        w.flush_held()
    await agent.settle()
    await extras.close()
    for w in watchers:
        w.close()
