"""Black-box batch s36 (issue 28): the real logs of the failed cells e08 and e18/e32
(tests/data/blackbox/s36/repro/README.md; each log as the tester's agent echoed it).

- e18/e32: ``accelerate launch`` with accelerate's own logger (``get_logger(...).info(...,
  main_process_only=False)``): every process's lines in the one log, each marked ``[RANK n]``.
- e08: plain ``run -- torchrun``: rank 1 prints ``ERROR: ...`` on stderr and exits 3.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rankwatch.analyze import analyze
from rankwatch.config.schema import Config
from rankwatch.records import StepRecord
from rankwatch.runtime.workers import lent_lines
from rankwatch.sources.decorations import strip
from rankwatch.sources.lines import NOISE, read_lines
from rankwatch.sources.logparser import LogParser

REPRO = Path(__file__).parent / "data" / "blackbox" / "s36" / "repro"


def _accelerate_lines(tmp: Path) -> Path:
    """The e18 log's own job (lines 1-120 are another job's, written into the same file): the
    lines e32 kept with ``grep -E '^[0-9]{2}/[0-9]{2}/[0-9]{4}.*\\[RANK'``."""
    text = (REPRO / "e18_accelerate_nan_with_foreign_lines.log").read_text()
    out = tmp / "acc.log"
    out.write_text("".join(x for x in text.splitlines(keepends=True) if "[RANK " in x))
    return out


@pytest.mark.unit
def test_accelerate_rank_marker_names_the_rank(tmp_path: Path) -> None:
    """e32: before, one rank 0 with 80 steps and the NaN on rank 0 at step 15."""
    result = analyze([str(_accelerate_lines(tmp_path))], Config(), jobs=1)
    assert [(r.rank, r.steps, r.last_step) for r in result.ranks] == [(0, 40, 40), (1, 40, 40)]
    nan = {f.rank: f.step for f in result.findings if f.kind == "nan_loss"}
    assert nan == {1: 15, 0: 16}


@pytest.mark.unit
def test_accelerate_rank_marker_in_the_live_reader() -> None:
    """The run pipeline's reader (default rank None, as under ``run -- accelerate launch``)
    gives each marked line its rank; two ranks named, or a marker past the world, name none."""
    parser = LogParser(default_rank=None, world_size=2)
    line = "11/28/2026 14:54:18 - INFO - __main__ - [RANK 1] step 15: loss nan lr 0.01"
    recs = parser.feed(line, 1)
    assert [(type(r), r.rank, getattr(r, "step", None)) for r in recs] == [(StepRecord, 1, 15)]
    assert [r.rank for r in parser.feed("INFO - [RANK 0] step 16: loss 1.0 lr 0.01", 2)] == [0]
    assert [r.rank for r in parser.feed("INFO - [RANK 7] step 17: loss 1.0", 3)] == [None]
    assert [r.rank for r in parser.feed("[RANK 0] [RANK 1] step 18: loss 1.0", 4)] == [None]


@pytest.mark.unit
def test_a_worker_that_printed_nothing_of_its_own_is_quoted_from_the_run_lines() -> None:
    """e08: the run pipeline's unprefixed lines of the combined log (what plain ``run --
    torchrun`` reads for the run), lent to rank 1 when it exits 3 with no prefixed line: its
    ``ERROR:`` line is the last, rank 0's ``rank=0`` lines and torchrun's teardown are not."""
    text = (REPRO / "e08_plain_torchrun_sysexit3_combined.log").read_text()
    unprefixed = [(0.0, x) for x in text.splitlines() if strip(x)[1] is None]
    lent = lent_lines(unprefixed, 0.0, 1)
    assert lent[-1].startswith("ERROR: tokenizer vocab mismatch (expected 50257, got 32000)")
    assert "step=9 loss=1.97467 lr=0.01 rank=1" in lent
    assert not any("rank=0" in x or "torch/distributed" in x for x in lent)
    assert lent_lines(unprefixed, 1.0, 1) == []  # none read since the worker started


def _segments(name: str) -> list[tuple[str, int]]:
    return [
        (fl.text, fl.lineno)
        for fl in read_lines(str(REPRO / name), max_line_bytes=1 << 20, drop=NOISE)
        if not fl.cut
    ]


@pytest.mark.unit
def test_hf_dicts_and_bars_read_from_two_files_get_the_trainers_steps() -> None:
    """d16 live: a worker's stdout file (the Trainer's dicts) and stderr file (tqdm's bar) are
    read apart. With the bar's segments relayed to the stdout file's reader (``pipes_apart``),
    here all of them after all the dicts, as in one turn of a fast job: every dict gets the
    Trainer's step (2..40), the NaN grad norm from the dict at step 22. Without: counted records."""
    dicts = _segments("d16_hf_tqdm_redirects_rank0_stdout.log")
    bars = [
        (t, -n) for t, n in _segments("d16_hf_tqdm_redirects_rank0_stderr.log") if "%|" in t or t.isspace()
    ]
    parser = LogParser(default_rank=0)
    parser.pipes_apart()
    recs = [r for t, n in dicts + bars for r in parser.feed(t, n)] + parser.finish()
    steps = [(r.step, r.grad_norm) for r in recs if isinstance(r, StepRecord)]
    assert [s for s, _ in steps] == list(range(2, 41, 2))
    # HF's logging_nan_inf_filter keeps the NaN out of the loss: the grad norm shows it.
    assert next(s for s, norm in steps if norm is not None and norm != norm) == 22
    plain = LogParser(default_rank=0)
    counted = [r for t, n in dicts for r in plain.feed(t, n)] + plain.finish()
    assert [r.step for r in counted if isinstance(r, StepRecord)] != list(range(2, 41, 2))
