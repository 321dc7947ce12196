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

import conftest
from rankwatch.actions.alerts import AlertDispatcher
from rankwatch.actions.alerts.board import Board, Record, board_path
from rankwatch.actions.alerts.message import AlertMessage
from rankwatch.config.schema import AlertsConfig
from rankwatch.identity import Identity
from rankwatch.records import Finding, Severity

pytestmark = pytest.mark.unit

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
    await conftest.until(cond, timeout)


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
    """Advance the shared clock and wait until every dispatcher (its timer loop, board I/O,
    state file and sinks) has acted on it and waits for a later time."""
    clock.advance(dt)
    for d in ds:
        d.wake()
    await until(lambda: all(d.settled() for d in ds))


def state(board: Path, rank: int, kind: str = "stall") -> str | None:
    """The rank's record on the board, as its file name says (r<rank>-<state>-<us>.json)."""
    path = board_path(str(board), None, RUN)
    assert path is not None
    names = sorted(p.name for p in (path / kind).glob(f"r{rank}-*.json"))
    return names[-1].split("-")[1] if names else None


def sent(sinks: list[RecordingSink]) -> list[Any]:
    return [a for s in sinks for a in s.alerts]


async def all_stalled(ds: list[AlertDispatcher], ranks: range, board: Path, clock: FakeClock) -> None:
    """Each agent reports its rank's stall, all of them are on the board, group_wait passes."""
    for d, r in zip(ds, ranks, strict=True):
        d.send(stall(r))
    await until(lambda: all(state(board, r) == "firing" for r in ranks))
    await tick(ds, clock, 5.1)


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


def test_agents_closing_together_still_send_one_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crashed job: every agent exits within its group wait; close() settles on the board."""
    from rankwatch.actions.alerts import peers as P

    monkeypatch.setattr(P, "SETTLE_POLL_S", 0.02)  # the follower's re-reads, in real time

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


# --- regressions: an alert must never be lost to the board ---------------------------------


def peer_record(path: Path, rank: int, clock: FakeClock, severity: str = "critical", **member: Any) -> None:
    """A record of a peer agent that is not running in this test (dead, or just slow)."""
    m: dict[str, Any] = {
        "message": f"no progress on rank {rank}",
        "step": 1,
        "evidence": {},
        "starts_at": clock(),
    }
    m.update(member)
    Board(path, RUN, 600).post([Record(RUN, "stall", rank, "firing", clock(), f"node-{rank}", severity, m)])


@pytest.mark.parametrize(
    "bad",
    [
        {"starts_at": "2024-01-01T00:00:00Z"},
        {"severity": "fatal"},
        {"evidence": ["a"]},
        {"step": "12"},
        {"message": {"nested": 1}},
    ],
)
def test_a_malformed_peer_record_never_stops_alerting(tmp_path: Path, bad: dict[str, Any]) -> None:
    """A peer record that parses but holds odd values (another version, corruption) used to
    raise out of the leader and end the dispatcher's run() task: no alert was ever sent again."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        path = board_path(str(board), None, RUN)
        assert path is not None
        peer_record(path, 1, clock, **bad)
        d, sink = agent(tmp_path, 0, 2, clock, board)
        task = asyncio.create_task(d.run())
        try:
            d.send(stall(0))
            await until(lambda: state(board, 0) == "firing")
            await tick([d], clock, 5.1)
            await until(lambda: len(sink.alerts) == 1)
            assert not task.done()
            assert 0 in sink.alerts[0].ranks
            if "severity" in bad:  # unusable: left out, so its own agent sends it
                assert sink.alerts[0].ranks == [0]
            else:  # the odd field is dropped, the rank is grouped
                assert sink.alerts[0].ranks == [0, 1]
            d.send(Finding("crash", Severity.CRITICAL, 0, "rank 0 crashed", 1))
            await tick([d], clock, 5.1)
            await until(lambda: len(sink.alerts) == 2)
            assert not task.done()
        finally:
            await d.close(1.0)
            await asyncio.wait_for(task, 5.0)

    asyncio.run(go())


def test_board_load_skips_bad_records_and_never_raises(tmp_path: Path) -> None:
    from rankwatch.actions.alerts.board import Entry

    path = tmp_path / "b"
    folder = path / "stall"
    folder.mkdir(parents=True)
    good = {
        "run": RUN,
        "kind": "stall",
        "rank": 0,
        "state": "firing",
        "time": 1.7e9,
        "node": "n",
        "severity": "critical",
    }
    docs: list[Any] = [
        {**good, "member": {"evidence": {"k": [1, 2], 3: "x", "f": float("inf")}, "starts_at": -1}},
        {**good, "rank": 1, "severity": "fatal"},
        {**good, "rank": 2, "time": "yesterday"},
        {**good, "rank": 3, "run": "other"},
        {**good, "rank": 4, "state": "exploded"},
        {**good, "rank": 5, "member": "not a dict"},
        ["not", "a", "dict"],
        {**good, "rank": True},
    ]
    entries = []
    for i, doc in enumerate(docs):
        p = folder / f"r{i}-firing-1.json"
        p.write_text(json.dumps(doc).replace("Infinity", "1e999"))
        entries.append(Entry(i, "firing", 1, p))
    deep = folder / "r8-firing-1.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    entries.append(Entry(8, "firing", 1, deep))
    entries.append(Entry(9, "firing", 1, folder / "r9-firing-1.json"))  # gone meanwhile
    out = Board(path, RUN, 600).load(entries)
    assert {r for r, rec in out.items() if rec is not None} == {0, 5}
    assert (
        out[0] is not None and out[0].member["evidence"] == {"3": "x"} and out[0].member["starts_at"] == 1.7e9
    )
    assert out[5] is not None and out[5].member["message"] == ""


@pytest.mark.parametrize("where", ["post", "hold", "_flush", "_decide", "_lead"])
def test_any_board_error_sends_alone_and_alerting_goes_on(
    tmp_path: Path, caplog: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Whatever goes wrong inside the board's coordination, the alert goes out alone."""
    from rankwatch.actions.alerts import peers as P

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError(f"boom in {where}")

    async def aboom(*a: Any, **k: Any) -> Any:
        boom()

    monkeypatch.setattr(P.PeerGroups, where, aboom if where.startswith("_") else boom)

    async def go() -> None:
        clock = FakeClock()
        d, sink = agent(tmp_path, 0, 2, clock, tmp_path / "board")
        task = asyncio.create_task(d.run())
        try:
            d.send(stall(0))
            await tick([d], clock, 5.1)
            await until(lambda: len(sink.alerts) == 1)
            assert sink.alerts[0].ranks == [0] and not task.done()
            d.send(Finding("crash", Severity.CRITICAL, 0, "rank 0 crashed", 1))
            await tick([d], clock, 5.1)
            await until(lambda: len(sink.alerts) == 2)
            await tick([d], clock, P.RETRY_S)  # the board is tried again, and fails again
            d.send(Finding("nan_loss", Severity.CRITICAL, 0, "rank 0 loss is nan", 1))
            await tick([d], clock, 5.1)
            await until(lambda: len(sink.alerts) == 3)
            assert not task.done()
            assert d.peer_stats["fallback"] >= 2 and d.errors["alerts"] >= 2
        finally:
            await d.close(1.0)
            await asyncio.wait_for(task, 5.0)
        assert [a.kind for a in sink.alerts] == ["stall", "crash", "nan_loss"]

    with caplog.at_level(logging.ERROR, logger="rankwatch.alerts"):
        asyncio.run(go())
    assert sum("coordination failed" in r.getMessage() for r in caplog.records) == 1


def test_resolve_is_sent_when_a_peer_announced_the_firing_we_had_not_heard_of(tmp_path: Path) -> None:
    """Rank 0 sends the grouped firing for ranks 0-1; rank 1 recovers before its next board
    poll. It used to post 'cleared' (never announced, it thought) and its resolve was lost."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 2, clock, board) for r in range(2)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        async with all_running(ds):
            await all_stalled(ds, range(2), board, clock)
            await until(lambda: len(sent(sinks)) == 1)
            assert sent(sinks)[0].ranks == [0, 1] and ds[1].peers is not None and ds[1].peers.waiting
            clock.advance(1.0)
            for r in range(2):
                ds[r].send(stall(r, resolved=True))
            for _ in range(10):
                await tick(ds, clock, 2.0)
            await until(lambda: state(board, 1) == "resolved")
            for _ in range(5):
                await tick(ds, clock, 2.0)
        resolves = [a for a in sent(sinks) if a.status == "resolved"]
        assert sorted(r for a in resolves for r in a.ranks) == [0, 1]

    asyncio.run(go())


def test_refire_after_a_peer_sent_the_resolve_is_sent(tmp_path: Path) -> None:
    """Rank 0 sends the grouped resolve for ranks 0-1; rank 1 stalls again 1 s later, before
    its next poll. It used to take that for a flap and stay silent until repeat_interval."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 2, clock, board, repeat_interval=4 * 3600.0) for r in range(2)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        async with all_running(ds):
            await all_stalled(ds, range(2), board, clock)
            await tick(ds, clock, 2.1)
            await until(lambda: len(sent(sinks)) == 1)
            for r in range(2):
                ds[r].send(stall(r, resolved=True))
            await until(lambda: all(state(board, r) == "resolved" for r in range(2)))
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) == 2)
            assert sent(sinks)[1].title == "resolved: stall on 2 of 2 ranks"
            clock.advance(1.0)
            ds[1].send(stall(1))
            for _ in range(12):
                await tick(ds, clock, 2.0)
            await until(lambda: len(sent(sinks)) == 3)
            for _ in range(5):
                await tick(ds, clock, 2.0)
        assert [(a.status, a.ranks) for a in sent(sinks)][2:] == [("firing", [1])]

    asyncio.run(go())


def test_a_flap_seen_by_no_peer_stays_silent_with_a_board(tmp_path: Path) -> None:
    """The watch for a peer's send must not turn a plain flap into messages."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        d, sink = agent(tmp_path, 1, 2, clock, board)
        async with running(d):
            d.send(stall(1))
            await until(lambda: state(board, 1) == "firing")
            d.send(stall(1, resolved=True))  # within group_wait: cleared, never sent
            await until(lambda: state(board, 1) == "cleared")
            for _ in range(8):
                await tick([d], clock, 10.0)
            assert sink.alerts == []
            d.send(stall(1))
            await tick([d], clock, 5.1)
            await until(lambda: len(sink.alerts) == 1)
            d.send(stall(1, resolved=True))
            await until(lambda: state(board, 1) == "resolved")
            d.send(stall(1))  # a flap before its resolve left: silent
            for _ in range(8):
                await tick([d], clock, 10.0)
        assert [a.status for a in sink.alerts] == ["firing"]

    asyncio.run(go())


def test_live_ranks_behind_dead_ones_take_over_one_at_a_time(tmp_path: Path) -> None:
    """Ranks 0-7 posted records and died (one node); ranks 8-15 are alive. Every rank at
    position >= MAX_POSITION used to get the same takeover time: all eight sent at once."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        path = board_path(str(board), None, RUN)
        assert path is not None
        for r in range(8):
            peer_record(path, r, clock)
        pairs = [agent(tmp_path, r, 16, clock, board) for r in range(8, 16)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        async with all_running(ds):
            await all_stalled(ds, range(8, 16), board, clock)
            for _ in range(8 * 4 + 8):
                await tick(ds, clock, TAKEOVER / 4)
            await until(lambda: len(sent(sinks)) >= 1)
        assert [a.ranks for a in sent(sinks)] == [list(range(16))]
        assert sum(d.peer_stats["took_over"] for d in ds) == 1

    asyncio.run(go())


def test_takeover_delays_are_spread_past_max_position() -> None:
    import itertools
    import random

    from rankwatch.actions.alerts.peers import MAX_POSITION, SPREAD, _gap, max_takeover_delay, takeover_delay

    t = 30.0
    assert [takeover_delay(p, t) for p in range(MAX_POSITION + 1)] == [p * t for p in range(MAX_POSITION + 1)]
    rng = random.Random(1)
    delays = [takeover_delay(p, t, rng.random()) for p in range(1024)]
    distinct = delays[: MAX_POSITION + SPREAD + 1]
    assert all(b - a >= _gap(t) / 2 for a, b in itertools.pairwise(distinct))
    rest = delays[MAX_POSITION + SPREAD + 1 :]
    assert min(rest) > distinct[-1] and max(delays) <= max_takeover_delay(t)
    assert len({round(x, 3) for x in rest}) > len(rest) * 0.9  # jittered: not one instant


def test_slow_peer_reads_still_send_one_grouped_alert_and_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's read of its peers' records hangs after the first one (a slow metadata
    server). It used to set the board aside, write no marker, and every rank sent alone."""
    import threading

    from rankwatch.actions.alerts import board as B
    from rankwatch.actions.alerts import peers as P

    release = threading.Event()
    orig = B.Board.load

    def slow(self: Board, entries: Any, out: Any = None, stop: Any = None) -> Any:
        entries = list(entries)
        out = orig(self, entries[:1], out)
        release.wait(8.0)
        return orig(self, entries[1:], out, stop)

    monkeypatch.setattr(B.Board, "load", slow)
    monkeypatch.setattr(P, "LOAD_MAX_S", 0.1)  # waited out for real: long enough to read one record

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 4, clock, board) for r in range(4)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        async with all_running(ds):
            await all_stalled(ds, range(4), board, clock)
            await until(lambda: len(sent(sinks)) == 1, timeout=10)
            for _ in range(4 * 4 + 4):
                await tick(ds, clock, TAKEOVER / 4)
            await until(lambda: sum(d.peer_stats["grouped_by_peer"] for d in ds) == 3)
        release.set()
        [a] = sent(sinks)
        assert a.ranks == [0, 1, 2, 3] and a.title == "stall on 4 of 4 ranks"
        assert a.members[1].message == "no progress for 12m on rank 1"  # read in time
        assert "details not read" in a.members[2].message and a.members[2].node is None
        assert ds[0].peer_stats["led"] == 1 and ds[0].peer_stats["fallback"] == 0

    try:
        asyncio.run(go())
    finally:
        release.set()


@pytest.mark.timeout(30)
def test_a_hung_board_does_not_keep_the_agent_from_exiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A board call stuck on a dead NFS mount: the alert goes out alone after the I/O timeout,
    and asyncio.run (how the agent runs) returns. Board I/O on the default executor made it
    wait for the stuck thread at exit."""
    import threading

    from rankwatch.actions.alerts import board as B
    from rankwatch.actions.alerts import peers as P

    hang = threading.Event()
    orig = B.Board.view

    def stuck(self: Board, *a: Any, **k: Any) -> Any:
        hang.wait(10.0)
        return orig(self, *a, **k)

    monkeypatch.setattr(B.Board, "view", stuck)
    monkeypatch.setattr(P, "IO_TIMEOUT_S", 0.1)  # waited out for real; the other board calls fit in it

    async def go() -> list[AlertMessage]:
        clock = FakeClock()
        board = tmp_path / "board"
        d, sink = agent(tmp_path, 0, 2, clock, board)
        async with running(d):
            d.send(stall(0))
            await until(lambda: state(board, 0) == "firing")
            await tick([d], clock, 5.1)
            await until(lambda: len(sink.alerts) == 1)
        return sink.alerts

    try:
        alerts = asyncio.run(go())  # a hung board call that kept it from returning fails by timeout
    finally:
        hang.set()
    assert [a.ranks for a in alerts] == [[0]]


def test_board_cleans_old_temp_files_and_keeps_markers_longer_than_records(tmp_path: Path) -> None:
    import os

    from rankwatch.actions.alerts.board import Marker

    stale = 600.0
    now = time.time()
    b = Board(tmp_path / "b", RUN, stale)
    b.post([Record(RUN, "stall", 3, "firing", now - 1.5 * stale, "n", "critical", {})])
    b.mark("stall", Marker("firing", 3, now - 1.5 * stale, {3: 1}))
    b.mark("stall", Marker("firing", 4, now - 5 * stale, {4: 1}))
    folder = tmp_path / "b" / "stall"
    old_tmp, new_tmp = folder / ".r1-firing-1.json.1.ab.tmp", folder / ".r2-firing-1.json.1.cd.tmp"
    for p in (old_tmp, new_tmp):
        p.write_text("{")
    os.utime(old_tmp, (now - 2 * stale, now - 2 * stale))
    v = b.view("stall", now)
    assert not old_tmp.exists() and new_tmp.exists()  # a writer mid-write keeps its temp file
    assert v.records == {}  # the record is stale (kept on disk: not ours, not dead)
    assert [m.by for m in v.markers] == [3]  # the marker is still read; the dead one is gone
    assert len(list(folder.glob("sent-*"))) == 1


# --- alerts about a subject within a rank (a GPU's UUID, a folder) ---------------------------
# The board's unit is a member, (rank, subject): one hot GPU on each of a node's ranks is one
# message, and one rank's two hot GPUs stay two alerts, each resolved by itself.


def hot(rank: int, uuid: str, *, resolved: bool = False) -> Finding:
    msg = f"GPU {uuid} back to 70 C" if resolved else f"GPU {uuid} at 95 C"
    return Finding("gpu_overheat", Severity.CRITICAL, rank, msg, 10, resolved=resolved, subject=uuid)


def subject_state(board: Path, rank: int, subject: str, kind: str = "gpu_overheat") -> str | None:
    """The member's record on the board, as its file name says (r<rank>.<tag>-<state>-<us>.json)."""
    from rankwatch.actions.alerts.board import subject_tag

    path = board_path(str(board), None, RUN)
    assert path is not None
    names = sorted(p.name for p in (path / kind).glob(f"r{rank}.{subject_tag(subject)}-*.json"))
    return names[-1].split("-")[1] if names else None


def who(alerts: list[AlertMessage]) -> list[tuple[str, list[tuple[int | None, str | None]]]]:
    return [(a.status, [(m.rank, m.subject) for m in a.members]) for a in alerts]


def test_one_hot_gpu_on_each_rank_of_a_node_is_one_message(tmp_path: Path) -> None:
    """A node's cooling fails: every rank's agent sees its own GPU overheat. The alert is about
    a subject (the GPU's UUID), and such alerts used to bypass the board: four messages."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 4, clock, board) for r in range(4)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        async with all_running(ds):
            for r in (2, 0, 3, 1):
                ds[r].send(hot(r, f"GPU-{r}"))
            await until(lambda: all(subject_state(board, r, f"GPU-{r}") == "firing" for r in range(4)))
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) >= 1)
            await tick(ds, clock, 2.1)  # followers find the marker
            await until(lambda: sum(d.peer_stats["grouped_by_peer"] for d in ds) == 3)
            for r in range(4):
                ds[r].send(hot(r, f"GPU-{r}", resolved=True))
            await until(lambda: all(subject_state(board, r, f"GPU-{r}") == "resolved" for r in range(4)))
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) >= 2)
            await tick(ds, clock, 2.1)
            await tick(ds, clock, 60)
        everyone = [(r, f"GPU-{r}") for r in range(4)]
        assert who(sent(sinks)) == [("firing", everyone), ("resolved", everyone)]
        assert sent(sinks) == sinks[0].alerts
        assert [a.title for a in sent(sinks)] == [
            "gpu_overheat on 4 of 4 ranks",
            "resolved: gpu_overheat on 4 of 4 ranks",
        ]

    asyncio.run(go())


def test_first_gpu_to_cool_resolves_only_itself_when_grouped_with_peers(tmp_path: Path) -> None:
    """Rank 0 has two hot GPUs, rank 1 one: one message for the three. GPU-aaa cools first:
    the resolve names it alone, the other two are still firing (and resolve together later)."""
    from rankwatch.actions.alerts._alertmanager import payload as am_payload
    from rankwatch.actions.alerts._slack import build_blocks, fallback_text

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 2, clock, board) for r in range(2)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        async with all_running(ds):
            ds[0].send(hot(0, "GPU-bbb"))
            ds[1].send(hot(1, "GPU-ccc"))
            ds[0].send(hot(0, "GPU-aaa"))
            gpus = ((0, "GPU-aaa"), (0, "GPU-bbb"), (1, "GPU-ccc"))
            await until(lambda: all(subject_state(board, r, u) == "firing" for r, u in gpus))
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) >= 1)
            await tick(ds, clock, 2.1)
            ds[0].send(hot(0, "GPU-aaa", resolved=True))
            await until(lambda: subject_state(board, 0, "GPU-aaa") == "resolved")
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) >= 2)
            await tick(ds, clock, 2.1)
            await tick(ds, clock, 60)
            assert len(sent(sinks)) == 2  # GPU-bbb and GPU-ccc are still hot: nothing for them
            still = [m for d in ds for m in d.policy.active_messages()]
            assert sorted((m.rank, m.subject) for a in still for m in a.members) == [
                (0, "GPU-bbb"),
                (1, "GPU-ccc"),
            ]
            ds[0].send(hot(0, "GPU-bbb", resolved=True))
            ds[1].send(hot(1, "GPU-ccc", resolved=True))
            await until(lambda: subject_state(board, 1, "GPU-ccc") == "resolved")
            await until(lambda: subject_state(board, 0, "GPU-bbb") == "resolved")
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) >= 3)
            await tick(ds, clock, 2.1)
            await tick(ds, clock, 60)
        assert who(sent(sinks)) == [
            ("firing", [(0, "GPU-aaa"), (0, "GPU-bbb"), (1, "GPU-ccc")]),
            ("resolved", [(0, "GPU-aaa")]),
            ("resolved", [(0, "GPU-bbb"), (1, "GPU-ccc")]),
        ]
        firing, cooled, _ = sent(sinks)
        assert firing.title == "gpu_overheat on 2 of 2 ranks"  # ranks, not GPUs
        assert cooled.title == "resolved: gpu_overheat on rank 0"
        labels = [
            (doc["labels"]["rank"], doc["labels"]["subject"]) for doc in am_payload(firing, now=clock())
        ]
        assert labels == [("0", "GPU-aaa"), ("0", "GPU-bbb"), ("1", "GPU-ccc")]
        assert [doc["labels"]["subject"] for doc in am_payload(cooled, now=clock())] == ["GPU-aaa"]
        assert firing.members[2].node == "node-0" and "GPU-ccc at 95 C" in firing.members[2].message
        assert "GPU-aaa back to 70 C" in fallback_text(cooled) and "GPU-bbb" not in fallback_text(cooled)
        fields = [f["text"] for f in build_blocks(firing)[1]["fields"]]
        assert "*Ranks*\n0-1" in fields  # a rank with two GPUs is listed once, not as an unknown "?"

    asyncio.run(go())


def test_a_killed_leader_of_subject_alerts_is_taken_over_with_one_message(tmp_path: Path) -> None:
    """Rank 0's agent posts its GPU's record and is killed before its group wait ends: rank 1
    takes over after the timeout and sends one message for the three GPUs; rank 2 stays quiet."""
    from rankwatch.actions.alerts.board import subject_tag
    from rankwatch.actions.alerts.delivery import _cancel

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        path = board_path(str(board), None, RUN)
        assert path is not None
        pairs = [agent(tmp_path, r, 3, clock, board) for r in range(3)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        dead = asyncio.create_task(ds[0].run())
        async with all_running(ds[1:]):
            for r in range(3):
                ds[r].send(hot(r, f"GPU-{r}"))
            await until(lambda: all(subject_state(board, r, f"GPU-{r}") == "firing" for r in range(3)))
            # As SIGKILL would: no close, nothing flushed.
            await _cancel([dead, *(w.task for w in ds[0].delivery.workers.values() if w.task)])
            live = ds[1:]
            await tick(live, clock, 5.1)
            await tick(live, clock, TAKEOVER - 1)
            assert sent(sinks) == []  # still waiting for rank 0
            await tick(live, clock, 1.1)
            await until(lambda: len(sent(sinks)) >= 1)
            await tick(live, clock, 2.1)
            await until(lambda: ds[2].peer_stats["grouped_by_peer"] == 1)
            await tick(live, clock, 60)
        assert who(sent(sinks)) == [("firing", [(r, f"GPU-{r}") for r in range(3)])]
        assert sent(sinks) == sinks[1].alerts and ds[1].peer_stats["took_over"] == 1
        assert sent(sinks)[0].members[0].message == "GPU GPU-0 at 95 C"  # read from its record
        markers = [json.loads(p.read_text()) for p in (path / "gpu_overheat").glob("sent-firing-*.json")]
        assert len(markers) == 1 and markers[0]["covers"] == {}
        assert markers[0]["subjects"].keys() == {f"{r}.{subject_tag(f'GPU-{r}')}" for r in range(3)}

    asyncio.run(go())


def test_board_names_of_subject_records_are_bounded_and_plain_records_unchanged(tmp_path: Path) -> None:
    """A subject goes into file names as a 16-hex tag (any subject: a folder with slashes, a
    name of any length); a record without one is byte for byte what the previous version wrote
    and read, so agents of both versions share a board for subject-less alerts."""
    from rankwatch.actions.alerts.board import Marker, subject_tag

    now = time.time()
    b = Board(tmp_path / "b", RUN, 600)
    member = {"message": "m", "step": 1, "evidence": {}, "dump_path": None, "starts_at": now}
    plain = Record(RUN, "disk_low", 3, "firing", now, "n", "warning", member)
    odd = "/scratch/ckpt/../" + "x" * 500 + "/\n*"
    folder_rec = Record(RUN, "disk_low", 3, "firing", now, "n", "warning", member, odd)
    b.post([plain, folder_rec])
    folder = tmp_path / "b" / "disk_low"
    us = round(now * 1e6)
    tag = subject_tag(odd)
    assert sorted(p.name for p in folder.iterdir()) == [f"r3-firing-{us}.json", f"r3.{tag}-firing-{us}.json"]
    old_format = {"v": 1, "run": RUN, "kind": "disk_low", "rank": 3, "state": "firing", "time": now}
    old_format.update({"node": "n", "severity": "warning", "member": member})
    assert (folder / f"r3-firing-{us}.json").read_bytes() == json.dumps(
        old_format, separators=(",", ":")
    ).encode()
    assert json.loads((folder / f"r3.{tag}-firing-{us}.json").read_text())["subject"] == odd
    (folder / f"r4.GPU-aaa-firing-{us}.json").write_text("{}")  # not a tag: ignored
    (folder / f"r4.{tag}x-firing-{us}.json").write_text("{}")
    v = b.view("disk_low", now)
    assert set(v.records) == {3, (3, tag)} and v.open("firing") == [3, (3, tag)]
    loaded = b.load(v.records.values())
    about, itself = loaded[(3, tag)], loaded[3]
    assert about is not None and about.subject == odd and itself is not None and itself.subject is None
    assert b.claim("disk_low", "firing", {3: us, (3, tag): us}) == {3, (3, tag)}
    assert b.claim("disk_low", "firing", {3: us, (3, tag): us}) == set()  # taken
    b.mark("disk_low", Marker("resolved", 3, now, {3: us, (3, tag): us}))
    v = b.view("disk_low", now)
    assert v.covered(3, "resolved", us) and v.covered((3, tag), "resolved", us)
    assert not v.covered((3, "0" * 16), "resolved", us)
    marker = json.loads(next(folder.glob("sent-resolved-*.json")).read_text())
    assert marker["covers"] == {"3": us}  # what an agent of the previous version reads


def test_one_failure_seen_by_four_agents_is_one_message(tmp_path: Path) -> None:
    """Rank 1 runs out of memory; the agents of ranks 0, 2 and 3 each report their rank's crash
    as its consequence (gloo lost rank 1), naming rank 1 as the first failure: one problem, so
    one message between the four agents, the first failure's, suspect rank 1."""
    from rankwatch.records import FirstFailure

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 4, clock, board) for r in range(4)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        first = FirstFailure(1, "oom", clock.t, "CUDA out of memory")
        async with all_running(ds):
            oom = Finding("oom", Severity.CRITICAL, 1, "CUDA out of memory", 8, time=clock.t)
            oom.diagnosed(suspects=(1,), first_failure=first)
            ds[1].send(oom)
            for r in (0, 2, 3):
                crash = Finding("crash", Severity.CRITICAL, r, "rank 1 failed first", 7, time=clock.t + 1)
                crash.diagnosed(suspects=(1,), first_failure=first)
                ds[r].send(crash)
            await until(lambda: all(state(board, r, "crash") == "firing" for r in (0, 2, 3)))
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) >= 1)
            for _ in range(3):
                await tick(ds, clock, 5.1)
        titles = [a.title for a in sent(sinks)]
        assert titles == ["oom on rank 1, suspect rank 1"], titles

    asyncio.run(go())


def test_a_crash_after_the_suspects_warning_pages_across_agents(tmp_path: Path) -> None:
    """Rank 1's own NCCL timeout is a warning; rank 0's crash that follows it (critical, naming
    rank 1) is the job's death. Between the two agents it is not folded into the warning: the
    crash goes out critical, still naming rank 1, so routing on ``min_severity: critical``
    pages."""
    from rankwatch.records import FirstFailure

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 2, clock, board) for r in range(2)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        first = FirstFailure(1, "nccl_timeout", clock.t, "watchdog timeout")
        async with all_running(ds):
            nccl = Finding("nccl_timeout", Severity.WARNING, 1, "watchdog timeout", 8, time=clock.t)
            nccl.diagnosed(suspects=(1,), first_failure=first)
            ds[1].send(nccl)
            crash = Finding("crash", Severity.CRITICAL, 0, "rank 1 failed first", 7, time=clock.t + 1)
            crash.diagnosed(first_failure=first)
            ds[0].send(crash)
            await until(
                lambda: state(board, 0, "crash") == "firing" and state(board, 1, "nccl_timeout") == "firing"
            )
            for _ in range(4):
                await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) >= 2)
        got = sorted((a.title, a.severity.label) for a in sent(sinks))
        assert got == [
            ("crash on rank 0, suspect rank 1", "critical"),
            ("nccl_timeout on rank 1, suspect rank 1", "warning"),
        ], got

    asyncio.run(go())


def test_a_consequence_after_the_first_failures_alert_of_its_kind_is_part_of_it(tmp_path: Path) -> None:
    """One agent per rank (srun): rank 1 raises and its crash alert goes out; rank 0's gloo
    crash after it, naming rank 1, comes to its agent only later. It is part of rank 1's alert
    already sent (its kind is the same, so no other kind's record takes it in), not a second
    "crash on rank 0, suspect rank 1" (black-box batch s38, g47)."""
    from rankwatch.records import FirstFailure

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 2, clock, board) for r in range(2)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        first = FirstFailure(1, "crash", clock.t, "RuntimeError: bad batch")
        async with all_running(ds):
            own = Finding("crash", Severity.CRITICAL, 1, "RuntimeError: bad batch", 8, time=clock.t)
            own.diagnosed(suspects=(1,), first_failure=first)
            ds[1].send(own)
            await until(lambda: state(board, 1, "crash") == "firing")
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) >= 1)
            crash = Finding("crash", Severity.CRITICAL, 0, "rank 1 failed first", 7, time=clock.t)
            crash.diagnosed(suspects=(1,), first_failure=first)
            ds[0].send(crash)
            await until(lambda: state(board, 0, "crash") == "firing")
            for _ in range(3):
                await tick(ds, clock, 5.1)
            await until(lambda: ds[0].peer_stats["grouped_by_peer"] == 1)
        assert [a.title for a in sent(sinks)] == ["crash on rank 1, suspect rank 1"]

    asyncio.run(go())


def _board_agents(tmp: Path, clock: FakeClock, world: int) -> tuple[list[Any], list[Any]]:
    """One agent per rank of ``world``, on one board (``tmp/board``): the dispatchers, their sinks."""
    pairs = [agent(tmp, r, world, clock, tmp / "board") for r in range(world)]
    return [d for d, _ in pairs], [s for _, s in pairs]


async def _rank_0s_consequence_of_rank_1(board: Path, ds: list[Any], clock: FakeClock) -> Any:
    """Every agent on the board, then rank 0's crash naming rank 1 as its first failure, posted
    and past the group wait; returns that first failure (rank 1's own crash may follow)."""
    from rankwatch.records import FirstFailure

    path = board_path(str(board), None, RUN)
    assert path is not None
    await until(lambda: all((path / "present" / f"r{r}.json").exists() for r in range(len(ds))))
    first = FirstFailure(1, "crash", clock.t, "RuntimeError: bad batch")
    crash = Finding("crash", Severity.CRITICAL, 0, "rank 1 failed first", 7, time=clock.t)
    crash.diagnosed(suspects=(1,), first_failure=first)
    ds[0].send(crash)
    await until(lambda: state(board, 0, "crash") == "firing")
    await tick(ds, clock, 5.1)
    return first


def test_a_consequence_waits_for_its_first_failures_record(tmp_path: Path) -> None:
    """Rank 0's crash, naming rank 1 as the first failure, is judged before rank 1's agent
    posts rank 1's own: rank 1's agent is on the board, so rank 0's waits for that record
    rather than go out first as an alert of its own, and the job gets one message naming rank 1."""

    async def go() -> None:
        clock = FakeClock()
        ds, sinks = _board_agents(tmp_path, clock, 3)
        async with all_running(ds):
            first = await _rank_0s_consequence_of_rank_1(tmp_path / "board", ds, clock)
            await tick(ds, clock, 2.1)
            assert sent(sinks) == []  # waiting for rank 1's record
            own = Finding("crash", Severity.CRITICAL, 1, "RuntimeError: bad batch", 8, time=clock.t)
            own.diagnosed(suspects=(1,), first_failure=first)
            ds[1].send(own)
            await until(lambda: state(tmp_path / "board", 1, "crash") == "firing")
            for _ in range(4):
                await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) >= 1)
            for _ in range(3):
                await tick(ds, clock, 5.1)
        [alert] = sent(sinks)
        assert alert.suspect == 1 and {m.rank for m in alert.members} <= {0, 1}, alert.title

    asyncio.run(go())


def test_a_consequence_waits_no_longer_than_the_takeover_for_its_first_failure(tmp_path: Path) -> None:
    """Rank 0's crash names rank 1 as the first failure, and rank 1's agent is on the board but
    never posts a failure (it died with its rank): rank 0's crash goes out after
    ``alerts.board_takeover``, still naming rank 1, not never."""

    async def go() -> None:
        clock = FakeClock()
        ds, sinks = _board_agents(tmp_path, clock, 2)
        async with all_running(ds):
            await _rank_0s_consequence_of_rank_1(tmp_path / "board", ds, clock)
            await tick(ds, clock, TAKEOVER - 2)
            assert sent(sinks) == []
            await tick(ds, clock, 2.1)
            await until(lambda: len(sent(sinks)) >= 1)
        assert [(a.title, a.suspect) for a in sent(sinks)] == [("crash on rank 0, suspect rank 1", 1)]

    asyncio.run(go())


def test_a_throughput_drop_after_its_stragglers_alert_is_part_of_it(tmp_path: Path) -> None:
    """One agent per rank: rank 1's straggler alert goes out; rank 0's throughput drop that the
    straggler verdict explains (its diagnosis names rank 1) comes later from its own agent and is
    part of that alert, not a second "throughput_drop on rank 0" (black-box batch s38, g13)."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 2, clock, board) for r in range(2)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        async with all_running(ds):
            slow = Finding("straggler", Severity.WARNING, 1, "rank 1 is 3x slower", 40, time=clock.t)
            slow.diagnosed(suspects=(1,))
            ds[1].send(slow)
            await until(lambda: state(board, 1, "straggler") == "firing")
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) >= 1)
            drop = Finding("throughput_drop", Severity.WARNING, 0, "steps/s down 60%", 45, time=clock.t)
            drop.diagnosed(suspects=(1,))
            ds[0].send(drop)
            await until(lambda: state(board, 0, "throughput_drop") == "firing")
            for _ in range(3):
                await tick(ds, clock, 5.1)
            await until(lambda: ds[0].peer_stats["grouped_by_peer"] == 1)
        assert [a.kind for a in sent(sinks)] == ["straggler"]

    asyncio.run(go())


def test_a_peers_member_keeps_its_user(tmp_path: Path) -> None:
    """s38 g15: one sidecar per rank, each rank's finding carries its process's user; the one
    grouped message names that user for the peer's member too (the webhook's ``user`` is the
    suspect's member's, often a peer's)."""

    async def go() -> None:
        clock = FakeClock()
        board = tmp_path / "board"
        pairs = [agent(tmp_path, r, 2, clock, board) for r in range(2)]
        ds, sinks = [d for d, _ in pairs], [s for _, s in pairs]
        async with all_running(ds):
            for r in range(2):
                f = stall(r)
                f.user = "alice"
                ds[r].send(f)
            await until(lambda: all(state(board, r) == "firing" for r in range(2)))
            await tick(ds, clock, 5.1)
            await until(lambda: len(sent(sinks)) == 1)
            await tick(ds, clock, 2.1)
        [a] = sent(sinks)
        assert [(m.rank, m.user) for m in a.members] == [(0, "alice"), (1, "alice")]

    asyncio.run(go())
