"""What runs around the rank watchers in a live agent: the HTTP server, the alert
dispatcher and the polled sources (NVML, disk, checkpoint folder, timers, ...).

Each one is optional and independent: one that cannot start (port taken, NVML absent,
no checkpoint directory) logs one line, counts an internal error, and the others run on.
Detection never waits for any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from prometheus_client import CollectorRegistry

from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.engine import RankEngine
from rankwatch.events import Event
from rankwatch.exporter.metrics import make_registry
from rankwatch.gpu.backend import GpuBackend
from rankwatch.offloop import in_daemon
from rankwatch.records import POISON_KINDS, EvalRecord, Finding, StepRecord
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.judge import CrossRankWhenPeers
from rankwatch.runtime.loopmon import LoopMonitor
from rankwatch.runtime.reload import ConfigReloader, ConfigSource, hand_over
from rankwatch.runtime.watcher import RankWatcher
from rankwatch.sources.polled import (
    PolledSource,
    Poller,
    Sampled,
    SourceContext,
    ToRank,
    WatchedRank,
    build_sources,
    scope_of,
)
from rankwatch.sources.polled.checkpoint_scan import SHARED_KEY as CHECKPOINT_WATCHER
from rankwatch.sources.polled.disk import DiskSource

log = logging.getLogger("rankwatch.services")


def _on_clock(event: Event, now: float) -> Event:
    """``event`` with ``now`` read from a rank's clock (the events of a per-rank source have it)."""
    return cast(Event, dataclasses.replace(cast(Any, event), now=now))


class Services:
    def __init__(
        self,
        agent: Agent,
        cfg: Config,
        *,
        gpu_backend: GpuBackend | None = None,
        alert_sinks: list[Any] | None = None,
        server: bool | None = None,
        on_start: Callable[[Services], None] | None = None,
        config_source: ConfigSource | None = None,
    ) -> None:
        self.agent = agent
        self.cfg = cfg
        self.gpu_backend = gpu_backend
        self.alert_sinks = alert_sinks
        self.want_server = cfg.server.enabled if server is None else server
        self.on_start = on_start
        self.config_source = config_source
        self.reloader: ConfigReloader | None = None
        self.server: Any = None
        self.dispatcher: Any = None
        self.checkpoints: Any = None
        # One engine per rank: events about a watched rank go to its watcher's engine. These
        # are for what no watcher owns: GPUs tied to no watched rank, and the agent's folders
        # and NVML itself when no watcher is the agent's own rank (a node daemon); keyed by the
        # rank their findings carry.
        self.engines: dict[int | None, RankEngine] = {}
        self.polled: dict[str, Poller] = {}
        self.sources: SourceContext | None = None  # what the polled sources were built from
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    def _failed(self, component: str, msg: str, *args: Any) -> None:
        errs = self.agent.internal_errors_by_component
        errs[component] = errs.get(component, 0) + 1
        log.error(msg, *args)

    # --- start ---------------------------------------------------------------------------
    async def start(self) -> None:
        mon = self.agent.loop_monitor = LoopMonitor()
        self._tasks.append(asyncio.create_task(mon.run(self._stop), name="loop-monitor"))
        self._start_reload()
        self.dispatcher = self._make_dispatcher()
        self._build_polled()
        # The one place a finding's way from the detectors to the sinks is declared.
        self.agent.wire(
            cross_rank=CrossRankWhenPeers(self.agent, self.cfg),
            enrich=self._with_last_good if self.checkpoints is not None else None,
            alerts=self.dispatcher,
        )
        self._start_alerts()
        self._start_polled()
        if self.cfg.dumps.on_stall and float(self.cfg.dumps.join_peers) > 0:
            if self.agent.identity.run == "default":
                # No job id, no torchrun run id, no run.name: unrelated jobs sharing the dumps
                # folder would py-spy each other's ranks into one incident.
                log.info("dumps.join_peers off: the run has no name (set run.name; Slurm, torchrun set one)")
            else:
                self._tasks.append(asyncio.create_task(self._join_peer_incidents(), name="join-incidents"))
        if self.want_server:
            await self._start_server()
        if self.on_start is not None:
            self.on_start(self)

    def _make_dispatcher(self) -> Any:
        """The alert dispatcher, or None (no sink configured, or it cannot be made)."""
        from rankwatch import runfolder
        from rankwatch.actions.alerts.sinks import sinks_from_config

        try:
            # The sinks first: without one the dispatcher's modules are never loaded.
            sinks = self.alert_sinks if self.alert_sinks is not None else sinks_from_config(self.cfg.alerts)
            if not sinks:
                return None
            from rankwatch.actions.alerts import AlertDispatcher

            d = AlertDispatcher(
                self.cfg.alerts,
                self.agent.identity,
                sinks=sinks,
                errors=self.agent.internal_errors_by_component,
                ranks=[w.rank for w in self.agent.watchers if w.rank is not None],
                dumps_dir=self.cfg.dumps.dir,
                folder_group=runfolder.resolve_group(self.cfg.dumps.group),
                clock_skew=float(self.cfg.dumps.clock_skew),
                new_job=self.agent.launched,
            )
        except Exception as e:
            self._failed("alerts", "alerting disabled: %s", e)
            return None
        return d if d.sinks else None

    def _start_alerts(self) -> None:
        d = self.dispatcher
        if d is None:
            return
        d.replayed([f for w in self.agent.watchers for f in w.replayed])
        self.agent.alert_stats = d.stats
        self.agent.alert_peer_stats = d.peer_stats  # the live dict: read at every scrape
        self._tasks.append(asyncio.create_task(d.run(), name="alerts"))
        log.info("alerts go to %s", ", ".join(s.name for s in d.sinks))

    def _start_reload(self) -> None:
        if self.config_source is None or self.cfg.reload.interval <= 0:
            return
        self.reloader = ConfigReloader(self.config_source, self.cfg, hand_over=self._hand_over)
        self._tasks.append(
            asyncio.create_task(self.reloader.run(self._stop, self.cfg.reload.interval), name="reload")
        )

    def _hand_over(self, old: Config, new: Config) -> Config:
        cfg = self.cfg = hand_over(old, new, watchers=self.agent.watchers, dispatcher=self.dispatcher)
        self.agent.cfg = replaced(self.agent.cfg, detectors=cfg.detectors, stall=cfg.stall, alerts=cfg.alerts)
        return cfg

    def own_pipeline(self) -> RankWatcher | None:
        """The watcher of the agent's own rank and run (in run mode and ``watch --pid``, the
        rank it watches): what the agent samples of itself (its folders' free space, NVML, the
        checkpoint folder) is that rank's, judged by that rank's one engine. Every pipeline of
        run mode is of the one job the agent launched, whose run its workers name (torchrun's
        run id): there the rank alone picks it."""
        me = self.agent.identity
        launched = self.agent.launched
        return next(
            (w for w in self.agent.watchers if w.rank == me.rank and (launched or w.identity.run == me.run)),
            None,
        )

    def engine(self, rank: int | None = None, *, agent: bool = False) -> RankEngine:
        """The engine of events about ``rank`` (``agent``: this agent's rank): its watcher's,
        else one kept here for what no watcher owns."""
        if agent:
            w = self.own_pipeline()
            if w is not None:
                return w.engine
            rank = self.agent.identity.rank
        eng = self.engines.get(rank)
        if eng is None:
            eng = self.engines[rank] = RankEngine(
                self.cfg, rank, None, started=time.monotonic(), job_end=self.agent.identity.job_end
            )
        return eng

    def push(self, event: Event, rank: int | None = None, *, agent: bool = False) -> None:
        w = self.own_pipeline() if agent else None
        if w is not None:
            w.push(event)  # its findings carry the run of its process
            return
        for f in self.engine(rank, agent=agent).feed(event):
            self.agent.emit(f)

    def _history(self, records: list[Any]) -> None:
        """A trainer's own history read by a source (HF log_history, with exact step numbers),
        for the detectors of a rank whose log shows no steps (none followed, or no step lines):
        else a NaN seen only there finds nothing. Once the log has steps of its own it is the
        source, and history would count twice."""
        ws = self.agent.watchers
        w = next((w for w in ws if w.rank == self.agent.identity.rank), None)
        if w is None and ws:  # a node daemon: rank 0 is the one that writes HF checkpoints
            w = ws[0] if len(ws) == 1 else next((w for w in ws if w.rank == 0), None)
        if w is not None:
            w.history(records)

    def _with_last_good(self, f: Finding) -> Finding:
        """A NaN or divergence marks later checkpoints suspect, and its alert names the one to resume from."""
        cw = self.checkpoints
        cw.on_finding(f)
        if f.kind not in POISON_KINDS or f.resolved:
            return f
        good = cw.last_good()
        if good is not None and f.step is not None and good.step is not None and good.step >= f.step:
            good = next(
                (e for e in reversed(cw.catalog.ordered()) if e.status == "good" and (e.step or 0) < f.step),
                None,
            )
        if good is None:
            text = "No good checkpoint from before it is known."
            evidence: dict[str, Any] = {"last_good_checkpoint": None}
        else:
            where = f" (step {good.step})" if good.step is not None else ""
            text = f"Last good checkpoint to resume from: {good.path}{where}."
            evidence = {"last_good_checkpoint": str(good.path), "last_good_step": good.step}
        return dataclasses.replace(f, message=f"{f.message} {text}", evidence={**f.evidence, **evidence})

    async def _join_peer_incidents(self) -> None:
        """Add this agent's stacks to a stall incident a peer agent of the run opened.

        The look runs on a daemon thread of its own, one at a time: on a hung shared
        filesystem it stays stuck there, never in the loop's executor (which process sampling
        needs) and never in the way of the agent's exit."""
        failed = False
        inflight: asyncio.Future[str | None] | None = None
        while not self._stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), float(self.cfg.dumps.join_peers))
            if self._stop.is_set() or not self.cfg.dumps.on_stall:
                return
            if inflight is None:
                inflight = in_daemon(self.agent.peer_incident, name="rankwatch-join")
            try:
                incident = await asyncio.wait_for(asyncio.shield(inflight), 10.0)
            except asyncio.TimeoutError:
                continue  # still stuck: look again at the next poll, no second thread
            except Exception as e:
                inflight = None
                errs = self.agent.internal_errors_by_component
                errs["dumps"] = errs.get("dumps", 0) + 1
                if not failed:
                    failed = True
                    log.error("cannot look for peers' stall incidents: %s (further failures only counted)", e)
                continue
            inflight = None
            if incident is not None:
                log.warning("a peer agent of this run found a stall: adding our stacks to %s", incident)
                await self.agent.capture_dumps("stall", incident)

    def disk_folders(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for w in self.agent.watchers:
            for st in w.streams:
                out.setdefault(str(st.path.parent), "log")
        if self.cfg.dumps.on_stall:
            out.setdefault(str(self.cfg.dumps.dir), "dumps")
        if self.dispatcher is not None:
            out.setdefault(str(self.cfg.alerts.spool_dir), "spool")
        return out

    # --- polled sources (sources/polled: disk, checkpoint folder, deadline, ...) ----------------
    def _build_polled(self) -> None:
        """Every registered source this configuration turns on (once)."""
        if self.sources is not None:
            return
        ctx = self.sources = SourceContext(
            cfg=self.cfg,
            folders=self.disk_folders,
            job_end=self.agent.identity.job_end,
            ranks=self.watched_ranks,
            rank=self.agent.identity.rank,
            backends={} if self.gpu_backend is None else {"gpu": self.gpu_backend},
        )
        for src in build_sources(ctx, self.agent.internal_errors_by_component):
            self.add_source(src)
        self.checkpoints = ctx.shared.get(CHECKPOINT_WATCHER)  # for the findings it annotates

    def _start_polled(self) -> None:
        self._build_polled()
        for name, poller in self.polled.items():
            deliver = functools.partial(self._sampled, poller.source)
            self._tasks.append(asyncio.create_task(poller.run(self._stop, deliver), name=f"source-{name}"))

    def add_source(self, src: PolledSource) -> None:
        """``src`` may be polled (``poll``); its errors are exported from 0, and what it shows
        between samples (``view``) is read through the agent's hook its ``face`` names."""
        self.polled[src.name] = Poller(src, self.agent.internal_errors_by_component)
        face = getattr(src, "face", None)
        if face is not None:
            if not hasattr(self.agent, face):
                raise TypeError(f"polled source {src.name!r}: the agent has no hook {face!r}")
            setattr(self.agent, face, src.view)  # type: ignore[attr-defined]

    def source(self, name: str) -> Any:
        """The polled source ``name`` when this configuration runs it, else None."""
        p = self.polled.get(name)
        return p.source if p is not None else None

    def watched_ranks(self) -> list[WatchedRank]:
        """The watched ranks as the polled sources see them (read on the loop: the PIDs the
        last process samples knew, no walk of /proc; a source that needs the tree as it is
        now walks it off the loop, ``WatchedRank.walk``)."""
        out = []
        for w in self.agent.watchers:
            known = w.known_pids()
            out.append(WatchedRank(w.rank, tuple(known), frozenset(known), dict(w.gpu_env), w.pids))
        return out

    def _sampled(self, src: PolledSource, events: list[Sampled]) -> None:
        self.agent.sampled[src.name] = tuple(e.event if isinstance(e, ToRank) else e for e in events)
        self._deliver(src, events)

    def _deliver(self, src: PolledSource, sampled: list[Sampled]) -> None:
        """Events to the engines the source's scope names: the agent's rank's, or every
        watched rank's with ``now`` on that rank's clock. Records (a trainer's own history
        read elsewhere than its log) go to the agent's rank as history."""
        records = [e for e in sampled if isinstance(e, (StepRecord, EvalRecord))]
        if records:
            self._history(records)
            sampled = [e for e in sampled if not isinstance(e, (StepRecord, EvalRecord))]
        events: list[Event] = []
        for e in sampled:
            if isinstance(e, ToRank):
                self._to_rank(e)
            else:
                events.append(e)
        if scope_of(src) == "agent":
            for event in events:
                self.push(event, agent=True)
            return
        for w in self.agent.watchers:
            for event in events:
                w.push(_on_clock(event, w.clock()))

    def _to_rank(self, routed: ToRank) -> None:
        """An event about one rank to that rank's watcher (the only one, in a rank's own
        agent), on its clock; about a rank no watcher owns, to an engine kept here."""
        watchers = self.agent.watchers
        targets = [w for w in watchers if w.rank == routed.rank or len(watchers) == 1]
        for w in targets:
            w.push(_on_clock(routed.event, w.clock()))
        if not targets:
            self.push(_on_clock(routed.event, time.monotonic()), routed.rank)

    async def poll(self, name: str, timeout: float | None = None) -> list[Sampled] | None:
        """One sample of the polled source ``name`` (at most one in flight: a hung one is waited
        for, never doubled), its events delivered (while it hangs, what the source's
        ``overdue`` says); None when it failed or hung."""
        p = self.polled.get(name)
        if p is None:
            return None
        events = await p.once(timeout)
        if events is not None:
            self._sampled(p.source, events)
        return events

    async def sample_disks(self, timeout: float | None = None) -> list[Sampled] | None:
        """The free space of the agent's folders now (run mode asks when the child died)."""
        return await self.poll(DiskSource.name, timeout)

    def registry(self) -> CollectorRegistry:
        """The metrics registry: every registered collector over the agent's snapshots, which
        from now on carry the checkpoint watcher's and the config reloader's numbers."""
        faces = self.agent.faces
        if self.cfg.checkpoints.dir:
            faces.checkpoints = lambda: self.checkpoints.snapshot() if self.checkpoints is not None else None
        if self.reloader is not None:
            faces.config_reload = self.reloader.snapshot
        return make_registry(self.agent.snapshot)

    async def _start_server(self) -> None:
        from rankwatch.server import start_server

        try:
            self.server = await start_server(self.agent.snapshot, self.cfg.server, registry=self.registry())
        except (OSError, ValueError) as e:
            self._failed(
                "server", "HTTP server not started on %s: %s (detection goes on)", self.cfg.server.listen, e
            )

    # --- stop ----------------------------------------------------------------------------
    async def close(self, timeout: float = 10.0) -> None:
        """Flush alerts (bounded), then stop everything. Never raises."""
        self._stop.set()
        if self.dispatcher is not None:
            try:
                await self.dispatcher.close(timeout)
            except Exception:
                log.exception("closing the alert dispatcher failed")
        for t in self._tasks:
            if not t.done():
                try:
                    await asyncio.wait_for(t, 5.0)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    pass
                except Exception:
                    log.exception("task %s failed", t.get_name())
        if self.server is not None:
            with contextlib.suppress(Exception):
                await self.server.close()
