"""Run the real NvmlBackend (pynvml over the stand-in libnvidia-ml.so.1) through a scenario.

Run in its own process, with LD_LIBRARY_PATH pointing at the stand-in, because the dynamic
loader reads that variable only at process start and pynvml keeps the library it loaded.
argv: the stand-in's state file, then a JSON list of steps:
``{"set": {key: value-or-null}}`` edits the state file, ``{"sample": n}`` takes n samples,
``{"map": {"pids": [...], "env": {...}}}`` ties processes to GPUs. Prints one JSON document.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the exposition helper
from gpufake import exposition
from rankwatch.config.schema import GpuConfig
from rankwatch.gpu.backend import NvmlBackend
from rankwatch.gpu.sampler import GpuSampler

LABELS = {"run": "standin", "rank": "0", "local_rank": "0", "node": "n1"}


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def _plain(sample: Any) -> dict[str, Any]:
    d = dataclasses.asdict(sample)
    if d.get("ecc"):
        d["ecc"] = {"/".join(k): v for k, v in d["ecc"].items()}
    return d


def _edit(state: Path, changes: dict[str, Any]) -> None:
    kv: dict[str, str] = {}
    for line in state.read_text().splitlines():
        if " " in line:
            k, v = line.split(" ", 1)
            kv[k] = v
    for k, v in changes.items():
        if v is None:
            kv.pop(k, None)
        else:
            kv[k] = str(v)
    state.write_text("".join(f"{k} {v}\n" for k, v in kv.items()))


async def main(state: Path, steps: list[dict[str, Any]], timeout: float) -> dict[str, Any]:
    keep = _Keep()
    logging.getLogger("rankwatch").addHandler(keep)
    logging.getLogger("rankwatch").setLevel(logging.INFO)
    sampler = GpuSampler(GpuConfig(call_timeout=timeout, xid_wait=0.05), backend=NvmlBackend())
    out: dict[str, Any] = {"started": await sampler.start(), "reason": sampler.reason, "rounds": []}
    out["devices"] = {i: dataclasses.asdict(d) for i, d in sampler.devices.items()}
    for step in steps:
        if "set" in step:
            _edit(state, step["set"])
        if "map" in step:
            owner = await sampler.map_ranks([(0, step["map"]["pids"], step["map"].get("env", {}))])
            out["mapped"] = sorted(owner)  # the agent's own mapping call (Services._map_gpus)
        for _ in range(int(step.get("sample", 0))):
            samples = await sampler.sample_once()
            out["rounds"].append(
                {
                    "samples": [_plain(s) for s in samples],
                    "up": sampler.up,
                    "hung": sampler.hung_for() is not None,
                    "errors": sampler.errors,
                }
            )
    out["metrics"] = exposition({0: sampler.latest()}, LABELS, sampler.up)
    out["log"] = keep.lines
    await sampler.close()
    return out


if __name__ == "__main__":
    doc = asyncio.run(main(Path(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])))
    json.dump(doc, sys.stdout, default=str)
