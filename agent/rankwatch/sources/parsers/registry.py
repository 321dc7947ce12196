"""The log formats there are: each parser class registers itself with ``@register_parser``.

Adding a format is one new module in this package: a class with the ``FormatParser``
attributes (``name``, ``hints``, ``generic``, ``order``, ``sniff``, ``parse``) decorated with
``@register_parser``. ``load_all`` imports every module of the package, so the new format is
a valid ``logs.format`` (the config schema's choices are read from here), a ``--format``
choice and, when it has hints, a candidate of auto-detection.

Auto-detection offers a line to the sniffers in ``order`` (smaller first, ties by name):
specific framework formats before the generic JSON and key=value ones, which claim lines the
specific ones print too. The order is each parser's own declaration, not an import order.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TypeVar

from rankwatch.config.settings import plugin_modules

from .base import FormatParser

_P = TypeVar("_P", bound=type[FormatParser])

REGISTRY: dict[str, type[FormatParser]] = {}
DEFAULT_ORDER = 100  # a specific format; the generic ones sit at 200 and later
_loaded = False


def register_parser(cls: _P) -> _P:
    """Class decorator: ``cls`` parses the format ``cls.name``."""
    name = cls.name
    if not name or name == "auto":
        raise TypeError(f"{cls.__name__}: a format needs a name other than 'auto'")
    known = REGISTRY.get(name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise TypeError(f"log format {name!r} is registered twice: {known.__qualname__}, {cls.__qualname__}")
    REGISTRY[name] = cls
    return cls


def load_all() -> tuple[type[FormatParser], ...]:
    """Every parser module of the package, imported once; the registered classes in sniff order."""
    global _loaded
    if not _loaded:
        package = __name__.rpartition(".")[0]  # discovered, so a parser's module needs no import line
        for name in plugin_modules(Path(__file__).parent):
            if not name.startswith("_"):
                importlib.import_module(f"{package}.{name}")
        _loaded = True
    return tuple(sorted(REGISTRY.values(), key=lambda c: (getattr(c, "order", DEFAULT_ORDER), c.name)))
