"""Format parsers against samples adapted from what the frameworks really print."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from rankwatch.records import EvalRecord, OverflowRecord, Record, StepRecord
from rankwatch.sources.parsers import FORMATS, make_parser, sniff_format
from rankwatch.sources.parsers.base import LogLine
from rankwatch.sources.parsers.deepspeed import DeepSpeedParser
from rankwatch.sources.parsers.hf import HFParser
from rankwatch.sources.parsers.megatron import MegatronParser

pytestmark = pytest.mark.unit

GIB = 1 << 30
MIB = 1 << 20


def feed(fmt: str, text: str, *, regex: str | None = None) -> list[Record]:
    parser = make_parser(fmt, regex=regex)
    return run(parser, text)


def run(parser: object, text: str) -> list[Record]:
    out: list[Record] = []
    for i, t in enumerate(text.split("\n"), 1):
        out.extend(parser.parse(LogLine(t, i, rank=3, time=1000.0 + i)))  # type: ignore[attr-defined]
    return out


def steps(recs: list[Record]) -> list[StepRecord]:
    return [r for r in recs if isinstance(r, StepRecord)]


def evals(recs: list[Record]) -> list[EvalRecord]:
    return [r for r in recs if isinstance(r, EvalRecord)]


def overflows(recs: list[Record]) -> list[OverflowRecord]:
    return [r for r in recs if isinstance(r, OverflowRecord)]


NCCL_NOISE = [
    "node01:1234:1300 [0] NCCL INFO Channel 00/02 :    0   1",
    "node01:1234:1300 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/IPC/read",
    "node01:1234:1300 [0] NCCL INFO comm 0x55d8c6c0 rank 0 nranks 8 cudaDev 0 busId 1000 - Init COMPLETE",
    "node01:1234:1300 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",
    "node01:1234:1300 [0] NCCL INFO Using network IB",
]
OTHER_NOISE = [
    "Traceback (most recent call last):",
    '  File "/workspace/train.py", line 812, in <module>',
    "    loss.backward()",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
    "of 79.15 GiB of which 1.02 GiB is free.",
    "[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, Timeout(ms)=600000) ran for 600011 milliseconds",
    "Saving model checkpoint to ./out/checkpoint-500",
    "The loss went down a lot in this epoch, which is nice.",
    '{"level": "info", "msg": "loaded 1000 samples"}',
    "",
    "   ",
]

# ---------------------------------------------------------------- Megatron

MEGATRON_LOG = """\
training ...
[before the start of training step] datetime: 2025-04-13 23:41:00
 [2025-04-13 23:41:12] iteration       10/    1000 | consumed samples:          160 | elapsed time per iteration (ms): 1147.6 | learning rate: 0.000000E+00 | global batch size:    16 | loss scale: 8388608.0 | number of skipped iterations:  10 | number of nan iterations:   0 |
[Rank 0] (after 10 iterations) memory (MB) | allocated: 1464.33154296875 | max allocated: 1464.3408203125 | reserved: 1576.0 | max reserved: 1576.0
 [2024-05-01 10:00:00] iteration      100/  500000 | consumed samples:        12800 | elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 180.2 | learning rate: 3.000000E-04 | global batch size:   128 | lm loss: 6.543210E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2024-05-01 10:02:03] iteration      200/  500000 | consumed samples:        25600 | elapsed time per iteration (ms): 1230.0 | learning rate: 2.990000E-04 | global batch size:   128 | lm loss: NAN | loss scale: 1.0 | grad norm: nan | number of skipped iterations:   0 | number of nan iterations:   3 |
-----------------------------------------------------------------------------------------------------------------
 validation loss at iteration 1000 on validation set | lm loss value: 5.432000E+00 | lm loss PPL: 2.286000E+02 |
-----------------------------------------------------------------------------------------------------------------
 validation loss at iteration 1000 | lm loss value: INF | lm loss PPL: 4.851652E+08 |
 validation loss at the end of training for test data | lm loss value: 5.1E+00 | lm loss PPL: 1.6E+02 |
"""  # noqa: E501


def test_megatron_iteration_lines() -> None:
    recs = feed("megatron", MEGATRON_LOG)
    s = steps(recs)
    assert [r.step for r in s] == [10, 100, 200]
    first, mid, bad = s
    assert first.loss is None and first.skipped_iters == 10 and first.loss_scale == 8388608.0
    assert mid.total_steps == 500000
    assert mid.loss == pytest.approx(6.54321)
    assert mid.step_time_s == pytest.approx(1.2345)
    assert mid.tflops == pytest.approx(180.2)
    assert mid.learning_rate == pytest.approx(3e-4)
    assert mid.grad_norm == pytest.approx(1.234)
    assert (mid.skipped_iters, mid.nan_iters) == (0, 0)
    assert (mid.rank, mid.line, mid.time) == (3, 5, 1005.0)
    assert math.isnan(bad.loss) and math.isnan(bad.grad_norm)  # type: ignore[arg-type]
    assert bad.nan_iters == 3


def test_megatron_validation_lines() -> None:
    ev = evals(feed("megatron", MEGATRON_LOG))
    assert len(ev) == 2  # the test-set line is not a validation point
    assert ev[0].step == 1000 and ev[0].eval_loss == pytest.approx(5.432)
    assert ev[0].metrics == {"lm loss ppl": pytest.approx(228.6)}
    assert ev[1].eval_loss == math.inf


def test_megatron_variants() -> None:
    log = """\
 iteration     2000/   10000 | elapsed time per iteration (ms): 430.0 | learning rate 1.342E-04 | lm loss 7.399415E+00 | loss scale 16384.0 |
 iteration      199/  317892 | consumed samples:       152832 | consumed tokens:    625999872 | elapsed time per iteration (ms): 14287.5 | learning rate: 2.407E-04 | global batch size:   768 | lm loss: 5.905366E+00 | loss scale: 8192.0 | actual seqlen:  4096 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 53.753 | tokens per gpu per second (tgs): 1146.733 | TFLOPs: 69.85 |
 iteration        5/infinity | consumed samples: 40 | elapsed time per iteration (ms): 900.0 | learning rate: 1.0E-04 | global batch size: 8 | mtp_1 loss: 7.1E+00 | load_balancing_loss: 1.01E+00 | loss scale: 1.0 |"""  # noqa: E501
    # Three runs (releases and forks), each read by its own parser.
    a, b, c = (steps(feed("megatron", variant))[0] for variant in log.split("\n"))
    assert (a.step, a.learning_rate, a.loss, a.loss_scale) == (2000, 1.342e-4, 7.399415, 16384.0)
    assert (b.samples_per_s, b.tokens_per_s, b.tflops) == (53.753, 1146.733, 69.85)
    assert c.total_steps is None and c.loss == pytest.approx(7.1)


def test_megatron_layout_fast_path_reads_what_the_general_walk_reads() -> None:
    """After its first iteration line the parser matches the next ones against that line's
    layout; a line that differs in any way must still read as a fresh parser reads it."""
    head = " iteration {it:>8}/    1000 | consumed samples: {c:>8} | elapsed time per iteration (ms): {ms} | "
    lines = [
        head + "learning rate: 1.0E-04 | lm loss: {loss} | loss scale: 1.0 | grad norm: {gn} |",
        head + "learning rate: 1.0E-04 | lm loss: {loss} | loss scale: 1.0 | grad norm: {gn} |   ",
        head + "learning rate: 1.0E-04 | lm loss: {loss} | loss scale: 1.0 | grad norm: {gn} | extra: 3 |",
        head + "learning rate: 1.0E-04 | lm loss: {loss} | loss scale: 1.0 | grad norm: {gn} | tail",
        head + "learning rate: 1.0E-04 | z loss: 0.5 | lm loss: {loss} | loss scale: 1.0 | grad norm: {gn} |",
        head + "lm loss: {loss} | learning rate: 1.0E-04 | loss scale: 1.0 | grad norm: {gn} |",
    ]
    same = "learning rate: 1.0E-04 | lm loss: {loss} | loss scale: 1.0 | grad norm: {gn} |"
    # The counter after another "iteration", coloured, or behind a timestamp.
    lines += [
        "per iteration: x | preiteration 3/ 4 |" + head + same,
        "\x1b[32m" + head + same + "\x1b[0m",
        " [2026-11-20 09:00:00]" + head + same,
        head.replace(" |", " \x1b[0m|", 1) + same,
    ]
    values = [("2.5", "0.3", "900.0"), ("nan", "inf", "901.5"), ("2.4", "-", "N/A")]
    values.append(("1,234.5", "0.1", " 7 "))
    warm = MegatronParser()
    warm.parse(LogLine(lines[0].format(it=1, c=8, loss="3.0", gn="1.0", ms="1.0"), 1))
    assert warm._layout is not None
    n = 1
    for tpl in lines:
        for loss, gn, ms in values:
            n += 1
            text = tpl.format(it=n, c=8 * n, loss=loss, gn=gn, ms=ms)
            got = warm.parse(LogLine(text, n))
            want = MegatronParser().parse(LogLine(text, n))
            assert repr(got) == repr(want), text
    # A colon inside a value: the walk reads the cell as "<text>: value".
    warm = MegatronParser()
    warm.parse(LogLine(" iteration 1/ 10 | foo: 1 | grad norm: 2.0 |", 1))
    text = " iteration 2/ 10 | foo: x moe loss: 3.0 | grad norm: 2.0 |"
    assert repr(warm.parse(LogLine(text, 2))) == repr(MegatronParser().parse(LogLine(text, 2)))
    # A field told twice, unreadable the first time on the line the layout is built from.
    dup = " iteration {it:>8}/    1000 | tflops: {a} | throughput per GPU (TFLOP/s/GPU): {b} | lm loss: 2.0 |"
    warm = MegatronParser()
    warm.parse(LogLine(dup.format(it=1, a="-", b="100.0"), 1))
    for a, b in [("50.0", "100.0"), ("-", "7.0"), ("nan", "1.0")]:
        text = dup.format(it=2, a=a, b=b)
        assert repr(warm.parse(LogLine(text, 2))) == repr(MegatronParser().parse(LogLine(text, 2))), text


_MEGATRON_LINES = (
    " [2026-11-20 09:00:00] iteration      120/  500000 | consumed samples:        30720 | "
    "elapsed time per iteration (ms): 1532.4 | throughput per GPU (TFLOP/s/GPU): 178.3 | "
    "learning rate: 2.999000E-04 | global batch size:   256 | lm loss: 3.123400E+00 | "
    "loss scale: 1.0 | grad norm: 0.452 | number of skipped iterations:   0 | "
    "number of nan iterations:   0 |",
    " iteration      120/  500000 | consumed samples:        30720 | grad norm: 0.452 |",  # no loss term
)
_EDITS = st.sampled_from(
    [":", "|", " ", "nan", "-", "iteration", "loss", "\x1b[0m", "7", "/", "E+", ",", " z loss: 3", "infinity"]
)


@settings(max_examples=fuzz_examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(_MEGATRON_LINES),
    st.lists(st.tuples(st.floats(0, 1), st.integers(0, 3), _EDITS), min_size=1, max_size=4),
)
def test_megatron_layout_matches_the_walk_on_any_edit(line: str, edits: list[tuple[float, int, str]]) -> None:
    """Any text inserted or overwritten anywhere in a line of a settled layout: the warm
    parser's answer is a fresh parser's (which walks the cells)."""
    text = line
    for where, cut, piece in edits:
        at = int(where * len(text))
        text = text[:at] + piece + text[at + cut :]
    warm = MegatronParser()
    warm.parse(LogLine(line, 1))
    assert warm._layout is not None
    # The same history (a NaN reads as a missing loss cell after a line that had one), no layout.
    walk = MegatronParser()
    walk.parse(LogLine(line, 1))
    walk._layout = None
    assert repr(warm.parse(LogLine(text, 2))) == repr(walk.parse(LogLine(text, 2)))


# ---------------------------------------------------------------- DeepSpeed

DEEPSPEED_LOG = """\
[2024-09-23 10:11:01,021] [INFO] [fused_optimizer.py:344:_update_scale]
Grad overflow on iteration 5999
[2024-09-23 10:11:01,021] [INFO] [fused_optimizer.py:345:_update_scale] Reducing dynamic loss scale from 32768.0 to 16384.0
[2024-09-23 10:11:01,021] [INFO] [logging.py:96:log_dist] [Rank 0] Overflow detected. Skipping step. Attempted loss scale: 32768.0, reducing to 16384.0
[2024-09-23 10:11:02,482] [INFO] [logging.py:96:log_dist] [Rank 0] step=6000, skipped=10, lr=[0.001], mom=[[0.8, 0.999]]
[2024-09-23 10:11:02,482] [INFO] [timer.py:260:stop] epoch=0/micro_step=6000/global_step=6000, RunningAvgSamplesPerSec=6493.909488298559, CurrSamplesPerSec=6601.5, MemAllocated=6.01GB, MaxMemAllocated=19.52GB
steps: 6000 loss: 1.2093 iter time (s): 0.512 samples/sec: 250.100
[Rank 0] step=6010, skipped=12, lr=[0.0001371, 0.0001371], mom=[(0.9, 0.95), (0.9, 0.95)]
steps: 6010 loss: nan iter time (s): 0.498 samples/sec: 257.000
[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1
  1%|▌         | 1/189 [00:00<01:26,  2.17it/s]
[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1
[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4096, but hysteresis is 2. Reducing hysteresis to 1
"""  # noqa: E501


def test_deepspeed_steps_and_timer() -> None:
    # step=, the timer's global_step= and the pipeline's steps: line tell one step each:
    # one record per step, with the fields of all three.
    s = steps(feed("deepspeed", DEEPSPEED_LOG))
    assert [r.step for r in s] == [6000, 6010]
    first, second = s
    assert first.learning_rate == 0.001 and first.skipped_iters == 10 and first.line == 5
    assert first.samples_per_s == pytest.approx(6601.5)
    assert first.memory_bytes == pytest.approx(6.01 * GIB)
    assert first.max_memory_bytes == pytest.approx(19.52 * GIB)
    assert (first.loss, first.step_time_s) == (1.2093, 0.512)
    assert second.learning_rate == pytest.approx(1.371e-4) and second.skipped_iters == 2
    assert math.isnan(second.loss) and second.step_time_s == 0.498  # type: ignore[arg-type]
    assert second.samples_per_s == 257.0


def test_deepspeed_overflow_is_counted_once_per_event() -> None:
    ov = overflows(feed("deepspeed", DEEPSPEED_LOG))
    # 1 event told three ways, 2 skipped steps at the minimum scale, 1 hysteresis skip.
    assert [(o.old_scale, o.new_scale) for o in ov] == [
        (32768.0, 16384.0),
        (1.0, 1.0),
        (1.0, 1.0),
        (4096.0, 4096.0),
    ]
    assert ov[0].step == 5999 and ov[0].line == 3 and ov[0].rank == 3
    assert ov[1].step is None


def test_deepspeed_hosts_megatron_and_hf() -> None:
    meg_ds = """\
[Rank 0] step=2499, skipped=1585, lr=[0.0001371, 0.0001371], mom=[(0.9, 0.95), (0.9, 0.95)]
steps: 2499 loss: 13.4013 iter time (s): 1.202 samples/sec: 26.614
 iteration     2499/    2500 | consumed samples:        79968 | elapsed time per iteration (ms): 1205.4 | learning rate: 1.371E-04 | global batch size:    32 | lm loss: 1.340131E+01 | loss scale: 1.0 | grad norm: 2.265 | number of skipped iterations:   0 | number of nan iterations:   0 |
[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 2, reducing to 1
[Rank 0] step=2500, skipped=1586, lr=[0.0001371, 0.0001371], mom=[(0.9, 0.95), (0.9, 0.95)]
steps: 2500 loss: 13.1 iter time (s): 1.2 samples/sec: 26.6
 iteration     2500/    2500 | consumed samples:        80000 | elapsed time per iteration (ms): 1201.0 | learning rate: 1.371E-04 | global batch size:    32 | lm loss: 1.31E+01 | loss scale: 1.0 | grad norm: 2.1 | number of skipped iterations:   1 | number of nan iterations:   0 |"""  # noqa: E501
    parser = DeepSpeedParser()
    recs = run(parser, meg_ds)
    assert isinstance(parser.host, MegatronParser)
    # Before Megatron was recognised DeepSpeed's own lines count (as one step); after, only
    # Megatron's.
    assert [(r.step, r.step_time_s) for r in steps(recs)] == [
        (2499, 1.202),
        (2499, pytest.approx(1.2054)),
        (2500, pytest.approx(1.201)),
    ]
    assert len(overflows(recs)) == 1

    hf_ds = """\
[Rank 0] step=10, skipped=0, lr=[4.9e-05], mom=[(0.9, 0.999)]
  1%|          | 10/1000 [00:05<08:15,  2.00it/s]
{'loss': 2.4512, 'grad_norm': 1.23, 'learning_rate': 4.9e-05, 'epoch': 0.01}
[Rank 0] step=20, skipped=0, lr=[4.8e-05], mom=[(0.9, 0.999)]"""
    parser = DeepSpeedParser()
    s = steps(run(parser, hf_ds) + parser.finish())
    assert isinstance(parser.host, HFParser)
    # HF's dicts are the step records: DeepSpeed's own step lines add no step beside them.
    assert [(r.step, r.loss) for r in s] == [(10, 2.4512)]


# ---------------------------------------------------------------- Hugging Face

HF_LOG = """\
***** Running training *****
  Num examples = 8,000
  Total optimization steps = 1,000
Map: 100%|██████████| 1000/1000 [00:00<00:00, 5000.00 examples/s]
Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.50s/it]
  0%|          | 0/1000 [00:00<?, ?it/s]
  5%|▌         | 50/1000 [00:25<08:00,  1.98it/s]
{'loss': 2.4512, 'grad_norm': 1.23, 'learning_rate': 4.9e-05, 'epoch': 0.05}
 10%|█         | 100/1000 [00:50<07:30,  2.00it/s]
{'loss': '2.061', 'grad_norm': '0.8', 'learning_rate': '4.8e-05', 'epoch': '0.1'}
  0%|          | 0/63 [00:00<?, ?it/s]
 51%|█████     | 32/63 [00:01<00:01, 25.00it/s]
{'eval_loss': 1.8, 'eval_runtime': 2.5, 'eval_samples_per_second': 200.0, 'eval_steps_per_second': 25.2, 'epoch': 0.1}
 15%|█▌        | 150/1000 [01:15<07:05,  4.00s/it]
{'loss': nan, 'grad_norm': 'nan', 'learning_rate': np.float64(4.7e-05), 'epoch': 0.15}
{'train_runtime': 500.1, 'train_samples_per_second': 16.0, 'train_steps_per_second': 2.0, 'train_loss': 1.8, 'epoch': 1.0}"""  # noqa: E501


def test_hf_dicts_take_step_from_training_bar() -> None:
    parser = HFParser()
    recs = run(parser, HF_LOG)
    s = steps(recs)
    assert [(r.step, r.step_inferred) for r in s] == [(50, False), (100, False), (150, False)]
    a, b, c = s
    assert (a.loss, a.grad_norm, a.learning_rate, a.epoch, a.total_steps) == (
        2.4512,
        1.23,
        4.9e-05,
        0.05,
        1000,
    )
    assert a.step_time_s == 0.5  # 50 steps in 00:25, not tqdm's smoothed 1.98it/s
    assert (b.loss, b.grad_norm, b.learning_rate, b.epoch) == (2.061, 0.8, 4.8e-05, 0.1)
    assert math.isnan(c.loss) and math.isnan(c.grad_norm)  # type: ignore[arg-type]
    # 01:15 includes the evaluation: the rate measured before it stands.
    assert c.learning_rate == 4.7e-05 and c.step_time_s == 0.5
    (ev,) = evals(recs)
    assert ev.step == 100 and ev.eval_loss == 1.8
    assert ev.metrics == {
        "eval_runtime": 2.5,
        "eval_samples_per_second": 200.0,
        "eval_steps_per_second": 25.2,
    }
    assert parser.progress() == (150, 1000)


def test_hf_counts_dicts_without_a_bar() -> None:
    log = "\n".join(
        f"{{'loss': {2.0 - i / 10}, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': {i / 10}}}"
        for i in range(1, 4)
    )
    parser = HFParser()
    s = steps(run(parser, "  Total optimization steps = 3\n" + log))
    # Without a bar the step is not known: the record says so and the state counts it.
    assert [(r.step, r.step_inferred, r.total_steps) for r in s] == [
        (None, True, 3),
        (None, True, 3),
        (None, True, 3),
    ]
    assert parser.progress() is None


def test_hf_bar_that_did_not_move_gives_inferred_next_step() -> None:
    log = """\
 10%|█         | 100/1000 [00:50<07:30,  2.00it/s]
{'loss': 1.9, 'grad_norm': 0.5, 'learning_rate': 4e-05, 'epoch': 0.1}
 19%|█▉        | 190/1000 [01:35<06:45,  2.00it/s]
{'loss': 1.8, 'grad_norm': 0.5, 'learning_rate': 4e-05, 'epoch': 0.2}
{'loss': 1.7, 'grad_norm': 0.5, 'learning_rate': 4e-05, 'epoch': 0.3}"""
    parser = HFParser()
    s = steps(run(parser, log) + parser.finish())  # the last dict waits for a bar that never comes
    assert [(r.step, r.step_inferred) for r in s] == [(100, False), (190, False), (280, True)]


def test_hf_dict_glued_to_and_cut_by_the_bar() -> None:
    log = """\
{'loss': 1.9, 'grad_norm': 0.5, 'learni 10%|█         | 100/1000 [00:50<07:30,  2.00it/s]ng_rate': 4e-05, 'epoch': 0.1}
 20%|██        | 200/1000 [01:40<06:40,  2.00it/s]{'loss': 1.8, 'grad_norm': 0.45, 'learning_rate': 3.5e-05, 'epoch': 0.2}
{'loss': 1.7, 'grad_norm': 0.4, 'learn
 30%|███       | 300/1000 [02:30<05:50,  2.00it/s]
ing_rate': 3e-05, 'epoch': 0.3}
{'loss': 1.65, 'grad_norm': 0.35, 'learning_rate': 2.5e-05, 'epoch': 0.4}   40%|████      | 400/1000 [03:20<05:00,  2.00it/s]"""  # noqa: E501
    parser = HFParser()
    s = steps(run(parser, log))
    got = [(r.step, r.loss, r.grad_norm, r.learning_rate, r.epoch, r.line) for r in s]
    assert got == [
        (100, 1.9, 0.5, 4e-05, 0.1, 1),
        (200, 1.8, 0.45, 3.5e-05, 0.2, 2),
        (300, 1.7, 0.4, 3e-05, 0.3, 3),
        (400, 1.65, 0.35, 2.5e-05, 0.4, 6),
    ]
    assert parser.progress() == (400, 1000)


def test_hf_dict_never_finished_keeps_only_whole_pairs() -> None:
    log = """\
 10%|█         | 100/1000 [00:50<07:30,  2.00it/s]
{'loss': 1.9, 'grad_norm': 0.5, 'learning_rate': 4
 11%|█         | 110/1000 [00:55<07:25,  2.00it/s]
 12%|█▏        | 120/1000 [01:00<07:20,  2.00it/s]
 13%|█▎        | 130/1000 [01:05<07:15,  2.00it/s]
 14%|█▍        | 140/1000 [01:10<07:10,  2.00it/s]
 15%|█▌        | 150/1000 [01:15<07:05,  2.00it/s]"""
    (rec,) = steps(feed("hf", log))
    assert (rec.loss, rec.grad_norm, rec.learning_rate) == (1.9, 0.5, None)


def test_hf_finish_flushes_a_dict_cut_at_end_of_stream() -> None:
    for parser in (HFParser(), DeepSpeedParser()):
        run(
            parser, " 10%|█         | 100/1000 [00:50<07:30,  2.00it/s]\n{'loss': 1.9, 'grad_norm': 0.5, 'lea"
        )
        (rec,) = parser.finish()  # type: ignore[attr-defined]
        assert isinstance(rec, StepRecord) and (rec.step, rec.loss, rec.grad_norm) == (100, 1.9, 0.5)
        assert parser.finish() == []  # type: ignore[attr-defined]


def test_hf_evaluate_before_train_does_not_hijack_the_step() -> None:
    log = """\
  0%|          | 0/63 [00:00<?, ?it/s]
100%|██████████| 63/63 [00:02<00:00, 25.00it/s]
{'eval_loss': 2.5, 'eval_runtime': 2.5, 'epoch': 0}
  0%|          | 0/1000 [00:00<?, ?it/s]
  1%|          | 10/1000 [00:05<08:15,  2.00it/s]
{'loss': 2.4, 'grad_norm': 1.0, 'learning_rate': 5e-05, 'epoch': 0.01}"""
    parser = HFParser()
    recs = run(parser, log)
    assert [(r.step, r.step_inferred) for r in steps(recs)] == [(10, False)]
    assert evals(recs)[0].step == 63
    assert parser.progress() == (10, 1000)


def test_hf_overflow_lines_inside_hf_log() -> None:
    log = """\
  0%|          | 0/189 [00:00<?, ?it/s]
 [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 262144, reducing to 131072.0
  1%|▌         | 1/189 [00:00<01:26,  2.17it/s] [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 131072.0, reducing to 65536.0"""  # noqa: E501
    parser = HFParser()
    ov = overflows(run(parser, log))
    assert [(o.old_scale, o.new_scale) for o in ov] == [(262144.0, 131072.0), (131072.0, 65536.0)]
    assert parser.progress() == (1, 189)


# ---------------------------------------------------------------- Lightning

LIGHTNING_LOG = """\
Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 10.00it/s]
Epoch 0:  50%|█████     | 50/100 [00:12<00:12,  4.00it/s, v_num=0, train_loss=2.900]
Epoch 0:  50%|█████     | 50/100 [00:12<00:12,  4.00it/s, v_num=0, train_loss=2.900]
Validation DataLoader 0:  40%|████      | 4/10 [00:00<00:00, 20.00it/s]
Epoch 0: 100%|██████████| 100/100 [00:25<00:00,  4.00it/s, v_num=0, train_loss=2.500, val_loss=2.600]
Epoch 1:  45%|████▌     | 45/100 [00:12<00:15,  3.61it/s, v_num=0, train_loss=2.340, val_loss=2.600]
Epoch 1: 100%|██████████| 100/100 [00:25<00:00,  4.00it/s, v_num=0, train_loss=nan, val_loss=nan]
Epoch 2:   1%|          | 1/100 [00:00<00:25,  4.00it/s, v_num=0, train_loss=nan, val_loss=nan]"""


def feed_all(fmt: str, text: str) -> list[Record]:
    """``feed`` and the end of the stream: parsers that hold the latest step give it out."""
    parser = make_parser(fmt)
    return run(parser, text) + parser.finish()  # type: ignore[attr-defined]


def test_lightning_bar() -> None:
    recs = feed_all("lightning", LIGHTNING_LOG)
    s = steps(recs)
    assert [(r.step, r.epoch) for r in s] == [(50, 0.0), (100, 0.0), (145, 1.0), (200, 1.0), (201, 2.0)]
    assert s[0].loss == 2.9 and s[0].step_time_s == 0.25
    assert s[2].loss == 2.34 and s[2].step_time_s == pytest.approx(1 / 3.61)
    assert math.isnan(s[3].loss)  # type: ignore[arg-type]
    ev = evals(recs)
    assert [e.step for e in ev] == [100, 200]  # once per new value
    assert ev[0].eval_loss == 2.6 and math.isnan(ev[1].eval_loss)  # type: ignore[arg-type]


def test_lightning_bar_without_total_and_rich_bar() -> None:
    log = """\
Epoch 0: 10it [00:02,  4.00it/s, v_num=1, loss=3.1]
Epoch 0: 20it [00:05,  4.00it/s, v_num=1, loss=3.0]
Epoch 1: 5it [00:01,  4.00it/s, v_num=1, loss=2.9]"""
    assert [(r.step, r.loss) for r in steps(feed_all("lightning", log))] == [(10, 3.1), (20, 3.0), (25, 2.9)]
    slow = "Epoch 0:  10%|█ | 10/100 [00:15<02:15,  1.50s/it, v_num=0, train_loss=3.0]\n" + (
        "Epoch 0:  11%|█ | 11/100 [00:16<02:13,  1.50s/it, v_num=0, train_loss=2.5]"
    )
    assert [(r.step, r.loss, r.step_time_s) for r in steps(feed_all("lightning", slow))] == [
        (10, 3.0, 1.5),
        (11, 2.5, 1.5),
    ]
    redraws = (
        "\r".join(f"Epoch 0: {i}it [00:0{i},  1.00it/s, v_num=1, loss=3.{i}]" for i in range(1, 4)) + "\r"
    )
    assert [(r.step, r.loss) for r in steps(feed_all("lightning", redraws))] == [(3, 3.3)]
    rich = (
        "Epoch 2/9  ━━━━━━━━━━━━━╸━━━━━━━━━━━━━ 45/100 0:00:12 • 0:00:15 3.61it/s v_num: 0 train_loss: 2.340"
    )
    (rec,) = steps(feed_all("lightning", rich))
    assert (rec.step, rec.total_steps, rec.loss, rec.epoch) == (245, 1000, 2.34, 2.0)


def test_lightning_csv() -> None:
    csv = """\
epoch,lr-AdamW,step,train_loss,val_loss
0,,49,2.345,
0,0.001,49,,
0,,99,2.1,
0,,99,,2.2
1,,149,nan,"""
    recs = feed("lightning_csv", csv)
    assert [(r.step, r.loss, r.epoch) for r in steps(recs)][:2] == [(49, 2.345, 0.0), (99, 2.1, 0.0)]
    assert math.isnan(steps(recs)[2].loss)  # type: ignore[arg-type]
    (ev,) = evals(recs)
    assert (ev.step, ev.eval_loss) == (99, 2.2)
    # A rewritten file with a wider header replaces the columns.
    wider = "epoch,step,train_loss,val_acc,val_loss\n2,199,1.9,,\n2,199,,0.71,2.0"
    recs = feed("lightning_csv", wider)
    assert evals(recs)[0].metrics == {"val_acc": 0.71}


# ---------------------------------------------------------------- nanoGPT, torchtitan

NANOGPT_LOG = """\
step 0: train loss 10.9853, val loss 10.9850
iter 0: loss 10.9868, time 30728.83ms, mfu -100.00%
iter 10: loss 9.4321, time 123.45ms, mfu 12.34%
iter 20: loss nan, time 125.00ms, mfu 12.30%
step 250: train loss 4.1234, val loss 4.2345"""


def test_nanogpt() -> None:
    recs = feed("nanogpt", NANOGPT_LOG)
    a, b, c = steps(recs)
    assert (a.step, a.loss, a.step_time_s, a.mfu) == (0, 10.9868, pytest.approx(30.72883), None)
    assert (b.step, b.loss, b.step_time_s, b.mfu) == (
        10,
        9.4321,
        pytest.approx(0.12345),
        pytest.approx(0.1234),
    )
    assert math.isnan(c.loss)  # type: ignore[arg-type]
    e0, e1 = evals(recs)
    assert (e1.step, e1.eval_loss, e1.metrics) == (250, 4.2345, {"train_loss": 4.1234})
    assert e0.step == 0


TORCHTITAN_LOG = """\
\x1b[31mstep:  1  \x1b[32mloss: 12.2365  \x1b[33mgrad_norm:  4.1023  \x1b[38;2;54;234;195mmemory: 47.32GiB(49.81%)  \x1b[34mtps: 1,287  \x1b[36mtflops: 74.53  \x1b[35mmfu: 7.54%\x1b[39m
step: 10  loss:    nan  grad_norm:    nan  memory: 52.10GiB(54.84%)  tps: 5,123  tflops: 296.70  mfu: 30.00%
step:  2  loss: 10.8000  memory:  5.35GiB(6.70%)  wps: 8,390  mfu: 4.59%
\x1b[33mvalidate step: 10  \x1b[32mloss:  8.9012  \x1b[38;2;54;234;195mmemory: 52.10GiB(54.84%)  \x1b[34mtps: 9,876\x1b[39m"""  # noqa: E501


def test_torchtitan() -> None:
    recs = feed("torchtitan", TORCHTITAN_LOG)
    a, b, c = steps(recs)
    assert (a.step, a.loss, a.grad_norm, a.tokens_per_s, a.tflops) == (1, 12.2365, 4.1023, 1287.0, 74.53)
    assert a.mfu == pytest.approx(0.0754) and a.max_memory_bytes == pytest.approx(47.32 * GIB)
    assert math.isnan(b.loss) and math.isnan(b.grad_norm)  # type: ignore[arg-type]
    assert (c.step, c.tokens_per_s, c.grad_norm) == (2, 8390.0, None)
    (ev,) = evals(recs)
    assert (ev.step, ev.eval_loss) == (10, 8.9012)


# ---------------------------------------------------------------- generic formats


def test_json_lines() -> None:
    log = """\
{"step": 10, "loss": 2.3, "lr": 1e-4, "grad_norm": 0.9, "tokens_per_sec": 1234.5, "mfu": 41.2}
{"iteration": 20, "train/loss": NaN, "train/learning_rate": 9e-5, "step_time_ms": 250, "loss_scale": 1024}
{"global_step": 30, "eval": {"loss": 2.1, "accuracy": 0.5}}
{"step": 40, "loss": "inf", "val_loss": 2.0}"""
    recs = feed("json", log)
    a, b, c = steps(recs)
    assert (a.step, a.loss, a.learning_rate, a.grad_norm, a.tokens_per_s) == (10, 2.3, 1e-4, 0.9, 1234.5)
    assert a.mfu == pytest.approx(0.412)
    assert b.step == 20 and math.isnan(b.loss) and b.step_time_s == 0.25 and b.loss_scale == 1024  # type: ignore[arg-type]
    assert c.loss == math.inf
    e1, e2 = evals(recs)
    assert (e1.step, e1.eval_loss, e1.metrics) == (30, 2.1, {"eval/accuracy": 0.5})
    assert (e2.step, e2.eval_loss) == (40, 2.0)


def test_kv_lines() -> None:
    log = """\
step=10 loss=2.45 lr=6.67e-05 grad_norm=1.1
Step 20: loss=2.40, lr=6.5e-05
Epoch 1 Step 30 | loss: 2.35 | lr: 1e-4
step    40/1000 | loss: 2.300000 | lr 6.0000e-04 | norm: 0.4521 | dt: 412.34ms | tok/sec: 1271512.29
step 50 loss=nan
step 60 | train loss 2.2 | val loss 2.3"""
    recs = feed("kv", log)
    s = steps(recs)
    assert [(r.step, r.loss) for r in s][:4] == [(10, 2.45), (20, 2.40), (30, 2.35), (40, 2.3)]
    assert (s[0].learning_rate, s[0].grad_norm) == (6.67e-05, 1.1)
    assert s[2].epoch == 1.0 and s[2].learning_rate == 1e-4
    assert (s[3].total_steps, s[3].grad_norm, s[3].step_time_s, s[3].tokens_per_s) == (
        1000,
        0.4521,
        pytest.approx(0.41234),
        1271512.29,
    )
    assert math.isnan(s[4].loss)  # type: ignore[arg-type]
    (ev,) = evals(recs)
    assert (ev.step, ev.eval_loss) == (60, 2.3)


def test_kv_does_not_mistake_timestamps_or_bare_memory_for_metrics() -> None:
    log = """\
Time: 2023-12-11 16:39:28, Epoch: 0, Step: 5, Rank: 0, loss = 7.7890625
step 10/100: loss 2.3 | time 120ms | mem 12.5GB
Epoch 1 | step 30 | loss: 2.35 | memory: 10.5 | time: 1700000000.5"""
    a, b, c = steps(feed("kv", log))
    assert (a.step, a.epoch, a.loss, a.step_time_s) == (5, 0.0, 7.7890625, None)
    assert (b.step, b.total_steps, b.step_time_s, b.memory_bytes) == (10, 100, 0.12, 12.5 * GIB)
    assert (c.step, c.memory_bytes, c.step_time_s) == (30, None, None)
    (j,) = steps(feed("json", '{"time": 1700000000.5, "step": 3, "loss": 2.0, "memory": 123456789}'))
    assert (j.step, j.step_time_s, j.memory_bytes) == (3, None, None)


def test_regex_parser() -> None:
    pattern = (
        r"it (?P<step>\d+)/(?P<total_steps>\d+) L=(?P<loss>\S+) mfu=(?P<mfu>[\d.]+%?) vl=(?P<eval_loss>\S+)?"
    )
    recs = feed("regex", "it 5/100 L=nan mfu=40% vl=3.5\nit 6/100 L=2.0 mfu=0.4 vl=\nnoise", regex=pattern)
    a, b = steps(recs)
    assert (a.step, a.total_steps, a.mfu) == (5, 100, 0.4) and math.isnan(a.loss)  # type: ignore[arg-type]
    assert (b.step, b.loss, b.mfu) == (6, 2.0, 0.4)
    (ev,) = evals(recs)
    assert (ev.step, ev.eval_loss) == (5, 3.5)


@pytest.mark.parametrize("pattern", ["(?P<step>\\d+", "loss (\\d+)", "(?P<foo>x)"])
def test_regex_parser_rejects_bad_patterns(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"logs\.regex"):
        make_parser("regex", regex=pattern)


def test_registry() -> None:
    assert FORMATS[-3:] == ("json", "kv", "regex")
    assert set(FORMATS) == {
        "hf",
        "llmc",
        "mlagents",
        "olmo",
        "lightning",
        "lightning_csv",
        "megatron",
        "deepspeed",
        "nanogpt",
        "torchtitan",
        "json",
        "kv",
        "regex",
    }
    with pytest.raises(ValueError, match="unknown log format"):
        make_parser("fairseq")
    with pytest.raises(ValueError):
        make_parser("regex")
    assert make_parser("hf") is not make_parser("hf")


# ---------------------------------------------------------------- sniffing

SNIFF_SAMPLES: dict[str, list[str]] = {
    "megatron": [MEGATRON_LOG.splitlines()[2], MEGATRON_LOG.splitlines()[4], MEGATRON_LOG.splitlines()[7]],
    "deepspeed": [DEEPSPEED_LOG.splitlines()[i] for i in (1, 2, 3, 4, 5, 6, 9)],
    "hf": [HF_LOG.splitlines()[i] for i in (7, 9, 12, 14, 15)],
    "lightning": [LIGHTNING_LOG.splitlines()[1], "Epoch 0: 10it [00:02,  4.00it/s, v_num=1, loss=3.1]"],
    "lightning_csv": [
        "epoch,step,train_loss,val_loss",
        "epoch,lr-AdamW,step,train_loss_step,val_acc,val_loss",
    ],
    "nanogpt": NANOGPT_LOG.splitlines(),
    "torchtitan": TORCHTITAN_LOG.splitlines(),
    "json": ['{"step": 10, "loss": 2.3, "lr": 1e-4}', '{"iteration": 20, "train/loss": NaN}'],
    "kv": [
        "step=10 loss=2.45 lr=6.67e-05",
        "Step 20: loss=2.40, lr=6.5e-05",
        "Epoch 1 Step 30 | loss: 2.35 | lr: 1e-4",
    ],
}


@pytest.mark.parametrize("fmt", sorted(SNIFF_SAMPLES))
def test_sniff_recognises_own_format_only(fmt: str) -> None:
    for line in SNIFF_SAMPLES[fmt]:
        assert sniff_format(line) == fmt, line
        others = [f for f in FORMATS if f not in (fmt, "regex") and make_parser(f).sniff(line)]
        assert others == [], line


@pytest.mark.parametrize("line", NCCL_NOISE + OTHER_NOISE + [HF_LOG.splitlines()[i] for i in (3, 5, 6)])
def test_noise_sniffs_as_nothing_and_parses_to_nothing(line: str) -> None:
    assert sniff_format(line) is None
    for fmt in FORMATS:
        if fmt != "regex":
            assert make_parser(fmt).parse(LogLine(line, 1)) == [], fmt


def test_tolerates_stray_ansi_and_indent() -> None:
    line = "\x1b[0m   iter 10: loss 9.4321, time 123.45ms, mfu 12.34%\x1b[0m"
    assert sniff_format(line) == "nanogpt"
    assert steps(feed("nanogpt", line))[0].loss == 9.4321
    hf = "\x1b[32m{'loss': 1.5, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.5}\x1b[0m"
    assert sniff_format(hf) == "hf"
    assert steps(feed("hf", hf))[0].loss == 1.5


# ---------------------------------------------------------------- llm.c, OLMo, OpenMMLab (wild formats)


def test_mlagents_console_summaries() -> None:
    """ML-Agents' ConsoleWriter (mlagents/trainers/stats.py): the step of each summary, no loss.
    0.x lines from the wild batch 11 case (mlagents_findthetarget_gpu_healthy.log); the 1.x form
    as stats.py joins its parts (". ".join, "Time Elapsed: {:0.3f} s")."""
    log = (
        "INFO:mlagents.trainers: gpu_test: FindTheTarget: Step: 15000. Time Elapsed: 80.900 s Mean Reward: 0.333. Std of Reward: 0.471. Training.\n"  # noqa: E501
        "3DBall. Step: 12000. Time Elapsed: 15.112 s. Mean Reward: 1.173. Std of Reward: 0.705. Training.\n"
        "3DBall. Step: 24000. Time Elapsed: 30.201 s. No episode was completed since last summary. Training.\n"  # noqa: E501
        "Time Elapsed: 3 s of the data download\n"
    )
    recs = feed("mlagents", log)
    assert [(r.step, r.loss) for r in recs] == [(15000, None), (12000, None), (24000, None)]
    assert [sniff_format(t) for t in log.splitlines()] == ["mlagents", "mlagents", "mlagents", None]


def test_llmc_logfile() -> None:
    # karpathy/llm.c's main.log as committed in KellerJordan/modded-nanogpt (records/*_llmc, *_AdamW).
    log = """\
s:0 tel:11.0092
s:0 trl:11.0091 lr:0.000001 norm:15.37
s:1 trl:10.9598 lr:0.000002 norm:15.24
s:250 eval:0.2512
s:9535 trl:3.340180"""
    recs = feed("llmc", log)
    s = steps(recs)
    assert [(r.step, r.loss, r.learning_rate, r.grad_norm) for r in s] == [
        (0, 11.0091, 1e-6, 15.37),
        (1, 10.9598, 2e-6, 15.24),
        (9535, 3.34018, None, None),
    ]
    (ev,) = evals(recs)  # HellaSwag's "eval:" is an accuracy, not a loss
    assert (ev.step, ev.eval_loss) == (0, 11.0092)


def test_llmc_console() -> None:
    log = """\
val loss 11.129390
step    1/32000 | loss 11.133732 (+nanz)| norm 52.9732 (+nanz)| lr 8.57e-07 | 3056.36 ms | 42.6% bf16 MFU | 343080 tok/s
step    2/1765 | loss 10.958870 (+nanz)| norm 22.0987 (+nanz)| lr 1.71e-06 | 2679.79 ms | -100.0% bf16 MFU | 195645 tok/s
step 19560/19560 | loss 3.252871 (-1.21z)| norm 0.2281 (+0.02z)| lr 0.00e+00 | 4367.96 ms | 30.9% bf16 MFU | 124072 tok/s
val loss 3.265413
step    1/74 | train loss 4.367631 | norm 1.2345 | lr 3.00e-04 | 80.64 ms | 6350 tok/s
step 1/74: train loss 4.367631 (80.639749 ms, 6350 tok/s)"""  # noqa: E501
    recs = feed("llmc", log)
    a, b, c, d, e = steps(recs)
    assert (a.step, a.total_steps, a.loss, a.grad_norm, a.learning_rate) == (
        1,
        32000,
        11.133732,
        52.9732,
        8.57e-7,
    )
    assert (a.step_time_s, a.mfu, a.tokens_per_s) == (pytest.approx(3.05636), pytest.approx(0.426), 343080)
    assert b.mfu is None  # -100% is "not measured yet"
    assert (c.step, c.grad_norm) == (19560, 0.2281)
    assert (d.loss, d.grad_norm, d.tokens_per_s) == (4.367631, 1.2345, 6350)
    assert (e.step, e.loss, e.step_time_s, e.tokens_per_s) == (1, 4.367631, pytest.approx(0.0806397), 6350)
    first, last = evals(recs)
    assert (first.step, last.step, last.eval_loss) == (None, 19560, 3.265413)


def test_llmc_sniff() -> None:
    assert sniff_format("s:0 trl:10.965596") == "llmc"
    assert sniff_format("s:0 tel:11.0092") == "llmc"
    assert (
        sniff_format(
            "step    1/32000 | loss 11.133732 (+nanz)| norm 52.9732 (+nanz)| lr 8.57e-07 | 3056.36 ms"
        )
        == "llmc"
    )


OLMO_LOG = """\
[2024-04-18 19:06:05] INFO     [olmo.train:816, rank=0] [step=74/739328]
    train/CrossEntropyLoss=7.525
    train/Perplexity=1,853
    optim/total_grad_norm=0.4118
    throughput/device/tokens_per_second=9,407
    System/Peak GPU Memory (MB)=42,133
INFO     [olmo.train:816, rank=0] [step=75/739328,epoch=0]
    train/CrossEntropyLoss=nan
    eval/v3-small-c4_en-validation/CrossEntropyLoss=3.5
CRITICAL [olmo.util:158, rank=0] Uncaught OLMoThreadError: generator thread data thread 3 failed
[step=30000/30000, eta=1 minute]
    train/CE loss=1.2345"""


def test_olmo_multiline_records() -> None:
    parser = make_parser("olmo")
    recs = run(parser, OLMO_LOG)
    recs += parser.finish()  # type: ignore[attr-defined]
    a, b, c = steps(recs)
    assert (a.step, a.total_steps, a.loss, a.grad_norm, a.tokens_per_s) == (74, 739328, 7.525, 0.4118, 9407)
    assert a.max_memory_bytes == 42133 * MIB and a.line == 1 and a.rank == 0
    assert b.step == 75 and math.isnan(b.loss)  # type: ignore[arg-type]
    assert (c.step, c.total_steps, c.loss, c.rank) == (30000, 30000, 1.2345, 3)  # no rank=: the stream's
    (ev,) = evals(recs)
    assert (ev.step, ev.eval_loss) == (75, 3.5)
    assert sniff_format("INFO     [olmo.train:816, rank=0] [step=1/739328]") == "olmo"


def test_openmmlab_and_epoch_counters_in_kv() -> None:
    log = """\
10/30 22:19:57 - mmengine - INFO - Epoch(train) [2][240/735]  lr: 1.9813e-04  eta: 2:44:49  time: 2.8874  loss: 2.5128  grad_norm: nan
2021-11-22 01:32:34,502 - mmocr - INFO - Epoch [1][200/62598]\tlr: 1.000e-03, eta: 7 days, 15:55:58, time: 0.705, loss: 0.9186, grad_norm: 3.9772
Iter(train) [  200/10000]  lr: 1.0e-04  loss: 3.1
epoch: 3451 loss: nan"""  # noqa: E501
    a, b, c, d = steps(feed("kv", log))
    assert (a.step, a.loss) == (735 + 240, 2.5128) and math.isnan(a.grad_norm)  # type: ignore[arg-type]
    assert (b.step, b.grad_norm) == (200, 3.9772)
    assert (c.step, c.total_steps) == (200, 10000)
    assert (d.step, d.epoch) == (3451, 3451) and math.isnan(d.loss)  # type: ignore[arg-type]
    assert sniff_format("epoch: 3442 loss: 0.2105546216666698") == "kv"
    assert sniff_format("{'loss': 0.2051, 'grad_norm': nan, 'learning_rate': 9.7e-06, 'epoch': 0.53}") == "hf"


def test_megatron_nan_is_a_missing_loss_cell() -> None:
    # epfLLM/Megatron-LLM#33: training_log prints a loss only when its average is positive.
    head = (
        " iteration {it:>8}/    8000 | consumed samples: {c:>8} | elapsed time per iteration (ms): 7613.1 | "
    )
    tail = "loss scale: 1.0 | grad norm: 0.752 | number of skipped iterations: {sk:>3} | number of nan iterations: {n:>3} |"  # noqa: E501
    line = head + "learning rate: 6.680E-06 | global batch size:    64 | lm loss: 7.334521E-01 | " + tail
    no_loss = head + "learning rate: 6.680E-06 | global batch size:    64 | " + tail
    log = "\n".join(
        [
            line.format(it=1, c=64, sk=0, n=0),
            no_loss.format(it=2, c=128, sk=1, n=0),  # fp16: every iteration of the interval skipped
            line.format(it=3, c=192, sk=0, n=0),
            no_loss.format(it=4, c=256, sk=0, n=0),  # the loss was NaN
            no_loss.format(it=5, c=320, sk=0, n=1),
            line.format(it=6, c=384, sk=0, n=2),  # NaN iterations counted while a loss is printed
        ]
    )
    s = steps(feed("megatron", log))
    assert [r.step for r in s] == [1, 2, 3, 4, 5, 6]
    assert s[0].loss == pytest.approx(0.7334521) and s[1].loss is None and s[2].loss is not None
    assert all(math.isnan(r.loss) for r in s[3:])  # type: ignore[arg-type]
    # A run that never prints its main loss is not read as NaN.
    assert steps(feed("megatron", no_loss.format(it=1, c=64, sk=0, n=0)))[0].loss is None


def test_torchtitan_same_step_from_several_ranks_counts_once() -> None:
    # pytorch/torchtitan#2389: seven ranks print the same step on one unprefixed stream.
    line = "[titan] 2026-02-24 19:46:17,508 - root - INFO - step:  {s}  loss:  7.62585  grad_norm: 26.6250  memory: 66.91GiB(37.51%)  tps: 10,050  tflops: 314.69  mfu: 13.99%"  # noqa: E501
    log = "\n".join(
        [line.format(s=4)] * 7
        + [line.format(s=5)] * 7
        + ["validate step: 5  loss: 7.1  memory: 1.0GiB(1%)  tps: 1"]
    )
    recs = feed("torchtitan", log)
    assert [r.step for r in steps(recs)] == [4, 5]
    assert [e.step for e in evals(recs)] == [5]


# Printed by a real Lightning 2.6 TQDMProgressBar (tests/golden/gen_lightning.py
# lightning_tqdm_nan30): each step is drawn, then drawn again with the postfix it logged;
# a NaN shows as ``nan.0``; each epoch starts with a ``0/18`` redraw.
REAL_LIGHTNING = [
    "Epoch 0:   0%|          | 0/18 [00:00<?, ?it/s]",
    "Epoch 0: 100%|██████████| 18/18 [00:00<00:00, 37.11it/s, v_num=0, train_loss=1.500]",
    "Epoch 0: 100%|██████████| 18/18 [00:00<00:00, 32.62it/s, v_num=0, train_loss=1.500, val_loss=1.340]",
    "Epoch 0:   0%|          | 0/18 [00:00<?, ?it/s, v_num=0, train_loss=1.500, val_loss=1.340]         ",
    "Epoch 1:   0%|          | 0/18 [00:00<?, ?it/s, v_num=0, train_loss=1.500, val_loss=1.340]",
    "Epoch 1:  61%|██████    | 11/18 [00:00<00:00, 45.71it/s, v_num=0, train_loss=1.610, val_loss=1.340]",
    "Epoch 1:  67%|██████▋   | 12/18 [00:00<00:00, 46.74it/s, v_num=0, train_loss=1.610, val_loss=1.340]",
    "Epoch 1:  67%|██████▋   | 12/18 [00:00<00:00, 46.67it/s, v_num=0, train_loss=nan.0, val_loss=1.340]",
    "Epoch 1:  72%|███████▏  | 13/18 [00:00<00:00, 46.34it/s, v_num=0, train_loss=nan.0, val_loss=1.340]",
]


def test_lightning_real_bar_zero_is_no_step_and_the_second_drawing_holds_the_values() -> None:
    s = steps(feed_all("lightning", "\n".join(REAL_LIGHTNING)))
    assert [r.step for r in s] == [18, 29, 30, 31]
    assert s[1].loss == 1.61 and math.isnan(s[2].loss)  # type: ignore[arg-type]


@pytest.mark.parametrize("epoch", ["1e400", "'1e400'", "0e400", "-1e999", "nan"])
def test_hf_dict_with_an_epoch_past_float_range_is_read_not_raised(epoch: str) -> None:
    """Found by hypothesis: an epoch float() reads as inf made the step-precision arithmetic
    overflow, and the parser raised on the line instead of reading its loss."""
    recs = feed("hf", f"{{'loss': 2.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': {epoch}}}\n")
    assert [r.loss for r in steps(recs)] == [2.5]
