"""The detectors there are: each class registers itself with ``@register``.

``build_detectors`` makes one rank's set from the configuration. Findings of one event come
out in the detectors' order: by their module's ``ORDER`` (default ``DEFAULT_ORDER``; the log
rules set theirs so that, of one record, an error comes before a grad finding, before a
loss finding, before a throughput one), then module name, then place in the module. The
modules of the package are imported first, so a detector in a new file needs no other line
to be found.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rankwatch.config.settings import plugin_modules
from rankwatch.detectors.base import Detector, DetectorContext

if TYPE_CHECKING:
    from rankwatch.config.schema import Config

_D = TypeVar("_D", bound=type[Detector])

REGISTRY: list[type[Detector]] = []
DEFAULT_ORDER = 100
_loaded = False


def register(cls: _D) -> _D:
    """Class decorator: ``cls`` is built for every rank by ``build_detectors``."""
    if not cls.kinds:
        raise TypeError(f"{cls.__name__} declares no finding kinds")
    if cls not in REGISTRY:
        REGISTRY.append(cls)
    return cls


def load_all() -> list[type[Detector]]:
    """Every detector module of the package, imported once; the registered classes."""
    global _loaded
    if not _loaded:
        package = __name__.rpartition(".")[0]  # discovered, so a detector's module needs no import line
        for name in plugin_modules(Path(__file__).parent):
            importlib.import_module(f"{package}.{name}")
        _loaded = True
    return sorted(REGISTRY, key=_order)


def _order(cls: type[Detector]) -> tuple[int, str]:
    module = sys.modules[cls.__module__]
    return int(getattr(module, "ORDER", DEFAULT_ORDER)), cls.__module__  # sorted() is stable


def build_detectors(cfg: Config, ctx: DetectorContext) -> list[Detector]:
    """A fresh set for one rank (detectors keep per-rank episode state)."""
    out: list[Detector] = []
    for cls in load_all():
        det = cls.create(cfg, ctx)
        if det is not None:
            out.append(det)
    return out
