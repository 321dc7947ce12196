"""Polled sources: one file each, registered, sampled off the loop with a timeout."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

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
