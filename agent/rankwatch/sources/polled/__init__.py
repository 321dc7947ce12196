"""Polled sources: what the agent samples on a period, each one file with ``@register_source``.

A polled source's ``sample`` blocks (a ``statvfs``, a ``/proc`` read, a driver call), so the
runtime never calls it on the event loop: it reads the source's ``inputs()`` on the loop
(cheap, may look at the agent through the context's callables), then runs
``sample(inputs)`` on a daemon thread with the source's ``timeout``, one call in flight at a
time. A source whose sample only reads what ``inputs`` handed it says so with
``blocking = False`` and is sampled on the loop. A sample that raises or hangs is logged
once, counted under the source's ``name``, and the next period tries again; the other
sources and the detection never wait for it.

Where the events go is the source's ``scope``: ``"agent"`` (the default), events about the
agent's own rank (its folders, its node), to that rank's one engine; ``"ranks"``, events
every watched rank judges on its own (the checkpoint folder's activity, a timer), to each
watched rank's engine with ``now`` set from that rank's clock. The engine routes them to
the detectors that accept them.

Two hooks are optional. ``bind(wake)`` hands a source that learns of news between periods
(filesystem events) a thread-safe ``wake()`` that starts its next sample early; ``min_gap``
is then the shortest time between two samples (a storm of events is one rescan). ``close()``
is called off the loop when the agent stops. Records a source hands on (``StepRecord``,
``EvalRecord``: a trainer's own history read elsewhere than its log) go to the agent's rank
as history, judged only while that rank's log shows no steps of its own. Sources of one
agent may share a component they both read through ``ctx.shared`` (made by whichever asks
first, never by import order).

``Poller`` is the policy, the same for every source: the live agent runs one per source, and
so may a test.

Adding a source is one new module in this package: a class with ``name``, ``create(ctx)``
(None to stay off with this configuration), ``interval``, ``timeout``, ``inputs`` and
``sample``, decorated with ``@register_source``. ``build_sources`` imports every module of
the package, so nothing else needs a line. A source imports ``events``, ``records`` and
``config``, never a detector, action or runtime module (tests/test_layers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, TypeVar, cast

from rankwatch.config.schema import Config
from rankwatch.events import CheckpointStatus, Event
from rankwatch.offloop import in_daemon, threadsafe_waker

log = logging.getLogger("rankwatch.sources")


@dataclass(frozen=True)
class SourceContext:
    """What a source may know of the agent: its configuration and, read on the loop, the
    folders it writes to or reads from (``{path: role}``, role ``log``, ``dumps`` or ``spool``);
    when the job must end (wall time, from the scheduler); ``checkpoints``, a reading of the
    checkpoint state to use instead of the watcher's own (tests); ``shared``, components the
    sources of one agent share (the checkpoint watcher)."""

    cfg: Config
    folders: Callable[[], Mapping[str, str]]
    job_end: float | None = None
    checkpoints: Callable[[], CheckpointStatus | None] | None = None
    shared: dict[str, Any] = field(default_factory=dict, compare=False)


class PolledSource(Protocol):
    name: ClassVar[str]

    @property
    def interval(self) -> float:
        """Seconds between two samples."""
        ...

    @property
    def timeout(self) -> float:
        """A sample that has not returned after this long is given up (its thread is left)."""
        ...

    def inputs(self) -> Any:
        """Read on the event loop just before a sample: must not block."""
        ...

    def sample(self, inputs: Any) -> list[Event]:
        """Blocking: runs on a daemon thread."""
        ...


class SourceFactory(Protocol):
    name: ClassVar[str]

    @classmethod
    def create(cls, ctx: SourceContext) -> PolledSource | None: ...


_S = TypeVar("_S", bound=type[SourceFactory])

REGISTRY: list[type[SourceFactory]] = []
_loaded = False


Scope = Literal["agent", "ranks"]


class EveryRank:
    """A base for a source whose events every watched rank judges on its own and whose sample
    only hands on what ``inputs`` read on the loop (a timer, another component's state): it
    needs no thread, and cannot hang."""

    scope: ClassVar[str] = "ranks"
    blocking: ClassVar[bool] = False
    interval: float

    @property
    def timeout(self) -> float:
        return self.interval


def scope_of(src: PolledSource) -> Scope:
    """Where ``src``'s events go (its ``scope``, ``"agent"`` when it declares none)."""
    scope = getattr(src, "scope", "agent")
    if scope not in ("agent", "ranks"):
        raise TypeError(f"polled source {src.name!r}: scope {scope!r} is not 'agent' or 'ranks'")
    return cast(Scope, scope)


def blocks(src: PolledSource) -> bool:
    """Whether ``src``'s sample runs off the loop (its ``blocking``, True when it declares none)."""
    return bool(getattr(src, "blocking", True))


def register_source(cls: _S) -> _S:
    """Class decorator: ``cls.create(ctx)`` is asked for a source by every live agent."""
    if not getattr(cls, "name", ""):
        raise TypeError(f"{cls.__name__} has no name")
    if any(c.name == cls.name and c is not cls for c in REGISTRY):
        raise TypeError(f"two polled sources are named {cls.name!r}")
    if cls not in REGISTRY:
        REGISTRY.append(cls)
    return cls


def _load() -> None:
    global _loaded
    if _loaded:
        return
    for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{__name__}.{mod.name}")
    _loaded = True


class Poller:
    """One source under the policy: its sample off the loop (unless it says it need not),
    one in flight at a time, given up after its ``timeout`` (waited for again, never
    doubled), a failure logged once per cause and counted in ``errors[name]``."""

    def __init__(self, source: PolledSource, errors: dict[str, int] | None = None) -> None:
        self.source = source
        self.errors = errors if errors is not None else {}
        self.errors.setdefault(source.name, 0)
        self.inflight: asyncio.Future[list[Event]] | None = None
        self.hung_logged = False
        self.failing: str | None = None  # the failure last logged: the same one again is only counted

    def _count(self) -> None:
        name = self.source.name
        self.errors[name] = self.errors.get(name, 0) + 1

    async def poll(self, timeout: float | None = None) -> list[Event] | None:
        """One sample's events; None when it failed or hung."""
        src = self.source
        name = src.name
        wait = src.timeout if timeout is None else timeout
        if self.inflight is None:
            if blocks(src):
                self.inflight = in_daemon(src.sample, src.inputs(), name=f"rankwatch-{name}")
            else:  # it only reads what inputs() read: on the loop, no thread
                self.inflight = asyncio.get_running_loop().create_future()
                try:
                    self.inflight.set_result(src.sample(src.inputs()))
                except Exception as e:
                    self.inflight.set_exception(e)
        try:
            events = await asyncio.wait_for(asyncio.shield(self.inflight), wait)
        except asyncio.TimeoutError:
            if not self.hung_logged:  # one count per hang, however often it is waited for
                self.hung_logged = True
                self._count()
                log.error("%s sample hung for %.0fs (a dead mount? a stuck driver?)", name, wait)
            return None
        except Exception as e:
            self.inflight = None
            self._count()
            why = f"{type(e).__name__}: {e}"
            if self.failing != why:  # the same cause every interval (an unwritable folder): counted
                self.failing = why
                log.error("%s sample failed: %s (again: counted in rankwatch_internal_errors_total)", name, e)
            return None
        self.inflight = None
        self.hung_logged = False
        if self.failing is not None:
            self.failing = None
            log.info("%s sample works again", name)
        return events

    async def run(self, stop: asyncio.Event, deliver: Callable[[list[Event]], None]) -> None:
        """Sample every ``interval`` (earlier when woken) until ``stop``; each sample's events
        to ``deliver``, on the loop. Ends with the source's ``close`` off the loop."""
        src = self.source
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        bind = getattr(src, "bind", None)
        if bind is not None:
            bind(threadsafe_waker(loop, woken))
        stop_task = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                began = loop.time()
                woken.clear()
                try:
                    events = await self.poll()
                    if events is not None:
                        deliver(events)
                except Exception:
                    self._count()
                    log.exception("%s sample failed", src.name)
                wake_task = asyncio.ensure_future(woken.wait())
                try:
                    await asyncio.wait(
                        {wake_task, stop_task}, timeout=src.interval, return_when="FIRST_COMPLETED"
                    )
                finally:
                    wake_task.cancel()
                rest = float(getattr(src, "min_gap", 0.0)) - (loop.time() - began)
                if rest > 0 and not stop.is_set():
                    await asyncio.wait({stop_task}, timeout=rest)
        finally:
            stop_task.cancel()
            close = getattr(src, "close", None)
            if close is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closing
                    in_daemon(close, name=f"rankwatch-{src.name}-close")  # may join a thread: not awaited


def build_sources(ctx: SourceContext, errors: dict[str, int] | None = None) -> list[PolledSource]:
    """The sources this configuration turns on, in registration order. One that cannot be
    made (a folder it cannot watch) is logged and counted in ``errors[name]``; the others run."""
    _load()
    out: list[PolledSource] = []
    for cls in REGISTRY:
        try:
            src = cls.create(ctx)
        except Exception as e:
            if errors is not None:
                errors[cls.name] = errors.get(cls.name, 0) + 1
            log.error("%s disabled: %s", cls.name, e)
            continue
        if src is not None:
            out.append(src)
    return out


__all__ = [
    "REGISTRY",
    "EveryRank",
    "PolledSource",
    "Poller",
    "Scope",
    "SourceContext",
    "blocks",
    "build_sources",
    "register_source",
    "scope_of",
]
