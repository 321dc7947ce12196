"""Polled sources: what the agent samples on a period, each one file with ``@register_source``.

A polled source's ``sample`` blocks (a ``statvfs``, a ``/proc`` read, a driver call), so the
runtime never calls it on the event loop: it reads the source's ``inputs()`` on the loop
(cheap, may look at the agent through the context's callables), then runs
``sample(inputs)`` on a daemon thread with the source's ``timeout``, one call in flight at a
time, and hands the events it returns to the engine of the agent's rank, which routes them
to the detectors that accept them. A sample that raises or hangs is logged once, counted
under the source's ``name``, and the next period tries again; the other sources and the
detection never wait for it.

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
from typing import Any, ClassVar, Protocol, TypeVar

from rankwatch.config.schema import Config
from rankwatch.events import Event


@dataclass(frozen=True)
class SourceContext:
    """What a source may know of the agent: its configuration and, read on the loop, the
    folders it writes to or reads from (``{path: role}``, role ``log``, ``dumps`` or ``spool``)."""

    cfg: Config
    folders: Callable[[], Mapping[str, str]]


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


__all__ = ["REGISTRY", "PolledSource", "SourceContext", "build_sources", "register_source"]
