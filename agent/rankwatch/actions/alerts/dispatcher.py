"""Alert routing: findings in, few and reliable messages out.

Policy (each rule exists because the alternative wakes someone for nothing or loses an alert):

- An alert is a finding with severity >= ``min_severity``; it is identified by
  (run, rank, kind). A second firing of an active alert is not re-sent (a higher severity
  is, as an escalation); ``repeat_interval`` re-sends still-active ones; a resolved finding
  closes it and, with ``send_resolved``, sends a resolve message.
- Grouping: the findings of one kind (and status) arriving within ``group_wait`` of the
  first become one message, "stall on 7 of 8 ranks, suspect rank 2" (see
  ``message.suspect_rank``). A resolve that arrives before its firing left the group
  cancels both; a re-firing that arrives before its resolve left cancels both (flapping
  stays silent). "of 8" only when every rank of the world is known to exist (watched
  here, or present on the board), else "7 ranks (0-6)".
- Across agents (one agent per rank): with an alert board (``board.py``, ``peers.py``)
  the agents of one run send one message per group between them, not one each; repeats
  and resolves go the same way. Without a usable board each agent sends its own, and so
  it does after any error in the board's coordination (logged once, counted as
  ``fallback``): a duplicate is acceptable, a lost alert is not.
- Startup quiet: for ``startup_quiet`` after ``run()`` starts, groups are held, not
  dropped; when the window ends, what is still active is sent (one message per kind), and
  what resolved meanwhile is forgotten. ``close()`` sends held alerts at once: a crash in
  the first minute must not be lost because the agent exits with it.
- Delivery: one queue and one task per sink, so a sink that hangs never delays another
  nor the caller (``send`` only enqueues). Per sink: FIFO (a resolve never overtakes its
  firing), a token bucket of ``rate_limit_per_minute`` (excess waits, is not dropped),
  retries with exponential backoff and "equal" jitter (the n-th wait is between half and
  all of ``min(backoff_max, 2**(n-1) s)``) at most ``max_retries`` times, a sink's Retry-After
  honoured as a floor (capped at ``backoff_max``), permanent errors not retried. Half of
  every wait is fixed so the budget is a guarantee, not an average: with the defaults (12
  retries, 300 s) an alert is given up no sooner than 705 s after its first failure
  (``retry_window``), so a sink down for 10 minutes loses nothing; full jitter could draw
  twelve short waits and give up after a minute or two. A resolve never reaches a sink
  that gave up its firing (the members whose firing it dropped are left out of it).
- Spool: while a sink fails, every alert queued for it, and whatever is undelivered at
  ``close``, is written to a per run+rank spool file and removed once delivered; a new
  dispatcher loads it and delivers it (with a fresh retry budget). Delivery is
  at-least-once: a crash between delivery and removal re-sends one alert. Alerts held back
  by the rate limit are spooled too. What a SIGKILL of the agent can still lose: an alert
  whose first attempt is in flight, and findings not yet made alerts (inside ``group_wait``
  or ``startup_quiet``), which live in memory.
- Restarts: what is firing (announced or not) and what ended recently are kept in a state
  file beside the spool (``state.py``, written off the loop whenever they change). A
  restarted agent takes its alerts back, announces those it had not, sends a resolve it
  still owed, and compares the findings of the replayed log tail with them: the same
  episode is not sent again, one that cleared while no agent ran is resolved, and one no
  agent reported (a NaN while no agent ran) is sent once. An alert it cannot re-detect is
  resolved by rule after ``INHERIT_HOLD_S`` (the rule is in ``state.py``). A firing found
  in the spool counts as announced even when the state file had not caught up.
- Sinks with ``refresh_interval`` (Alertmanager) get the active alerts re-posted that
  often, best effort (never retried nor spooled; skipped while that sink has a backlog).

``stats[sink]``: ``sent`` deliveries, ``failed`` failed attempts, ``retried`` retries
scheduled, ``dropped`` alerts given up (retries exhausted, permanent error, spool or queue
bound). Each dropped alert is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import random
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwatch.actions.alerts.board import MAX_TEXT, Board, board_path, clean_member, small_evidence
from rankwatch.actions.alerts.message import (
    AlertMember,
    AlertMessage,
    AlertSink,
    DeliveryError,
    Status,
    jsonable,
    render_link,
)
from rankwatch.actions.alerts.peers import PeerGroups, max_takeover_delay
from rankwatch.actions.alerts.spool import Spool, SpoolEntry, spool_path
from rankwatch.actions.alerts.state import (
    EVENT_KINDS,
    INHERIT_HOLD_S,
    Remembered,
    StateFile,
    prune_ended,
    state_path,
)
from rankwatch.actions.alerts.threads import ThreadStore
from rankwatch.config.schema import AlertsConfig
from rankwatch.identity import Identity
from rankwatch.offloop import call as off_loop
from rankwatch.records import Finding, Severity

log = logging.getLogger("rankwatch.alerts")

MAX_QUEUE = 10_000
BACKOFF_BASE_S = 1.0
Key = tuple[str, int | None, str]  # (run, rank, kind)
GroupKey = tuple[str, Status, bool]  # (kind, status, repeat)
STALE_MIN_S = 600.0  # board records younger than this are never ignored as stale
STATE_TIMEOUT_S = 10.0  # one write (or read) of the alert state file; a hung mount gives up
STATE_RETRY_S = 30.0  # after a failed write, the next try waits this long


def sink_name(kind: str, target: str, names: dict[str, str], *, alone: bool) -> str:
    """Named by what it sends to, not by position: the spool routes backlog by this name, so
    reordering the URLs in the config must not send one receiver's alerts to another. The
    only sink of its kind keeps the plain kind name (``sink="alertmanager"`` in dashboards)."""
    given = names.get(target)
    if given:
        return given
    return kind if alone else f"{kind}-{hashlib.sha256(target.encode()).hexdigest()[:8]}"


def sinks_from_config(cfg: AlertsConfig) -> list[AlertSink]:
    from rankwatch.actions.alerts.alertmanager import AlertmanagerSink
    from rankwatch.actions.alerts.slack import SlackSink
    from rankwatch.actions.alerts.webhook import WebhookSink

    sinks: list[AlertSink] = []
    s = cfg.slack
    if (s.token and s.channel) or s.webhook_url:
        sinks.append(SlackSink(s))  # one Slack sink at most: "slack" is already stable
    elif s.token or s.channel:
        log.warning("alerts.slack: set both token and channel (or webhook_url); Slack alerts are off")
    am = cfg.alertmanager
    urls = list(dict.fromkeys(am.urls))
    for url in urls:
        name = sink_name("alertmanager", url, am.names, alone=len(urls) == 1)
        sinks.append(AlertmanagerSink(url, timeout=am.timeout, name=name))
    wh = cfg.webhook
    urls = list(dict.fromkeys(wh.urls))
    for url in urls:
        name = sink_name("webhook", url, wh.names, alone=len(urls) == 1)
        sinks.append(WebhookSink(url, headers=wh.headers, timeout=wh.timeout, name=name))
    return sinks


@dataclass(eq=False)
class _Active:
    severity: Severity
    member: AlertMember
    sent: bool = False  # announced at least once
    pending: bool = True  # in a firing group not yet emitted
    last_sent: float = 0.0
    board_time: float = 0.0  # wall clock of this episode's board record
    resolved_at: float = 0.0  # wall clock of its resolve's board record


@dataclass(eq=False)
class _Group:
    kind: str
    status: Status
    deadline: float
    severity: Severity
    members: dict[Key, AlertMember] = field(default_factory=dict)
    repeat: bool = False
    times: dict[Key, float] = field(default_factory=dict)  # board record time per member


@dataclass(eq=False)
class _Item:
    alert: AlertMessage
    entry_id: str
    attempts: int = 0
    not_before: float = 0.0
    spooled: bool = False
    refresh: bool = False
    dropped: bool = False


class _Bucket:
    """Token bucket: ``per_minute`` burst, refilled continuously; <= 0 means unlimited."""

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.tokens = self.capacity
        self.rate = per_minute / 60.0
        self.last = now

    def wait_time(self, now: float) -> float:
        if self.capacity <= 0:
            return 0.0
        self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def take(self) -> None:
        if self.capacity > 0:
            self.tokens -= 1.0


class _Worker:
    def __init__(self, sink: AlertSink, bucket: _Bucket) -> None:
        self.sink = sink
        self.name = sink.name
        self.queue: deque[_Item] = deque()
        self.bucket = bucket
        self.wake = asyncio.Event()
        self.task: asyncio.Task[Any] | None = None
        self.refresh_interval: float | None = getattr(sink, "refresh_interval", None)
        self.next_refresh = 0.0
        self.lost: set[tuple[int | None, str]] = set()  # (rank, kind) whose firing this sink never got


class AlertDispatcher:
    def __init__(
        self,
        cfg: AlertsConfig,
        identity: Identity,
        *,
        sinks: list[AlertSink] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        backoff_base: float = BACKOFF_BASE_S,
        errors: dict[str, int] | None = None,
        ranks: Iterable[int] = (),
        dumps_dir: str | Path | None = None,
        inherit_hold: float = INHERIT_HOLD_S,
    ) -> None:
        """``ranks``: the ranks this agent watches (for "N of WORLD"); ``dumps_dir``: where the
        alert board lives by default (``alerts.board_dir`` unset)."""
        self.cfg = cfg
        # The agent's internal-error counters, so a spool that cannot be written shows in /metrics.
        self.errors = errors if errors is not None else {}
        self.identity = identity
        self.clock = clock
        self.wall = wall
        self.rng = rng
        self.backoff_base = backoff_base
        self.min_severity = Severity.parse(cfg.min_severity)
        self.sinks = sinks_from_config(cfg) if sinks is None else list(sinks)
        names = [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"alert sink names must be unique: {names}")
        now = clock()
        self._workers = {s.name: _Worker(s, _Bucket(cfg.rate_limit_per_minute, now)) for s in self.sinks}
        self.stats: dict[str, dict[str, int]] = {
            n: {"sent": 0, "failed": 0, "dropped": 0, "retried": 0} for n in names
        }
        self.spool = Spool(spool_path(cfg.spool_dir, identity.run, identity.rank), cfg.spool_max_bytes)
        self.state = StateFile(state_path(cfg.spool_dir, identity.run, identity.rank))
        self.inherit_hold = float(inherit_hold)
        self._ended: dict[Key, Remembered] = {}  # alerts that ended (replay tells old from new)
        self._inherited: dict[Key, float] = {}  # firing at start, not yet seen again -> deadline
        self._owed: set[Key] = set()  # resolves owed from before the restart, not yet announced
        self._replayed: list[Finding] | None = []  # None once the state is loaded
        self._saved_doc: Any = None
        self._saving: asyncio.Future[Any] | None = None
        self._state_retry_at = -float("inf")
        self._state_errors = 0
        self._active: dict[Key, _Active] = {}
        self._resolving: dict[Key, _Active] = {}
        self._pending: dict[GroupKey, _Group] = {}
        self._dumps: dict[int | None, str] = {}
        self._wake = asyncio.Event()
        self._spool_lock = asyncio.Lock()
        self._t0: float | None = None
        self._started = False
        self._starting: asyncio.Future[None] | None = None
        self._closed = False
        self._spool_errors = 0
        self._peer_errors = 0
        self._ranks: set[int] = {r for r in ranks if r is not None}
        if identity.rank is not None:
            self._ranks.add(identity.rank)
        path = board_path(self.cfg.board_dir, dumps_dir, self.identity.run)
        self.peers = self._make_peers(path) if path is not None else None
        for s in self.sinks:
            share = getattr(s, "share_threads", None)
            if path is not None and callable(share):
                share(ThreadStore(path / "slack-threads"))

    def _make_peers(self, path: Path) -> PeerGroups | None:
        takeover = float(self.cfg.board_takeover)
        chain = float(self.cfg.group_wait) + max_takeover_delay(takeover) + 2 * takeover
        stale = max(STALE_MIN_S, float(self.cfg.startup_quiet) + chain)
        return PeerGroups(
            self,
            Board(path, self.identity.run, stale),
            run=self.identity.run,
            node=self.identity.node,
            ranks=self._ranks,
            clock=self.clock,
            wall=self.wall,
            takeover=takeover,
            errors=self.errors,
            rng=self.rng,
        )

    # --- the board, guarded: any error in it sends alone, never loses an alert --------------
    def _peers_failed(self, e: BaseException, alone: int = 0) -> None:
        """Take back what the board held and send it alone; the board is set aside for a while.
        ``alone``: groups the caller sends alone because of it (counted as fallbacks too)."""
        peers = self.peers
        assert peers is not None
        self._peer_errors += 1
        self.errors["alerts"] = self.errors.get("alerts", 0) + 1
        if self._peer_errors == 1:
            log.error(
                "alert board %s: coordination failed (%s: %s); each agent sends its own alerts"
                " (further errors counted)",
                peers.board.path,
                type(e).__name__,
                e,
                exc_info=e,
            )
        try:
            groups, thens = peers.abandon()
        except Exception:
            groups, thens = [], []
        peers.stats["fallback"] += alone
        now = self.clock()
        for g in groups:
            self._emit(g, now)
        for then in thens:  # in doubt whether a peer sent it: act as if it did
            try:
                then()
            except Exception:
                log.debug("alert board watch failed", exc_info=True)
        self._wake.set()

    def _peers_call(self, fn: Callable[..., Any], *args: Any, failed: Any = None, alone: int = 0) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            self._peers_failed(e, alone)
            return failed

    async def _peers_step(self, now: float) -> float:
        assert self.peers is not None
        if not self.peers.usable(now) and not self.peers.waiting:
            return float("inf")  # set aside, and nothing left to decide
        try:
            return await self.peers.step(now)
        except Exception as e:
            self._peers_failed(e)
            return float("inf")  # what it held is sent: nothing is due there (and no busy loop)

    @property
    def peer_stats(self) -> dict[str, int]:
        """led / took_over: grouped messages this agent sent for its peers too; grouped_by_peer:
        alerts a peer sent for this agent; fallback: groups sent alone, the board being unusable."""
        if self.peers is None:
            return {"led": 0, "took_over": 0, "grouped_by_peer": 0, "fallback": 0}
        return self.peers.stats

    # --- intake (synchronous, called by the agent) ---------------------------------------
    def send(self, f: Finding) -> None:
        """Enqueue only: never blocks, never raises for a well-formed finding."""
        if self._closed:
            return
        rank = f.rank if f.rank is not None else self.identity.rank
        key: Key = (self.identity.run, rank, f.kind)
        if rank is not None:
            self._ranks.add(rank)
        if f.resolved:
            self._resolve(key, f)
        elif f.severity >= self.min_severity:
            self._fire(key, f)
        self._wake.set()

    def _member(self, rank: int | None, f: Finding, starts_at: float) -> AlertMember:
        dump = f.evidence.get("dump_path") or self._dumps.get(rank)
        return AlertMember(
            rank, f.message, f.step, jsonable(f.evidence), str(dump) if dump else None, starts_at, None
        )

    def _fire(self, key: Key, f: Finding) -> None:
        a = self._active.get(key)
        if a is not None:
            self._inherited.pop(key, None)  # seen again: the same episode, resolved by its detector
            fresh = self._member(key[1], f, a.member.starts_at)
            a.member.message, a.member.step, a.member.evidence = fresh.message, fresh.step, fresh.evidence
            a.member.dump_path = a.member.dump_path or fresh.dump_path
            if f.severity > a.severity:  # an escalation is news: a new board episode
                a.severity = f.severity
                a.pending = True
                a.board_time = self.wall()
                self._add(key, a.member, "firing", f.severity, a.board_time)
            return
        back = self._resolving.pop(key, None)
        if back is not None:
            group = self._pending.get((f.kind, "resolved", False))
            if group is not None:
                group.members.pop(key, None)
            if self.peers is not None:
                self._peers_call(self.peers.forget, key, "resolved")
                # A flap: silent, unless a peer sent our resolve before we learned it.
                again = lambda: self._fire_after_peer_resolve(key, back)  # noqa: E731
                self._peers_call(self.peers.watch, key, "resolved", back.resolved_at, again, failed=True)
            self._active[key] = back
            self._post(key, back.member, "firing", back.severity, back.board_time)  # covered already
            return
        self._new_episode(key, f)

    def _new_episode(self, key: Key, f: Finding) -> None:
        starts = f.time if f.time is not None else self.wall()
        a = _Active(f.severity, self._member(key[1], f, starts), board_time=self.wall())
        self._active[key] = a
        self._add(key, a.member, "firing", f.severity, a.board_time)

    def _resolve(self, key: Key, f: Finding) -> None:
        a = self._active.pop(key, None)
        if a is None:
            return
        self._inherited.pop(key, None)
        self._owed.discard(key)
        for repeat in (False, True):
            group = self._pending.get((key[2], "firing", repeat))
            if group is not None:
                group.members.pop(key, None)
        if self.peers is not None:
            self._peers_call(self.peers.forget, key, "firing")
        m = self._member(key[1], f, a.member.starts_at)
        m.dump_path = m.dump_path or a.member.dump_path
        self._ended[key] = Remembered(
            key[1],
            key[2],
            a.severity.label,
            a.board_time,
            a.sent,
            a.member.step,
            _member_doc(m),
            ended=self.wall(),
            ended_step=f.step,
        )
        if not a.sent or not self.cfg.send_resolved:
            if self.peers is not None and self.cfg.send_resolved:
                # Not announced by us, but maybe by a peer before we learned it: then it is owed.
                owed = lambda: self._resolve_after_peer_fire(key, a, m)  # noqa: E731
                self._peers_call(self.peers.watch, key, "firing", a.board_time, owed, failed=True)
            self._post(key, a.member, "cleared", a.severity, self.wall())
            return
        self._resolving[key] = a
        a.resolved_at = self.wall()
        self._add(key, m, "resolved", a.severity, a.resolved_at)

    # --- restarts: the alert state file and the replayed log tail ---------------------------
    def replayed(self, findings: Iterable[Finding]) -> None:
        """What the detectors found in the log's tail, replayed at start (oldest first): compared
        with the alert state file once it is loaded (see ``state.py`` for the rule)."""
        if self._replayed is not None:
            self._replayed.extend(findings)
        else:
            self._adopt(list(findings))
            self._wake.set()

    def _restore(self, remembered: list[Remembered]) -> None:
        now = self.clock()
        saved = self.state.saved_at
        stale = saved is not None and self.wall() - saved > self.inherit_hold
        hold = 0.0 if stale else self.inherit_hold  # an earlier incarnation's: ended at once
        for rec in remembered:
            key: Key = (self.identity.run, rec.rank, rec.kind)
            if rec.rank is not None:
                self._ranks.add(rec.rank)
            try:
                sev = Severity.parse(rec.severity)
            except KeyError:
                continue
            m = clean_member(rec.member, rec.since)
            member = AlertMember(
                rec.rank, m["message"], m["step"], m["evidence"], m["dump_path"], m["starts_at"]
            )
            if rec.ended is not None:
                self._ended[key] = rec
                if rec.resolve_pending and rec.sent and self.cfg.send_resolved and key not in self._active:
                    # Killed before its resolve went out: it is still owed.
                    a = _Active(sev, member, sent=True, pending=False, board_time=rec.since)
                    a.resolved_at = rec.ended
                    self._resolving[key] = a
                    self._owed.add(key)
                    self._add(key, member, "resolved", sev, rec.ended)
                continue
            live = self._active.get(key)
            if live is not None:  # a live finding came first: the same episode
                if rec.sent and not live.sent:
                    live.sent, live.pending, live.board_time = True, False, rec.since
                    for repeat in (False, True):
                        group = self._pending.get((key[2], "firing", repeat))
                        if group is not None:
                            group.members.pop(key, None)
                continue
            a = _Active(sev, member, sent=rec.sent, pending=not rec.sent, last_sent=now, board_time=rec.since)
            self._active[key] = a
            self._inherited[key] = now + hold
            if rec.sent:
                self._post(key, member, "firing", sev, rec.since)
            else:  # never announced (killed inside group_wait or startup_quiet): it is now
                self._add(key, member, "firing", sev, rec.since)
        if remembered:
            log.info(
                "alert state %s: %d alert(s) firing, %d ended, from before the restart",
                self.state.path,
                len(self._inherited),
                len(self._ended),
            )

    def _restore_spooled(self, spooled: dict[Key, tuple[AlertMessage, AlertMember]]) -> None:
        """A firing in the spool was announced, whatever the state file says: the agent may have
        been killed after queueing it and before the state file was written."""
        now = self.clock()
        for key, (alert, m) in spooled.items():
            if alert.status != "firing" or key in self._ended:
                continue
            a = self._active.get(key)
            if a is None:
                member = dataclasses.replace(m, node=None)
                a = _Active(
                    alert.severity, member, sent=True, pending=False, last_sent=now, board_time=m.starts_at
                )
                self._active[key] = a
                self._inherited[key] = now + self.inherit_hold
                self._post(key, member, "firing", alert.severity, a.board_time)
            elif not a.sent:
                a.sent, a.pending = True, False
                for repeat in (False, True):
                    group = self._pending.get((key[2], "firing", repeat))
                    if group is not None:
                        group.members.pop(key, None)

    def _adopt(self, findings: list[Finding]) -> None:
        """Per alert, the replayed tail's last word: firing (the same episode, or a new one not
        reported yet) or resolved (it cleared while no agent ran)."""
        last: dict[Key, Finding] = {}
        for f in findings:
            rank = f.rank if f.rank is not None else self.identity.rank
            key: Key = (self.identity.run, rank, f.kind)
            last.pop(key, None)
            last[key] = f
        for key, f in last.items():
            if f.resolved:
                if key in self._active:
                    self._resolve(key, f)
                continue
            if f.severity < self.min_severity:
                continue
            if key not in self._active:
                old = self._ended.get(key)
                if old is not None and _same_episode(old, f):
                    continue
                log.warning(
                    "%s on rank %s happened while no agent watched (found in the replayed log at step %s):"
                    " alerting now",
                    f.kind,
                    key[1],
                    f.step,
                )
            if key[1] is not None:
                self._ranks.add(key[1])
            if key in self._owed:
                # The resolve owed from before the restart may have gone out just before the
                # kill: it is sent (again), and this firing is a new episode, not a flap.
                self._owed.discard(key)
                self._resolving.pop(key, None)
                self._new_episode(key, f)
                continue
            self._fire(key, f)

    def _expire_inherited(self, now: float) -> float:
        """Alerts inherited from before a restart that this agent has not seen again (the rule
        in ``state.py``); returns the next deadline."""
        due = float("inf")
        for key, deadline in list(self._inherited.items()):
            a = self._active.get(key)
            if a is None:
                del self._inherited[key]
            elif now >= deadline:
                del self._inherited[key]
                mins = self.inherit_hold / 60
                if key[2] in EVENT_KINDS:
                    log.info(
                        "%s on rank %s (from before the restart) forgotten after %.0f min",
                        key[2],
                        key[1],
                        mins,
                    )
                    self._active.pop(key, None)
                    self._ended[key] = Remembered(
                        key[1],
                        key[2],
                        a.severity.label,
                        a.board_time,
                        a.sent,
                        a.member.step,
                        ended=self.wall(),
                    )
                    continue
                what = f"{key[2]} on rank {key[1]}" if key[1] is not None else key[2]
                msg = (
                    f"{what}: not seen again by the restarted agent in {mins:.0f} min, so resolved by rule"
                    " (the condition could not be checked again after the agent restarted)"
                )
                self._resolve(key, Finding(key[2], a.severity, key[1], msg, resolved=True))
            else:
                due = min(due, deadline)
        return due

    def _state_alerts(self) -> list[Remembered]:
        out: list[Remembered] = []
        for (_, rank, kind), a in self._active.items():
            member = _member_doc(a.member)
            out.append(Remembered(rank, kind, a.severity.label, a.board_time, a.sent, a.member.step, member))
        prune_ended(self._ended, self.wall())
        for key, rec in self._ended.items():
            if key in self._active:
                continue
            pending = key in self._resolving
            if rec.resolve_pending != pending:
                rec = dataclasses.replace(rec, resolve_pending=pending)
            out.append(rec)
        return out

    def _save_state(self) -> None:
        """Write the state file if it changed (on a daemon thread; one write at a time)."""
        if self._replayed is not None or self.clock() < self._state_retry_at:
            return  # not loaded yet (never overwrite what we have not read), or failing
        if self._saving is not None and not self._saving.done():
            return  # its end wakes the loop, which comes back here
        alerts = self._state_alerts()
        doc = [dataclasses.asdict(a) for a in alerts]
        if doc == self._saved_doc:
            return
        self._saved_doc = doc
        self._saving = asyncio.ensure_future(self._write_state(alerts))

    async def _write_state(self, alerts: list[Remembered]) -> bool:
        meta = {"run": self.identity.run, "rank": self.identity.rank, "saved": self.wall()}
        try:
            await off_loop(
                self.state.save, alerts, meta, timeout=STATE_TIMEOUT_S, name="rankwatch-alert-state"
            )
            return True
        except Exception as e:
            self._saved_doc = None  # written again at the next try
            self._state_retry_at = self.clock() + STATE_RETRY_S
            self._state_errors += 1
            self.errors["alerts"] = self.errors.get("alerts", 0) + 1
            if self._state_errors == 1:
                log.error(
                    "alert state %s cannot be written (%s: %s); a restarted agent may repeat or miss"
                    " a resolve (further failures counted)",
                    self.state.path,
                    type(e).__name__,
                    e,
                )
            return False
        finally:
            self._wake.set()

    def _resolve_after_peer_fire(self, key: Key, a: _Active, m: AlertMember) -> None:
        """A peer announced this alert, which cleared before we learned it: send its resolve."""
        if self._closed or key in self._active or key in self._resolving:
            return  # firing again (its announcement stands) or already resolving
        a.sent = True
        self._resolving[key] = a
        a.resolved_at = self.wall()
        self._add(key, m, "resolved", a.severity, a.resolved_at)
        self._wake.set()

    def _fire_after_peer_resolve(self, key: Key, a: _Active) -> None:
        """A peer sent our resolve, and we fired again before we learned it: a new episode."""
        if self._closed or self._active.get(key) is not a:
            return
        a.sent, a.pending = False, True
        a.board_time = self.wall()
        a.member = dataclasses.replace(a.member, starts_at=a.board_time)
        self._add(key, a.member, "firing", a.severity, a.board_time)
        self._wake.set()

    def _add(
        self, key: Key, m: AlertMember, status: Status, severity: Severity, when: float, repeat: bool = False
    ) -> None:
        gk: GroupKey = (key[2], status, repeat)
        g = self._pending.get(gk)
        if g is None:
            g = _Group(key[2], status, self.clock() + self.cfg.group_wait, severity, repeat=repeat)
            self._pending[gk] = g
        g.severity = max(g.severity, severity)
        g.members[key] = m
        g.times[key] = when
        self._post(key, m, status, severity, when)

    def _post(self, key: Key, m: AlertMember, state: str, severity: Severity, when: float) -> None:
        if self.peers is not None:
            self._peers_call(self.peers.post, key, m, state, severity, when)

    def set_dump_path(self, rank: int | None, path: str | Path) -> None:
        """Where the stacks of ``rank`` are; shown in messages built from now on."""
        self._dumps[rank] = str(path)
        for (_, r, _), a in self._active.items():
            if r == rank and not a.member.dump_path:
                a.member.dump_path = str(path)

    def note(self, text: str) -> None:
        """The agent's dump notice ("stack dumps for rank R: PATH") sets the dump path."""
        m = re.match(r"stack dumps for rank (\w+): (.+)$", text.strip())
        if m:
            self.set_dump_path(int(m[1]) if m[1].isdigit() else None, m[2])

    def refresh_policy(self) -> None:
        """Re-read the policy values parsed at start (config hot reload changed ``cfg`` in place)."""
        self.min_severity = Severity.parse(self.cfg.min_severity)
        self._wake.set()

    def wake(self) -> None:
        """Re-evaluate timers now (tests with a fake clock call it after advancing)."""
        self._wake.set()
        for w in self._workers.values():
            w.wake.set()

    # --- timers ----------------------------------------------------------------------------
    def pump(self, now: float, *, force: bool = False) -> float:
        """Move due groups, repeats and refreshes into the sink queues; returns the next due time."""
        due = float("inf") if force else self._expire_inherited(now)
        quiet_end = (
            -float("inf") if force else (now if self._t0 is None else self._t0) + self.cfg.startup_quiet
        )
        for gk, g in list(self._pending.items()):
            if not g.members:
                del self._pending[gk]
                continue
            ready = max(g.deadline, quiet_end) if not force else now
            if now >= ready:
                del self._pending[gk]
                if (
                    force
                    or self.peers is None
                    or not self._peers_call(self.peers.hold, g, now, failed=False, alone=1)
                ):
                    self._emit(g, now)
            else:
                due = min(due, ready)
        sent = [(k, a) for k, a in self._active.items() if a.sent and not a.pending]
        interval = self.cfg.repeat_interval
        if interval > 0 and sent and not force:
            repeat = [(k, a) for k, a in sent if now - a.last_sent >= interval]
            for kind in sorted({k[2] for k, _ in repeat}):
                group = [(k, a) for k, a in repeat if k[2] == kind]
                for _, a in group:
                    a.last_sent = now
                if self.peers is not None and self.peers.usable(now):
                    for k, a in group:  # peers repeat too: one "still firing" between them
                        a.board_time = self.wall()
                        self._add(k, dataclasses.replace(a.member), "firing", a.severity, a.board_time, True)
                    due = min(due, now + self.cfg.group_wait)
                    continue
                self._enqueue(self._message(kind, "firing", group, repeat=True), self._workers.values())
            due = min(due, *(a.last_sent + interval for _, a in sent))
        for w in self._workers.values():
            if not w.refresh_interval or force:
                continue
            if now >= w.next_refresh:
                w.next_refresh = now + w.refresh_interval
                if sent and not w.queue:
                    for kind in sorted({k[2] for k, _ in sent}):
                        msg = self._message(kind, "firing", [(k, a) for k, a in sent if k[2] == kind])
                        self._enqueue(msg, [w], refresh=True)
            if sent:
                due = min(due, w.next_refresh)
        return due

    def _message(
        self, kind: str, status: Status, actives: list[tuple[Key, _Active]], *, repeat: bool = False
    ) -> AlertMessage:
        members = [dataclasses.replace(a.member) for _, a in sorted(actives, key=_rank_order)]
        sev = max(a.severity for _, a in actives)
        return self._finish(
            AlertMessage(
                self.identity.run,
                kind,
                sev,
                status,
                members,
                self.identity.node,
                self.identity.world_size,
                saw_all=self._saw_all(),
                repeat=repeat,
            )
        )

    def _saw_all(self, extra: set[int] | None = None) -> bool:
        """Every rank of the world is known to exist, so "N of WORLD ranks" is a fact."""
        world = self.identity.world_size
        if not world:
            return False
        known = self._ranks | (extra or set())
        return all(r in known for r in range(world))

    def _finish(self, msg: AlertMessage) -> AlertMessage:
        for m in msg.members:
            m.dump_path = m.dump_path or self._dumps.get(m.rank)
        msg.grafana_url = render_link(self.cfg.grafana_url, msg.run, msg.rank, msg.kind)
        if msg.status == "resolved":
            msg.ends_at = self.wall()
        return msg

    def _emit(self, g: _Group, now: float, *, saw_all: bool | None = None) -> None:
        keys = sorted(g.members, key=lambda k: (k[1] is None, k[1] or 0))
        members = [dataclasses.replace(g.members[k]) for k in keys]
        msg = AlertMessage(
            self.identity.run,
            g.kind,
            g.severity,
            g.status,
            members,
            self.identity.node,
            self.identity.world_size,
            saw_all=self._saw_all() if saw_all is None else saw_all,
            repeat=g.repeat,
        )
        self._by_peer(g, keys, now)
        self._enqueue(self._finish(msg), self._workers.values())

    def _by_peer(self, g: _Group, keys: list[Key], now: float) -> None:
        """These members are announced (by us, or by the peer that led the group)."""
        for k in keys:
            a = self._active.get(k)
            if g.status == "firing" and a is not None:
                a.sent, a.pending, a.last_sent = True, False, now
            elif g.status == "resolved":
                self._resolving.pop(k, None)
                self._owed.discard(k)

    def _enqueue(self, msg: AlertMessage, workers: Iterable[_Worker], *, refresh: bool = False) -> None:
        for w in workers:
            w.queue.append(_Item(msg, f"{msg.id}:{w.name}", refresh=refresh))
            while len(w.queue) > MAX_QUEUE:
                self._drop(w, w.queue.popleft(), "the in-memory queue is full")
            w.wake.set()

    # --- lifecycle -----------------------------------------------------------------------
    async def _start(self) -> None:
        """Once, however many callers: ``close`` may come while ``run`` is still starting (two
        starts made two workers per sink, which delivered one alert twice)."""
        if self._starting is None:
            self._started = True
            self._starting = asyncio.ensure_future(self._start_once())
        await asyncio.shield(self._starting)

    async def _start_once(self) -> None:
        self._t0 = self.clock()
        entries = await self._spool_op(self.spool.load) or []
        seen: set[str] = set()
        orphans: dict[str, str] = {}  # entry id -> sink name
        spooled: dict[Key, tuple[AlertMessage, AlertMember]] = {}  # the last spooled word per alert
        for e in entries:
            if e.id in seen:
                continue
            seen.add(e.id)
            w = self._workers.get(e.sink)
            try:
                alert = AlertMessage.from_json(e.alert)
            except (TypeError, KeyError, ValueError):
                alert = None
            if w is None or alert is None:
                orphans[e.id] = e.sink
                continue
            w.queue.append(_Item(alert, e.id, spooled=True))
            for m in alert.members:
                k: Key = (self.identity.run, m.rank, alert.kind)
                spooled.pop(k, None)
                spooled[k] = (alert, m)
        if seen:
            log.info(
                "alert spool %s: %d undelivered alert(s) re-queued", self.spool.path, len(seen) - len(orphans)
            )
        if orphans:
            self._drop_orphans(orphans)
            await self._spool_op(self.spool.remove, set(orphans))
        for w in self._workers.values():
            if w.task is None or w.task.done():
                w.task = asyncio.get_running_loop().create_task(self._work(w), name=f"alerts-{w.name}")
        try:
            remembered = await off_loop(
                self.state.load, timeout=STATE_TIMEOUT_S, name="rankwatch-alert-state"
            )
        except Exception as e:
            remembered = []
            self.errors["alerts"] = self.errors.get("alerts", 0) + 1
            log.error(
                "alert state %s unreadable (%s: %s); starting without it",
                self.state.path,
                type(e).__name__,
                e,
            )
        replayed, self._replayed = self._replayed or [], None
        mine = set(self._ranks)
        self._restore(remembered)
        self._restore_spooled({k: v for k, v in spooled.items() if k[1] in mine or k[1] is None})
        self._adopt(replayed)
        self._wake.set()

    async def run(self) -> None:
        """The timer loop (grouping, quiet, repeats, refreshes); sinks run in their own tasks."""
        await self._start()
        while not self._closed:
            self._wake.clear()
            due = self.pump(self.clock())
            if self.peers is not None:
                due = min(due, await self._peers_step(self.clock()))
            self._save_state()
            if self._state_retry_at > self.clock():
                due = min(due, self._state_retry_at)
            await _wait(self._wake, due - self.clock())

    async def close(self, timeout: float = 10.0) -> None:
        """Send what can be sent within ``timeout`` (real seconds), spool the rest."""
        if self._closed:
            return
        await self._start()
        deadline = time.monotonic() + max(0.0, timeout)
        for w in self._workers.values():
            if w.task is None or w.task.done():  # run() was cancelled with its workers: flush anyway
                w.task = asyncio.get_running_loop().create_task(self._work(w), name=f"alerts-{w.name}")
        if self.peers is not None:
            # Agents of a crashed job close together: decide on the board now rather than
            # each sending alone, within half the budget (the rest is for delivery).
            now = self.clock()
            for g in list(self._pending.values()):
                if g.members and self._peers_call(self.peers.hold, g, now, failed=False, alone=1):
                    del self._pending[(g.kind, g.status, g.repeat)]
            if self.peers.waiting:
                budget = min(float(self.cfg.board_takeover), max(0.0, timeout) / 2)
                try:
                    await self.peers.settle(budget)
                except Exception as e:
                    self._peers_failed(e)
        self.pump(self.clock(), force=True)
        for w in self._workers.values():
            w.queue = deque(i for i in w.queue if not i.refresh)
        while any(w.queue for w in self._workers.values()) and time.monotonic() < deadline:
            await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))
        self._closed = True
        self._wake.set()
        await _cancel([w.task for w in self._workers.values() if w.task is not None])
        await self._final_state()
        rest: list[SpoolEntry] = []
        for w in self._workers.values():
            for item in w.queue:
                if not item.spooled and not item.refresh and not item.dropped:
                    rest.append(SpoolEntry(item.entry_id, w.name, item.alert.to_json(), item.attempts))
                    item.spooled = True
        if rest:
            log.warning(
                "%d undelivered alert(s) written to %s for the next start", len(rest), self.spool.path
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._append(rest), 10.0)
        for s in self.sinks:
            aclose = getattr(s, "aclose", None)
            if callable(aclose):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(aclose(), 2.0)

    async def _final_state(self) -> None:
        if self._saving is not None and not self._saving.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._saving), STATE_TIMEOUT_S)
        self._state_retry_at = -float("inf")
        self._save_state()
        if self._saving is not None and not self._saving.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._saving), STATE_TIMEOUT_S)

    # --- delivery ------------------------------------------------------------------------
    async def _work(self, w: _Worker) -> None:
        hard_timeout = float(getattr(w.sink, "timeout", 30.0)) + 5.0
        while True:
            w.wake.clear()
            while w.queue and w.queue[0].dropped:
                w.queue.popleft()
            if not w.queue:
                await _wait(w.wake, None)
                continue
            item = w.queue[0]
            now = self.clock()
            if item.not_before > now:
                await self._spool_backlog(w)
                await _wait(w.wake, item.not_before - now)
                continue
            pause = w.bucket.wait_time(now)
            if pause > 0:
                await self._spool_backlog(w)  # held back by the rate limit: on disk meanwhile
                await _wait(w.wake, pause)
                continue
            alert = self._deliverable(w, item)
            if alert is None:
                _discard(w.queue, item)
                if item.spooled:
                    await self._spool_op(self.spool.remove, {item.entry_id})
                continue
            w.bucket.take()
            try:
                await asyncio.wait_for(w.sink.deliver(alert), hard_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                err = e if isinstance(e, DeliveryError) else DeliveryError(f"{type(e).__name__}: {e}")
                if not isinstance(e, DeliveryError):
                    log.debug("sink %s raised", w.name, exc_info=True)
                await self._failed(w, item, err)
            else:
                self.stats[w.name]["sent"] += 1
                if alert.status == "firing":
                    w.lost.difference_update((m.rank, alert.kind) for m in alert.members)
                _discard(w.queue, item)
                if item.spooled:
                    await self._spool_op(self.spool.remove, {item.entry_id})

    def _deliverable(self, w: _Worker, item: _Item) -> AlertMessage | None:
        """The alert as this sink may get it: a resolve without the members whose firing this
        sink never got (None when that is all of them: a resolve of nothing is not sent)."""
        alert = item.alert
        if alert.status != "resolved" or not w.lost:
            return alert
        keep = [m for m in alert.members if (m.rank, alert.kind) not in w.lost]
        if len(keep) == len(alert.members):
            return alert
        gone = sorted((m.rank for m in alert.members if (m.rank, alert.kind) in w.lost), key=str)
        w.lost.difference_update((r, alert.kind) for r in gone)
        log.warning(
            "alert %r to %s: not resolving rank(s) %s there, whose firing it never got",
            alert.title,
            w.name,
            ", ".join(map(str, gone)),
        )
        if not keep:
            return None
        return dataclasses.replace(alert, members=keep)

    async def _failed(self, w: _Worker, item: _Item, err: DeliveryError) -> None:
        self.stats[w.name]["failed"] += 1
        if item.refresh:
            _discard(w.queue, item)
            return
        item.attempts += 1
        if err.permanent or item.attempts > self.cfg.max_retries:
            why = "permanent error" if err.permanent else f"gave up after {item.attempts} attempts"
            self._drop(w, item, f"{why}: {err}")
            if item.alert.status == "firing":
                w.lost.update((m.rank, item.alert.kind) for m in item.alert.members)
            _discard(w.queue, item)
            if item.spooled:
                await self._spool_op(self.spool.remove, {item.entry_id})
            return
        cap = min(float(self.cfg.backoff_max), self.backoff_base * 2 ** (item.attempts - 1))
        delay = cap / 2 + self.rng() * cap / 2
        if err.retry_after is not None:
            # A server's wish, within our own ceiling: one absurd Retry-After must not park the
            # queue, and a short one must not burn the retry budget in seconds.
            delay = max(delay, min(max(0.0, err.retry_after), float(self.cfg.backoff_max)))
        item.not_before = self.clock() + delay
        self.stats[w.name]["retried"] += 1
        log.info(
            "alert %r to %s failed (%s); retry %d in %.1fs",
            item.alert.title,
            w.name,
            err,
            item.attempts,
            delay,
        )
        await self._spool_backlog(w)

    async def _spool_backlog(self, w: _Worker) -> None:
        """While a sink fails, everything queued for it is undelivered: put it on disk."""
        fresh = [i for i in w.queue if not (i.spooled or i.refresh or i.dropped)]
        for i in fresh:
            i.spooled = True
        if fresh:
            await self._append([SpoolEntry(i.entry_id, w.name, i.alert.to_json(), i.attempts) for i in fresh])

    def _drop_orphans(self, orphans: dict[str, str]) -> None:
        """Undelivered alerts nobody can deliver any more are losses like any other: counted
        under the sink they were meant for (so a removed or renamed sink shows its loss)."""
        by_sink: dict[str, int] = {}
        for sink in orphans.values():
            by_sink[sink] = by_sink.get(sink, 0) + 1
        for sink, n in sorted(by_sink.items()):
            counts = self.stats.setdefault(sink, {"sent": 0, "failed": 0, "dropped": 0, "retried": 0})
            counts["dropped"] += n
            known = "unreadable" if sink in self._workers else "no longer configured"
            log.error("alert spool: %d alert(s) for sink %s dropped (%s)", n, sink, known)

    def _drop(self, w: _Worker, item: _Item, why: str) -> None:
        if item.dropped:
            return
        item.dropped = True
        self.stats[w.name]["dropped"] += 1
        log.error("alert %r (run %s) to %s dropped: %s", item.alert.title, item.alert.run, w.name, why)

    async def _append(self, entries: list[SpoolEntry]) -> None:
        lost = await self._spool_op(self.spool.append, entries) or []
        for e in lost:
            w = self._workers.get(e.sink)
            item = next((i for i in w.queue if i.entry_id == e.id), None) if w else None
            if w is not None and item is not None:
                self._drop(w, item, f"spool full ({self.cfg.spool_max_bytes} bytes), oldest dropped")
            elif w is not None:
                self.stats[w.name]["dropped"] += 1
                log.error("alert %s to %s dropped: spool full", e.id, e.sink)

    async def _spool_op(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self._spool_lock:
            try:
                return await asyncio.to_thread(fn, *args)
            except OSError as e:
                self._spool_errors += 1
                self.errors["alerts"] = self.errors.get("alerts", 0) + 1
                if self._spool_errors == 1:
                    log.error(
                        "alert spool %s unusable (%s); undelivered alerts will not survive a restart",
                        self.spool.path,
                        e,
                    )
                return None


def retry_window(cfg: AlertsConfig, backoff_base: float = BACKOFF_BASE_S) -> float:
    """The shortest time between an alert's first failed attempt and its being given up: the sum
    of the fixed halves of its ``max_retries`` waits (705 s with the defaults)."""
    cap = float(cfg.backoff_max)
    return float(sum(min(cap, backoff_base * 2**n) / 2 for n in range(max(0, int(cfg.max_retries)))))


def _member_doc(m: AlertMember) -> dict[str, Any]:
    return {
        "message": m.message[:MAX_TEXT],
        "step": m.step,
        "evidence": small_evidence(m.evidence),
        "dump_path": m.dump_path,
        "starts_at": m.starts_at,
    }


def _same_episode(old: Remembered, f: Finding) -> bool:
    """A replayed firing of an alert that ended before the restart is that old episode when it
    is not later than the end (by step where both are known, else by time); in doubt, new."""
    if f.step is not None and old.ended_step is not None:
        return f.step <= old.ended_step
    if f.time is not None and old.ended is not None:
        return f.time <= old.ended
    return False


def _rank_order(ka: tuple[Key, _Active]) -> tuple[bool, int]:
    r = ka[0][1]
    return (r is None, r or 0)


def _discard(q: deque[_Item], item: _Item) -> None:
    with contextlib.suppress(ValueError):
        q.remove(item)


async def _cancel(tasks: list[asyncio.Task[Any]], limit_s: float = 5.0) -> None:
    """Cancel and reap. Cancelled again until done: on Python 3.11 ``asyncio.wait_for`` swallows a
    cancel that lands as its awaitable completes (a wake at that moment), and a single cancel
    left ``close`` waiting forever on a worker that went back to sleep."""
    pending = {t for t in tasks if not t.done()}
    end = time.monotonic() + limit_s
    while pending and time.monotonic() < end:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.05)
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: a worker that died is not reported again at exit


async def _wait(event: asyncio.Event, timeout: float | None) -> None:
    if timeout is not None:
        if timeout <= 0:
            return
        timeout = min(timeout, 3600.0)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
