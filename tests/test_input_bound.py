"""dataloader_stall: GPU starved while the rank steps and its loader workers burn CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankwatch.detectors.input_bound import DataloaderStallDetector
from rankwatch.gpu import GpuConfig
from rankwatch.records import Finding, Severity


def drive(det: DataloaderStallDetector, start: float, end: float, *, util: float, cpu: float,
          step_every: float = 2.0, first_step: int = 1) -> list[Finding]:  # fmt: skip
    out: list[Finding] = []
    t, step, next_step = start, first_step, start
    while t <= end:
        if step_every and t >= next_step:
            det.on_step(t, step)
            step, next_step = step + 1, next_step + step_every
        det.on_cpu(t, cpu)
        if int(t) % 5 == 0:
            out += det.on_gpu(t, util)
        t += 1.0
    return out


@pytest.mark.unit
def test_starved_gpu_with_busy_loader_fires_once_then_resolves() -> None:
    det = DataloaderStallDetector(GpuConfig(), rank=2, path="rank-2.log")
    assert drive(det, 0, 500, util=0.12, cpu=350.0) == []  # the window is not covered yet
    (f,) = drive(det, 501, 900, util=0.12, cpu=350.0)
    assert f.kind == "dataloader_stall" and f.severity is Severity.WARNING and f.rank == 2
    assert "utilisation averaged 12%" in f.message and "num_workers" in f.message
    assert f.evidence["cpu_percent"] == 350.0
    assert drive(det, 901, 1100, util=0.12, cpu=350.0) == []
    fixed = drive(det, 1101, 2000, util=0.95, cpu=350.0)
    assert [x.resolved for x in fixed] == [True]


@pytest.mark.unit
def test_healthy_or_other_causes_stay_silent() -> None:
    cfg = GpuConfig()
    busy_gpu = DataloaderStallDetector(cfg, 0)
    assert drive(busy_gpu, 0, 3000, util=0.97, cpu=300.0) == []
    idle_host = DataloaderStallDetector(cfg, 0)  # GPU idle and CPU idle: I/O or network, not the loader
    assert drive(idle_host, 0, 3000, util=0.1, cpu=5.0) == []
    stalled = DataloaderStallDetector(cfg, 0)  # no steps at all: a stall, judged by the stall detector
    assert drive(stalled, 0, 3000, util=0.0, cpu=300.0, step_every=0) == []


@pytest.mark.unit
def test_short_idle_stretches_are_normal() -> None:
    """A 3-minute eval with the GPU idle inside a 10-minute window of training is not starvation."""
    det = DataloaderStallDetector(GpuConfig(), 0)
    out = drive(det, 0, 600, util=0.95, cpu=200.0)
    out += drive(det, 601, 780, util=0.02, cpu=200.0)
    out += drive(det, 781, 1500, util=0.95, cpu=200.0)
    assert out == []


@pytest.mark.unit
def test_off_with_a_zero_window() -> None:
    det = DataloaderStallDetector(GpuConfig(dataloader_window=0), 0)  # type: ignore[arg-type]
    assert drive(det, 0, 3000, util=0.0, cpu=400.0) == []


@pytest.mark.process
def test_live_agent_names_a_starved_gpu(tmp_path: Path) -> None:
    """Run mode, a CPU-bound rank, a scripted GPU at 8%: the wired agent says dataloader_stall."""
    import asyncio
    import sys

    from gpufake import FakeBackend, const, healthy
    from rankwatch.config.loader import config_from_yaml
    from rankwatch.identity import Identity
    from rankwatch.runtime.modes import run_command

    cfg = config_from_yaml(
        f"run: {{name: dl}}\ndetectors: {{warmup_steps: 5}}\nprocess: {{sample_interval: 200ms}}\n"
        f"dumps: {{dir: {tmp_path / 'dumps'}}}\n"
        f"runner: {{log_dir: {tmp_path / 'logs'}, echo: false}}\nserver: {{enabled: false}}\n"
        "gpu: {interval: 200ms, dataloader_window: 3s, dataloader_min_cpu_percent: 50}\n"
    )
    found: list[Finding] = []

    class Sink:
        def send(self, f: Finding) -> None:
            found.append(f)

    backend = FakeBackend([healthy(0, fields={"utilization": const((0.08, 0.02))})])
    cmd = [sys.executable, "-m", "rankwatch.demo.trainer", "--rank", "0", "--step-time", "0.05",
           "--busy", "--steps", "120"]  # fmt: skip
    ident = Identity(run="dl", rank=0, local_rank=0, world_size=1, node="n1")
    rc = asyncio.run(run_command(cfg, ident, cmd, sinks=[Sink()], services={"gpu_backend": backend}))
    assert rc == 0
    starved = [f for f in found if f.kind == "dataloader_stall" and not f.resolved]
    assert len(starved) == 1, [(f.kind, f.resolved) for f in found]
    assert "utilisation averaged 8%" in starved[0].message


@pytest.mark.unit
def test_memory_stays_bounded_without_gpu_readings() -> None:
    det = DataloaderStallDetector(GpuConfig(), 0)
    for t in range(20_000):
        det.on_step(float(t), t)
        det.on_cpu(float(t), 50.0)
    assert len(det.steps) <= 601 and len(det.cpu) <= 601
    off = DataloaderStallDetector(GpuConfig(dataloader_window=0), 0)  # type: ignore[arg-type]
    off.on_step(1.0, 1)
    off.on_cpu(1.0, 50.0)
    assert not off.steps and not off.cpu


@pytest.mark.unit
def test_a_finding_names_the_log_the_rank_writes_now() -> None:
    """Fed through the rank's engine: after a ``--redirects`` restart the engine's state names
    attempt_1's file, and so does what this rule finds."""
    from rankwatch.config.schema import Config
    from rankwatch.engine import RankEngine
    from rankwatch.events import GpuRound, GpuSample, ProcessSample, Progress

    eng = RankEngine(Config(), rank=2, path="attempt_0/2/stdout.log")
    eng.state.path = "attempt_1/2/stdout.log"
    found: list[Finding] = []
    step = 0
    for t in range(0, 700):
        if t % 2 == 0:
            step += 1
            found += eng.feed(Progress(now=float(t), step=step))
        found += eng.feed(ProcessSample(time=float(t), pid=7, alive=True, cpu_percent=350.0, state="running"))
        if t % 5 == 0:
            round_ = GpuRound(now=float(t), samples=(GpuSample(index=0, time=float(t), utilization=0.12),))
            found += eng.feed(round_)
    mine = [f for f in found if f.kind == "dataloader_stall"]
    assert mine and {f.path for f in mine} == {"attempt_1/2/stdout.log"}
