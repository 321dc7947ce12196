"""GPU telemetry with the scripted fake backend: sampler, findings, PID mapping, metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pytest

from conftest import until
from gpufake import (
    H100_TOTAL,
    FakeBackend,
    FakeGpu,
    GiB,
    MiB,
    const,
    flaky,
    healthy,
    heat_up,
    leak,
    lost,
    seq,
    switch,
    throttle,
    unsupported,
)
from gpufake import exposition as gpufake_exposition
from rankwatch.config.schema import Config, Duration
from rankwatch.config.snapshot import replaced
from rankwatch.detectors.gpu import (
    ACTIVITY_AMBIGUOUS,
    ACTIVITY_BUSY,
    ACTIVITY_IDLE,
    ACTIVITY_SPINNING,
    ACTIVITY_UNKNOWN,
    GpuDetector,
    gpu_activity,
    staircase_step,
)
from rankwatch.detectors.trend import FloorHistory, sustained_climb
from rankwatch.events import NvmlHang
from rankwatch.gpu import GpuConfig, GpuInfo, GpuSample
from rankwatch.gpu.backend import GpuError, error_kind
from rankwatch.gpu.collector import gpu_metric_families
from rankwatch.gpu.sampler import GpuSampler, attribute_pids_to_gpus
from rankwatch.records import Finding, Severity
from rankwatch.sources.polled import Poller, SourceContext, ToRank
from rankwatch.sources.polled.gpu import GpuSource

INTERVAL = 5.0
# call_timeout of the hang tests, waited out for real: short, yet a healthy fake sample (a
# thread's start and a few dict reads) fits in it on a loaded machine.
HANG_TIMEOUT = 0.08
LABELS = {"run": "llama-7b", "rank": "0", "local_rank": "0", "node": "gpu-node-01"}


def drive(
    gpus: list[FakeGpu], ticks: int, cfg: GpuConfig | None = None
) -> tuple[list[tuple[int, Finding]], GpuSampler, FakeBackend]:
    """Sample the fake every tick (5 s apart on the sampler's clock) through the detector."""
    cfg = cfg or GpuConfig()
    fb = FakeBackend(gpus)
    sampler = GpuSampler(cfg, backend=fb, clock=lambda: 1000.0 + fb.tick * INTERVAL)
    det = GpuDetector(cfg, rank=0)

    assert sampler.open()
    out: list[tuple[int, Finding]] = []
    for t in range(ticks):
        out.extend((t, f) for f in det.observe_all(sampler.sample()))
        fb.advance()
    return out, sampler, fb


def kinds(findings: list[tuple[int, Finding]]) -> list[tuple[str, bool]]:
    return [(f.kind, f.resolved) for _, f in findings]


# --- scripted sequences -> findings -------------------------------------------------------


@pytest.mark.unit
def test_healthy_gpus_stay_silent() -> None:
    findings, sampler, _ = drive([healthy(0), healthy(1)], 120)
    assert findings == []
    s = sampler.latest()[0]
    assert s.temperature == 62.0 and s.memory_total == H100_TOTAL and s.utilization == 0.98
    assert s.ecc is not None and s.ecc[("uncorrected", "volatile")] == 0


@pytest.mark.unit
def test_heat_up_fires_overheat_once_then_resolves() -> None:
    findings, _, _ = drive([heat_up(0, start=65, peak=92, over=5, cool_at=20)], 40)
    assert kinds(findings) == [("gpu_overheat", False), ("gpu_overheat", True)]
    (t_fire, fire), (t_clear, _) = findings
    # 86.6 C from tick 4: six samples in a row at or above 85 C -> tick 9.
    assert t_fire == 9
    assert fire.severity == Severity.WARNING and fire.rank == 0
    assert "92 C" in fire.message and "85 C" in fire.message and "cooling" in fire.message
    assert fire.evidence["gpu"] == 0 and fire.evidence["uuid"].startswith("GPU-")
    assert t_clear == 22  # cooled at 20, three cool samples


@pytest.mark.unit
def test_short_heat_spike_is_not_overheat() -> None:
    temps = [60.0] * 10 + [90.0] * 4 + [60.0] * 30
    findings, _, _ = drive([healthy(0, fields={"temperature": seq(temps)})], len(temps))
    assert findings == []


@pytest.mark.unit
def test_overheat_resolves_only_below_the_hysteresis_band() -> None:
    temps = [90.0] * 8 + [82.0] * 10 + [70.0] * 5
    findings, _, _ = drive([healthy(0, fields={"temperature": seq(temps)})], len(temps))
    assert [(t, f.resolved) for t, f in findings] == [(5, False), (20, True)]


@pytest.mark.unit
def test_thermal_throttle_window_fires_once_and_resolves() -> None:
    findings, _, _ = drive([throttle(0, begin=3, end=15)], 30)
    assert kinds(findings) == [("gpu_throttle", False), ("gpu_throttle", True)]
    fire = findings[0][1]
    assert findings[0][0] == 8
    assert "hw_thermal_slowdown" in fire.message and "1100 MHz" in fire.message


@pytest.mark.unit
def test_power_cap_alone_is_not_a_throttle_finding() -> None:
    findings, sampler, _ = drive([throttle(0, begin=0, end=100, reason="sw_power_cap")], 30)
    assert findings == []
    assert sampler.latest()[0].throttle == {
        "gpu_idle": False,
        "sw_power_cap": True,
        "hw_slowdown": False,
        "sw_thermal_slowdown": False,
        "hw_thermal_slowdown": False,
    }


@pytest.mark.unit
def test_leak_staircase_fires_once_with_slope_and_resolves_on_plateau() -> None:
    cfg = GpuConfig(leak_window=24, warmup_samples=4)
    findings, _, _ = drive([leak(0, step=96 * MiB, every=2, begin=0, end=60)], 100, cfg)
    assert kinds(findings) == [("gpu_memory_leak", False), ("gpu_memory_leak", True)]
    (t_fire, fire), (t_clear, _) = findings
    assert t_fire == 27  # first full window after the 4 warm-up samples
    # 96 MiB every other 5 s sample: 48 MiB per sample, 576 MiB per minute.
    assert fire.evidence["step_bytes"] == 96 * MiB
    assert fire.evidence["slope_bytes_per_sample"] == pytest.approx(48 * MiB, rel=0.05)
    assert fire.evidence["slope_bytes_per_minute"] == pytest.approx(576 * MiB, rel=0.05)
    assert "MiB per sample" in fire.message and "MiB/min" in fire.message
    assert "full in about" in fire.message
    assert 60 < t_clear < 80


@pytest.mark.unit
def test_warmup_ramp_then_plateau_is_not_a_leak() -> None:
    # Allocator warm-up: big early steps that level off, then a flat line for good.
    used = [int(20 * GiB + min(t, 8) * 900 * MiB) for t in range(80)]
    findings, _, _ = drive(
        [healthy(0, fields={"memory": seq([(u, H100_TOTAL) for u in used])})],
        80,
        GpuConfig(leak_window=24, warmup_samples=0),
    )
    assert findings == []


@pytest.mark.unit
def test_staircase_shapes() -> None:
    kw = {"min_steps": 4, "min_growth": 256 * MiB}
    stairs = [10 * GiB + (i // 2) * 64 * MiB for i in range(24)]
    assert staircase_step(stairs, **kw) == 64 * MiB
    plateau = [10 * GiB + min(i, 6) * 128 * MiB for i in range(24)]
    assert staircase_step(plateau, **kw) is None
    sawtooth = [10 * GiB + (i % 4) * 256 * MiB for i in range(24)]
    assert staircase_step(sawtooth, **kw) is None
    one_jump = [10 * GiB] * 12 + [14 * GiB] * 12
    assert staircase_step(one_jump, **kw) is None
    uneven = [10 * GiB + s * MiB for s in (0, 16, 32, 48, 1600, 1616, 1632, 1648, 3000, 3016, 3032, 3048)]
    assert staircase_step(uneven, **kw) is None  # two huge jumps among small steps


@pytest.mark.unit
def test_memory_pressure_fires_once_and_resolves() -> None:
    full = (int(H100_TOTAL * 0.97), H100_TOTAL)
    ok = (int(H100_TOTAL * 0.80), H100_TOTAL)
    mem = seq([ok] * 5 + [full] * 15 + [ok] * 10)
    findings, _, _ = drive([healthy(0, fields={"memory": mem})], 30)
    assert kinds(findings) == [("gpu_memory_pressure", False), ("gpu_memory_pressure", True)]
    assert findings[0][0] == 10
    assert "97%" in findings[0][1].message and "out-of-memory" in findings[0][1].message


@pytest.mark.unit
def test_xid_79_fires_once_with_meaning_and_resolves_after_quiet() -> None:
    cfg = GpuConfig(xid_quiet=60.0)
    gpu = healthy(0, xids={3: [79], 5: [79]})
    findings, sampler, _ = drive([gpu], 30, cfg)
    assert kinds(findings) == [("xid", False), ("xid", True)]
    (t_fire, fire), (t_clear, clear) = findings
    assert t_fire == 3 and fire.severity == Severity.CRITICAL
    assert "Xid 79" in fire.message and "fallen off the bus" in fire.message
    assert fire.evidence["xid"] == 79
    assert t_clear == 5 + 12  # 60 s after the last Xid 79
    assert clear.severity == Severity.CRITICAL
    assert sampler.latest()[0].xid_counts == {79: 2}


@pytest.mark.unit
def test_application_xid_is_a_warning_and_a_new_xid_fires_in_the_same_episode() -> None:
    findings, _, _ = drive([healthy(0, xids={2: [13], 4: [13, 31], 6: [48]})], 10)
    fired = [(f.evidence["xid"], f.severity) for _, f in findings if not f.resolved]
    assert fired == [(13, Severity.WARNING), (31, Severity.WARNING), (48, Severity.CRITICAL)]


@pytest.mark.unit
def test_lost_gpu_is_one_critical_finding_and_other_gpus_keep_sampling() -> None:
    cfg = GpuConfig(lost_reprobe=20.0)
    findings, _, fb = drive([healthy(0), lost(1, at=3, back_at=10)], 14, cfg)
    assert kinds(findings) == [("gpu_lost", False), ("gpu_lost", True)]
    (t_lost, f), (t_back, _) = findings
    assert t_lost == 3 and f.severity == Severity.CRITICAL and f.evidence["gpu"] == 1
    assert "GPU is lost" in f.message and "drain" in f.message
    # Reprobed every 4 ticks (20 s): 7 still lost, 11 answers again.
    assert t_back == 11
    # GPU 0 read every tick; GPU 1 while alive (0-2, 11-13), when lost (3) and at the failed reprobe (7).
    assert fb.calls["memory"] == 14 + (3 + 2 + 3)


@pytest.mark.unit
def test_lost_gpu_samples_carry_no_readings() -> None:
    _, sampler, _ = drive([healthy(0), lost(1, at=0)], 3)
    s0, s1 = sampler.latest()
    assert not s0.lost and s0.temperature is not None
    assert s1.lost and s1.lost_reason == "GPU is lost" and s1.temperature is None and s1.memory_used is None


@pytest.mark.unit
def test_uncorrectable_ecc_increase_fires_and_resolves() -> None:
    def ecc(unc: int) -> dict[tuple[str, str], int]:
        return {("uncorrected", "volatile"): unc, ("uncorrected", "aggregate"): unc + 5}

    script = seq([ecc(2)] * 5 + [ecc(3)] * 10)  # 2 already there when the agent starts
    every = GpuConfig(health_interval=Duration(INTERVAL))  # the counters read at every sample
    findings, _, _ = drive([healthy(0, fields={"ecc_errors": script})], 15, every)
    assert [(t, f.severity, f.resolved) for t, f in findings] == [
        (0, Severity.INFO, False),  # the board's history, told once
        (3, Severity.INFO, True),
        (5, Severity.CRITICAL, False),
        (8, Severity.CRITICAL, True),
    ]
    assert (
        "before this agent started: 2 uncorrectable ECC errors since the driver loaded"
        in findings[0][1].message
    )
    assert "7 uncorrectable ECC errors in the board's lifetime" in findings[0][1].message
    assert "from 2 to 3" in findings[2][1].message


@pytest.mark.unit
def test_pending_remap_then_failure_escalates() -> None:
    rows = seq([(0, 0, False, False)] * 2 + [(0, 1, True, False)] * 3 + [(0, 1, True, True)] * 3)
    every = GpuConfig(health_interval=Duration(INTERVAL))
    findings, _, _ = drive([healthy(0, fields={"remapped_rows": rows})], 8, every)
    assert [(f.kind, f.severity) for _, f in findings] == [
        ("ecc_error", Severity.WARNING),
        ("ecc_error", Severity.CRITICAL),
    ]


# --- health counters on their own cadence (gpu.health_interval) ------------------------------


def _per_tick(
    gpus: list[FakeGpu], ticks: int, cfg: GpuConfig | None = None
) -> tuple[list[list[GpuSample]], dict[str, int]]:
    """Every tick's samples (5 s apart on the sampler's clock) and the backend's call counts."""
    fb = FakeBackend(gpus)
    sampler = GpuSampler(cfg or GpuConfig(), backend=fb, clock=lambda: 1000.0 + fb.tick * INTERVAL)

    assert sampler.open()
    out = []
    for _ in range(ticks):
        out.append(sampler.sample())
        fb.advance()
    return out, dict(fb.calls)


@pytest.mark.unit
def test_health_counters_are_read_every_health_interval_and_carried_forward_between() -> None:
    assert float(GpuConfig().health_interval) == 30.0  # dcgm-exporter's default collection interval
    rounds, calls = _per_tick([healthy(0, fields={"pcie_replays": lambda t: t})], 13)
    # 30 s at 5 s a sample: ticks 0, 6 and 12 read the board; the fast readings every tick
    for name in ("power_limit", "ecc_errors", "retired_pages", "remapped_rows", "pcie_replays", "violations"):
        assert calls[name] == 3, name
    assert calls["temperature"] == calls["utilization"] == calls["power"] == 13
    fresh = [t for t, (s,) in enumerate(rounds) if s.health_fresh]
    assert fresh == [0, 6, 12]
    for (s,) in rounds:  # carried forward: /metrics keeps every series between reads
        assert s.ecc is not None and s.retired_pages is not None and s.remapped_rows is not None
        assert s.violations is not None and s.temperature == 62.0
    assert [s.pcie_replays for (s,) in rounds] == [0] * 6 + [6] * 6 + [12]


@pytest.mark.unit
def test_a_new_ecc_error_is_found_within_one_health_interval_and_carried_rounds_decide_nothing() -> None:
    def ecc(unc: int) -> dict[tuple[str, str], int]:
        return {("uncorrected", "volatile"): unc, ("uncorrected", "aggregate"): unc}

    errors = switch(8, const(ecc(0)), const(ecc(1)))  # between the reads at ticks 6 and 12
    findings, _, _ = drive([healthy(0, fields={"ecc_errors": errors})], 60)
    assert [(t, f.severity, f.resolved) for t, f in findings] == [
        (12, Severity.CRITICAL, False),  # 4 samples (20 s) after the error: within 30 s
        (30, Severity.CRITICAL, True),  # clear_samples (3) reads without news: 18, 24, 30
    ]
    assert "from 0 to 1" in findings[0][1].message


@pytest.mark.unit
def test_an_xid_reads_the_memory_counters_at_the_next_sample() -> None:
    errors = switch(8, const({("uncorrected", "volatile"): 0}), const({("uncorrected", "volatile"): 1}))
    gpu = healthy(0, fields={"ecc_errors": errors}, xids={8: [48]})
    findings, _, _ = drive([gpu], 12)
    ecc = [(t, f.severity) for t, f in findings if f.kind == "ecc_error"]
    assert ecc == [(9, Severity.CRITICAL)]  # not at tick 12, the next scheduled read


@pytest.mark.unit
def test_carried_counters_neither_fire_nor_resolve_an_ecc_episode() -> None:
    fresh = [_ecc(uncorrected=0), _ecc(uncorrected=1)]
    carried = [{**_ecc(uncorrected=1), "health_fresh": False}] * 10
    findings = ecc_run(fresh + carried + [_ecc(uncorrected=1)] * 3)
    assert [(t, f.severity, f.resolved) for t, f in findings] == [
        (1, Severity.CRITICAL, False),
        (14, Severity.CRITICAL, True),  # the third read without news, not the third sample
    ]
    # a carried round with a different value (it cannot happen) is not news either
    assert ecc_run([_ecc(uncorrected=0), {**_ecc(uncorrected=5), "health_fresh": False}]) == []


@pytest.mark.unit
def test_a_failed_health_reading_is_retried_at_the_next_sample() -> None:
    first_fails = seq([GpuError("failed", "Timeout", code=10)] + [(0, 0, False, False)] * 20)
    rounds, calls = _per_tick([healthy(0, fields={"remapped_rows": first_fails})], 8)
    assert [s.remapped_rows is not None for (s,) in rounds] == [False] + [True] * 7
    # read again at tick 1, then a health interval (6 ticks) from that read
    assert [s.health_fresh for (s,) in rounds] == [True, True] + [False] * 5 + [True]
    assert calls["remapped_rows"] == calls["ecc_errors"] == 3


# --- degraded backends -----------------------------------------------------------------------


@pytest.mark.unit
def test_not_supported_fields_are_skipped_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rankwatch.gpu")
    names = ("memory_temperature", "ecc_errors", "retired_pages")
    findings, sampler, fb = drive([unsupported(0, names), unsupported(1, names)], 6)
    assert findings == []
    for s in sampler.latest():
        assert s.memory_temperature is None and s.ecc is None and s.retired_pages is None
        assert s.temperature == 62.0 and s.remapped_rows == {"correctable": 0, "uncorrectable": 0}
    assert fb.calls["memory_temperature"] == 2  # once per GPU, never again
    assert fb.calls["temperature"] == 12
    for name in names:
        assert sum(f"{name} not supported" in r.getMessage() for r in caplog.records) == 1
    text = exposition({0: sampler.latest()}, up=sampler.up)
    assert "rankwatch_gpu_memory_temperature_celsius" not in text
    assert "rankwatch_gpu_ecc_errors_total" not in text
    assert "rankwatch_gpu_temperature_celsius{" in text


@pytest.mark.unit
def test_xid_events_not_supported_disable_the_event_wait() -> None:
    fb = FakeBackend([healthy(0)], xid_supported=False)
    sampler = GpuSampler(backend=fb)

    assert sampler.open()
    for _ in range(3):
        assert len(sampler.sample()) == 1
    assert fb.calls["xid_events"] == 1


def _source(fb: FakeBackend, cfg: GpuConfig) -> tuple[Poller, GpuSource]:
    """The agent's path: the registered GPU source under the polled sources' policy."""
    ctx = SourceContext(cfg=replaced(Config(), gpu=cfg), folders=dict, rank=0, backends={"gpu": fb})
    src = GpuSource.create(ctx)
    assert src is not None
    return Poller(src, {}), src


def _samples(events: list[Any] | None) -> list[GpuSample]:
    return [s for e in events or [] if isinstance(e, ToRank) for s in e.event.samples]


@pytest.mark.unit
@pytest.mark.timeout(20)
def test_hung_call_returns_within_timeout_and_does_not_pile_up_threads() -> None:
    release = threading.Event()
    fb = FakeBackend([healthy(0, hang={"temperature": release})])
    poller, src = _source(fb, GpuConfig(call_timeout=HANG_TIMEOUT))

    async def go() -> None:
        assert await poller.open()
        assert _samples(await poller.once(HANG_TIMEOUT)) == []  # a call not timed out hangs (test timeout)
        assert not src.sampler.up and src.sampler.timeouts == 1
        for _ in range(3):  # waited for again, not called again: no second thread on the hung call
            assert _samples(await poller.once(HANG_TIMEOUT)) == []
        assert fb.calls["temperature"] == 1 and src.sampler.timeouts == 1
        release.set()
        await until(lambda: src.sampler.up, timeout=2.0)
        fb.gpus[0].hang.clear()
        samples = _samples(await poller.once(5.0))
        assert len(samples) == 1 and samples[0].temperature == 62.0

    try:
        asyncio.run(go())
    finally:
        release.set()


@pytest.mark.unit
def test_no_nvml_logs_one_line_and_exports_collector_down(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="rankwatch.gpu")
    fb = FakeBackend([], init_error="NVML Shared Library Not Found")
    sampler = GpuSampler(backend=fb)

    assert not sampler.open()
    assert sampler.sample() == []
    assert [r.getMessage() for r in caplog.records] == [
        "NVML not available: NVML Shared Library Not Found; GPU metrics disabled"
    ]
    assert caplog.records[0].levelno == logging.INFO  # a CPU-only node: normal, no WARNING each start
    families = gpu_metric_families({0: sampler.latest()}, LABELS, up=sampler.up)
    assert [f.name for f in families] == ["rankwatch_gpu_collector_up"]
    assert families[0].samples[0].value == 0.0
    assert families[0].samples[0].labels == {"run": "llama-7b", "rank": "0", "node": "gpu-node-01"}


@pytest.mark.unit
def test_nvml_failing_on_a_gpu_node_is_still_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="rankwatch.gpu")
    sampler = GpuSampler(backend=FakeBackend([], init_error="Driver/library version mismatch"))
    assert not sampler.open()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "NVML not available: Driver/library version mismatch; GPU metrics disabled")
    ]


@pytest.mark.unit
def test_run_loop_samples_until_stopped() -> None:
    poller, _ = _source(FakeBackend([healthy(0)]), GpuConfig(interval=Duration(0.05)))
    got: list[list[Any]] = []

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(poller.run(stop, got.append))
        await until(lambda: len(got) >= 3, timeout=2.0)
        stop.set()
        await asyncio.wait_for(task, 1.0)

    asyncio.run(go())
    assert all(len(_samples(events)) == 1 for events in got)


@pytest.mark.unit
def test_error_kinds_from_nvml_codes() -> None:
    assert error_kind(3) == "not_supported"
    assert error_kind(15) == "gone"
    assert error_kind(999, "Unknown Error") == "unknown"  # lost only when it persists
    assert error_kind(None, "Unknown Error") == "unknown"
    assert error_kind(16) == "gone"
    assert error_kind(None, "GPU has fallen off the bus") == "gone"
    assert error_kind(12, "NVML Shared Library Not Found") == "failed"


# --- PID -> GPU mapping ----------------------------------------------------------------------

DEVICES = [GpuInfo(i, uuid=f"GPU-{i}abc{i}-0000-1111", name="H100") for i in range(8)]


def map_pids_to_gpus(
    pids: Iterable[int],
    env: Mapping[str, str],
    *,
    processes: Mapping[int, Iterable[int]] | None = None,
    devices: Sequence[GpuInfo] = (),
) -> list[int] | None:
    """``attribute_pids_to_gpus`` (what the GPU source ties each rank's GPUs with) without the how."""
    return attribute_pids_to_gpus(pids, env, processes=processes, devices=devices)[0]


@pytest.mark.unit
def test_pids_map_through_nvml_process_lists_first() -> None:
    procs = {0: [111], 3: [4242, 999], 5: [4243]}
    env = {"CUDA_VISIBLE_DEVICES": "6", "LOCAL_RANK": "6"}
    assert map_pids_to_gpus([4242, 4243], env, processes=procs, devices=DEVICES) == [3, 5]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1"}, [3]),
        ({"CUDA_VISIBLE_DEVICES": "5", "LOCAL_RANK": "3"}, [5]),  # one GPU per task (Slurm)
        ({"CUDA_VISIBLE_DEVICES": "4,5"}, [4, 5]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-2abc2,GPU-7abc7", "SLURM_LOCALID": "1"}, [7]),
        ({"CUDA_VISIBLE_DEVICES": "1,MIG-abc,3"}, [1]),  # parsing stops like CUDA's
        ({"CUDA_VISIBLE_DEVICES": "1,99"}, [1]),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, []),
        ({"LOCAL_RANK": "6"}, [6]),
        ({"LOCAL_RANK": "9"}, None),
        ({}, None),
    ],
)
def test_pids_map_through_env_fallbacks(env: dict[str, str], expected: list[int] | None) -> None:
    assert map_pids_to_gpus([4242], env, processes={0: [1]}, devices=DEVICES) == expected


@pytest.mark.unit
def test_sampler_watches_the_gpu_holding_the_pid() -> None:
    gpus = [healthy(i, fields={"compute_pids": const([7000 + i])}) for i in range(4)]
    fb = FakeBackend(gpus)
    sampler = GpuSampler(backend=fb)

    assert sampler.open()
    by_pid = sampler.map([(0, [1, 7002], {"LOCAL_RANK": "0"})])
    indices = [s.index for s in sampler.sample()]
    by_env = sampler.map([(1, [1], {"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "1"})])
    assert by_pid == {2: 0} and by_env == {1: 1} and indices == [2]


@pytest.mark.unit
def test_configured_devices_win_and_accept_uuids() -> None:
    fb = FakeBackend([healthy(i) for i in range(4)])
    sampler = GpuSampler(GpuConfig(devices=["3", "GPU-00000001"]), backend=fb)

    assert sampler.open()
    sampler.map([(0, [1], {"LOCAL_RANK": "0"})])
    assert [s.index for s in sampler.sample()] == [1, 3]


# --- activity ------------------------------------------------------------------------------


def _s(util: float | None, power: float | None, mem: float | None = 0.3, lost: bool = False) -> GpuSample:
    return GpuSample(
        index=0,
        time=0.0,
        utilization=util,
        memory_utilization=mem,
        power=power,
        power_limit=700.0,
        lost=lost,
    )


@pytest.mark.unit
def test_gpu_activity_classes() -> None:
    assert gpu_activity([_s(0.98, 610.0)] * 3) == ACTIVITY_BUSY
    assert gpu_activity([_s(1.0, 110.0, mem=0.0)] * 3) == ACTIVITY_SPINNING
    assert gpu_activity([_s(0.0, 75.0, mem=0.0)] * 3) == ACTIVITY_IDLE
    assert gpu_activity([_s(0.02, 80.0), _s(0.0, 75.0)]) == ACTIVITY_IDLE
    # Without a power reading, full utilisation proves nothing; memory traffic decides where read.
    assert gpu_activity([_s(1.0, None, mem=None)]) == ACTIVITY_AMBIGUOUS
    assert gpu_activity([_s(1.0, None, mem=0.02)] * 3) == ACTIVITY_SPINNING
    assert gpu_activity([_s(1.0, None, mem=0.45)] * 3) == ACTIVITY_BUSY
    assert gpu_activity([_s(0.6, None, mem=None)] * 3) == ACTIVITY_BUSY  # kernels come and go
    assert gpu_activity([_s(None, None)]) == ACTIVITY_UNKNOWN
    assert gpu_activity([_s(0.0, 75.0, lost=True)]) == ACTIVITY_UNKNOWN
    assert gpu_activity([]) == ACTIVITY_UNKNOWN


# --- metrics -------------------------------------------------------------------------------


def exposition(samples_by_rank: dict, up: bool) -> str:
    return gpufake_exposition(samples_by_rank, LABELS, up)


def _value(families: list, name: str, **labels: str) -> float | None:
    for fam in families:
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def _sampled_families() -> tuple[list, list[GpuSample]]:
    gpus = [
        healthy(0, xids={1: [79, 79, 13, 160]}),
        lost(1, at=1),
        unsupported(2, ("memory_temperature",)),
    ]
    _, sampler, _ = drive(gpus, 3)
    samples = sampler.latest()
    return gpu_metric_families({0: samples}, LABELS, up=sampler.up), samples


@pytest.mark.unit
def test_metric_families_values_labels_and_absent_fields() -> None:
    fams, samples = _sampled_families()
    names = {f.name for f in fams}
    assert {
        "rankwatch_gpu_collector_up",
        "rankwatch_gpu_utilization_ratio",
        "rankwatch_gpu_memory_utilization_ratio",
        "rankwatch_gpu_memory_used_bytes",
        "rankwatch_gpu_memory_total_bytes",
        "rankwatch_gpu_temperature_celsius",
        "rankwatch_gpu_memory_temperature_celsius",
        "rankwatch_gpu_power_watts",
        "rankwatch_gpu_power_limit_watts",
        "rankwatch_gpu_sm_clock_hertz",
        "rankwatch_gpu_memory_clock_hertz",
        "rankwatch_gpu_throttle_reason",
        "rankwatch_gpu_ecc_errors",
        "rankwatch_gpu_retired_pages",
        "rankwatch_gpu_remapped_rows",
        "rankwatch_gpu_pcie_replay",
        "rankwatch_gpu_xid_errors",
    } <= names
    g0 = {
        "gpu": "0",
        "rank": "0",
        "local_rank": "0",
        "run": "llama-7b",
        "node": "gpu-node-01",
        "uuid": samples[0].uuid,
    }
    assert _value(fams, "rankwatch_gpu_collector_up") == 1.0
    assert _value(fams, "rankwatch_gpu_utilization_ratio", **g0) == 0.98
    assert _value(fams, "rankwatch_gpu_power_watts", **g0) == 610.0
    assert _value(fams, "rankwatch_gpu_sm_clock_hertz", **g0) == 1.98e9
    assert _value(fams, "rankwatch_gpu_throttle_reason", reason="sw_power_cap", **g0) == 0.0
    assert _value(fams, "rankwatch_gpu_ecc_errors_total", type="corrected", scope="aggregate", **g0) == 3
    assert _value(fams, "rankwatch_gpu_xid_errors_total", xid="79", **g0) == 2
    assert _value(fams, "rankwatch_gpu_xid_errors_total", xid="13", **g0) == 1
    assert _value(fams, "rankwatch_gpu_xid_errors_total", xid="other", **g0) == 1  # 160: bounded label
    # The lost GPU: only its lost flag, no stale or zero readings.
    assert _value(fams, "rankwatch_gpu_lost", gpu="1") == 1.0
    assert _value(fams, "rankwatch_gpu_temperature_celsius", gpu="1") is None
    # Unsupported memory temperature on GPU 2: no series, not a zero.
    assert _value(fams, "rankwatch_gpu_memory_temperature_celsius", gpu="2") is None
    assert _value(fams, "rankwatch_gpu_memory_temperature_celsius", gpu="0") == 70.0


@pytest.mark.tool
def test_exposition_passes_promtool() -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.path.exists(promtool):
        pytest.skip("promtool not installed")
    _, samples = _sampled_families()
    text = exposition({0: samples, 1: samples[:1]}, up=True)
    assert "rankwatch_gpu_ecc_errors_total{" in text and "rankwatch_gpu_pcie_replay_total{" in text
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == "", res.stdout + res.stderr
    down = exposition({}, up=False)
    assert "rankwatch_gpu_collector_up" in down and "} 0.0" in down
    res = subprocess.run(
        [promtool, "check", "metrics"], input=down, capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 0, res.stdout + res.stderr


# --- slow leaks: the long horizon -------------------------------------------------------------


def memory_run(
    used: Callable[[int], float], ticks: int, cfg: GpuConfig | None = None
) -> list[tuple[int, Finding]]:
    """Feed the detector one memory reading per 5 s tick, no driver involved."""
    det = GpuDetector(cfg or GpuConfig(), rank=0)
    out: list[tuple[int, Finding]] = []
    for t in range(ticks):
        s = GpuSample(
            index=0,
            time=1000.0 + t * INTERVAL,
            uuid="GPU-0",
            memory_used=int(used(t)),
            memory_total=H100_TOTAL,
        )
        out.extend((t, f) for f in det.observe_sample(s))
    return out


HOUR = 720  # ticks of 5 s


@pytest.mark.unit
def test_slow_overnight_leak_fires_on_the_long_horizon_and_resolves_when_it_stops() -> None:
    # 40 MiB every 30 s from 10 GiB: 80 MiB/min, too slow for the 3-minute staircase window.
    def used(t: int) -> float:
        return 10 * GiB + 40 * MiB * (min(t, int(2.5 * HOUR)) // 6)

    assert used(4 * HOUR) > 10 * GiB + 11 * GiB  # held at 21.7 GiB after 2.5 h, 28.7 GiB if it ran 4 h
    findings = memory_run(used, 4 * HOUR)
    assert kinds(findings) == [("gpu_memory_leak", False), ("gpu_memory_leak", True)]
    (t_fire, fire), (t_clear, clear) = findings
    assert HOUR <= t_fire <= HOUR + 24  # the first full hour of history after warm-up
    assert fire.severity == Severity.WARNING and fire.evidence["horizon"] == "long"
    assert fire.evidence["slope_bytes_per_minute"] == pytest.approx(80 * MiB, rel=0.05)
    assert "80.0 MiB/min" in fire.message and "full in about" in fire.message
    assert "every quarter" in fire.message and "torch.cuda.memory snapshot" in fire.message
    assert int(2.5 * HOUR) < t_clear <= int(2.5 * HOUR) + 20 * 12  # within ~20 min of the stop
    assert "stopped climbing" in clear.message


@pytest.mark.unit
def test_slow_staircase_every_ten_minutes_is_a_leak() -> None:
    findings = memory_run(lambda t: 30 * GiB + 200 * MiB * (t // 120), 2 * HOUR)
    assert kinds(findings) == [("gpu_memory_leak", False)]
    assert findings[0][1].evidence["horizon"] == "long"


def _noise(seed: int, amplitude: float) -> Callable[[int], float]:
    rng = random.Random(seed)
    values = [rng.uniform(-amplitude, amplitude) for _ in range(5 * HOUR)]
    return lambda t: values[t]


# Warm-up: weights and optimizer state in the first steps, then ever smaller and rarer growth
# (new shapes, the allocator's pools) for about four minutes, then flat for good.
_WARMUP = {1: 6 * GiB, 2: 4 * GiB, 3: 1536 * MiB, 5: 700 * MiB, 9: 500 * MiB, 14: 300 * MiB, 22: 200 * MiB,
           35: 150 * MiB, 48: 100 * MiB}  # fmt: skip


def _warmup_then_flat(t: int) -> float:
    return 20 * GiB + sum(v for tick, v in _WARMUP.items() if t >= tick)


@pytest.mark.unit
@pytest.mark.parametrize(
    "shape",
    [
        "warmup_then_flat_with_noise",
        "linear_three_minute_warmup",
        "eval_spikes_that_return",
        "first_eval_jump",
        "one_off_allocator_jump",
        "growth_that_slows_down",
    ],
)
def test_healthy_memory_shapes_stay_silent_for_four_hours(shape: str) -> None:
    noise = _noise(7, 6 * MiB)

    def used(t: int) -> float:
        base = _warmup_then_flat(t) + noise(t)
        if shape == "eval_spikes_that_return":  # +3 GiB for a minute every 20 minutes
            return base + (3 * GiB if t % 240 >= 228 else 0)
        if shape == "first_eval_jump":  # the first eval grows the cache once, and it stays
            return base + (2 * GiB if t >= 240 else 0)
        if shape == "one_off_allocator_jump":  # a new, larger batch shape after 2 hours
            return base + (3 * GiB if t >= 2 * HOUR else 0) + (256 * MiB if t >= 3 * HOUR else 0)
        if shape == "linear_three_minute_warmup":
            return 20 * GiB + min(t, 36) * 100 * MiB + noise(t)
        if shape == "growth_that_slows_down":  # new maximum sequence lengths, ever rarer
            return base + 300 * MiB * sum(t >= 12 * m for m in (1, 2, 4, 8, 16, 32, 64, 128))
        return base

    assert memory_run(used, 4 * HOUR) == []


@pytest.mark.unit
def test_sustained_climb_shapes() -> None:
    def pts(values: list[float]) -> list[tuple[float, float]]:
        return [(60.0 * i, v) for i, v in enumerate(values)]

    kw = {"min_growth": 512 * MiB}
    linear = [10 * GiB + i * 20 * MiB for i in range(61)]
    climb = sustained_climb(pts(linear), **kw)
    assert climb is not None and climb.per_minute == pytest.approx(20 * MiB)
    warmup = [10 * GiB + min(i, 10) * 300 * MiB for i in range(61)]
    assert sustained_climb(pts(warmup), **kw) is None
    jump = [10 * GiB + (4 * GiB if i >= 30 else 0) + i * MiB for i in range(61)]
    assert sustained_climb(pts(jump), **kw) is None  # the jump is left out; 60 MiB remain
    jump_and_leak = [v + i * 15 * MiB for i, v in enumerate(jump)]
    got = sustained_climb(pts(jump_and_leak), **kw)
    assert got is not None and got.jump == pytest.approx(4 * GiB + 16 * MiB)  # a jump cannot hide a leak
    assert climb.jump == 0.0  # a regular climb has no one-off jump to leave out
    sawtooth = [10 * GiB + (i % 10) * 200 * MiB + i * 10 * MiB for i in range(61)]
    assert sustained_climb(pts(sawtooth), **kw) is None
    late = [10 * GiB + max(0, i - 40) * 60 * MiB for i in range(61)]
    assert sustained_climb(pts(late), **kw) is None  # climbing for 20 minutes is not yet sustained


@pytest.mark.unit
def test_floor_history_keeps_the_lowest_reading_per_minute_and_a_bounded_window() -> None:
    h = FloorHistory(60.0, 3600.0)
    closed = [h.add(float(t), 100.0 + (50.0 if t % 60 == 30 else 0.0) + t / 60) for t in range(40, 7260, 5)]
    assert sum(closed) == 119 and len(h.points) == 61  # the first minute, seen from 40 s on, is dropped
    assert all(v == pytest.approx(100.0 + t / 60) for t, v in h.points)  # spikes never make the floor
    assert h.full() and h.points[-1][0] - h.points[0][0] == 3600.0


# --- stall: full utilisation without a power reading ------------------------------------------


@pytest.mark.unit
def test_nccl_spin_without_power_reading_is_not_life_for_the_stall_detector() -> None:
    from rankwatch.config.schema import StallConfig
    from rankwatch.detectors.liveness import StallDetector
    from rankwatch.sources.process import ProcessSample
    from rankwatch.state import RankState

    def spin(t: float, mem: float | None) -> GpuSample:
        # Power NOT_SUPPORTED (vGPU, some boards): only utilisation and maybe memory traffic.
        return GpuSample(index=0, time=t, utilization=1.0, memory_utilization=mem)

    for mem in (None, 0.01):
        det = StallDetector(StallConfig(), started=0.0)
        state = RankState(rank=3, path="rank-3.log")
        fired: list[Finding] = []
        for t in range(1000, 2400, 5):  # a silent rank, past its grace, CPU idle, NCCL kernel spinning
            det.on_gpu(float(t), gpu_activity([spin(float(t), mem)] * 3))
            sample = ProcessSample(time=float(t), pid=42, alive=True, cpu_time_s=1.0, state="sleeping")
            fired += det.on_sample(state, sample, float(t))
        assert [f.kind for f in fired] == ["stall"], mem
        assert fired[0].evidence["gpu_activity"] in (ACTIVITY_AMBIGUOUS, ACTIVITY_SPINNING)


# --- ECC beyond a rising uncorrectable count --------------------------------------------------


def ecc_run(
    samples: list[dict], cfg: GpuConfig | None = None, every: float = INTERVAL
) -> list[tuple[int, Finding]]:
    det = GpuDetector(cfg or GpuConfig(), rank=0)
    out: list[tuple[int, Finding]] = []
    for t, fields in enumerate(samples):
        s = GpuSample(index=0, time=1000.0 + t * every, uuid="GPU-0", **fields)
        out.extend((t, f) for f in det.observe_sample(s))
    return out


def _ecc(corrected: int = 0, uncorrected: int = 0, aggregate_unc: int | None = None) -> dict:
    return {
        "ecc": {
            ("corrected", "volatile"): corrected,
            ("uncorrected", "volatile"): uncorrected,
            ("corrected", "aggregate"): corrected + 40,
            ("uncorrected", "aggregate"): uncorrected if aggregate_unc is None else aggregate_unc,
        }
    }


@pytest.mark.unit
def test_uncorrectable_history_at_the_first_sample_is_told_once_as_info() -> None:
    rows = {"remapped_rows": {"correctable": 0, "uncorrectable": 2}}
    findings = ecc_run([{**_ecc(aggregate_unc=4), **rows}] * 200)
    assert [(t, f.severity, f.resolved) for t, f in findings] == [
        (0, Severity.INFO, False),
        (3, Severity.INFO, True),
    ]
    msg = findings[0][1].message
    assert "before this agent started: 4 uncorrectable ECC errors in the board's lifetime" in msg
    assert "2 rows remapped" in msg and "Xid 48" in msg
    assert ecc_run([_ecc()] * 20) == []  # a clean board: nothing


@pytest.mark.unit
def test_retired_pages_increasing_is_reported_and_double_bit_is_critical() -> None:
    def pages(sbe: int, dbe: int) -> dict:
        # A page retired while the GPU runs stays "pending" until the next reset.
        return {
            "retired_pages": {"single_bit_ecc": sbe, "double_bit_ecc": dbe},
            "retired_pages_pending": sbe + dbe > 0,
        }

    seqs = [pages(0, 0)] * 5 + [pages(1, 0)] * 5 + [pages(2, 0)] * 5 + [pages(2, 1)] * 100
    findings = ecc_run(seqs)
    assert [(t, f.severity, f.resolved) for t, f in findings] == [
        (5, Severity.WARNING, False),  # the second single-bit retirement (tick 10) does not repeat
        (15, Severity.CRITICAL, False),  # nor does the pending flag, for as long as it stays set
    ]
    assert "1 more page(s) retired (single-bit-ecc, now 1)" in findings[0][1].message
    assert "page retirement is pending" in findings[0][1].message
    assert "double-bit-ecc" in findings[1][1].message


@pytest.mark.unit
def test_sustained_corrected_errors_are_info_a_storm_is_a_warning_and_a_burst_is_nothing() -> None:
    cfg = GpuConfig(ecc_corrected_rate=10.0, ecc_corrected_window=3600.0)
    steady = [_ecc(corrected=t // 120) for t in range(3 * HOUR)]  # one every 10 min: 6/h, below 10/h
    assert ecc_run(steady, cfg) == []
    trickle = [_ecc(corrected=t // 48) for t in range(3 * HOUR)]  # one every 4 min: 15/h
    findings = ecc_run(trickle, cfg)
    assert [(f.severity, f.resolved) for _, f in findings] == [(Severity.INFO, False)]
    assert HOUR <= findings[0][0] <= HOUR + 2
    assert "corrected ECC errors keep coming: +15 in 60 min (15/h)" in findings[0][1].message
    storm = [_ecc(corrected=t // 2) for t in range(2 * HOUR)]  # 360/h
    findings = ecc_run(storm, cfg)
    assert [(f.severity, f.resolved) for _, f in findings] == [(Severity.WARNING, False)]
    burst = [_ecc(corrected=0 if t < 100 else 500) for t in range(3 * HOUR)]  # one event, then quiet
    assert ecc_run(burst, cfg) == []
    stops = [_ecc(corrected=min(t, HOUR + 100) // 48) for t in range(4 * HOUR)]
    findings = ecc_run(stops, cfg)
    assert [(f.severity, f.resolved) for _, f in findings] == [(Severity.INFO, False), (Severity.INFO, True)]


# --- NVML Unknown Error (999) -------------------------------------------------------------------


@pytest.mark.unit
def test_one_unknown_error_is_a_skipped_sample_not_a_lost_gpu() -> None:
    findings, sampler, _ = drive([healthy(0), flaky(1, ticks={3, 4, 7})], 12)
    assert findings == []
    assert not any(s.lost for s in sampler.latest())


@pytest.mark.unit
def test_persistent_unknown_error_becomes_gpu_lost_and_stays_lost_while_reprobes_fail() -> None:
    cfg = GpuConfig(lost_after=3, lost_reprobe=10.0)
    findings, sampler, _ = drive([healthy(0), flaky(1, ticks=set(range(3, 12)))], 16, cfg)
    assert [(t, f.kind, f.resolved) for t, f in findings] == [(5, "gpu_lost", False), (13, "gpu_lost", True)]
    f = findings[0][1]
    assert f.severity == Severity.CRITICAL and f.evidence["gpu"] == 1
    assert "Unknown Error (NVML error 999) on every reading for 3 samples in a row" in f.message
    assert sampler.latest()[1].temperature == 62.0


@pytest.mark.unit
def test_gpu_is_lost_is_still_immediate() -> None:
    findings, _, _ = drive([lost(0, at=2)], 4, GpuConfig(lost_after=5))
    assert [(t, f.kind) for t, f in findings] == [(2, "gpu_lost")]


# --- labels and names ---------------------------------------------------------------------------


@pytest.mark.unit
def test_series_carry_local_rank_for_the_own_rank_and_for_mapped_ranks() -> None:
    _, samples = _sampled_families()
    fams = gpu_metric_families(
        {0: samples[:1], 5: samples[:1], 9: samples[:1]}, {**LABELS, "local_rank": "2"}, local_ranks={5: 1}
    )
    locals_ = {
        (s.labels["rank"], s.labels["local_rank"])
        for f in fams
        if f.name == "rankwatch_gpu_temperature_celsius"
        for s in f.samples
    }
    assert locals_ == {("0", "2"), ("5", "1"), ("9", "")}
    text = exposition({0: samples}, up=True)
    assert 'rankwatch_gpu_memory_used_bytes{gpu="0",local_rank="0",node="gpu-node-01",rank="0"' in text


@pytest.mark.unit
def test_metric_names_follow_prometheus_conventions() -> None:
    _, samples = _sampled_families()
    text = exposition({0: samples}, up=True)
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
    assert types["rankwatch_gpu_retired_pages_total"] == "counter"
    assert types["rankwatch_gpu_remapped_rows_total"] == "counter"
    assert 'rankwatch_gpu_retired_pages_total{cause="single_bit_ecc"' in text
    assert 'rankwatch_gpu_remapped_rows_total{gpu="0"' in text
    for name, kind in types.items():
        assert name.endswith("_total") == (kind == "counter"), name


@pytest.mark.unit
def test_a_hang_clears_the_last_readings_and_a_long_one_is_a_finding() -> None:
    """While NVML hangs, /metrics must not keep serving the last good temperature and memory,
    and a hang that lasts (the way a GPU off the bus first shows) pages, then resolves."""
    from rankwatch.detectors.gpu import NvmlHangRule

    release = threading.Event()
    fb = FakeBackend([healthy(0)])
    poller, src = _source(fb, GpuConfig(call_timeout=HANG_TIMEOUT))
    sampler = src.sampler

    async def go() -> None:
        assert await poller.open()
        assert len(_samples(await poller.once(5.0))) == 1 and len(sampler.latest()) == 1
        assert sampler.hung_for() is None
        fb.gpus[0].hang["temperature"] = release
        (hang,) = await poller.once(HANG_TIMEOUT) or []
        assert sampler.latest() == [] and src.view() == ({}, False)
        assert isinstance(hang, NvmlHang) and hang.hung_for is not None and hang.hung_for >= 0.0
        release.set()
        await until(lambda: sampler.up, timeout=2.0)
        assert sampler.hung_for() is None

    try:
        asyncio.run(go())
    finally:
        release.set()

    rule = NvmlHangRule(60.0, rank=3)
    assert rule.judge(None) == [] and rule.judge(59.0) == []
    (f,) = rule.judge(61.0)
    assert f.kind == "gpu_unresponsive" and f.rank == 3 and "dmesg" in f.message and not f.resolved
    assert rule.judge(120.0) == []  # once per episode
    (r,) = rule.judge(None)
    assert r.resolved


@pytest.mark.unit
def test_a_finding_on_a_gpu_not_tied_to_the_rank_says_it_may_be_another_jobs() -> None:
    from rankwatch.detectors.gpu import GpuDetector

    det = GpuDetector(GpuConfig(), 0)
    lost = "GPU is lost"
    (mine,) = det.observe_sample(GpuSample(index=0, time=1.0, uuid="GPU-a", lost=True, lost_reason=lost,
                                           attribution="nvml_process"))  # fmt: skip
    (other,) = det.observe_sample(GpuSample(index=1, time=1.0, uuid="GPU-b", lost=True, lost_reason=lost,
                                            attribution="unattributed"))  # fmt: skip
    assert mine.kind == other.kind == "gpu_lost"
    assert "another job" not in mine.message
    assert "may belong to another job" in other.message and other.evidence["attribution"] == "unattributed"


@pytest.mark.unit
def test_two_gpus_of_one_rank_overheat_and_resolve_each_on_its_own() -> None:
    """The first GPU to cool must not resolve the other's alert (Finding.key has the GPU)."""
    from rankwatch.exporter.findings import FindingTracker

    findings, _, _ = drive(
        [
            heat_up(0, start=65, peak=92, over=5, cool_at=20),
            heat_up(1, start=65, peak=92, over=5, cool_at=40),
        ],
        60,
    )
    got = [(f.subject, f.resolved) for _, f in findings]
    uuids = sorted({f.subject for _, f in findings})
    assert len(uuids) == 2 and all(u and u.startswith("GPU-") for u in uuids)
    assert sorted(got) == sorted([(u, r) for u in uuids for r in (False, True)])
    tracker = FindingTracker()
    seen: list[Finding] = []
    active_counts = []
    for _, f in findings:
        seen.append(f)
        tracker.update(seen)
        active_counts.append(len(tracker.active()))
    # both fire, then GPU 0 cools (one left active), then GPU 1 cools.
    assert active_counts == [1, 2, 1, 0]
