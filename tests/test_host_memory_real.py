"""host_memory_growth on real processes, sampled by the agent's own ``ProcessProber``.

A child Python program grows its host memory one step at a time, on command from the test
(one line on its stdin per step, "ok" back when done), so every sample sees a finished step
and nothing sleeps. The prober's clock is a ``FakeClock``: each step is followed by one
sample and the clock moves ``SIM_PER_STEP`` (30 s) of simulated time, so the detector's real
30-minute window is covered by about 65 steps, a second or two of real time.

The memory limit: the test machine's own RAM is far too large for a few hundred MiB to run
out within the hour, so the samples' headroom is that of a cgroup of ``LIMIT_ABOVE`` (700 MiB)
above the child's usage when the test starts, holding only the child's tree: its usage is
the tree's PSS (each page counted once, as a memory cgroup charges it), read from
``/proc/<pid>/smaps_rollup`` by psutil. RSS and everything else in the sample is the prober's.
The leak adds 4 MiB a step, 8 MiB a simulated minute: once the window is full (~250 MiB
leaked) what is left runs out in under an hour, so the warning must come then.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

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
        prober = ProcessProber(p.pid, clock=clock)
        limit = charged(p.pid) + above
        eng = RankEngine(cfg, rank=0, path="rank-0.log")
        for i in range(MAX_STEPS):
            step(p)
            clock.advance(SIM_PER_STEP)
            s = prober.sample()
            assert s.alive and s.rss_bytes > 0 and s.memory_available_bytes is not None
            s = dataclasses.replace(
                s, memory_limit_bytes=limit, memory_available_bytes=max(0, limit - charged(p.pid))
            )
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
