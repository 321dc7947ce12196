"""``rankwatch`` with N scripted healthy GPUs in place of NVML, for benchmarks on GPU-less machines.

    python bench/fakegpu_agent.py N -- watch|run ...

Without a driver the GPU collector stops at start ("NVML absent") and costs nothing, which
would flatter footprint and scrape figures. Swapping the backend the sampler builds keeps
every other line of the agent (sampler thread, timeouts, GPU detectors, ``rankwatch_gpu_*``
series) exactly as on a GPU node; only the NVML calls themselves are not paid.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rankwatch.gpu import sampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the fake GPU backend
import gpufake as fake


def main() -> int:
    n = int(sys.argv[1])
    args = sys.argv[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    sampler.NvmlBackend = lambda: fake.FakeBackend([fake.healthy(i) for i in range(n)])  # type: ignore[assignment,misc]
    from rankwatch.cli import main as cli

    return cli(args)


if __name__ == "__main__":
    raise SystemExit(main())
