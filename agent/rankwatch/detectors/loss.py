"""The "loss is wrong" family: NaN, spikes, divergence, plateau, overfitting."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter
from typing import Any

from rankwatch.config.settings import opt, settings
from rankwatch.detectors.base import Detector, Episode, at_step, finding, fmt, median, step_noise
from rankwatch.detectors.registry import register
from rankwatch.events import Event
from rankwatch.records import EvalRecord, Finding, Severity, StepRecord
from rankwatch.state import RankState, finite


@settings("detectors", "nan", "NaN / Inf detection")
@dataclass(frozen=True)
class NanConfig:
    enabled: bool = opt(True, "non-finite loss, grad norm, eval loss or loss scale")
    zero_loss_min_prior: float = opt(
        0.05, "a loss of exactly 0 after the median loss was above this is treated as NaN-filtered"
    )
    lookback_steps: int = opt(10, "steps before a NaN inspected to tell blow-up from bad batch")
    # fp16 dynamic loss scaling starts high (torch GradScaler 2^16, DeepSpeed 2^32) and halves on
    # each overflow, skipping that step (torch/amp/grad_scaler.py, deepspeed loss_scaler.py): the
    # first logging window of a healthy fp16 run can hold a NaN/inf grad norm. Real cases: the
    # three DeepSpeed calibrations in tests/data/wild (ds_*_scale_calibration.log) and the HF
    # Trainer fp16 run of tests/test_general_reader.py. The next record decides.
    # float32 holds up to 3.4e38 and fp16 training multiplies the loss by the loss scale (torch
    # GradScaler starts at 2^16): a loss beyond 3.4e38 / 2^16 = 5.2e33 overflows to inf when
    # scaled; no loss that means something is that large (ESPnet#3885: -3.19e34 after 59.6).
    overflow_magnitude: float = opt(
        5.2e33, "a loss this large in magnitude is numerically broken: reported as a NaN/Inf loss"
    )
    calibration_records: int = opt(
        1,
        "logged records at the start of a run whose non-finite grad norm (with a finite, non-zero "
        "loss) may be fp16 loss-scale calibration: judged by the record after them, 0 to judge at once",
        min=0,
    )


@settings("detectors", "loss_spike", "loss spikes")
@dataclass(frozen=True)
class LossSpikeConfig:
    enabled: bool = opt(True, "a single step's loss far above its recent mean")
    factor: float = opt(2.0, "spike when loss > factor x rolling mean of the window")
    window: int = opt(10, "logged steps in the rolling mean")
    min_delta: float = opt(0.1, "and at least this absolute rise, so tiny losses do not fire")
    noise_factor: float = opt(
        8.0,
        "and this many robust standard deviations of the step-to-step noise (MAD), so noisy runs do not fire",
    )
    noise_window: int = opt(50, "logged steps the noise is measured over")
    # Per-batch logs at small batch sizes are noisy (YOLOX VOC at batch size 1, step noise 25% of
    # the loss: tests/data/wild/batch2/yolox_voc_s_healthy_bs1.log; LitGPT per-batch SFT losses
    # 3.5..26, awslabs/keys_values#97); smooth pretraining logs are at 1-2% (the llm.c and
    # torchtitan cases of tests/data/wild). In a noisy log one batch that comes straight back is noise.
    confirm_noise_ratio: float = opt(
        0.1,
        "step noise (robust sd) at or above this fraction of the loss level: a spike must still be up "
        "at the next logged step to count",
    )
    # A short log has no step noise to judge a jump against, so the losses after it decide: a
    # rise that stays (MLX LoRA 1.41 -> 3.32 -> 6.44 .. 4.60, ml-explore/mlx-examples#620; a
    # resumed Qwen3 pre-training 1.47 -> 13.85 .. 14.4, batch10) against per-batch noise that
    # comes back within the window (Horovod deeplab rank 1: 3.40 -> 11.08 -> 3.98,
    # horovod/horovod#1737; a torch DDP run's fresh batches 4.44 -> 11.33 -> 10.59 -> 9.22 ->
    # 5.75 .. 0.64, tests/data/torchrun/ddp_healthy_noisy_start_rank-0.log).
    min_records: int = opt(
        1,
        "earlier logged steps a spike is judged against at the least; with fewer than `window` the "
        "loss and most of the `window` losses after it (all the log has, when it ends first) must "
        "exceed factor x the largest of them (a short log is judged against what there is)",
        min=1,
    )
    # One earlier loss is no level: it may be the low draw of a noisy per-batch start. An
    # accelerate run's first per-batch MSE of 1.45, then 11.3, 9.2, 10.0, 6.4, 6.5, 6.7, 12.7 and
    # back to 2.1 (tests/data/accelerate/acc_healthy_low_first_loss_rank-0.log), and the same
    # workload's first logged loss 1.45 -> 11.2 .. 10.3 -> 1.6 under another run (black-box s38
    # g23, tests/data/blackbox/s38/repro/g23): six of the losses after the jump stay up, then one
    # comes back to the first's level. A jump that stays up never comes back (a resumed Qwen3
    # pre-training 1.47 -> 13.85 .. 14.4, batch10; 2.77 -> 7.34 -> 8.72, issue 27).
    level_records: int = opt(
        2,
        "earlier logged steps a short log's jump needs before most of the window after it decides; "
        "against fewer, every loss after it must stay up (one earlier loss may be a low draw)",
        min=1,
    )
    # Real per-batch noise rises a few times the loss level at most (YOLOX VOC at batch size 1:
    # 21.6 after 5.2; LitGPT SFT losses 3.5..26, awslabs/keys_values#97), and a ratio to the mean
    # says nothing when the losses are negative (a flow's or VAE's log-likelihood). WaveGlow#32:
    # 4191.7 after -4.07..-4.49 (930x their magnitude), then -2.4: a blow-up the model survived.
    extreme_factor: float = opt(
        100.0,
        "a loss above every earlier one of the window by this many times their largest magnitude is "
        "a spike at once, even when the next loss comes back (short logs and negative losses)",
        min=1.0,
    )


@settings("detectors", "loss_divergence", "sustained loss rise")
@dataclass(frozen=True)
class LossDivergenceConfig:
    enabled: bool = opt(True, "a sustained rise of the loss, not a single spike")
    window: int = opt(50, "logged steps per median window")
    rise_ratio: float = opt(0.25, "diverging when the recent median is this far above the best median")
    consecutive_windows: int = opt(2, "rise must hold over this many consecutive windows")
    min_delta: float = opt(
        0.1, "and the loss must have risen by at least this much, so tiny losses do not fire"
    )
    blowup_factor: float = opt(
        4.0, "blow-up: losses above this many times the lowest of the run's first five"
    )
    # The lowest of the first losses may be one low draw of a noisy per-batch start (accelerate's
    # per-batch MSE 1.45, then 11.3, 9.2, 10.0, 6.4 and back to 2.1 at step 9:
    # tests/data/accelerate; the same workload in another run, 1.45, 11.2, 8.5, 8.8, 5.8 .. 1.6 at
    # step 9, black-box s38 g23), not the level the run started from: a level is what more than
    # one loss reaches, 2 the fewest that is not one draw. Real blow-ups from one loss stay up
    # (the golden corpus's HF run at lr 5: 3.90, then 236, 207, 600 ..; batch10's resumed Qwen3
    # 1.47 -> 13.85 .. 14.4); those from a level are told as soon as before (wild
    # fairseq_fconv_wmt_enfr_explosion: 9.57, 8.61, 7.50, 6.87, then 1.0e4 .. 7.7e12).
    blowup_level_records: int = opt(
        2,
        "blow-up: first losses within blowup_factor of the lowest for it to be the run's level; "
        "against a lower one alone, every loss after it must stay above for short_records logged steps",
        min=1,
    )
    blowup_records: int = opt(3, "blow-up: logged steps in a row above it")
    trend_records: int = opt(32, "trend: logged steps over which most changes must be rises")
    # Per-batch losses are noisy: a window median 29-63% above its best that stays within one
    # step-noise sd of the window is the batches' spread, not a rise (batch9 t5_custom_loop:
    # 0.4026 -> 0.5177 among per-batch losses); the wild corpus's window-rule divergences rise
    # beyond it.
    noise_factor: float = opt(
        1.0, "windows: the median must also rise this many step-noise sds of its window", min=0.0
    )
    # A log shorter than one window has no window median to judge. It is judged against what
    # there is, like the spike detector's min_records: the last blowup_records losses all
    # rise_ratio above the lowest loss before them and short_noise_factor step-noise sds beyond
    # it. Few records make a noisy per-batch loss look like a rise: healthy wild logs reach
    # 1.2-2.3 sds (batch2 yolox_voc_s, batch4 yolov1, batch5 llamafactory jsonl, batch9 t5
    # custom loop); batch10's word_lm RNN at lr 20 rises 36 sds (12.21 -> 15.97, noise 0.10).
    short_records: int = opt(
        20, "logged steps before a log shorter than one window is judged for a sustained rise", min=3
    )
    short_noise_factor: float = opt(
        6.0, "short logs: the rise must also clear this many step-noise sds of the losses before it", min=0.0
    )


@settings("detectors", "loss_plateau", "loss plateau")
@dataclass(frozen=True)
class LossPlateauConfig:
    enabled: bool = opt(True, "loss stopped improving long after warmup")
    window: int = opt(500, "training steps (not logged records) over which some improvement is expected")
    min_improvement: float = opt(0.005, "relative improvement of the median below this is a plateau")
    # A loss that never moves from its first record is a model learning nothing (a warning, not
    # the window rule's info): tf2 ALBERT at 11.17 for 8 records (aws-samples/deep-learning-models
    # #45), DINO at 11.0902 = ln 65536 for 11 epochs (facebookresearch/dino#246), lit-gpt at
    # 10.8259 = ln 50257 for 12 (Lightning-AI/litgpt#689); no healthy run of the wild corpus starts
    # with more than 3 records that close.
    flat_records: int = opt(
        8, "logged losses all within flat_tolerance of the first, from the first, before warning", min=2
    )
    flat_tolerance: float = opt(
        0.001, "relative spread of losses counted as flat (ALBERT's 11.166-11.177 is 0.1%)", min=0.0
    )


@settings("detectors", "overfitting", "eval rising while train falls")
@dataclass(frozen=True)
class OverfittingConfig:
    enabled: bool = opt(True, "eval loss rising while train loss still falls")
    eval_rise_ratio: float = opt(0.05, "eval loss this far above its minimum")
    min_evals: int = opt(3, "evaluations needed before judging")
    consecutive: int = opt(2, "evaluations in a row above the threshold")
    # A rise counts only beyond this many times the eval curve's own noise (robust sd of its
    # eval-to-eval changes; the 3-sigma control limit). Real curves: a healthy Keras fine-tune's
    # noisy val loss peaks 2.4 sigma above its best (batch6 keras_csvlogger_resnet50_emotion);
    # overfitting LSTMs rise 3.4 sigma (kk7nc/RMDL#14) and 5.8 sigma (keras-team/keras#3056).
    noise_factor: float = opt(3.0, "a rise must also exceed this many eval-to-eval noise sds", min=0.0)


def _restated(before: float, now: float) -> bool:
    """``now`` is ``before`` rounded to the digits ``now`` is written with."""
    text = repr(now)
    if "e" in text or "." not in text:
        return now == before
    return round(before, len(text.split(".", 1)[1])) == now


def _nonfinite(x: float | None) -> bool:
    return x is not None and not math.isfinite(x)


@register
class NanDetector(Detector):
    """Non-finite loss, grad norm, eval loss or loss scale.

    Hugging Face's ``logging_nan_inf_filter`` drops NaN losses from the logged mean, so a
    poisoned run may print ``loss 0`` beside ``grad_norm nan``: a loss that drops to exactly
    zero from a normal level counts too. Under fp16 loss scaling an isolated inf grad norm
    is an overflow the scaler skips, so there it takes a few in a row.
    """

    kinds = ("nan_loss",)
    accepts = (StepRecord, EvalRecord)
    section = "detectors.nan"

    def __init__(self, cfg: NanConfig, warmup_steps: int) -> None:
        self.cfg = cfg
        self.episode = Episode()
        # An eval's NaN is its own episode: the training losses between two evals are finite
        # (s39 k28), and only a finite eval loss says the eval recovered.
        self.eval_episode = Episode()
        self.bad_grads = 0
        # A first-window record with a non-finite grad norm and a finite loss, held until the
        # next record says whether it was fp16 loss-scale calibration.
        self.held: tuple[StepRecord, str] | None = None
        # The latest step of a non-finite record in the open episode: a finite record at that
        # step or before is another rank's of the same step where one log interleaves ranks
        # (plain ``run -- torchrun``, mp.spawn), not a recovery.
        self.bad_step: int | None = None

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not self.cfg.enabled:
            return []
        if isinstance(record, EvalRecord):
            if _nonfinite(record.eval_loss):
                return self._fire(state, record, f"eval loss is {record.eval_loss}")
            if finite(record.eval_loss) and self.eval_episode.close() and not self.episode.active:
                return [
                    finding(
                        "nan_loss",
                        Severity.CRITICAL,
                        state,
                        f"eval loss is finite again at eval {at_step(record)}",
                        record=record,
                        resolved=True,
                    )
                ]
            return []
        if not isinstance(record, StepRecord):
            return []
        held = self.held
        if held is not None:
            self.held = None
            if not (finite(record.loss) and record.loss and finite(record.grad_norm)):
                # Not calibration: the NaN stayed (or the loss went). Told at the first record.
                self.bad_grads = 0
                return self._fire(state, held[0], held[1]) + self.observe(state, record)
        loss, scale, grad = record.loss, record.loss_scale, record.grad_norm
        if (
            loss  # neither None nor 0: a NaN or inf is truthy, so it is tested below
            and loss - loss == 0
            and -self.cfg.overflow_magnitude < loss < self.cfg.overflow_magnitude
            and (scale is None or scale - scale == 0)
            and (grad is None or grad - grad == 0)
            and not self.episode.active
        ):
            self.bad_grads = 0
            return []  # every healthy step
        if (
            _nonfinite(grad)
            and loss
            and loss - loss == 0
            and not _nonfinite(scale)
            and state.step_count <= self.cfg.calibration_records
            and not self.episode.active
        ):
            self.held = (record, f"grad norm is {grad}")
            return []
        reasons: list[str] = []
        if _nonfinite(record.loss):
            reasons.append(f"loss is {record.loss}")
        elif loss is not None and abs(loss) >= self.cfg.overflow_magnitude:
            reasons.append(f"loss is {loss:.3g}, beyond what float32 holds once scaled (an overflow)")
        if _nonfinite(record.loss_scale):
            reasons.append(f"loss scale is {record.loss_scale}")
        if _nonfinite(record.grad_norm):
            self.bad_grads += 1
            needed = 3 if state.fp16_evidence else 1
            if self.bad_grads >= needed or reasons or record.loss == 0:
                reasons.append(f"grad norm is {record.grad_norm}")
        else:
            self.bad_grads = 0
        if record.loss == 0 and not reasons:
            prior = state.recent("loss", 20)[:-1]
            # On a shorter history the gradient tells: a loss of exactly 0 has a zero gradient,
            # so a grad norm still above 0 beside it (Qwen3-VL#1981 under the HF Trainer: 2.7584,
            # then 0.0 with the grad norm unchanged at 1.41) was not taken from that loss.
            short = (
                0 < len(prior) < 3
                and grad is not None
                and 0 < grad < math.inf
                and min(prior) > self.cfg.zero_loss_min_prior
            )
            # Zeros already in a row are the same collapse, judged against the losses before
            # them: three records, zeros included, are as much history as three losses
            # (LLaMA-Factory's trainer_log.jsonl: 122.14, then 0.0 on every record, no grad norm).
            before = list(prior)
            while before and before[-1] == 0:
                before.pop()
            if before and (len(prior) >= 3 or short) and median(before) > self.cfg.zero_loss_min_prior:
                reasons.append(
                    f"loss fell to exactly 0 from a median of {fmt(median(before))} "
                    "(NaN losses filtered out of the logged mean, e.g. HF logging_nan_inf_filter)"
                )
        if reasons:
            step = record.step
            if step is not None and (self.bad_step is None or step > self.bad_step):
                self.bad_step = step
            return self._fire(state, record, " and ".join(reasons))
        bad = self.bad_step
        if bad is not None and (record.step is None or record.step <= bad):
            return []
        if finite(record.loss) and record.loss != 0 and self.episode.close():
            self.bad_step = None
            if self.eval_episode.active:
                return []  # the NaN of the eval stays: resolved by a finite eval loss
            return [
                finding(
                    "nan_loss",
                    Severity.CRITICAL,
                    state,
                    f"loss is finite again at {at_step(record)}",
                    record=record,
                    resolved=True,
                )
            ]
        return []

    def finish(self, state: RankState) -> list[Finding]:
        held, self.held = self.held, None
        return self._fire(state, held[0], held[1]) if held is not None else []

    def _story(self, state: RankState) -> tuple[str, dict[str, Any]]:
        n = self.cfg.lookback_steps
        grads = [r.grad_norm for r in state.recent_records(n + 1)[:-1] if r.grad_norm is not None]
        history = state.recent("grad_norm", 200)
        base = median(history[: max(0, len(history) - n)]) if len(history) > n else math.nan
        evidence = {"grad_norm_before": grads, "grad_norm_baseline": base}
        finite_grads = [g for g in grads if math.isfinite(g)]
        if finite_grads and math.isfinite(base) and base > 0 and max(finite_grads) > 5 * base:
            return (
                f"Grad norm climbed before it ({', '.join(fmt(g) for g in grads[-5:])} vs a median of "
                f"{fmt(base)}): an optimisation blow-up. Usual fix: lower the LR or lengthen warmup, "
                "check gradient clipping, prefer bf16 over fp16; resume from the last good checkpoint.",
                evidence,
            )
        if finite_grads:
            return (
                f"Grad norm was flat before it ({', '.join(fmt(g) for g in grads[-5:])}): points to a bad "
                "sample or a numerics bug at this step. Usual fix: inspect the batch at this step "
                "(skip it on resume), look for log(0)/division by zero or an overflow in fp16.",
                evidence,
            )
        return (
            "Usual fix: resume from the last good checkpoint with a lower LR, check the batch at this "
            "step, prefer bf16 over fp16.",
            evidence,
        )

    def _fire(self, state: RankState, record: StepRecord | EvalRecord, what: str) -> list[Finding]:
        mine, other = (self.eval_episode, self.episode) if isinstance(record, EvalRecord) else (
            self.episode, self.eval_episode
        )  # fmt: skip
        if not mine.open(record.step) or other.active:
            return []  # one finding while either is open
        story, evidence = self._story(state)
        if isinstance(record, StepRecord):
            # Which values were not finite: under DDP one rank's NaN loss reaches every rank's
            # gradients through the backward all-reduce at the same step, while the others'
            # losses are still finite (``first_member`` in actions/alerts/message.py).
            bad = {"loss": record.loss, "grad_norm": record.grad_norm, "loss_scale": record.loss_scale}
            evidence["nonfinite"] = [k for k, v in bad.items() if _nonfinite(v)]
        where = at_step(record)
        first = "eval at " if isinstance(record, EvalRecord) else ""
        return [
            finding(
                "nan_loss",
                Severity.CRITICAL,
                state,
                f"NaN/Inf at {first}{where}: {what}. {story}",
                record=record,
                evidence=evidence,
            )
        ]


EVAL_NOISE_MEMORY = 64  # recent evals whose changes measure the eval curve's noise
FIRST_LOSSES = 5  # the run's first losses, the base of the blow-up rule
TREND_MIN_RECORDS = 12  # logged losses before a trend is judged
TREND_RISE_SHARE = 0.75  # share of step-to-step changes that must be rises
PLATEAU_EVERY = 10  # the plateau rule looks again every this many logged steps
PLATEAU_MIN_RECORDS = 20  # logged losses in the window needed to judge it
PLATEAU_RUN_SHARE = 3  # the window is at least this fraction of the run so far
PLATEAU_RESUME = 4  # "improving again" takes this many times min_improvement: noise flips less
SPIKE_MEMORY = 1000  # logged steps a past jump is remembered as "this run's normal"
SPIKE_RECORD_MARGIN = 1.25  # and a new one must beat it by this much to be news


@dataclass(eq=False)
class _Held:
    """A short log's jump above every earlier loss, until the losses after it decide."""

    record: StepRecord
    top: float  # the largest loss before it
    prior: list[float]  # the losses before it
    last: int  # the step of the last loss judged
    after: list[bool] = field(default_factory=list)  # each loss after it: still up?


@register
class LossSpikeDetector(Detector):
    """A jump far above the recent mean, beyond the run's own noise, larger than any lately.

    Per-batch losses (SFT, logging_steps=1) jump 2-3x now and then and come straight back:
    a spike must stand out from the step-to-step noise (median/MAD), beat the largest jump
    of the last ``SPIKE_MEMORY`` logged steps by a quarter. In a noisy log (step noise at least
    ``confirm_noise_ratio`` of the level) the next loss must still be above ``factor`` x the
    mean too (told at the jump; a jump that is the last loss of a log is told).
    """

    kinds = ("loss_spike",)
    accepts = (StepRecord,)
    section = "detectors.loss_spike"

    def __init__(self, cfg: LossSpikeConfig, warmup_steps: int) -> None:
        self.cfg = cfg
        self.warmup = warmup_steps
        self.quiet_until = -1
        self.ratios: deque[float] = deque(maxlen=SPIKE_MEMORY)  # loss / rolling mean, per logged step
        # A short log's jump above every earlier loss, its top, the losses before it and, for
        # each loss after it, whether it stayed up: until most of a window says.
        self.held: _Held | None = None
        # A jump over a full window, until the next loss says whether it stayed up.
        self.pending: tuple[StepRecord, float, float, list[float], float] | None = None
        self.last_epoch = -math.inf
        self.fresh = 0  # losses still to come before a run begun again in the log is judged

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, StepRecord) or not self.cfg.enabled:
            return []
        epoch = record.epoch
        if epoch is not None:
            if epoch < self.last_epoch:
                # The epoch went back: a new run in the same log (a second trainer.train(), a
                # restart). Its losses are no spike against the last run's: judged once a
                # window of its own is there.
                self.fresh, self.pending, self.held = self.cfg.window, None, None
            self.last_epoch = epoch
        loss = record.loss
        if loss is None or loss - loss != 0:  # absent, NaN or inf: the NaN detector's
            return []
        if self.fresh:
            self.fresh -= 1
            return []
        step = record.step if record.step is not None else state.position()
        cfg = self.cfg
        if self.held is not None:
            told = self._after_held(state, loss, step)
            if told or step <= self.quiet_until:
                return told
            vals = state.recent("loss", cfg.window + 1)  # a far larger jump meanwhile is told at once
            return self._extreme(state, record, loss, step, vals[:-1]) if len(vals) > cfg.min_records else []
        pending, self.pending = self.pending, None
        if pending is not None and loss > cfg.factor * pending[2]:
            # The loss after the jump is still up: a spike, told at the jump.
            self.quiet_until = step + cfg.window
            return [self._spike(state, *pending)]
        if step <= self.quiet_until:
            return []
        total = state.prior_sum("loss", cfg.window)
        if total is None:
            return self._short(state, record, loss, step)
        mean = total / cfg.window
        if mean <= 0:
            return self._extreme(state, record, loss, step, state.recent("loss", cfg.window + 1)[:-1])
        ratio = loss / mean if mean > 0 else 0.0
        before = self.ratios.copy() if ratio > cfg.factor else None
        self.ratios.append(ratio)
        if before is not None and loss - mean >= cfg.min_delta:
            window = state.recent("loss", cfg.window + 1)[:-1]
            history = state.recent("loss", max(self.cfg.noise_window, self.cfg.window) + 1)[:-1]
            level, sigma = median(history[-self.cfg.window :]), step_noise(history)
            if loss - level <= self.cfg.noise_factor * sigma:
                return []  # within this run's own step-to-step noise (per-batch losses of SFT)
            if before and ratio <= SPIKE_RECORD_MARGIN * max(before):
                return []  # this run had a jump as large recently and recovered: its normal tail
            if level > 0 and sigma / level >= cfg.confirm_noise_ratio:
                # A noisy per-batch log: judged at the next loss; one batch that comes straight
                # back (YOLOX at batch size 1: 5.0, 2.3, 5.2, 21.6, 6.7) is its noise.
                self.pending = (record, loss, mean, window, sigma)
                return []
            self.quiet_until = step + self.cfg.window
            return [self._spike(state, record, loss, mean, window, sigma)]
        return []

    def finish(self, state: RankState) -> list[Finding]:
        pending, self.pending = self.pending, None
        held, self.held = self.held, None
        if (
            held is not None
            and held.after
            and self._stayed_up(held)
            and not self._low_first_draw(state, held)
        ):
            # The log ended while the jump was still up in most of what came after it.
            return [self._held_spike(state, held)]
        return [self._spike(state, *pending)] if pending is not None else []

    def _short(self, state: RankState, record: StepRecord, loss: float, step: int) -> list[Finding]:
        """A log shorter than ``window``: judged against what there is, and stricter for it. A
        loss above every earlier one by ``factor`` is a candidate (``_after_held`` judges it)."""
        cfg = self.cfg
        vals = state.recent("loss", cfg.window + 1)
        if not vals or vals[-1] != loss:
            return []
        if len(vals) > cfg.min_records:
            found = self._extreme(state, record, loss, step, vals[:-1])
            if found:
                return found
        prior = vals[:-1]
        if len(prior) < cfg.min_records:
            return []
        top = max(prior)
        if top > 0 and loss > cfg.factor * top and loss - top >= cfg.min_delta:
            self.held = _Held(record, top, prior, step)
        return []

    def _after_held(self, state: RankState, loss: float, step: int) -> list[Finding]:
        """A short log's jump is a spike when the loss stays above ``factor`` x the earlier top
        for most of the ``window`` losses after it. With no step noise measured before it, one
        noisy batch or a few (fresh per-batch losses early in a run) are told from a rise only by
        the loss coming back: it is dropped as soon as most of the window can no longer stay up."""
        held = self.held
        assert held is not None
        if step == held.last:
            return []  # the same step's loss again (the ranks of a combined log): not a loss after it
        held.last = step
        cfg = self.cfg
        top, after = held.top, held.after
        after.append(loss > cfg.factor * top and loss - top >= cfg.min_delta)
        # Against fewer than level_records earlier losses the jump may be that loss's low draw:
        # every loss after it must stay up.
        need = cfg.window // 2 + 1 if len(held.prior) >= cfg.level_records else cfg.window
        up = sum(after)
        if up >= need:
            self.held = None
            if self._low_first_draw(state, held):
                return []
            self.quiet_until = step + cfg.window
            return [self._held_spike(state, held)]
        if len(after) - up > cfg.window - need:
            self.held = None  # came back: the noise of a log too short to measure it
        return []

    def _low_first_draw(self, state: RankState, held: _Held) -> bool:
        """Against fewer than ``level_records`` earlier losses, losses after the jump this noisy
        (a per-batch log: step noise at least ``confirm_noise_ratio`` of their level) put that
        earlier loss within ``noise_factor`` of their own noise: it was a low draw of a noisy
        start, not a level the loss jumped from (an accelerate job's per-rank MSE 1.45, then
        11.2, 9.2, 6.1 .. 3.2 .. 4.9 and back to 1.9 at the 12th: the s40 tester's l33)."""
        if len(held.prior) >= self.cfg.level_records:
            return False
        after = state.recent("loss", len(held.after))
        if len(after) < 3:
            return False
        level, sigma = median(after), step_noise(after)
        return (
            level > 0
            and sigma >= self.cfg.confirm_noise_ratio * level
            and (level - held.top <= self.cfg.noise_factor * sigma)
        )

    def _stayed_up(self, held: _Held) -> bool:
        """The losses after a held jump, where the log ended, stayed up: most of them, or all of
        them against fewer than ``level_records`` earlier losses."""
        up = sum(held.after)
        if len(held.prior) < self.cfg.level_records:
            return up == len(held.after)
        return 2 * up > len(held.after)

    def _held_spike(self, state: RankState, held: _Held) -> Finding:
        rec, prior = held.record, held.prior
        return self._spike(state, rec, rec.loss or 0.0, sum(prior) / len(prior), prior, 0.0)

    def _extreme(
        self, state: RankState, record: StepRecord, loss: float, step: int, prior: list[float]
    ) -> list[Finding]:
        """A rise above every earlier loss of ``extreme_factor`` times their largest magnitude."""
        if not prior:
            return []
        top = max(prior)
        rise = loss - top
        size = max(abs(v) for v in prior)
        if rise < self.cfg.min_delta or size <= 0 or rise < self.cfg.extreme_factor * size:
            return []
        self.quiet_until = step + self.cfg.window
        return [self._spike(state, record, loss, sum(prior) / len(prior), prior, 0.0)]

    @staticmethod
    def _spike(
        state: RankState, record: StepRecord, loss: float, mean: float, window: list[float], sigma: float
    ) -> Finding:
        return finding(
            "loss_spike",
            Severity.WARNING,
            state,
            f"loss spiked to {fmt(loss)} at {at_step(record)}, "
            + (f"{loss / mean:.1f}x the mean " if mean > 0 else "from a mean of ")
            + f"{fmt(mean)} of the previous {len(window)} logged steps. One spike that recovers "
            "is survivable; repeated spikes usually mean the LR is too high or a bad batch: "
            "check the data at this step, lower the LR or tighten clipping.",
            record=record,
            evidence={"loss": loss, "baseline_mean": mean, "window": window, "noise_sigma": sigma},
        )


@register
class LossDivergenceDetector(Detector):
    """A loss that goes up and stays up, judged from the first step. Three rules:

    - blow-up: the last ``blowup_records`` losses all above ``blowup_factor`` x the level of
      of the run's first few (an LR far too high diverges within steps, inside any warmup;
      a healthy loss starts at its highest and falls); from a lowest first loss that no other
      of them comes near, only once the loss stayed up for ``short_records`` logged steps;
    - trend: over the last up to ``trend_records`` logged losses most step-to-step changes
      are rises and the newest third's median is ``rise_ratio`` above the oldest third's
      (a short run rising on every iteration; noise rises half the time and has no trend);
    - windows: the median of the last ``window`` logged losses ``rise_ratio`` above the best
      such median for ``consecutive_windows`` half-windows (a slow, noisy rise).
    """

    kinds = ("loss_divergence",)
    accepts = (StepRecord,)
    section = "detectors.loss_divergence"

    def __init__(self, cfg: LossDivergenceConfig, warmup_steps: int) -> None:
        self.cfg = cfg
        self.best: float | None = None
        self.best_step: int | None = None
        self.rising = 0
        self.seen = 0
        self.first: list[float] = []  # the run's first finite losses
        self.recent: deque[tuple[int | None, float]] = deque(maxlen=max(3, cfg.trend_records))
        self.rises: deque[bool] = deque(maxlen=max(3, cfg.trend_records) - 1)  # each change a rise?
        self.rises_max = self.rises.maxlen
        self.rise_count = 0
        self.first_min = math.inf  # min(self.first)
        self.last_loss = math.nan  # the newest in self.recent
        self.episode = Episode()
        # A blow-up or trend episode ends when the loss is back under this level.
        self.resolve_below: float | None = None

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, StepRecord) or not self.cfg.enabled:
            return []
        loss = record.loss
        if loss is None or loss - loss != 0:
            return []
        cfg = self.cfg
        self.seen += 1
        first = self.first
        if len(first) < FIRST_LOSSES:
            first.append(loss)
            self.first_min = min(first)
        recent = self.recent
        if recent:
            up = loss > self.last_loss
            rises = self.rises
            count = self.rise_count
            if len(rises) == self.rises_max:
                count -= rises[0]
            rises.append(up)
            count = self.rise_count = count + up
        else:
            count = self.rise_count
        self.last_loss = loss
        recent.append((record.step, loss))
        if self.episode.active:
            if self.resolve_below is not None:
                found = self._recovered(state, record)
                if found:
                    return found
        elif (len(first) > 1 and loss > cfg.blowup_factor * self.first_min) or count >= TREND_RISE_SHARE * (
            len(recent) - 1
        ) >= TREND_RISE_SHARE * (TREND_MIN_RECORDS - 1):
            found = self._blowup(state, record) or self._trend(state, record)
            if found:
                return found
        w = cfg.window
        if not self.episode.active and cfg.short_records <= self.seen < w:
            found = self._short(state, record)
            if found:
                return found
        if self.seen < w or self.seen % max(1, w // 2):
            return []
        window_losses = state.recent("loss", w)
        cur = median(window_losses)
        if self.best is None or cur < self.best:
            self.best, self.best_step = cur, record.step
        if (
            self.best > 0
            and cur > self.best * (1 + cfg.rise_ratio)
            and cur - self.best > cfg.noise_factor * step_noise(window_losses)
        ):
            self.rising += 1
        else:
            self.rising = 0
            if self.resolve_below is None and self.episode.close():
                return [
                    finding(
                        "loss_divergence",
                        Severity.WARNING,
                        state,
                        f"loss back near its best (median {fmt(cur)})",
                        record=record,
                        resolved=True,
                    )
                ]
        if self.rising >= cfg.consecutive_windows and self.episode.open(record.step):
            return [
                finding(
                    "loss_divergence",
                    Severity.WARNING,
                    state,
                    f"loss is diverging: median of the last {w} logged steps is {fmt(cur)}, "
                    f"{(cur / self.best - 1) * 100:.0f}% above its best median {fmt(self.best)} "
                    f"(around step {self.best_step}). Usual fix: lower the LR or lengthen warmup, "
                    "check clipping; resume from a checkpoint before the rise.",
                    record=record,
                    evidence={"median": cur, "best_median": self.best, "best_step": self.best_step},
                )
            ]
        return []

    def _short(self, state: RankState, record: StepRecord) -> list[Finding]:
        """Fewer logged losses than one window: the last ``blowup_records`` all far above the
        lowest loss before them, by ``rise_ratio`` and by ``short_noise_factor`` step-noise sds."""
        cfg = self.cfg
        k = cfg.blowup_records
        vals = [v for _, v in self.recent]
        prior, last = vals[:-k], vals[-k:]
        if len(prior) < 3:
            return []
        low, top = min(prior), min(last)
        if (
            low <= 0
            or top <= low * (1 + cfg.rise_ratio)
            or top - low < cfg.min_delta
            or top - low <= cfg.short_noise_factor * step_noise(prior)
        ):
            return []
        self.episode.open(record.step)
        self.resolve_below = low * (1 + cfg.rise_ratio)
        shown = self._shown()
        return [
            finding(
                "loss_divergence",
                Severity.WARNING,
                state,
                f"loss is diverging: the last {k} logged losses are at least {(top / low - 1) * 100:.0f}% "
                f"above the run's lowest {fmt(low)} ({shown}). Usual fix: lower the LR or lengthen "
                "warmup, check clipping; resume from a checkpoint before the rise.",
                record=record,
                evidence={"lowest": low, "recent": last},
            )
        ]

    def _shown(self) -> str:
        """The last six logged losses with their steps, as a finding quotes them."""
        return ", ".join(f"{s}: {fmt(v)}" if s is not None else fmt(v) for s, v in list(self.recent)[-6:])

    def _recovered(self, state: RankState, record: StepRecord) -> list[Finding]:
        level = self.resolve_below
        if level is None or not self.episode.active:
            return []
        if median([v for _, v in list(self.recent)[-3:]]) > level:
            return []
        self.resolve_below = None
        self.episode.close()
        return [
            finding(
                "loss_divergence",
                Severity.WARNING,
                state,
                f"loss back to {fmt(record.loss)}",
                record=record,
                resolved=True,
            )
        ]

    def _lone_low(self) -> bool:
        """The lowest of the run's first losses is one low draw: fewer than
        ``blowup_level_records`` of them are within ``blowup_factor`` of it."""
        top = self.cfg.blowup_factor * self.first_min
        return sum(v <= top for v in self.first) < self.cfg.blowup_level_records

    def _blowup(self, state: RankState, record: StepRecord) -> list[Finding]:
        cfg = self.cfg
        k = cfg.blowup_records
        if self.episode.active or len(self.recent) < k or len(self.first) < 2:
            return []
        base = self.first_min
        if base <= 0 or record.loss <= cfg.blowup_factor * base:  # type: ignore[operator]
            return []
        if self._lone_low():
            k = min(max(k, cfg.short_records), self.recent.maxlen or k)
            if len(self.recent) < k:
                return []
        last = [v for _, v in list(self.recent)[-k:]]
        low = min(last)
        if low <= cfg.blowup_factor * base or low - base < cfg.min_delta:
            return []
        self.episode.open(record.step)
        self.resolve_below = 2 * base
        shown = self._shown()
        return [
            finding(
                "loss_divergence",
                Severity.WARNING,
                state,
                f"loss is blowing up: {fmt(record.loss)} at {at_step(record)}, at least {low / base:.1f}x "
                f"the run's first losses (lowest {fmt(base)}) for {k} logged steps ({shown}). A loss that "
                "multiplies in the first steps is an LR far too high (or no warmup), a wrong loss scale "
                "or bad data. Usual fix: lower the LR, add warmup, enable gradient clipping.",
                record=record,
                evidence={"first_min": base, "recent": last},
            )
        ]

    def _trend(self, state: RankState, record: StepRecord) -> list[Finding]:
        cfg = self.cfg
        n = len(self.recent)
        rises = self.rise_count
        if self.episode.active or n < TREND_MIN_RECORDS or rises < TREND_RISE_SHARE * (n - 1):
            return []
        vals = [v for _, v in self.recent]
        third = max(1, n // 3)
        old, new = median(vals[:third]), median(vals[-third:])
        if old <= 0 or new <= old * (1 + cfg.rise_ratio) or new - old < cfg.min_delta:
            return []
        self.episode.open(record.step)
        self.resolve_below = old * (1 + cfg.rise_ratio / 2)
        since = self.recent[0][0]
        return [
            finding(
                "loss_divergence",
                Severity.WARNING,
                state,
                f"loss is rising steadily: {rises} of the last {n - 1} logged changes were rises"
                + (f" since step {since}" if since is not None else "")
                + f", median {fmt(old)} -> {fmt(new)} (+{(new / old - 1) * 100:.0f}%). Usual fix: lower "
                "the LR or lengthen warmup, check clipping and the data; resume from a checkpoint "
                "before the rise.",
                record=record,
                evidence={"rises": rises, "records": n, "old_median": old, "new_median": new},
            )
        ]


def _walk_losses(state: RankState, lo: int) -> list[float]:
    """The finite losses of the newest records back to the first one logged before step
    ``lo`` (but at least ``PLATEAU_MIN_RECORDS`` of them), oldest first."""
    losses: list[float] = []
    for rec in reversed(state.steps):
        s = rec.step
        if s is not None and s < lo and len(losses) >= PLATEAU_MIN_RECORDS:
            break
        v = rec.loss
        if v is not None and v - v == 0:
            losses.append(v)
    losses.reverse()
    return losses


_STEP_OF = attrgetter("step")


class _Flat:
    """The plateau rule's record of a loss that has not moved since the first record."""

    __slots__ = ("broken", "fine", "first", "hi", "lo", "n", "told")

    def __init__(self) -> None:
        self.n = 0
        self.lo = self.hi = self.first = 0.0
        self.broken = False
        self.fine = False  # some loss of it was printed to better than the tolerance
        self.told = False


def _last_digit(v: float) -> float:
    """The place of a printed number's last digit, relative to the number (10.8259: 9e-6;
    2.0: 0.5), read from its shortest representation: the exponent of its last nonzero digit,
    as ``Decimal(repr(v)).normalize()`` has it, without loading ``decimal`` in every agent."""
    if not math.isfinite(v):
        return math.inf
    mantissa, _, e = repr(v).partition("e")
    whole, _, frac = mantissa.lstrip("-").partition(".")
    digits = whole + frac
    exp = (int(e) if e else 0) - len(frac) + len(digits) - len(digits.rstrip("0")) if digits.strip("0") else 0
    return 10.0**exp / abs(v)


@register
class LossPlateauDetector(Detector):
    """No meaningful improvement over the last ``window`` training steps, or the last third
    of the run so far when that is longer (however often the log prints): info only, as
    converged runs plateau too. A loss that has not moved from its first record for
    ``flat_records`` records (within ``flat_tolerance``, not drifting down) is a warning: a run
    that learns nothing at all."""

    kinds = ("loss_plateau",)
    accepts = (StepRecord,)
    section = "detectors.loss_plateau"

    def __init__(self, cfg: LossPlateauConfig, warmup_steps: int) -> None:
        self.cfg = cfg
        self.seen = 0
        self.first_step: int | None = None
        self.next_check = 0  # the step from which the window is looked at again
        self.episode = Episode()
        self.observed = 0  # step records seen, to match them with the state's
        self.back_at = 0  # the number of the last one whose step was below its predecessor's
        self.prev_step: int | None = None
        self.flat = _Flat()

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, StepRecord) or not self.cfg.enabled:
            return []
        self.observed += 1
        s, prev = record.step, self.prev_step
        if s is None or (prev is not None and s < prev):
            self.back_at = self.observed
        self.prev_step = s
        loss = record.loss
        if loss is None or loss - loss != 0:
            return []
        flat = self._flat(state, record, loss)
        if flat:
            return flat
        step = record.step if record.step is not None else state.position()
        if self.first_step is None:
            self.first_step = step
        self.seen += 1
        if step < self.next_check:
            return []  # every step but one in a tenth of a window
        w = max(self.cfg.window, (step - self.first_step) // PLATEAU_RUN_SHARE)
        if step - self.first_step < w or self.seen % PLATEAU_EVERY:
            return []
        self.next_check = step + w // PLATEAU_EVERY
        losses = self._window(state, step - w)
        if len(losses) < PLATEAU_MIN_RECORDS:
            return []
        q = max(1, len(losses) // 5)
        old, new = median(losses[:q]), median(losses[-q:])
        if old <= 0:
            return []
        gain = (old - new) / old
        if gain < self.cfg.min_improvement:
            if self.episode.open(record.step):
                return [
                    finding(
                        "loss_plateau",
                        Severity.INFO,
                        state,
                        f"loss has plateaued: median {fmt(new)} now vs {fmt(old)} {w} steps ago "
                        f"({gain * 100:.2f}% improvement over {len(losses)} logged steps). If this is not "
                        "convergence (a loss stuck near ln(vocabulary size) is a model learning nothing), "
                        "try a higher LR or a schedule change; otherwise consider stopping early.",
                        record=record,
                        evidence={"old_median": old, "new_median": new, "window_steps": w},
                    )
                ]
        elif gain >= PLATEAU_RESUME * self.cfg.min_improvement and self.episode.close():
            return [
                finding(
                    "loss_plateau", Severity.INFO, state, "loss improving again", record=record, resolved=True
                )
            ]
        return []

    def _flat(self, state: RankState, record: StepRecord, loss: float) -> list[Finding]:
        """Every loss so far within ``flat_tolerance`` of the first, for ``flat_records``
        records: nothing is learned at all (a run that moved once is out of this rule for good)."""
        fl = self.flat
        if fl.broken:
            return []
        if fl.n == 0:
            fl.lo = fl.hi = fl.first = loss
        lo, hi = min(fl.lo, loss), max(fl.hi, loss)
        if loss <= 0 or hi - lo > self.cfg.flat_tolerance * hi:
            fl.broken = True
            if fl.told and self.episode.close():
                return [
                    finding(
                        "loss_plateau",
                        Severity.INFO,
                        state,
                        "loss moving again",
                        record=record,
                        resolved=True,
                    )
                ]
            return []
        fl.lo, fl.hi, fl.n = lo, hi, fl.n + 1
        # Only a print fine enough to show learning can show its absence: "2.0" over and over
        # (a loss rounded to one digit) may hide a falling loss; "10.8259" cannot.
        fl.fine = fl.fine or _last_digit(loss) < self.cfg.flat_tolerance
        if fl.n >= self.cfg.flat_records and not fl.fine:
            fl.broken = True  # printed too coarsely to judge
        if fl.n < self.cfg.flat_records or fl.broken or fl.told or fl.first - loss > (hi - lo) / 2:
            return []  # too few yet, too coarse, told, or drifting down through the band
        if not self.episode.open(record.step):
            return []
        fl.told = True
        guess = (
            f" (a uniform guess over about {math.exp(loss):,.0f} classes scores {fmt(loss)})"
            if 1 < loss < 25
            else ""
        )
        return [
            finding(
                "loss_plateau",
                Severity.WARNING,
                state,
                f"loss flat at {fmt(loss)} for all {fl.n} logged steps so far (spread {fmt(hi - lo)}): the "
                f"model is learning nothing{guess}. Usual causes: a loss stuck at ln(vocabulary size) "
                "or ln(output size) from a collapsed head, a zero or tiny learning rate, frozen or "
                "detached parameters, labels all masked out.",
                record=record,
                evidence={"loss": loss, "records": fl.n, "spread": hi - lo},
            )
        ]

    def _window(self, state: RankState, lo: int) -> list[float]:
        """What ``_walk_losses`` returns, without the walk in the usual case: up to
        ``HISTORY`` records every tenth of a window, walked in Python, made this rule the
        dearest part of a healthy step. When every record the state holds came through here
        with its step in order and a finite loss (a loss is only ever filled in later, never
        changed), the window is a bisection and the state's own copy of the losses."""
        recs = state.steps
        n = len(recs)
        count = state.step_count
        missing = state.finite_missing["loss"]
        if (
            n
            and self.observed == count
            and self.back_at <= count - n + 1
            and (not missing or missing[-1] <= count - n)
        ):
            k = n - bisect_left(recs, lo, key=_STEP_OF)  # newest first, the first from before ``lo``
            if k >= PLATEAU_MIN_RECORDS or k == n:
                kept = state.finite_values["loss"]
                return list(islice(kept, len(kept) - k, None))
        return _walk_losses(state, lo)


@register
class OverfittingDetector(Detector):
    """Eval loss ``consecutive`` times above its best by ``eval_rise_ratio`` and by more than
    ``noise_factor`` times the eval curve's own noise, while the train loss kept falling."""

    kinds = ("overfitting",)
    accepts = (EvalRecord,)
    section = "detectors.overfitting"

    def __init__(self, cfg: OverfittingConfig, warmup_steps: int) -> None:
        self.cfg = cfg
        self.best: float | None = None
        self.best_step: int | None = None
        self.train_at_best: float | None = None
        self.above = 0
        self.count = 0
        self.last_step: int | None = None
        self.episode = Episode()
        self.evals: deque[float] = deque(maxlen=EVAL_NOISE_MEMORY)

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not self.cfg.enabled or not isinstance(record, EvalRecord) or not finite(record.eval_loss):
            return []
        ev = float(record.eval_loss)  # type: ignore[arg-type]
        step = record.step
        if self.train_at_best is None and self.best is not None:
            # The best came before any train loss (a log cut just before an epoch's end): the
            # first train loss told after it stands for the train loss at it.
            train = state.recent("loss", 20)
            self.train_at_best = median(train) if train else None
        if self.evals and _restated(self.evals[-1], ev):
            # The last evaluation told again at a coarser precision (Keras's TqdmCallback bar
            # "val_loss=5.71" after the logged "val_loss=5.7130", at the epoch, not the batch):
            # one evaluation, and its other step is no restart.
            if step is not None:
                self.last_step = step
            return []
        if step is not None and self.last_step is not None and step < self.last_step:
            # An eval at an earlier step than the last one: the run restarted (from scratch or a
            # checkpoint), and the best of the run before is not this one's to beat.
            self.best = self.best_step = self.train_at_best = None
            self.above = self.count = 0
            self.evals.clear()
        if step is not None:
            self.last_step = step
        self.count += 1
        self.evals.append(ev)
        train = state.recent("loss", 20)
        train_now = median(train) if train else None
        if self.best is None or ev < self.best:
            self.best, self.best_step, self.train_at_best = ev, record.step, train_now
            self.above = 0
            if self.episode.close():
                return [
                    finding(
                        "overfitting",
                        Severity.WARNING,
                        state,
                        f"eval loss at a new best {fmt(ev)}",
                        record=record,
                        resolved=True,
                    )
                ]
            return []
        if (
            self.best > 0
            and ev > self.best * (1 + self.cfg.eval_rise_ratio)  # no percent of 0
            and ev - self.best > self.cfg.noise_factor * step_noise(self.evals)  # beyond its own noise
        ):
            self.above += 1
        else:
            self.above = 0
        train_falling = (
            train_now is not None and self.train_at_best is not None and train_now < self.train_at_best
        )
        if (
            self.count >= self.cfg.min_evals
            and self.above >= self.cfg.consecutive
            and train_falling
            and self.episode.open(record.step)
        ):
            return [
                finding(
                    "overfitting",
                    Severity.WARNING,
                    state,
                    f"overfitting: eval loss {fmt(ev)} is {(ev / self.best - 1) * 100:.1f}% above its best "
                    f"{fmt(self.best)} (step {self.best_step}) while train loss kept falling "
                    f"({fmt(self.train_at_best)} -> {fmt(train_now)}). Usual fix: keep the checkpoint "
                    "from the best eval, add regularisation or data, or stop early.",
                    record=record,
                    evidence={"eval_loss": ev, "best_eval": self.best, "best_step": self.best_step},
                )
            ]
        return []


# Order of findings of one log record across modules (registry.py): then the loss.
ORDER = 30
