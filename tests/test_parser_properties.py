"""No text can make a parser raise, and numbers survive the trip through each format."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from rankwatch.records import EvalRecord, OverflowRecord, StepRecord
from rankwatch.sources.parsers import FORMATS, make_parser, sniff_format
from rankwatch.sources.parsers.base import FormatParser, LogLine

pytestmark = pytest.mark.unit

PARSED = [f for f in FORMATS if f != "regex"]

REAL_LINES = [
    " [2024-05-01 10:00:00] iteration      100/  500000 | consumed samples:        12800 | elapsed time per "
    "iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 180.2 | learning rate: 3.000000E-04 | global "
    "batch size:   128 | lm loss: 6.543210E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped "
    "iterations:   0 | number of nan iterations:   0 |",
    " validation loss at iteration 1000 | lm loss value: 5.432E+00 | lm loss PPL: 2.3E+02 |",
    "[Rank 0] step=100, skipped=2, lr=[0.0001], mom=[(0.9, 0.999)]",
    "steps: 100 loss: 2.3456 iter time (s): 0.512 samples/sec: 250.1",
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    "Reducing dynamic loss scale from 65536 to 32768.0",
    "Grad overflow on iteration 12",
    "epoch=0/micro_step=2000/global_step=2000, RunningAvgSamplesPerSec=1755.8, CurrSamplesPerSec=1681.6, "
    "MemAllocated=0.0GB, MaxMemAllocated=0.0GB",
    "  5%|▌         | 50/1000 [00:25<08:00,  1.98it/s]",
    "{'loss': 2.4512, 'grad_norm': 1.23, 'learning_rate': 4.9e-05, 'epoch': 0.01}",
    "{'loss': '2.061', 'grad_norm': 'nan', 'learning_rate': '4.9e-05', 'epoch': '0.01'}",
    "{'eval_loss': 2.1, 'eval_runtime': 1.2, 'eval_samples_per_second': 100.0, 'epoch': 0.1}",
    "{'loss': 1.9, 'grad_norm': 0.5, 'learni 10%|█  | 100/1000 [00:50<07:30, 2.00it/s]ng_rate': 4e-05}",
    "Epoch 3:  45%|████▌     | 45/100 [00:12<00:15,  3.61it/s, v_num=0, train_loss=2.340, val_loss=2.1]",
    "Epoch 2/9  ━━━━━━━━━━━━━╸━━━━━━━━━━━━━ 45/100 0:00:12 • 0:00:15 3.61it/s v_num: 0 train_loss: 2.340",
    "epoch,step,train_loss,val_loss",
    "0,49,2.345,",
    "iter 100: loss 2.3456, time 123.45ms, mfu 12.34%",
    "step 200: train loss 2.1234, val loss 2.2345",
    "\x1b[31mstep:  1  \x1b[32mloss: 12.2365  \x1b[33mgrad_norm:  4.1023  \x1b[36mmemory: 47.32GiB(49.81%)  "
    "\x1b[34mtps: 1,287  \x1b[36mtflops: 74.53  \x1b[35mmfu: 7.54%\x1b[39m",
    "validate step: 10  loss:  8.9012  memory: 52.10GiB(54.84%)  tps: 9,876",
    '{"step": 10, "loss": 2.3, "lr": 1e-4, "eval": {"loss": 2.1}}',
    "step=10 loss=2.45 lr=6.67e-05",
    "Epoch 1 Step 10 | loss: 2.45 | lr: 1e-4",
    "node01:1234:1300 [0] NCCL INFO Channel 00/02 :    0   1",
]

NASTY = [
    "1e400",
    "-1e400",
    "9" * 5000,
    "nan",
    "-inf",
    "NaN",
    "{",
    "}",
    "{'",
    "'",
    '"',
    "|",
    "%|",
    "[",
    "]",
    "\x00",
    "\x1b[",
    "\r",
    "\u2028",
    "٣",
    "²",
    ":",
    "=",
    ",",
    "E+",
    "0x1F",
]

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.floats(min_value=1e-8, max_value=1e6, allow_nan=False),
)

fast = settings(max_examples=fuzz_examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _parsers() -> list[FormatParser]:
    out = [make_parser(f) for f in PARSED]
    out.append(make_parser("regex", regex=r"step (?P<step>\S+) loss (?P<loss>\S+) mfu (?P<mfu>\S+)"))
    return out


def _check_record(rec: object) -> None:
    assert isinstance(rec, (StepRecord, EvalRecord, OverflowRecord))
    for name in ("step", "total_steps", "skipped_iters", "nan_iters"):
        v = getattr(rec, name, None)
        assert v is None or (isinstance(v, int) and not isinstance(v, bool)), (name, v)
    if isinstance(rec, StepRecord) and rec.mfu is not None and math.isfinite(rec.mfu):
        assert rec.mfu >= 0
    if isinstance(rec, EvalRecord):
        assert all(isinstance(v, float) for v in rec.metrics.values())


def _feed_all(lines: list[str]) -> None:
    for parser in _parsers():
        for i, text in enumerate(lines, 1):
            parser.sniff(text)
            for rec in parser.parse(LogLine(text, i, rank=0, time=1.0)):
                _check_record(rec)
    for text in lines:
        assert sniff_format(text) in (*FORMATS, None)


@fast
@given(st.lists(st.text(max_size=300), max_size=8))
def test_arbitrary_text_never_raises(lines: list[str]) -> None:
    _feed_all(lines)


@fast
@given(
    st.lists(
        st.text(alphabet=st.sampled_from(list("{}'\":|,=%[] .-+eE0123456789nanif/\r\x1b")), max_size=200)
    )
)
def test_punctuation_soup_never_raises(lines: list[str]) -> None:
    _feed_all(lines)


@st.composite
def mutated_real_lines(draw: st.DrawFn) -> list[str]:
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        text = draw(st.sampled_from(REAL_LINES))
        for _ in range(draw(st.integers(0, 4))):
            pos = draw(st.integers(0, len(text)))
            op = draw(st.sampled_from(["insert", "delete", "replace", "cut"]))
            piece = draw(st.one_of(st.sampled_from(NASTY), st.text(max_size=4)))
            if op == "insert":
                text = text[:pos] + piece + text[pos:]
            elif op == "delete":
                text = text[:pos] + text[pos + draw(st.integers(1, 8)) :]
            elif op == "replace":
                text = text[:pos] + piece + text[pos + len(piece) :]
            else:
                text = text[:pos]
        lines.append(text)
    return lines


@settings(max_examples=fuzz_examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_real_lines())
def test_near_misses_never_raise(lines: list[str]) -> None:
    _feed_all(lines)


def _one(fmt: str, text: str) -> StepRecord:
    parser = make_parser(fmt)
    out = list(parser.parse(LogLine(text, 1)))
    finish = getattr(parser, "finish", None)
    if finish is not None:  # a parser may hold a record until it knows its step (HF: the bar after it)
        out += list(finish())
    (rec,) = [r for r in out if isinstance(r, StepRecord)]
    return rec


def _same(got: float | None, want: float, rel: float) -> bool:
    if got is None:
        return False
    if math.isnan(want):
        return math.isnan(got)
    if math.isinf(want):
        return got == want
    return math.isclose(got, want, rel_tol=rel, abs_tol=1e-300)


LOSS_TEMPLATES = {
    "megatron": (
        " iteration       10/     100 | learning rate: 1.0E-04 | lm loss: {} | loss scale: 1.0 |",
        ".6E",
    ),
    "deepspeed": ("steps: 10 loss: {} iter time (s): 0.5 samples/sec: 1.0", "0.4f"),
    "nanogpt": ("iter 10: loss {}, time 12.00ms, mfu 1.00%", ".4f"),
    "torchtitan": ("step: 10  loss: {}  memory:  5.35GiB(6.70%)  tps: 8,390  mfu: 4.59%", "7.4f"),
    "hf": ("{{'loss': {}, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}}", "r"),
    "kv": ("step=10 loss={} lr=1e-05", "r"),
    "lightning": ("Epoch 0:  10%|█         | 10/100 [00:01<00:09,  9.0it/s, v_num=0, train_loss={}]", ".3g"),
    "json": ('{{"step": 10, "loss": {}}}', "r"),
}


@fast
@given(NUMBERS)
def test_loss_survives_every_format(x: float) -> None:
    for fmt, (template, spec) in LOSS_TEMPLATES.items():
        shown = repr(x) if spec == "r" else format(x, spec)
        if fmt == "json":
            shown = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(shown, shown)
        text = template.format(shown)
        got = _one(fmt, text).loss
        assert _same(got, float(shown.strip()), 1e-12), (fmt, text, got)


@fast
@given(NUMBERS)
def test_json_keeps_non_finite_and_huge_numbers(x: float) -> None:
    import json

    text = json.dumps({"step": 3, "loss": x, "grad_norm": x})
    rec = _one("json", text)
    assert _same(rec.loss, x, 1e-12) and _same(rec.grad_norm, x, 1e-12)
    assert _one("json", '{"step": 3, "loss": 1e400}').loss == math.inf


BARS = [
    "  5%|▌         | 50/1000 [00:25<08:00,  1.98it/s]",
    " 10%|█         | 100/1000 [00:50<07:30,  2.00it/s]",
    "100%|██████████| 1000/1000 [08:20<00:00,  2.00it/s]",
    "\r 42%|████▏     | 420/1000 [03:30<04:50,  3.50s/it]",
]


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(
    loss=NUMBERS,
    grad=NUMBERS,
    lr=st.floats(min_value=1e-9, max_value=1.0),
    bar=st.sampled_from(BARS),
    cut=st.floats(min_value=0.0, max_value=1.0),
    split=st.booleans(),
)
def test_hf_dict_survives_any_cut_by_a_bar(
    loss: float, grad: float, lr: float, bar: str, cut: float, split: bool
) -> None:
    d = f"{{'loss': {loss!r}, 'grad_norm': {grad!r}, 'learning_rate': {lr!r}, 'epoch': 0.5}}"
    k = 2 + round(cut * (len(d) - 2))
    text = f"{d[:k]}\n{bar}{d[k:]}" if split else d[:k] + bar + d[k:]
    parser = make_parser("hf")
    recs = [r for i, t in enumerate(text.split("\n"), 1) for r in parser.parse(LogLine(t, i))]
    (rec,) = [r for r in recs if isinstance(r, StepRecord)]
    assert _same(rec.loss, loss, 0) and _same(rec.grad_norm, grad, 0)
    assert rec.learning_rate == lr and rec.epoch == 0.5
