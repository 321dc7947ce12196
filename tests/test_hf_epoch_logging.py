"""HF Trainer with ``logging_strategy="epoch"`` on real logs (tests/data/hf_epoch/README.md;
black-box s37 f10/f40): one dict per epoch, no step number. Before, the NaN was "at step 2"
with the hint "the trainer's step is about logging_steps times this" (2 x 500 by HF's default,
where the real step is 16): under epoch logging that rule is wrong, so the finding says the
epoch and carries no step. Where the log does tell the step (tqdm's redraw under ``--tee``),
the finding has it; ``logging_strategy="steps"`` keeps the counted records and their hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankwatch.analyze import analyze
from rankwatch.config.schema import Config
from rankwatch.detectors.base import counted_epoch
from rankwatch.detectors.crash import how_it_ended
from rankwatch.engine import RankEngine
from rankwatch.records import ErrorRecord, Finding, StepRecord
from rankwatch.sources.decorations import strip
from rankwatch.sources.lines import NOISE, read_lines
from rankwatch.sources.logparser import LogParser

DATA = Path(__file__).parent / "data" / "hf_epoch"


def _nans(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.kind == "nan_loss" and not f.resolved]


@pytest.mark.unit
@pytest.mark.parametrize("name", ["tee_epoch_nan.log", "plain_epoch_nan.log"])
def test_epoch_logging_nan_is_told_at_its_epoch_with_no_step(name: str) -> None:
    result = analyze([str(DATA / name)], Config(), jobs=1)
    (rep,) = result.ranks
    assert (rep.format, rep.steps) == ("hf", 3)
    (nan,) = _nans(result.findings)
    assert nan.step is None
    assert nan.message.startswith("NaN/Inf at epoch 2: grad norm is nan"), nan.message
    assert "logged record 2" in nan.message and "logging_steps" not in nan.message, nan.message
    assert (nan.evidence["epoch"], nan.evidence["logged_record"]) == (2, 2)


@pytest.mark.unit
def test_the_live_reader_of_a_workers_stdout_says_the_same() -> None:
    """The live agent under ``run -- torchrun --tee 3`` reads each worker's stdout file (the
    dicts; with ``disable_tqdm`` no bar is relayed to it) through the same parser and engine."""
    parser = LogParser(default_rank=0)
    engine = RankEngine(Config(), 0)
    found: list[Finding] = []
    for fl in read_lines(str(DATA / "tee_epoch_nan.log"), max_line_bytes=1 << 20, drop=NOISE):
        body, rank, _ = strip(fl.text)
        if rank == 0:  # rank 0's lines: what its stdout/stderr files hold
            for rec in parser.feed(body, fl.lineno):
                found.extend(engine.feed(rec))
    for rec in parser.finish():
        found.extend(engine.feed(rec))
    (live,) = _nans(found)
    (offline,) = _nans(analyze([str(DATA / "tee_epoch_nan.log")], Config(), jobs=1).findings)
    assert (live.step, live.message) == (offline.step, offline.message)


@pytest.mark.unit
def test_a_bar_from_the_other_pipe_glued_before_a_dict_is_not_its_step() -> None:
    """The first dict (step 8) lands behind the bar's ``4/24`` drawn before it, each under its
    own ``[default0]:`` header: two readers. Before: steps 4, 8, 12 and the NaN at step 8."""
    result = analyze([str(DATA / "tee_epoch_bar_nan.log")], Config(), jobs=1)
    (rep,) = result.ranks
    assert (rep.steps, rep.last_step, rep.total_steps) == (3, 24, 24)
    (nan,) = _nans(result.findings)
    assert nan.step == 16 and nan.message.startswith("NaN/Inf at step 16"), nan.message
    assert "logged record" not in nan.message and "logging_steps" not in nan.message
    parser = LogParser(default_rank=None)
    steps = [
        r.step
        for fl in read_lines(str(DATA / "tee_epoch_bar_nan.log"), max_line_bytes=1 << 20, drop=NOISE)
        for r in parser.feed(fl.text, fl.lineno)
        if isinstance(r, StepRecord)
    ]
    steps += [r.step for r in parser.finish() if isinstance(r, StepRecord)]
    assert steps == [8, 16, 24]


@pytest.mark.unit
def test_steps_logging_keeps_the_counted_records_and_their_hint() -> None:
    """``logging_steps=4``: the 3rd record (epoch 1.5) is step 12 = 3 x logging_steps, as said."""
    result = analyze([str(DATA / "tee_steps4_nan.log")], Config(), jobs=1)
    (nan,) = _nans(result.findings)
    assert nan.step == 3 and nan.evidence.get("step_counted") is True
    assert "about logging_steps times this" in nan.message and "epoch" not in nan.message


@pytest.mark.unit
def test_only_a_whole_epoch_of_a_counted_record_is_one() -> None:
    assert counted_epoch(StepRecord(step=2, epoch=2.0, step_inferred=True)) == 2
    assert counted_epoch(StepRecord(step=3, epoch=1.5, step_inferred=True)) is None
    assert counted_epoch(StepRecord(step=16, epoch=2.0)) is None  # a step the log told
    assert counted_epoch(StepRecord(step=1, epoch=0.0, step_inferred=True)) is None
    assert counted_epoch(StepRecord(step=1, epoch=float("nan"), step_inferred=True)) is None


@pytest.mark.unit
def test_an_error_or_exit_after_epoch_records_names_the_epoch_not_a_count() -> None:
    """An error line or the rank's end after the epoch dicts: "(last step 3)" was the count."""
    engine = RankEngine(Config(), 0)
    parser = LogParser(default_rank=0)
    for fl in read_lines(str(DATA / "plain_epoch_nan.log"), max_line_bytes=1 << 20, drop=NOISE):
        for rec in parser.feed(fl.text, fl.lineno):
            engine.feed(rec)
    oom = ErrorRecord(kind="oom", summary="torch.OutOfMemoryError: CUDA out of memory.", rank=0, line=99)
    (f,) = engine.feed(oom)
    assert f.step is None and "(last logged epoch 3)" in f.message, f.message
    assert how_it_ended(engine.state, 1, None) == "process exited with code 1 after epoch 3"
