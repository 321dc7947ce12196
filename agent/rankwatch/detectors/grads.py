"""Gradient health: explosion, saturated clipping, vanishing, fp16 loss-scale collapse."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rankwatch.config.settings import opt, settings
from rankwatch.detectors.base import Detector, Episode, finding, fmt, median
from rankwatch.detectors.registry import register
from rankwatch.events import Event
from rankwatch.records import Finding, OverflowRecord, Severity, StepRecord
from rankwatch.state import RankState


@settings("detectors", "grad_explosion", "gradient explosion")
@dataclass(frozen=True)
class GradExplosionConfig:
    enabled: bool = opt(True, "grad norm far above normal for several steps")
    threshold: float = opt(10.0, "absolute grad-norm threshold")
    factor: float = opt(10.0, "and this many times the post-warmup median")
    consecutive: int = opt(3, "steps in a row above both")
    climb_factor: float = opt(
        10.0, "from step 1: grad norm above threshold and this many times the lowest of the few before"
    )
    baseline_steps: int = opt(10, "steps that form the median; before it, only cold_threshold counts")
    # Without a baseline a large grad norm may be the run's normal: YOLO-World (mmengine, summed
    # detection losses) logs 971-1067 (AILab-CVC/YOLO-World#190) and 1225-1304
    # (AILab-CVC/YOLO-World#165) in healthy runs; openpi's exploded run (Physical-Intelligence/
    # openpi#814) logs 5.5e5-1.2e6 from its first record.
    cold_threshold: float = opt(
        1e4, "before baseline_steps: grad norm above this for consecutive steps is an explosion", min=0.0
    )


@settings("detectors", "grad_clipping", "clipping saturated")
@dataclass(frozen=True)
class GradClippingConfig:
    enabled: bool = opt(True, "pre-clip grad norm above max_grad_norm on most steps")
    max_grad_norm: float = opt(1.0, "the run's clipping threshold (HF default 1.0)")
    fraction: float = opt(0.9, "share of steps in the window that must exceed it")
    window: int = opt(100, "logged steps judged")


@settings("detectors", "grad_vanishing", "vanishing gradients")
@dataclass(frozen=True)
class GradVanishingConfig:
    enabled: bool = opt(True, "grad norm collapsed to ~0 for many steps")
    threshold: float = opt(1e-6, "grad norm below this counts as vanished")
    consecutive: int = opt(20, "steps in a row below it")
    # A loss 10^4 times below its first value with the gradients gone likewise is no learning
    # but a collapse (every label masked, the target in the input). Real cases: OLMo#692
    # (tests/data/wild/olmo_loss_collapse_zero.log: 12.18 -> 1.8e-6, grad 231 -> 2e-4) and
    # ModernBERT#233 (loss 0.2 -> 0.0 with NaN grads); a cross-entropy's healthy end is within
    # 10^2 of its start (ln(vocab) ~ 10 -> >= 0.1).
    collapse_ratio: float = opt(
        1e-4, "a loss and a grad norm this many times below their first values is a collapse, from step 1"
    )
    # A loss of exactly 0 with a grad norm below ``threshold`` is what a batch with every label
    # masked gives (no token to learn from), from the first record on, so no first value to fall
    # from. Real case: axolotl#2357 (tests/data/wild/batch3/axolotl_qwen32b_loss_grad_zero.log,
    # 11 records of loss 0.0, grad_norm 0.0). A learning model's loss printed as 0.0 after rounding
    # still has a gradient; five records in a row is no single empty batch.
    dead_records: int = opt(
        5, "records in a row with loss exactly 0 and the grad norm below threshold: nothing is learnt", min=1
    )


@settings("detectors", "loss_scale", "fp16 loss-scale collapse")
@dataclass(frozen=True)
class LossScaleConfig:
    enabled: bool = opt(True, "fp16 loss scaler shrinking again and again")
    min_scale: float = opt(1.0, "a scale at or below this is a collapse")
    max_overflows: int = opt(20, "overflow (skipped) steps within the window that count as a collapse")
    window: int = opt(200, "steps the overflow count is taken over")
    halvings: int = opt(
        5, "overflows in a row (no growth between) ending at or below low_scale are a collapse"
    )
    low_scale: float = opt(16.0, "a scale this low after repeated halvings is no start-up calibration")
    # DeepSpeed's dynamic scaler at its floor overflows once more before it raises (hysteresis,
    # delayed_shift=2 by default, runtime/fp16/loss_scaler.py): beyond that, every step is skipped.
    # Real cases: ds_t5_scale_stuck_at_1.log (HF#14531, every step at scale 1) and fairseq#512
    # (the scale halved to 0.000122, fairseq's floor, then FloatingPointError).
    floor_overflows: int = opt(
        3, "overflows in a row at or below min_scale that count as a collapse (beyond the hysteresis)", min=1
    )


CLIMB_RECORDS = 5  # logged steps a grad-norm climb is looked for over
LR_RISING = 1.01  # the LR 10 logged steps ago was more than 1% lower: still in warmup
_BASELINE_MAX = 500  # grad norms the explosion baseline learns from


def lr_warming_up(state: RankState) -> bool:
    ends = state.ends("learning_rate", 10)
    return ends is not None and ends[1] > ends[0] * LR_RISING


@register
class GradExplosionDetector(Detector):
    """Grad norm above an absolute threshold *and* far above its own median, or, from the
    first step and through any warmup, climbing ``climb_factor``-fold within a few logged
    steps to above the threshold and staying there.

    The relative test keeps runs whose healthy grad norm is simply large silent; a healthy
    warmup's grad norm starts high and falls, it does not multiply.
    """

    kinds = ("grad_explosion",)
    accepts = (StepRecord,)
    section = "detectors.grad_explosion"

    def __init__(self, cfg: GradExplosionConfig, warmup_steps: int) -> None:
        self.cfg = cfg
        self.warmup = warmup_steps
        self.run: list[tuple[int | None, float]] = []
        self.baseline: list[float] = []
        self._base: float | None = None
        self.episode = Episode()
        self.lately: deque[float] = deque(maxlen=CLIMB_RECORDS + 2)
        self.climb_low: float | None = None  # set while an episode opened by a climb lasts

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, StepRecord) or not self.cfg.enabled:
            return []
        g = record.grad_norm
        if g is None or g - g != 0:  # absent, NaN or inf: the NaN detector's
            return []
        g = float(g)
        lately = self.lately
        lately.append(g)
        if g > self.cfg.threshold and not self.episode.active and len(lately) >= 3:
            climbed = self._climb(state, record, list(lately))
            if climbed:
                return climbed
        base = self._base if len(self.baseline) >= self.cfg.baseline_steps else None
        # Without a baseline yet, only a blow-up far past any healthy run's grad norm counts.
        high = (
            g > self.cfg.factor * base and g > self.cfg.threshold
            if base is not None
            else g > self.cfg.cold_threshold
        )
        if not high and not self.run and not self.episode.active and len(self.baseline) >= _BASELINE_MAX:
            return []  # the usual step: nothing to learn, count or close, in warmup or not
        if lr_warming_up(state) and self.climb_low is None:
            return []  # warmup by the run's own schedule, however long: grad norms run high
        if not high:
            if self.climb_low is not None and g > self.cfg.threshold:
                return []  # after a climb: still above the absolute threshold, not over
            self.climb_low = None
            self.run.clear()
            if len(self.baseline) < _BASELINE_MAX:
                self.baseline.append(g)
                n = len(self.baseline)
                if n >= 5 and (n < 50 or n % 25 == 0):
                    self._base = median(self.baseline)
            if self.episode.close():
                return [
                    finding(
                        "grad_explosion",
                        Severity.WARNING,
                        state,
                        f"grad norm back to {fmt(g)}",
                        record=record,
                        resolved=True,
                    )
                ]
            return []
        self.run.append((record.step, g))
        if len(self.run) >= self.cfg.consecutive and self.episode.open(record.step):
            vals = ", ".join(f"{s}: {fmt(v)}" for s, v in self.run[-8:])
            return [
                finding(
                    "grad_explosion",
                    Severity.WARNING,
                    state,
                    f"gradient explosion: grad norm above {fmt(self.cfg.threshold)}"
                    + (f" and {fmt(self.cfg.factor)}x its median {fmt(base)}" if base else "")
                    + f" for {len(self.run)} steps ({vals}). A NaN often follows. Usual fix: lower the "
                    "LR, enable/tighten gradient clipping, check for a bad batch, prefer bf16.",
                    record=record,
                    evidence={"grad_norms": self.run[-16:], "baseline_median": base},
                )
            ]
        return []

    def _climb(self, state: RankState, record: StepRecord, vals: list[float]) -> list[Finding]:
        """The last two grad norms both ``climb_factor`` x the lowest of the few before them."""
        before = vals[:-2]
        low = min(before)
        factor = self.cfg.climb_factor
        if low <= 0 or min(vals[-2:]) < factor * low:
            return []
        self.episode.open(record.step)
        self.climb_low = low
        self.run = [(record.step, vals[-1])]
        return [
            finding(
                "grad_explosion",
                Severity.WARNING,
                state,
                f"gradient explosion: grad norm climbed from {fmt(low)} to {fmt(vals[-1])} "
                f"({vals[-1] / low:.0f}x) within {len(vals)} logged steps. In the first steps this is an LR "
                "far too high or no warmup; a NaN often follows. Usual fix: lower the LR, add warmup, "
                "enable/tighten gradient clipping, check for a bad batch, prefer bf16.",
                record=record,
                evidence={"grad_norms": vals, "from": low},
            )
        ]


@register
class GradClippingDetector(Detector):
    kinds = ("grad_clipping_saturated",)
    accepts = (StepRecord,)
    section = "detectors.grad_clipping"

    def __init__(self, cfg: GradClippingConfig, warmup_steps: int) -> None:
        self.cfg = cfg
        self.warmup = warmup_steps
        self.seen = 0
        self.flags: deque[bool] = deque(maxlen=cfg.window)
        self.over = 0
        self.episode = Episode()

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, StepRecord) or not self.cfg.enabled:
            return []
        g = record.grad_norm
        if g is None or g - g != 0:
            return []
        if (record.step if record.step is not None else state.position()) <= self.warmup:
            return []
        self.seen += 1
        w = self.cfg.window
        over = g > self.cfg.max_grad_norm
        if len(self.flags) == w:
            self.over -= self.flags[0]
        self.flags.append(over)
        self.over += over
        if self.seen < w:
            return []
        share = self.over / len(self.flags)
        if share >= self.cfg.fraction:
            if self.episode.open(record.step):
                grads = state.recent("grad_norm", w)
                return [
                    finding(
                        "grad_clipping_saturated",
                        Severity.INFO,
                        state,
                        f"gradient clipping saturated: the pre-clip grad norm exceeded max_grad_norm "
                        f"{fmt(self.cfg.max_grad_norm)} on {share * 100:.0f}% of the last {len(grads)} "
                        f"logged steps (median {fmt(median(grads))}), so every update is rescaled. The "
                        "learning rate is likely too high; lower it or raise max_grad_norm.",
                        record=record,
                        evidence={"share": share, "median_grad_norm": median(grads)},
                    )
                ]
        elif share < self.cfg.fraction / 2 and self.episode.close():
            return [
                finding(
                    "grad_clipping_saturated",
                    Severity.INFO,
                    state,
                    "clipping no longer saturated",
                    record=record,
                    resolved=True,
                )
            ]
        return []


@register
class GradVanishingDetector(Detector):
    kinds = ("grad_vanishing",)
    accepts = (StepRecord,)
    section = "detectors.grad_vanishing"

    def __init__(self, cfg: GradVanishingConfig, warmup_steps: int) -> None:
        self.cfg = cfg
        self.warmup = warmup_steps
        self.low = 0
        self.episode = Episode()
        self.first_loss: float | None = None
        self.first_grad: float | None = None
        self.dead = 0  # records in a row with loss exactly 0 and no gradient

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, StepRecord) or not self.cfg.enabled:
            return []
        loss = record.loss
        if self.first_loss is None and loss is not None and loss - loss == 0 and loss > 0:
            self.first_loss = loss
        g = record.grad_norm
        if g is None or g - g != 0:
            return []
        self.dead = self.dead + 1 if loss == 0 and g < self.cfg.threshold else 0
        if self.dead >= self.cfg.dead_records and self.episode.open(record.step):
            return [
                finding(
                    "grad_vanishing",
                    Severity.WARNING,
                    state,
                    f"nothing is being learnt: loss exactly 0 and grad norm {fmt(g)} on {self.dead} logged "
                    "steps in a row. Usual causes: every label masked (-100) or padding only, an empty "
                    "completion after the prompt is masked, a broken data collator.",
                    record=record,
                    evidence={"grad_norm": g, "loss": loss, "records": self.dead},
                )
            ]
        if self.first_grad is None and g > 0:
            self.first_grad = g
        # The collapse rule is safe from step 1 (the slow rule below waits out the warmup): the
        # loss and the grad norm both fell by collapse_ratio from their first values, or the grad
        # norm below the vanishing threshold.
        ratio = self.cfg.collapse_ratio
        gone = g < self.cfg.threshold or (self.first_grad is not None and g <= self.first_grad * ratio)
        if (
            gone
            and loss is not None
            and self.first_loss is not None
            and 0 <= loss <= self.first_loss * ratio
            and self.episode.open(record.step)
        ):
            return [
                finding(
                    "grad_vanishing",
                    Severity.WARNING,
                    state,
                    f"training collapsed: loss fell from {fmt(self.first_loss)} to {fmt(loss)} and the grad "
                    f"norm to {fmt(g)}; nothing is being learnt any more. Usual causes: every label masked "
                    "(-100) or padding only, a batch of one repeated sample, or the target leaking into the "
                    "input.",
                    record=record,
                    evidence={"grad_norm": g, "loss": loss, "first_loss": self.first_loss},
                )
            ]
        if (record.step if record.step is not None else state.position()) <= self.warmup:
            return []
        if g < self.cfg.threshold:
            self.low += 1
        else:
            self.low = 0
            if self.episode.close():
                return [
                    finding(
                        "grad_vanishing",
                        Severity.WARNING,
                        state,
                        "grad norm recovered",
                        record=record,
                        resolved=True,
                    )
                ]
        if self.low >= self.cfg.consecutive and self.episode.open(record.step):
            return [
                finding(
                    "grad_vanishing",
                    Severity.WARNING,
                    state,
                    f"vanishing gradients: grad norm below {fmt(self.cfg.threshold)} for {self.low} logged "
                    f"steps (now {fmt(record.grad_norm)}); the model has stopped learning. Usual causes: "
                    "LR decayed to ~0, frozen parameters, dead activations, or an fp16 underflow.",
                    record=record,
                    evidence={"grad_norm": record.grad_norm, "steps_below": self.low},
                )
            ]
        return []


@register
class LossScaleDetector(Detector):
    """fp16 dynamic loss scaling that keeps shrinking: every overflow is a skipped step.

    Two rules, both safe at start-up, where the scaler backs off from 2^16..2^32 to a
    scale that fits (a few to 16 halvings, ending high): ``halvings`` overflows in a row
    ending at or below ``low_scale`` (a scale that low means gradients overflow at any
    scale: inf/NaN in the model), or ``max_overflows`` overflows within ``window`` steps.
    A scale at or below ``min_scale`` after a higher one, or an overflow to below it, counts at once.
    """

    kinds = ("loss_scale_collapse",)
    accepts = (StepRecord, OverflowRecord)
    section = "detectors.loss_scale"

    def __init__(self, cfg: LossScaleConfig, warmup_steps: int) -> None:
        self.cfg = cfg
        self.episode = Episode()
        self.streak = 0  # overflows since the scale last grew

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not self.cfg.enabled or not isinstance(record, (StepRecord, OverflowRecord)):
            return []
        is_step = isinstance(record, StepRecord)
        if not is_step:
            old, new = record.old_scale, record.new_scale  # type: ignore[union-attr]
            if old is not None and new is not None and new >= old and old > self.cfg.min_scale:
                self.streak = 0  # hysteresis: the scale held
            else:
                self.streak += 1  # halved, or overflowing at the floor ("scale: 1, reducing to 1")
        scale = record.loss_scale if is_step else record.new_scale  # type: ignore[union-attr]
        if scale is None or scale - scale != 0:
            scale = state.last_loss_scale  # DeepSpeed's step lines print no scale; its OVERFLOW lines do
        ok = scale is not None and scale - scale == 0
        if is_step and not record.skipped_iters:  # type: ignore[union-attr]
            if self.streak and ok and scale > max(self.cfg.min_scale * 4, self.cfg.low_scale):  # type: ignore[operator]
                self.streak = 0  # a step went through at a healthy scale
            low_streak = self.streak >= self.cfg.halvings and scale <= self.cfg.low_scale  # type: ignore[operator]
            if (
                self.episode.active
                and ok
                and scale > self.cfg.min_scale * 4  # type: ignore[operator]
                and not low_streak  # still what opened it: no "recovered" to reopen at the next step
                and self.episode.close()
            ):
                return [
                    finding(
                        "loss_scale_collapse",
                        Severity.WARNING,
                        state,
                        f"loss scale recovered to {fmt(scale)}",
                        record=record,
                        resolved=True,
                    )
                ]
            if scale is None:
                return []
        peak = state.max_loss_scale
        collapsed = (
            ok
            and scale <= self.cfg.min_scale  # type: ignore[operator]
            and peak is not None
            and peak > self.cfg.min_scale
        )
        halved = ok and self.streak >= self.cfg.halvings and scale <= self.cfg.low_scale  # type: ignore[operator]
        # Steps skipped again and again at the lowest scale: no scale is small enough, the
        # gradients are inf/NaN whatever the scaler does.
        floor = ok and self.streak >= self.cfg.floor_overflows and scale <= self.cfg.min_scale  # type: ignore[operator]
        # A scale printed as 0: below what the framework's own format shows (fairseq prints 3
        # decimals; its floor is 1e-4): fairseq#1529 "loss_scale 0.000" and fairseq#1895
        # "loss_scale 0", both ending in "Minimum loss scale reached". No run trains at scale 0.
        zero = ok and scale == 0 and is_step
        # An overflow that takes the scale below min_scale, whatever came before: every scaler
        # starts far above it (apex amp and torch's GradScaler at 2^16, apex fp16_utils and
        # DeepSpeed at 2^16..2^32 with a floor of 1), so the scale got there by overflowing again
        # and again, the gradients inf/NaN even unscaled. apex amp has no floor (min_loss_scale
        # None, amp/scaler.py) and prints only the new scale: PVT#94 "reducing loss scale to
        # 0.03125" is the one line the run left; apex#318 halves on down to 1e-205.
        below = ok and not is_step and scale < self.cfg.min_scale  # type: ignore[operator]
        collapsed = collapsed or floor or zero or below
        if not collapsed and not halved and len(state.overflows) < self.cfg.max_overflows:
            return []  # every step of a healthy run: too few overflows ever to count
        now = record.step if record.step is not None else state.position()
        start = now - self.cfg.window
        recent = [s for s in state.overflows if s > start]
        if (collapsed or halved or len(recent) >= self.cfg.max_overflows) and self.episode.open(now):
            if zero:
                why = "the scale the trainer prints has fallen to 0"
            elif below and not floor and not halved:
                why = f"an overflow took it below {fmt(self.cfg.min_scale)}, where no scaler starts"
            elif floor:
                why = f"{self.streak} overflows in a row at the lowest scale (every one a skipped step)"
            elif halved:
                why = f"{self.streak} overflows in a row halved it to {fmt(scale)}"
            else:
                why = f"{len(recent)} overflow/skipped steps in the last {self.cfg.window} steps"
            return [
                finding(
                    "loss_scale_collapse",
                    Severity.WARNING,
                    state,
                    f"fp16 loss scale collapsing: scale {fmt(scale)}, {why}. The model is producing "
                    "inf/NaN gradients; switch to bf16, lower the LR, or check for a bad batch.",
                    record=record,
                    step=now,
                    evidence={"loss_scale": scale, "overflows_in_window": len(recent), "streak": self.streak},
                )
            ]
        return []


# Order of findings of one log record across modules (registry.py): then grad norms and loss scale.
ORDER = 20
