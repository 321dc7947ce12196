"""A backlog is read in bounded turns and shed while the agent is far behind (issue 26 item 7).

A ``rankwatch run`` child that writes 2M step lines (75 MB) in seconds used to be handed over
whole: one read of everything, 2M line objects at once, the loop blocked until all of it was
parsed. Now a read is at most ``logs.read_bytes_per_turn``, the loop runs other tasks between
two, and while more than ``logs.shed_backlog`` bytes wait only the lines that may matter (an
error signature, a non-finite value) and the last line of each piece are parsed, every other
one counted. Speed and memory figures are in ``bench/bench_burst.py --latency --steps``; these
tests hold the properties: bounded turns, nothing that matters skipped, every line counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from pathlib import Path
from typing import Any

import pytest

from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.identity import Identity
from rankwatch.records import Finding
from rankwatch.runtime.watcher import RankWatcher
from rankwatch.sources.follower import LogFollower

IDENT = Identity(run="t", rank=0, local_rank=0, world_size=1, node="n")
LINES = 200_000


def _burst(path: Path, lines: int = LINES, *, oom_at: int | None = None) -> int:
    """``lines`` short key=value step lines (~38 bytes each), then a NaN step; its size."""
    with path.open("w") as fh:
        for start in range(1, lines + 1, 1000):
            block = [
                f"step={s} loss={2.6 + (s % 97) / 1000:.6f} lr=3.0e-04\n" for s in range(start, start + 1000)
            ]
            if oom_at is not None and start <= oom_at < start + 1000:
                block[oom_at - start] = (
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
                )
            fh.write("".join(block))
        fh.write(f"step={lines + 1} loss=nan lr=3.0e-04\n")
    return path.stat().st_size


def _watcher(tmp_path: Path, found: list[Finding], **cfg: Any) -> RankWatcher:
    conf = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps"), "logs.format": "kv", **cfg})
    return RankWatcher(conf, IDENT, [tmp_path / "rank-0.log"], emit=found.append)


def _record_batches(w: RankWatcher) -> list[int]:
    sizes: list[int] = []
    feed = w.feed_lines

    def recording(stream: Any, batch: list[Any]) -> None:
        sizes.append(sum(len(fl.text) + 1 for fl in batch))
        feed(stream, batch)

    w.feed_lines = recording  # type: ignore[method-assign]
    return sizes


@pytest.mark.unit
def test_a_backlog_at_exit_is_read_in_bounded_turns_and_the_nan_after_it_is_found(tmp_path: Path) -> None:
    _burst(tmp_path / "rank-0.log", oom_at=100_500)
    found: list[Finding] = []
    w = _watcher(tmp_path, found)
    sizes = _record_batches(w)
    w.drain()
    turn = int(w.cfg.logs.read_bytes_per_turn)
    assert len(sizes) > 20 and max(sizes) <= turn + int(w.cfg.logs.max_line_bytes), max(sizes)
    kinds = {(f.kind, f.step) for f in found}
    assert ("nan_loss", LINES + 1) in kinds, kinds  # the NaN written after the burst
    assert any(f.kind == "oom" for f in found), kinds  # an error inside the burst is never shed
    st = w.streams[0].parser.stats
    assert st.shed > LINES // 2  # most of the burst passed over...
    assert st.lines == LINES + 1 and w.lines == LINES + 1  # ...and every line counted
    assert w.engine.state.last_step == LINES + 1


@pytest.mark.unit
def test_a_live_backlog_yields_to_the_loop_between_turns(tmp_path: Path) -> None:
    """While ``_follow`` works off the burst, another task runs between every two turns."""
    _burst(tmp_path / "rank-0.log")
    found: list[Finding] = []
    w = _watcher(tmp_path, found, **{"logs.poll_interval": 0.01})
    sizes = _record_batches(w)
    ticks_at_feed: list[int] = []
    ticks = 0
    feed = w.feed_lines

    def noting(stream: Any, batch: list[Any]) -> None:
        ticks_at_feed.append(ticks)
        feed(stream, batch)

    w.feed_lines = noting  # type: ignore[method-assign]

    async def go() -> None:
        nonlocal ticks

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        follow = asyncio.create_task(w._follow())
        try:
            for _ in range(20_000):
                if any(f.kind == "nan_loss" for f in found):
                    break
                await asyncio.sleep(0.001)
        finally:
            w.stop()
            t.cancel()
            await asyncio.wait_for(follow, 5)
            with contextlib.suppress(asyncio.CancelledError):
                await t

    asyncio.run(go())
    assert any(f.kind == "nan_loss" and f.step == LINES + 1 for f in found)
    assert len(ticks_at_feed) > 20
    assert all(b > a for a, b in itertools.pairwise(ticks_at_feed)), "a turn ran without yielding"
    assert max(sizes) <= int(w.cfg.logs.read_bytes_per_turn) + int(w.cfg.logs.max_line_bytes)
    assert w.streams[0].parser.stats.shed > 0


@pytest.mark.unit
def test_without_a_backlog_every_line_is_parsed(tmp_path: Path) -> None:
    _burst(tmp_path / "rank-0.log", 2_000)  # ~76 KB: under logs.shed_backlog
    found: list[Finding] = []
    w = _watcher(tmp_path, found)
    w.drain()
    st = w.streams[0].parser.stats
    assert st.shed == 0 and st.parsed == 2_001
    off = _watcher(tmp_path, [], **{"logs.shed_backlog": 0})  # 0: never shed
    _burst(tmp_path / "rank-0.log", 50_000)
    off.drain()
    assert off.streams[0].parser.stats.shed == 0 and off.streams[0].parser.stats.parsed == 50_001


@pytest.mark.unit
def test_a_thinned_read_keeps_what_matters_and_counts_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    _burst(path, 20_000, oom_at=7_777)
    f = LogFollower(path)
    out: list[Any] = []
    while True:
        batch = f.read_available(64 << 10, thin=lambda t: "nan" in t or "Error" in t)
        out += batch
        assert sum(len(x.text) + 1 for x in batch) <= (64 << 10) + (1 << 20)
        if not f.behind:
            break
    texts = [x.text for x in out]
    assert any("OutOfMemoryError" in t for t in texts) and texts[-1] == "step=20001 loss=nan lr=3.0e-04"
    assert len(out) < 20_001 // 10
    assert len(out) + f.stats.thinned_lines == 20_001
    numbers = [x.lineno for x in out]
    assert numbers == sorted(numbers) and numbers[-1] == 20_001  # numbers stay the file's own


@pytest.mark.unit
def test_what_matters_while_behind() -> None:
    from rankwatch.runtime.watcher import matters

    for text in ("step=3 loss=nan", "loss: -Infinity", "grad_norm=INF", "'loss': NaN", "info inf"):
        assert matters(text), text
    for text in ("2026-01-01 INFO - shard 3: fetched", "step=3 loss=2.5", "nanoGPT infinite loader"):
        assert not matters(text), text
    assert matters("torch.OutOfMemoryError: CUDA out of memory") and matters("\x1b[31mERROR")
