"""One finding per death, whatever files a rank is read from.

torchrun's ``--redirects 3 --log-dir D`` gives each worker two files: its step lines in
``stdout.log``, its traceback in ``stderr.log``. Line numbers order the lines of one file only;
an exit judged by comparing line 9 of stderr with line 11 of stdout threw the OOM away as
"survived" and reported a second, self-contradictory crash ("No error was recognised in the
log; last line: ... OutOfMemoryError"). The text below is what torch 2.13 wrote into those two
files for an OOM raised at step 12 (/work/bb/c04_redirects_oom, the black-box run of s35).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from rankwatch.config.loader import config_from_yaml
from rankwatch.detectors.exit import ExitDetector
from rankwatch.events import ProcessExit
from rankwatch.identity import Identity
from rankwatch.records import ErrorRecord, Finding, Severity, StepRecord
from rankwatch.runtime.watcher import RankWatcher
from rankwatch.state import RankState

pytestmark = pytest.mark.unit

IDENT = Identity(run="r", rank=1, local_rank=1, world_size=2, node="n")
STDOUT = "".join(f"step={n} loss={4 - n / 10:.5f} lr=0.01 rank=1\n" for n in range(1, 12))
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.15 GiB total)"
STDERR = (
    "[W1128 11:10:52.910987359 Utils.hpp:137] Warning: Environment variable TORCH_NCCL_TRACE_BUFFER_SIZE "
    "is deprecated; use TORCH_FR_BUFFER_SIZE instead (function operator())\n"
    "[rank1]: Traceback (most recent call last):\n"
    '[rank1]:   File "/work/bb/train.py", line 34, in <module>\n'
    '[rank1]:     if __name__ == "__main__": main()\n'
    "[rank1]:                                ^^^^^^\n"
    '[rank1]:   File "/work/bb/train.py", line 22, in main\n'
    '[rank1]:     if fault == "oom": raise torch.cuda.OutOfMemoryError("CUDA out of memory.")\n'
    "[rank1]:                        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    f"[rank1]: {OOM}\n"
)


def _worker(tmp: Path, order: tuple[str, ...]) -> tuple[RankWatcher, list[Finding]]:
    """A worker read as under ``--redirects``: its two files, in ``order``, on a wall clock
    that ticks at every read (the live reader dates a line by when it was read)."""
    (tmp / "stdout.log").write_text(STDOUT)
    (tmp / "stderr.log").write_text(STDERR)
    out: list[Finding] = []
    tick = itertools.count(1_000_000)
    w = RankWatcher(
        config_from_yaml("alerts: {startup_quiet: 0s}\n"),
        IDENT,
        [tmp / name for name in order],
        emit=out.append,
        wall=lambda: float(next(tick)),
    )
    w.drain()
    return w, out


def _serious(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f.severity >= Severity.WARNING and f.kind != "loss_spike"]


def test_an_oom_in_stderr_after_the_steps_in_stdout_is_one_finding(tmp_path: Path) -> None:
    w, out = _worker(tmp_path, ("stdout.log", "stderr.log"))
    w.on_exit(1, None)
    w.close()
    [oom] = _serious(out)
    assert oom.kind == "oom" and oom.rank == 1 and oom.step == 11, out
    assert oom.path == str(tmp_path / "stderr.log") and oom.line == 9  # the file line 9 is in
    [end] = [f for f in out if f.kind == "process_exit"]
    assert end.severity is Severity.INFO and end.step == 11
    assert end.message.startswith("process exited with code 1 after step 11: its oom finding above (line 9)")
    assert end.evidence["cause_kind"] == "oom" and end.evidence["cause_reported"] is True
    assert end.evidence["exit_code"] == 1


def test_an_error_read_before_later_steps_of_another_file_was_survived(tmp_path: Path) -> None:
    """Across files the time a line was read orders them: an OOM read before the steps that
    followed it was survived (a batch-size finder's), and is not the cause of a later death."""
    w, out = _worker(tmp_path, ("stderr.log", "stdout.log"))
    w.on_exit(1, None)
    w.close()
    crash = [f for f in out if f.kind == "crash"]
    assert len(crash) == 1 and crash[0].evidence["cause_kind"] is None, out


def _exit(state: RankState, code: int | None) -> Finding | None:
    return ExitDetector(state.rank, None).judge(state, ProcessExit(code, None, ("x",), False, None, wall=5.0))


def test_a_death_by_an_error_not_told_yet_is_a_crash_with_its_cause() -> None:
    """Held back (a launcher's run pipeline leaves a worker's error to its exit), or only a
    warning told: the death is the crash finding, with the error as its cause."""
    st = RankState(rank=0)
    st.add(StepRecord(step=3, line=3))
    st.add(ErrorRecord(kind="oom", summary="CUDA out of memory", line=4))
    f = _exit(st, 1)
    assert f is not None and f.kind == "crash" and f.evidence["cause_kind"] == "oom"
    st = RankState(rank=0)
    st.add(StepRecord(step=3, line=3))
    st.add(
        ErrorRecord(
            kind="nccl_error", summary="NCCL WARN x", severity=Severity.WARNING, line=4, reported=True
        )
    )
    f = _exit(st, 1)
    assert f is not None and f.kind == "crash" and f.severity is Severity.CRITICAL
    st.errors[-1].kind = "peer_error"  # gloo's lost peer, a warning: the death is the crash
    f = _exit(st, 1)
    assert f is not None and f.kind == "crash" and f.evidence["cause_kind"] == "peer_error"
    st.errors[-1].severity = Severity.CRITICAL
    f = _exit(st, 1)
    assert f is not None and f.kind == "process_exit" and f.evidence["cause_reported"] is True
    assert _exit(st, 0) is None  # a clean exit stays no finding


def test_a_rank_stopped_after_its_own_told_error_is_that_error_not_a_second_failure() -> None:
    """Every rank OOMs at once; torchrun stops the last one while it tears down (s39 k27): its
    own OOM already went out as a critical finding, so its death on the launcher's stop is told
    by it (info), not a crash warning naming another rank's OOM as the first failure."""
    st = RankState(rank=2)
    st.add(StepRecord(step=9, line=3))
    st.add(
        ErrorRecord(kind="oom", summary="torch.OutOfMemoryError: CUDA out of memory", line=4, reported=True)
    )
    st.errors[-1].severity = Severity.CRITICAL
    stop = ProcessExit(None, 15, ("x",), 15, None, wall=5.0, stopped_by="the launcher sent")
    f = ExitDetector(2, None).judge(st, stop)
    assert f is not None and (f.kind, f.severity) == ("process_exit", Severity.INFO), f
    assert "on the stop signal the launcher sent" in f.message and "its oom finding above" in f.message, f
    st.errors[-1].reported = False  # held, not told yet: the death is the crash, a warning after a stop
    f = ExitDetector(2, None).judge(st, stop)
    assert f is not None and (f.kind, f.severity) == ("crash", Severity.WARNING), f


LIGHTNING_CHILD = {
    "LOCAL_RANK": "1",
    "NODE_RANK": "0",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "41234",
}


@pytest.mark.parametrize(
    ("env", "parent", "rank"),
    [
        (LIGHTNING_CHILD, 10, "1"),  # what _SubprocessScriptLauncher sets, on node 0
        ({**LIGHTNING_CHILD, "NODE_RANK": "1"}, 10, None),  # node 1: devices per node unknown
        ({**LIGHTNING_CHILD, "RANK": "1"}, 10, None),  # a rank of a launcher's, found as such
        ({**LIGHTNING_CHILD, "LOCAL_RANK": "0"}, 10, None),  # local rank 0 is the script itself
        (LIGHTNING_CHILD, 11, None),  # not the script's own child (a worker of a worker)
        ({"LOCAL_RANK": "1"}, 10, None),  # no world to be a rank of
    ],
)
def test_a_rank_lightning_started_is_told_by_its_environment(
    env: dict[str, str], parent: int, rank: Any
) -> None:
    from rankwatch.runtime.workers import started_rank

    got = started_rank(env, parent, root=10)
    assert (got or {}).get("RANK") == rank


def test_a_script_with_no_children_starts_no_ranks() -> None:
    from rankwatch.runtime.workers import rank_workers

    assert rank_workers(2**22 + 12345, script=True) == []  # no such process: nothing, no error


def test_a_launcher_stopped_from_outside_is_no_crash() -> None:
    """``run -- timeout -s TERM 12 torchrun ...`` (s40 l07, a real run's combined log): torchrun
    got SIGTERM from ``timeout``, stopped its workers and re-raised torchelastic's
    SignalException; ``timeout`` ended 124. A stop someone asked for: the launcher's end is info,
    not a rank-less critical crash."""
    from rankwatch.sources.logparser import LogParser

    log = Path(__file__).parent / "data/torchrun/timeout_stops_torchrun.log"
    parser = LogParser()
    st = RankState(rank=None)
    for n, line in enumerate(log.read_text().splitlines(), 1):
        for rec in parser.feed(line, n):
            st.add(rec)
    for rec in parser.finish():
        st.add(rec)
    assert any("SignalException" in e.summary for e in st.errors), st.errors
    f = ExitDetector(None, None).judge(st, ProcessExit(124, None, ("x",), False, None, wall=5.0))
    assert f is not None and (f.kind, f.severity) == ("process_exit", Severity.INFO), f
    assert "stopped from outside the agent: it got SIGTERM" in f.message, f
