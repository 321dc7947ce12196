"""One rank's pipeline stage between sources and actions: state plus its detectors.

Shared by the live agent and ``analyze``. A detector that raises is disabled for that
record only, logged once and counted; the others keep running.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from rankwatch.config.schema import DetectorsConfig
from rankwatch.detectors import Detector, build_detectors
from rankwatch.detectors.base import Episode
from rankwatch.records import Finding, Record
from rankwatch.state import RankState

log = logging.getLogger("rankwatch.engine")


class RankEngine:
    def __init__(self, cfg: DetectorsConfig, rank: int | None, path: str | None = None) -> None:
        self.state = RankState(rank=rank, path=path)
        self.detectors: list[Detector] = build_detectors(cfg)
        self.internal_errors = 0
        self._logged: set[str] = set()
        self._routes: dict[type, list[Detector]] = {}

    def feed(self, record: Record) -> list[Finding]:
        self.state.add(record)
        out: list[Finding] = []
        route = self._routes.get(type(record))
        if route is None:
            route = self._routes[type(record)] = [d for d in self.detectors if isinstance(record, d.accepts)]
        state = self.state
        for det in route:
            try:
                found = det.observe(state, record)
            except Exception:
                self._failed(det)
                continue
            if found:
                out.extend(found)
        return out

    def finish(self) -> list[Finding]:
        out: list[Finding] = []
        for det in self.detectors:
            try:
                out.extend(det.finish(self.state))
            except Exception:
                self._failed(det)
        return out

    def reconfigure(self, cfg: DetectorsConfig) -> None:
        """A new config snapshot (hot reload). A detector whose settings changed is built anew
        from it, since a window is a deque's length and a warm-up is counted from the start;
        its open episodes are carried over, so a condition still active stays one alert and
        still resolves. A detector whose settings did not change keeps its state."""
        out: list[Detector] = []
        for old, new in zip(self.detectors, build_detectors(cfg), strict=True):
            if type(old) is not type(new) or _settings(old) == _settings(new):
                out.append(old)
                continue
            for name, value in vars(old).items():
                if isinstance(value, Episode):
                    setattr(new, name, value)
            out.append(new)
        self.detectors = out
        self._routes.clear()

    def _failed(self, det: Detector) -> None:
        self.internal_errors += 1
        name = type(det).__name__
        if name not in self._logged:
            self._logged.add(name)
            log.exception(
                "detector %s failed on rank %s (further failures counted only)", name, self.state.rank
            )


def _settings(det: Detector) -> dict[str, Any]:
    """What a detector was built from: its config sections (frozen snapshots) and warm-up."""
    return {
        k: v
        for k, v in vars(det).items()
        if k == "warmup" or (dataclasses.is_dataclass(v) and not isinstance(v, type))
    }
