"""The shared pid table: a job's descendants without reading every process's /proc entry.

A walk must answer what psutil's ``children(recursive=True)`` answers for the same /proc, and
read the stat of only the pids it has not seen and of the tree's own members (issue 30,
"Light": the full walk was a fifth of the idle agent's CPU on a node of 100 processes).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import FakeClock, wait_for
from rankwatch.sources.process import PidTable, descendants


def _proc(root: Path, pid: int, ppid: int, comm: str = "python") -> None:
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194304 0 0 0 0\n")


def _node(tmp_path: Path) -> Path:
    """init 1; the job 10 -> 11 -> 12 and 10 -> 13; unrelated 20 -> 21; kernel thread 2."""
    root = tmp_path / "proc"
    root.mkdir()
    for pid, ppid in ((1, 0), (2, 0), (10, 1), (11, 10), (12, 11), (13, 10), (20, 1), (21, 20)):
        _proc(root, pid, ppid)
    (root / "self").mkdir()  # not a pid: skipped
    return root


@pytest.mark.unit
def test_walk_finds_every_descendant_parents_first(tmp_path: Path) -> None:
    t = PidTable(str(_node(tmp_path)))
    got = t.walk(10)
    assert got is not None and sorted(got) == [11, 12, 13]
    assert got.index(11) < got.index(12)
    assert t.walk(20) == [21]
    assert t.walk(12) == []


@pytest.mark.unit
def test_a_second_walk_reads_only_new_pids_and_the_trees_members(tmp_path: Path) -> None:
    root = _node(tmp_path)
    t = PidTable(str(root))
    t.walk(10)
    assert t.stat_reads == 8  # the first walk reads every process once
    t.stat_reads = 0
    assert sorted(t.walk(10) or []) == [11, 12, 13]
    assert t.stat_reads == 3  # the tree's members (they may be re-parented), nothing else
    _proc(root, 14, 12)  # a new worker below the job
    _proc(root, 30, 1)  # and an unrelated process
    t.stat_reads = 0
    assert sorted(t.walk(10) or []) == [11, 12, 13, 14]
    assert t.stat_reads == 5


@pytest.mark.unit
def test_an_orphan_re_parented_to_init_leaves_the_tree_as_with_psutil(tmp_path: Path) -> None:
    root = _node(tmp_path)
    t = PidTable(str(root))
    t.walk(10)
    for f in (root / "11").iterdir():
        f.unlink()
    (root / "11").rmdir()  # 11 exits: 12 goes to init
    _proc(root, 12, 1)
    assert t.walk(10) == [13]


@pytest.mark.unit
def test_a_pid_that_left_and_came_back_is_read_again(tmp_path: Path) -> None:
    root = _node(tmp_path)
    t = PidTable(str(root))
    t.walk(10)
    (root / "21" / "stat").unlink()
    (root / "21").rmdir()
    assert t.walk(10) is not None
    _proc(root, 21, 13)  # the pid reused, now by a process of the job
    assert sorted(t.walk(10) or []) == [11, 12, 13, 21]


@pytest.mark.unit
def test_a_pid_handed_out_again_between_two_walks_is_found_by_the_next_full_read(
    tmp_path: Path, fake_clock: FakeClock
) -> None:
    root = _node(tmp_path)
    t = PidTable(str(root), clock=fake_clock)
    t.walk(10)
    _proc(root, 21, 13)  # 21 ended and its pid went to a new process of the job, unseen
    walks = []
    for _ in range(50):  # walks at run mode's worker-search cadence (every 1 s sample)
        fake_clock.advance(1.0)
        walks.append(sorted(t.walk(10) or []))
    assert walks[0] == walks[-1] == [11, 12, 13]  # its parent as read for the old process
    reads = t.stat_reads
    fake_clock.advance(PidTable.FULL_READ_S)
    assert sorted(t.walk(10) or []) == [11, 12, 13, 21]  # the full read finds it
    assert t.stat_reads - reads == sum(d.name.isdigit() for d in root.iterdir())  # every pid again


@pytest.mark.unit
def test_comm_with_parentheses_and_spaces_and_unreadable_stat(tmp_path: Path) -> None:
    root = _node(tmp_path)
    _proc(root, 15, 10, comm="a) S 1 (b")
    (root / "16").mkdir()  # listed but no stat (it exited while we looked)
    t = PidTable(str(root))
    assert sorted(t.walk(10) or []) == [11, 12, 13, 15]


@pytest.mark.unit
def test_a_refused_pid_is_left_out_with_what_lies_below_it(tmp_path: Path) -> None:
    t = PidTable(str(_node(tmp_path)))
    assert t.walk(10, admit=lambda pid: pid != 11) == [13]


@pytest.mark.unit
def test_no_proc_listing_is_none(tmp_path: Path) -> None:
    assert PidTable(str(tmp_path / "absent")).walk(1) is None


# The job: a child that starts a grandchild, and a second child; all sleep.
SPAWN_TREE = """
import subprocess, sys, time
nap = "import time; time.sleep(60)"
mid = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {nap!r}]); time.sleep(60)"
subprocess.Popen([sys.executable, "-c", mid])
subprocess.Popen([sys.executable, "-c", nap])
time.sleep(60)
"""


@pytest.mark.process
def test_real_tree_same_as_psutil() -> None:
    job = subprocess.Popen([sys.executable, "-c", SPAWN_TREE])
    p = psutil.Process(job.pid)
    try:
        wait_for(lambda: len(p.children(recursive=True)) == 3, timeout=30, what="the job's 3 descendants")
        t = PidTable()
        for _ in range(2):  # the first walk reads everything, the second only the tree and new pids
            ours = sorted(c.pid for c in descendants(p, t))
            assert ours == sorted(c.pid for c in p.children(recursive=True))
        assert t.stat_reads < 2 * len(psutil.pids())
    finally:
        for c in p.children(recursive=True):
            c.kill()
        job.kill()
        job.wait()


@pytest.mark.unit
def test_the_job_tree_and_the_prober_walk_the_shared_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard: none asks psutil for its walk over every process on the node (the launcher's
    and the script's worker search, ``rank_workers``, runs every process sample)."""
    import os

    from rankwatch.runtime.workers import Tree, rank_workers
    from rankwatch.sources.process import ProcessProber

    def full_walk(self: psutil.Process, recursive: bool = False) -> list[psutil.Process]:
        raise AssertionError("psutil's walk over every process on the node")

    monkeypatch.setattr(psutil.Process, "children", full_walk)
    me = os.getpid()
    mine = {c.pid for c in descendants(psutil.Process(me))}
    assert {p.pid for p in Tree(me).remember()} == mine
    prober = ProcessProber(me)
    assert prober.sample().children == len(mine)
    assert rank_workers(me) == [] and rank_workers(me, script=True) == []  # no RANK below this test
