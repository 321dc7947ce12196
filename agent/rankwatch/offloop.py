"""Blocking calls that may hang (a dead NFS mount, a stuck driver) without the agent hanging.

Not ``asyncio.to_thread``: the default executor's threads are joined when ``asyncio.run``
returns and are shared with process sampling, so one call stuck on a dead mount would keep
the agent from exiting and starve everything else; a daemon thread is simply left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def in_daemon(fn: Callable[..., T], *args: Any, name: str = "rankwatch-io") -> asyncio.Future[T]:
    """``fn(*args)`` on a daemon thread of its own; its result or exception lands in the future
    (retrieved even when the caller stops waiting, so asyncio never warns about it)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def work() -> None:
        value: T | BaseException
        try:
            ok, value = True, fn(*args)
        except Exception as e:
            ok, value = False, e
        except BaseException as e:  # never raise SystemExit & co. into the loop
            ok, value = False, RuntimeError(repr(e))
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=work, name=name, daemon=True).start()
    return fut


async def call(fn: Callable[..., T], *args: Any, timeout: float, name: str = "rankwatch-io") -> T:
    """``in_daemon`` awaited for at most ``timeout`` seconds (TimeoutError; the thread stays)."""
    return await asyncio.wait_for(asyncio.shield(in_daemon(fn, *args, name=name)), timeout)
