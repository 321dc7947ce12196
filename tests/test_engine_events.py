"""One event model: every detector registers, declares what it takes and emits, and the engine
routes each event type to those that accept it, live and in ``analyze`` alike."""

from __future__ import annotations

import dataclasses
import glob
import typing
from pathlib import Path
from typing import ClassVar

import pytest

from rankwatch import events as ev
from rankwatch.analyze import analyze_file
from rankwatch.config.schema import Config, DetectorsConfig
from rankwatch.detectors import REGISTRY, Detector, DetectorContext, build_detectors
from rankwatch.detectors.base import config_section
from rankwatch.detectors.gpu import GpuDetector, NvmlHangRule
from rankwatch.detectors.liveness import StallDetector
from rankwatch.detectors.registry import load_all, register
from rankwatch.engine import RankEngine
from rankwatch.records import Finding, Severity, StepRecord
from rankwatch.state import RankState

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
EVENT_TYPES = set(typing.get_args(ev.Event))


def test_every_detector_declares_kinds_events_and_a_real_config_section() -> None:
    classes = load_all()
    assert len(classes) >= 17 and len(set(classes)) == len(classes)
    for cls in classes:
        assert cls.kinds and all(isinstance(k, str) and k for k in cls.kinds), cls
        assert cls.accepts and set(cls.accepts) <= EVENT_TYPES, cls
        if cls.section is not None:
            config_section(Config(), cls.section)  # raises on a misspelt section


def test_build_detectors_builds_the_registry_and_leaves_out_what_has_nothing_to_judge() -> None:
    kinds = {type(d) for d in build_detectors(Config(), DetectorContext(rank=0))}
    assert StallDetector in kinds and GpuDetector in kinds and NvmlHangRule in kinds
    from rankwatch.detectors.deadline import DeadlineDetector

    assert DeadlineDetector not in kinds  # no job end known
    assert DeadlineDetector in {type(d) for d in build_detectors(Config(), DetectorContext(0, job_end=1e10))}


def test_the_engine_routes_an_event_by_type_and_only_records_touch_the_state() -> None:
    eng = RankEngine(Config(), rank=2, started=0.0)
    lost = ev.GpuSample(index=0, time=5.0, uuid="GPU-x", lost=True, lost_reason="GPU is lost")
    (f,) = eng.feed(ev.GpuRound(now=5.0, samples=(lost,)))
    assert f.kind == "gpu_lost" and f.rank == 2 and f.subject == "GPU-x"
    assert eng.state.first_time is None and eng.state.step_count == 0
    (h,) = [x for t in range(0, 200, 10) for x in eng.feed(ev.NvmlHang(now=float(t), hung_for=float(t)))]
    assert h.kind == "gpu_unresponsive"
    eng.feed(StepRecord(step=1, loss=2.0, time=100.0))
    assert eng.state.step_count == 1 and eng.internal_errors == 0


def test_analyze_keeps_taking_the_detectors_config_alone() -> None:
    eng = RankEngine(DetectorsConfig(), rank=0, path="rank-0.log")
    assert {type(d) for d in eng.detectors} >= {StallDetector, GpuDetector}


class _Liar(Detector):
    kinds: ClassVar[tuple[str, ...]] = ("declared",)
    accepts = (ev.Tick,)

    def observe(self, state: RankState, record: ev.Event) -> list[Finding]:
        return [Finding(kind="undeclared", severity=Severity.INFO, rank=state.rank, message="x")]


class _Broken(Detector):
    kinds: ClassVar[tuple[str, ...]] = ("never",)
    accepts = (ev.Tick,)

    def observe(self, state: RankState, record: ev.Event) -> list[Finding]:
        raise RuntimeError("bug")


def test_an_undeclared_kind_is_passed_on_and_counted_and_a_raising_detector_is_isolated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    eng = RankEngine(Config(), rank=0)
    eng.detectors[:0] = [_Broken(), _Liar()]
    for _ in range(3):
        (f,) = eng.feed(ev.Tick(now=1.0, wall=2.0))
        assert f.kind == "undeclared"
    assert eng.internal_errors == 6
    assert sum("does not declare" in r.message for r in caplog.records) == 1
    assert sum("_Broken failed" in r.message for r in caplog.records) == 1


def test_register_refuses_a_detector_without_kinds() -> None:
    class Nameless(Detector):
        def observe(self, state: RankState, record: ev.Event) -> list[Finding]:
            return []

    with pytest.raises(TypeError):
        register(Nameless)
    assert Nameless not in REGISTRY


def _logs() -> list[str]:
    found = glob.glob(str(ROOT / "examples" / "**" / "*.log*"), recursive=True)
    kept = glob.glob(str(ROOT / "tests" / "**" / "*.log"), recursive=True)
    found += [p for p in kept if Path(p).stat().st_size < 2e6]
    return sorted(found)


@pytest.mark.parametrize("path", _logs(), ids=lambda p: str(Path(p).relative_to(ROOT)))
def test_every_finding_on_the_kept_logs_is_of_a_kind_its_detector_declares(path: str) -> None:
    res = analyze_file(path, Config(), 0)
    declared = {k for cls in load_all() for k in cls.kinds}
    for eng, found in res.ranks:
        assert eng.internal_errors == 0, path
        assert {f.kind for f in found} <= declared, path


def test_events_are_plain_data() -> None:
    for t in EVENT_TYPES:
        assert dataclasses.is_dataclass(t), t
