"""One rank's pipeline stage between sources and actions: state plus its detectors.

Shared by the live agent and ``analyze``. Every event, a log record or a process, GPU,
disk, checkpoint or timer event, is routed by its type to the detectors that accept it;
log records are first added to the rank's state. A detector that raises is disabled for
that event only, logged once and counted; the others keep running. A finding of a kind
its detector did not declare is passed on, and logged once and counted as that
detector's bug.
"""

from __future__ import annotations

import logging
from typing import cast

from rankwatch.config.schema import Config, DetectorsConfig
from rankwatch.detectors import Detector, DetectorContext, build_detectors
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
        ctx = DetectorContext(rank=rank, path=path, started=started, job_end=job_end)
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
        """This rank's instance of a detector class (the runtime reads its live figures)."""
        return next((d for d in self.detectors if type(d) is cls), None)

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

    def _failed(self, det: Detector) -> None:
        self.internal_errors += 1
        name = type(det).__name__
        if name not in self._logged:
            self._logged.add(name)
            log.exception(
                "detector %s failed on rank %s (further failures counted only)", name, self.state.rank
            )
