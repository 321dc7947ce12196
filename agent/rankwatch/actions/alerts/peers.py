"""Cross-agent grouping over the alert board: one message per incident, not one per agent.

Protocol, per group the dispatcher would send (kind + status). Its unit is a member
(``board.Member``): a rank, or a rank and a subject (one of its GPUs), each with its own
record, claim and place in a marker; so one rank's two hot GPUs are two members, and a
job's eight hot GPUs on eight ranks are eight members of one message.

1. When an alert joins a group, its record goes on the board (``post``).
2. When the group's ``group_wait`` is over (``hold``), the agent reads the board for that
   kind. Its members a peer already covered are suppressed (``grouped_by_peer``). Of the
   fresh records nobody covered, the lowest rank leads: if that is ours, we send ONE
   message for all of them (the in-agent grouping and suspect logic, fed the peers'
   records) and write a marker naming the members we covered.
3. Otherwise we wait for that marker. A leader that is dead never writes it, so the
   next-lowest rank takes over after ``takeover`` (the one after it after twice that, ...;
   past ``MAX_POSITION`` the steps are shorter and jittered, see ``takeover_delay``). A
   position counts ranks, not members: a rank with three hot GPUs is one agent, dead or
   alive. Just before sending, the sender reads the board once more: a marker that appeared
   meanwhile (a slow leader, an earlier taker) wins, and records that changed are left out.
   It claims each record (``O_EXCL``) and sends only the members it got.
4. A leader that cannot read a peer's record in time still sends for that member (named,
   without details) and still writes its marker; a record that holds values this agent
   cannot use is left out, so its owner sends it.
5. An agent whose alert clears before it learned that a peer announced it (or that fires
   again before it learned that a peer sent its resolve) does not decide alone: it reads
   the markers for that record for ``WATCH_S`` and sends the resolve (or the new firing)
   itself when one shows the peer did send. Only a marker shows that (it is written after
   the send); a claim does not: its claimer may have been killed before sending, or it may
   be our own, of a member that resolved (or fired again) while we claimed it.

The board is an optimisation, never a dependency: when it cannot be written or read
(permissions, ENOSPC, a hung NFS mount), each agent sends its own alerts again, which is
logged once and counted, and the board is left alone for ``RETRY_S`` before the next try.
Its I/O runs on daemon threads of its own, not the loop's default executor: a call stuck
on a dead mount is abandoned after its timeout and cannot hold up the agent's exit.
All waits are on the dispatcher's clock; only ``settle`` (used by ``close``, whose budget
is real seconds) waits in real time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from rankwatch.actions.alerts.board import (
    MAX_TEXT,
    Board,
    Entry,
    Marker,
    Member,
    Record,
    View,
    member_of,
    rank_of,
    small_evidence,
    stamp,
)
from rankwatch.actions.alerts.message import AlertMember
from rankwatch.actions.alerts.policy import FAILURE_FAMILY, FOLD_WINDOW_S, SLOWDOWN_FAMILY, Group, Key
from rankwatch.offloop import in_daemon
from rankwatch.records import Diagnosis, Severity

log = logging.getLogger("rankwatch.alerts")

IO_TIMEOUT_S = 5.0  # one board operation (real seconds); a hung mount must not hold alerts
LOAD_PER_RECORD_S = 0.02  # the leader's read of its peers' records may take this much more each
LOAD_MAX_S = 30.0  # ... up to this; what is not read by then is sent without details
RETRY_S = 300.0  # after a failure, the board is not tried again for this long
MAX_POSITION = 8  # takeover waits grow by one ``takeover`` per position, up to this many steps
SPREAD = 24  # ... then by a shorter step for this many more positions; the rest share a window
POLL_S = 2.0  # a follower re-reads the board at least this often while it waits
WATCH_S = 60.0  # how long a cleared (or re-fired) record's markers are watched for a peer's send
SETTLE_POLL_S = 0.2  # at close, a follower re-reads the board this often (real seconds)


def shared(key: Key) -> bool:
    """An alert the board can coordinate: one of a rank (with or without a subject). One of no
    rank (a node daemon's own) is this agent's alone."""
    return key[1] is not None


def member(key: Key) -> Member:
    """The board's member for an alert of ``shared`` key."""
    assert key[1] is not None
    return member_of(key[1], key[3])


def _gap(takeover: float) -> float:
    return max(POLL_S, takeover / 4) if takeover > 0 else 0.0


def takeover_delay(position: int, takeover: float, jitter: float = 0.0) -> float:
    """How long the rank at ``position`` among the open ranks waits before it sends for all.

    One ``takeover`` per position up to ``MAX_POSITION``; past it, a shorter step per
    position (``_gap``, still longer than one board poll) plus up to half a step of jitter
    (``jitter`` in [0, 1)), for ``SPREAD`` more positions; beyond those all share one window
    spread by jitter. So when the ranks before are dead (a node gone with its agents), the
    live ones behind them do not send at once: the first sends, the others see its marker."""
    takeover = max(0.0, takeover)
    if position <= MAX_POSITION:
        return position * takeover
    extra = position - MAX_POSITION
    if extra <= SPREAD:
        return MAX_POSITION * takeover + (extra + jitter / 2) * _gap(takeover)
    return MAX_POSITION * takeover + (SPREAD + 1 + jitter * SPREAD) * _gap(takeover)


def max_takeover_delay(takeover: float) -> float:
    """The longest ``takeover_delay``: records must stay fresh at least this long."""
    return MAX_POSITION * max(0.0, takeover) + (2 * SPREAD + 1) * _gap(takeover)


class GroupHost(Protocol):
    """Where decided groups go back to (``policy.AlertPolicy``): sent by us, or announced by
    the peer that sent them."""

    def emit(self, g: Group, now: float, *, saw_all: bool | None = None) -> None: ...
    def announced(self, g: Group, keys: list[Key], now: float) -> None: ...
    def saw_all(self, extra: set[int] | None = None) -> bool: ...


@dataclasses.dataclass(eq=False)
class _Held:
    group: Group
    since: float  # dispatcher clock: when the group's own wait was over
    next_check: float
    jitter: float = 0.0  # [0, 1): spreads takeovers past MAX_POSITION


@dataclasses.dataclass(eq=False)
class _Watch:
    key: Key
    status: str  # a marker of this status covering the record means a peer sent it
    since_us: int  # the record's time
    until: float  # dispatcher clock
    next_check: float
    then: Callable[[], None]  # called (once) when a peer did send it, or when that cannot be known


class PeerGroups:
    def __init__(
        self,
        host: GroupHost,
        board: Board,
        *,
        run: str,
        node: str,
        ranks: set[int],
        clock: Callable[[], float],
        wall: Callable[[], float],
        takeover: float,
        errors: dict[str, int],
        rng: Callable[[], float] = random.random,
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
        self.rng = rng
        self.stats = {"led": 0, "took_over": 0, "grouped_by_peer": 0, "fallback": 0}
        self._outbox: list[Record] = []
        self._held: list[_Held] = []
        self._watches: list[_Watch] = []
        self._posted: dict[tuple[str, Member], tuple[str, int]] = {}  # (kind, member) -> (state, us)
        self._present: set[int] = set()
        self._broken_until = -float("inf")
        self._failures = 0
        self._inflight: asyncio.Future[Any] | None = None
        self._step_lock = asyncio.Lock()

    # --- called synchronously by the policy (``policy.Coordinator``) ---------------------------
    @property
    def where(self) -> str:
        return str(self.board.path)

    @property
    def busy(self) -> bool:
        """A step (and so a board operation it waits for) is under way. An operation given up on
        a hung mount is not: its thread is abandoned, and the board set aside."""
        return self._step_lock.locked()

    def usable(self, now: float) -> bool:
        return now >= self._broken_until

    def post(self, key: Key, m: AlertMember, state: str, severity: Severity, when: float) -> None:
        rank = key[1]
        if rank is None or not shared(key) or not self.usable(self.clock()):
            return
        doc = {
            "message": m.message[:MAX_TEXT],
            "step": m.step,
            "evidence": small_evidence(m.evidence),
            "dump_path": m.dump_path,
            "starts_at": m.starts_at,
            "diagnosis": m.diagnosis.to_json() if m.diagnosis is not None else None,
            "user": m.user,  # whose process the rank is: the peer's message names it too
        }
        rec = Record(self.run, key[2], rank, state, when, self.node, severity.label, doc, key[3])
        self._outbox = [r for r in self._outbox if (r.kind, r.id) != (rec.kind, rec.id)]
        self._outbox.append(rec)

    def hold(self, g: Group, now: float) -> bool:
        """Take a group whose wait is over; False: the dispatcher sends it alone, now."""
        if not all(shared(k) for k in g.members):
            return False
        if not self.usable(now):
            self._fallback()
            return False
        self._held.append(_Held(g, now, now, min(max(float(self.rng()), 0.0), 1.0)))
        return True

    def forget(self, key: Key, status: str) -> None:
        """A member resolved (or fired again) while its group waited on the board."""
        for h in self._held:
            if h.group.status == status:
                h.group.members.pop(key, None)

    def watch(self, key: Key, status: str, since: float, then: Callable[[], None]) -> bool:
        """This rank's ``status`` record of ``since`` is being replaced before this agent learned
        whether a peer sent it: call ``then`` if a peer's marker shows it did (or if the board
        cannot tell). False: that record never reached the board, so no peer can have sent it."""
        if not shared(key) or self._posted.get((key[2], member(key))) != (status, stamp(since)):
            return False
        now = self.clock()
        self._watches.append(_Watch(key, status, stamp(since), now + WATCH_S, now, then))
        return True

    def abandon(self) -> tuple[list[Group], list[Callable[[], None]]]:
        """Something went wrong that should not have: hand back every held group (to be sent
        alone) and every watch (to be acted on: in doubt, send), and leave the board alone."""
        groups = [h.group for h in self._held if h.group.members]
        thens = [w.then for w in self._watches]
        self._held.clear()
        self._watches.clear()
        self._outbox.clear()
        self._broken_until = self.clock() + RETRY_S
        self.stats["fallback"] += len(groups)
        return groups, thens

    @property
    def waiting(self) -> int:
        return len(self._held) + len(self._watches)

    # --- the dispatcher's timer loop -------------------------------------------------------
    async def step(self, now: float, *, closing: bool = False, poll: bool = False) -> float:
        """Post records, decide held groups that are due (all with ``poll``); returns the next due time.

        One step at a time: the dispatcher's timer loop and its ``close`` (``settle``) both step,
        and two decisions on one group running side by side would send it twice."""
        async with self._step_lock:
            return await self._step(now, closing=closing, poll=poll)

    async def _step(self, now: float, *, closing: bool, poll: bool) -> float:
        await self._flush()
        due = float("inf")
        for h in list(self._held):
            if h in self._held and (closing or poll or now >= h.next_check):
                await self._decide(h, now, closing=closing)
            if h in self._held:
                due = min(due, h.next_check)
        return min(due, await self._check(now, closing=closing, poll=poll))

    async def settle(self, budget_s: float) -> None:
        """At close: decide every held group now; followers wait for a marker within the budget."""
        end = time.monotonic() + max(0.0, budget_s)
        while True:
            await self.step(self.clock(), closing=time.monotonic() >= end, poll=True)
            if not self._held or time.monotonic() >= end:
                break
            await asyncio.sleep(min(SETTLE_POLL_S, max(0.0, end - time.monotonic())))
        if self._held or self._watches:
            await self.step(self.clock(), closing=True)

    # --- decisions -------------------------------------------------------------------------
    def _poll(self) -> float:
        return min(POLL_S, max(self.takeover / 4, 0.01))

    async def _decide(self, h: _Held, now: float, *, closing: bool) -> None:
        g = h.group
        if not g.members:
            self._drop(h)
            return
        view = await self._io(self.board.view, g.kind, self.wall(), sorted(_ranks(g)))
        if h not in self._held:  # handed back meanwhile (``abandon``): whoever took it sends it
            return
        if view is None:
            self._alone(h, now)
            return
        if self._drop_covered(g, view, now):
            self._drop(h)
            return
        folded = await self._drop_folded(g, now) if g.status == "firing" else False
        if folded:
            self._drop(h)
            return
        if h not in self._held:
            return
        if folded is None and not closing and now < h.since + self.takeover:
            h.next_check = min(h.since + self.takeover, now + self._poll())
            return  # the first failure's record is on its way: fold into it, not before it
        open_members = view.open(g.status)
        mine = _members(g)
        if not mine or not mine <= set(open_members):  # our record is not there: the board lost it
            self._alone(h, now)
            return
        open_ranks = sorted({rank_of(m) for m in open_members})
        position = open_ranks.index(min(rank_of(m) for m in mine))
        takeover_at = h.since + takeover_delay(position, self.takeover, h.jitter)
        if position == 0 or closing or now >= takeover_at:
            await self._lead(h, view, open_members, now, took_over=position > 0)
            return
        h.next_check = min(takeover_at, now + self._poll())

    def _drop_covered(self, g: Group, view: View, now: float) -> bool:
        """Our members a peer sent are announced; True when none is left to send."""
        covered = [
            k
            for k in g.members
            if k in g.times and shared(k) and view.covered(member(k), g.status, stamp(g.times[k]))
        ]
        if covered:
            self.stats["grouped_by_peer"] += len(covered)
            self.host.announced(g, covered, now)
            for k in covered:
                g.members.pop(k, None)
        return not g.members

    async def _drop_folded(self, g: Group, now: float) -> bool | None:
        """Our alerts that follow another rank's problem (the rank their diagnosis names), when
        that rank's alert of the same family is on the board: one problem, one message across
        agents, that rank's (its agent sends it; ``policy._problem_of`` does the same within one
        agent), when that alert is at least as severe as ours. A rank's OOM and its peers' gloo
        crashes after it are one alert, not an OOM alert and a "crash on 3 of 4 ranks" one; a
        straggler and the throughput drops it explains are one alert. Of our own kind only a
        record already sent (or claimed) takes ours in: one still open is grouped with ours by
        the board (one message for both). True when none of ours is left to send; None when a
        failure of ours names a first failure whose rank's agent is on the board but has no
        failure record there yet (its agent posts it within moments: we wait for it, up to
        ``takeover``, rather than send the consequence first as an alert of its own)."""
        family = (
            FAILURE_FAMILY
            if g.kind in FAILURE_FAMILY
            else SLOWDOWN_FAMILY
            if g.kind in SLOWDOWN_FAMILY
            else None
        )
        if family is None:
            return False
        causes: dict[Key, tuple[int, float]] = {}
        awaited: set[int] = set()  # first failures of other ranks, named by a failure of ours
        for k, m in g.members.items():
            d = m.diagnosis
            cause = d.suspect if d is not None else None
            if cause is not None and k[1] is not None and cause != k[1]:
                causes[k] = (cause, m.starts_at)
                ff = d.first_failure if d is not None else None
                # A failure its agent alerts (not a clean exit, not a kind of another family).
                if family is FAILURE_FAMILY and ff is not None and ff.rank == cause and ff.kind in family:
                    awaited.add(cause)
        if not causes:
            return False
        firing: dict[int, list[float]] = {}
        posted: set[int] = set()  # suspects with a record of the family on the board
        present: set[int] = set()
        wanted = {cause for cause, _ in causes.values()}
        for kind in sorted(family):
            view = await self._io(self.board.view, kind, self.wall(), sorted(_ranks(g)))
            if view is None:
                return False  # in doubt, ours goes out
            present |= view.present
            theirs = [e for e in view.records.values() if not e.tag and e.rank in wanted - _ranks(g)]
            posted |= {e.rank for e in theirs}
            entries = [e for e in theirs if e.state == "firing"]
            if kind == g.kind:  # one still open is the board's to group with ours
                entries = [e for e in entries if view.covered(e.member, "firing", e.us)]
            if not entries:
                continue
            # Only an alert at least as severe as ours may take ours in: a crash after the
            # suspect's warning is the job's death, and an alert routed on critical must page.
            loaded = await self._load(kind, entries)
            for e in entries:
                rec = loaded.get(e.member)
                if rec is not None and Severity.parse(rec.severity) >= g.severity:
                    firing.setdefault(e.rank, []).append(e.us / 1e6)
        folded = [
            k
            for k, (cause, starts) in causes.items()
            if any(abs(t - starts) <= FOLD_WINDOW_S for t in firing.get(cause, ()))
        ]
        if folded:
            self.stats["grouped_by_peer"] += len(folded)
            self.host.announced(g, folded, now)
            for k in folded:
                g.members.pop(k, None)
        if not g.members:
            return True
        if (awaited & present) - posted:
            return None
        return False

    def _alone(self, h: _Held, now: float) -> None:
        if h not in self._held:
            return
        self._fallback()
        if h.group.members:
            self.host.emit(h.group, now)
        self._drop(h)  # only once it is out: an error before leaves it for abandon()

    def _drop(self, h: _Held) -> None:
        """Decided: no longer held. Never raises: another path may have taken it already."""
        if h in self._held:
            self._held.remove(h)

    async def _lead(
        self, h: _Held, view: View, members: list[Member], now: float, *, took_over: bool
    ) -> None:
        """Send one message for our members and the peers' open records. Every await below may
        let the dispatcher change the group (a member resolved) or hand it back (``abandon``):
        after each one, a group no longer held is someone else's to send."""
        g = h.group
        mine = _members(g)
        theirs = [view.records[m] for m in members if m not in mine]
        loaded = await self._load(g.kind, theirs) if theirs else {}
        if h not in self._held:
            return
        # Just before sending: a marker may have appeared while we read (a slow leader, an
        # earlier taker), and a peer's record may have changed (cleared, fired again).
        again = await self._io(self.board.view, g.kind, self.wall(), sorted(_ranks(g)))
        if h not in self._held:
            return
        if again is not None:
            if self._drop_covered(g, again, now):
                self._drop(h)
                return
            theirs = [e for e in theirs if _still_open(again, e, g.status)]
        extra: dict[Member, tuple[Key, AlertMember]] = {}
        covers: dict[Member, int] = {}
        severity = g.severity
        for e in theirs:
            if e.member not in loaded:  # not read in time: named, without its details
                extra[e.member] = ((self.run, e.rank, g.kind, e.tag or None), _bare(e, g.kind))
            elif (rec := loaded[e.member]) is not None:
                extra[e.member] = ((self.run, e.rank, g.kind, rec.subject), _peer(rec))
                severity = max(severity, Severity.parse(rec.severity))
            else:
                continue  # gone or unusable: its own agent sends it (not covered)
            covers[e.member] = e.us
        for k, t in g.times.items():
            if shared(k) and k in g.members:
                covers[member(k)] = stamp(t)
        if not covers:
            self._drop(h)  # every member resolved while we read
            return
        # Claim each record before sending it: of two agents that both decided to send (a slow
        # leader and its taker read the board at the same moment), each record goes with one.
        at_claim = {member(k): k for k in g.members if shared(k)}
        claimed = await self._io(self.board.claim, g.kind, g.status, covers)
        if h not in self._held:
            return
        if claimed is None:  # the board failed: in doubt, our own members go alone
            self._alone(h, now)
            return
        # Ours that resolved (or fired again) during the claim: their claim stays on the board,
        # yet nobody sends them, so our marker must not name them (our watch reads it).
        claimed -= {m for m, k in at_claim.items() if k not in g.members}
        ours = [k for k in g.members if shared(k)]
        lost = [k for k in ours if member(k) not in claimed]  # a peer claimed them first: it sends them
        if lost:
            self.stats["grouped_by_peer"] += len(lost)
            self.host.announced(g, lost, now)
            for k in lost:
                g.members.pop(k, None)
        extra = {m: km for m, km in extra.items() if m in claimed}
        covers = {m: us for m, us in covers.items() if m in claimed}
        if not covers or not (g.members or extra):
            self._drop(h)
            return
        own = _ranks(g)
        by = min(own) if own else min(rank_of(m) for m in covers)  # ours, before the peers join
        g.members.update(dict(extra.values()))
        g.severity = severity
        self.stats["took_over" if took_over else "led"] += 1
        if took_over:
            log.warning(
                "alert board: no peer sent %s %s for ranks %s; rank %s sends it",
                g.kind,
                g.status,
                sorted({rank_of(m) for m in covers}),
                by,
            )
        seen = view.ranks() | (again.ranks() if again is not None else set())
        self.host.emit(g, now, saw_all=self.host.saw_all(seen))
        self._drop(h)
        await self._io(self.board.mark, g.kind, Marker(g.status, by, self.wall(), covers))

    async def _load(self, kind: str, entries: list[Entry]) -> dict[Member, Record | None]:
        """The peers' records, as many as can be read in a time that grows with their number."""
        out: dict[Member, Record | None] = {}
        stop = threading.Event()
        timeout = min(LOAD_MAX_S, IO_TIMEOUT_S + LOAD_PER_RECORD_S * len(entries))
        done = await self._io(self.board.load, entries, out, stop, timeout=timeout, soft=True)
        stop.set()
        got = dict(out)
        if done is None:
            log.warning(
                "alert board: read %d of %d peer %s records in %.0fs; the others are sent without details",
                len(got),
                len(entries),
                kind,
                timeout,
            )
        return got

    async def _check(self, now: float, *, closing: bool, poll: bool) -> float:
        """Watched records: did a peer send them after all?"""
        due_kinds = sorted({w.key[2] for w in self._watches if closing or poll or now >= w.next_check})
        for kind in due_kinds:
            ws = [w for w in self._watches if w.key[2] == kind]
            ranks = sorted({rank_of(member(w.key)) for w in ws})
            view = await self._io(self.board.view, kind, self.wall(), ranks)
            for w in ws:
                if w not in self._watches:
                    continue
                if view is None or view.sent(member(w.key), w.status, w.since_us):
                    self._watches.remove(w)  # in doubt (no board), act as if the peer sent it
                    w.then()
                elif closing or now >= w.until:
                    self._watches.remove(w)
                else:
                    w.next_check = now + self._poll()
        return min((w.next_check for w in self._watches), default=float("inf"))

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
            for r in batch:  # from now on a peer may see it (even if the write times out)
                self._posted[(r.kind, r.id)] = (r.state, stamp(r.time))
            await self._io(self.board.post, batch)

    async def _io(
        self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, soft: bool = False
    ) -> Any:
        """Run one board operation on a thread; None (and the board set aside) on any failure.
        ``soft``: a timeout or error only returns None (the thread is left to finish)."""
        if not self.usable(self.clock()):
            return None
        if self._inflight is not None and not self._inflight.done():
            return self._failed("a previous board operation is still hanging")
        fut = _in_thread(fn, *args)
        if not soft:
            self._inflight = fut
        limit = IO_TIMEOUT_S if timeout is None else timeout
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), limit)
        except asyncio.TimeoutError:
            return None if soft else self._failed(f"no answer in {limit:.0f}s")
        except Exception as e:  # OSError mostly; whatever it is, alerts must still go out
            return None if soft else self._failed(f"{type(e).__name__}: {e}")
        return True if result is None else result

    def _failed(self, why: str) -> None:
        self._failures += 1
        self._broken_until = self.clock() + RETRY_S
        self._outbox.clear()  # by the next try these may be out of date: posted afresh then
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


def _in_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    return in_daemon(fn, *args, name="rankwatch-board")


def _members(g: Group) -> set[Member]:
    """The group's members as the board names them."""
    return {member(k) for k in g.members if shared(k)}


def _ranks(g: Group) -> set[int]:
    return {k[1] for k in g.members if k[1] is not None}


def _still_open(view: View, e: Entry, status: str) -> bool:
    """The peer's record read earlier is still one to send for: in that state, and unsent."""
    cur = view.records.get(e.member)
    return cur is not None and cur.state == status and not view.covered(e.member, status, e.us)


def _bare(e: Entry, kind: str) -> AlertMember:
    """A peer's member whose record could not be read in time: named, without its details (its
    subject is known by its tag only)."""
    return AlertMember(
        e.rank,
        f"{kind} on rank {e.rank} (details not read from the alert board in time)",
        None,
        {},
        None,
        e.us / 1e6,
    )


def _peer(rec: Record) -> AlertMember:
    """A peer's record (cleaned by ``Record.from_json``) as a member of our message."""
    m = rec.member
    step = m.get("step")
    starts = m.get("starts_at")
    evidence = m.get("evidence")
    return AlertMember(
        rec.rank,
        str(m.get("message") or "")[:MAX_TEXT],
        step if isinstance(step, int) and not isinstance(step, bool) else None,
        dict(evidence) if isinstance(evidence, dict) else {},
        str(m["dump_path"]) if m.get("dump_path") else None,
        float(starts) if isinstance(starts, (int, float)) and not isinstance(starts, bool) else rec.time,
        node=rec.node or None,
        subject=rec.subject,
        diagnosis=m.get("diagnosis") if isinstance(m.get("diagnosis"), Diagnosis) else None,
        user=m.get("user") if isinstance(m.get("user"), str) else None,
    )
