"""NVML as a registered polled source: the agent's path from NVML to each rank's engine."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path

import pytest

from gpufake import FakeBackend, const, healthy
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.events import Event, GpuRound, NvmlHang
from rankwatch.identity import Identity
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.services import Services
from rankwatch.sources.polled import Poller, ToRank, WatchedRank
from rankwatch.sources.polled.gpu import GpuSource

pytestmark = pytest.mark.unit

IDENT = Identity(run="gpu", rank=0, local_rank=0, world_size=2, node="n1")


def _services(
    tmp_path: Path, fb: FakeBackend, ranks: list[WatchedRank] | None = None, **gpu: object
) -> tuple[Services, dict[int | None, list[Event]]]:
    """Two watched ranks (0 and 1) whose processes hold GPU 0 and GPU 1 (``ranks``: as the
    sources see them); what each rank's watcher is handed, by rank."""
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "d"), **{f"gpu.{k}": v for k, v in gpu.items()}})
    agent = Agent(cfg, IDENT)
    got: dict[int | None, list[Event]] = {}
    for rank in (0, 1):
        w = agent.add_watcher([], dataclasses.replace(IDENT, rank=rank, local_rank=rank))
        w.push = lambda e, r=rank: got.setdefault(r, []).append(e) or []  # type: ignore[method-assign]
    svc = Services(agent, cfg, gpu_backend=fb, server=False)
    svc.watched_ranks = lambda: (
        ranks
        or [  # type: ignore[method-assign]
            WatchedRank(r, (7000 + r,), frozenset({7000 + r})) for r in (0, 1)
        ]
    )
    svc._build_polled()
    return svc, got


def _gpus(events: list[Event]) -> list[list[int]]:
    return [[s.index for s in e.samples] for e in events if isinstance(e, GpuRound)]


def test_each_ranks_gpus_go_to_that_ranks_engine_and_nvml_state_to_the_agents(tmp_path: Path) -> None:
    fb = FakeBackend([healthy(i, fields={"compute_pids": const([7000 + i])}) for i in range(3)])
    svc, got = _services(tmp_path, fb)

    async def main() -> None:
        assert await svc.polled["gpu"].open()
        events = await svc.poll("gpu")
        assert events is not None and NvmlHang(events[-1].now, None) in events  # type: ignore[union-attr]
        routed = {e.rank: [s.index for s in e.event.samples] for e in events if isinstance(e, ToRank)}  # type: ignore[attr-defined]
        assert routed == {0: [0], 1: [1]}  # GPU 2 holds neither rank's processes: not watched

    asyncio.run(main())
    assert _gpus(got[0]) == [[0]] and _gpus(got[1]) == [[1]]
    assert [e for e in got[0] if isinstance(e, NvmlHang)] and not [
        e for e in got[1] if isinstance(e, NvmlHang)
    ]
    by_rank, up = svc.agent.gpu_latest()  # type: ignore[misc]  # what /metrics and the page read
    assert up and {k: [s.index for s in v] for k, v in by_rank.items()} == {0: [0], 1: [1]}
    assert {s.attribution for v in by_rank.values() for s in v} == {"nvml_process"}


def test_a_stuck_nvml_call_is_an_nvmlhang_each_period_counted_once_never_doubled(tmp_path: Path) -> None:
    fb = FakeBackend([healthy(0, fields={"compute_pids": const([7000])})], xid_supported=False)
    svc, got = _services(tmp_path, fb, call_timeout=0.2, xid_wait=0.0)
    p = svc.polled["gpu"]
    source = p.source
    assert isinstance(source, GpuSource)
    errors = svc.agent.internal_errors_by_component

    async def main() -> None:
        assert await p.open()
        assert _gpus([e.event for e in await p.once() or [] if isinstance(e, ToRank)]) == [[0]]
        release = threading.Event()
        fb.gpus[0].hang["memory"] = release
        try:
            for _ in range(2):  # given up after a short wait each time: the test's own timeout
                (hang,) = await svc.poll("gpu", 0.05) or []
                assert isinstance(hang, NvmlHang) and hang.hung_for is not None and hang.hung_for >= 0.05
            assert fb.calls["memory"] == 2  # the stuck call waited for, no second thread
            assert not source.sampler.up and source.view() == ({}, False)  # no stale readings
            assert errors["gpu"] == 1 and source.sampler.timeouts == 1
        finally:
            del fb.gpus[0].hang["memory"]
            release.set()
        events = await svc.poll("gpu", 5.0) or []
        assert NvmlHang(events[-1].now, None) in events  # type: ignore[union-attr]
        assert source.sampler.up and errors["gpu"] == 1

    asyncio.run(main())
    hangs = [e for e in got[0] if isinstance(e, NvmlHang)]
    assert [h.hung_for is None for h in hangs] == [False, False, True]


def test_nvml_absent_is_one_line_never_sampled_never_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fb = FakeBackend([], init_error="NVML Shared Library Not Found")
    svc, _ = _services(tmp_path, fb)
    p: Poller = svc.polled["gpu"]

    async def main() -> None:
        delivered: list[object] = []
        await asyncio.wait_for(p.run(asyncio.Event(), delivered.append), 5.0)  # ends: never sampled
        assert delivered == []

    with caplog.at_level("INFO", logger="rankwatch"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if "NVML" in r.getMessage()]
    assert lines == ["NVML not available: NVML Shared Library Not Found; GPU metrics disabled"]
    assert fb.calls["init"] == 1 and fb.calls["memory"] == 0 and p.errors["gpu"] == 0
    assert svc.agent.gpu_latest is not None and svc.agent.gpu_latest() == ({}, False)  # "sampler down"


def test_an_environment_read_stuck_in_d_state_never_holds_a_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The rank's /proc environ read blocks (a process in D state): samples go on with every
    GPU and no "none is tied" warning; past the /proc timeout the GPUs are tied without it
    (here by the environment the agent gave the rank), said once and counted."""
    from conftest import until
    from rankwatch import offloop
    from rankwatch.sources.polled import SourceContext
    from rankwatch.sources.polled import gpu as gpu_source

    release = threading.Event()
    monkeypatch.setattr(gpu_source, "_environ", lambda pid: release.wait(30) and {})
    monkeypatch.setattr(offloop, "PROC_TIMEOUT_S", 0.3)
    fb = FakeBackend([healthy(0), healthy(1)])
    cfg = replaced(Config(), {"gpu.call_timeout": 0.2})
    ranks = [WatchedRank(0, (4242,), frozenset({4242}), {"CUDA_VISIBLE_DEVICES": "1"})]
    src = GpuSource.create(
        SourceContext(cfg=cfg, folders=dict, ranks=lambda: ranks, rank=0, backends={"gpu": fb})
    )
    assert src is not None and src.open()

    def gpus() -> list[int]:
        return sorted(
            s.index for e in src.sample(src.inputs()) if isinstance(e, ToRank) for s in e.event.samples
        )

    try:
        assert gpus() == [0, 1] and src.owner == {}  # still being read: every GPU, tied later
        asyncio.run(until(lambda: gpus() == [1], 5.0))
        assert src.owner == {1: 0} and src.env_given_up == 1 and src.failed == 1
    finally:
        release.set()
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1 and "environment of pid 4242 not read" in said[0], said


def test_the_ranks_trees_are_walked_off_the_loop_and_only_when_the_gpus_are_mapped(tmp_path: Path) -> None:
    """What the GPU source reads of the ranks on the loop is what their last process samples
    knew; the walk of /proc that finds a worker started since (a child process that holds a
    GPU) runs in the sample, off the loop, and only when the GPUs are mapped to ranks anew."""
    fb = FakeBackend([healthy(i, fields={"compute_pids": const([7100 + i])}) for i in range(2)])
    walks: list[str] = []

    def walk(rank: int) -> list[int]:
        walks.append(threading.current_thread().name)
        return [7000 + rank, 7100 + rank]  # a worker the last process sample did not know

    ranks = [WatchedRank(r, (7000 + r,), frozenset({7000 + r}), walk=lambda r=r: walk(r)) for r in (0, 1)]
    svc, got = _services(tmp_path, fb, ranks)

    async def main() -> None:
        assert await svc.polled["gpu"].open()
        for _ in range(3):
            assert await svc.poll("gpu") is not None

    asyncio.run(main())
    assert len(walks) == 2 and threading.main_thread().name not in walks  # one map, two ranks
    assert _gpus(got[0]) == [[0]] * 3 and _gpus(got[1]) == [[1]] * 3
