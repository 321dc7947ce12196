"""Black-box batch s35b (issue 28): ``analyze`` on the real logs of the failed cells d16, d43,
d28/d39 and d46 (tests/data/blackbox/s35b/README.md; each log as the tester's run wrote it).

- d16: an HF Trainer's log under ``torchrun --tee 3``: the dicts (stdout) and tqdm's bar
  (stderr) reach the log through two readers, so a dict is no longer beside its redraw.
- d43: the plain ``run -- torchrun`` form: rank 0's unprefixed bar and dicts follow another
  rank's ``[rank1]:`` warning.
- d28/d39: every worker of mp.spawn / plain torchrun prints ``step=N loss=X ... rank=R`` into
  the one log; rank 3's NaN at step 15 sits between the other ranks' finite step-15 lines.
- d46: ``torchrun ... /work/bb2/trian.py`` (a typo): CPython's "can't open file" on each rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rankwatch.analyze import analyze
from rankwatch.config.schema import Config
from rankwatch.detectors.loss import NanConfig, NanDetector
from rankwatch.records import Severity, StepRecord
from rankwatch.sources.lines import NOISE, read_lines
from rankwatch.sources.logparser import LogParser
from rankwatch.sources.signatures import classify
from rankwatch.state import RankState

REPRO = Path(__file__).parent / "data" / "blackbox" / "s35b" / "repro"


def _steps(name: str) -> list[int | None]:
    parser = LogParser(default_rank=None)
    out: list[int | None] = []
    for fl in read_lines(str(REPRO / name), max_line_bytes=1 << 20, drop=NOISE):
        out.extend(r.step for r in parser.feed(fl.text, fl.lineno) if isinstance(r, StepRecord))
    out.extend(r.step for r in parser.finish() if isinstance(r, StepRecord))
    return out


@pytest.mark.unit
def test_hf_tee_log_gets_the_trainers_steps_and_never_passes_the_total() -> None:
    """d16: 30 dicts logged every 2 steps of 60 (epoch = step / 64); the NaN from the dict at
    epoch 0.5, trainer step 32 (the bar printed 32/60). Before: step 63 and last step 77/60."""
    result = analyze([str(REPRO / "hf_tqdm_nan_rank-0.log")], Config(), jobs=1)
    (rep,) = result.ranks
    assert (rep.steps, rep.last_step, rep.total_steps) == (30, 60, 60)
    assert [(f.kind, f.step) for f in result.findings] == [("nan_loss", 32)]
    assert "counted log records" not in result.findings[0].message
    healthy = analyze([str(REPRO / "hf_tqdm_healthy_rank-0.log")], Config(), jobs=1)
    (rep,) = healthy.ranks
    assert (rep.steps, rep.last_step, rep.total_steps, healthy.findings) == (30, 60, 60, [])
    assert _steps("hf_tqdm_healthy_rank-0.log") == list(range(2, 61, 2))
    # The dicts before the two pipes showed apart keep the steps the bar next to them gave.
    assert _steps("hf_tqdm_nan_rank-0.log")[2:] == list(range(6, 61, 2))


@pytest.mark.unit
def test_an_unprefixed_bar_after_another_ranks_line_is_not_that_ranks() -> None:
    """d43: rank 0's 30 records were "rank 1 steps=30" (a ``[rank1]:`` DDP warning came just
    before its first indented bar, and every later line starts with the bar)."""
    result = analyze([str(REPRO / "hf_plain_torchrun_healthy.log")], Config(), jobs=1)
    assert [(r.rank, r.steps, r.last_step, r.total_steps) for r in result.ranks] == [(0, 30, 60, 60)]
    assert result.findings == []
    assert _steps("hf_plain_torchrun_healthy.log") == list(range(2, 61, 2))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "first", "world"),
    [("d39_plain_4rank_nan.log", 3, 4), ("d28_spawn_nan.log", 1, 2)],
)
def test_a_combined_log_goes_to_the_rank_each_line_names(name: str, first: int, world: int) -> None:
    """d39/d28: before, one series for all ranks: the NaN at 15, "finite again at step 15"
    from rank 0's line, the alert at 16. Each line names its rank (``rank=3``), two records cut
    together on one line included: each rank's NaN at its own step, nothing cleared."""
    result = analyze([str(REPRO / name)], Config(), jobs=1)
    assert [(r.rank, r.steps, r.last_step) for r in result.ranks] == [(r, 30, 30) for r in range(world)]
    nan = {f.rank: f.step for f in result.findings if f.kind == "nan_loss"}
    assert nan == {r: 15 if r == first else 16 for r in range(world)}
    assert all(f.kind == "nan_loss" and not f.resolved for f in result.findings)


@pytest.mark.unit
def test_glued_records_of_two_ranks_are_split_and_other_numbers_are_no_rank() -> None:
    parser = LogParser(default_rank=0)
    recs = parser.feed("step=16 loss=nan lr=0.01 rank=1step=16 loss=nan lr=0.01 rank=2", 1)
    assert [(r.rank, getattr(r, "step", None)) for r in recs] == [(1, 16), (2, 16)]
    recs = parser.feed("step=17 loss=1.0 local_rank=3 node_rank=2", 2)
    assert [r.rank for r in recs] == [0]
    bounded = LogParser(default_rank=0, world_size=2)
    assert [r.rank for r in bounded.feed("step=1 loss=1.0 rank=7", 1)] == [0]


@pytest.mark.unit
def test_a_finite_loss_at_or_before_the_nan_step_does_not_clear_it() -> None:
    """One series holding several ranks' lines (nothing names them): rank 0's finite step 15
    after rank 3's NaN step 15 is no recovery; a finite loss past the NaN steps is."""
    det = NanDetector(NanConfig(), warmup_steps=0)
    state = RankState(rank=None)
    seen = []
    for step, loss in [(14, 2.0), (14, 2.0), (15, float("nan")), (15, 2.1), (16, float("nan")), (16, 2.0)]:
        rec = StepRecord(step=step, loss=loss)
        state.add(rec)
        seen.extend((f.step, f.resolved) for f in det.observe(state, rec))
    assert seen == [(15, False)]
    rec = StepRecord(step=17, loss=2.0)
    state.add(rec)
    assert [(f.step, f.resolved) for f in det.observe(state, rec)] == [(17, True)]


@pytest.mark.unit
def test_python_that_cannot_open_its_script_is_a_crash_with_that_cause() -> None:
    """d46: before, "No error was recognised in the log and it printed nothing"."""
    line = "/work/venv/bin/python3: can't open file '/work/bb2/trian.py': [Errno 2] No such file or directory"
    hit = classify(line)
    assert hit is not None and hit.kind == "crash" and hit.severity is Severity.CRITICAL
    assert "trian.py" in hit.summary and "No such file or directory" in hit.summary
    result = analyze([str(REPRO / "d46_typo_script.log")], Config(), jobs=1)
    crashes = sorted((f.rank, f.kind, f.line) for f in result.findings)
    # Each rank's own line, torchrun's failure box folded into rank 0's; no first failure named.
    assert crashes == [(0, "crash", 6), (1, "crash", 5)]
    assert all("can't open" in f.message or "could not open" in f.message for f in result.findings)
