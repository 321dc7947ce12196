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

from rankwatch.detectors.exit import restarts_exhausted
from rankwatch.records import ErrorRecord
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
        self.tail = ["its last line"]  # it printed: nothing to read back
        self.own: frozenset[Path] = frozenset()
        self.streams: list[object] = []

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


HEALTHY = Path(__file__).parent / "data" / "torchrun" / "ddp_healthy_noisy_start_rank-0.log"


@pytest.mark.parametrize("whole", [True, False])
def test_a_teed_workers_lines_are_read_once(tmp_path: Path, whole: bool) -> None:
    """``--tee 3``: a worker's stdout and stderr are files of its own, and torchrun copies each
    line to the combined log with its ``[defaultN]:`` prefix. Its pipeline reads them once, as
    ``analyze`` reads its file (read twice, each step came twice and the detectors judged another
    history: live and analyze disagreed on the s35 tester's healthy run). When only its stdout
    is a file of its own, what it writes elsewhere reaches only the combined log: read there."""
    from rankwatch.config.schema import Config
    from rankwatch.identity import Identity
    from rankwatch.runtime.workers import _worker_watcher_class

    lines = HEALTHY.read_text().splitlines()
    own = tmp_path / "attempt_0" / "0" / "stdout.log"
    own.parent.mkdir(parents=True)
    own.write_text("".join(f"{line}\n" for line in lines))
    combined = tmp_path / "rank-0.log"
    teed = lines if whole else ["step=41 loss=0.61 lr=0.01 rank=0"]
    combined.write_text("".join(f"[default0]:{line}\n" for line in teed))
    ident = Identity(run="t", rank=0, local_rank=0, world_size=2, node="n")
    w = _worker_watcher_class()(Config(), ident, [own, combined], emit=lambda f: None)
    w.own, w.reads, w.whole = frozenset([own]), 0, whole
    for stream in w.streams:
        w.feed_lines(stream, stream.follower.read_available())
    assert w.engine.state.step_count == (40 if whole else 41)


RESTARTS = Path(__file__).parent / "data" / "torchrun" / "restarts2_every_attempt_fails.log"


def test_the_failure_box_names_the_root_cause() -> None:
    launcher = LauncherLog(RESTARTS, 0)
    launcher.read()
    assert launcher.failed == {1643: 1, 1680: 1, 1711: 1}  # one line per attempt
    assert launcher.root_cause == (1, 1)  # "Root Cause (first observed failure)": rank 1, exit 1


def _upto(tmp: Path, line: int) -> Path:
    log = tmp / "rank-0.log"
    log.write_text("\n".join(RESTARTS.read_text().splitlines()[:line]) + "\n")
    return log


@pytest.mark.parametrize("traceback", [True, False])
def test_a_worker_that_failed_in_the_same_poll_as_the_named_one_is_no_clean_exit(
    tmp_path: Path, traceback: bool
) -> None:
    """d11's attempt 1: both workers fail in init_process_group within 60 ms and torchrun names
    rank 0's (pid 1680) alone; rank 1's worker (its pid unnamed) printed its gloo traceback.
    Its end is of unknown status (a crash with that cause), not a clean exit. A worker unnamed
    with no error in its log ended cleanly, as before (a rank that leaves early)."""
    log = _upto(tmp_path, 88)  # up to attempt 1's failure line
    fleet = Fleet(SimpleNamespace(), SimpleNamespace(), log, 1, [], cmd=[])
    w = _Worker(1681)
    errors = [ErrorRecord("crash", "RuntimeError: Gloo connectFullMesh failed with ...", rank=1)]
    w.engine = SimpleNamespace(state=SimpleNamespace(errors=errors if traceback else []))  # type: ignore[attr-defined]
    fleet.by_rank[1] = w
    fleet.failed_before[1] = 1  # attempt 0's failure was named before this worker began
    fleet.launcher_log.read()
    fleet.check()
    assert w.ends == ([(None, None)] if traceback else [(0, None)])


def test_restarts_exhausted_names_the_root_cause() -> None:
    f = restarts_exhausted(
        restarts=2, max_restarts=2, status=1, root_rank=1, root_step=4, cause="RuntimeError: boom"
    )
    assert f.kind == "restarts_exhausted" and f.rank == 1 and f.severity.label == "critical"
    assert "restarts exhausted (2 of 2)" in f.message and "(exit status 1)" in f.message
    assert "root cause rank 1 at step 4: RuntimeError: boom" in f.message
    assert f.diagnosis is not None and f.diagnosis.suspect == 1
