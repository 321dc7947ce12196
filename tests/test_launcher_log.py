"""What torchrun says of its workers' ends, read from the combined log (runtime/workers.py).

``data/torchrun/sigkill_box.log``: torchrun's own lines (the workers' ``[defaultN]:`` lines
left out) of ``rankwatch run -- torchrun --nproc-per-node 2 --tee 3 tests/workloads/ddp_train.py``
on torch 2.13 (CPU, gloo), rank 1 SIGKILLed at step 8: tests/test_launch_matrix.py's
``test_torchrun_a_failing_rank_is_named_by_its_peer[tee-sigkill]``, recorded on 2026-11-28.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from rankwatch.runtime.workers import Fleet, LauncherLog

pytestmark = pytest.mark.unit

BOX = Path(__file__).parent / "data" / "torchrun" / "sigkill_box.log"


def test_the_failure_box_names_each_workers_rank_and_fate() -> None:
    """A worker that died before the agent's first look is known by the box alone: its rank,
    local rank and exit status by pid (the agent gives it its pipeline at the end)."""
    launcher = LauncherLog(BOX, 0)
    launcher.read()
    assert launcher.ranks == {2196: (0, 0), 2197: (1, 1)}
    assert launcher.fate(2197) == (-9, None)  # its failure line: SIGKILL
    assert launcher.fate(2196) == (None, int(signal.SIGTERM))  # the launcher stopped it
    assert launcher.boxed == {2196: -15, 2197: -9}


class _Worker:
    """What Fleet._judge reads of a worker's pipeline, and the ends it reports."""

    def __init__(self, pid: int) -> None:
        self.prober = SimpleNamespace(pid=pid)
        self.last_sample = SimpleNamespace(alive=False, exit_code=None, time=0.0)
        self.exited = False
        self.rank = 1
        self.ends: list[tuple[int | None, int | None]] = []

    def clock(self) -> float:
        return 10.0  # past the grace since its last sample

    def on_exit(self, code: int | None, sig: int | None, **_: object) -> None:
        self.exited = True
        self.ends.append((code, sig))


def test_a_worker_judged_clean_for_the_launchers_silence_is_judged_again_on_its_late_word(
    tmp_path: Path,
) -> None:
    """On a loaded node torchrun's ``failed (exitcode: -9)`` line can come after the grace the
    agent waits for it: the worker was judged a clean end; once the line is read its SIGKILL
    is reported (rank 1 had no finding at all, and the launcher's exit 1 was an unexplained
    crash of the run)."""
    log = tmp_path / "rank-0.log"
    log.write_text("")
    fleet = Fleet(SimpleNamespace(), SimpleNamespace(), log, 1, [], cmd=[])
    w = _Worker(2197)
    fleet.by_rank[1] = w
    fleet.check()
    assert w.ends == [(0, None)]  # nothing from the launcher within the grace: clean
    log.write_text(BOX.read_text())
    fleet.launcher_log.read()
    fleet.check()
    assert w.ends == [(0, None), (None, 9)]
    fleet.check()
    assert w.ends == [(0, None), (None, 9)]  # once
