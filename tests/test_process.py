from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

from conftest import wait_for
from rankwatch.sources.process import ProcessProber, find_processes, state_name

BUSY = "import time\nt = time.time() + 20\nwhile time.time() < t: pass\n"
SLEEP = "import time; time.sleep(20)"
# The parent starts a child and reports its pid on stdout, then both sleep.
SPAWN = (
    "import subprocess, sys, time\n"
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)'])\n"
    "print(c.pid, flush=True)\n"
    "time.sleep(20)\n"
)


@contextmanager
def spawn(code: str, *extra: str, stdout: int | None = None) -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen([sys.executable, "-c", code, *extra], stdout=stdout)
    try:
        yield p
    finally:
        for c in psutil.Process(p.pid).children(recursive=True) if p.poll() is None else []:
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass
        p.kill()
        p.wait(timeout=5)


@pytest.mark.unit
def test_state_names() -> None:
    assert state_name(psutil.STATUS_DISK_SLEEP) == "disk-wait"
    assert state_name(psutil.STATUS_SLEEPING) == "sleeping"
    assert state_name(psutil.STATUS_RUNNING) == "running"
    assert state_name(psutil.STATUS_STOPPED) == "stopped"
    assert state_name(psutil.STATUS_ZOMBIE) == "zombie"
    assert state_name("tracing-stop") == "tracing-stop"  # py-spy's ptrace pause is not SIGSTOP


@pytest.mark.process
def test_busy_loop_uses_cpu_sleeper_does_not() -> None:
    with spawn(BUSY) as busy, spawn(SLEEP) as idle:
        pb, pi = ProcessProber(busy.pid), ProcessProber(idle.pid)
        time.sleep(0.35)
        sb, si = pb.sample(), pi.sample()
        # on a loaded 2-core box the first 0.35 s may be short of CPU: retry, bounded
        busy_seen = sb.cpu_percent > 40 or wait_for(lambda: pb.sample().cpu_percent > 40, timeout=3.0)
    assert sb.alive and si.alive
    assert sb.pid == busy.pid
    assert busy_seen, sb
    assert si.cpu_percent < 10, si
    assert sb.cpu_time_s > 0.1
    assert sb.state in ("running", "sleeping")  # preempted on a 2-core box
    assert si.state == "sleeping"
    assert sb.rss_bytes > 1_000_000 and sb.threads >= 1
    assert sb.cmdline[:2] == [sys.executable, "-c"]
    assert sb.exit_code is None


@pytest.mark.process
def test_descendants_counted_and_listed() -> None:
    with spawn(SPAWN, stdout=subprocess.PIPE) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        prober = ProcessProber(parent.pid)
        s = prober.sample()
        single = psutil.Process(parent.pid).memory_info().rss
        assert s.children == 1
        assert s.threads >= 2
        assert s.rss_bytes > single
        assert set(prober.pids()) == {parent.pid, child}


@pytest.mark.process
def test_exited_process_is_not_alive() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    try:
        prober = ProcessProber(p.pid, returncode=p.poll)
        assert wait_for(lambda: not prober.sample().alive)
        assert p.wait(timeout=5) == 3
        s = prober.sample()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=5)
    assert not s.alive
    assert s.exit_code == 3
    assert s.state == "dead"
    assert prober.pids() == []


@pytest.mark.process
def test_unreaped_child_reads_as_zombie() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        prober = ProcessProber(p.pid)
        assert wait_for(lambda: psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE)
        s = prober.sample()
        assert not s.alive and s.state == "zombie"
    finally:
        p.wait(timeout=5)


@pytest.mark.process
def test_vanished_pid_never_raises() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=5)
    s = ProcessProber(p.pid).sample()
    assert not s.alive and s.cpu_time_s == 0.0 and s.children == 0


@pytest.mark.process
def test_stopped_process() -> None:
    with spawn(SLEEP) as p:
        prober = ProcessProber(p.pid)
        os.kill(p.pid, signal.SIGSTOP)
        try:
            assert wait_for(lambda: prober.sample().state == "stopped")
            assert prober.sample().alive
        finally:
            os.kill(p.pid, signal.SIGCONT)


@pytest.mark.process
def test_injected_clock_sets_time() -> None:
    ticks = iter([100.0, 101.0, 102.0])
    with spawn(SLEEP) as p:
        prober = ProcessProber(p.pid, clock=lambda: next(ticks))
        assert prober.sample().time == 101.0


@pytest.mark.process
def test_find_processes_excludes_self() -> None:
    """Like `rankwatch watch --match X`: the caller's own command line contains the pattern."""
    marker = f"rankwatch-marker-{uuid.uuid4().hex}"
    finder = (
        "import sys\nfrom rankwatch.sources.process import find_processes\nprint(find_processes(sys.argv[1]))"
    )
    with spawn(SLEEP, marker) as p:
        out = subprocess.run(
            [sys.executable, "-c", finder, marker], capture_output=True, text=True, timeout=20, check=True
        )
        assert out.stdout.strip() == f"[{p.pid}]"
        assert find_processes(marker) == [p.pid]
    assert os.getpid() in find_processes(r"pytest|python", exclude_self=False)
    assert os.getpid() not in find_processes(r"pytest|python")


@pytest.mark.unit
def test_find_processes_bad_regex() -> None:
    import re

    with pytest.raises(re.error):
        find_processes("(")


@pytest.mark.process
def test_a_process_start_is_read_to_the_clock_tick() -> None:
    """When a rank's process started, on the wall clock: what tells a job's failure records
    from an earlier job's in the same run folder. psutil's create_time is up to a second early
    (the boot time in whole seconds); this is within a few ticks of the spawn."""
    before = time.time()
    with spawn(SLEEP) as p:
        after = time.time()
        started = ProcessProber(p.pid).started
        assert started is not None and before - 0.05 <= started <= after + 0.05, (before, started, after)
    assert ProcessProber(p.pid).started is None  # gone: unknown, never a guess
