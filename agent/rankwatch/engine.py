"""One rank's pipeline stage between sources and actions: state plus its detectors.

Shared by the live agent and ``analyze``. Every event, a log record or a process, GPU,
disk, checkpoint or timer event, is routed by its type to the detectors that accept it;
log records are first added to the rank's state. A detector that raises is disabled for
that event only, logged once and counted; the others keep running. A finding of a kind
its detector did not declare is passed on, and logged once and counted as that
detector's bug.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from typing import Any, cast

from rankwatch.config.schema import Config, DetectorsConfig
from rankwatch.detectors import Detector, DetectorContext, build_detectors
from rankwatch.detectors.base import Episode
from rankwatch.detectors.liveness import Liveness, StallDetector
from rankwatch.detectors.registry import load_all
from rankwatch.events import Event
from rankwatch.records import ErrorRecord, EvalRecord, Finding, OverflowRecord, Record, StepRecord
from rankwatch.state import RankState

log = logging.getLogger("rankwatch.engine")

_RECORDS = frozenset({StepRecord, EvalRecord, ErrorRecord, OverflowRecord})


class RankEngine:
    def __init__(
        self,
        cfg: Config | DetectorsConfig,
        rank: int | None,
        path: str | None = None,
        *,
        started: float = 0.0,
        job_end: float | None = None,
    ) -> None:
        if isinstance(cfg, DetectorsConfig):
            cfg = Config(detectors=cfg)
        self.state = RankState(rank=rank, path=path)
        self.cfg = cfg
        self.ctx = ctx = DetectorContext(rank=rank, path=path, started=started, job_end=job_end)
        self.detectors: list[Detector] = build_detectors(cfg, ctx)
        self.internal_errors = 0
        self._logged: set[str] = set()
        self._routes: dict[type, tuple[bool, list[Detector]]] = {}

    def _route(self, kind: type) -> tuple[bool, list[Detector]]:
        takers = [d for d in self.detectors if issubclass(kind, d.accepts)]
        route = self._routes[kind] = (kind in _RECORDS, takers)
        return route

    def feed(self, event: Event) -> list[Finding]:
        is_record, route = self._routes.get(type(event)) or self._route(type(event))
        state = self.state
        if is_record:
            state.add(cast(Record, event))
        out: list[Finding] = []
        for det in route:
            try:
                found = det.observe(state, event)
            except Exception:
                self._failed(det)
                continue
            if found:
                self._check_kinds(det, found)
                out.extend(found)
        return out

    def detector(self, cls: type[Detector]) -> Detector | None:
        """This rank's instance of a detector class (tests read its state)."""
        return next((d for d in self.detectors if type(d) is cls), None)

    def liveness(self, now: float) -> Liveness | None:
        """The stall rule's reading of this rank at ``now`` (None when the rule is off)."""
        det = next((d for d in self.detectors if isinstance(d, StallDetector)), None)
        return det.liveness(self.state, now) if det is not None else None

    def finish(self) -> list[Finding]:
        out: list[Finding] = []
        for det in self.detectors:
            try:
                found = det.finish(self.state)
            except Exception:
                self._failed(det)
                continue
            self._check_kinds(det, found)
            out.extend(found)
        return out

    def _check_kinds(self, det: Detector, found: list[Finding]) -> None:
        kinds = det.kinds
        for f in found:
            if f.kind not in kinds:
                self.internal_errors += 1
                name = f"{type(det).__name__}:{f.kind}"
                if name not in self._logged:
                    self._logged.add(name)
                    log.error("detector %s emitted kind %r it does not declare", type(det).__name__, f.kind)

    def reconfigure(self, cfg: Config) -> None:
        """A new config snapshot (hot reload). What a detector can take is derived from the
        detector: two fresh ones are built, from the old and the new snapshot. Where they differ
        only in the config sections they hold, the settings are read on every use, and the
        running detector takes the new sections and keeps its state. Where the config shaped
        the detector when it was built (a window is a deque's length, a warm-up a number it
        keeps), the fresh one replaces it, with the running one's open episodes, so a condition
        still active stays one alert and still resolves."""
        running = {type(d): d for d in self.detectors}
        out: list[Detector] = []
        for cls in load_all():
            new = cls.create(cfg, self.ctx)
            if new is None:
                continue
            det = running.get(cls)
            if det is None:
                out.append(new)
                continue
            old = cls.create(self.cfg, self.ctx)
            if old is not None and _shape(old) == _shape(new):
                for name, value in vars(new).items():
                    if _is_section(value):
                        setattr(det, name, value)
                out.append(det)
                continue
            for name, value in vars(det).items():
                if isinstance(value, Episode):
                    setattr(new, name, value)
            out.append(new)
        self.cfg = cfg
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


def _is_section(value: object) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _shape(value: Any, depth: int = 0) -> Any:
    """A fresh detector's state, config sections left out: equal for two fresh detectors
    unless the config shaped it (a deque's length, a number it copied)."""
    if depth > 4:
        return type(value).__name__
    if _is_section(value):
        return "section"
    if isinstance(value, deque):
        return ("deque", value.maxlen, [_shape(v, depth + 1) for v in value])
    if isinstance(value, (list, tuple)):
        return [_shape(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _shape(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    fields = getattr(value, "__dict__", None)
    if fields is None:
        slots = getattr(type(value), "__slots__", ())
        fields = {k: getattr(value, k) for k in slots if hasattr(value, k)}
    if fields or hasattr(value, "__dict__"):
        return (type(value).__name__, {k: _shape(v, depth + 1) for k, v in fields.items()})
    return type(value).__name__
