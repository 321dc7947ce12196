"""Reads of other processes' /proc entries go through offloop, like filesystem calls.

A process in uninterruptible sleep (D state), or one holding its memory-map lock, blocks a read
of its /proc cmdline, environ or smaps for minutes. On the loop's default executor
(``asyncio.to_thread``) every sampling period then left one more worker blocked, the executor
filled up, and ``asyncio.run`` joined the stuck workers at exit: the agent could not stop. Each
test makes a call block on an event until the test ends; a watchdog thread lets it go after
``WATCHDOG_S``, so the old code fails on the time it took instead of hanging the suite.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import FakeClock, source_nodes, ticks_during, until
from rankwatch import offloop
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.dumps.capture import DumpResult
from rankwatch.events import ProcessSample
from rankwatch.identity import Identity
from rankwatch.runtime import agent as agent_mod
from rankwatch.runtime import modes
from rankwatch.runtime.services import Services
from rankwatch.runtime.watcher import RankWatcher
from rankwatch.sources.polled import process as process_source
from rankwatch.sources.process import ProcessProber

pytestmark = pytest.mark.unit

IDENT = Identity(run="t", rank=0, local_rank=0, world_size=1, node="n")
TIMEOUT = 0.05  # what a blocking call is given here (2 s and 10 s in the agent)
WATCHDOG_S = 15.0  # the old code's stuck threads are let go after this, so it fails, not hangs
EXIT_S = 8.0  # an agent that stops with a call still stuck is gone within this


class Stuck:
    """A blocking call that waits until ``release``; counts the threads inside it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.calls = 0
        self.inside = 0
        self.most_inside = 0

    def block(self) -> None:
        with self.lock:
            self.calls += 1
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            self.release.wait()
        finally:
            with self.lock:
                self.inside -= 1


@pytest.fixture
def stuck(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stuck]:
    monkeypatch.setattr(offloop, "PROC_TIMEOUT_S", TIMEOUT)
    monkeypatch.setattr(offloop, "timeouts", {})
    # The process source's floor on its timeout (2 s): a blocking call is given TIMEOUT here.
    monkeypatch.setattr(process_source, "SAMPLE_TIMEOUT_MIN_S", TIMEOUT)
    s = Stuck()
    yield s
    s.release.set()
    deadline = time.monotonic() + 10
    while s.inside and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.inside == 0


def _proc_threads(name: str) -> list[str]:
    """Threads of ``name`` (an earlier test's idle kept thread, of another name, may linger)."""
    return [t.name for t in threading.enumerate() if t.name == name]


class HungProber:
    """A prober whose ``sample`` blocks (a rank in D state); after the release it samples."""

    pid = 4242  # set as a watcher's prober, not attached: its calls are named rankwatch-proc-<rank>

    def __init__(self, stuck: Stuck, clock: Callable[[], float]) -> None:
        self.stuck = stuck
        self.clock = clock

    def sample(self) -> ProcessSample:
        if not self.stuck.release.is_set():
            self.stuck.block()
        return ProcessSample(time=self.clock(), pid=self.pid, alive=True, cpu_time_s=1.0, state="sleeping")

    def pids(self) -> list[int]:
        return []

    def known_pids(self) -> list[int]:
        return []


def _bounded_run(stuck: Stuck, main: Callable[[], Coroutine[Any, Any, Any]]) -> tuple[Any, float, bool]:
    """``asyncio.run(main())`` with a watchdog that releases the stuck call after WATCHDOG_S:
    (its result, the seconds it took, whether the watchdog had to step in)."""
    fired = threading.Event()

    def watchdog() -> None:
        if not stuck.release.wait(WATCHDOG_S):
            fired.set()
            stuck.release.set()

    dog = threading.Thread(target=watchdog, name="test-watchdog", daemon=True)
    dog.start()
    start = time.monotonic()
    try:
        out = asyncio.run(main())
    finally:
        took = time.monotonic() - start
    return out, took, fired.is_set()


def test_a_hung_sample_leaves_one_thread_keeps_the_loop_turning_and_claims_nothing(
    stuck: Stuck, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    clock = FakeClock()
    found: list[Any] = []
    cfg = replaced(Config(), {"process.sample_interval": 0.01, "stall.startup_grace": 5.0})
    w = RankWatcher(cfg, IDENT, [], emit=found.append, clock=clock)
    w.prober = HungProber(stuck, clock)  # type: ignore[assignment]
    periods = 12

    async def go() -> None:
        async def many() -> None:
            for _ in range(periods):
                clock.advance(60.0)  # far past every stall timeout: no sample, no verdict
                assert await w.sample_once() == []

        _, ticks, took = await ticks_during(many())
        assert took < TIMEOUT + 2  # only the first period waited for the timeout
        assert ticks >= 5  # the loop kept turning
        assert len(_proc_threads(w.proc_io)) == 1 and stuck.most_inside == 1  # one thread on the hung process
        assert found == []  # no stall and no crash claimed from missing samples
        stuck.release.set()  # the process came back: once the stuck call returned, sampling resumes
        await until(lambda: offloop._stuck[w.proc_io].is_set(), 5)
        await w.sample_once()  # judged from a real sample again (12 silent minutes: a stall)
        assert w.last_sample is not None and w.last_sample.alive

    _, took, fired = _bounded_run(stuck, go)
    assert not fired and took < EXIT_S
    assert stuck.calls == 1
    # Each period counted, as rankwatch_internal_errors_total{component="process"}.
    assert w.source_errors["process"] == periods
    assert offloop.timeouts == {"rankwatch-proc-0": periods}
    said = [m for m in (r.getMessage() for r in caplog.records) if "rankwatch-proc-" in m or "sampling" in m]
    assert len(said) == 1 and "D state" in said[0], said  # logged once, with the likely cause


def _watch_cfg(tmp: Path) -> Config:
    return replaced(
        Config(),
        {
            "process.sample_interval": 0.05,
            "gpu.enabled": False,
            "dumps.dir": str(tmp / "dumps"),
            "dumps.on_stall": False,
            "alerts.spool_dir": str(tmp / "spool"),
            "alerts.board_dir": "",
        },
    )


def test_the_agent_exits_while_a_process_sample_is_stuck(
    tmp_path: Path, stuck: Stuck, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rankwatch watch --pid`: its rank's sample hangs; a stop must still end the agent. With
    ``asyncio.to_thread`` ``asyncio.run`` waited for the stuck executor thread."""

    def hung_sample(self: ProcessProber) -> ProcessSample:
        stuck.block()
        raise OSError("the process came back too late")

    monkeypatch.setattr(ProcessProber, "sample", hung_sample)
    log = tmp_path / "rank-0.log"
    log.touch()
    started: list[Services] = []

    async def main() -> tuple[int, int]:
        stop = asyncio.Event()
        task = asyncio.create_task(
            modes.watch_processes(
                _watch_cfg(tmp_path), IDENT, pids=[os.getpid()], match=None, logs=[log], sinks=[], stop=stop,
                services={"server": False, "on_start": started.append},
            )
        )  # fmt: skip
        try:
            await until(lambda: started and started[0].agent.watchers[0].source_errors["process"] >= 3, 10)
            errors = started[0].agent.snapshot().internal_errors["process"]  # what /metrics shows
        finally:
            stop.set()
        return await asyncio.wait_for(task, EXIT_S), errors

    (rc, errors), took, fired = _bounded_run(stuck, main)
    assert not fired and took < EXIT_S, f"asyncio.run took {took:.1f}s: it waited for the stuck sample"
    assert rc == 0 and errors >= 3
    assert stuck.calls == 1 and stuck.most_inside == 1


@pytest.mark.parametrize("hangs", ["find_processes", "_read_process_env"])
def test_the_agent_exits_while_finding_processes_is_stuck(
    tmp_path: Path, stuck: Stuck, monkeypatch: pytest.MonkeyPatch, hangs: str
) -> None:
    """`rankwatch watch --match`: the scan of every process's cmdline, or the read of a found
    rank's environment (to learn its RANK), hangs at startup and then every period; the agent
    starts, counts it under ``process`` and still stops. Both used to block the loop itself
    at startup, the scan later the executor."""

    def hung(*_: Any, **__: Any) -> Any:
        stuck.block()
        return ({}, None) if hangs == "_read_process_env" else []

    monkeypatch.setattr(modes, hangs, hung)
    if hangs == "_read_process_env":
        monkeypatch.setattr(modes, "find_processes", lambda pattern, **_: [os.getpid()])
    started: list[Services] = []

    async def main() -> tuple[int, int]:
        stop = asyncio.Event()
        task = asyncio.create_task(
            modes.watch_processes(
                _watch_cfg(tmp_path), IDENT, pids=[], match="no-such-trainer", logs=[], sinks=[], stop=stop,
                services={"server": False, "on_start": started.append},
            )
        )  # fmt: skip
        try:
            await until(
                lambda: started and started[0].agent.internal_errors_by_component.get("process", 0) > 2, 10
            )
            errors = started[0].agent.snapshot().internal_errors["process"]
        finally:
            stop.set()
        return await asyncio.wait_for(task, EXIT_S), errors

    (rc, errors), took, fired = _bounded_run(stuck, main)
    assert not fired and took < EXIT_S, f"asyncio.run took {took:.1f}s: it waited for the stuck scan"
    assert rc == 0 and errors >= 3
    assert stuck.calls == 1 and stuck.most_inside == 1  # later periods left no thread behind


def test_a_capture_stuck_on_the_process_is_a_failed_dump_that_says_why(
    tmp_path: Path, stuck: Stuck, monkeypatch: pytest.MonkeyPatch
) -> None:
    """py-spy is killed past its own timeout, but the capture around it reads /proc of the
    process (cmdline, status, children): stuck there, the dump fails with the reason, the next
    capture of that pid fails at once, and the agent still exits."""

    def hung_capture(pid: int, **_: Any) -> DumpResult:
        stuck.block()
        raise OSError("the process came back too late")

    monkeypatch.setattr(agent_mod, "capture", hung_capture)
    monkeypatch.setattr(agent_mod, "CAPTURE_SLACK_S", TIMEOUT)
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps"), "dumps.timeout": 0.1})
    agent = agent_mod.Agent(cfg, IDENT)
    agent.add_watcher([tmp_path / "rank-0.log"]).attach(os.getpid())

    async def main() -> tuple[Path | None, Path | None]:
        first, ticks, took = await ticks_during(agent.capture_dumps("stall"))
        assert took < 0.1 + TIMEOUT + 2 and ticks >= 5
        again, _, took = await ticks_during(agent.capture_dumps("stall"))
        assert took < 2
        return first, again

    (first, again), took, fired = _bounded_run(stuck, main)
    assert not fired and took < EXIT_S
    assert first is not None and again is not None
    text = (first / "rank-0.txt").read_text()
    assert "did not return" in text and "D state" in text, text
    assert agent.dumps_failed == {"timeout": 2} and agent.internal_errors_by_component["dumps"] == 2
    assert stuck.calls == 1


def test_no_blocking_call_goes_to_the_loops_executor() -> None:
    """One policy: the default executor's threads are shared and joined at exit, so the agent
    hands no blocking call to it (``asyncio.to_thread``, ``run_in_executor(None, ...)``)."""
    pkg = Path(__file__).resolve().parent.parent / "agent" / "rankwatch"
    found = []
    for path in sorted(pkg.rglob("*.py")):
        for node in source_nodes(path):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            name = node.func.attr
            default = (
                bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value is None
            )
            if name == "to_thread" or (name == "run_in_executor" and default):
                found.append(f"{path.relative_to(pkg)}:{node.lineno} {name}")
    assert not found, "use rankwatch.offloop (call, fs or proc) instead: " + ", ".join(found)
