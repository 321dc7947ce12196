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

Adding a source is one new module in this package: a class with ``name``, ``create(ctx)``
(None to stay off with this configuration), ``interval``, ``timeout``, ``inputs`` and
``sample``, decorated with ``@register_source``. ``build_sources`` imports every module of
the package, so nothing else needs a line. A source imports ``events``, ``records`` and
``config``, never a detector, action or runtime module (tests/test_layers.py).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, TypeVar, cast

from rankwatch.config.schema import Config
from rankwatch.events import CheckpointStatus, Event


@dataclass(frozen=True)
class SourceContext:
    """What a source may know of the agent: its configuration and, read on the loop, the
    folders it writes to or reads from (``{path: role}``, role ``log``, ``dumps`` or ``spool``);
    when the job must end (wall time, from the scheduler), and the checkpoint watcher's state
    (None when no checkpoint folder is watched)."""

    cfg: Config
    folders: Callable[[], Mapping[str, str]]
    job_end: float | None = None
    checkpoints: Callable[[], CheckpointStatus | None] | None = None


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


def build_sources(ctx: SourceContext) -> list[PolledSource]:
    """The sources this configuration turns on, in registration order."""
    _load()
    out: list[PolledSource] = []
    for cls in REGISTRY:
        src = cls.create(ctx)
        if src is not None:
            out.append(src)
    return out


__all__ = [
    "REGISTRY",
    "EveryRank",
    "PolledSource",
    "Scope",
    "SourceContext",
    "blocks",
    "build_sources",
    "register_source",
    "scope_of",
]
