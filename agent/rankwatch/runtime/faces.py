"""Builds the snapshot the exporter and the server read (``rankwatch.snapshot``).

This is the only code that looks inside the watchers, detectors and the agent on their
behalf. It runs on the event loop once per scrape or API request, so it copies what is
shown and derives rates from the watchers' rolling windows (a few hundred attribute loads
per rank) instead of bookkeeping anything per event. A part that cannot be read (a hook
that raises, a sample of the wrong shape) is left out and named in ``broken``: the
collectors showing it fail alone, and they log it (here it is only a debug line).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from rankwatch.exporter.findings import FindingTracker
from rankwatch.identity import Identity
from rankwatch.records import Finding, StepRecord
from rankwatch.snapshot import (
    AgentSnapshot,
    ConfigReloadView,
    DumpsView,
    FindingsView,
    GpuView,
    HttpCounters,
    LogView,
    LoopView,
    PodView,
    ProcessSampleView,
    ProcessView,
    RankLabels,
    RankSnapshot,
    SourcesView,
    TrainingView,
    frozen_map,
)
from rankwatch.state import RankState, eta, step_duration, step_rate

if TYPE_CHECKING:
    from rankwatch.dumps.store import DumpStore
    from rankwatch.runtime.watcher import RankWatcher

log = logging.getLogger("rankwatch.faces")
_T = TypeVar("_T")

# A field absent from the last RECENT step lines counts as no longer printed: the exporter
# then drops the series instead of repeating a stale value forever.
RECENT = 64
HISTORY_POINTS = 120  # step lines behind the status page's sparklines

LATEST_FIELDS = (
    "loss",
    "grad_norm",
    "learning_rate",
    "loss_scale",
    "tokens_per_s",
    "samples_per_s",
    "step_time_s",
    "tflops",
    "mfu",
    "memory_bytes",
    "max_memory_bytes",
)


class AgentState(Protocol):
    """What the builder reads of the agent (``runtime.agent.Agent``)."""

    @property
    def identity(self) -> Identity: ...
    @property
    def watchers(self) -> Sequence[RankWatcher]: ...
    @property
    def findings(self) -> Sequence[Finding]: ...
    @property
    def started_at(self) -> float: ...
    @property
    def attach_problems(self) -> Mapping[int, str]: ...
    @property
    def pods(self) -> Callable[[], tuple[PodView, ...]] | None: ...
    @property
    def store(self) -> DumpStore: ...
    @property
    def dumps_captured(self) -> int: ...
    @property
    def dumps_failed(self) -> Mapping[str, int]: ...
    @property
    def last_incident(self) -> Path | None: ...
    @property
    def sink_errors(self) -> Mapping[str, int]: ...
    @property
    def internal_errors_by_component(self) -> Mapping[str, int]: ...
    @property
    def alert_stats(self) -> Mapping[str, Mapping[str, int]] | None: ...
    @property
    def alert_peer_stats(self) -> Mapping[str, int] | None: ...
    @property
    def http(self) -> HttpCounters: ...
    @property
    def gpu_latest(self) -> Callable[[], tuple[Any, bool]] | None: ...
    @property
    def loop_monitor(self) -> Any: ...
    @property
    def echo(self) -> Any: ...
    @property
    def stderr_guard(self) -> Any: ...


def _s(x: object) -> str:
    return "" if x is None else str(x)


def latest_values(steps: Iterable[StepRecord], limit: int = RECENT) -> dict[str, float]:
    """The newest printed value of each field (``steps`` newest first); NaN stays NaN."""
    out: dict[str, float] = {}
    for n, rec in enumerate(steps, 1):
        for name in LATEST_FIELDS:
            if name not in out:
                v = getattr(rec, name)
                if v is not None:
                    out[name] = float(v)
        if n >= limit or len(out) == len(LATEST_FIELDS):
            break
    return out


def _training(state: RankState) -> dict[str, Any]:
    """The fields of a RankSnapshot that come from the rank's rolling state."""
    latest = latest_values(reversed(state.steps))
    eval_loss = None
    for ev in reversed(state.evals):
        if ev.eval_loss is not None:
            eval_loss = float(ev.eval_loss)
            break
    rate = step_rate(state)
    duration = step_duration(state, rate)
    recent = list(islice(reversed(state.steps), HISTORY_POINTS))
    recent.reverse()
    return {
        "state": TrainingView(
            step_count=state.step_count,
            last_step=state.last_step,
            total_steps=state.total_steps,
            step_time_counts=tuple(state.step_time_counts),
            step_time_sum=state.step_time_sum,
        ),
        "latest": frozen_map(latest),
        "eval_loss": eval_loss,
        "steps_per_s": rate,
        "step_duration_s": duration,
        "eta_s": eta(state, rate, duration),
        "last_progress_time": state.last_progress_time,
        "recent_steps": tuple(recent),
    }


def sources_status(w: RankWatcher) -> SourcesView:
    who = f"rank {_s(w.rank) or '?'}"
    if w.prober is not None:
        return SourcesView(True, f"{who}: process {w.prober.pid} attached")
    # What the log's reads (off the loop) found: a stat here would block on a hung mount.
    present = [s for s in w.streams if s.follower.stats.bytes_read > 0 or s.follower.is_open]
    if present:
        return SourcesView(True, f"{who}: following {len(present)} of {len(w.streams)} log file(s)")
    if not w.streams:
        return SourcesView(False, f"{who}: no log configured and no process attached")
    paths = ", ".join(str(s.path) for s in w.streams[:4])
    return SourcesView(False, f"{who}: no log file yet ({paths}) and no process attached")


def _process(w: RankWatcher) -> ProcessView | None:
    if w.prober is None:
        return None
    s = w.last_sample
    sample = None
    if s is not None:
        sample = ProcessSampleView(
            alive=s.alive,
            state=s.state,
            cpu_percent=s.cpu_percent,
            cpu_time_s=s.cpu_time_s,
            rss_bytes=s.rss_bytes,
            threads=s.threads,
            children=s.children,
        )
    return ProcessView(pid=w.prober.pid, exited=w.exited, sample=sample)


def _logs(w: RankWatcher) -> LogView:
    parsed = unparsed = cut = nbytes = rot = trunc = errs = refusals = ranks = shed = 0
    for s in w.streams:
        ps, fs = s.parser.stats, s.follower.stats
        ranks += ps.rank_refused
        shed += ps.shed
        parsed, unparsed, cut = parsed + ps.parsed, unparsed + ps.unparsed, cut + ps.cut
        nbytes, rot, trunc = nbytes + fs.bytes_read, rot + fs.rotations, trunc + fs.truncations
        errs += fs.reopen_errors
        refusals += fs.refused_opens
    return LogView(
        paths=tuple(str(s.path) for s in w.streams),
        parsed=parsed,
        unparsed=unparsed,
        cut=cut,
        bytes_read=nbytes,
        rotations=rot,
        truncations=trunc,
        open_errors=errs,
        open_refused=refusals,
        rank_refused=ranks,
        shed=shed,
    )


def _part(broken: dict[str, BaseException] | None, part: str, read: Callable[[], _T]) -> _T | None:
    """``read()``, or None with the failure kept under ``part`` (raised if nobody keeps it)."""
    try:
        return read()
    except Exception as e:
        if broken is None:
            raise
        broken.setdefault(part, e)
        log.debug("reading %s for the metrics and the API failed", part, exc_info=True)
        return None


def _own_view(
    w: RankWatcher,
    labels: RankLabels,
    wall: float,
    sources: SourcesView,
    broken: dict[str, BaseException] | None,
) -> RankSnapshot:
    eng = w.engines.get(w.rank)
    fields: dict[str, Any] = _training(eng.state) if eng is not None else {}
    live = w.liveness()  # on the stall rule's own clock, so since > timeout means "stalled"
    if fields.get("last_progress_time") is None and live.stepping:
        fields["last_progress_time"] = wall - live.since
    return RankSnapshot(
        labels=labels,
        rank=w.rank,
        own=True,
        local_rank=w.identity.local_rank,
        seconds_since_progress=live.since,
        stall_timeout_s=live.timeout,
        stalled=live.stalled,
        process=_part(broken, "process", lambda: _process(w)),
        logs=_part(broken, "logs", lambda: _logs(w)),
        sources=sources,
        **fields,
    )


def rank_views(
    watchers: Iterable[RankWatcher],
    wall: float | None = None,
    sources: list[SourcesView] | None = None,
    broken: dict[str, BaseException] | None = None,
) -> list[RankSnapshot]:
    """Every rank of every watcher, one view per distinct label set (first one wins).
    ``sources``, if given, receives each watcher's sources status (in watcher order);
    ``broken``, if given, the parts of a rank that could not be read (else they raise)."""
    wall = time.time() if wall is None else wall
    out: list[RankSnapshot] = []
    seen: set[RankLabels] = set()
    for w in watchers:
        ident = w.identity
        status = sources_status(w)
        if sources is not None:
            sources.append(status)
        own = (ident.run, _s(w.rank), _s(ident.local_rank), ident.node)
        if own not in seen:
            seen.add(own)
            out.append(_own_view(w, own, wall, status, broken))
        for rank, eng in list(w.engines.items()):
            if rank == w.rank:
                continue
            labels = (ident.run, _s(rank), "", ident.node)
            if labels in seen or (eng.state.step_count == 0 and not eng.state.evals):
                continue
            seen.add(labels)
            fields = _training(eng.state)
            last = fields["last_progress_time"]
            since = max(0.0, wall - last) if last is not None else None
            view = RankSnapshot(labels=labels, rank=rank, own=False, seconds_since_progress=since, **fields)
            out.append(view)
    return out


def _own_watchers(agent: AgentState, views: Iterable[RankSnapshot]) -> list[RankWatcher]:
    """The watchers behind the own views (a watcher whose label set another took is left out)."""
    labels = {v.labels for v in views if v.own}
    out = []
    for w in agent.watchers:
        ident = w.identity
        key = (ident.run, _s(w.rank), _s(ident.local_rank), ident.node)
        if key in labels:
            labels.discard(key)
            out.append(w)
    return out


class SnapshotBuilder:
    """Per agent. Services plug in what the agent object does not hold itself (the
    checkpoint watcher's and the config reloader's numbers)."""

    def __init__(self, agent: AgentState) -> None:
        self.agent = agent
        self.tracker = FindingTracker()
        self.checkpoints: Callable[[], Mapping[str, Any] | None] | None = None
        self.config_reload: Callable[[], Mapping[str, Any]] | None = None

    def _broken(self, broken: dict[str, BaseException], part: str, e: Exception) -> None:
        broken.setdefault(part, e)
        log.debug("reading %s for the metrics and the API failed", part, exc_info=True)

    def build(self, wall: float | None = None) -> AgentSnapshot:
        agent = self.agent
        wall = time.time() if wall is None else wall
        ident = agent.identity
        broken: dict[str, BaseException] = {}
        sources: list[SourcesView] = []
        views: list[RankSnapshot] = []
        try:
            views = rank_views(list(agent.watchers), wall, sources, broken)
        except Exception as e:
            self._broken(broken, "ranks", e)
        findings = FindingsView()
        try:
            self.tracker.update(agent.findings)
            totals, active_counts = self.tracker.snapshot()
            findings = FindingsView(
                totals=frozen_map(totals),
                active_counts=frozen_map(active_counts),
                active=tuple(self.tracker.active()),
                recent=tuple(agent.findings),
            )
        except Exception as e:
            self._broken(broken, "findings", e)
        http = agent.http
        return AgentSnapshot(
            identity=ident,
            labels=(ident.run, _s(ident.rank), _s(ident.local_rank), ident.node),
            time=wall,
            started_at=agent.started_at,
            ranks=tuple(views),
            sources=tuple(sources),
            attach_problems=tuple(agent.attach_problems.values()),
            local_ranks=frozen_map(
                {w.rank: w.identity.local_rank for w in agent.watchers if w.rank is not None}
            ),
            findings=findings,
            dumps=DumpsView(
                store=agent.store,
                captured=agent.dumps_captured,
                failed=frozen_map(agent.dumps_failed),
                last_incident=agent.last_incident.name if agent.last_incident is not None else None,
            ),
            internal_errors=self._internal_errors(views, broken),
            alerts=_nested(agent.alert_stats),
            alert_groups=frozen_map(agent.alert_peer_stats) if agent.alert_peer_stats is not None else None,
            http_rejected=frozen_map(http.rejected) if http.serving else None,
            http_dropped=frozen_map(http.dropped) if http.serving else None,
            loop=_part(broken, "loop", lambda: _loop(agent.loop_monitor)),
            echo_dropped_bytes=_part(broken, "loop", lambda: _dropped(agent.echo)),
            stderr_dropped_bytes=_part(broken, "loop", lambda: _dropped(agent.stderr_guard)),
            gpu=self._gpu(broken),
            checkpoints=self._checkpoints(broken),
            config_reload=self._config(broken),
            broken=frozen_map(broken),
            http=http,
            pods=agent.pods() if agent.pods is not None else None,
        )

    def _internal_errors(
        self, views: list[RankSnapshot], broken: Mapping[str, BaseException]
    ) -> Mapping[str, int]:
        """By component: watcher-level counters, sink failures and whatever the agent counts
        under ``internal_errors_by_component`` (alerts, dumps, ...), and the server's."""
        agent = self.agent
        out = {"parser": 0, "watcher": 0, "detector": 0}
        if "ranks" not in broken:
            for w in _own_watchers(agent, views):
                out["parser"] += sum(s.parser.stats.errors for s in w.streams)
                out["watcher"] += w.internal_errors
                for name, n in list(w.source_errors.items()):
                    out[name] = out.get(name, 0) + n  # each source under its own name (logs, process)
                out["detector"] += sum(e.internal_errors for e in list(w.engines.values()))
        out["sink"] = sum(agent.sink_errors.values())
        for name, n in list(agent.internal_errors_by_component.items()):
            out[str(name)] = out.get(str(name), 0) + int(n)
        out["server"] = out.get("server", 0) + agent.http.errors
        return frozen_map(out)

    def _gpu(self, broken: dict[str, BaseException]) -> GpuView | None:
        hook = self.agent.gpu_latest
        if hook is None:
            return None
        try:
            mapping, up = hook()
            return GpuView(by_rank=frozen_map({k: tuple(v) for k, v in mapping.items()}), up=bool(up))
        except Exception as e:
            self._broken(broken, "gpu", e)
            return GpuView(error=f"GPU data unavailable: {type(e).__name__}")

    def _checkpoints(self, broken: dict[str, BaseException]) -> Mapping[str, Any] | None:
        if self.checkpoints is None:
            return None
        try:
            snap = self.checkpoints()
        except Exception as e:
            self._broken(broken, "checkpoints", e)
            return None
        return frozen_map(snap) if snap is not None else None

    def _config(self, broken: dict[str, BaseException]) -> ConfigReloadView | None:
        if self.config_reload is None:
            return None
        try:
            snap = self.config_reload()
            return ConfigReloadView(
                reloads=frozen_map(snap["reloads"]),
                last_success=bool(snap["last_success"]),
                last_success_time=float(snap["last_success_time"]),
            )
        except Exception as e:
            self._broken(broken, "config", e)
            return None


def _nested(stats: Mapping[str, Mapping[str, int]] | None) -> Mapping[str, Mapping[str, int]] | None:
    if stats is None:
        return None
    return frozen_map({str(k): frozen_map(v) for k, v in list(stats.items())})


def _dropped(sink: Any) -> int | None:
    """Bytes the echo or the stderr guard dropped (None: no such thing in this mode)."""
    return int(sink.dropped_bytes) if sink is not None else None


def _loop(mon: Any) -> LoopView | None:
    if mon is None:
        return None
    ok, text = mon.health()
    return LoopView(lag=float(mon.lag), healthy=bool(ok), health=str(text))
