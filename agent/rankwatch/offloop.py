"""Blocking calls that may hang (a dead NFS mount, a stuck driver) without the agent hanging.

The one policy for blocking I/O from the event loop: every filesystem call (dump store,
spool, alert state, config file, checkpoint folders) goes through ``call``, which runs it on
a daemon thread (one kept per kind of call while idle, a new one while it is busy) and stops
waiting after a timeout. Not ``asyncio.to_thread``:
the default executor's threads are joined when ``asyncio.run`` returns and are shared with
process sampling, so one call stuck on a dead mount would keep the agent from exiting and
starve everything else; a daemon thread is simply left behind. A timeout is logged once per
kind of call (its thread ``name``), counted in ``timeouts`` and, where the caller passes its
``errors`` counters, in ``rankwatch_internal_errors_total``. Reads of other processes' /proc
entries (``proc``) hang the same way: a process in uninterruptible sleep (D state), or one
holding its memory-map lock, blocks a read of its cmdline, environ or smaps for minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("rankwatch.offloop")

# Calls given up on, by name (the kind of call); read by tests and by whoever reports them.
timeouts: dict[str, int] = {}
# Timeouts of the filesystem calls (``one_stuck``) made through this module: a healthy local
# disk answers in milliseconds, a dead NFS/Lustre mount never; long enough for a slow one.
FS_TIMEOUT_S = 30.0
# Timeout of the /proc calls (``proc``): a scan of every process on a busy node takes a second.
PROC_TIMEOUT_S = 10.0
# A name's thread waits this long for its next call before it ends: the agent's periodic calls
# (process samples, NVML rounds, the descendants' walk, config polls) come every 1-10 s.
LANE_IDLE_S = 30.0
FS_HINT = "hung filesystem?"
PROC_HINT = "a process in D state or holding its memory map lock?"


def in_daemon(fn: Callable[..., T], *args: Any, name: str = "rankwatch-io") -> asyncio.Future[T]:
    """``fn(*args)`` on a daemon thread (``start``: the name's kept thread when idle); its
    result or exception lands in the future (retrieved even when the caller stops waiting, so
    asyncio never warns about it)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    done: list[tuple[bool, Any]] = []

    def work() -> None:
        value: T | BaseException
        try:
            ok, value = True, fn(*args)
        except Exception as e:
            ok, value = False, e
        except BaseException as e:  # never raise SystemExit & co. into the loop
            ok, value = False, RuntimeError(repr(e))
        done.append((ok, value))

    def report() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, *done[0])

    start(work, name, then=report)
    return fut


def threadsafe_waker(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Callable[[], None]:
    """A ``wake()`` any thread may call to set ``event`` on ``loop``: a storm of calls while
    one is pending is one callback on the loop."""
    pending = threading.Lock()

    def _set() -> None:
        pending.release()
        event.set()

    def wake() -> None:
        if not pending.acquire(blocking=False):
            return
        try:
            loop.call_soon_threadsafe(_set)
        except RuntimeError:  # the loop closed
            pending.release()

    return wake


_Job = tuple[Callable[[], None], "Callable[[], None] | None"]


class _Lane:
    """The daemon thread of one ``name``, kept between calls."""

    def __init__(self, nice: int) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None: end
        self.busy = True
        self.nice = nice


def _nice() -> int:
    """The calling thread's nice value: Linux keeps one per thread, and a new thread takes its
    creator's (``runtime.modes.lower_priority`` lowers the agent's after start-up)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        return 0


_lanes: dict[str, _Lane] = {}
_lanes_lock = threading.Lock()


def start(work: Callable[[], None], name: str, then: Callable[[], None] | None = None) -> None:
    """``work()`` then ``then()`` on a daemon thread named ``name``: that name's thread when it
    is idle, else a new one; the thread counts as idle again before ``then`` runs, so a caller
    woken by ``then`` finds it free. Periodic callers (a process sample a second, an NVML
    round a second) would otherwise start and end a thread per call (clone, a stack mapped and
    unmapped, the interpreter's thread state) for nothing. A name whose thread is busy (a call still
    running, or stuck on a hung mount) gets a thread of its own, as every call once did, so
    no call ever waits behind another. A kept thread started before the caller's priority
    changed is let go (it would run at the old one), as a new thread per call never did.
    ``work`` must not raise."""
    nice = _nice()
    with _lanes_lock:
        lane = _lanes.get(name)
        if lane is not None and lane.nice != nice:
            del _lanes[name]
            lane.jobs.put(None)
            lane = None
        if lane is None:
            lane = _lanes[name] = _Lane(nice)
            threading.Thread(target=_serve, args=(name, lane, (work, then)), name=name, daemon=True).start()
            return
        if not lane.busy:
            lane.busy = True
            lane.jobs.put((work, then))
            return
    threading.Thread(target=_once, args=(work, then), name=name, daemon=True).start()


def _once(work: Callable[[], None], then: Callable[[], None] | None) -> None:
    with contextlib.suppress(BaseException):
        work()
    if then is not None:
        with contextlib.suppress(BaseException):
            then()


def _serve(name: str, lane: _Lane, job: _Job | None) -> None:
    while job is not None:
        work, then = job
        with contextlib.suppress(BaseException):
            work()
        with _lanes_lock:
            lane.busy = False
        if then is not None:
            with contextlib.suppress(BaseException):
                then()
        try:
            job = lane.jobs.get(timeout=LANE_IDLE_S)
        except queue.Empty:
            with _lanes_lock:
                if lane.busy:  # handed a call as the wait ended: it is in the queue
                    job = lane.jobs.get_nowait()
                    continue
                if _lanes.get(name) is lane:
                    del _lanes[name]
                return


async def call(
    fn: Callable[..., T],
    *args: Any,
    timeout: float,
    name: str = "rankwatch-io",
    errors: dict[str, int] | None = None,
    component: str = "io",
    one_stuck: bool = False,
    hint: str = FS_HINT,
) -> T:
    """``in_daemon`` awaited for at most ``timeout`` seconds (TimeoutError; the thread stays).

    A timeout is logged the first time for each ``name`` and counted: in ``timeouts[name]``
    and, given the agent's ``errors`` counters, in ``errors[component]``. ``one_stuck`` (the
    filesystem calls): while a call of this ``name`` that timed out has not returned, the next
    one times out at once instead of leaving one more thread on the hung mount."""
    if one_stuck and stuck(name):
        gave_up(name, timeout, errors, component, hint=hint)
        raise asyncio.TimeoutError(f"{name}: an earlier call is still blocked")
    returned = threading.Event()

    def run(*a: Any) -> T:
        try:
            return fn(*a)
        finally:
            returned.set()

    try:
        return await asyncio.wait_for(asyncio.shield(in_daemon(run, *args, name=name)), timeout)
    except asyncio.TimeoutError:
        if one_stuck:
            _stuck[name] = returned
        gave_up(name, timeout, errors, component, hint=hint)
        raise


# name -> "the call given up on has returned", for ``one_stuck`` calls
_stuck: dict[str, threading.Event] = {}


def stuck(name: str) -> bool:
    """Whether a ``one_stuck`` call of ``name`` given up on has not returned yet (the next one
    would time out at once)."""
    returned = _stuck.get(name)
    return returned is not None and not returned.is_set()


async def fs(
    fn: Callable[..., T],
    *args: Any,
    name: str,
    errors: dict[str, int] | None = None,
    component: str = "io",
    timeout: float | None = None,
) -> T:
    """A filesystem call from the event loop: ``call`` with ``FS_TIMEOUT_S`` and ``one_stuck``.
    ``name`` is the store it touches (``rankwatch-dumps``, ``rankwatch-spool``, ...)."""
    return await call(
        fn,
        *args,
        timeout=FS_TIMEOUT_S if timeout is None else timeout,
        name=name,
        errors=errors,
        component=component,
        one_stuck=True,
    )


async def proc(
    fn: Callable[..., T],
    *args: Any,
    name: str,
    errors: dict[str, int] | None = None,
    component: str = "process",
    timeout: float | None = None,
) -> T:
    """A call that reads other processes' /proc entries (psutil): ``call`` with
    ``PROC_TIMEOUT_S`` and ``one_stuck``, so a process stuck in D state leaves at most one thread
    per ``name`` (``rankwatch-proc-...``) behind and never holds the agent's exit."""
    return await call(
        fn,
        *args,
        timeout=PROC_TIMEOUT_S if timeout is None else timeout,
        name=name,
        errors=errors,
        component=component,
        one_stuck=True,
        hint=PROC_HINT,
    )


def gave_up(
    name: str,
    timeout: float,
    errors: dict[str, int] | None = None,
    component: str = "io",
    *,
    hint: str = FS_HINT,
) -> None:
    """Count (and the first time, log) a blocking call given up on after ``timeout`` seconds."""
    n = timeouts[name] = timeouts.get(name, 0) + 1
    if errors is not None:
        errors[component] = errors.get(component, 0) + 1
    if n == 1:
        log.warning(
            "%s: a blocking call did not return within %.3gs (%s); it is left on a "
            "daemon thread and the agent goes on; further timeouts are only counted",
            name,
            timeout,
            hint,
        )
