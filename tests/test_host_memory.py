"""host_memory_growth: a host-memory leak is named before the OOM killer ends the rank.

Fed through a rank's engine, as the live agent feeds it (process samples every 5 s)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from rankwatch.config.schema import Config, HostMemoryConfig
from rankwatch.config.snapshot import replaced
from rankwatch.detectors.host_memory import KIND, HostMemoryDetector
from rankwatch.engine import RankEngine
from rankwatch.events import ProcessSample
from rankwatch.records import Finding, Severity
from rankwatch.sources.process import memory_headroom

pytestmark = pytest.mark.unit

MiB = 1 << 20
GiB = 1 << 30
EVERY = 5.0


def run(
    rss: Callable[[float], float],
    minutes: float,
    *,
    limit: int = 64 * GiB,
    others: int = 0,
    cfg: Config | None = None,
) -> list[tuple[float, Finding]]:
    """Samples every 5 s for ``minutes``; available = limit - others - rss (others: the rest of
    the cgroup or host). Returns (minute, finding) pairs."""
    eng = RankEngine(cfg or Config(), rank=1, path="rank-1.log")
    out: list[tuple[float, Finding]] = []
    for i in range(int(minutes * 60 / EVERY)):
        t = i * EVERY
        r = int(rss(t))
        s = ProcessSample(
            time=1000.0 + t,
            pid=7,
            alive=True,
            rss_bytes=r,
            state="running",
            memory_limit_bytes=limit,
            memory_available_bytes=max(0, limit - others - r),
        )
        out.extend((t / 60, f) for f in eng.feed(s) if f.kind == KIND)  # not the stall rule's
    assert eng.internal_errors == 0
    return out


def leak(base: float, per_min: float) -> Callable[[float], float]:
    """A per-step leak under batch-to-batch noise of 300 MiB (workers come and go)."""
    return lambda t: base + per_min * t / 60 + 300 * MiB * (0.5 + 0.5 * math.sin(t / 7))


def test_a_steady_leak_is_named_before_the_limit_with_its_rate_and_time_left() -> None:
    # 8 GiB used, +60 MiB/min, 40 GiB limit with 24 GiB used by others: ~2 h left at first.
    found = run(leak(8 * GiB, 60 * MiB), 200, limit=40 * GiB, others=24 * GiB)
    fired = [(m, f) for m, f in found if not f.resolved]
    assert len(fired) == 1, [(m, f.severity) for m, f in found]
    minute, f = fired[0]
    assert f.kind == KIND and f.rank == 1 and f.severity is Severity.WARNING
    # Warned once an hour's worth of headroom is left (8 GiB + 60 MiB/min * m + others > 40 - 3.5 GiB)
    assert 60 <= minute <= 130
    assert f.evidence["slope_bytes_per_minute"] / MiB > 40
    assert f.evidence["eta_seconds"] <= 3600
    assert "OOM killer" in f.message and "MiB/min" in f.message and "limit" in f.message


def test_a_leak_minutes_from_the_limit_is_critical() -> None:
    # 10 GiB +400 MiB/min under a 24 GiB limit: ~6 min left when the 30 min window is full.
    ((minute, f),) = run(leak(10 * GiB, 400 * MiB), 40, limit=24 * GiB)
    assert f.severity is Severity.CRITICAL and f.evidence["eta_seconds"] <= 600 and 29 <= minute <= 32


def test_flat_warmup_and_sawtooth_memory_stay_silent() -> None:
    assert run(lambda t: 20 * GiB + 300 * MiB * math.sin(t / 7), 240, limit=24 * GiB) == []
    # A warm-up that fills caches for 20 min, then levels off near the limit.
    assert run(lambda t: 10 * GiB + 10 * GiB * min(1.0, t / 1200), 240, limit=24 * GiB) == []
    # A sawtooth: grows 3 GiB over 10 min, freed at every epoch end.
    assert run(lambda t: 12 * GiB + 3 * GiB * ((t % 600) / 600), 240, limit=24 * GiB) == []


def test_a_slow_leak_far_from_the_limit_is_not_news() -> None:
    # +5 MiB/min with 200 GiB free: days away, nobody should be paged.
    assert run(leak(8 * GiB, 5 * MiB), 240, limit=256 * GiB) == []


def test_it_resolves_when_the_growth_stops_and_when_the_process_exits() -> None:
    def rss(t: float) -> float:
        return 8 * GiB + 200 * MiB * min(t, 3600) / 60

    found = run(rss, 150, limit=24 * GiB)
    states = [(f.resolved, f.severity) for _, f in found]
    assert states[0][0] is False and states[-1][0] is True, states
    det = HostMemoryDetector(HostMemoryConfig(), rank=0)
    det.episode.open(None)
    from rankwatch.state import RankState

    (gone,) = det.observe(RankState(rank=0), ProcessSample(time=1.0, pid=7, alive=False))
    assert gone.resolved and gone.kind == KIND


def test_disabled_by_config() -> None:
    cfg = replaced(Config(), {"detectors.host_memory.enabled": False})
    assert run(leak(4 * GiB, 400 * MiB), 60, limit=24 * GiB, cfg=cfg) == []


def test_headroom_reads_the_tightest_cgroup_v2_ancestor(tmp_path: Path) -> None:
    """A Slurm job's limit on the job's cgroup, the step's own unlimited: the job's counts,
    its reclaimable page cache counted as free."""
    job = tmp_path / "job_42"
    step = job / "step_0"
    step.mkdir(parents=True)
    (job / "memory.max").write_text(f"{4 * GiB}\n")
    (job / "memory.current").write_text(f"{3 * GiB}\n")
    (job / "memory.stat").write_text(f"anon 1\ninactive_file {512 * MiB}\n")
    (step / "memory.max").write_text("max\n")
    real_open = open

    def fake_open(path: object, *a: object, **k: object):  # type: ignore[no-untyped-def]
        if path == f"/proc/{os.getpid()}/cgroup":
            return real_open(tmp_path / "cg", *a, **k)  # type: ignore[call-overload]
        return real_open(path, *a, **k)  # type: ignore[call-overload]

    (tmp_path / "cg").write_text("0::/job_42/step_0\n")
    import builtins

    builtins_open = builtins.open
    builtins.open = fake_open  # type: ignore[assignment]
    try:
        limit, avail = memory_headroom(os.getpid(), root=str(tmp_path))
    finally:
        builtins.open = builtins_open  # type: ignore[assignment]
    assert limit == 4 * GiB and avail == 1536 * MiB
