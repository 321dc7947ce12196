"""loss_plateau's window: the fast path (a bisection and the state's loss copy) must hand
over exactly what the walk over the step records does, whatever the log looks like."""

from __future__ import annotations

import math
import random

import pytest

import rankwatch.detectors.loss as loss_mod
from rankwatch.config.schema import DetectorsConfig
from rankwatch.detectors.loss import LossPlateauDetector, _walk_losses
from rankwatch.engine import RankEngine
from rankwatch.records import StepRecord
from rankwatch.state import HISTORY, RankState

pytestmark = pytest.mark.unit


def _engine() -> tuple[RankEngine, LossPlateauDetector]:
    eng = RankEngine(DetectorsConfig(), rank=0, path="rank-0.log")
    det = next(d for d in eng.detectors if isinstance(d, LossPlateauDetector))
    return eng, det


def _loss(rng: random.Random, kind: str) -> float | None:
    if kind == "nan" and rng.random() < 0.05:
        return math.nan
    if kind == "missing" and rng.random() < 0.05:
        return None
    return 3.0 + rng.random()


@pytest.mark.parametrize("kind", ["ordered", "nan", "missing", "backwards", "sparse", "late_loss"])
def test_window_equals_walk(kind: str) -> None:
    rng = random.Random(kind)
    eng, det = _engine()
    step = 0
    late: list[StepRecord] = []
    windows = 0
    for i in range(HISTORY + 1500):
        step += rng.choice([1, 1, 5, 50]) if kind == "sparse" else 1
        if kind == "backwards" and i % 700 == 699:
            step -= 300  # a restart from a checkpoint
        rec = StepRecord(step=step, loss=None if kind == "late_loss" and i % 97 == 0 else _loss(rng, kind))
        if rec.loss is None and kind == "late_loss":
            late.append(rec)
        eng.feed(rec)
        if kind == "late_loss" and late and i % 97 == 3:
            late.pop().loss = 2.5  # DeepSpeed fills a field of a step it already handed out
        if i % 211 == 0 or i % 700 == 0:  # a spread of points, and each one just after a restart
            for lo in (step - 10, step - 400, step - 3000, step - 10**6, step + 1):
                fast, walked = det._window(eng.state, lo), _walk_losses(eng.state, lo)
                assert fast == walked, (kind, i, lo)
                assert all(a is b for a, b in zip(fast, walked, strict=True))
                windows += 1
    assert windows > 100


def test_fast_path_taken_on_a_healthy_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case it exists for takes no walk (else the fix is gone, silently)."""
    eng, det = _engine()
    for s in range(1, HISTORY + 200):
        eng.feed(StepRecord(step=s, loss=3.0 + (s % 7) / 100))
    called: list[int] = []
    real = loss_mod._walk_losses

    def spy(state: RankState, lo: int) -> list[float]:
        called.append(lo)
        return real(state, lo)

    monkeypatch.setattr(loss_mod, "_walk_losses", spy)
    got = det._window(eng.state, HISTORY - 500)
    assert called == []
    assert got == real(eng.state, HISTORY - 500)
