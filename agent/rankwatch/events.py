"""Typed events that flow from the sources to the engine, beside the log records.

Plain data: every layer may import this module, and nothing here does I/O. A source
(process prober, NVML sampler, disk probe, checkpoint watcher, the runtime's timers)
builds these; the engine routes each one by its type to the detectors that declare it in
``accepts``. Times named ``now`` are monotonic (a wall-clock jump can neither fake nor
hide a stall); ``wall`` is seconds since the epoch, for what is compared with file times
or a job's end.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import ClassVar, Literal

from rankwatch.records import ErrorRecord, EvalRecord, OverflowRecord, Record, StepRecord, median

__all__ = [
    "CheckpointCleared",
    "CheckpointCorrupt",
    "CheckpointEvent",
    "CheckpointIncomplete",
    "CheckpointPointerBroken",
    "CheckpointScan",
    "CheckpointSmall",
    "CheckpointStatus",
    "CheckpointWeightsOnly",
    "DiskSample",
    "Event",
    "GpuInfo",
    "GpuRound",
    "GpuSample",
    "LogActivity",
    "NvmlHang",
    "ProcessExit",
    "ProcessSample",
    "ProcessStart",
    "Progress",
    "Record",
    "SavedCheckpoint",
    "Tick",
]


# --- the process ----------------------------------------------------------------------


@dataclass(slots=True)
class ProcessSample:
    """The watched process tree at one moment (``sources.process.ProcessProber``)."""

    time: float  # monotonic seconds, from the prober's clock
    pid: int
    alive: bool
    exit_code: int | None = None  # only for our own child, else None
    cpu_time_s: float = 0.0  # user+system of the tree, reaped children included
    cpu_percent: float = 0.0  # since the previous sample, of one core (may exceed 100)
    rss_bytes: int = 0  # tree total
    threads: int = 0  # tree total
    state: str = "dead"
    children: int = 0  # live descendants
    cmdline: list[str] = field(default_factory=list)
    # What the tree may use before the kernel's OOM killer steps in: the cgroup's memory
    # limit where one is set, else the host's RAM; None when unknown.
    memory_limit_bytes: int | None = None
    # What may still be allocated before that limit: the tightest of the cgroups' headroom
    # (page cache it could drop counted as free) and the host's available memory.
    memory_available_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessStart:
    """The runtime started watching a process (a new pid after a restart resets liveness)."""

    now: float
    pid: int


@dataclass(frozen=True, slots=True)
class ProcessExit:
    """The watched process ended. ``exit_code`` follows subprocess (negative: that signal).

    ``requested``: the agent forwarded a stop signal (its number when known).
    ``disk_full``: the log's filesystem was full at the time (what was found).
    ``tail``: the last lines of its output.
    """

    exit_code: int | None
    signal: int | None
    tail: tuple[str, ...] = ()
    requested: bool | int = False
    disk_full: str | None = None
    wall: float | None = None
    stopped_by: str = "we forwarded"  # who sent the ``requested`` stop (the launcher, for its workers)


# --- progress and activity --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    """A rank's last step advanced (or went back: a restart), at monotonic ``now``.

    Derived by the runtime from the log records of any rank a watcher follows, so that a
    watcher whose log carries other ranks' prefixes still sees its progress."""

    now: float
    step: int | None


@dataclass(frozen=True, slots=True)
class LogActivity:
    """The rank's log grew (a sign of life even without step lines)."""

    now: float


@dataclass(frozen=True, slots=True)
class CheckpointStatus:
    """What the checkpoint watcher knows, polled: ``scans`` done, a save ``writing`` now,
    when the newest judged checkpoint was saved (wall, file mtime), and when the next save
    is due from the run's cadence (wall; None before two saves)."""

    now: float
    scans: int
    writing: bool
    last_saved: float | None = None
    next_due: float | None = None
    # Seconds before ``now`` that a save in progress last changed on disk: the write is the
    # progress, not the save being open (a writer hung in torch.save writes nothing more).
    write_age: float | None = None


@dataclass(frozen=True, slots=True)
class SavedCheckpoint:
    """A checkpoint the watcher judged, as the rules read it (a copy: the catalog's
    entries change under the scan thread)."""

    name: str
    path: PurePath
    step: int | None
    saved_at: float  # wall, the file mtime
    layout: str = ""
    size: int = 0
    weights_only: bool = False


@dataclass(frozen=True, slots=True)
class CheckpointScan:
    """One scan of the checkpoint folder ``root``, for the stale and free-space rules.

    ``wall`` is when it ended, compared with the saves' mtimes; ``started`` is when the
    watcher began (wall), since a save older than the agent is not this run's fault.
    ``save_times`` are the recent good saves (wall), whose median gap is the cadence.
    ``free`` is what its filesystem has left (None: statvfs failed) and ``next_size`` what
    the next save will likely take (None before one completed)."""

    now: float
    wall: float
    root: str
    started: float
    save_times: tuple[float, ...] = ()
    last_good: SavedCheckpoint | None = None
    free: int | None = None
    next_size: int | None = None


# What the checkpoint watcher found wrong, each one a fact about the folder: the checkpoint
# rules (``detectors.checkpoints``) word it as a finding. ``group`` is the finding a problem
# belongs to: a group resolves (``CheckpointCleared``) once its last cause cleared.
CheckpointGroup = Literal["corrupt", "suspect", "incomplete", "weights_only"]


@dataclass(frozen=True, slots=True)
class _CheckpointFact:
    wall: float  # when the scan that found it ended
    root: str  # the watched folder


@dataclass(frozen=True, slots=True)
class _SaveFact(_CheckpointFact):
    checkpoint: SavedCheckpoint


@dataclass(frozen=True, slots=True)
class CheckpointCorrupt(_SaveFact):
    """A finished save failed its ``check`` (``problem`` says how); with ``file``, a file
    verified earlier changed on disk since (its sha256 differs)."""

    group: ClassVar[CheckpointGroup] = "corrupt"
    problem: str
    check: str
    last_good: SavedCheckpoint | None
    file: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointIncomplete(_SaveFact):
    """A save stopped changing ``quiet_s`` ago without its framework's ``marker`` (None: it
    never finished, or its files disappeared)."""

    group: ClassVar[CheckpointGroup] = "incomplete"
    marker: str | None
    quiet_s: float
    last_good: SavedCheckpoint | None


@dataclass(frozen=True, slots=True)
class CheckpointSmall(_SaveFact):
    """An intact save much smaller than the intact one before it (``previous``)."""

    group: ClassVar[CheckpointGroup] = "suspect"
    previous: SavedCheckpoint


@dataclass(frozen=True, slots=True)
class CheckpointWeightsOnly(_SaveFact):
    """The newest save holds no optimizer state; ``regressed``: the one before it did."""

    group: ClassVar[CheckpointGroup] = "weights_only"
    regressed: bool


@dataclass(frozen=True, slots=True)
class CheckpointPointerBroken(_CheckpointFact):
    """A framework's "latest" ``file`` names ``value``, and ``target`` does not exist."""

    group: ClassVar[CheckpointGroup] = "corrupt"
    file: str
    value: str
    target: str
    step: int | None


@dataclass(frozen=True, slots=True)
class CheckpointCleared(_CheckpointFact):
    """Every cause of ``group`` cleared (``causes``: what they were, as text)."""

    group: CheckpointGroup
    causes: tuple[str, ...]
    last_good: SavedCheckpoint | None


CheckpointEvent = (
    CheckpointCorrupt
    | CheckpointIncomplete
    | CheckpointSmall
    | CheckpointWeightsOnly
    | CheckpointPointerBroken
    | CheckpointCleared
)


# --- checkpoint wording shared by ``rankwatch checkpoints`` and the checkpoint rules -----------


def human_size(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    s = max(0.0, seconds)
    if s < 90:
        return f"{s:.0f}s ago"
    if s < 5400:
        return f"{s / 60:.0f}m ago"
    if s < 2 * 86400:
        return f"{s / 3600:.0f}h ago"
    return f"{s / 86400:.0f}d ago"


def duration(seconds: float) -> str:
    return ago(seconds).removesuffix(" ago")


def describe(saved: SavedCheckpoint | None, now: float) -> str:
    if saved is None:
        return "none"
    step = f"step {saved.step}, " if saved.step is not None else ""
    age = ago(now - saved.saved_at) if saved.saved_at else "time unknown"
    name = saved.path.name if saved.name == "." else saved.name
    only = ", weights only" if saved.weights_only else ""
    return f"{name} ({step}{age}{only})"


def last_good_line(saved: SavedCheckpoint | None, now: float) -> str:
    return f"last good: {describe(saved, now)}"


def median_save_gap(save_times: Sequence[float]) -> float | None:
    """The run's save cadence: the median gap between its good saves (None before two)."""
    times = sorted(save_times)
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    return median(gaps) if gaps else None


def next_save_due(save_times: Sequence[float]) -> float | None:
    """The last save plus the run's median save interval; None before two saves."""
    gap = median_save_gap(save_times)
    return max(save_times) + gap if gap is not None else None


@dataclass(frozen=True, slots=True)
class Tick:
    """A timer: for the rules judged on time alone (a job's time limit)."""

    now: float
    wall: float


# --- the GPUs ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None
    compute_capability: str | None = None  # "9.0"


@dataclass(slots=True)
class GpuSample:
    """One GPU at one moment. ``None`` means "not read" (unsupported or failed), never zero."""

    index: int
    time: float
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None
    compute_capability: str | None = None
    # How this GPU was tied to the rank: configured, nvml_process, cuda_visible_devices,
    # local_rank, or unattributed (every GPU of the node watched: it may be a neighbour's).
    attribution: str | None = None
    lost: bool = False
    lost_reason: str | None = None
    utilization: float | None = None  # ratio 0..1
    memory_utilization: float | None = None  # memory-controller busy ratio 0..1
    memory_used: int | None = None  # bytes
    memory_total: int | None = None
    temperature: float | None = None  # celsius
    memory_temperature: float | None = None
    power: float | None = None  # watts
    power_limit: float | None = None
    sm_clock: float | None = None  # hertz
    memory_clock: float | None = None
    throttle: dict[str, bool] | None = None  # supported reason -> active
    ecc: dict[tuple[str, str], int] | None = None  # (corrected|uncorrected, volatile|aggregate)
    retired_pages: dict[str, int] | None = None  # cause -> pages
    retired_pages_pending: bool | None = None
    remapped_rows: dict[str, int] | None = None  # correctable|uncorrectable -> rows
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    pcie_replays: int | None = None
    # False when ecc .. pcie_replays and violations were not read this sample but carried
    # forward from the last read (``gpu.health_interval``): kept for /metrics, but no news
    # for the detectors, which neither fire nor count a quiet sample on them.
    health_fresh: bool = True
    xids: list[int] = field(default_factory=list)  # Xid numbers seen since the previous sample
    xid_counts: dict[int, int] = field(default_factory=dict)  # cumulative since the sampler started
    memory_free: int | None = None  # bytes
    memory_reserved: int | None = None  # bytes the driver keeps (NVML memory v2)
    energy: float | None = None  # joules since the driver loaded (a counter)
    pcie_tx: float | None = None  # bytes/s over the last NVML window (~20 ms)
    pcie_rx: float | None = None
    violations: dict[str, float] | None = None  # policy -> seconds of clock limitation (counters)
    nvlink_tx: float | None = None  # bytes since the driver loaded, all links (a counter)
    nvlink_rx: float | None = None
    nvlink_errors: dict[str, int] | None = None  # crc_flit|crc_data|replay|recovery -> count
    sm_active: float | None = None  # GPM ratios 0..1 (Hopper and later)
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None

    @property
    def memory_ratio(self) -> float | None:
        if self.memory_used is None or not self.memory_total:
            return None
        return self.memory_used / self.memory_total


@dataclass(frozen=True, slots=True)
class GpuRound:
    """One sampling round of the GPUs tied to one rank (all of them, or those of the round)."""

    now: float  # monotonic, the rank's clock
    samples: tuple[GpuSample, ...]


@dataclass(frozen=True, slots=True)
class NvmlHang:
    """How long NVML has not answered (None: it answers)."""

    now: float
    hung_for: float | None


# --- filesystems ------------------------------------------------------------------------


@dataclass
class DiskSample:
    """``statvfs`` of one filesystem; ``roles`` are the agent's folders on it (``{path: "log"}``)."""

    roles: dict[str, str]
    free: int  # bytes available to an unprivileged writer (f_bavail)
    total: int
    time: float  # monotonic
    error: str | None = None  # the sample failed (timeout: a hung mount)
    device: int | None = field(default=None)
    wall: float | None = None  # when it was taken, for the finding's time


Event = (
    StepRecord
    | EvalRecord
    | ErrorRecord
    | OverflowRecord
    | ProcessSample
    | ProcessStart
    | ProcessExit
    | Progress
    | LogActivity
    | CheckpointStatus
    | CheckpointScan
    | CheckpointEvent
    | Tick
    | GpuRound
    | NvmlHang
    | DiskSample
)
