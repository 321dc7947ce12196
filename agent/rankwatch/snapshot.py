"""What the exporter and the server show: one immutable snapshot of the live agent.

The runtime builds it (``rankwatch.runtime.faces``) on the event loop, once per scrape or
API request, and hands the faces a callable that returns the current one; ``/metrics``,
``/api/status`` and the status page then never disagree, and none of them reaches into
the watchers, detectors or the agent object. Everything here is a copy (numbers, strings,
tuples, read-only mappings) or a record the runtime no longer changes (findings, GPU
samples, step records: only a parser's late fields may still land on the newest step),
with two handles the faces need to act: the dump store (listed and read off the loop) and
the server's own counters (``HttpCounters``), which the runtime reads back into the next
snapshot.

Building one costs a few hundred attribute loads per rank (0.4-0.8 ms for 8 busy ranks,
GPUs and checkpoints: ``bench/bench_snapshot.py``); nothing is bookkept per event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rankwatch.identity import Identity
from rankwatch.records import Finding, StepRecord

if TYPE_CHECKING:
    from rankwatch.dumps.store import DumpStore
    from rankwatch.events import GpuSample

RANK_LABELS = ("run", "rank", "local_rank", "node")
RankLabels = tuple[str, str, str, str]
CountKey = tuple[int | None, str, str]  # (rank, kind, severity)

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def _empty() -> Mapping[Any, Any]:
    return _EMPTY


def frozen_map(d: Mapping[Any, Any] | None) -> Mapping[Any, Any]:
    """A read-only copy (the snapshot must not change when the agent's dict does)."""
    return MappingProxyType(dict(d)) if d else _EMPTY


class PartUnavailable(RuntimeError):
    """A part of the snapshot could not be read; the collectors that need it fail alone."""


@dataclass
class HttpCounters:
    """The server's own counts, kept by the runtime and read into every snapshot: the one
    thing a face writes. ``errors``: handler failures (``internal_errors_total{component="server"}``)."""

    rejected: dict[int, int] = field(default_factory=dict)  # malformed requests, by status
    dropped: dict[str, int] = field(default_factory=dict)  # connections closed, by reason
    errors: int = 0
    serving: bool = False  # a listener was started (its counters are then exported)


@dataclass(frozen=True, slots=True)
class ProcessSampleView:
    alive: bool
    state: str
    cpu_percent: float
    cpu_time_s: float
    rss_bytes: int
    threads: int
    children: int


@dataclass(frozen=True, slots=True)
class ProcessView:
    """The watched process of an own rank (absent: no process attached)."""

    pid: int
    exited: bool
    sample: ProcessSampleView | None  # None until the first sample


@dataclass(frozen=True, slots=True)
class LogView:
    """The rank's log files, summed over its streams."""

    paths: tuple[str, ...] = ()
    parsed: int = 0
    unparsed: int = 0
    cut: int = 0
    bytes_read: int = 0
    rotations: int = 0
    truncations: int = 0
    open_errors: int = 0
    open_refused: int = 0
    rank_refused: int = 0  # lines naming a rank outside the world or past logs.max_ranks
    shed: int = 0  # lines passed over unparsed while the agent was far behind (logs.shed_backlog)


@dataclass(frozen=True, slots=True)
class SourcesView:
    """Attached = something to watch exists: a process, or a log file that is there."""

    attached: bool
    detail: str


@dataclass(frozen=True, slots=True)
class TrainingView:
    """The rank's rolling state, as far as the faces show it."""

    step_count: int = 0
    last_step: int | None = None
    total_steps: int | None = None
    step_time_counts: tuple[int, ...] = ()  # per bucket of STEP_TIME_BUCKETS, then +Inf
    step_time_sum: float = 0.0


@dataclass(frozen=True, slots=True)
class RankSnapshot:
    """One rank. ``own`` is False for extra ranks found in a shared log (launcher prefixes):
    those have log data but no process, log files or stall clock of their own."""

    labels: RankLabels
    rank: int | None
    own: bool
    local_rank: int | None = None
    state: TrainingView | None = None  # None: the rank has no engine (nothing logged yet)
    latest: Mapping[str, float] = field(default_factory=_empty)  # newest printed value of each step field
    eval_loss: float | None = None
    steps_per_s: float | None = None
    step_duration_s: float | None = None
    eta_s: float | None = None
    seconds_since_progress: float | None = None
    stall_timeout_s: float | None = None
    stalled: bool = False
    last_progress_time: float | None = None
    process: ProcessView | None = None
    logs: LogView | None = None  # own ranks only
    sources: SourcesView | None = None  # own ranks only
    # The newest step lines, oldest first (the status page's sparklines).
    recent_steps: tuple[StepRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class FindingsView:
    """Counts caught up at snapshot time (a counter never goes down) and the log itself."""

    totals: Mapping[CountKey, int] = field(default_factory=_empty)  # fired since start
    active_counts: Mapping[CountKey, int] = field(default_factory=_empty)  # a 0 for every key ever active
    active: tuple[Finding, ...] = ()  # fired and not resolved since, newest first
    recent: tuple[Finding, ...] = ()  # every finding the agent still keeps, oldest first


@dataclass(frozen=True, slots=True)
class DumpsView:
    store: DumpStore | None  # a handle: listing and reading it is disk I/O, done off the loop
    captured: int = 0
    failed: Mapping[str, int] = field(default_factory=_empty)  # by reason
    last_incident: str | None = None


@dataclass(frozen=True, slots=True)
class LoopView:
    lag: float  # of the last tick
    healthy: bool
    health: str  # "ok", or why /healthz fails


@dataclass(frozen=True, slots=True)
class GpuView:
    """The GPU sampler's latest samples by rank ("" when a GPU is tied to no rank)."""

    by_rank: Mapping[Any, tuple[GpuSample, ...]] = field(default_factory=_empty)
    up: bool = False
    error: str | None = None  # the samples could not be read


@dataclass(frozen=True, slots=True)
class ConfigReloadView:
    reloads: Mapping[str, int]  # by result: ok, error
    last_success: bool
    last_success_time: float


@dataclass(frozen=True, slots=True)
class PodView:
    """A watched rank's pod (node mode on Kubernetes): what joins its series to the pod."""

    labels: RankLabels
    namespace: str
    pod: str
    container: str
    gpus: tuple[str, ...] = ()  # device IDs from the kubelet's pod-resources API (GPU UUIDs)


@dataclass(frozen=True)
class AgentSnapshot:
    identity: Identity
    labels: RankLabels  # the agent's own label set
    time: float  # wall clock when taken
    started_at: float
    ranks: tuple[RankSnapshot, ...] = ()  # one per distinct label set, own ranks first per watcher
    sources: tuple[SourcesView, ...] = ()  # one per watcher (readiness)
    attach_problems: tuple[str, ...] = ()
    local_ranks: Mapping[int, int | None] = field(default_factory=_empty)  # each watched rank's local rank
    findings: FindingsView = FindingsView()
    dumps: DumpsView = DumpsView(None)
    # By component, what the runtime counted (the exporter adds its own failures).
    internal_errors: Mapping[str, int] = field(default_factory=_empty)
    alerts: Mapping[str, Mapping[str, int]] | None = None  # by sink: sent, failed, dropped
    alert_groups: Mapping[str, int] | None = None  # cross-agent grouping, by role
    http_rejected: Mapping[int, int] | None = None  # None: no server
    http_dropped: Mapping[str, int] | None = None
    loop: LoopView | None = None
    echo_dropped_bytes: int | None = None  # run mode only
    stderr_dropped_bytes: int | None = None
    gpu: GpuView | None = None  # None: GPU monitoring off
    checkpoints: Mapping[str, Any] | None = None  # the checkpoint watcher's numbers; None: not watched
    config_reload: ConfigReloadView | None = None  # None: no hot reload
    broken: Mapping[str, BaseException] = field(default_factory=_empty)  # part -> why it could not be read
    http: HttpCounters = field(default_factory=HttpCounters)  # a handle (see the module doc)
    pods: tuple[PodView, ...] | None = None  # None: not a Kubernetes node daemon

    def need(self, part: str) -> None:
        """Raise if ``part`` could not be read: the collector showing it fails alone."""
        why = self.broken.get(part)
        if why is not None:
            raise PartUnavailable(f"{part} could not be read: {type(why).__name__}: {why}") from why

    def labels_for_rank(self) -> dict[int | None, RankLabels]:
        """Label sets by rank number, for findings (which carry only a rank)."""
        out: dict[int | None, RankLabels] = {}
        for v in self.ranks:
            out.setdefault(v.rank, v.labels)
        out.setdefault(self.identity.rank, self.labels)
        return out


SnapshotFn = Callable[[], AgentSnapshot]


@runtime_checkable
class Snapshots(Protocol):
    """Whatever can take a snapshot of itself (the runtime's ``Agent``)."""

    def snapshot(self) -> AgentSnapshot: ...


Source = SnapshotFn | Snapshots


def snapshot_fn(source: Source) -> SnapshotFn:
    """The callable behind ``source`` (an object with ``snapshot()``, or the callable itself)."""
    if isinstance(source, Snapshots):
        return source.snapshot
    return source
