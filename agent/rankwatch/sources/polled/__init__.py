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
watched rank's engine with ``now`` set from that rank's clock; ``"rank"``, a source made
for each watched rank (its process), whose ``create`` gets a ``RankContext`` instead: what
that rank's pipeline knows of it, read on the loop (its process as last attached: a
restart attaches a new one, an exit none). Its events go to that rank's engine; the rank's
watcher polls it. The engine routes them to the detectors that accept them.

An event a source wraps in ``ToRank(rank, event)`` goes to that rank's engine instead (the
only watched rank's, when the agent watches one), with ``now`` on that rank's clock: a
source that ties what it reads to ranks (the GPUs of each rank's processes) routes each
part itself. What a source knows of the watched ranks (their rank, PIDs and the environment
the agent gave them) it reads on the loop through ``ctx.ranks``.

The other hooks are optional. ``open()``, blocking, runs off the loop once before the first
sample (given up after ``timeout``, like a sample); a source whose ``open`` returns False or
fails is never sampled (it says why in its one line: NVML absent on a CPU node is normal).
``overdue(seconds)``, on the loop, is asked for events each period a sample has been
stuck for ``seconds`` (a hung driver call is itself news: the GPUs stopped answering).
``failed``, a count that only grows, is how a sample that returned says some of its
readings failed: a sample during which it grew is counted once. ``view()`` with ``face``
naming one of the agent's read hooks (``gpu_latest``) is what the status page and /metrics
read of the source between samples. ``bind(wake)`` hands a source that learns of news
between periods (filesystem events) a thread-safe ``wake()`` that starts its next sample
early; ``min_gap`` is then the shortest time between two samples (a storm of events is one
rescan). ``close()`` is called off the loop when the agent stops; ``stopping()``, on the loop
as the poller stops, ends a wait a sample in flight holds on its thread (``logs``). Records a
source hands on (``StepRecord``, ``EvalRecord``: a trainer's own history read elsewhere than
its log) go to the agent's rank
as history, judged only while that rank's log shows no steps of its own. Sources of one
agent may share a component they both read through ``ctx.shared`` (made by whichever asks
first, never by import order).

What a source's sample does while it hangs is the policy's, tuned by four optional
attributes. ``when_stuck``: ``"wait"`` (the default) waits for the sample in flight again
each period, for its ``timeout``, and hands on its late result; ``"fail"`` gives up at
once while a sample given up on has not returned (a read of a process in D state can block
for minutes: no period waits for it again, none leaves a second thread), drops its late
result and samples anew once it has. ``count_hung``: ``"once"`` (the default) counts a hang
once however long it lasts; ``"period"`` counts every period that went without a sample
(a rate of missed samples). ``hint``: the likely cause the one line about a hang names.
``thread``: the name of the thread a sample runs on (read each period: a source may name
one per process it samples), by which ``offloop`` counts the hangs of ``"fail"`` sources.

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, cast

from rankwatch import offloop
from rankwatch.config.schema import Config
from rankwatch.config.settings import plugin_modules
from rankwatch.events import CheckpointStatus, Event
from rankwatch.offloop import in_daemon, threadsafe_waker

if TYPE_CHECKING:
    from rankwatch.sources.follower import LogReader
    from rankwatch.sources.process import ProcessProber

log = logging.getLogger("rankwatch.sources")


@dataclass(frozen=True)
class SourceContext:
    """What a source may know of the agent: its configuration and, read on the loop, the
    folders it writes to or reads from (``{path: role}``, role ``log``, ``dumps`` or ``spool``)
    and the watched ranks; when the job must end (wall time, from the scheduler);
    ``checkpoints``, a reading of the checkpoint state to use instead of the watcher's own
    (tests); ``shared``, components the sources of one agent share (the checkpoint watcher)."""

    cfg: Config
    folders: Callable[[], Mapping[str, str]]
    job_end: float | None = None
    checkpoints: Callable[[], CheckpointStatus | None] | None = None
    shared: dict[str, Any] = field(default_factory=dict, compare=False)
    ranks: Callable[[], Sequence[WatchedRank]] = tuple
    rank: int | None = None  # the agent's own rank
    backends: Mapping[str, Any] = field(default_factory=dict)  # by source name: a driver a test scripts


@dataclass(frozen=True)
class WatchedRank:
    """One watched rank as a source sees it: its PIDs (the process tree's root first) and
    every PID of its tree as its last process sample knew them, the environment the agent gave
    it (``CUDA_VISIBLE_DEVICES``), and ``walk()``, blocking (a walk of /proc: off the loop,
    in a sample), its PIDs as they are now."""

    rank: int | None
    pids: tuple[int, ...]
    known: frozenset[int] = frozenset()
    env: Mapping[str, str] = field(default_factory=dict)
    walk: Callable[[], Sequence[int]] | None = field(default=None, compare=False)

    def current(self) -> tuple[int, ...]:
        """``walk()``'s PIDs (the known ones without it, or when it found none)."""
        return tuple(self.walk() or self.pids) if self.walk is not None else self.pids


@dataclass(frozen=True)
class RankContext:
    """What a source made for one watched rank (scope ``"rank"``) may know of it: the
    configuration, its rank and its clock, and, read on the loop, its process as the rank's
    pipeline last attached it (``prober()``: None before the first attach and once the
    process has exited; a restart attaches a new one) with the name of the thread its reads
    of that process run on (``io()``: one per process, so a restarted rank's new process is
    sampled at once while a read of the old one is stuck); and its logs' readers (``logs()``:
    the files it follows now, which a restart into new files changes) with the name of the
    thread their reads run on (``log_io()``: one per set of files)."""

    cfg: Config
    rank: int | None
    clock: Callable[[], float]
    prober: Callable[[], ProcessProber | None] = lambda: None
    io: Callable[[], str] = lambda: "rankwatch-proc"
    logs: Callable[[], Sequence[LogReader]] = tuple
    log_io: Callable[[], str] = lambda: "rankwatch-log"


@dataclass(frozen=True)
class ToRank:
    """``event`` for the engine of ``rank`` (the only watched rank's when there is one)."""

    rank: int | None
    event: Event


Sampled = Event | ToRank  # what a sample hands on


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

    def sample(self, inputs: Any) -> Sequence[Sampled]:
        """Blocking: runs on a daemon thread."""
        ...


class SourceFactory(Protocol):
    name: ClassVar[str]

    @classmethod
    def create(cls, ctx: SourceContext) -> PolledSource | None: ...


class RankSourceFactory(Protocol):
    """A source made for each watched rank (``scope = "rank"``)."""

    name: ClassVar[str]
    scope: ClassVar[str]

    @classmethod
    def create(cls, ctx: RankContext) -> PolledSource | None: ...


Factory = type[SourceFactory] | type[RankSourceFactory]
_S = TypeVar("_S", bound=Factory)

REGISTRY: list[Factory] = []
_loaded = False


Scope = Literal["agent", "ranks", "rank"]
Stuck = Literal["wait", "fail"]
Counted = Literal["once", "period"]
HANG_HINT = "a dead mount? a stuck driver?"


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
    if scope not in ("agent", "ranks", "rank"):
        raise TypeError(f"polled source {src.name!r}: scope {scope!r} is not 'agent', 'ranks' or 'rank'")
    return cast(Scope, scope)


def blocks(src: PolledSource) -> bool:
    """Whether ``src``'s sample runs off the loop (its ``blocking``, True when it declares none)."""
    return bool(getattr(src, "blocking", True))


def _choice(src: PolledSource, attr: str, choices: tuple[str, ...]) -> str:
    value = getattr(src, attr, choices[0])
    if value not in choices:
        raise TypeError(f"polled source {src.name!r}: {attr} {value!r} is not one of {choices}")
    return str(value)


def when_stuck(src: PolledSource) -> Stuck:
    """What a period does while ``src``'s sample hangs (its ``when_stuck``, ``"wait"`` when it
    declares none)."""
    return cast(Stuck, _choice(src, "when_stuck", ("wait", "fail")))


def count_hung(src: PolledSource) -> Counted:
    """How ``src``'s hangs are counted (its ``count_hung``, ``"once"`` when it declares none)."""
    return cast(Counted, _choice(src, "count_hung", ("once", "period")))


def thread_of(src: PolledSource) -> str:
    """The name of the thread ``src``'s samples run on (its ``thread``, ``rankwatch-<name>``)."""
    return str(getattr(src, "thread", None) or f"rankwatch-{src.name}")


def hint_of(src: PolledSource) -> str:
    """The likely cause of a hang of ``src`` (its ``hint``)."""
    return str(getattr(src, "hint", None) or HANG_HINT)


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
    for name in plugin_modules(Path(__file__).parent):
        importlib.import_module(f"{__name__}.{name}")
    _loaded = True


class Poller:
    """One source under the policy: its sample off the loop (unless it says it need not),
    one in flight at a time, given up after its ``timeout`` (``when_stuck``: waited for
    again, never doubled; or failed at once while it has not returned), a hang counted once
    or every period (``count_hung``) and logged once with its likely cause (``hint``), any
    other failure logged once per cause and counted in ``errors[name]``."""

    def __init__(self, source: PolledSource, errors: dict[str, int] | None = None) -> None:
        self.source = source
        self.errors = errors if errors is not None else {}
        self.errors.setdefault(source.name, 0)
        self.inflight: asyncio.Future[Sequence[Sampled]] | None = None
        self.began = 0.0  # loop time the sample in flight (or the one stuck) started
        self.hung_logged = False  # the hang going on is logged (and, counted once, counted)
        self.failing: str | None = None  # the failure last logged: the same one again is only counted
        self.failed = int(getattr(source, "failed", 0))
        self.thread: str | None = None  # ``"fail"`` sources: the thread of the last sample started

    def _count(self) -> None:
        name = self.source.name
        self.errors[name] = self.errors.get(name, 0) + 1

    @property
    def stuck(self) -> bool:
        """A sample given up on has not returned."""
        if self.thread is not None:
            return offloop.stuck(self.thread)
        return self.inflight is not None and not self.inflight.done()

    async def poll(self, timeout: float | None = None) -> list[Sampled] | None:
        """One sample's events; None when it failed or hung."""
        src = self.source
        wait = src.timeout if timeout is None else timeout
        if blocks(src) and when_stuck(src) == "fail":
            return await self._poll_anew(wait)
        if self.inflight is None:
            self.began = asyncio.get_running_loop().time()
            if blocks(src):
                self.inflight = in_daemon(src.sample, src.inputs(), name=thread_of(src))
            else:  # it only reads what inputs() read: on the loop, no thread
                self.inflight = asyncio.get_running_loop().create_future()
                try:
                    self.inflight.set_result(src.sample(src.inputs()))
                except Exception as e:
                    self.inflight.set_exception(e)
        try:
            events = await asyncio.wait_for(asyncio.shield(self.inflight), wait)
        except asyncio.TimeoutError:
            self._hung(wait)
            return None
        except Exception as e:
            self.inflight = None
            self._failed(e)
            return None
        self.inflight = None
        return self._returned(events)

    async def _poll_anew(self, wait: float) -> list[Sampled] | None:
        """``when_stuck = "fail"``: a new sample each period through ``offloop.call`` with
        ``one_stuck`` (which fails at once while the one given up on has not returned, counts
        every period in ``offloop.timeouts[thread]`` and logs the first with the hint)."""
        src = self.source
        thread = self.thread = thread_of(src)
        fresh = not offloop.stuck(thread)
        if fresh:
            self.began = asyncio.get_running_loop().time()
        try:
            events = await offloop.call(
                src.sample, src.inputs(), timeout=wait, name=thread, one_stuck=True, hint=hint_of(src)
            )
        except asyncio.TimeoutError:
            if fresh:
                self.hung_logged = False  # a new hang (the last one ended failing, not returning)
            self._hung(wait, said=True)
            return None
        except Exception as e:
            self._failed(e)
            return None
        return self._returned(events)

    def _hung(self, wait: float, *, said: bool = False) -> None:
        """A period without a sample, its sample stuck: counted (once, or every period), and
        the first time logged (``said``: offloop did)."""
        src = self.source
        if count_hung(src) == "period" or not self.hung_logged:
            self._count()
        if not self.hung_logged:
            self.hung_logged = True
            if not said:
                log.error("%s sample hung for %.0fs (%s)", src.name, wait, hint_of(src))

    def _failed(self, e: Exception) -> None:
        self.hung_logged = False
        self._count()
        why = f"{type(e).__name__}: {e}"
        if self.failing != why:  # the same cause every interval (an unwritable folder): counted
            self.failing = why
            who = self.source.name if self.thread is None else f"{self.source.name} ({self.thread})"
            log.error("%s sample failed: %s (again: counted in rankwatch_internal_errors_total)", who, e)

    def _returned(self, events: Sequence[Sampled]) -> list[Sampled]:
        src = self.source
        self.hung_logged = False
        failed = int(getattr(src, "failed", 0))
        if failed > self.failed:  # it logged which readings failed, once: counted here
            self._count()
        self.failed = failed
        if self.failing is not None:
            self.failing = None
            log.info("%s sample works again", src.name)
        return list(events)

    async def once(self, timeout: float | None = None) -> list[Sampled] | None:
        """One period's events: a sample's, or while a sample is stuck what the source's
        ``overdue`` says of it; None when it failed (or hung, for a source without
        ``overdue``)."""
        events = await self.poll(timeout)
        overdue = getattr(self.source, "overdue", None)
        if events is None and self.stuck and overdue is not None:
            return list(overdue(asyncio.get_running_loop().time() - self.began))
        return events

    async def open(self, stop: asyncio.Future[Any] | None = None) -> bool:
        """The source's ``open`` off the loop (True when it has none): False when it says no,
        fails, or has not returned after its ``timeout`` (then logged and counted)."""
        src = self.source
        opener = getattr(src, "open", None)
        if opener is None:
            return True
        fut = in_daemon(opener, name=f"rankwatch-{src.name}")
        waiting: set[asyncio.Future[Any]] = {fut} if stop is None else {fut, stop}
        await asyncio.wait(waiting, timeout=src.timeout, return_when="FIRST_COMPLETED")
        if not fut.done():
            if stop is None or not stop.done():
                self._count()
                log.error("%s did not start within %gs; not sampled", src.name, src.timeout)
            return False
        if fut.exception() is not None:
            self._count()
            log.error("%s did not start: %s; not sampled", src.name, fut.exception())
            return False
        return bool(fut.result())

    async def run(
        self, stop: asyncio.Event, deliver: Callable[[list[Sampled]], Awaitable[None] | None]
    ) -> None:
        """Sample every ``interval`` (earlier when woken) until ``stop``; each sample's events
        to ``deliver``, on the loop (awaited when it is a coroutine: a big delivery may yield
        to the loop in slices, and the next sample waits for it). Ends with the source's
        ``close`` off the loop."""
        src = self.source
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        bind = getattr(src, "bind", None)
        if bind is not None:
            bind(threadsafe_waker(loop, woken))
        stop_task = asyncio.ensure_future(stop.wait())
        stopping = getattr(src, "stopping", None)
        if stopping is not None:
            stop_task.add_done_callback(lambda _: stopping())
        try:
            if not await self.open(stop_task):
                return
            while not stop.is_set():
                began = loop.time()
                woken.clear()
                try:
                    events = await self.once()
                    if events is not None:
                        delivered = deliver(events)
                        if delivered is not None:
                            await delivered
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


def _build(ctx: Any, rank: bool, errors: dict[str, int] | None) -> list[PolledSource]:
    _load()
    out: list[PolledSource] = []
    for cls in REGISTRY:
        if (getattr(cls, "scope", "agent") == "rank") != rank:
            continue
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


def build_sources(ctx: SourceContext, errors: dict[str, int] | None = None) -> list[PolledSource]:
    """The sources this configuration turns on, in registration order (those made for each
    watched rank aside: ``build_rank_sources``). One that cannot be made (a folder it cannot
    watch) is logged and counted in ``errors[name]``; the others run."""
    return _build(ctx, False, errors)


def build_rank_sources(ctx: RankContext, errors: dict[str, int] | None = None) -> list[PolledSource]:
    """The sources (scope ``"rank"``) this configuration turns on for the watched rank ``ctx``
    describes, as ``build_sources`` does for the agent's."""
    return _build(ctx, True, errors)


__all__ = [
    "HANG_HINT",
    "REGISTRY",
    "EveryRank",
    "PolledSource",
    "Poller",
    "RankContext",
    "Sampled",
    "Scope",
    "SourceContext",
    "ToRank",
    "WatchedRank",
    "blocks",
    "build_rank_sources",
    "build_sources",
    "count_hung",
    "hint_of",
    "register_source",
    "scope_of",
    "thread_of",
    "when_stuck",
]
