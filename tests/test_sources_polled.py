"""Polled sources: one file each, registered, sampled off the loop with a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

from conftest import until
from rankwatch import offloop
from rankwatch.config.loader import load_config
from rankwatch.events import DiskSample, Event, Tick
from rankwatch.identity import Identity
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.services import Services
from rankwatch.sources import polled
from rankwatch.sources.polled import SourceContext, build_sources, register_source
from rankwatch.sources.polled.disk import DiskSource, disk_samples

pytestmark = pytest.mark.unit

IDENT = Identity(run="src", rank=0, local_rank=0, world_size=1, node="n1")


def test_the_disk_probe_is_a_registered_source_found_without_a_line_elsewhere(tmp_path: Path) -> None:
    cfg = load_config(None)
    folders = {str(tmp_path / "logs"): "log", str(tmp_path / "not-made-yet" / "dumps"): "dumps"}
    (tmp_path / "logs").mkdir()
    built = build_sources(SourceContext(cfg=cfg, folders=lambda: folders))
    (disk,) = [s for s in built if isinstance(s, DiskSource)]
    events = disk.sample(disk.inputs())
    # Both folders sit on one filesystem: one sample naming both roles, with a wall time.
    assert len(events) == 1
    (s,) = events
    assert isinstance(s, DiskSample) and s.roles == folders and 0 < s.free <= s.total and s.wall
    assert disk_samples({}) == []


class _Hanging:
    """A source whose sample blocks until released: a dead NFS mount, a stuck driver."""

    name: ClassVar[str] = "test-hanging"
    release = threading.Event()
    calls = 0

    @classmethod
    def create(cls, ctx: SourceContext) -> _Hanging:
        return cls()

    @property
    def interval(self) -> float:
        return 3600.0

    @property
    def timeout(self) -> float:
        return 0.05  # waited out for real by each poll of the test

    def inputs(self) -> None:
        return None

    def sample(self, inputs: Any) -> list[Event]:
        type(self).calls += 1
        self.release.wait(10)
        return [Tick(now=1.0, wall=2.0)]


def test_a_new_source_is_registered_and_a_hung_sample_is_given_up_once_counted_never_doubled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    register_source(_Hanging)
    try:
        cfg = load_config(None)
        agent = Agent(cfg, IDENT)
        svc = Services(agent, cfg, server=False)

        async def main() -> None:
            svc._start_polled()
            assert "test-hanging" in svc.polled and "disk" in svc.polled
            assert await svc.poll("test-hanging") is None  # the loop task's sample is in flight
            assert await svc.poll("test-hanging") is None
            assert _Hanging.calls == 1  # one thread, waited for again, never a second one
            assert agent.internal_errors_by_component.get("test-hanging", 0) >= 1
            _Hanging.release.set()
            events = await svc.poll("test-hanging", timeout=5.0)
            assert events == [Tick(now=1.0, wall=2.0)]
            await svc.close(2.0)

        asyncio.run(main())
        hung = [r for r in caplog.records if "test-hanging sample hung" in r.getMessage()]
        assert len(hung) == 1
    finally:
        polled.REGISTRY.remove(_Hanging)


def test_two_sources_of_one_name_are_refused() -> None:
    class Other(_Hanging):
        pass

    with pytest.raises(TypeError, match="two polled sources"):
        register_source(_Hanging)
        register_source(Other)
    polled.REGISTRY.remove(_Hanging)


class _Partial:
    """A source whose samples return with some readings failed (it logs which, once)."""

    name: ClassVar[str] = "test-partial"
    interval = 3600.0
    timeout = 5.0

    def __init__(self, opens: bool | None) -> None:
        self.opens = opens  # None: its open hangs
        self.failed = 0
        self.release = threading.Event()

    def open(self) -> bool:
        if self.opens is None:
            self.release.wait(10)
        return bool(self.opens)

    def inputs(self) -> None:
        return None

    def sample(self, inputs: Any) -> list[Event]:
        self.failed += 2
        return [Tick(now=1.0, wall=2.0)]


def test_a_sample_with_failed_readings_counts_once_and_a_source_that_does_not_open_is_never_sampled() -> None:
    async def main() -> None:
        errors: dict[str, int] = {}
        src = _Partial(opens=True)
        p = polled.Poller(src, errors)
        assert await p.open()
        assert await p.poll() == [Tick(now=1.0, wall=2.0)] and errors["test-partial"] == 1
        assert await p.poll() and errors["test-partial"] == 2  # once a sample, not once a reading

        for opens, counted in ((False, 0), (None, 1)):  # says no (its own line) / hangs (counted)
            src = _Partial(opens)
            src.timeout = 0.05
            errors = {}
            got: list[object] = []
            await asyncio.wait_for(polled.Poller(src, errors).run(asyncio.Event(), got.append), 5.0)
            src.release.set()
            assert got == [] and src.failed == 0 and errors["test-partial"] == counted

    asyncio.run(main())


class _Stuck:
    """A blocking source under the stuck-sample policies given as attributes: its sample blocks
    while ``hold`` is set (a process in D state) and says which thread it ran on."""

    name: ClassVar[str] = "test-stuck"
    interval = 3600.0
    timeout = 0.05

    def __init__(self, thread: str, **policy: str) -> None:
        self.thread = thread
        for k, v in policy.items():
            setattr(self, k, v)
        self.hold = threading.Event()
        self.release = threading.Event()
        self.ran_on: list[str] = []
        self.inside = 0

    def inputs(self) -> None:
        return None

    def sample(self, inputs: Any) -> list[Event]:
        self.ran_on.append(threading.current_thread().name)
        if self.hold.is_set():
            self.inside += 1
            self.release.wait(10)
            self.inside -= 1
        return [Tick(now=float(len(self.ran_on)), wall=2.0)]


def _polls(src: _Stuck, periods: int, errors: dict[str, int]) -> list[Any]:
    """A hang (its first poll waits ``src.timeout``), ``periods`` more polls each given an hour
    (one still waiting after a few turns of the loop, the stuck sample waited for again, is
    cancelled: ``"waiting"``), then the release and one poll that samples."""

    async def main() -> list[Any]:
        p = polled.Poller(src, errors)
        src.hold.set()
        got: list[Any] = [await p.poll()]
        for _ in range(periods):
            task = asyncio.ensure_future(p.poll(timeout=3600.0))
            for _ in range(5):
                await asyncio.sleep(0)
            if task.done():
                got.append(task.result())
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                got.append("waiting")
        src.hold.clear()
        src.release.set()
        await until(lambda: src.inside == 0 and not p.stuck, 5)
        got.append(await p.poll(timeout=5.0))
        return got

    return asyncio.run(main())


def test_a_source_that_fails_while_stuck_never_waits_for_its_hung_sample_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``when_stuck = "fail"``: each period while the sample given up on has not returned fails
    at once (no second thread on it); its late result is dropped and the next period samples
    anew. The default (``"wait"``) waits for the same sample again and hands on its result."""
    monkeypatch.setattr(offloop, "timeouts", {})
    src = _Stuck("rankwatch-test-fail", when_stuck="fail")
    got = _polls(src, 3, {})
    assert got[:4] == [None, None, None, None]
    assert got[4] == [Tick(now=2.0, wall=2.0)]  # a new sample, not the stuck one's late result
    assert src.ran_on == ["rankwatch-test-fail"] * 2
    assert offloop.timeouts == {"rankwatch-test-fail": 4}  # every period, by its thread's name

    waits = _Stuck("rankwatch-test-wait")
    got = _polls(waits, 1, {})
    assert got == [None, "waiting", [Tick(now=1.0, wall=2.0)]]  # the stuck sample's late result
    assert waits.ran_on == ["rankwatch-test-wait"]


@pytest.mark.parametrize(("counted", "when", "expect"), [
    ("period", "fail", 4), ("once", "fail", 1), ("period", "wait", 2), ("once", "wait", 1),
])  # fmt: skip
def test_a_hang_is_counted_every_period_or_once_as_the_source_says(
    monkeypatch: pytest.MonkeyPatch, counted: str, when: str, expect: int
) -> None:
    """``count_hung = "period"``: every period without a sample is one more internal error (a
    rate of missed samples); ``"once"`` (the default): one hang, one count."""
    monkeypatch.setattr(offloop, "timeouts", {})
    src = _Stuck(f"rankwatch-test-count-{counted}-{when}", when_stuck=when, count_hung=counted)
    if when == "wait":
        src.timeout = 0.01  # each period waits it out
    errors: dict[str, int] = {}
    periods = 3 if when == "fail" else 1

    async def main() -> None:
        p = polled.Poller(src, errors)
        src.hold.set()
        for _ in range(1 + periods):
            assert await p.poll() is None
        src.hold.clear()
        src.release.set()
        await until(lambda: src.inside == 0 and not p.stuck, 5)

    asyncio.run(main())
    assert errors == {"test-stuck": expect}


@pytest.mark.parametrize("when", ["fail", "wait"])
def test_a_hang_is_logged_once_with_the_cause_the_source_names(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, when: str
) -> None:
    monkeypatch.setattr(offloop, "timeouts", {})
    caplog.set_level(logging.WARNING)
    src = _Stuck(f"rankwatch-test-hint-{when}", when_stuck=when, hint="a tape drive rewinding?")
    src.timeout = 0.01
    _polls(src, 2 if when == "fail" else 0, {})
    said = [r.getMessage() for r in caplog.records if "test-" in r.getMessage()]
    assert len(said) == 1 and "a tape drive rewinding?" in said[0], said


def test_a_sample_runs_on_the_thread_the_source_names_read_each_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``thread`` names the sample's thread, and is read anew each period: a source that names
    one per process it samples (a restarted rank's new pid) samples the new one at once while a
    read of the old one is stuck."""
    monkeypatch.setattr(offloop, "timeouts", {})
    src = _Stuck("rankwatch-test-pid1", when_stuck="fail")

    async def main() -> list[Any] | None:
        p = polled.Poller(src, {})
        src.hold.set()
        assert await p.poll() is None
        src.hold.clear()  # the new process answers; the old one's read is still stuck
        src.thread = "rankwatch-test-pid2"
        got = await p.poll(timeout=5.0)
        src.release.set()
        await until(lambda: src.inside == 0, 5)
        return got

    assert asyncio.run(main()) == [Tick(now=2.0, wall=2.0)]
    assert src.ran_on == ["rankwatch-test-pid1", "rankwatch-test-pid2"]
    assert offloop.timeouts == {"rankwatch-test-pid1": 1}
