"""Run the real NvmlBackend (pynvml over the stand-in libnvidia-ml.so.1) through a scenario.

Run in its own process, with LD_LIBRARY_PATH pointing at the stand-in, because the dynamic
loader reads that variable only at process start and pynvml keeps the library it loaded.
argv: the stand-in's state file, then a JSON list of steps:
``{"set": {key: value-or-null}}`` edits the state file, ``{"sample": n}`` takes n samples,
``{"map": {"pids": [...], "env": {...}}}`` makes them rank 0's processes (tied to GPUs at the
next sample). Prints one JSON document.
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
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.events import GpuRound
from rankwatch.gpu.backend import NvmlBackend
from rankwatch.sources.polled import Poller, SourceContext, ToRank, WatchedRank
from rankwatch.sources.polled.gpu import GpuSource

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
    """The agent's path: the registered GPU source under the polled-source policy (``Poller``)."""
    keep = _Keep()
    logging.getLogger("rankwatch").addHandler(keep)
    logging.getLogger("rankwatch").setLevel(logging.INFO)
    ranks: list[WatchedRank] = []
    cfg = replaced(Config(), {"gpu.call_timeout": timeout, "gpu.xid_wait": 0.05})
    ctx = SourceContext(cfg=cfg, folders=dict, ranks=lambda: ranks, rank=0, backends={"gpu": NvmlBackend()})
    source = GpuSource.create(ctx)
    assert source is not None
    sampler = source.sampler
    poller = Poller(source, {})
    started = await poller.open()
    out: dict[str, Any] = {"started": started, "reason": sampler.reason, "rounds": []}
    out["devices"] = {i: dataclasses.asdict(d) for i, d in sampler.devices.items()}
    for step in steps:
        if "set" in step:
            _edit(state, step["set"])
        if "map" in step:
            pids = step["map"]["pids"]
            ranks[:] = [WatchedRank(0, tuple(pids), frozenset(pids), step["map"].get("env", {}))]
        for _ in range(int(step.get("sample", 0))):
            events = (await poller.once() or []) if started else []
            samples = [
                s
                for e in events
                if isinstance(e, ToRank) and isinstance(e.event, GpuRound)
                for s in e.event.samples
            ]
            if ranks:
                out["mapped"] = sorted(source.owner)
            out["rounds"].append(
                {
                    "samples": [_plain(s) for s in samples],
                    "up": sampler.up,
                    "hung": sampler.hung_for() is not None,
                    "errors": sampler.errors,
                }
            )
    by_rank, up = source.view()
    out["metrics"] = exposition(by_rank, LABELS, up)
    out["log"] = keep.lines
    source.close()
    return out


if __name__ == "__main__":
    doc = asyncio.run(main(Path(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])))
    json.dump(doc, sys.stdout, default=str)
