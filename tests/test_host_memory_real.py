"""host_memory_growth on real processes, sampled by the agent's own ``ProcessProber``.

A child Python program grows its host memory one step at a time, on command from the test
(one line on its stdin per step, "ok" back when done), so every sample sees a finished step
and nothing sleeps. The prober's clock is a ``FakeClock``: each step is followed by one
sample and the clock moves ``SIM_PER_STEP`` (30 s) of simulated time, so the detector's real
30-minute window is covered by about 65 steps, a second or two of real time.

The memory limit: the test machine's own RAM is far too large for a few hundred MiB to run
out within the hour, so the child's tree runs in a real memory cgroup of its own (v1 or v2,
made by the test under its own) whose limit is ``LIMIT_ABOVE`` (700 MiB) above what the cgroup
is charged once the tree is in it. Everything in the sample, limit and headroom included, is
what the prober reads itself.
The leak adds 4 MiB a step, 8 MiB a simulated minute: once the window is full (~250 MiB
leaked) what is left runs out in under an hour, so the warning must come then.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from conftest import FakeClock
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.detectors.host_memory import KIND
from rankwatch.engine import RankEngine
from rankwatch.events import ProcessSample
from rankwatch.records import Finding
from rankwatch.sources.process import ProcessProber

pytestmark = pytest.mark.process

MiB = 1 << 20
SIM_PER_STEP = 30.0  # simulated seconds between two samples (one step each)
MAX_STEPS = 75  # 75 x 4 MiB = 300 MiB at most, whatever happens
LIMIT_ABOVE = 700 * MiB

# Each program answers "ok" after each step it is told to take.
APPEND = """
import sys
kept = []                                   # a cache that is never emptied
for line in sys.stdin:
    kept.append(bytearray(b"x") * (4 << 20))  # 4 MiB, written, so resident
    print("ok", flush=True)
"""

PLATEAU = """
import sys
kept = []
for i, line in enumerate(sys.stdin):
    if i < 12:                              # a warm-up: caches filled, then no more
        kept.append(bytearray(b"x") * (4 << 20))
    print("ok", flush=True)
"""

# The DataLoader "leak" of pytorch/pytorch#13246: the Dataset holds a Python list of samples,
# a forked worker reads them, and every read writes the object's refcount, so the worker gets
# its own copy of each page it touches. RSS counts a shared page in both processes from the
# fork on, so the tree's RSS stays flat while the memory charged to the job grows.
COPY_ON_READ = """
import os, sys
samples = [bytes([i % 256]) * 4000 for i in range(40_960)]  # 160 MiB, one object a page
r, w = os.pipe()
r2, w2 = os.pipe()
if os.fork() == 0:                                  # the worker
    os.close(w); os.close(r2)
    step = 0
    with os.fdopen(r) as cmd, os.fdopen(w2, "w") as out:
        for line in cmd:
            n = 0
            for s in samples[step * 512:(step + 1) * 512]:  # 2 MiB of pages a step
                n += len(s)                         # a read: the refcount is written
            step += 1
            out.write("ok\\n"); out.flush()
    os._exit(0)
os.close(r); os.close(w2)
cmd, back = os.fdopen(w, "w"), os.fdopen(r2)
print("ok", flush=True)                             # the worker is there
for line in sys.stdin:
    cmd.write("go\\n"); cmd.flush()
    back.readline()
    print("ok", flush=True)
"""


@contextmanager
def child(code: str) -> Iterator[subprocess.Popen[str]]:
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield p
    finally:
        kids = psutil.Process(p.pid).children(recursive=True) if p.poll() is None else []
        for k in kids:
            try:
                k.kill()
            except psutil.NoSuchProcess:
                pass
        p.kill()
        p.wait(timeout=5)


def step(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("step\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "ok"


def charged(pid: int) -> int:
    """What a memory cgroup holding only this tree is charged: the sum of its PSS."""
    root = psutil.Process(pid)
    return sum(int(q.memory_full_info().pss) for q in [root, *root.children(recursive=True)])


def _own_memory_cgroup() -> tuple[Path, str] | None:
    """This process's memory cgroup folder and its limit file's name (v1 first, then v2)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        num, ctrls, rel = line.split(":", 2)
        if "memory" in ctrls.split(","):
            return Path("/sys/fs/cgroup/memory") / rel.lstrip("/"), "memory.limit_in_bytes"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        num, ctrls, rel = line.split(":", 2)
        if num == "0" and not ctrls:
            base = Path("/sys/fs/cgroup") / rel.lstrip("/")
            if "memory" in (base / "cgroup.subtree_control").read_text(errors="replace").split():
                return base, "memory.max"
    return None


@contextmanager
def memory_cgroup(pids: list[int], above: int) -> Iterator[int]:
    """Move ``pids`` into a new memory cgroup; its limit is ``above`` over what it is charged."""
    own = _own_memory_cgroup()
    if own is None:
        pytest.skip("needs root: no memory cgroup controller this test may make a cgroup under")
    parent, limit_file = own
    cg = parent / f"rankwatch-test-{os.getpid()}-{pids[0]}"
    try:
        cg.mkdir()
        if limit_file == "memory.limit_in_bytes":  # v1: bring what the pages cost along, where
            try:  # the kernel still can (it is gone from recent ones: new pages are charged)
                (cg / "memory.move_charge_at_immigrate").write_text("3")
            except OSError:
                pass
        for pid in pids:
            (cg / "cgroup.procs").write_text(str(pid))
    except OSError as e:
        pytest.skip(f"needs root: cannot make a memory cgroup under {parent}: {e}")
    try:
        usage = "memory.usage_in_bytes" if limit_file == "memory.limit_in_bytes" else "memory.current"
        limit = int((cg / usage).read_text()) + above
        (cg / limit_file).write_text(str(limit))
        yield limit
    finally:
        for pid in (cg / "cgroup.procs").read_text().split():  # back to where they came from
            try:
                (parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        cg.rmdir()


def watch(
    code: str, cfg: Config, *, ready: bool = False, above: int = LIMIT_ABOVE
) -> tuple[list[tuple[int, Finding]], list[int]]:
    """Run ``code`` step by step under the real prober; (step, finding) pairs and the RSS seen."""
    clock = FakeClock()
    found: list[tuple[int, Finding]] = []
    rss: list[int] = []
    with child(code) as p:
        if ready:  # the program forks its worker first and says when it is there
            assert p.stdout is not None and p.stdout.readline().strip() == "ok"
        tree = [p.pid, *(q.pid for q in psutil.Process(p.pid).children(recursive=True))]
        with memory_cgroup(tree, above) as limit:
            prober = ProcessProber(p.pid, clock=clock)
            eng = RankEngine(cfg, rank=0, path="rank-0.log")
            for i in range(MAX_STEPS):
                step(p)
                clock.advance(SIM_PER_STEP)
                s = prober.sample()
                assert s.alive and s.rss_bytes > 0 and s.memory_available_bytes is not None
                assert s.memory_limit_bytes == limit  # the prober found the cgroup's limit itself
                assert isinstance(s, ProcessSample)
                rss.append(s.rss_bytes)
                found.extend((i, f) for f in eng.feed(s) if f.kind == KIND)
                if found:
                    break
            assert eng.internal_errors == 0
    return found, rss


# About 300 MiB is all CI may spend, so the rule's minimum growth over its window is lowered
# from 512 MiB to 64 MiB; the window (30 min), resolution (1 min) and horizon (1 h) are the defaults.
CFG = replaced(Config(), {"detectors.host_memory.min_growth": 64 * MiB})


def test_a_process_appending_memory_every_step_is_named_once_the_window_is_full() -> None:
    found, rss = watch(APPEND, CFG)
    assert found, f"no finding; RSS went {rss[0] // MiB} -> {rss[-1] // MiB} MiB"
    ((at, f),) = found
    # The window is full after ~62 steps of 30 s (the first minute is only seen in part).
    assert 60 <= at <= 70, at
    assert not f.resolved and f.evidence["eta_seconds"] <= 3600
    assert 6 * MiB <= f.evidence["slope_bytes_per_minute"] <= 10 * MiB  # 4 MiB per 30 s
    assert rss[-1] - rss[0] >= 230 * MiB


def test_a_process_that_fills_its_caches_then_levels_off_stays_silent() -> None:
    found, rss = watch(PLATEAU, CFG)
    assert found == []
    assert len(rss) == MAX_STEPS and rss[-1] - rss[0] >= 40 * MiB  # it did grow, early on


def test_dataloader_copy_on_read_is_named_though_the_trees_rss_stays_flat() -> None:
    # 2 MiB copied a step, 4 MiB a simulated minute: 350 MiB of headroom at the start
    found, rss = watch(COPY_ON_READ, CFG, ready=True, above=350 * MiB)
    # RSS counts the shared pages in both processes: it barely moves
    assert max(rss) - min(rss) < 32 * MiB, [r // MiB for r in rss[::10]]
    assert found, "the copy-on-read leak went unnoticed"
    ((at, f),) = found
    assert 60 <= at <= 70 and f.evidence["eta_seconds"] <= 3600
