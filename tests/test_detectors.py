from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from rankwatch.analyze import analyze
from rankwatch.config.schema import Config, DetectorsConfig, RankLagConfig
from rankwatch.config.snapshot import replaced
from rankwatch.detectors.crossrank import cross_rank
from rankwatch.engine import RankEngine
from rankwatch.records import ErrorRecord, EvalRecord, Finding, OverflowRecord, Severity, StepRecord
from rankwatch.state import HISTORY, RankState

pytestmark = pytest.mark.unit


def healthy(step: int, rng: random.Random) -> StepRecord:
    loss = 2.0 + 8.0 * math.exp(-step / 300) + rng.gauss(0, 0.03)
    grad = (8.0 if step < 40 else 0.6) * (1 + rng.gauss(0, 0.15))
    tps = 12000.0 * (1 + rng.gauss(0, 0.02)) if step > 1 else 800.0
    lr = 3e-4 * min(1.0, step / 100)
    return StepRecord(
        step=step,
        total_steps=5000,
        loss=loss,
        grad_norm=abs(grad),
        learning_rate=lr,
        tokens_per_s=tps,
        line=step,
    )


def run(records, cfg: DetectorsConfig | None = None) -> list[Finding]:
    eng = RankEngine(cfg or DetectorsConfig(), rank=0, path="rank-0.log")
    out: list[Finding] = []
    for r in records:
        out.extend(eng.feed(r))
    out.extend(eng.finish())
    assert eng.internal_errors == 0
    return out


def alarms(fs: list[Finding]) -> list[Finding]:
    return [f for f in fs if f.severity >= Severity.WARNING and not f.resolved]


def healthy_run(n: int = 3000, seed: int = 1) -> list:
    rng = random.Random(seed)
    recs: list = []
    for s in range(1, n + 1):
        recs.append(healthy(s, rng))
        if s % 250 == 0:
            ev = 2.1 + 7.0 * math.exp(-s / 300) + rng.gauss(0, 0.02)
            recs.append(EvalRecord(eval_loss=ev, step=s, line=s))
    return recs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_healthy_run_is_silent(seed: int) -> None:
    assert alarms(run(healthy_run(seed=seed))) == []


def test_eval_noise_of_a_few_percent_is_silent() -> None:
    rng = random.Random(5)
    recs: list = [healthy(s, rng) for s in range(1, 400)]
    for i, s in enumerate(range(400, 2000, 100)):
        recs.extend(healthy(x, rng) for x in range(s, s + 100))
        recs.append(EvalRecord(eval_loss=2.0 * (1.03 if i % 2 else 0.99), step=s + 99))
    assert alarms(run(recs)) == []


def test_nan_after_grad_blowup_tells_the_blowup_story() -> None:
    rng = random.Random(0)
    recs = [healthy(s, rng) for s in range(1, 500)]
    for i, s in enumerate(range(500, 505)):
        recs.append(StepRecord(step=s, loss=2.5 + i, grad_norm=10.0 * 3**i, line=s))
    recs.append(StepRecord(step=505, loss=math.nan, grad_norm=math.nan, line=505))
    recs.extend(StepRecord(step=s, loss=math.nan, grad_norm=math.nan) for s in range(506, 520))
    fs = [f for f in run(recs) if f.kind == "nan_loss"]
    assert len(fs) == 1
    f = fs[0]
    assert f.severity is Severity.CRITICAL and f.step == 505 and f.line == 505
    assert "blow-up" in f.message and "lower the LR" in f.message
    ge = [x for x in run(recs) if x.kind == "grad_explosion"]
    assert ge and ge[0].step < 505


def test_nan_out_of_flat_grad_norm_tells_the_bad_batch_story() -> None:
    rng = random.Random(0)
    recs = [healthy(s, rng) for s in range(1, 300)]
    recs.append(StepRecord(step=300, loss=math.inf, grad_norm=0.6))
    f = next(f for f in run(recs) if f.kind == "nan_loss")
    assert f.step == 300
    assert "bad sample" in f.message and "batch at this step" in f.message


def test_hf_nan_filter_zero_loss_and_nan_grad() -> None:
    recs = [StepRecord(loss=2.0 - i * 0.01, grad_norm=0.8) for i in range(10)]
    recs.append(StepRecord(loss=0.0, grad_norm=math.nan))
    fs = run(recs)
    nan = [f for f in fs if f.kind == "nan_loss"]
    assert len(nan) == 1 and nan[0].step == 11


def test_zero_loss_alone_from_normal_level() -> None:
    recs = [StepRecord(step=i, loss=1.5) for i in range(1, 10)] + [StepRecord(step=10, loss=0.0)]
    assert [f.step for f in run(recs) if f.kind == "nan_loss"] == [10]


# AolinGuo/graduate_agent@787eda9:trainer_log.jsonl (LLaMA-Factory, batch10): "loss": 122.1416 at
# step 10, then "loss": 0.0 on every record, no grad norm logged. Three records of history, the
# zeros included, are enough; one lone zero after one loss is not.
def test_zero_losses_in_a_row_after_a_short_history_are_a_collapse() -> None:
    recs = [StepRecord(step=10, loss=122.1416)] + [StepRecord(step=s, loss=0.0) for s in range(20, 110, 10)]
    assert [f.step for f in run(recs) if f.kind == "nan_loss"] == [40]
    assert [f for f in run(recs[:3]) if f.kind == "nan_loss"] == []


def test_nan_eval_loss() -> None:
    recs = [StepRecord(step=1, loss=2.0), EvalRecord(eval_loss=math.nan, step=1)]
    assert [f.kind for f in alarms(run(recs))] == ["nan_loss"]


def test_isolated_inf_grad_under_fp16_is_an_overflow_not_nan() -> None:
    recs = [StepRecord(step=s, loss=2.0, grad_norm=0.5, loss_scale=65536.0) for s in range(1, 200)]
    recs.append(StepRecord(step=200, loss=2.0, grad_norm=math.inf, loss_scale=32768.0))
    recs.extend(StepRecord(step=s, loss=2.0, grad_norm=0.5, loss_scale=32768.0) for s in range(201, 210))
    assert [f for f in run(recs) if f.kind == "nan_loss"] == []


def test_nan_resolves_when_loss_is_finite_again() -> None:
    recs = [StepRecord(step=1, loss=2.0), StepRecord(step=2, loss=math.nan), StepRecord(step=3, loss=2.0)]
    fs = [f for f in run(recs) if f.kind == "nan_loss"]
    assert [f.resolved for f in fs] == [False, True]


def test_loss_spike_fires_once_and_single_noise_does_not() -> None:
    rng = random.Random(3)
    recs = [healthy(s, rng) for s in range(1, 600)]
    base = recs[-1].loss
    recs.append(StepRecord(step=600, loss=base * 3, grad_norm=0.6))
    recs.extend(healthy(s, rng) for s in range(601, 700))
    fs = [f for f in run(recs) if f.kind == "loss_spike"]
    assert [f.step for f in fs] == [600]
    assert "3.0x" in fs[0].message or "2.9x" in fs[0].message


def test_loss_spike_is_judged_from_its_first_full_window_not_after_a_warmup() -> None:
    recs = [StepRecord(step=s, loss=5.0) for s in range(1, 50)] + [StepRecord(step=50, loss=20.0)]
    assert [f.step for f in run(recs) if f.kind == "loss_spike"] == [50]
    # Before ten losses exist a spike is judged against what there is (issue 27): above every
    # earlier loss by the factor, and the next loss still up.
    recs = [StepRecord(step=s, loss=5.0) for s in range(1, 5)] + [StepRecord(step=5, loss=20.0)]
    assert [f.step for f in run([*recs, StepRecord(step=6, loss=18.0)]) if f.kind == "loss_spike"] == [5]
    # One noisy batch that comes straight back (horovod deeplab rank 1: 3.2, 3.4, 11.1, 4.0): silent.
    recs = [StepRecord(step=s, loss=v) for s, v in enumerate([3.216, 3.396, 11.08, 3.984], 1)]
    assert [f for f in run(recs) if f.kind == "loss_spike"] == []
    # A short log whose loss only wanders within the factor of its largest value: silent.
    recs = [StepRecord(step=s, loss=v) for s, v in enumerate([5.0, 3.0, 4.0, 9.0], 1)]
    assert [f for f in run(recs) if f.kind == "loss_spike"] == []


def test_a_spike_after_three_records_is_flagged() -> None:
    """Issue 27: 2.77 -> 7.34 -> 8.72 with no earlier history is a spike at the second record."""
    recs = [StepRecord(step=s, loss=v) for s, v in enumerate([2.77, 7.34, 8.72], 1)]
    assert [f.step for f in run(recs) if f.kind == "loss_spike"] == [2]


def test_a_healthy_ddp_runs_noisy_first_batches_are_no_spike() -> None:
    """A real torch DDP run (black-box session s35, tests/data/torchrun/README.md): 4.44, then
    11.33, 10.59, 9.22 on fresh batches, back to 5.75 and down. Judged against its one earlier
    loss it looked like a spike confirmed by the next; it is the noise of a log too short to
    measure it, and the loss comes back within the window."""
    path = Path(__file__).parent / "data" / "torchrun" / "ddp_healthy_noisy_start_rank-0.log"
    result = analyze([str(path)], Config(), jobs=1)
    assert result.ranks[0].steps == 40
    assert [f for f in result.findings if f.severity >= Severity.WARNING] == []


@pytest.mark.parametrize(
    "path",
    [
        Path(__file__).parent / "data" / "accelerate" / "acc_healthy_low_first_loss_rank-0.log",
        Path(__file__).parent / "data" / "blackbox" / "s38" / "repro" / "g23" / "rank-0.head.log",
    ],
    ids=["acc5_60_steps", "s38_g23_head"],
)
def test_a_healthy_run_whose_first_loss_is_a_low_draw_raises_no_loss_warning(path: Path) -> None:
    """accelerate's per-batch MSE (black-box s38, item C; tests/data/accelerate/README.md):
    1.449 first, then 11.28, 9.19, 10.05, 6.44 .. back to 2.13 at step 9 and noise around 6.
    One low first loss is no level: neither a spike above it nor a blow-up from it."""
    result = analyze([str(path)], Config(), jobs=1)
    assert result.ranks[0].steps >= 9
    assert [f for f in result.findings if f.kind in ("loss_spike", "loss_divergence")] == []


def test_the_low_first_loss_keys_restore_judging_against_one_loss() -> None:
    """With ``level_records`` and ``blowup_level_records`` at 1 the accelerate run's first loss
    is a baseline again: the spike at step 2 and the blow-up at step 4 come back."""
    path = Path(__file__).parent / "data" / "accelerate" / "acc_healthy_low_first_loss_rank-0.log"
    cfg = replaced(
        Config(),
        {"detectors.loss_spike.level_records": 1, "detectors.loss_divergence.blowup_level_records": 1},
    )
    found = [(f.kind, f.step) for f in analyze([str(path)], cfg, jobs=1).findings if not f.resolved]
    assert sorted(found) == [("loss_divergence", 4), ("loss_spike", 2)]


# The golden corpus's hf_lr5 (tests/golden/gen_hf.py: transformers Trainer, learning_rate 5.0, no
# warmup, no clipping, logging_steps 1), its first 24 logged losses as the Trainer printed them.
HF_LR5 = [
    3.901, 236.2, 206.6, 599.5, 451.8, 593.0, 608.7, 687.0, 620.2, 795.7, 596.0, 608.9,
    465.6, 336.5, 584.0, 444.2, 445.5, 598.4, 474.3, 762.1, 520.8, 400.3, 431.0, 268.0,
]  # fmt: skip


def test_a_blow_up_from_one_first_loss_is_told_once_it_stayed_up() -> None:
    """One low first loss is no level, so a blow-up from it waits for ``short_records`` losses
    that all stayed up: the HF run at lr 5 (3.90, then 236 .. 762) still diverges, at step 21."""
    recs = [StepRecord(step=i, loss=v) for i, v in enumerate(HF_LR5, 1)]
    fs = [f for f in alarms(run(recs)) if f.kind == "loss_divergence"]
    assert [f.step for f in fs] == [21] and "lowest 3.901" in fs[0].message


def test_the_combined_log_of_two_ranks_is_judged_as_one_ranks_log() -> None:
    """``run -- torchrun`` without ``--tee`` (s35, c01): both ranks print each step into one
    log, each line naming its rank (``rank=1``): each rank's lines are its own, rank 1's NaN at
    step 20 and rank 0's at 21 (DDP spreads it). Where nothing names the rank, a loss printed
    again for the same step is not one more loss after a jump, so a jump is judged as on one
    rank's log."""
    path = Path(__file__).parent / "data" / "torchrun" / "ddp_plain_combined_nan_rank-0.log"
    result = analyze([str(path)], Config(), jobs=1)
    assert [(f.kind, f.rank, f.step) for f in result.findings if f.severity >= Severity.WARNING] == [
        ("nan_loss", 0, 21),
        ("nan_loss", 1, 20),
    ]
    assert [(r.rank, r.steps, r.last_step) for r in result.ranks] == [(0, 40, 40), (1, 40, 40)]
    up_three_steps = [5.0, 5.1, 4.9, 20.0, 18.0, 17.0, 16.0, 5.0, 4.9, 5.1, 4.8, 5.0, 4.7]
    for losses in (
        up_three_steps,
        [float(v) for v in (4.437, 11.33, 10.59, 9.22, 5.75, 4.63, 8.48, 8.27, 1.97)],
    ):
        one = [StepRecord(step=i + 1, loss=v) for i, v in enumerate(losses)]
        two = [StepRecord(step=i + 1, loss=v) for i, v in enumerate(losses) for _ in range(2)]
        spikes = [[f.step for f in run(recs) if f.kind == "loss_spike"] for recs in (one, two)]
        assert spikes == [[], []]


def test_a_short_logs_jump_counts_when_the_loss_stays_up_over_the_window() -> None:
    """MLX LoRA (ml-explore/mlx-examples#620): 1.59, 1.41, then 3.32 and up to 4.60 at its last
    record (continued here at that level to show the live timing): a spike at its step, told
    once most of the window after it stayed up, not only at the log's end."""
    losses = [1.593, 1.406, 3.316, 6.437, 5.478, 4.857, 4.874, 4.604, 4.9, 5.1, 4.8, 4.7]
    eng = RankEngine(DetectorsConfig(), rank=0, path="rank-0.log")
    told: list[tuple[int, int | None]] = []
    for i, v in enumerate(losses):
        told += [
            (i, f.step) for f in eng.feed(StepRecord(step=25 * (i + 1), loss=v)) if f.kind == "loss_spike"
        ]
    assert told == [(8, 75)]  # six of the losses after the jump up: most of a window of ten
    # A jump of extreme_factor x the earlier losses while one is held is told at once.
    recs = [StepRecord(step=i + 1, loss=v) for i, v in enumerate([2.0, 5.0, 5.5, 900.0, 2.0, 2.1, 2.0])]
    assert [f.step for f in run(recs) if f.kind == "loss_spike"] == [4]
    # The same jump that comes back (a noisy batch or two of a short log): silent.
    back = [1.593, 1.406, 3.316, 3.4, 1.5, 1.45, 1.6, 1.3, 1.4, 1.5, 1.35, 1.38]
    assert [
        f for f in run([StepRecord(step=i + 1, loss=v) for i, v in enumerate(back)]) if f.kind == "loss_spike"
    ] == []


def test_a_jump_of_a_thousand_times_the_loss_is_a_spike_even_when_it_comes_back() -> None:
    """WaveGlow#32 (https://github.com/NVIDIA/waveglow/issues/32, description by hdmjdp): a
    negative log-likelihood at -4.07..-4.49 jumps to 4191.68 and comes straight back."""
    losses = [
        -4.065555573,
        -4.490265846,
        -4.454271317,
        -4.322495461,
        4191.683593750,
        -2.408614397,
        -2.908127546,
    ]
    recs = [StepRecord(step=78540 + 20 * i, loss=v) for i, v in enumerate(losses)]
    assert [f.step for f in run(recs) if f.kind == "loss_spike"] == [78620]
    # The same jump after a full window of negative losses.
    long = [-4.3 + 0.1 * math.sin(i) for i in range(40)] + [4191.68, -2.4]
    assert [
        f.step
        for f in run([StepRecord(step=i + 1, loss=v) for i, v in enumerate(long)])
        if f.kind == "loss_spike"
    ] == [41]
    # Per-batch noise a few times the level (YOLOX at batch size 1) is no extreme jump.
    noisy = [5.0, 2.3, 5.2, 21.6, 6.7]
    assert [
        f
        for f in run([StepRecord(step=i + 1, loss=v) for i, v in enumerate(noisy)])
        if f.kind == "loss_spike"
    ] == []


def test_divergence() -> None:
    rng = random.Random(4)
    recs = [healthy(s, rng) for s in range(1, 800)]
    lvl = recs[-1].loss
    recs.extend(StepRecord(step=s, loss=lvl * (1 + (s - 800) / 150), grad_norm=1.0) for s in range(800, 1100))
    fs = [f for f in run(recs) if f.kind == "loss_divergence" and not f.resolved]
    assert len(fs) == 1 and fs[0].severity is Severity.WARNING and 800 < fs[0].step < 1100


def test_a_large_grad_norm_from_the_first_record_is_judged_by_the_cold_threshold() -> None:
    # YOLO-World (mmengine) healthy runs: "grad_norm: 971.4538" ... (AILab-CVC/YOLO-World#190)
    # and "grad_norm: 1298.9029" ... (AILab-CVC/YOLO-World#165), no baseline yet.
    for norms in ([971.4538, 1034.6824, 1066.5644, 1006.1330], [1298.9029, 1304.1145, 1224.8096]):
        recs = [StepRecord(step=50 * (i + 1), loss=1100.0, grad_norm=g) for i, g in enumerate(norms)]
        assert [f for f in alarms(run(recs)) if f.kind == "grad_explosion"] == []
    # openpi (Physical-Intelligence/openpi#814): "Step 5900: grad_norm=681325.8125, loss=344671968.0000"
    norms = [681325.8125, 846482.3750, 549847.8750, 775058.3750]
    recs = [StepRecord(step=5900 + 100 * i, loss=3e8, grad_norm=g) for i, g in enumerate(norms)]
    fs = [f for f in alarms(run(recs)) if f.kind == "grad_explosion"]
    assert len(fs) == 1 and fs[0].step == 6100


# pypi nlpia2 0.2.0 ch08/rnn_word/checkpoint_notes (wild batch10 pytorch_word_lm_rnn_tanh_lr20):
# word_language_model RNN_TANH at lr 20, train losses of epochs 3-4 ("| loss 12.21 |" ...).
WORD_LM_LR20 = [
    15.14, 15.03, 14.95, 14.90, 14.86, 14.89, 14.99, 14.84, 14.73, 14.29, 14.72, 14.63, 14.59, 14.55,
    13.48, 13.02, 12.98, 13.34, 12.54, 12.36, 12.40, 12.21, 13.96, 15.97, 17.21, 17.34, 17.33, 17.28,
]  # fmt: skip


def test_a_log_shorter_than_one_window_that_rises_for_good_diverges() -> None:
    recs = [StepRecord(step=200 * (i + 1), loss=v) for i, v in enumerate(WORD_LM_LR20)]
    fs = [f for f in alarms(run(recs)) if f.kind == "loss_divergence"]
    assert len(fs) == 1 and fs[0].step == 200 * 26 and "12.21" in fs[0].message
    # Before the rise the same short log is silent, and so is a noisy per-batch loss.
    assert [f for f in alarms(run(recs[:22])) if f.kind == "loss_divergence"] == []
    rng = random.Random(3)
    noisy = [StepRecord(step=i, loss=3.0 + rng.gauss(0, 0.5)) for i in range(1, 45)]
    assert [f for f in alarms(run(noisy)) if f.kind == "loss_divergence"] == []


# https://github.com/facebookresearch/dino/issues/246 (description by AwayFromKeyboardwarrior):
# DINO's train_loss per epoch (151-161) at ln 65536, the head collapsed to a uniform output.
DINO_STUCK = [
    11.090190887451172, 11.090194702148438, 11.090197801589966, 11.090206146240234, 11.0902099609375,
    11.090211868286133, 11.090214729309082, 11.090224266052246, 11.090226173400879, 11.090229988098145,
    11.09023666381836,
]  # fmt: skip


def test_a_loss_flat_from_the_first_record_is_a_plateau_warning() -> None:
    fs = [f for f in alarms(run([StepRecord(step=151 + i, loss=v) for i, v in enumerate(DINO_STUCK)]))]
    assert [(f.kind, f.severity) for f in fs] == [("loss_plateau", Severity.WARNING)]
    # https://github.com/Lightning-AI/litgpt/issues/689: "loss 10.8259" (ln 50257) at every step
    fs = alarms(run([StepRecord(step=38 + i, loss=10.8259) for i in range(12)]))
    assert [f.kind for f in fs] == ["loss_plateau"] and "50,3" in fs[0].message  # e^10.8259 = 50,307


def test_a_short_flat_history_or_one_that_moved_is_no_plateau_warning() -> None:
    short = [StepRecord(step=151 + i, loss=v) for i, v in enumerate(DINO_STUCK[:7])]
    assert alarms(run(short)) == []
    # The healthy Keras run's train losses (it learned), then its last value held: not stuck.
    learned = [StepRecord(step=i, loss=tr) for i, (tr, _) in enumerate(KERAS_NOISY_HEALTHY)]
    learned += [StepRecord(step=17 + i, loss=0.9639) for i in range(12)]
    assert [f for f in alarms(run(learned)) if f.kind == "loss_plateau"] == []
    # A loss printed to one digit ("2.0") may hide a falling loss: too coarse to judge.
    assert alarms(run([StepRecord(step=i, loss=2.0) for i in range(1, 41)])) == []


def test_plateau_is_info_only() -> None:
    cfg = replaced(DetectorsConfig(), {"loss_plateau.window": 200})
    rng = random.Random(1)
    recs = [StepRecord(step=s, loss=3.0 + rng.gauss(0, 0.01)) for s in range(1, 800)]
    fs = [f for f in run(recs, cfg) if f.kind == "loss_plateau"]
    assert len(fs) == 1 and fs[0].severity is Severity.INFO


def test_overfitting() -> None:
    recs: list = []
    # 1.82 is within the curve's own eval-to-eval noise (its steep start): 1.9 and 2.0 are not.
    evals = [2.0, 1.8, 1.7, 1.75, 1.82, 1.9, 2.0]
    for i, ev in enumerate(evals):
        recs.extend(StepRecord(step=i * 100 + k, loss=2.0 - 0.002 * (i * 100 + k)) for k in range(1, 101))
        recs.append(EvalRecord(eval_loss=ev, step=i * 100 + 100))
    fs = [f for f in run(recs) if f.kind == "overfitting" and not f.resolved]
    assert len(fs) == 1 and fs[0].step == 700 and "1.82" not in fs[0].message


def _epochs(pairs: list[tuple[float, float]]) -> list:
    """(train loss, val loss) per epoch as a Keras-style log gives them: one of each per epoch."""
    recs: list = []
    for e, (tr, ev) in enumerate(pairs):
        recs += [StepRecord(step=e, loss=tr, epoch=e), EvalRecord(eval_loss=ev, step=e)]
    return recs


# (loss, val_loss) per epoch of real runs:
# Aditya24jar/Emotion-Detection-Resnet50@65f5765144a3589340241f72845baabc4e1a4e04:training.log
# (Keras CSVLogger, healthy: a noisy val loss, best 1.024 at epoch 10, then 1.04-1.13).
KERAS_NOISY_HEALTHY = [
    (1.7160, 1.4436), (1.5262, 7.4172), (1.4375, 1.2864), (1.3448, 1.5442), (1.2870, 1.6200),
    (1.2312, 1.1484), (1.1537, 1.1709), (1.1001, 1.0636), (1.0729, 1.0713), (1.0732, 1.0480),
    (1.0344, 1.0240), (1.0185, 1.0730), (0.9931, 1.0445), (0.9870, 1.0522), (0.9583, 1.1142),
    (0.9513, 1.1289), (0.9639, 1.0745),
]  # fmt: skip
# https://github.com/keras-team/keras/issues/3056 (description by zero76114): an LSTM whose val
# loss climbs from its best 0.6765 at epoch 2 while the train loss falls.
KERAS_3056_OVERFIT = [
    (0.6807, 0.6770), (0.6693, 0.6765), (0.6678, 0.6789), (0.6485, 0.6913), (0.6175, 0.7101),
    (0.5860, 0.7268), (0.5521, 0.7586),
]  # fmt: skip
# https://github.com/kk7nc/RMDL/issues/14 (turn 5 by zhuzhangli), epochs 8-14: best 0.8235 at 10.
RMDL_14_OVERFIT = [
    (0.6090, 0.8632), (0.4891, 0.8302), (0.4015, 0.8235), (0.3249, 0.9020), (0.2727, 0.9440),
    (0.2220, 0.9457), (0.1903, 1.0360),
]  # fmt: skip


def test_overfitting_is_a_rise_beyond_the_eval_curves_own_noise() -> None:
    assert [f for f in alarms(run(_epochs(KERAS_NOISY_HEALTHY))) if f.kind == "overfitting"] == []
    for curve, at in ((KERAS_3056_OVERFIT, {5, 6}), (RMDL_14_OVERFIT, {4, 5, 6})):
        fs = [f for f in alarms(run(_epochs(curve))) if f.kind == "overfitting"]
        assert len(fs) == 1 and fs[0].step in at


def test_overfitting_after_an_eval_loss_of_zero_fails_nothing() -> None:
    """Found by fuzzing: a best eval loss of exactly 0 made the message divide by it."""
    recs: list = []
    for i, ev in enumerate([0.5, 0.0, 0.3, 0.4, 0.5, 0.6]):
        recs.extend(StepRecord(step=i * 100 + k, loss=2.0 - 0.002 * (i * 100 + k)) for k in range(1, 101))
        recs.append(EvalRecord(eval_loss=ev, step=i * 100 + 100))
    assert [f for f in run(recs) if f.kind == "overfitting" and not f.resolved] == []


def test_grad_explosion_needs_consecutive_steps() -> None:
    rng = random.Random(2)
    recs = [healthy(s, rng) for s in range(1, 300)]
    recs.append(StepRecord(step=300, loss=2.5, grad_norm=50.0))
    recs.extend(healthy(s, rng) for s in range(301, 320))
    assert [f for f in run(recs) if f.kind == "grad_explosion"] == []
    recs.extend(StepRecord(step=s, loss=2.5, grad_norm=40.0 + s) for s in range(320, 324))
    fs = [f for f in run(recs) if f.kind == "grad_explosion"]
    assert len(fs) == 1 and fs[0].step == 321  # two in a row, far above the norms before


def test_grad_clipping_saturated() -> None:
    recs = [StepRecord(step=s, loss=2.0, grad_norm=3.0 + (s % 5) * 0.1) for s in range(1, 400)]
    fs = [f for f in run(recs) if f.kind == "grad_clipping_saturated"]
    assert len(fs) == 1 and "too high" in fs[0].message


def test_grad_vanishing() -> None:
    recs = [StepRecord(step=s, loss=2.0, grad_norm=0.5) for s in range(1, 200)]
    recs.extend(StepRecord(step=s, loss=2.0, grad_norm=1e-9) for s in range(200, 240))
    fs = [f for f in run(recs) if f.kind == "grad_vanishing"]
    assert len(fs) == 1 and fs[0].step == 219


def test_loss_scale_collapse_from_overflows() -> None:
    recs: list = [StepRecord(step=s, loss=2.0, loss_scale=65536.0) for s in range(1, 100)]
    scale = 65536.0
    for s in range(100, 130):
        scale /= 2
        recs.append(OverflowRecord(old_scale=scale * 2, new_scale=scale, step=s))
    fs = [f for f in run(recs) if f.kind == "loss_scale_collapse"]
    assert len(fs) == 1 and fs[0].severity is Severity.WARNING


def test_halvings_to_a_low_scale_are_told_once_while_steps_go_on_at_it() -> None:
    # Scale 512 halved 6 times to 8, then steps go through at 8 (above 4 x min_scale, not above
    # low_scale): the finding stands, it is not "recovered" and reopened at every step.
    recs: list = [StepRecord(step=s, loss=2.0, loss_scale=512.0) for s in range(1, 50)]
    scale = 512.0
    for s in range(50, 56):
        scale /= 2
        recs.append(OverflowRecord(old_scale=scale * 2, new_scale=scale, step=s))
    recs.extend(StepRecord(step=s, loss=2.0) for s in range(56, 120))
    fs = [f for f in run(recs) if f.kind == "loss_scale_collapse"]
    assert len(fs) == 1 and not fs[0].resolved


def test_throughput_drop_and_recovery() -> None:
    rng = random.Random(7)
    recs = [healthy(s, rng) for s in range(1, 400)]
    for s in range(400, 420):
        r = healthy(s, rng)
        r.tokens_per_s = 3000.0
        recs.append(r)
    recs.extend(healthy(s, rng) for s in range(420, 440))
    fs = [f for f in run(recs) if f.kind == "throughput_drop"]
    assert [f.resolved for f in fs] == [False, True]
    assert fs[0].step == 400 and "25%" in fs[0].message


def test_slow_single_steps_do_not_fire_throughput() -> None:
    rng = random.Random(8)
    recs = []
    for s in range(1, 1000):
        r = healthy(s, rng)
        if s % 100 == 0:
            r.tokens_per_s = 1000.0  # eval / checkpoint step
        recs.append(r)
    assert [f for f in run(recs) if f.kind == "throughput_drop"] == []


def test_error_records_become_findings_once() -> None:
    err = ErrorRecord(
        kind="nccl_error",
        summary="NCCL WARN NET/IB : Got completion with error 12",
        severity=Severity.WARNING,
        line=7,
    )
    fs = run([StepRecord(step=1, loss=2.0), err, err, err])
    assert [(f.kind, f.line) for f in fs] == [("nccl_error", 7)]


def _state_with(rank, last_step, kinds, time=None):
    eng = RankEngine(DetectorsConfig(), rank=rank, path=f"rank-{rank}.log")
    for s in range(1, last_step + 1):
        eng.feed(StepRecord(step=s, loss=2.0))
    fs = []
    for k in kinds:
        fs += eng.feed(ErrorRecord(kind=k, summary=f"{k} on {rank}", time=time, line=99))
    return eng.state, fs


def test_cross_rank_names_the_crashed_rank_behind_nccl_timeouts() -> None:
    states, findings = [], {}
    for r in range(4):
        st, fs = _state_with(r, 100, ["crash"] if r == 2 else ["nccl_timeout"])
        states.append(st)
        findings[r] = fs
    out = cross_rank(states, findings, RankLagConfig())
    assert [(f.kind, f.rank, f.severity) for f in out] == [("rank_lagging", 2, Severity.CRITICAL)]
    assert "rank 2 failed first" in out[0].message and "0,1,3" in out[0].message


@pytest.mark.parametrize("own", ["crash", "oom", "cuda_error", "xid", "gpu_lost"])
def test_cross_rank_weighs_the_failures_the_live_agent_records(own: str) -> None:
    """One list of failure kinds: whatever the live agent records as a rank's own failure is a
    cause for ``analyze`` too, and what a rank says of a lost peer is a consequence for both."""
    from rankwatch.errorkinds import OWN_FAILURES, PEER_FAILURES, RECORDED_FAILURES

    assert own in OWN_FAILURES and set(OWN_FAILURES) <= RECORDED_FAILURES
    assert "peer_error" in RECORDED_FAILURES and "peer_error" in PEER_FAILURES
    states, findings = [], {}
    for r in range(3):
        st, fs = _state_with(r, 100, [own] if r == 1 else ["peer_error"])
        states.append(st)
        findings[r] = fs
    out = cross_rank(states, findings, RankLagConfig())
    assert [(f.kind, f.rank, f.severity) for f in out] == [("rank_lagging", 1, Severity.CRITICAL)]


def test_cross_rank_names_the_rank_without_timeout() -> None:
    states, findings = [], {}
    for r in range(4):
        st, fs = _state_with(r, 50, [] if r == 1 else ["nccl_timeout"])
        states.append(st)
        findings[r] = fs
    out = cross_rank(states, findings, RankLagConfig())
    assert [f.rank for f in out] == [1]


def test_cross_rank_lag_by_steps_and_healthy_silence() -> None:
    states = [_state_with(r, 200 if r != 3 else 120, [])[0] for r in range(4)]
    out = cross_rank(states, {}, RankLagConfig())
    assert [(f.rank, f.step) for f in out] == [(3, 120)]
    healthy_states = [_state_with(r, 200, [])[0] for r in range(4)]
    assert cross_rank(healthy_states, {}, RankLagConfig()) == []


def test_bf16_constant_loss_scale_of_one_is_not_a_collapse() -> None:
    recs = [StepRecord(step=s, loss=2.0, grad_norm=0.5, loss_scale=1.0) for s in range(1, 400)]
    assert [f for f in run(recs) if f.kind == "loss_scale_collapse"] == []


def test_dynamic_scale_falling_to_one_is_a_collapse() -> None:
    recs = [StepRecord(step=s, loss=2.0, loss_scale=2.0 ** max(0, 16 - s // 10)) for s in range(1, 400)]
    fs = [f for f in run(recs) if f.kind == "loss_scale_collapse"]
    assert len(fs) == 1 and fs[0].step == 160


# --- job time limit ----------------------------------------------------------------------
def test_eta_past_job_end_warns_once_and_resolves() -> None:
    from rankwatch.detectors.deadline import KIND, SUSTAIN, DeadlineDetector

    d = DeadlineDetector(3)
    kw = dict(job_end=10_000.0, step=500, checkpoints_watched=True)
    out = []
    for i in range(SUSTAIN + 2):
        out += d.check(now=1000.0 + i, eta=20_000.0, next_checkpoint=None, **kw)
    assert [f.kind for f in out] == [KIND] and not out[0].resolved and out[0].rank == 3
    assert "job ends in 2h29m" in out[0].message
    # A checkpoint due well before the end: the loss is bounded, nothing to say.
    res = d.check(now=1100.0, eta=20_000.0, next_checkpoint=5000.0, **kw)
    assert len(res) == 1 and res[0].resolved


def test_eta_past_job_end_silent_when_run_finishes_or_saves_in_time() -> None:
    from rankwatch.detectors.deadline import SUSTAIN, DeadlineDetector

    d = DeadlineDetector(0)
    out = []
    for i in range(SUSTAIN * 3):
        out += d.check(
            now=1000.0 + i,
            eta=3000.0,
            next_checkpoint=None,
            job_end=10_000.0,
            step=1,
            checkpoints_watched=False,
        )
        out += d.check(
            now=1000.0 + i,
            eta=90_000.0,
            next_checkpoint=2000.0,
            job_end=10_000.0,
            step=1,
            checkpoints_watched=True,
        )
        out += d.check(
            now=1000.0 + i, eta=90_000.0, next_checkpoint=None, job_end=None, step=1, checkpoints_watched=True
        )
    assert out == []
    # A blip shorter than SUSTAIN checks never fires.
    for i in range(SUSTAIN - 1):
        out += d.check(
            now=2000.0 + i,
            eta=90_000.0,
            next_checkpoint=None,
            job_end=10_000.0,
            step=1,
            checkpoints_watched=True,
        )
    out += d.check(
        now=2100.0, eta=10.0, next_checkpoint=None, job_end=10_000.0, step=1, checkpoints_watched=True
    )
    assert out == []


# -- noisy but healthy: the false alarms a reviewer found ------------------------------------


def test_per_batch_loss_noise_of_sft_is_silent_but_a_real_spike_is_not() -> None:
    """logging_steps=1: per-batch losses jump 2-3x now and then and come straight back."""
    rng = random.Random(7)
    recs = []
    for s in range(1, 1001):
        loss = 0.9 * (1 + rng.uniform(-0.4, 0.4))
        if rng.random() < 0.006:
            loss *= rng.uniform(2.3, 3.0)  # a hard batch: the heavy tail of a healthy run
        recs.append(StepRecord(step=s, loss=loss, grad_norm=0.5, learning_rate=1e-5))
    assert [f for f in run(recs) if f.kind == "loss_spike"] == []
    recs.append(StepRecord(step=1001, loss=9.0, grad_norm=0.5, learning_rate=1e-5))
    (f,) = [f for f in run(recs) if f.kind == "loss_spike"]
    assert f.step == 1001 and f.evidence["noise_sigma"] > 0


def test_a_second_spike_no_larger_than_the_first_is_not_news() -> None:
    rng = random.Random(3)
    recs = [healthy(s, rng) for s in range(1, 600)]
    base = recs[-1].loss
    recs.append(StepRecord(step=600, loss=base * 3, grad_norm=0.6))
    recs.extend(healthy(s, rng) for s in range(601, 800))
    recs.append(StepRecord(step=800, loss=base * 2.9, grad_norm=0.6))
    recs.extend(healthy(s, rng) for s in range(801, 900))
    assert [f.step for f in run(recs) if f.kind == "loss_spike"] == [600]


def test_grad_norms_high_through_a_long_lr_warmup_are_silent() -> None:
    """LLM pretraining warms the LR up over hundreds of steps, well past warmup_steps."""
    rng = random.Random(5)
    recs = []
    for s in range(1, 1000):
        lr = 3e-4 * min(1.0, s / 400)
        g = rng.uniform(5.0, 40.0) if s < 400 else rng.uniform(0.3, 1.2)
        recs.append(StepRecord(step=s, loss=3.0, grad_norm=g, learning_rate=lr))
    assert [f for f in run(recs) if f.kind == "grad_explosion"] == []


def test_a_blow_up_right_after_warmup_fires_without_a_baseline() -> None:
    recs = [StepRecord(step=s, loss=3.0, grad_norm=0.5, learning_rate=3e-4) for s in range(1, 102)]
    recs += [StepRecord(step=s, loss=3.0, grad_norm=5e3, learning_rate=3e-4) for s in range(102, 106)]
    (f,) = [f for f in run(recs) if f.kind == "grad_explosion"]
    assert f.step == 103 and f.evidence["from"] == 0.5


def test_deepspeed_fp16_start_up_overflows_are_silent_and_counted_once() -> None:
    """DeepSpeed backs the scale off from 2^32 at start: one OVERFLOW line per skipped step,
    and its step line's cumulative skipped= counts the same steps again."""
    recs: list = []
    scale = 2.0**32
    for s in range(1, 17):
        recs.append(OverflowRecord(old_scale=scale, new_scale=scale / 2, step=s))
        scale /= 2
    recs.append(StepRecord(step=100, loss=3.0, learning_rate=1e-4, skipped_iters=16))
    recs += [StepRecord(step=s, loss=3.0, learning_rate=1e-4, skipped_iters=0) for s in range(110, 400, 10)]
    eng = RankEngine(DetectorsConfig(), rank=0, path="rank-0.log")
    out = [f for r in recs for f in eng.feed(r)]
    assert [f for f in out if f.kind == "loss_scale_collapse"] == []
    assert len(eng.state.overflows) == 16 and eng.state.last_loss_scale == 65536.0


def test_loss_scale_collapse_message_names_the_scale_from_overflow_lines() -> None:
    recs: list = [StepRecord(step=s, loss=2.0, learning_rate=1e-4) for s in range(1, 150, 10)]
    scale = 65536.0
    for s in range(150, 180):
        scale /= 2
        recs.append(OverflowRecord(old_scale=scale * 2, new_scale=scale, step=s))
        recs.append(StepRecord(step=s, loss=2.0, learning_rate=1e-4, skipped_iters=1))
    (f,) = [f for f in run(recs) if f.kind == "loss_scale_collapse"]
    assert "scale n/a" not in f.message


def test_recent_windows_skip_non_finite_values_and_keep_order() -> None:
    st = RankState(rank=0)
    vals = [1.0, math.nan, 2.0, None, math.inf, 3.0, 4.0]
    for i, v in enumerate(vals, 1):
        st.add(StepRecord(step=i, loss=v, learning_rate=v, tokens_per_s=v))
    for attr in ("loss", "learning_rate", "tokens_per_s"):  # tracked apart, and walked
        assert st.recent(attr, 3) == [2.0, 3.0, 4.0]
        assert st.recent(attr, 10) == [1.0, 2.0, 3.0, 4.0]
        assert st.recent(attr, 0) == []
    assert st.ends("loss", 3) == (2.0, 4.0) and st.ends("loss", 50) == (1.0, 4.0)
    assert st.ends("loss", 1) is None and RankState(rank=0).ends("loss", 10) is None
    for i in range(HISTORY + 5):
        st.add(StepRecord(step=100 + i, loss=float(i)))
    assert len(st.recent("loss", 10 * HISTORY)) == HISTORY
    assert st.recent("loss", 2) == [HISTORY + 3.0, HISTORY + 4.0]


def test_recent_windows_reach_no_further_back_than_the_last_history_records() -> None:
    """A field most records lack (a loss on every third): the window is of the last HISTORY
    records, as the records themselves are, not of the last HISTORY values."""
    st = RankState(rank=0)
    for i in range(3 * HISTORY + 7):
        v = float(i) if i % 3 == 0 else None
        st.add(StepRecord(step=i + 1, loss=v, learning_rate=v))
        if i % 1000 == 0 or i > 3 * HISTORY:
            want = [r.loss for r in st.steps if r.loss is not None]
            assert st.recent("loss", 10 * HISTORY) == want
            assert st.recent("loss", 5) == want[-5:]
            ends = st.ends("learning_rate", 10 * HISTORY)
            assert ends == ((want[0], want[-1]) if len(want) >= 2 else None)


# -- right from step 1: rules safe in warmup, windows in training steps --------------------


def test_lr_far_too_high_is_flagged_within_the_first_ten_steps() -> None:
    """A real HF Trainer with learning_rate=5.0 and no warmup: loss 5 -> 26 -> 112 -> 473 ->
    1204, grad norm 1 -> 94 within six steps."""
    losses = [5.0, 5.2, 26.0, 112.0, 473.0, 1204.0, 900.0, 1500.0, 1300.0, 1800.0]
    grads = [1.0, 1.1, 9.0, 35.0, 94.0, 60.0, 80.0, 70.0, 90.0, 85.0]
    recs = [
        StepRecord(step=i, loss=loss, grad_norm=g, learning_rate=5.0 * (1 - i / 240))
        for i, (loss, g) in enumerate(zip(losses, grads, strict=True), 1)
    ]
    fs = alarms(run(recs))
    by_kind = {f.kind: f.step for f in fs}
    assert by_kind["loss_divergence"] <= 6 and by_kind["grad_explosion"] <= 6, fs


def test_healthy_warmup_stays_silent() -> None:
    """High grad norm falling, a slow first step, fp16 scale calibration from 65536."""
    rng = random.Random(11)
    recs: list = []
    scale = 65536.0
    for s in range(1, 4):  # the scaler backs off three times in the first steps
        recs.append(OverflowRecord(old_scale=scale, new_scale=scale / 2, step=s))
        scale /= 2
    for s in range(4, 400):
        recs.append(
            StepRecord(
                step=s,
                loss=10.5 * math.exp(-s / 80) + 2.5 + rng.gauss(0, 0.05),
                grad_norm=40.0 * math.exp(-s / 10) + 0.8 + abs(rng.gauss(0, 0.1)),
                learning_rate=3e-4 * min(1.0, s / 50),
                loss_scale=scale,
                step_time_s=30.0 if s == 4 else 0.5 * (1 + rng.gauss(0, 0.03)),
            )
        )
    assert alarms(run(recs)) == []


def test_deepspeed_overflow_five_times_down_to_two_is_a_collapse() -> None:
    recs: list = [StepRecord(step=s, loss=2.0, loss_scale=64.0) for s in range(1, 30)]
    scale = 64.0
    for s in range(30, 35):
        recs.append(OverflowRecord(old_scale=scale, new_scale=scale / 2, step=s))
        scale /= 2
    (f,) = [f for f in run(recs) if f.kind == "loss_scale_collapse"]
    assert f.step == 34 and "5 overflows in a row" in f.message and scale == 2.0


def test_a_short_run_rising_on_every_iteration_diverges() -> None:
    """Megatron-DeepSpeed, 62 iterations: the loss triples at iteration 3, then rises on
    every iteration from 31 to 62 (+75%). All of it sat inside the old 100-step warmup."""
    losses = [10.9, 10.8, 31.0, 14.0, 11.5]
    losses += [9.5 - 0.1 * i for i in range(25)]  # 6..30 falling
    level = losses[-1]
    losses += [level * (1 + 0.75 * i / 31) for i in range(1, 33)]  # 31..62 rising
    recs = [StepRecord(step=i, loss=v, learning_rate=1e-4) for i, v in enumerate(losses, 1)]
    fs = [f for f in alarms(run(recs)) if f.kind == "loss_divergence"]
    assert len(fs) == 1 and 40 <= fs[0].step <= 62, fs


def test_plateau_at_ln_vocab_logged_every_five_steps_is_found() -> None:
    rng = random.Random(2)
    lnv = math.log(50257)
    recs = [StepRecord(step=s, loss=lnv + rng.gauss(0, 0.01)) for s in range(5, 705, 5)]
    (f,) = [f for f in run(recs) if f.kind == "loss_plateau"]
    assert f.severity is Severity.INFO and f.step <= 700


@pytest.mark.parametrize("every", [1, 25, 500])
def test_logged_every_step_or_every_500_is_judged_alike(every: int) -> None:
    rng = random.Random(every)
    flat = [StepRecord(step=s, loss=3.0 + rng.gauss(0, 0.01)) for s in range(every, 40 * 500 + 1, every)]
    assert [f.kind for f in run(flat) if not f.resolved] == ["loss_plateau"]
    falling = [StepRecord(step=s, loss=10.0 - 7.0 * s / 20000) for s in range(every, 20001, every)]
    assert run(falling) == []


def test_throughput_halved_exactly_is_a_drop_found_at_once() -> None:
    recs = [StepRecord(step=s, loss=2.0, tokens_per_s=12000.0) for s in range(1, 30)]
    recs += [StepRecord(step=s, loss=2.0, tokens_per_s=6000.0) for s in range(30, 40)]
    (f,) = [f for f in run(recs) if f.kind == "throughput_drop"]
    assert f.step == 30 and "50%" in f.message


def test_throughput_baseline_first_taken_at_a_slow_moment_rises_to_the_real_speed() -> None:
    recs = [StepRecord(step=1, loss=2.0, tokens_per_s=500.0)]  # compile
    recs += [StepRecord(step=s, loss=2.0, tokens_per_s=5000.0) for s in range(2, 25)]  # slow start
    recs += [StepRecord(step=s, loss=2.0, tokens_per_s=12000.0) for s in range(25, 100)]
    recs += [StepRecord(step=s, loss=2.0, tokens_per_s=4000.0) for s in range(100, 110)]  # 3x slower
    (f,) = [f for f in run(recs) if f.kind == "throughput_drop"]
    assert f.step == 100 and f.evidence["baseline"] == 12000.0


def test_a_loss_and_grad_collapse_is_flagged_from_the_first_steps() -> None:
    """OLMo#692: cross-entropy 12.18 -> 1.8e-6 -> 0.0 while the grad norm falls 231 -> 7.7e-8."""
    collapse = [
        StepRecord(step=1, loss=12.18, grad_norm=231.7),
        StepRecord(step=2, loss=1.787e-6, grad_norm=0.0002),
        StepRecord(step=3, loss=0.0, grad_norm=7.7e-8),
    ]
    fs = [f for f in run(collapse) if f.kind == "grad_vanishing" and not f.resolved]
    # Step 2 already: loss and grad norm both 10^4 below their first values (collapse_ratio).
    assert [f.step for f in fs] == [2] and "collapsed" in fs[0].message
    # Low loss with live gradients, or tiny gradients with a loss that still means something: silent.
    fine = [StepRecord(step=i, loss=2.0 / i, grad_norm=1.0 if i < 50 else 1e-7) for i in range(1, 60)]
    assert not [f for f in run(fine) if f.kind == "grad_vanishing"]


def test_overflows_at_the_lowest_loss_scale_are_a_collapse() -> None:
    """transformers#14531 (T5 + DeepSpeed fp16): 'Attempted loss scale: 1, reducing to 1' again and again."""
    recs = [OverflowRecord(step=None, old_scale=1.0, new_scale=1.0) for _ in range(4)]
    fs = [f for f in run(recs) if f.kind == "loss_scale_collapse"]
    assert len(fs) == 1 and "lowest scale" in fs[0].message
    # A scale that held at a healthy value is hysteresis, not a collapse.
    held = [OverflowRecord(step=None, old_scale=1024.0, new_scale=1024.0) for _ in range(4)]
    assert not [f for f in run(held) if f.kind == "loss_scale_collapse"]


def test_a_loss_scale_printed_as_zero_is_a_collapse() -> None:
    """fairseq#1529 ("loss_scale 0.000") and fairseq#1895 ("loss_scale 0"): below fairseq's own
    3-decimal print of its 1e-4 floor; no run trains at scale 0."""
    recs = [StepRecord(step=s, loss=9.8, loss_scale=0.0) for s in (695, 700)]
    assert [f.step for f in run(recs) if f.kind == "loss_scale_collapse"] == [695]
    # Megatron's bf16 "loss scale: 1.0" on every line is no collapse.
    assert not [
        f
        for f in run([StepRecord(step=s, loss=2.0, loss_scale=1.0) for s in range(1, 50)])
        if f.kind == "loss_scale_collapse"
    ]


# batch9 hf_trainer_token_classifier_healthy.log: two trainer.train() runs in one log; the
# second starts at a higher loss with its epoch back at 2.21 after 2.8 (loss, epoch).
TWO_RUNS = [
    (1.6282, 0.22), (0.072, 0.43), (0.0217, 0.65), (0.0116, 0.86), (0.0076, 1.08), (0.005, 1.29),
    (0.0038, 1.51), (0.0032, 1.72), (0.0027, 1.94), (0.0022, 2.16), (0.002, 2.37), (0.0016, 2.59),
    (0.0014, 2.8), (0.1373, 2.21), (0.0276, 4.42), (0.0147, 6.64), (0.01, 8.85),
]  # fmt: skip


def test_a_second_run_in_the_log_is_no_spike_against_the_first() -> None:
    recs = [StepRecord(step=None, loss=v, epoch=e, line=i) for i, (v, e) in enumerate(TWO_RUNS, 1)]
    assert [f for f in run(recs) if f.kind == "loss_spike"] == []
    # The same jump without the epoch going back is still a spike.
    same = [StepRecord(step=None, loss=v, epoch=float(i), line=i) for i, (v, _) in enumerate(TWO_RUNS, 1)]
    assert [f.kind for f in run(same) if f.kind == "loss_spike"] == ["loss_spike"]


def test_an_eval_nan_is_resolved_by_a_finite_eval_loss_only() -> None:
    """Training lines between two evals say nothing of the eval: its NaN stays open until an
    eval loss is finite again, and a training NaN while it is open is the same one finding."""
    recs: list[StepRecord | EvalRecord] = [StepRecord(step=s, loss=2.0) for s in range(1, 6)]
    recs += [EvalRecord(eval_loss=math.nan, step=5), StepRecord(step=6, loss=2.0)]
    recs += [StepRecord(step=7, loss=math.nan), StepRecord(step=8, loss=2.0)]
    recs += [EvalRecord(eval_loss=math.nan, step=10), EvalRecord(eval_loss=2.1, step=15)]
    found = [f for f in run(recs) if f.kind == "nan_loss"]
    assert [(f.step, f.resolved) for f in found] == [(5, False), (15, True)], found
