"""``follow``: a followed log as an async generator of batches, for the tests that drive a
``LogFollower`` the way the agent's log source does (its reads and the folder's watch through
a ``LogReader``) without a whole rank pipeline. Reads run on the test's loop: a test's files
are local."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from rankwatch.offloop import threadsafe_waker
from rankwatch.sources.follower import FollowedLine, LogFollower, LogReader


async def follow(
    follower: LogFollower,
    *,
    poll_interval: float = 0.25,
    stop: asyncio.Event | None = None,
    max_bytes: int = 128 << 10,
    thin: Callable[[], Callable[[str], bool] | None] | None = None,
) -> AsyncGenerator[list[FollowedLine], None]:
    """Batches as they appear (each read at most ``max_bytes``; one may be empty when the file
    grew by dropped noise only), woken by the folder's watch or every ``poll_interval``, until
    ``stop``, then what the file holds by then. Close it with ``contextlib.aclosing`` so the
    watch's thread is joined at once."""
    wake = asyncio.Event()
    reader = LogReader(follower, max_bytes, thin, watch=True)
    waker = threadsafe_waker(asyncio.get_running_loop(), wake)
    stop_task = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        while stop is None or not stop.is_set():
            wake.clear()
            behind = reader.fill(waker)
            while (batch := reader.take()) is not None:
                yield batch
            if behind:
                await asyncio.sleep(0)
                continue
            wake_task = asyncio.ensure_future(wake.wait())
            waiting = {wake_task} if stop_task is None else {wake_task, stop_task}
            try:
                await asyncio.wait(waiting, timeout=poll_interval, return_when=asyncio.FIRST_COMPLETED)
            finally:
                wake_task.cancel()
        while True:
            behind = reader.fill()
            while (batch := reader.take()) is not None:
                if batch:
                    yield batch
            if not behind:
                break
    finally:
        if stop_task is not None:
            stop_task.cancel()
        reader.unwatch()
