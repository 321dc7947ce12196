"""Alert routing: findings in, few and reliable messages out. Three parts, each testable alone:

- ``policy.AlertPolicy``: which findings become which messages, and when (dedup, grouping,
  repeats, resolves, startup quiet, restarts): a synchronous state machine on the clock.
- ``delivery.Delivery``: one queue, task and retry policy per sink, and the spool.
- ``peers.PeerGroups`` (optional): the agents of one run send one message per incident between
  them over the alert board (``board.py``). Without a usable board each agent sends its own.

This module wires them to the event loop: ``send`` hands a finding to the policy, ``run`` is
the timer loop (policy timers, the board's steps, refreshes, the state file), ``close`` sends
what can be sent and spools the rest. Restarts: what is firing (announced or not) and what
ended recently are kept in a state file beside the spool (``state.py``, written off the loop
whenever they change); a new dispatcher reads it and the spool and hands both to the policy.
An alert is counted announced in that file only once it is in the outbox (the spool, written
before its first attempt), so a SIGKILL during an attempt loses nothing. What a SIGKILL of the
agent can still lose: findings not yet made alerts (inside ``group_wait`` or ``startup_quiet``),
which live in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rankwatch import runfolder
from rankwatch.actions.alerts.board import Board, board_path
from rankwatch.actions.alerts.delivery import BACKOFF_BASE_S, Delivery, _wait, retry_window
from rankwatch.actions.alerts.message import AlertMember, AlertMessage, AlertSink
from rankwatch.actions.alerts.peers import PeerGroups, max_takeover_delay
from rankwatch.actions.alerts.policy import AlertPolicy, Key
from rankwatch.actions.alerts.sinks import sink_name, sinks_from_config
from rankwatch.actions.alerts.spool import Spool, spool_path
from rankwatch.actions.alerts.state import INHERIT_HOLD_S, Remembered, StateFile, state_path
from rankwatch.actions.alerts.threads import ThreadStore
from rankwatch.actions.dump_outcome import DumpOutcome
from rankwatch.config.schema import AlertsConfig
from rankwatch.identity import Identity
from rankwatch.offloop import call as off_loop
from rankwatch.records import Finding

__all__ = ["AlertDispatcher", "Key", "retry_window", "sink_name", "sinks_from_config"]

log = logging.getLogger("rankwatch.alerts")

STALE_MIN_S = 600.0  # board records younger than this are never ignored as stale
STATE_TIMEOUT_S = 10.0  # one write (or read) of the alert state file; a hung mount gives up
STATE_RETRY_S = 30.0  # after a failed write, the next try waits this long


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
        folder_group: int | None = None,
        clock_skew: float = runfolder.CLOCK_SKEW_S,
        new_job: bool = False,
    ) -> None:
        """``ranks``: the ranks this agent watches (for "N of WORLD"); ``dumps_dir``: where the
        alert board lives by default (``alerts.board_dir`` unset); ``folder_group`` and
        ``clock_skew``: the run folder's rules (``dumps.group``, ``dumps.clock_skew``); ``new_job``:
        the agent started the job (``run``): the state file's firing alerts are an earlier job's."""
        self.folder_group = folder_group
        self.clock_skew = clock_skew
        self.cfg = cfg
        # The agent's internal-error counters, so a spool that cannot be written shows in /metrics.
        self.errors = errors if errors is not None else {}
        self.identity = identity
        self.clock = clock
        self.wall = wall
        self.rng = rng
        self.sinks = sinks_from_config(cfg) if sinks is None else list(sinks)
        spool = Spool(
            spool_path(cfg.spool_dir, identity.run, identity.rank),
            cfg.spool_max_bytes,
            group=folder_group,
            errors=self.errors,
        )
        self.delivery = Delivery(
            self.sinks,
            cfg,
            spool,
            run=identity.run,
            clock=clock,
            rng=rng,
            backoff_base=backoff_base,
            errors=self.errors,
        )
        self.stats = self.delivery.stats
        self.delivery.on_outboxed = self.wake_loop
        self.spool = spool
        self.policy = AlertPolicy(
            cfg,
            identity,
            self.delivery.enqueue,
            clock=clock,
            wall=wall,
            errors=self.errors,
            ranks=ranks,
            inherit_hold=inherit_hold,
            new_job=new_job,
        )
        self.state = StateFile(
            state_path(cfg.spool_dir, identity.run, identity.rank), group=folder_group, errors=self.errors
        )
        self._saved_doc: Any = None
        self._state_on_disk = False  # a state file was read at start or written since
        self._saving: asyncio.Future[Any] | None = None
        self._state_retry_at = -float("inf")
        self._state_errors = 0
        self._wake = asyncio.Event()
        self._starting: asyncio.Future[None] | None = None
        self._closed = False
        self._sleeping_until: float | None = None  # the timer loop waits for this time (or a wake)
        from rankwatch.actions.alerts._alertmanager import AlertmanagerSink  # as sinks_from_config

        path = board_path(self.cfg.board_dir, dumps_dir, self.identity.run)
        if (
            path is not None
            and self.cfg.board_dir is None
            and self.sinks
            and all(isinstance(s, AlertmanagerSink) for s in self.sinks)
        ):
            # Alertmanager groups and deduplicates the agents' alerts itself (same labels, one
            # notification): the board steps aside, and a large run keeps no shared files for it.
            log.info("alert board off: Alertmanager is the only sink and groups across agents itself")
            path = None
        self.board_folder = self._board_folder(path) if path is not None else None
        self.peers = self._make_peers(self.board_folder) if self.board_folder is not None else None
        self.policy.coord = self.peers
        for s in self.sinks:
            share = getattr(s, "share_threads", None)
            if self.board_folder is not None and callable(share):
                share(ThreadStore(self.board_folder.child("slack-threads")))

    def _board_folder(self, path: Path) -> runfolder.RunFolder:
        """``<root>/<run>/.alerts``, the run folder's rules from ``<root>`` down."""
        return runfolder.RunFolder(
            path.parent.parent, path.parent.name, path.name, group=self.folder_group, errors=self.errors
        )

    def _make_peers(self, path: runfolder.RunFolder) -> PeerGroups:
        takeover = float(self.cfg.board_takeover)
        wait = float(self.cfg.group_wait) + float(self.cfg.death_wait)  # a peer's warning's longest
        chain = wait + max_takeover_delay(takeover) + 2 * takeover
        stale = max(STALE_MIN_S, float(self.cfg.startup_quiet) + chain)
        return PeerGroups(
            self.policy,
            Board(
                path,
                self.identity.run,
                stale,
                world=self.identity.world_size,
                skew=self.clock_skew,
                wall=self.wall,
            ),
            run=self.identity.run,
            node=self.identity.node,
            ranks=self.policy.ranks,
            clock=self.clock,
            wall=self.wall,
            takeover=takeover,
            errors=self.errors,
            rng=self.rng,
        )

    @property
    def peer_stats(self) -> dict[str, int]:
        """led / took_over: grouped messages this agent sent for its peers too; grouped_by_peer:
        alerts a peer sent for this agent; fallback: groups sent alone, the board being unusable."""
        if self.peers is None:
            return {"led": 0, "took_over": 0, "grouped_by_peer": 0, "fallback": 0}
        return self.peers.stats

    @property
    def peer_errors(self) -> int:
        """Errors raised inside the board's coordination (each sent its groups alone)."""
        return self.policy.peer_errors

    # --- intake (synchronous, called by the agent) ---------------------------------------
    def send(self, f: Finding) -> None:
        """Enqueue only: never blocks, never raises for a well-formed finding."""
        if self._closed:
            return
        self.policy.take(f)
        self._wake.set()

    def replayed(self, findings: Iterable[Finding]) -> None:
        """What the detectors found in the log's tail, replayed at start (oldest first): compared
        with the alert state file once it is loaded (see ``state.py`` for the rule)."""
        self.policy.replayed(findings)
        self._wake.set()

    def set_dump_path(self, rank: int | None, path: str | Path) -> None:
        """Where the stacks of ``rank`` are; shown in messages built from now on."""
        self.policy.set_dump_path(rank, str(path))

    def dumps_taken(self, outcome: DumpOutcome) -> None:
        """The agent took stacks (``Agent.capture_dumps``): each rank they hold links to them."""
        self.policy.dumps_taken(outcome)

    def refresh_policy(self, cfg: AlertsConfig | None = None) -> None:
        """Re-read the policy values parsed at start (config hot reload: ``cfg`` is the new
        section, or the old one changed in place)."""
        if cfg is not None:
            self.cfg = self.policy.cfg = cfg
        self.policy.refresh_policy()
        self.delivery.refresh_policy(self.cfg)
        self._wake.set()

    def wake_loop(self) -> None:
        """The timer loop acts again (the outbox took what the state file may now call sent)."""
        self._wake.set()

    def wake(self) -> None:
        """Re-evaluate timers now (tests with a fake clock call it after advancing)."""
        self._wake.set()
        self.delivery.wake()

    def settled(self) -> bool:
        """Every part has acted on the clock's present time and waits for a later one (or for
        news): the timer loop, the board's I/O, the state file's write, each sink's task.
        Tests with a fake clock wait for this after advancing it, instead of sleeping."""
        now = self.clock()
        due = self._sleeping_until
        if due is None or due <= now or self._wake.is_set():
            return False
        if self._saving is not None and not self._saving.done():
            return False
        if self.peers is not None and self.peers.busy:
            return False
        return self.delivery.idle(now)

    def pump(self, now: float, *, force: bool = False) -> float:
        """Send what is due (policy timers and refreshes); returns the next due time."""
        due = self.policy.pump(now, force=force)
        if not force:
            due = min(due, self.delivery.refresh(now, self.policy.active_messages, self.policy.any_sent()))
        return due

    # --- lifecycle -----------------------------------------------------------------------
    async def _start(self) -> None:
        """Once, however many callers: ``close`` may come while ``run`` is still starting (two
        starts made two workers per sink, which delivered one alert twice)."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start_once())
        await asyncio.shield(self._starting)

    async def _start_once(self) -> None:
        self.policy.start(self.clock())
        spooled = await self.delivery.load()
        self.delivery.start()
        try:
            remembered: list[Remembered] = await off_loop(
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
        run = self.identity.run
        by_key: dict[Key, tuple[AlertMessage, AlertMember]] = {
            (run, r, kind, subject): v for (r, kind, subject), v in spooled.items()
        }
        self._state_on_disk = self.state.saved_at is not None or bool(remembered)
        self.policy.restart(remembered, self.state.saved_at, by_key, str(self.state.path))
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
            self._sleeping_until = due
            try:
                await _wait(self._wake, due - self.clock())
            finally:
                self._sleeping_until = None

    async def _peers_step(self, now: float) -> float:
        assert self.peers is not None
        if not self.peers.usable(now) and not self.peers.waiting:
            return float("inf")  # set aside, and nothing left to decide
        try:
            return await self.peers.step(now)
        except Exception as e:
            self.policy.coordination_failed(e)
            return float("inf")  # what it held is sent: nothing is due there (and no busy loop)
        finally:
            self.delivery.wake()

    async def close(self, timeout: float = 10.0) -> None:
        """Send what can be sent within ``timeout`` (real seconds), spool the rest."""
        if self._closed:
            return
        await self._start()
        deadline = time.monotonic() + max(0.0, timeout)
        self.delivery.start()  # run() was cancelled with its workers: flush anyway
        if self.policy.new_job:
            self.policy.job_ended()  # what this agent ran is over: so are its conditions
        if self.peers is not None:
            # Agents of a crashed job close together: decide on the board now rather than
            # each sending alone, within half the budget (the rest is for delivery).
            self.policy.hold_pending(self.clock())
            if self.peers.waiting:
                budget = min(float(self.cfg.board_takeover), max(0.0, timeout) / 2)
                try:
                    await self.peers.settle(budget)
                except Exception as e:
                    self.policy.coordination_failed(e)
        self.pump(self.clock(), force=True)
        await self.delivery.flush(deadline)
        self._closed = self.policy.closed = True
        self._wake.set()
        await self.delivery.stop_tasks()
        await self._final_state()
        await self.delivery.stop()

    async def _final_state(self) -> None:
        if self._saving is not None and not self._saving.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._saving), STATE_TIMEOUT_S)
        self._state_retry_at = -float("inf")
        self._save_state(final=True)
        if self._saving is not None and not self._saving.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._saving), STATE_TIMEOUT_S)

    def _save_state(self, *, final: bool = False) -> None:
        """Write the state file if it changed (on a daemon thread; one write at a time). Not
        while an alert it would call announced is still only in memory (``outbox_pending``):
        the sink's task writes it to the outbox, then wakes the loop to come back here."""
        if not self.policy.loaded or self.clock() < self._state_retry_at:
            return  # not loaded yet (never overwrite what we have not read), or failing
        if not final and self.delivery.outbox_pending():
            return
        if self._saving is not None and not self._saving.done():
            return  # its end wakes the loop, which comes back here
        alerts = self.policy.remembered()
        if not self._state_on_disk and not any(a.sent or a.ended is None for a in alerts):
            # Nothing a restarted agent needs (no alert firing, none announced): no file, and
            # no spool folder made for it in the job's working directory.
            return
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
            self._state_on_disk = True
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
