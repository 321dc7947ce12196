"""Cross-agent grouping: several dispatchers (one per rank, as under `srun -n N rankwatch run`)
share an alert board folder and send one message per incident between them.

Each dispatcher runs in this process with its own sink; they share one fake clock (policy
timing) and the board's files (real I/O in threads, so positive checks poll).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rankwatch.actions.alerts import AlertDispatcher
from rankwatch.actions.alerts.board import Board, Record, board_path
from rankwatch.actions.alerts.message import AlertMessage
from rankwatch.config.schema import AlertsConfig
from rankwatch.identity import Identity
from rankwatch.records import Finding, Severity

RUN = "job42"
TAKEOVER = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0  # also the wall clock: board records carry it

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@dataclass
class RecordingSink:
    name: str = "rec"
    alerts: list[AlertMessage] = field(default_factory=list)

    async def deliver(self, alert: AlertMessage) -> None:
        self.alerts.append(alert)


def stall(rank: int, *, resolved: bool = False, **evidence: Any) -> Finding:
    msg = "progress resumed" if resolved else f"no progress for 12m on rank {rank}"
    return Finding("stall", Severity.CRITICAL, rank, msg, 1200, evidence=evidence, resolved=resolved)


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def running(d: AlertDispatcher) -> AsyncIterator[AlertDispatcher]:
    task = asyncio.create_task(d.run())
    try:
        yield d
    finally:
        await d.close(1.0)
        await asyncio.wait_for(task, 5.0)


def agent(
    tmp_path: Path, rank: int, world: int, clock: FakeClock, board: Path | str, **kw: Any
) -> tuple[AlertDispatcher, RecordingSink]:
    ident = Identity(run=RUN, rank=rank, local_rank=rank % 2, world_size=world, node=f"node-{rank // 2}")
    base: dict[str, Any] = dict(
        startup_quiet=0.0,
        group_wait=5.0,
        spool_dir=str(tmp_path / f"spool-{rank}"),
        board_dir=str(board),
        board_takeover=TAKEOVER,
    )
    sink = RecordingSink()
    d = AlertDispatcher(AlertsConfig(**{**base, **kw}), ident, sinks=[sink], clock=clock, wall=clock)
    return d, sink


@asynccontextmanager
async def all_running(ds: list[AlertDispatcher]) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        for d in ds:
            await stack.enter_async_context(running(d))
        yield


async def tick(ds: list[AlertDispatcher], clock: FakeClock, dt: float) -> None:
    """Advance the shared clock and let every dispatcher (and its board thread) act on it."""
    clock.advance(dt)
    for _ in range(10):
        for d in ds:
            d.wake()
        await asyncio.sleep(0.02)


def state(board: Path, rank: int, kind: str = "stall") -> str | None:
    """The rank's record on the board, as its file name says (r<rank>-<state>-<us>.json)."""
    path = board_path(str(board), None, RUN)
    assert path is not None
    names = sorted(p.name for p in (path / kind).glob(f"r{rank}-*.json"))
    return names[-1].split("-")[1] if names else None


def sent(sinks: list[RecordingSink]) -> list[Any]:
    return [a for s in sinks for a in s.alerts]


def test_job_wide_stall_is_one_message_from_the_lowest_rank(tmp_path: Path) -> None:
    """Ranks 0-2 stall, rank 3 is healthy: one "3 of 4" message, one resolve, one repeat."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 4, clock, board, repeat_interval=3600.0) for r in range(4)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        async with all_running(ds):
            for r in (2, 0, 1):  # the order agents notice does not matter
                ds[r].send(stall(r, classification="busy" if r == 1 else "idle"))
            await until(lambda: all(state(board, r) == "firing" for r in range(3)))
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) == 1)
            await tick(ds, clock, 2.1)  # followers re-read the board and find the marker
            await until(lambda: sum(d.peer_stats["grouped_by_peer"] for d in ds) == 2)
            assert len(sinks[0].alerts) == 1 and sent(sinks) == sinks[0].alerts
            a = sinks[0].alerts[0]
            assert a.title == "stall on 3 of 4 ranks, suspect rank 1"
            assert a.ranks == [0, 1, 2] and a.nodes == ["node-0", "node-1"]
            assert ds[0].peer_stats["led"] == 1

            await tick(ds, clock, 3600)  # repeat interval: one "still firing" between them
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) == 2)
            await tick(ds, clock, 2.1)
            assert sent(sinks)[1].title == "still firing: stall on 3 of 4 ranks, suspect rank 1"

            for r in range(3):
                ds[r].send(stall(r, resolved=True))
            await until(lambda: all(state(board, r) == "resolved" for r in range(3)))
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) == 3)
            await tick(ds, clock, 2.1)
            await tick(ds, clock, 60)
        assert [a.title for a in sent(sinks)][2] == "resolved: stall on 3 of 4 ranks"
        assert len(sent(sinks)) == 3

    asyncio.run(go())


def test_dead_leader_is_taken_over_after_the_timeout(tmp_path: Path) -> None:
    """Rank 0's record is on the board but its agent died before sending: rank 1 sends for both."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        path = board_path(str(board), None, RUN)
        assert path is not None
        member = {"message": "no progress for 12m", "step": 1200, "evidence": {}, "starts_at": clock()}
        Board(path, RUN, 600).post([Record(RUN, "stall", 0, "firing", clock(), "node-0", "critical", member)])
        d, sink = agent(tmp_path, 1, 8, clock, board)
        async with running(d):
            d.send(stall(1))
            await until(lambda: state(board, 1) == "firing")
            await tick([d], clock, 5.1)
            await tick([d], clock, TAKEOVER - 1)
            assert sink.alerts == []  # still waiting for rank 0
            await tick([d], clock, 1.1)
            await until(lambda: len(sink.alerts) == 1)
        a = sink.alerts[0]
        assert a.ranks == [0, 1] and a.title == "stall on 2 ranks (0-1)"  # 8 ranks, 2 visible
        assert a.members[0].node == "node-0" and a.members[0].message == "no progress for 12m"
        assert d.peer_stats["took_over"] == 1
        markers = list((path / "stall").glob("sent-firing-*.json"))
        assert len(markers) == 1 and json.loads(markers[0].read_text())["covers"].keys() == {"0", "1"}

    asyncio.run(go())


def test_stale_records_are_ignored_and_cleaned(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        path = board_path(str(board), None, RUN)
        assert path is not None
        old = clock() - 100_000  # a previous incident's record of an agent long gone
        Board(path, RUN, 600).post([Record(RUN, "stall", 0, "firing", old, "node-0", "critical", {})])
        d, sink = agent(tmp_path, 1, 8, clock, board)
        async with running(d):
            d.send(stall(1))
            await tick([d], clock, 5.1)
            await until(lambda: len(sink.alerts) == 1)
        assert sink.alerts[0].title == "stall on rank 1"
        assert state(board, 0) is None

    asyncio.run(go())


def test_unwritable_board_falls_back_to_per_agent_alerts(tmp_path: Path, caplog: Any) -> None:
    async def go() -> None:
        clock = FakeClock()
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("a file where the board folder should be")  # fails for root too
        errors: dict[str, int] = {}
        ident = Identity(run=RUN, rank=1, local_rank=1, world_size=8, node="node-0")
        cfg = AlertsConfig(
            startup_quiet=0.0, group_wait=5.0, spool_dir=str(tmp_path / "spool"), board_dir=str(blocker)
        )
        sink = RecordingSink()
        d = AlertDispatcher(cfg, ident, sinks=[sink], clock=clock, wall=clock, errors=errors)
        async with running(d):
            d.send(stall(1))
            d.send(stall(5))
            await tick([d], clock, 5.1)
            await until(lambda: len(sink.alerts) == 1)
            d.send(stall(1, resolved=True))
            d.send(stall(5, resolved=True))
            await tick([d], clock, 5.1)
            await until(lambda: len(sink.alerts) == 2)
        assert [a.ranks for a in sink.alerts] == [[1, 5], [1, 5]]
        assert errors["alerts"] >= 1 and d.peer_stats["fallback"] == 2

    with caplog.at_level(logging.ERROR, logger="rankwatch.alerts"):
        asyncio.run(go())
    assert sum("alert board" in r.getMessage() for r in caplog.records) == 1


def test_agents_closing_together_still_send_one_message(tmp_path: Path) -> None:
    """A crashed job: every agent exits within its group wait; close() settles on the board."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 2, clock, board) for r in range(2)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        tasks = [asyncio.create_task(d.run()) for d in ds]
        for r, d in enumerate(ds):
            d.send(stall(r))
        await until(lambda: all(state(board, r) == "firing" for r in range(2)))
        await asyncio.gather(*(d.close(2.0) for d in ds))
        await asyncio.gather(*tasks)
        assert [a.ranks for a in sent(sinks)] == [[0, 1]]
        assert sent(sinks)[0].title == "stall on 2 of 2 ranks"

    asyncio.run(go())


@pytest.mark.parametrize("board_dir", ["", None])
def test_board_off(tmp_path: Path, board_dir: str | None) -> None:
    """'' turns it off; unset it lives beside the dumps, so without a dumps dir there is none."""
    d = AlertDispatcher(
        AlertsConfig(spool_dir=str(tmp_path), board_dir=board_dir), Identity(RUN, 0, 0, 2, "n"), sinks=[]
    )
    assert d.peers is None
    d2 = AlertDispatcher(
        AlertsConfig(spool_dir=str(tmp_path)), Identity(RUN, 0, 0, 2, "n"), sinks=[], dumps_dir=tmp_path / "d"
    )
    assert d2.peers is not None and d2.peers.board.path == tmp_path / "d" / RUN / ".alerts"
