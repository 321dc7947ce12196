"""Whose each record of one shared log is (runtime/sharedlog.py, runtime/workers.py), on the real
log of s37 f34s: `torchrun --nproc-per-node 2 t4.py > job.log 2>&1` (no --tee), both workers'
``step=N ... rank=R`` lines unprefixed, some of them glued into one line where the two raced
(``step=19 ... rank=0step=19 ... rank=1``), rank 1 raising at step 40 after printing step 39."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from rankwatch.config.loader import load_config
from rankwatch.config.schema import Config
from rankwatch.identity import Identity, identity_from_env
from rankwatch.runtime import workers
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.sharedlog import SharedLogs, SharedLogWatcher

pytestmark = pytest.mark.unit

F34S = Path(__file__).parent / "data" / "blackbox" / "s37" / "repro" / "f34s" / "job.log"


def _lines(after_step: int = 0) -> list[str]:
    """The job's log from the first line after rank 1's ``step=<after_step>`` on: an agent that
    began reading there (attached mid-run)."""
    lines = F34S.read_text().splitlines(keepends=True)
    if after_step:
        at = next(i for i, t in enumerate(lines) if t.startswith(f"step={after_step} ") and "rank=1" in t)
        lines = lines[at + 1 :]
    return lines


def _sharers(tmp: Path, text: str) -> tuple[list[SharedLogWatcher], list[Any]]:
    """Two ranks' pipelines following one file, as the node daemon or `watch --pid W0 --pid W1`
    makes them (``sharedlog.make_watcher``), each reading it from its start here."""
    log = tmp / "job.log"
    log.write_text(text)
    shared = SharedLogs()
    found: list[Any] = []
    ws = []
    for rank in (0, 1):
        ident = Identity(run="j", rank=rank, local_rank=rank, world_size=2, node="n")
        w = SharedLogWatcher(Config(), ident, [log], emit=found.append)
        w.shared = shared
        shared.add(w, [log])
        ws.append(w)
    return ws, found


def _read(w: SharedLogWatcher) -> list[Any]:
    return w.streams[0].follower.read_available()


def test_steps_naming_a_rank_are_that_ranks_when_read_mid_run(tmp_path: Path) -> None:
    """Attached after step 14: rank 1's own steps after that (glued lines too) reach rank 1's
    pipeline, up to its step 39, not only rank 0's (the owner of the unprefixed lines)."""
    ws, _ = _sharers(tmp_path, "".join(_lines(after_step=14)))
    for w in ws:
        w.feed_lines(w.streams[0], _read(w))
    r0, r1 = ws
    assert r1.engine.state.last_step == 39
    assert r1.engine.state.step_count >= 20  # its own records, not the owner's progress
    assert r0.engine.state.last_step == 39
    held = r0.engines.get(1)
    assert held is None or held.state.step_count == 0  # none of rank 1's steps kept by rank 0


def test_a_ranks_end_is_told_at_its_last_step_the_owner_had_not_read_yet(tmp_path: Path) -> None:
    """Rank 1's end judged while the owner's reads are behind (its step 39 and its traceback
    written after the owner's last read): the owner reads first, and the crash is "after step
    39", not the step the owner had reached."""
    lines = _lines(after_step=14)
    cut = next(i for i, t in enumerate(lines) if t.startswith("step=30 "))
    ws, found = _sharers(tmp_path, "".join(lines[:cut]))
    for w in ws:
        w.feed_lines(w.streams[0], _read(w))
    r1 = ws[1]
    assert r1.engine.state.last_step == 29
    with open(tmp_path / "job.log", "a") as fh:
        fh.write("".join(lines[cut:]))
    r1.on_exit(None, None)
    [crash] = [f for f in found if f.kind == "crash" and f.rank == 1]
    assert crash.step == 39
    assert "injected failure in rank 1 at step 40" in crash.message


def test_a_shared_logs_history_is_replayed_once_each_record_by_its_rank(tmp_path: Path) -> None:
    """The read-back of the log at attach: each rank's pipeline replays its own steps; neither
    keeps the other's in an engine of its own (counted twice, found twice)."""
    ws, _ = _sharers(tmp_path, "".join(_lines()))
    for w in ws:
        w._replay(w.streams[0], _read(w))
    r0, r1 = ws
    assert r0.engine.state.last_step == 39 and r1.engine.state.last_step == 39
    assert set(r0.engines) == {0} and set(r1.engines) == {1}


def test_plain_run_torchrun_gives_a_workers_steps_to_its_pipeline(tmp_path: Path) -> None:
    """`run -- torchrun` without --tee (s37 f02): the combined log's ``step=N ... rank=R`` lines
    reach the run's pipeline only; each is handed to rank R's worker pipeline, so its crash is
    told at its own last step."""
    cfg_path = tmp_path / "rw.yaml"
    cfg_path.write_text(f"dumps: {{dir: {tmp_path / 'dumps'}}}\n")
    cfg = load_config(str(cfg_path))
    agent = Agent(cfg, identity_from_env(cfg.run, {}))
    agent.launched = True
    log = tmp_path / "combined.log"
    # What the workers printed to their step 11 (the launcher's own lines before them).
    lines = _lines()
    log.write_text("".join(lines[: next(i for i, t in enumerate(lines) if t.startswith("step=12 "))]))
    run = workers.run_watcher(cfg, agent.identity, log, emit=agent.emit, clock=agent.clock, start_at=0)
    agent.adopt(run)

    async def add() -> Any:
        fleet = workers.Fleet(agent, cfg, log, os.getpid(), [], cmd=["torchrun"], run_pipeline=run)
        for rank in (0, 1):
            fleet._add(os.getpid() + rank, {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"})
        for t in fleet.tasks:
            t.cancel()
        await asyncio.gather(*fleet.tasks, return_exceptions=True)
        return fleet

    fleet = asyncio.run(add())
    stream = run.streams[-1]
    run.feed_lines(stream, stream.follower.read_available())
    assert fleet.by_rank[0].engine.state.last_step == 11
    assert fleet.by_rank[1].engine.state.last_step == 11
    assert fleet.by_rank[0].engine.state.step_count == 11
    held = run.engines.get(0)
    assert held is None or held.state.step_count == 0
