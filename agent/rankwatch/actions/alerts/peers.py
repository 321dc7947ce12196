"""Cross-agent grouping over the alert board: one message per incident, not one per agent.

Protocol, per group the dispatcher would send (kind + status):

1. When an alert joins a group, its record goes on the board (``post``).
2. When the group's ``group_wait`` is over (``hold``), the agent reads the board for that
   kind. Its ranks a peer already covered are suppressed (``grouped_by_peer``). Of the
   fresh records nobody covered, the lowest rank leads: if that is ours, we send ONE
   message for all of them (the in-agent grouping and suspect logic, fed the peers'
   records) and write a marker naming the records we covered.
3. Otherwise we wait for that marker. A leader that is dead never writes it, so the
   next-lowest rank takes over after ``takeover`` (the one after it after twice that, ...).

The board is an optimisation, never a dependency: when it cannot be written or read
(permissions, ENOSPC, a hung NFS mount), each agent sends its own alerts again, which is
logged once and counted, and the board is left alone for ``RETRY_S`` before the next try.
All waits are on the dispatcher's clock; only ``settle`` (used by ``close``, whose budget
is real seconds) waits in real time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rankwatch.actions.alerts.board import MAX_TEXT, Board, Marker, Record, View, small_evidence, stamp
from rankwatch.actions.alerts.message import AlertMember
from rankwatch.records import Severity

if TYPE_CHECKING:
    from rankwatch.actions.alerts.dispatcher import Key, _Group

log = logging.getLogger("rankwatch.alerts")

IO_TIMEOUT_S = 5.0  # one board operation (real seconds); a hung mount must not hold alerts
RETRY_S = 300.0  # after a failure, the board is not tried again for this long
MAX_POSITION = 8  # takeover waits grow with the rank's position, up to this many steps
POLL_S = 2.0  # a follower re-reads the board at least this often while it waits


class _Host(Protocol):
    """What the coordinator needs from the dispatcher."""

    def _emit(self, g: _Group, now: float, *, saw_all: bool | None = None) -> None: ...
    def _by_peer(self, g: _Group, keys: list[Key], now: float) -> None: ...
    def _saw_all(self, extra: set[int]) -> bool: ...


@dataclasses.dataclass(eq=False)
class _Held:
    group: _Group
    since: float  # dispatcher clock: when the group's own wait was over
    next_check: float


class PeerGroups:
    def __init__(
        self,
        host: _Host,
        board: Board,
        *,
        run: str,
        node: str,
        ranks: set[int],
        clock: Callable[[], float],
        wall: Callable[[], float],
        takeover: float,
        errors: dict[str, int],
    ) -> None:
        self.host = host
        self.board = board
        self.run = run
        self.node = node
        self.ranks = ranks  # the dispatcher's known ranks (shared set): posted as present
        self.clock = clock
        self.wall = wall
        self.takeover = max(0.0, takeover)
        self.errors = errors
        self.stats = {"led": 0, "took_over": 0, "grouped_by_peer": 0, "fallback": 0}
        self._outbox: list[Record] = []
        self._held: list[_Held] = []
        self._present: set[int] = set()
        self._broken_until = -float("inf")
        self._failures = 0
        self._inflight: asyncio.Future[Any] | None = None

    # --- called synchronously by the dispatcher --------------------------------------------
    def usable(self, now: float) -> bool:
        return now >= self._broken_until

    def post(self, key: Key, m: AlertMember, state: str, severity: Severity, when: float) -> None:
        if key[1] is None or not self.usable(self.clock()):
            return
        member = {
            "message": m.message[:MAX_TEXT],
            "step": m.step,
            "evidence": small_evidence(m.evidence),
            "dump_path": m.dump_path,
            "starts_at": m.starts_at,
        }
        rec = Record(self.run, key[2], key[1], state, when, self.node, severity.label, member)
        self._outbox = [r for r in self._outbox if (r.kind, r.rank) != (rec.kind, rec.rank)]
        self._outbox.append(rec)

    def hold(self, g: _Group, now: float) -> bool:
        """Take a group whose wait is over; False: the dispatcher sends it alone, now."""
        if any(k[1] is None for k in g.members):
            return False
        if not self.usable(now):
            self._fallback()
            return False
        self._held.append(_Held(g, now, now))
        return True

    def forget(self, key: Key, status: str) -> None:
        """A member resolved (or fired again) while its group waited on the board."""
        for h in self._held:
            if h.group.status == status:
                h.group.members.pop(key, None)

    @property
    def waiting(self) -> int:
        return len(self._held)

    # --- the dispatcher's timer loop -------------------------------------------------------
    async def step(self, now: float, *, closing: bool = False, poll: bool = False) -> float:
        """Post records, decide held groups that are due (all with ``poll``); returns the next due time."""
        await self._flush()
        due = float("inf")
        for h in list(self._held):
            if closing or poll or now >= h.next_check:
                await self._decide(h, now, closing=closing)
            if h in self._held:
                due = min(due, h.next_check)
        return due

    async def settle(self, budget_s: float) -> None:
        """At close: decide every held group now; followers wait for a marker within the budget."""
        end = time.monotonic() + max(0.0, budget_s)
        while True:
            await self.step(self.clock(), closing=time.monotonic() >= end, poll=True)
            if not self._held or time.monotonic() >= end:
                break
            await asyncio.sleep(min(0.2, max(0.0, end - time.monotonic())))
        if self._held:
            await self.step(self.clock(), closing=True)

    # --- decisions -------------------------------------------------------------------------
    async def _decide(self, h: _Held, now: float, *, closing: bool) -> None:
        g = h.group
        if not g.members:
            self._held.remove(h)
            return
        mine = sorted({k[1] for k in g.members if k[1] is not None})
        view = await self._io(self.board.view, g.kind, self.wall(), mine)
        if view is None:
            self._held.remove(h)
            self._fallback()
            self.host._emit(g, now)
            return
        covered = [k for k in g.members if k in g.times and view.covered(k[1], g.status, stamp(g.times[k]))]
        if covered:
            self.stats["grouped_by_peer"] += len(covered)
            self.host._by_peer(g, covered, now)
            for k in covered:
                g.members.pop(k, None)
        if not g.members:
            self._held.remove(h)
            return
        open_ranks = view.open(g.status)
        mine = sorted({k[1] for k in g.members if k[1] is not None})
        if not set(mine) <= set(open_ranks):  # our record is not there: the board lost it
            self._held.remove(h)
            self._fallback()
            self.host._emit(g, now)
            return
        position = open_ranks.index(mine[0])
        takeover_at = h.since + min(position, MAX_POSITION) * self.takeover
        if position == 0 or closing or now >= takeover_at:
            self._held.remove(h)
            await self._lead(g, view, open_ranks, now, took_over=position > 0)
            return
        h.next_check = min(takeover_at, now + min(POLL_S, max(self.takeover / 4, 0.01)))

    async def _lead(self, g: _Group, view: View, ranks: list[int], now: float, *, took_over: bool) -> None:
        mine = {k[1] for k in g.members}
        theirs = [view.records[r] for r in ranks if r not in mine]
        loaded = (await self._io(self.board.load, theirs) if theirs else None) or {}
        for r, rec in sorted(loaded.items()):
            g.members[(self.run, r, g.kind)] = _member(rec)
            g.severity = max(g.severity, Severity.parse(rec.severity))
        self.stats["took_over" if took_over else "led"] += 1
        if took_over:
            log.warning(
                "alert board: no peer sent %s %s for ranks %s; rank %s sends it",
                g.kind,
                g.status,
                ranks,
                min(mine),
            )
        self.host._emit(g, now, saw_all=self.host._saw_all(view.ranks()))
        covers = {r: view.records[r].us for r in loaded}
        for k, t in g.times.items():
            if k[1] is not None and k in g.members:
                covers[k[1]] = stamp(t)
        marker = Marker(g.status, min(r for r in mine if r is not None), self.wall(), covers)
        await self._io(self.board.mark, g.kind, marker)

    # --- I/O -------------------------------------------------------------------------------
    async def _flush(self) -> None:
        now = self.clock()
        if not self.usable(now):
            self._outbox.clear()
            return
        fresh = sorted(self.ranks - self._present)
        if fresh and await self._io(self.board.present, fresh, self.node, self.wall()) is not None:
            self._present.update(fresh)
        if self._outbox:
            batch, self._outbox = self._outbox, []
            await self._io(self.board.post, batch)

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one board operation in a thread; None (and the board set aside) on any failure."""
        if not self.usable(self.clock()):
            return None
        if self._inflight is not None and not self._inflight.done():
            return self._failed("a previous board operation is still hanging")
        self._inflight = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        try:
            result = await asyncio.wait_for(asyncio.shield(self._inflight), IO_TIMEOUT_S)
        except asyncio.TimeoutError:
            return self._failed(f"no answer in {IO_TIMEOUT_S:.0f}s")
        except Exception as e:  # OSError mostly; whatever it is, alerts must still go out
            return self._failed(f"{type(e).__name__}: {e}")
        return True if result is None else result

    def _failed(self, why: str) -> None:
        self._failures += 1
        self._broken_until = self.clock() + RETRY_S
        self.errors["alerts"] = self.errors.get("alerts", 0) + 1
        if self._failures == 1:
            log.error(
                "alert board %s unusable (%s); each agent sends its own alerts (further failures counted)",
                self.board.path,
                why,
            )
        return None

    def _fallback(self) -> None:
        """Counted per group that goes out alone although the board should have grouped it."""
        self.stats["fallback"] += 1


def _member(rec: Record) -> AlertMember:
    m = rec.member
    step = m.get("step")
    return AlertMember(
        rec.rank,
        str(m.get("message", ""))[:MAX_TEXT],
        step if isinstance(step, int) else None,
        dict(m.get("evidence") or {}),
        str(m["dump_path"]) if m.get("dump_path") else None,
        float(m.get("starts_at") or rec.time),
        node=rec.node or None,
    )
