"""Black-box batch s38 (issue 28), item F: ``analyze`` on the real logs of restarted torchrun
jobs (tests/data/blackbox/s38/report.md; kept in tests/data/blackbox/s38/repro).

- g35: the run log of ``rankwatch run -- torchrun --max-restarts 1`` (g09), rank 1 raising in
  both attempts: torchrun's two "failed (exitcode: 1) local_rank: 1" lines, then its failure box.
- g36: the ``--log-dir`` tree of g11: attempt 0 crashed after step 9 (rank 1 raised at step 10),
  attempt 1 ran 25 clean steps.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from rankwatch.analyze import analyze
from rankwatch.config.schema import Config
from rankwatch.runtime.workers import LauncherLog

REPRO = Path(__file__).parent / "data" / "blackbox" / "s38" / "repro"
G35 = REPRO / "g35" / "g09-run.log"
G36 = REPRO / "g36" / "tl" / "none_3puxy1p_"


@pytest.mark.unit
@pytest.mark.parametrize("compressed", [False, True])
def test_restarts_exhausted_from_the_run_log_alone(tmp_path: Path, compressed: bool) -> None:
    """g35: before, crash, rank_lagging and peer_error but no restarts_exhausted."""
    path = G35
    if compressed:
        path = tmp_path / "g09-run.log.gz"
        path.write_bytes(gzip.compress(G35.read_bytes()))
    result = analyze([str(path)], Config(), jobs=1)
    (gave_up,) = [f for f in result.findings if f.kind == "restarts_exhausted"]
    assert gave_up.rank == 1
    assert gave_up.step == 4
    assert gave_up.diagnosis is not None and gave_up.diagnosis.suspects == (1,)
    assert "restarts exhausted (1 of 1)" in gave_up.message
    assert "injected failure in rank 1 at step 5" in gave_up.message


@pytest.mark.unit
def test_one_failed_attempt_is_no_restart_used() -> None:
    """The same log cut before attempt 1: one failure, then the box (as without --max-restarts)."""
    lines = G35.read_bytes().split(b"\n")
    first = next(i for i, x in enumerate(lines) if b"failed (exitcode" in x)
    second = next(i for i, x in enumerate(lines) if b"failed (exitcode" in x and i > first)
    log = LauncherLog(G35, 0)
    for raw in lines[second - 1 :]:  # attempt 1's failure and the box, without attempt 0's
        log.feed(raw)
    assert log.root_cause == (1, 1)
    assert log.restarts_used() == 0
    whole = LauncherLog(G35, 0)
    for raw in lines:
        whole.feed(raw)
    assert whole.restarts_used() == 1


@pytest.mark.unit
def test_log_dir_tree_tells_each_attempt_at_its_own_steps() -> None:
    """g36: before, the crash had step null and rank_lagging said "crash at step 25" (attempt
    1's steps)."""
    paths = sorted(str(p) for p in G36.glob("attempt_*/*/*.log"))
    result = analyze(paths, Config(), jobs=1)
    (crash,) = [f for f in result.findings if f.kind == "crash"]
    assert crash.rank == 1 and crash.step == 9
    assert "attempt_0" in str(crash.path)
    (lag,) = [f for f in result.findings if f.kind == "rank_lagging"]
    assert lag.rank == 1 and lag.step == 9
    assert "crash at step 9" in lag.message
    assert not [f for f in result.findings if f.kind == "restarts_exhausted"]  # it went on
