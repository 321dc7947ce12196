"""What one scrape costs in-process: the agent's snapshot, and the whole ``/metrics`` render.

    python bench/bench_snapshot.py [--renders 300]

Same agent as ``bench_scrape.py`` (8 busy ranks x 4096 step lines, 8 scripted GPUs, a
checkpoint folder, ~200 findings). The snapshot (``Agent.snapshot()``, built on the loop per
scrape and per API request) is the only part that reads the agent; ``generate_latest`` on the
Services registry is everything a scrape does before HTTP. Best-of figures are the ones to
compare between revisions on a shared machine: medians follow the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from prometheus_client import generate_latest

import bench_scrape  # beside this file: run as a script


def _ms(samples: list[float]) -> str:
    return f"best {min(samples):.3f} ms  median {statistics.median(samples):.3f} ms"


async def main(renders: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        agent = await bench_scrape.build_agent(Path(tmp))
        services = await bench_scrape.start_collectors(agent, agent.cfg)
        try:
            reg = services.registry()
            body = generate_latest(reg)
            print(f"exposition: {len(body)} bytes, {bench_scrape.series_counts(body)}")
            snap, render = [], []
            for _ in range(renders):
                t = time.perf_counter()
                agent.snapshot()
                snap.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                generate_latest(reg)
                render.append((time.perf_counter() - t) * 1000)
            print(f"Agent.snapshot(), {renders}x: {_ms(snap)}")
            print(f"generate_latest (whole /metrics body), {renders}x: {_ms(render)}")
        finally:
            await services.close(1.0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--renders", type=int, default=300)
    asyncio.run(main(ap.parse_args().renders))
