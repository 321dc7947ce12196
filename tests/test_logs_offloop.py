"""A rank's log is read off the event loop, by its log source under the polled sources' policy
(``sources/polled/logs.py``): a read that hangs (a dead NFS or Lustre mount) holds up that
rank's lines only. The other ranks' lines, the agent's other tasks and the stall clock go on;
the hang is logged once with its likely cause and counted once; and what the stuck read
returns at last is parsed, not lost."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import until
from rankwatch import offloop, safeio
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.identity import Identity
from rankwatch.records import Finding
from rankwatch.runtime import watcher
from rankwatch.runtime.watcher import RankWatcher
from rankwatch.sources.follower import LogFollower
from rankwatch.sources.polled.logs import LOG_HINT, LogSource

# Bounds the stand-in's block: on a loop that reads logs itself, the loop is frozen that long
# and the test fails instead of hanging.
FROZEN_S = 5.0


def _watcher(
    tmp_path: Path, rank: int, found: list[Finding], settings: dict[str, Any] | None = None, **kw: Any
) -> RankWatcher:
    base = {"dumps.dir": str(tmp_path / "dumps"), "logs.format": "kv", "logs.poll_interval": 0.02}
    conf = replaced(Config(), {**base, **(settings or {})})
    ident = Identity(run="t", rank=rank, local_rank=rank, world_size=2, node="n")
    return RankWatcher(conf, ident, [tmp_path / f"rank-{rank}.log"], emit=found.append, **kw)


class Ticker:
    """Another task of the loop: ``ticks`` grows while the loop runs."""

    def __init__(self) -> None:
        self.ticks = 0

    async def run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0)


@pytest.mark.unit
def test_a_log_whose_read_hangs_stops_neither_the_loop_nor_another_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(offloop, "FS_TIMEOUT_S", 0.1)
    found: list[Finding] = []
    hung, ok = _watcher(tmp_path, 70, found), _watcher(tmp_path, 71, found)
    (tmp_path / "rank-70.log").write_text("step=1 loss=2.5\nstep=2 loss=nan\n")
    blocked, release = threading.Event(), threading.Event()
    froze: list[bool] = []
    follower = hung.streams[0].follower
    read = follower.read_available

    def stuck_read(*args: Any, **kwargs: Any) -> Any:
        blocked.set()
        if not release.wait(FROZEN_S):
            froze.append(True)  # nobody could release it: the loop itself was blocked here
        return read(*args, **kwargs)

    monkeypatch.setattr(follower, "read_available", stuck_read)
    thread = hung.log_io
    ticker = Ticker()

    async def go() -> None:
        tasks = [asyncio.create_task(w.run()) for w in (hung, ok)]
        tick = asyncio.create_task(ticker.run())
        try:
            await until(blocked.is_set, what="rank 70's read started")
            before = ticker.ticks
            with (tmp_path / "rank-71.log").open("a") as fh:
                fh.write("step=1 loss=2.5\nstep=2 loss=2.4\nstep=3 loss=nan\n")
            await until(lambda: ok.engine.state.last_step == 3, what="rank 71's lines parsed")
            await until(lambda: offloop.timeouts.get(thread, 0) >= 3, what="periods failed at once")
            assert ticker.ticks > before, "the agent's other tasks stopped"
            assert hung.lines == 0 and hung.engine.state.last_step is None
            assert hung.source_errors[LogSource.name] == 1, "one hang is counted once"
            hung.drain()  # the rank exits meanwhile: its stuck log is left, the loop goes on
            release.set()
            await until(lambda: hung.engine.state.last_step == 2, what="the late read's lines parsed")
        finally:
            release.set()
            for w in (hung, ok):
                w.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
            tick.cancel()

    with caplog.at_level(logging.WARNING, logger="rankwatch.offloop"):
        asyncio.run(go())
    assert not froze, "the hung read blocked the event loop"
    said = [r.getMessage() for r in caplog.records if thread in r.getMessage()]
    assert len(said) == 1 and LOG_HINT in said[0], said
    kinds = {(f.rank, f.kind) for f in found}
    assert (71, "nan_loss") in kinds and (70, "nan_loss") in kinds
    for w in (hung, ok):
        w.close()


@pytest.mark.unit
def test_new_attempt_files_are_read_at_once_while_a_read_of_the_old_one_is_stuck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchelastic restarted the rank into new files while a read of its old one hangs: the
    switch does not wait for that read (it was given up on) nor touch the new file's folder on
    the loop, and the new file is read on a thread of its own."""
    monkeypatch.setattr(offloop, "FS_TIMEOUT_S", 0.1)
    monkeypatch.setattr(watcher, "DRAIN_WAIT_S", 2 * FROZEN_S)  # a wait would outlast the block
    found: list[Finding] = []
    w = _watcher(tmp_path, 72, found)
    old, new = tmp_path / "rank-72.log", tmp_path / "attempt_1.log"
    old.write_text("step=1 loss=2.5\n")
    blocked, release = threading.Event(), threading.Event()
    froze: list[bool] = []
    follower = w.streams[0].follower
    read = follower.read_available

    def stuck_read(*args: Any, **kwargs: Any) -> Any:
        blocked.set()
        if not release.wait(FROZEN_S):
            froze.append(True)
        return read(*args, **kwargs)

    monkeypatch.setattr(follower, "read_available", stuck_read)
    switching = False
    touched: list[str] = []  # the folder looked up or opened on the loop during the switch

    def noting(fn: Any) -> Any:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            if switching and threading.current_thread() is threading.main_thread():
                touched.append(f"{fn.__name__}({path})")
            return fn(path, *args, **kwargs)

        return call

    for name in ("resolve_dir", "open_dir"):
        monkeypatch.setattr(safeio, name, noting(getattr(safeio, name)))

    async def go() -> None:
        nonlocal switching
        task = asyncio.create_task(w.run())
        try:
            await until(blocked.is_set, what="the old file's read started")
            stuck_on = w.log_io
            await until(lambda: offloop.stuck(stuck_on), what="the read given up on")
            switching = True
            w.follow_instead([old], [new])
            switching = False
            assert touched == [], "the new file was looked up on the loop"
            assert w.log_io != stuck_on and [s.path for s in w.streams] == [new]
            new.write_text("step=1 loss=2.5\nstep=2 loss=nan\n")
            await until(lambda: w.engine.state.last_step == 2, what="the new file's lines parsed")
            assert not froze
        finally:
            release.set()
            w.stop()
            await asyncio.wait_for(task, 10)

    asyncio.run(go())
    assert not froze, "the switch waited for the stuck read"
    assert [(f.kind, f.step) for f in found if f.kind == "nan_loss"] == [("nan_loss", 2)]
    w.close()


@pytest.mark.unit
def test_a_log_whose_open_replay_and_close_hang_leaves_the_loop_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent attaching to a running rank whose log sits on a dead mount: the log's first
    open (at its end), the read-back of its history and its close each block, one after the
    other. Each runs on the thread of the rank's log reads: the loop's other tasks go on
    meanwhile, the history is replayed once it is read (not emitted), and the live lines
    follow it."""
    log = tmp_path / "rank-73.log"
    log.write_text("step=1 loss=2.5\nstep=2 loss=nan\n")
    phases = ("open", "replay", "close")
    release = {p: threading.Event() for p in phases}
    entered: dict[str, str] = {}  # phase -> the thread it blocked
    froze: list[str] = []

    def gated(phase: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            entered.setdefault(phase, threading.current_thread().name)
            if not release[phase].wait(FROZEN_S):
                froze.append(phase)  # nobody could release it: the loop itself was blocked here
            return fn(*args, **kwargs)

        return call

    for phase, name in zip(phases, ("_open_checked", "read_back_lines", "close"), strict=True):
        monkeypatch.setattr(LogFollower, name, gated(phase, getattr(LogFollower, name)))
    found: list[Finding] = []
    ticker = Ticker()

    async def responsive(phase: str) -> None:
        await until(lambda: phase in entered, what=f"the log's {phase} started")
        before = ticker.ticks
        await until(lambda: ticker.ticks > before + 10, what=f"the loop ran while the {phase} blocked")
        release[phase].set()

    async def go() -> RankWatcher:
        tick = asyncio.create_task(ticker.run())
        w = _watcher(tmp_path, 73, found, from_end=True, replay=True)
        task = asyncio.create_task(w.run())
        try:
            await responsive("open")
            await responsive("replay")
            await until(lambda: w.engine.state.last_step == 2, what="the history replayed")
            with log.open("a") as fh:
                fh.write("step=3 loss=2.4\n")
            await until(lambda: w.engine.state.last_step == 3, what="the live line after the history")
        finally:
            release["open"].set()
            release["replay"].set()
            w.stop()
            await asyncio.wait_for(task, 10)
        w.close()
        assert w.streams[0].follower.is_open, "the close waits on its thread"
        await responsive("close")
        await until(lambda: not w.streams[0].follower.is_open, what="the log closed")
        tick.cancel()
        return w

    try:
        w = asyncio.run(go())
    finally:
        for event in release.values():
            event.set()
    assert not froze, f"the event loop was blocked in the log's {froze}"
    assert "MainThread" not in entered.values(), entered
    assert [f.kind for f in w.replayed if f.kind == "nan_loss"] == ["nan_loss"]
    # The history's NaN is not sent again; the live line's recovery from it is news.
    assert [(f.step, f.resolved) for f in found if f.kind == "nan_loss"] == [(3, True)]


@pytest.mark.unit
def test_a_rank_source_counts_its_failures_under_its_own_component(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node_exporter's model: each source's failures under its name, not summed into one."""
    from rankwatch.exporter import render
    from rankwatch.runtime.agent import Agent

    conf = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(conf, Identity(run="t", rank=0, local_rank=0, world_size=1, node="n"))
    w = agent.add_watcher([tmp_path / "rank-0.log"])

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("EIO")

    monkeypatch.setattr(w.streams[0].follower, "read_available", broken)
    assert asyncio.run(w.pollers[LogSource.name].once()) is None  # the sample failed
    errors = agent.snapshot().internal_errors
    assert errors[LogSource.name] == 1 and errors.get("process", 0) == 0 and "sampler" not in errors
    text = render(agent).decode()
    assert re.search(r'rankwatch_internal_errors_total\{[^}]*component="logs"[^}]*\} 1', text), text[-2000:]
    w.close()


def _counting(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[int]]:
    """Counts the log source's samples (each one wakes the loop when it returns) and the reads
    of its readers (on its thread)."""
    from rankwatch.sources.follower import LogReader

    samples: list[str] = []
    fills = [0]
    sample, fill = LogSource.sample, LogReader.fill

    def counted_sample(self: LogSource, inputs: Any) -> list[Any]:
        out = sample(self, inputs)
        samples.append(threading.current_thread().name)
        return out

    def counted_fill(self: LogReader, wake: Any = None) -> bool:
        fills[0] += 1
        return fill(self, wake)

    monkeypatch.setattr(LogSource, "sample", counted_sample)
    monkeypatch.setattr(LogReader, "fill", counted_fill)
    return samples, fills


def _long_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle sample holds for an hour: only news, a changed set of logs or the stop end it."""
    from rankwatch.sources.polled import logs as polled_logs

    monkeypatch.setattr(polled_logs, "HOLD_S", 3600.0)
    monkeypatch.setattr(offloop, "FS_TIMEOUT_S", 3 * 3600.0)


def _run_to_nan(
    w: RankWatcher,
    found: list[Finding],
    body: Callable[[], Awaitable[None]],
    after: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """``w`` running: once its first line (step 1) is parsed, ``body``; then the stop, and
    ``after``. The NaN at step 2 that ``body`` brings in is found once."""
    _run(w, body, after)
    assert [(f.kind, f.step) for f in found if f.kind == "nan_loss"] == [("nan_loss", 2)]


def _run(
    w: RankWatcher, body: Callable[[], Awaitable[None]], after: Callable[[], Awaitable[None]] | None = None
) -> None:
    """``w`` running: once its first line (step 1) is parsed, ``body``; then the stop, ``after``
    and the close."""

    async def go() -> None:
        task = asyncio.create_task(w.run())
        try:
            await until(lambda: w.engine.state.last_step == 1, what="the first line parsed")
            await body()
        finally:
            w.stop()
            await asyncio.wait_for(task, 10)
        if after is not None:
            await after()

    asyncio.run(go())
    w.close()


@pytest.mark.unit
def test_an_idle_log_is_read_every_poll_on_its_thread_and_wakes_the_loop_only_with_news(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a rank's log is quiet its source reads it every ``logs.poll_interval`` on its own
    thread and hands the loop nothing: the loop hears from it when a read found lines (within
    a poll of the write), when the hold ends, or when the agent stops (at once, however long
    the hold)."""
    _long_hold(monkeypatch)
    samples, fills = _counting(monkeypatch)
    found: list[Finding] = []
    w = _watcher(tmp_path, 73, found)  # logs.poll_interval: 20 ms
    log = tmp_path / "rank-73.log"
    log.write_text("step=1 loss=2.5\n")
    quiet = 0

    async def body() -> None:
        nonlocal quiet
        quiet = len(samples)
        reads = fills[0]
        await until(lambda: fills[0] >= reads + 10, what="ten more reads of the quiet log")
        assert len(samples) == quiet, "a read that found nothing woke the loop"
        with log.open("a") as fh:
            fh.write("step=2 loss=nan\n")
        await until(lambda: w.engine.state.last_step == 2, what="the new line parsed")
        assert len(samples) == quiet + 1

    async def after() -> None:  # the hold in flight ended with the stop, not after its hour
        await until(lambda: len(samples) >= quiet + 2, what="the held sample returned on the stop")

    _run_to_nan(w, found, body, after)


@pytest.mark.unit
def test_a_held_read_returns_within_a_third_of_its_timeout_and_when_the_logs_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quiet log's sample gives the loop word at least every third of its timeout (a read
    that hangs during a hold is still given up on in time), and returns at once when the
    rank's set of logs changes (torchelastic's new attempt files are read within a poll)."""
    monkeypatch.setattr(offloop, "FS_TIMEOUT_S", 0.6)  # a hold of 0.2 s
    samples, fills = _counting(monkeypatch)
    found: list[Finding] = []
    w = _watcher(tmp_path, 74, found)
    old, new = tmp_path / "rank-74.log", tmp_path / "attempt_1.log"
    old.write_text("step=1 loss=2.5\n")

    async def body() -> None:
        n = len(samples)
        await until(lambda: len(samples) >= n + 3, what="three holds ended on their own")
        assert not offloop.stuck(w.log_io) and not found
        new.write_text("step=1 loss=2.5\nstep=2 loss=nan\n")
        w.follow_instead([old], [new])
        await until(lambda: w.engine.state.last_step == 2, what="the new file's lines parsed")

    _run_to_nan(w, found, body)
    assert fills[0] >= len(samples)


@pytest.mark.unit
def test_a_log_added_to_the_rank_is_read_at_once_whatever_the_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file the rank starts to follow beside its quiet one (nothing closed, the same thread)
    ends the hold in flight: its lines are parsed within a poll, not after the hold."""
    _long_hold(monkeypatch)
    found: list[Finding] = []
    w = _watcher(tmp_path, 75, found)
    first, added = tmp_path / "rank-75.log", tmp_path / "rank-75.err"
    first.write_text("step=1 loss=2.5\n")

    async def body() -> None:
        added.write_text("step=2 loss=nan\n")
        w.follow_instead([], [added])
        await until(lambda: w.engine.state.last_step == 2, timeout=10, what="the added file parsed")

    _run_to_nan(w, found, body)


def _watch_threads() -> set[threading.Thread]:
    """Threads of watchdog's observers, emitters and inotify buffers."""
    return {t for t in threading.enumerate() if type(t).__module__.startswith("watchdog")}


@pytest.mark.unit
@pytest.mark.parametrize("watch", [False, True])
def test_the_folder_watch_runs_only_when_configured_and_wakes_a_long_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watch: bool
) -> None:
    """``logs.watch`` (off by default: every log is read each ``logs.poll_interval``, so a
    watch could only move a read forward by less than one poll) starts an observer and its
    inotify threads per followed log. With it, a writer that opens, appends and closes is read
    at once under a 30 s poll; the watch's threads end with the rank."""
    _long_hold(monkeypatch)
    before = _watch_threads()
    found: list[Finding] = []
    w = _watcher(tmp_path, 76, found, {"logs.poll_interval": 30.0, "logs.watch": watch})
    log = tmp_path / "rank-76.log"
    log.write_text("step=1 loss=2.5\n")
    during: set[threading.Thread] = set()

    async def body() -> None:
        during.update(_watch_threads() - before)
        if not watch:
            return
        with log.open("a") as fh:  # closed after the write: the watch's one data event
            fh.write("step=2 loss=nan\n")
        await until(lambda: w.engine.state.last_step == 2, timeout=5, what="read at the watch's wake")

    if watch:
        _run_to_nan(w, found, body)
    else:
        _run(w, body)
    assert bool(during) is watch, during
    for t in during:
        t.join(5)
    assert not (_watch_threads() - before), "a watch thread outlived its rank"
