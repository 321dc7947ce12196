"""A read-only snapshot of the agent, taken at scrape (or request) time.

The exporter and the JSON API derive their numbers here, once, so ``/metrics`` and
``/api/status`` never disagree. Nothing is bookkept per event: the watchers' rolling
windows already hold what is needed, and reading them costs a few hundred attribute
loads per rank.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rankwatch.records import StepRecord
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.runtime.watcher import RankWatcher

RANK_LABELS = ("run", "rank", "local_rank", "node")

# A field absent from the last RECENT step lines counts as no longer printed: the exporter
# then drops the series instead of repeating a stale value forever.
RECENT = 64
RATE_WINDOW = 50  # step lines behind the step rate (and so the ETA)
DURATION_WINDOW = 20  # printed step times behind the median step duration

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


def _s(x: object) -> str:
    return "" if x is None else str(x)


@dataclass
class RankView:
    """One rank as the agent sees it now. ``own`` is False for extra ranks found in a
    shared log (launcher prefixes): those have log data but no process or stall clock."""

    labels: tuple[str, str, str, str]
    rank: int | None
    watcher: RankWatcher
    own: bool
    state: RankState | None = None
    latest: dict[str, float] = field(default_factory=dict)
    eval_loss: float | None = None
    steps_per_s: float | None = None
    step_duration_s: float | None = None
    eta_s: float | None = None
    seconds_since_progress: float | None = None
    stall_timeout_s: float | None = None
    stalled: bool = False
    last_progress_time: float | None = None


def latest_values(steps: Iterable[StepRecord], limit: int = RECENT) -> dict[str, float]:
    """The newest printed value of each field; NaN stays NaN (it is the news)."""
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


def step_rate(state: RankState, window: int = RATE_WINDOW) -> float | None:
    """Steps per second from the timestamps of the recent step lines, after any restart."""
    recs: list[StepRecord] = []
    for rec in reversed(state.steps):
        if rec.time is None or rec.step is None:
            continue
        last = recs[-1].step if recs else None
        if last is not None and rec.step >= last:
            break  # the run restarted (e.g. from a checkpoint): only the current stretch counts
        recs.append(rec)
        if len(recs) >= window:
            break
    if len(recs) < 2:
        return None
    newest, first = recs[0], recs[-1]
    dstep = (newest.step or 0) - (first.step or 0)
    dt = (newest.time or 0.0) - (first.time or 0.0)
    return dstep / dt if dstep > 0 and dt > 0 else None


def step_duration(state: RankState, rate: float | None) -> float | None:
    """Median of the recent printed step times; else derived from the step rate."""
    printed = state.recent("step_time_s", DURATION_WINDOW)
    if printed:
        return statistics.median(printed)
    return 1.0 / rate if rate else None


def eta(state: RankState, rate: float | None, duration: float | None) -> float | None:
    if state.total_steps is None or state.last_step is None or not state.steps:
        return None
    if state.steps[-1].step_inferred:
        return None  # a count of logged lines is not comparable to the planned total
    remaining = max(0, state.total_steps - state.last_step)
    if remaining == 0:
        return 0.0
    if not rate and duration:
        rate = 1.0 / duration
    return remaining / rate if rate else None


def _fill_state(view: RankView, state: RankState) -> None:
    view.state = state
    view.latest = latest_values(reversed(state.steps))
    for ev in reversed(state.evals):
        if ev.eval_loss is not None:
            view.eval_loss = float(ev.eval_loss)
            break
    view.steps_per_s = step_rate(state)
    view.step_duration_s = step_duration(state, view.steps_per_s)
    view.eta_s = eta(state, view.steps_per_s, view.step_duration_s)
    view.last_progress_time = state.last_progress_time


def _own_view(w: RankWatcher, labels: tuple[str, str, str, str], wall: float) -> RankView:
    view = RankView(labels=labels, rank=w.rank, watcher=w, own=True)
    eng = w.engines.get(w.rank)
    if eng is not None:
        _fill_state(view, eng.state)
    stall = w.stall
    now = w.clock()
    stepping = stall.steps_seen > 0 or (view.state is not None and view.state.step_count > 0)
    # The same clock the stall detector judges by, so since > timeout means "stalled".
    since = now - (stall.last_progress if stepping else stall.last_signal)
    view.seconds_since_progress = max(0.0, since)
    try:
        view.stall_timeout_s = float(stall.timeout())
    except Exception:
        view.stall_timeout_s = None
    view.stalled = bool(stall.active)
    if view.last_progress_time is None and stepping:
        view.last_progress_time = wall - view.seconds_since_progress
    return view


def rank_views(watchers: Iterable[RankWatcher], wall: float | None = None) -> list[RankView]:
    """Every rank of every watcher, one view per distinct label set (first one wins)."""
    wall = time.time() if wall is None else wall
    out: list[RankView] = []
    seen: set[tuple[str, str, str, str]] = set()
    for w in watchers:
        ident = w.identity
        own = (ident.run, _s(w.rank), _s(ident.local_rank), ident.node)
        if own not in seen:
            seen.add(own)
            out.append(_own_view(w, own, wall))
        for rank, eng in list(w.engines.items()):
            if rank == w.rank:
                continue
            labels = (ident.run, _s(rank), "", ident.node)
            if labels in seen or (eng.state.step_count == 0 and not eng.state.evals):
                continue
            seen.add(labels)
            view = RankView(labels=labels, rank=rank, watcher=w, own=False)
            _fill_state(view, eng.state)
            if view.last_progress_time is not None:
                view.seconds_since_progress = max(0.0, wall - view.last_progress_time)
            out.append(view)
    return out


def sources_status(w: RankWatcher) -> tuple[bool, str]:
    """Attached = something to watch exists: a process, or a log file that is there."""
    who = f"rank {_s(w.rank) or '?'}"
    if w.prober is not None:
        return True, f"{who}: process {w.prober.pid} attached"
    present = [s for s in w.streams if s.follower.stats.bytes_read > 0 or s.path.exists()]
    if present:
        return True, f"{who}: following {len(present)} of {len(w.streams)} log file(s)"
    if not w.streams:
        return False, f"{who}: no log configured and no process attached"
    paths = ", ".join(str(s.path) for s in w.streams[:4])
    return False, f"{who}: no log file yet ({paths}) and no process attached"


def identity_labels(agent: Any) -> tuple[str, str, str, str]:
    ident = agent.identity
    return (ident.run, _s(ident.rank), _s(ident.local_rank), ident.node)


def labels_for_rank(views: Iterable[RankView], agent: Any) -> dict[int | None, tuple[str, str, str, str]]:
    """Label sets by rank number, for findings (which carry only a rank)."""
    out: dict[int | None, tuple[str, str, str, str]] = {}
    for v in views:
        out.setdefault(v.rank, v.labels)
    out.setdefault(agent.identity.rank, identity_labels(agent))
    return out
