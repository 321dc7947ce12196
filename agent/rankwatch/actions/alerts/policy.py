"""Alert policy: which findings become which messages, and when. A synchronous state machine on
an injected clock: no I/O, no asyncio, unit-testable with plain calls (``take``, ``pump``).

- An alert is a finding with severity >= ``min_severity``; it is identified by the run and
  the finding's key (kind, rank, subject): two GPUs of one rank are two alerts, and the first
  to cool resolves only its own. A second firing of an active alert is not re-sent (a higher
  severity is, as an escalation); ``repeat_interval`` re-sends still-active ones; a resolved
  finding closes it and, with ``send_resolved``, sends a resolve message.
- Grouping: the findings of one kind (and status) arriving within ``group_wait`` of the
  first become one message, "stall on 7 of 8 ranks, suspect rank 2" (see
  ``message.suspect_rank``). A resolve that arrives before its firing left the group
  cancels both; a re-firing that arrives before its resolve left cancels both (flapping
  stays silent). "of 8" only when every rank of the world is known to exist (watched
  here, or present on the board), else "7 ranks (0-6)".
- Startup quiet: for ``startup_quiet`` after ``start`` groups are held, not dropped; when
  the window ends, what is still active is sent (one message per kind), and what resolved
  meanwhile is forgotten. ``pump(force=True)`` sends held alerts at once (at close: a crash
  in the first minute must not be lost because the agent exits with it).
- Restarts (``restart``, rule in ``state.py``): a restarted agent takes its alerts back,
  announces those it had not, sends a resolve it still owed, and compares the findings of the
  replayed log tail with them: the same episode is not sent again, one that cleared while no
  agent ran is resolved, and one no agent reported is sent once. An alert it cannot re-detect
  is resolved by rule after ``inherit_hold``. A firing found in the spool counts as announced.
- Across agents: an optional ``Coordinator`` (``peers.PeerGroups`` over the alert board) is
  told of every alert state (``post``) and may take a due group (``hold``) to send one
  message for the agents of a run; it hands groups back through ``emit``/``announced``. Any
  error it raises sends alone (logged once, counted as ``fallback``): a duplicate is
  acceptable, a lost alert is not.

Messages leave through ``out`` (the dispatcher's delivery queues them per sink).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rankwatch.actions.alerts.board import MAX_TEXT, clean_member, small_evidence
from rankwatch.actions.alerts.message import (
    AlertMember,
    AlertMessage,
    Status,
    jsonable,
    render_link,
    render_report_link,
)
from rankwatch.actions.alerts.state import EVENT_KINDS, INHERIT_HOLD_S, Remembered, prune_ended
from rankwatch.actions.dump_outcome import DumpOutcome, dump_link
from rankwatch.config.schema import AlertsConfig
from rankwatch.errorkinds import OWN_FAILURES, PEER_FAILURES
from rankwatch.identity import Identity
from rankwatch.records import Finding, Severity

log = logging.getLogger("rankwatch.alerts")

Key = tuple[str, int | None, str, str | None]  # (run, rank, kind, subject): Finding.key and the run
# A job's failures: one rank's crash after its own OOM, its peers' gloo errors after it, are one
# problem and one alert (``_problem_of``), within this long of the first (diagnose's window).
FAILURE_FAMILY = frozenset({*OWN_FAILURES, *PEER_FAILURES})  # the cross-rank judgement's kinds
FOLD_WINDOW_S = 600.0
# A slow rank's problem: its straggler finding and every rank's throughput drop that the
# straggler verdict explains (their diagnosis names it) are one alert (``_problem_of``).
SLOWDOWN_FAMILY = frozenset({"straggler", "throughput_drop"})
# A hang's problem: every rank's stall that names the same suspect or incident is one alert,
# however late a rank is judged (``_problem_of``).
HANG_FAMILY = frozenset({"stall"})
# A rank's loss blowing up: the spike, the rise that follows and the NaN or inf it ends in are
# one problem (``_blowup_of``); the critical NaN after a sent warning still pages.
LOSS_FAMILY = frozenset({"loss_spike", "loss_divergence", "nan_loss"})
MAX_RUN_WORLDS = 256  # runs whose world size is remembered (a node daemon outlives many jobs)
GroupKey = tuple[str, Status, bool]  # (kind, status, repeat)


@dataclass(eq=False)
class Active:
    severity: Severity
    member: AlertMember
    sent: bool = False  # announced at least once
    pending: bool = True  # in a firing group not yet emitted
    last_sent: float = 0.0
    board_time: float = 0.0  # wall clock of this episode's board record
    resolved_at: float = 0.0  # wall clock of its resolve's board record
    # The id of the message that first announced this episode: its repeats and its resolve
    # carry it, so a receiver that matches by id closes what it opened.
    alert_id: str | None = None


@dataclass(eq=False)
class Group:
    """Members of one kind and status waiting to leave as one message."""

    kind: str
    status: Status
    deadline: float
    severity: Severity
    members: dict[Key, AlertMember] = field(default_factory=dict)
    repeat: bool = False
    times: dict[Key, float] = field(default_factory=dict)  # board record time per member


class Coordinator(Protocol):
    """Cross-agent coordination (``peers.PeerGroups``); every call synchronous and cheap, its
    I/O done by its own ``step`` that the dispatcher drives. Any call may raise: the policy then
    takes back what it held (``abandon``) and sends alone."""

    stats: dict[str, int]

    @property
    def where(self) -> str: ...
    def usable(self, now: float) -> bool: ...
    def post(self, key: Key, m: AlertMember, state: str, severity: Severity, when: float) -> None: ...
    def hold(self, g: Group, now: float) -> bool: ...
    def forget(self, key: Key, status: str) -> None: ...
    def watch(self, key: Key, status: str, since: float, then: Callable[[], None]) -> bool: ...
    def abandon(self) -> tuple[list[Group], list[Callable[[], None]]]: ...


class AlertPolicy:
    def __init__(
        self,
        cfg: AlertsConfig,
        identity: Identity,
        out: Callable[[AlertMessage], None],
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
        errors: dict[str, int] | None = None,
        ranks: Iterable[int] = (),
        inherit_hold: float = INHERIT_HOLD_S,
        new_job: bool = False,
    ) -> None:
        """``out``: where a message goes once decided; ``ranks``: the ranks this agent watches
        (for "N of WORLD"); ``errors``: the agent's internal-error counters; ``new_job``: the
        agent started the job itself (``run``), so what the state file holds as firing is of an
        earlier job, never this one's (``_restore``)."""
        self.cfg = cfg
        self.identity = identity
        self.out = out
        self.clock = clock
        self.wall = wall
        self.errors = errors if errors is not None else {}
        self.min_severity = Severity.parse(cfg.min_severity)
        self.inherit_hold = float(inherit_hold)
        self.new_job = new_job
        self.coord: Coordinator | None = None
        self.closed = False
        self.peer_errors = 0
        self.ranks: set[int] = {r for r in ranks if r is not None}
        if identity.rank is not None:
            self.ranks.add(identity.rank)
        # The ranks known to exist, per run: a node daemon's two jobs each count their own
        # toward "N of WORLD" (``self.ranks``, every run's, is what the board is told).
        self._run_ranks: dict[str, set[int]] = {identity.run: set(self.ranks)}
        self._ended: dict[Key, Remembered] = {}  # alerts that ended (replay tells old from new)
        self._inherited: dict[Key, float] = {}  # firing at start, not yet seen again -> deadline
        self._owed: set[Key] = set()  # resolves owed from before the restart, not yet announced
        self._replayed: list[Finding] | None = []  # None once the state is loaded
        self._replaying = False  # ``_adopt`` is firing what a replayed history held
        self._active: dict[Key, Active] = {}
        self._resolving: dict[Key, Active] = {}
        self._pending: dict[GroupKey, Group] = {}
        self._dumps: dict[int | None, str] = {}
        self._t0: float | None = None
        # Each run's world size, as its findings carry it (the watched processes' own): a node
        # daemon's or a ``watch --pid`` agent's own identity has none. The newest runs kept.
        self._worlds: dict[str, int] = {}

    def start(self, now: float) -> None:
        """The startup quiet window begins."""
        if self._t0 is None:
            self._t0 = now

    # --- the coordinator, guarded: any error in it sends alone, never loses an alert ------
    def coordination_failed(self, e: BaseException, alone: int = 0) -> None:
        """Take back what the coordinator held and send it alone; it is set aside for a while.
        ``alone``: groups the caller sends alone because of it (counted as fallbacks too)."""
        peers = self.coord
        assert peers is not None
        self.peer_errors += 1
        self.errors["alerts"] = self.errors.get("alerts", 0) + 1
        if self.peer_errors == 1:
            log.error(
                "alert board %s: coordination failed (%s: %s); each agent sends its own alerts"
                " (further errors counted)",
                peers.where,
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
            self.emit(g, now)
        for then in thens:  # in doubt whether a peer sent it: act as if it did
            try:
                then()
            except Exception:
                log.debug("alert board watch failed", exc_info=True)

    def _peers_call(self, fn: Callable[..., Any], *args: Any, failed: Any = None, alone: int = 0) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            self.coordination_failed(e, alone)
            return failed

    def take(self, f: Finding) -> None:
        """A finding in: fires, updates or resolves its alert. Never blocks."""
        if self.closed:
            return
        rank = f.rank if f.rank is not None else self.identity.rank
        key: Key = (f.run or self.identity.run, rank, f.kind, f.subject)  # two jobs' rank 0: two alerts
        self._saw(key[0], rank)
        if f.world_size and self._worlds.get(key[0]) != f.world_size:
            self._worlds.pop(key[0], None)
            self._worlds[key[0]] = f.world_size
            while len(self._worlds) > MAX_RUN_WORLDS:
                del self._worlds[next(iter(self._worlds))]
        if f.resolved:
            self._resolve(key, f)
        elif f.severity >= self.min_severity:
            self._fire(key, f)

    def _saw(self, run: str, rank: int | None) -> None:
        """``rank`` of ``run`` exists; the newest ``MAX_RUN_WORLDS`` runs are kept."""
        if rank is None:
            return
        self.ranks.add(rank)
        known = self._run_ranks.pop(run, None) or set()
        known.add(rank)
        self._run_ranks[run] = known
        while len(self._run_ranks) > MAX_RUN_WORLDS:
            del self._run_ranks[next(iter(self._run_ranks))]

    def _member(self, rank: int | None, f: Finding, starts_at: float) -> AlertMember:
        dump = dump_link(f) or self._dumps.get(rank)
        return AlertMember(
            rank,
            f.message,
            f.step,
            jsonable(f.evidence),
            str(dump) if dump else None,
            starts_at,
            None,
            subject=f.subject,
            diagnosis=f.diagnosis,
            user=f.user,
        )

    def _fire(self, key: Key, f: Finding) -> None:
        a = self._active.get(key)
        if a is not None:
            self._inherited.pop(key, None)  # seen again: the same episode, resolved by its detector
            fresh = self._member(key[1], f, a.member.starts_at)
            a.member.message, a.member.step, a.member.evidence = fresh.message, fresh.step, fresh.evidence
            a.member.diagnosis = fresh.diagnosis or a.member.diagnosis
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
            if self.coord is not None:
                self._peers_call(self.coord.forget, key, "resolved")
                # A flap: silent, unless a peer sent our resolve before we learned it.
                again = lambda: self._fire_after_peer_resolve(key, back)  # noqa: E731
                self._peers_call(self.coord.watch, key, "resolved", back.resolved_at, again, failed=True)
            self._active[key] = back
            self._post(key, back.member, "firing", back.severity, back.board_time)  # covered already
            return
        self._new_episode(key, f)

    def _new_episode(self, key: Key, f: Finding) -> None:
        starts = f.time if f.time is not None else self.wall()
        a = Active(f.severity, self._member(key[1], f, starts), board_time=self.wall())
        self._active[key] = a
        problem = self._problem_of(key, f, starts)
        if problem is not None:
            # Part of a failure this agent already alerts: no message of its own. It stays
            # active (its resolve, its escalation above an announced alert, are its own).
            lead = self._active[problem]
            g = next(
                (g for g in self._pending.values() if problem in g.members and g.status == "firing"), None
            )
            # Not in a waiting group, yet not announced: the coordinator holds its group (the
            # board decides who sends it; at close, the agent's last findings come meanwhile).
            # Not when the problem's first failure is another rank's alerted failure (rank 1's
            # OOM, seen by its own agent): the board folds the held lead into that alert, and
            # this member follows it there; a rank that left cleanly has no alert of its own.
            d = f.diagnosis
            ff = d.first_failure if d is not None else None
            elsewhere = ff is not None and ff.rank not in (None, key[1]) and ff.kind != "exit"
            held = g is None and lead.pending and not lead.sent and not elsewhere
            if (g is not None or held) and f.severity > lead.severity and problem[2] != key[2]:
                # Not yet sent, and this member is worse (rank 1's crash after its gloo warning):
                # it leads the problem's alert, so the message's kind and severity are the job's
                # death, not its first symptom. The old lead is folded into it (taken back from
                # the coordinator: a page routed on critical must not leave as a warning).
                if g is not None:
                    g.members.pop(problem, None)
                    g.times.pop(problem, None)
                lead.pending = False
                if self.coord is not None:
                    self._peers_call(self.coord.forget, problem, "firing")
                self._add(key, a.member, "firing", f.severity, a.board_time)
                return
            a.pending = False
            if g is not None:
                g.severity = max(g.severity, f.severity)
            return
        self._add(key, a.member, "firing", f.severity, a.board_time)

    def _problem_of(self, key: Key, f: Finding, starts: float) -> Key | None:
        """The failure alert of this agent that ``f`` is part of: one problem, one alert. A rank's
        crash after its own OOM, CUDA or peer error is that error's end; a rank's failure whose
        first failure is another rank's (gloo's ``Connection closed by peer`` after rank 1 died)
        is part of the first failure's alert. A failure that is its own first failure is never
        folded into another rank's alert. One more severe than the alert it would join, once that
        is sent, is news (an alert routed on ``min_severity: critical`` must page when the job
        dies, whatever warning went first); before it is sent, it leads it (``_new_episode``)."""
        if key[2] in SLOWDOWN_FAMILY:
            return self._slowdown_of(key, f, starts)
        if key[2] in HANG_FAMILY:
            return self._hang_of(key, f, starts)
        if key[2] in LOSS_FAMILY:
            return self._blowup_of(key, f, starts)
        if key[2] not in FAILURE_FAMILY:
            return None
        d = f.diagnosis
        # Failed as another rank did: one problem. While that one's alert waits, this joins its
        # group (the alert counts both ranks and names no suspect); once sent, it folds.
        if (
            d is not None
            and d.verdict == "same_failure"
            and any(k != key and k[0] == key[0] and k[2] == key[2] and self._waiting(k) for k in self._active)
        ):
            return None
        first = d.first_failure.rank if d is not None and d.first_failure is not None else None
        caused_by = d.suspect if d is not None and d.suspect is not None else first
        consequence = caused_by is not None and caused_by != key[1]
        for k, a in self._active.items():
            # A consequence of a hang (a peer's collective timeout after a stall named the
            # rank that hung) is part of that stall's alert.
            hang = consequence and k[2] in HANG_FAMILY
            if (
                k == key
                or k[0] != key[0]
                or (k[2] not in FAILURE_FAMILY and not hang)
                or (k[2] == key[2] and k[1] == key[1])
            ):
                continue
            if abs(a.member.starts_at - starts) > FOLD_WINDOW_S:
                continue
            if a.sent and f.severity > a.severity:
                continue  # worse than announced (a crash after a sent warning): news, it pages
            if not a.pending and not a.sent:
                continue  # itself folded into another: fold into that one instead
            theirs = a.member.diagnosis.suspect if a.member.diagnosis is not None else None
            if k[1] == key[1] or (consequence and caused_by in (k[1], theirs)):
                return k
        return None

    def _blowup_of(self, key: Key, f: Finding, starts: float) -> Key | None:
        """The alert of this rank's loss already out (or waiting) that ``f`` continues: a loss
        that jumps, keeps rising and ends in inf or NaN (the s40 tester's l13: spike at step 12,
        divergence at 14, inf at 17) is one problem, not three pages. Worse than what was
        announced (the NaN, critical, after a sent warning) is news."""
        for k, a in self._active.items():
            if k == key or k[0] != key[0] or k[1] != key[1] or k[2] not in LOSS_FAMILY:
                continue
            if not a.pending and not a.sent:
                continue  # itself folded into another
            if abs(a.member.starts_at - starts) > FOLD_WINDOW_S:
                continue
            if a.sent and f.severity > a.severity:
                continue  # worse than announced: news
            return k
        return None

    def _slowdown_of(self, key: Key, f: Finding, starts: float) -> Key | None:
        """The alert of this run's slowdown that names the same straggler as ``f``: a rank that
        works while its peers wait slows every rank, and the straggler finding and the drops it
        explains are one problem, one alert naming that rank. One of the same kind still
        waiting joins its group instead (the alert counts the ranks)."""
        suspect = f.diagnosis.suspect if f.diagnosis is not None else None
        if suspect is None:
            return None
        for k, a in self._active.items():
            if k == key or k[0] != key[0] or k[2] not in SLOWDOWN_FAMILY:
                continue
            if a.pending and k[2] == key[2]:
                continue  # the same kind waiting to leave: join its group
            if not a.pending and not a.sent:
                continue  # itself folded into another
            if abs(a.member.starts_at - starts) > FOLD_WINDOW_S:
                continue
            if a.sent and f.severity > a.severity:
                continue  # worse than announced: news
            theirs = a.member.diagnosis.suspect if a.member.diagnosis is not None else None
            if theirs == suspect:
                return k
        return None

    def _hang_of(self, key: Key, f: Finding, starts: float) -> Key | None:
        """The stall alert of this run, already out (or held by the coordinator), that this
        rank's stall is part of: one hang, one alert. A rank judged later than its peers (one
        that prints no step lines waits ``stall.silent_rank_timeout``) joins the hang its
        diagnosis names: the same suspect or the same incident folder. One still waiting joins
        that group instead (the alert counts the ranks)."""
        d = f.diagnosis
        suspect = d.suspect if d is not None else None
        incident = d.incident if d is not None else None
        if suspect is None and not incident:
            return None
        for k, a in self._active.items():
            if k == key or k[0] != key[0] or k[2] != key[2] or k[1] == key[1]:
                continue
            if not a.sent and (not a.pending or self._waiting(k)):
                continue  # folded into another, or waiting to leave: join its group
            if abs(a.member.starts_at - starts) > FOLD_WINDOW_S or f.severity > a.severity:
                continue
            theirs = a.member.diagnosis
            if theirs is None:
                continue
            same_incident = bool(incident) and theirs.incident == incident
            if (suspect is not None and theirs.suspect == suspect) or same_incident:
                return k
        return None

    def _waiting(self, key: Key) -> bool:
        """``key`` is a member of a firing group still waiting here (not with the coordinator)."""
        return any(key in g.members for g in self._pending.values() if g.status == "firing")

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
        if self.coord is not None:
            self._peers_call(self.coord.forget, key, "firing")
        m = self._member(key[1], f, a.member.starts_at)
        m.dump_path = m.dump_path or a.member.dump_path
        # Its firing's verdict: the resolve names the same suspect (the payload's rank) as the
        # firing it closes, not the lowest rank (black-box d02, d15, d17).
        m.diagnosis = m.diagnosis or a.member.diagnosis
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
            subject=key[3],
            alert_id=a.alert_id,
        )
        if not a.sent or not self.cfg.send_resolved:
            if self.coord is not None and self.cfg.send_resolved:
                # Not announced by us, but maybe by a peer before we learned it: then it is owed.
                owed = lambda: self._resolve_after_peer_fire(key, a, m)  # noqa: E731
                self._peers_call(self.coord.watch, key, "firing", a.board_time, owed, failed=True)
            self._post(key, a.member, "cleared", a.severity, self.wall())
            return
        self._resolving[key] = a
        a.resolved_at = self.wall()
        self._add(key, m, "resolved", a.severity, a.resolved_at)

    def job_ended(self) -> None:
        """The job this agent started has ended (``rankwatch run``, closing): a condition it left
        firing (a stall of a hung job the user then stopped, the s40 tester's l54) cannot go on
        without it, so its alert is resolved, saying why. An event (a crash) is over already."""
        for key, a in list(self._active.items()):
            if key[2] in EVENT_KINDS or not a.sent:
                continue
            what = f"{key[2]} on rank {key[1]}" if key[1] is not None else key[2]
            msg = f"{what}: its job ended (the command this agent ran exited), so resolved"
            self._resolve(key, Finding(key[2], a.severity, key[1], msg, resolved=True, subject=key[3]))

    def replayed(self, findings: Iterable[Finding]) -> None:
        """What the detectors found in the log's tail, replayed at start (oldest first): compared
        with the alert state file once it is loaded (see ``state.py`` for the rule)."""
        if self._replayed is not None:
            self._replayed.extend(findings)
        else:
            self._adopt(list(findings))

    @property
    def loaded(self) -> bool:
        """The remembered state is in (``restart``): from now on it may be written back."""
        return self._replayed is None

    def restart(
        self,
        remembered: list[Remembered],
        saved_at: float | None,
        spooled: dict[Key, tuple[AlertMessage, AlertMember]],
        where: str = "",
    ) -> None:
        """Once, at start: what the state file and the spool remember, then the replayed tail."""
        replayed, self._replayed = self._replayed or [], None
        mine = set(self.ranks)
        self._restore(remembered, saved_at, where)
        self._restore_spooled({k: v for k, v in spooled.items() if k[1] in mine or k[1] is None})
        self._adopt(replayed)

    def _restore(self, remembered: list[Remembered], saved: float | None, where: str) -> None:
        now = self.clock()
        stale = saved is not None and self.wall() - saved > self.inherit_hold
        hold = 0.0 if stale else self.inherit_hold  # an earlier incarnation's: ended at once
        for rec in remembered:
            key: Key = (self.identity.run, rec.rank, rec.kind, rec.subject)
            self._saw(key[0], rec.rank)
            try:
                sev = Severity.parse(rec.severity)
            except KeyError:
                continue
            m = clean_member(rec.member, rec.since)
            member = AlertMember(
                rec.rank,
                m["message"],
                m["step"],
                m["evidence"],
                m["dump_path"],
                m["starts_at"],
                subject=rec.subject,
                diagnosis=m["diagnosis"],
            )
            if rec.ended is not None:
                self._ended[key] = rec
                if rec.resolve_pending and rec.sent and self.cfg.send_resolved and key not in self._active:
                    # Killed before its resolve went out: it is still owed.
                    a = Active(sev, member, sent=True, pending=False, board_time=rec.since)
                    a.resolved_at, a.alert_id = rec.ended, rec.alert_id
                    self._resolving[key] = a
                    self._owed.add(key)
                    self._add(key, member, "resolved", sev, rec.ended)
                continue
            if self.new_job:
                self._end_earlier_job(key, rec, sev, member)
                continue
            live = self._active.get(key)
            if live is not None:  # a live finding came first: the same episode
                if rec.sent and not live.sent:
                    live.sent, live.pending, live.board_time = True, False, rec.since
                    live.alert_id = rec.alert_id
                    for repeat in (False, True):
                        group = self._pending.get((key[2], "firing", repeat))
                        if group is not None:
                            group.members.pop(key, None)
                continue
            a = Active(sev, member, sent=rec.sent, pending=not rec.sent, last_sent=now, board_time=rec.since)
            a.alert_id = rec.alert_id if rec.sent else None
            self._active[key] = a
            self._inherited[key] = now + hold
            if rec.sent:
                self._post(key, member, "firing", sev, rec.since)
            else:  # never announced (killed inside group_wait or startup_quiet): it is now
                self._add(key, member, "firing", sev, rec.since)
        if remembered:
            log.info(
                "alert state %s: %d alert(s) firing, %d ended, from before the restart",
                where,
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
                a = Active(
                    alert.severity, member, sent=True, pending=False, last_sent=now, board_time=m.starts_at
                )
                a.alert_id = alert.id
                self._active[key] = a
                self._inherited[key] = now + self.inherit_hold
                self._post(key, member, "firing", alert.severity, a.board_time)
            elif not a.sent:
                a.sent, a.pending, a.alert_id = True, False, alert.id
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
            key: Key = (f.run or self.identity.run, rank, f.kind, f.subject)
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
            self._saw(key[0], key[1])
            self._replaying = True
            try:
                if key in self._owed:
                    # The resolve owed from before the restart may have gone out just before the
                    # kill: it is sent (again), and this firing is a new episode, not a flap.
                    self._owed.discard(key)
                    self._resolving.pop(key, None)
                    self._new_episode(key, f)
                    continue
                self._fire(key, f)
            finally:
                self._replaying = False

    def _end_earlier_job(self, key: Key, rec: Remembered, sev: Severity, member: AlertMember) -> None:
        """An alert firing when the agent of an earlier job under this run name stopped (``run``
        again in the same folder within ``INHERIT_HOLD_S``). That job is gone: an event (a crash)
        is over, and a condition it announced is resolved, saying why. Either way the new job's
        own findings of that kind are news, never taken for the old episode."""
        ended = Remembered(rec.rank, rec.kind, rec.severity, rec.since, rec.sent, rec.step, ended=self.wall())
        ended.subject = rec.subject
        if key[2] in EVENT_KINDS or not rec.sent or key in self._active or not self.cfg.send_resolved:
            self._ended[key] = ended
            return
        a = Active(sev, member, sent=True, pending=False, board_time=rec.since)
        a.alert_id = rec.alert_id
        self._active[key] = a
        what = f"{key[2]} on rank {key[1]}" if key[1] is not None else key[2]
        msg = f"{what}: its job ended (a new job was started under the same run name), so resolved"
        self._resolve(key, Finding(key[2], sev, key[1], msg, resolved=True, subject=key[3]))

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
                        subject=key[3],
                    )
                    continue
                what = f"{key[2]} on rank {key[1]}" if key[1] is not None else key[2]
                if key[3] is not None:
                    what += f" ({key[3]})"
                msg = (
                    f"{what}: not seen again by the restarted agent in {mins:.0f} min, so resolved by rule"
                    " (the condition could not be checked again after the agent restarted)"
                )
                self._resolve(key, Finding(key[2], a.severity, key[1], msg, resolved=True, subject=key[3]))
            else:
                due = min(due, deadline)
        return due

    def remembered(self) -> list[Remembered]:
        """What the state file is to hold (``state.py``): the alerts firing and those that ended."""
        out: list[Remembered] = []
        for (_, rank, kind, subject), a in self._active.items():
            member = _member_doc(a.member)
            out.append(
                Remembered(
                    rank,
                    kind,
                    a.severity.label,
                    a.board_time,
                    a.sent,
                    a.member.step,
                    member,
                    subject=subject,
                    alert_id=a.alert_id,
                )
            )
        prune_ended(self._ended, self.wall())
        for key, rec in self._ended.items():
            if key in self._active:
                continue
            pending = key in self._resolving
            if rec.resolve_pending != pending:
                rec = dataclasses.replace(rec, resolve_pending=pending)
            out.append(rec)
        return out

    def _resolve_after_peer_fire(self, key: Key, a: Active, m: AlertMember) -> None:
        """A peer announced this alert, which cleared before we learned it: send its resolve."""
        if self.closed or key in self._active or key in self._resolving:
            return  # firing again (its announcement stands) or already resolving
        a.sent = True
        self._resolving[key] = a
        a.resolved_at = self.wall()
        self._add(key, m, "resolved", a.severity, a.resolved_at)

    def _fire_after_peer_resolve(self, key: Key, a: Active) -> None:
        """A peer sent our resolve, and we fired again before we learned it: a new episode."""
        if self.closed or self._active.get(key) is not a:
            return
        a.sent, a.pending = False, True
        a.board_time = self.wall()
        a.member = dataclasses.replace(a.member, starts_at=a.board_time)
        self._add(key, a.member, "firing", a.severity, a.board_time)

    def _add(
        self, key: Key, m: AlertMember, status: Status, severity: Severity, when: float, repeat: bool = False
    ) -> None:
        gk: GroupKey = (key[2], status, repeat)
        g = self._pending.get(gk)
        if g is None:
            wait = float(self.cfg.group_wait)
            peer = key[2] in PEER_FAILURES and severity < Severity.CRITICAL
            if status == "firing" and not repeat and (peer or (self._replaying and key[2] in OWN_FAILURES)):
                # A rank whose peer failed dies of it (gloo raises, NCCL's watchdog aborts), on a
                # loaded node seconds later: its death leads the alert, not a second page. A
                # failure found in a replayed history (an agent that attached after the rank
                # died) has not been judged against its peers: its live twin, judged, comes
                # after the cross-rank wait and names the suspect before this goes out.
                wait += float(getattr(self.cfg, "death_wait", 0.0))
            g = Group(key[2], status, self.clock() + wait, severity, repeat=repeat)
            self._pending[gk] = g
        g.severity = max(g.severity, severity)
        g.members[key] = m
        g.times[key] = when
        self._post(key, m, status, severity, when)

    def _post(self, key: Key, m: AlertMember, state: str, severity: Severity, when: float) -> None:
        if self.coord is not None:
            self._peers_call(self.coord.post, key, m, state, severity, when)

    def set_dump_path(self, rank: int | None, path: str) -> None:
        """Where the stacks of ``rank`` are; shown in messages built from now on."""
        self._dumps[rank] = str(path)
        for (_, r, _, _), a in self._active.items():
            if r == rank and not a.member.dump_path:
                a.member.dump_path = str(path)

    def dumps_taken(self, outcome: DumpOutcome) -> None:
        """The agent took stacks: each rank they hold links to them (one node's agent takes the
        stacks of all its ranks into one folder)."""
        if outcome.link is None:
            return
        for rank in outcome.captured:
            self.set_dump_path(rank if rank is not None else self.identity.rank, outcome.link)

    def refresh_policy(self) -> None:
        """Re-read the policy values parsed at start (config hot reload changed ``cfg`` in place)."""
        self.min_severity = Severity.parse(self.cfg.min_severity)

    def pump(self, now: float, *, force: bool = False) -> float:
        """Send due groups and repeats (``force``: every group now); returns the next due time."""
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
                    or self.coord is None
                    or not self._peers_call(self.coord.hold, g, now, failed=False, alone=1)
                ):
                    self.emit(g, now)
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
                if self.coord is not None and self.coord.usable(now):
                    for k, a in group:  # peers repeat too: one "still firing" between them
                        a.board_time = self.wall()
                        self._add(k, dataclasses.replace(a.member), "firing", a.severity, a.board_time, True)
                    due = min(due, now + self.cfg.group_wait)
                    continue
                for msg in self._message(kind, "firing", group, repeat=True):
                    self.out(msg)
            due = min(due, *(a.last_sent + interval for _, a in sent))
        return due

    def any_sent(self) -> bool:
        """Some alert is announced and still firing."""
        return any(a.sent and not a.pending for a in self._active.values())

    def hold_pending(self, now: float) -> None:
        """At close: hand every waiting group to the coordinator now (it decides within its
        budget); what it does not take is sent by ``pump(force=True)``."""
        if self.coord is None:
            return
        for g in list(self._pending.values()):
            if g.members and self._peers_call(self.coord.hold, g, now, failed=False, alone=1):
                del self._pending[(g.kind, g.status, g.repeat)]

    def active_messages(self) -> list[AlertMessage]:
        """What is announced and still firing, one message per kind: for receivers that forget
        an alert not posted again (Alertmanager's ``resolve_timeout``)."""
        sent = [(k, a) for k, a in self._active.items() if a.sent and not a.pending]
        return [
            msg
            for kind in sorted({k[2] for k, _ in sent})
            for msg in self._message(kind, "firing", [(k, a) for k, a in sent if k[2] == kind])
        ]

    def _message(
        self, kind: str, status: Status, actives: list[tuple[Key, Active]], *, repeat: bool = False
    ) -> list[AlertMessage]:
        """One message per run (a node daemon's jobs are never one alert)."""
        return [
            self._run_message(run, kind, status, [(k, a) for k, a in actives if k[0] == run], repeat=repeat)
            for run in sorted({k[0] for k, _ in actives})
        ]

    def _run_message(
        self, run: str, kind: str, status: Status, actives: list[tuple[Key, Active]], *, repeat: bool = False
    ) -> AlertMessage:
        members = [dataclasses.replace(a.member) for _, a in sorted(actives, key=_rank_order)]
        sev = max(a.severity for _, a in actives)
        msg = AlertMessage(
            run,
            kind,
            sev,
            status,
            members,
            self.identity.node,
            self.world_of(run),
            saw_all=self.saw_all({m.rank for m in members if m.rank is not None}, run=run),
            repeat=repeat,
        )
        _episode_id(msg, [a for _, a in actives])
        return self._finish(msg)

    def world_of(self, run: str) -> int | None:
        """The run's world size: its processes' own, else the agent's for its own run."""
        return self._worlds.get(run) or (self.identity.world_size if run == self.identity.run else None)

    def saw_all(self, extra: set[int] | None = None, run: str | None = None) -> bool:
        """Every rank of the world is known to exist, so "N of WORLD ranks" is a fact."""
        run = run if run is not None else self.identity.run
        world = self.world_of(run)
        if not world:
            return False
        known = self._run_ranks.get(run, set()) | (extra or set())
        return all(r in known for r in range(world))

    def _finish(self, msg: AlertMessage) -> AlertMessage:
        for m in msg.members:
            m.dump_path = m.dump_path or self._dumps.get(m.rank)
        msg.grafana_url = render_link(self.cfg.grafana_url, msg.run, msg.rank, msg.kind)
        msg.report_url = render_report_link(
            self.cfg.report_url, msg.run, msg.rank, msg.kind, _incident_of(msg), msg.node
        )
        if msg.status == "resolved":
            msg.ends_at = self.wall()
        return msg

    def emit(self, g: Group, now: float, *, saw_all: bool | None = None) -> None:
        """Send the group now (``saw_all``: the coordinator's word on "N of WORLD")."""
        keys = sorted(g.members, key=_key_order)
        owners = {k: self._active.get(k) or self._resolving.get(k) for k in keys}
        self.announced(g, keys, now)
        for run in sorted({k[0] for k in keys}):  # one message per run: a node daemon's jobs apart
            members = [dataclasses.replace(g.members[k]) for k in keys if k[0] == run]
            # The members' ranks exist, and so do the run's ranks this agent saw (its own world
            # known from its processes: a launcher's workers); the coordinator adds the board's.
            here = {m.rank for m in members if m.rank is not None}
            msg = AlertMessage(
                run,
                g.kind,
                g.severity,
                g.status,
                members,
                self.identity.node,
                self.world_of(run),
                saw_all=bool(saw_all) or self.saw_all(here, run=run),
                repeat=g.repeat,
            )
            _episode_id(msg, [a for k in keys if k[0] == run and (a := owners[k]) is not None])
            self.out(self._finish(msg))

    def announced(self, g: Group, keys: list[Key], now: float) -> None:
        """These members are announced (by us, or by the peer that led the group)."""
        for k in keys:
            a = self._active.get(k)
            if g.status == "firing" and a is not None:
                a.sent, a.pending, a.last_sent = True, False, now
            elif g.status == "resolved":
                self._resolving.pop(k, None)
                self._owed.discard(k)


def _episode_id(msg: AlertMessage, actives: list[Active]) -> None:
    """The message carries its episode's id: the firing that announced every one of its members
    (a repeat, a resolve); a firing of members not yet announced names them after itself."""
    ids = {a.alert_id for a in actives}
    only = next(iter(ids)) if len(ids) == 1 else None
    if only is not None:
        msg.id = only
    elif msg.status == "firing":
        for a in actives:
            if a.alert_id is None:
                a.alert_id = msg.id


def _incident_of(msg: AlertMessage) -> str | None:
    """The incident folder's name the alert's stacks are in (its dump path, or the diagnosis)."""
    for m in msg.members:
        where = m.dump_path or (m.diagnosis.incident if m.diagnosis is not None else None)
        if isinstance(where, str) and where:
            return os.path.basename(where.rstrip("/"))
    return None


def _member_doc(m: AlertMember) -> dict[str, Any]:
    return {
        "message": m.message[:MAX_TEXT],
        "step": m.step,
        "evidence": small_evidence(m.evidence),
        "dump_path": m.dump_path,
        "starts_at": m.starts_at,
        "diagnosis": m.diagnosis.to_json() if m.diagnosis is not None else None,
    }


def _same_episode(old: Remembered, f: Finding) -> bool:
    """A replayed firing of an alert that ended before the restart is that old episode when it
    is not later than the end (by step where both are known, else by time); in doubt, new."""
    if f.step is not None and old.ended_step is not None:
        return f.step <= old.ended_step
    if f.time is not None and old.ended is not None:
        return f.time <= old.ended
    return False


def _key_order(k: Key) -> tuple[bool, int, str]:
    return (k[1] is None, k[1] or 0, k[3] or "")


def _rank_order(ka: tuple[Key, Active]) -> tuple[bool, int, str]:
    return _key_order(ka[0])
