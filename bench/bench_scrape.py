"""Latency of ``GET /metrics`` on an agent watching 8 busy ranks, served on loopback.

    python bench/bench_scrape.py [--scrapes 1000] [--quick]

Each rank has a full step window (4096 step lines with every field a framework can
print), evaluations, a sampled live process and findings fired and resolved. The client
runs on the same event loop as the server, as a co-located scraper would share the CPU,
so its cost is included. Two modes: plain text, and what Prometheus 2.x sends
(OpenMetrics preferred, gzip). Target (issue): p99 < 20 ms. The render time alone
(``generate_latest``, no HTTP) tells whether /metrics should render in a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from rankwatch.config.schema import Config, ServerConfig
from rankwatch.exporter import make_registry
from rankwatch.identity import Identity
from rankwatch.records import EvalRecord, Finding, Severity, StepRecord
from rankwatch.runtime.agent import Agent
from rankwatch.server import start_server

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
RANKS = 8
STEPS = 4096


async def build_agent(root: Path) -> Agent:
    cfg = Config()
    cfg.dumps.dir = str(root / "dumps")
    cfg.dumps.on_stall = False  # no py-spy of this very process mid-benchmark
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


async def main(scrapes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        agent = await build_agent(Path(tmp))
        reg = make_registry(agent)
        from prometheus_client import generate_latest

        render = []
        for _ in range(200):
            t = time.perf_counter()
            body = generate_latest(reg)
            render.append((time.perf_counter() - t) * 1000)
        series = sum(1 for x in body.splitlines() if not x.startswith(b"#"))
        print(f"exposition: {len(body)} bytes, {series} series, {RANKS} ranks x {STEPS} steps in window")
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
