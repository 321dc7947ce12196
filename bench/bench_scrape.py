"""Latency of ``GET /metrics`` on an agent watching 8 busy ranks, served on loopback.

    python bench/bench_scrape.py [--scrapes 1000] [--quick]

Each rank has a full step window (4096 step lines with every field a framework can
print), evaluations, a sampled live process and findings fired and resolved. The GPU and
checkpoint collectors run as in the agent (``Services``): 8 scripted GPUs through the real
sampler (``tests/gpufake.py``, as ``bench/fakegpu_agent.py``: no driver needed, only the
NVML calls are not paid) and a checkpoint folder of Hugging Face saves judged by the real
watcher, so every ``rankwatch_gpu_*`` and ``rankwatch_checkpoint_*`` series is there. The client
runs on the same event loop as the server, as a co-located scraper would share the CPU,
so its cost is included. Two modes: plain text, and what Prometheus 2.x sends
(OpenMetrics preferred, gzip). Target (issue): p99 < 20 ms. The render time alone
(``generate_latest``, no HTTP) tells whether /metrics should render in a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest

from rankwatch.config.schema import Config, ServerConfig
from rankwatch.config.snapshot import replaced
from rankwatch.identity import Identity
from rankwatch.records import EvalRecord, Finding, Severity, StepRecord
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.services import Services
from rankwatch.server import start_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the fake GPU backend
import gpufake as fake

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
RANKS = 8
GPUS = 8
STEPS = 4096
CHECKPOINTS = (500, 1000, 1500, 2000)


def write_checkpoints(root: Path, when: float) -> Path:
    """Hugging Face Trainer saves (weights, config, trainer_state.json), settled long ago."""
    for step in CHECKPOINTS:
        d = root / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32}))
        (d / "model.safetensors").write_bytes(_safetensors(4096))
        history = [
            {"step": s, "loss": 3.0 - s / 1000, "learning_rate": 3e-4} for s in range(50, step + 1, 50)
        ]
        state = {"global_step": step, "max_steps": 100_000, "log_history": history}
        (d / "trainer_state.json").write_text(json.dumps(state))
        for f in d.iterdir():
            os.utime(f, (when + step, when + step))
    return root


def _safetensors(n: int) -> bytes:
    """A valid one-tensor safetensors file (float32 zeros), without numpy or torch."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + bytes(4 * n)


async def start_collectors(agent: Agent, cfg: Config) -> Services:
    """GPU sampler and checkpoint watcher as the agent runs them; returns once both reported."""
    backend = fake.FakeBackend([fake.healthy(i) for i in range(GPUS)])
    services = Services(agent, cfg, gpu_backend=backend, server=False)
    await services.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        gpu = services.source("gpu")
        gpus = gpu.sampler.latest() if gpu is not None else []
        snap = services.checkpoints.snapshot() if services.checkpoints is not None else {}
        if len(gpus) == GPUS and snap.get("last_good_step") is not None:
            return services
        await asyncio.sleep(0.05)
    raise SystemExit(f"collectors not ready: {len(gpus)} GPU samples, checkpoint snapshot {snap}")


async def build_agent(root: Path) -> Agent:
    cfg = replaced(
        Config(),
        {
            "dumps.dir": str(root / "dumps"),
            "dumps.on_stall": False,  # no py-spy of this very process mid-benchmark
            "alerts.spool_dir": str(root / "spool"),
            "checkpoints.dir": str(write_checkpoints(root / "ckpt", time.time() - 7200)),
        },
    )
    agent = Agent(
        cfg, Identity(run="bench-run-4242", rank=0, local_rank=0, world_size=RANKS, node="gpu-node01")
    )
    rng = random.Random(7)
    t0 = time.time() - STEPS * 0.9
    for r in range(RANKS):
        log = root / f"rank-{r}.log"
        log.touch()
        ident = dataclasses.replace(agent.identity, rank=r, local_rank=r)
        w = agent.add_watcher([log], ident)
        recs = []
        for i in range(1, STEPS + 1):
            recs.append(
                StepRecord(
                    step=i,
                    total_steps=100_000,
                    loss=2.2 + 6.0 * math.exp(-i / 400) + rng.gauss(0, 0.02),
                    grad_norm=abs(rng.gauss(0.9, 0.1)),
                    learning_rate=3e-4 * min(1.0, i / 2000),
                    loss_scale=65536.0,
                    tokens_per_s=1_150_000 + rng.gauss(0, 5000),
                    samples_per_s=281.0 + rng.gauss(0, 1),
                    step_time_s=0.89 + rng.gauss(0, 0.005),
                    tflops=412.0 + rng.gauss(0, 2),
                    mfu=0.41,
                    memory_bytes=61.2e9,
                    max_memory_bytes=66.0e9,
                    time=t0 + 0.9 * i,
                )
            )
            if i % 500 == 0:
                recs.append(EvalRecord(eval_loss=2.3 + 5.0 * math.exp(-i / 400), step=i, time=t0 + 0.9 * i))
        w._records(recs)
        w.attach(os.getpid())
        await w.sample_once()
    for i in range(200):
        kind, sev = [("loss_spike", Severity.WARNING), ("throughput_drop", Severity.WARNING)][i % 2]
        agent.emit(Finding(kind, sev, i % RANKS, f"finding {i}", step=i, time=time.time()))
    agent.emit(Finding("stall", Severity.CRITICAL, 5, "no progress for 901s", time=time.time()))
    agent.emit(Finding("stall", Severity.CRITICAL, 3, "no progress", time=time.time()))
    agent.emit(Finding("stall", Severity.CRITICAL, 3, "progress resumed", resolved=True))
    agent.alert_stats = {"slack": {"sent": 12, "failed": 1, "dropped": 0}}  # type: ignore[attr-defined]
    return agent


def _figures(ms: list[float]) -> str:
    ms = sorted(ms)
    p99 = ms[max(0, math.ceil(0.99 * len(ms)) - 1)]
    return f"p50 {statistics.median(ms):.2f} ms  p99 {p99:.2f} ms  max {ms[-1]:.2f} ms"


def series_counts(body: bytes) -> str:
    lines = [x for x in body.splitlines() if x and not x.startswith(b"#")]
    gpu = sum(1 for x in lines if x.startswith(b"rankwatch_gpu_"))
    ckpt = sum(1 for x in lines if x.startswith(b"rankwatch_checkpoint"))
    return f"{len(lines)} series ({gpu} rankwatch_gpu_*, {ckpt} rankwatch_checkpoint*)"


async def main(scrapes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        agent = await build_agent(Path(tmp))
        services = await start_collectors(agent, agent.cfg)
        try:
            await bench(agent, services.registry(), scrapes)
        finally:
            await services.close(1.0)


async def bench(agent: Agent, reg: CollectorRegistry, scrapes: int) -> None:
    render = []
    for _ in range(200):
        t = time.perf_counter()
        body = generate_latest(reg)
        render.append((time.perf_counter() - t) * 1000)
    print(f"exposition: {len(body)} bytes, {series_counts(body)}")
    print(f"  {RANKS} ranks x {STEPS} steps in window, {GPUS} GPUs, {len(CHECKPOINTS)} checkpoints")
    print(f"render only (generate_latest, 200x): {_figures(render)}")
    server = await start_server(agent, ServerConfig(listen="127.0.0.1:0"), registry=reg)
    try:
        async with aiohttp.ClientSession() as s:
            for label, headers in (
                ("text/plain", {"Accept-Encoding": "identity"}),
                ("openmetrics+gzip (Prometheus 2.x headers)", {"Accept": PROMETHEUS_ACCEPT}),
            ):
                ms = []
                for _ in range(scrapes):
                    t = time.perf_counter()
                    async with s.get(server.url + "/metrics", headers=headers) as r:
                        await r.read()
                        assert r.status == 200
                    ms.append((time.perf_counter() - t) * 1000)
                target = "PASS" if sorted(ms)[math.ceil(0.99 * len(ms)) - 1] < 20 else "MISS"
                print(f"GET /metrics {label}, {scrapes}x: {_figures(ms)}  (target p99 < 20 ms: {target})")
    finally:
        await server.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="200 scrapes per mode")
    a = ap.parse_args()
    asyncio.run(main(200 if a.quick else a.scrapes))
