"""One policy for blocking filesystem calls from the event loop: a daemon thread each, a
timeout, one log line and a count, and never more than one thread left on a hung mount.

Each test makes a store call block for ever (a dead NFS mount) and checks that the loop
goes on after the timeout; with ``asyncio.to_thread`` and no timeout they waited for ever.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import agent_token, ticks_during
from rankwatch import offloop
from rankwatch.actions.alerts import AlertDispatcher
from rankwatch.config.schema import AlertsConfig, Config, ServerConfig
from rankwatch.config.snapshot import replaced
from rankwatch.identity import Identity
from rankwatch.runtime.agent import Agent
from rankwatch.server import start_server

IDENT = Identity(run="t", rank=0, local_rank=0, world_size=1, node="n")
# Short (the tests wait it out for real); the loop-turn count below still tells a loop that
# went on (dozens of turns) from one that was blocked for the whole timeout (one or two).
TIMEOUT = 0.05


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """A call that blocks until the test ends (then the stuck threads are let go)."""
    monkeypatch.setattr(offloop, "FS_TIMEOUT_S", TIMEOUT)
    monkeypatch.setattr(offloop, "timeouts", {})
    release = threading.Event()
    started: list[float] = []

    def block(*_: Any, **__: Any) -> Any:
        started.append(time.monotonic())
        release.wait()
        raise OSError("the mount came back too late")

    block.started = started  # type: ignore[attr-defined]
    block.release = release  # type: ignore[attr-defined]
    yield block
    release.set()
    deadline = time.monotonic() + 10
    while any(not e.is_set() for e in offloop._stuck.values()) and time.monotonic() < deadline:
        time.sleep(0.01)


def _run(hung: Any, go: Callable[[], Any]) -> None:
    async def main() -> None:
        try:
            await go()
        finally:
            hung.release.set()  # before asyncio.run ends: it joins the default executor's threads

    asyncio.run(main())


@pytest.mark.unit
def test_a_hung_call_times_out_is_logged_once_counted_and_leaves_one_thread(
    hung: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    errors: dict[str, int] = {}

    async def go() -> None:
        async def twice() -> None:
            for _ in range(2):
                with pytest.raises(asyncio.TimeoutError):
                    await offloop.fs(hung, name="rankwatch-test", errors=errors, component="dumps")

        _, ticks, took = await ticks_during(twice())
        assert TIMEOUT <= took < TIMEOUT + 2  # the second call did not wait again
        assert ticks >= 5

    _run(hung, go)
    assert len(hung.started) == 1  # the second call left no new thread on the mount
    assert offloop.timeouts == {"rankwatch-test": 2} and errors == {"dumps": 2}
    assert sum("rankwatch-test: a blocking call" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.process
def test_a_hung_dump_store_does_not_wedge_the_api(tmp_path: Path, hung: Any) -> None:
    agent = Agent(replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")}), IDENT)
    agent.store.list_incidents = hung  # type: ignore[method-assign]
    agent.store.find = hung  # type: ignore[method-assign]

    async def go() -> None:
        server = await start_server(agent, ServerConfig(listen="127.0.0.1:0"))
        auth = {"Authorization": f"Bearer {agent_token()}"}
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10), headers=auth) as s:

                async def ask(path: str) -> int:
                    async with s.get(server.url + path) as r:
                        return r.status

                status, ticks, took = await ticks_during(ask("/api/dumps"))
                assert status == 503 and took < TIMEOUT + 2 and ticks >= 5
                status, _, _ = await ticks_during(ask("/api/dumps/20240501T100000Z_stall/0"))
                assert status == 503
                status, _, _ = await ticks_during(ask("/healthz"))
                assert status == 200
        finally:
            await server.close()

    _run(hung, go)
    # one stuck call per kind: the listing's does not take the reads down with it
    assert offloop.timeouts["rankwatch-dumps-list"] >= 1 and offloop.timeouts["rankwatch-dumps-read"] >= 1


@pytest.mark.unit
def test_a_hung_dumps_folder_does_not_hold_the_capture(tmp_path: Path, hung: Any) -> None:
    agent = Agent(replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")}), IDENT)
    agent._incident = hung  # type: ignore[method-assign]

    async def go() -> None:
        folder, ticks, took = await ticks_during(agent.capture_dumps("stall"))
        assert folder is None and took < TIMEOUT + 2 and ticks >= 5

    _run(hung, go)
    assert agent.internal_errors_by_component.get("dumps") == 1


@pytest.mark.unit
def test_a_hung_spool_does_not_hold_the_dispatcher(tmp_path: Path, hung: Any) -> None:
    cfg = AlertsConfig(spool_dir=str(tmp_path / "spool"), board_dir="")

    async def go() -> None:
        d = AlertDispatcher(cfg, IDENT, sinks=[])
        out, ticks, took = await ticks_during(d.delivery._spool_op(hung))
        assert out is None and took < TIMEOUT + 2 and ticks >= 5
        assert d.errors.get("alerts") == 1

    _run(hung, go)


@pytest.mark.unit
def test_periodic_calls_of_one_name_reuse_its_thread_a_busy_one_gets_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 30 ("Light"): a call a second must not start and end a thread a second; a call
    still running (or stuck) never makes the next one of its name wait."""
    from conftest import wait_for

    monkeypatch.setattr(offloop, "_lanes", {})
    release = threading.Event()

    def ident() -> int:
        return threading.get_ident()

    def slow() -> int:
        release.wait(10)
        return threading.get_ident()

    async def go() -> None:
        first = await offloop.call(ident, timeout=5, name="rankwatch-lane")
        again = [await offloop.call(ident, timeout=5, name="rankwatch-lane") for _ in range(5)]
        assert again == [first] * 5
        stuck = offloop.in_daemon(slow, name="rankwatch-lane")
        other = await offloop.call(ident, timeout=5, name="rankwatch-lane")  # not behind ``slow``
        release.set()
        assert other != await stuck

    asyncio.run(go())
    monkeypatch.setattr(offloop, "LANE_IDLE_S", 0.01)
    offloop.start(lambda: None, "rankwatch-lane")  # the kept thread takes it, then ends when idle
    wait_for(lambda: "rankwatch-lane" not in offloop._lanes, timeout=20, what="the idle thread ending")
    wait_for(
        lambda: not any(t.name == "rankwatch-lane" for t in threading.enumerate()),
        timeout=20,
        what="it ended",
    )


@pytest.mark.unit
def test_a_kept_thread_from_before_the_agent_lowered_its_priority_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Linux keeps a nice value per thread: a thread kept from start-up would go on running the
    agent's periodic work at the priority it had before ``process.agent_nice`` took effect."""
    monkeypatch.setattr(offloop, "_lanes", {})
    nice = [0]
    monkeypatch.setattr(offloop, "_nice", lambda: nice[0])

    def ident() -> int:
        return threading.get_ident()

    async def go() -> None:
        before = await offloop.call(ident, timeout=5, name="rankwatch-nice")
        assert await offloop.call(ident, timeout=5, name="rankwatch-nice") == before
        nice[0] = 10
        after = await offloop.call(ident, timeout=5, name="rankwatch-nice")
        assert after != before
        assert await offloop.call(ident, timeout=5, name="rankwatch-nice") == after

    asyncio.run(go())
    assert offloop._lanes["rankwatch-nice"].nice == 10
