"""The "can't resume" family: corrupt, incomplete, stale checkpoints and a filling disk.

Pure: the checkpoint catalog and watcher pass plain numbers and entries in, so these
rules are tested without a filesystem. The stale and free-space rules are detectors: the
watcher's scans reach them as ``CheckpointScan`` events, through the engine. Messages say
which checkpoint to resume from, since that is the question the reader has at 3 AM.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Protocol

from rankwatch.detectors.base import Detector, DetectorContext, Episode
from rankwatch.detectors.registry import register
from rankwatch.events import CheckpointScan, Event
from rankwatch.records import Finding, Severity
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.config.schema import CheckpointConfig, Config


class Entry(Protocol):
    """What these rules read of a checkpoint (``checkpoints.catalog.Entry`` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> PurePath: ...
    @property
    def layout(self) -> str: ...
    @property
    def step(self) -> int | None: ...
    @property
    def weights_only(self) -> bool: ...
    @property
    def size(self) -> int: ...
    @property
    def saved_at(self) -> float: ...


class Pointer(Protocol):
    """A "latest" file of a framework (``checkpoints.layouts.Pointer`` has it)."""

    @property
    def file(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def target(self) -> Any: ...
    @property
    def step(self) -> int | None: ...


KINDS = (
    "checkpoint_corrupt",
    "checkpoint_suspect",
    "checkpoint_incomplete",
    "checkpoint_weights_only",
    "checkpoint_stale",
    "disk_low",
)
# Findings after which weights saved later are not trusted for a resume.
POISON_KINDS = frozenset({"nan_loss", "loss_divergence", "grad_explosion"})
_RESUME_HINT = {
    "hf": "Trainer(resume_from_checkpoint=True) picks the highest checkpoint-N: delete or move it away",
    "megatron": "resume follows latest_checkpointed_iteration.txt: point it at the last good iteration",
    "deepspeed": "resume follows the 'latest' file: point it at the last good tag",
    "lightning": "pass ckpt_path= explicitly to the last good file",
}


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


def describe(entry: Entry | None, now: float) -> str:
    if entry is None:
        return "none"
    step = f"step {entry.step}, " if entry.step is not None else ""
    age = ago(now - entry.saved_at) if entry.saved_at else "time unknown"
    name = entry.path.name if entry.name == "." else entry.name
    only = ", weights only" if getattr(entry, "weights_only", False) else ""
    return f"{name} ({step}{age}{only})"


def last_good_line(entry: Entry | None, now: float) -> str:
    return f"last good: {describe(entry, now)}"


def _finding(
    kind: str,
    severity: Severity,
    rank: int | None,
    message: str,
    entry: Entry | None = None,
    *,
    path: str | None = None,
    now: float | None = None,
    evidence: dict[str, Any] | None = None,
    resolved: bool = False,
    subject: str | None = None,
) -> Finding:
    return Finding(
        kind=kind,
        severity=severity,
        rank=rank,
        message=message,
        step=entry.step if entry is not None else None,
        path=path if path is not None else (str(entry.path) if entry is not None else None),
        time=now,
        evidence=evidence or {},
        resolved=resolved,
        subject=subject,
    )


def corrupt_finding(
    entry: Entry, problem: str, check: str, last_good: Entry | None, *, rank: int | None, now: float
) -> Finding:
    hint = _RESUME_HINT.get(entry.layout, "resume explicitly from the last good one")
    return _finding(
        "checkpoint_corrupt",
        Severity.CRITICAL,
        rank,
        f"checkpoint {entry.name} is corrupt: {problem}. Do not resume from it ({hint}); "
        f"{last_good_line(last_good, now)}. Usual causes: disk full or quota hit during the save, "
        "the job killed mid-save, a flaky network filesystem.",
        entry,
        now=now,
        evidence={"check": check, "problem": problem, "last_good": last_good.name if last_good else None},
    )


def changed_finding(
    entry: Entry, file: str, last_good: Entry | None, *, rank: int | None, now: float
) -> Finding:
    return _finding(
        "checkpoint_corrupt",
        Severity.CRITICAL,
        rank,
        f"checkpoint {entry.name}: {file} changed on disk after it was verified (sha256 differs, size and "
        f"time unchanged): silent corruption. {last_good_line(last_good, now)}.",
        entry,
        now=now,
        evidence={"check": "sha256", "file": file},
    )


def incomplete_finding(
    entry: Entry, marker: str | None, quiet_s: float, last_good: Entry | None, *, rank: int | None, now: float
) -> Finding:
    what = f"no {marker}" if marker else "it never finished"
    hint = _RESUME_HINT.get(entry.layout, "resume explicitly from the last good one")
    return _finding(
        "checkpoint_incomplete",
        Severity.WARNING,
        rank,
        f"checkpoint {entry.name} is incomplete: {what} {duration(quiet_s)} after its last write. The save "
        f"was interrupted (crash, kill, full disk); do not resume from it ({hint}); "
        f"{last_good_line(last_good, now)}.",
        entry,
        now=now,
        evidence={"marker": marker, "quiet_s": quiet_s},
    )


def small_finding(entry: Entry, prev: Entry, *, rank: int | None, now: float) -> Finding:
    ratio = entry.size / prev.size if prev.size else 0.0
    return _finding(
        "checkpoint_suspect",
        Severity.WARNING,
        rank,
        f"checkpoint {entry.name} is suspiciously small: {human_size(entry.size)}, {ratio:.0%} of "
        f"{prev.name} ({human_size(prev.size)}). A shard or tensor may be missing; check it before relying "
        "on it.",
        entry,
        now=now,
        evidence={
            "check": "size",
            "size_bytes": entry.size,
            "previous_bytes": prev.size,
            "previous": prev.name,
        },
    )


def weights_only_finding(entry: Entry, *, regressed: bool, rank: int | None, now: float) -> Finding:
    was = " (the previous checkpoint had optimizer state)" if regressed else ""
    return _finding(
        "checkpoint_weights_only",
        Severity.WARNING if regressed else Severity.INFO,
        rank,
        f"checkpoint {entry.name} holds weights only, no optimizer state{was}: resume will restart Adam's "
        "moments and the LR schedule (HF save_only_model, Lightning save_weights_only, "
        "Megatron --no-save-optim).",
        entry,
        now=now,
    )


def pointer_finding(ptr: Pointer, root: str, *, rank: int | None, now: float) -> Finding:
    return Finding(
        kind="checkpoint_corrupt",
        severity=Severity.CRITICAL,
        rank=rank,
        message=f"{ptr.file} points at {ptr.value!r} but {ptr.target} does not exist: resume will fail. "
        "Point it at the last good checkpoint.",
        step=ptr.step,
        path=root,
        time=now,
        evidence={"check": "pointer", "file": ptr.file, "value": ptr.value},
    )


# One cause of a firing checkpoint finding: ("saved", name) a save that failed or is
# suspect, ("changed", name) a verified file altered later, ("pointer", file, value) a
# "latest" pointer leading nowhere, ("weights",) the newest checkpoint holds weights only.
Cause = tuple[str, ...]

_CLEARED = {
    "checkpoint_corrupt": "no corrupt checkpoint or broken pointer is left in the way of a resume",
    "checkpoint_suspect": "the suspiciously small checkpoint is no longer the newest",
    "checkpoint_incomplete": "the interrupted save is no longer the newest",
    "checkpoint_weights_only": "the newest checkpoint holds optimizer state again",
}


def cause_text(cause: Cause) -> str:
    if cause[0] == "pointer":
        return f"{cause[1]} -> {cause[2]!r}"
    if cause[0] == "weights":
        return "weights-only saves"
    return cause[1]


class OpenFindings:
    """Which checkpoint findings are still firing, and for what, so each kind resolves once.

    Alerts are keyed by (kind, rank): one resolve closes the alert whatever fired it, so a
    kind with two causes (a corrupt save and a broken ``latest``) resolves only when the
    last of them clears. A cause that cleared and comes back fires again.
    """

    def __init__(self) -> None:
        self.causes: dict[str, dict[Cause, Severity]] = {}

    def open(self, kind: str, cause: Cause, severity: Severity) -> bool:
        """Note a cause; False when it was already firing (say it once)."""
        mine = self.causes.setdefault(kind, {})
        new = cause not in mine
        mine[cause] = max(severity, mine.get(cause, severity))
        return new

    def is_open(self, kind: str, cause: Cause) -> bool:
        return cause in self.causes.get(kind, {})

    def settle(self, holds: Callable[[Cause], bool]) -> list[tuple[str, Severity, list[Cause]]]:
        """Forget causes that no longer hold; per kind left with none: (kind, worst severity, cleared)."""
        out: list[tuple[str, Severity, list[Cause]]] = []
        for kind, mine in list(self.causes.items()):
            gone = [c for c in mine if not holds(c)]
            if not gone:
                continue
            worst = max(mine.values())
            for c in gone:
                del mine[c]
            if not mine:
                del self.causes[kind]
                out.append((kind, worst, gone))
        return out


def resolved_finding(
    kind: str,
    severity: Severity,
    cleared: Sequence[Cause],
    last_good: Entry | None,
    *,
    rank: int | None,
    path: str,
    now: float,
) -> Finding:
    what = ", ".join(cause_text(c) for c in cleared)
    return _finding(
        kind,
        severity,
        rank,
        f"{_CLEARED.get(kind, kind + ' cleared')} ({what}); {last_good_line(last_good, now)}",
        last_good,
        path=str(last_good.path) if last_good is not None else path,
        now=now,
        evidence={"cleared": [cause_text(c) for c in cleared]},
        resolved=True,
    )


def next_save_due(save_times: Sequence[float]) -> float | None:
    """The last save plus the run's median save interval; None before two saves."""
    times = sorted(save_times)
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    return times[-1] + statistics.median(gaps) if gaps else None


def stale_limit(cfg: CheckpointConfig, save_times: Sequence[float]) -> float | None:
    """How old the newest good save may get: ``max_age`` when set, else ``stale_factor``
    times the run's median save interval (never under ``stale_min``); None before two saves."""
    if cfg.max_age is not None:
        return float(cfg.max_age)
    times = sorted(save_times)
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    if not gaps:
        return None
    return max(float(cfg.stale_min), cfg.stale_factor * statistics.median(gaps))


@register
class CheckpointDiskDetector(Detector):
    """Free space too small for the next save: said before the save fails."""

    kinds = ("disk_low",)
    accepts = (CheckpointScan,)
    section = "checkpoints"

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> CheckpointDiskDetector | None:
        return cls(cfg.checkpoints, ctx.rank) if cfg.checkpoints.dir else None

    def __init__(self, cfg: CheckpointConfig, rank: int | None = None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.severity: Severity | None = None

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, CheckpointScan) or record.free is None:
            return []
        return self.check(record.free, record.next_size, path=record.root, now=record.wall)

    def check(self, free: int, next_size: int | None, *, path: str, now: float) -> list[Finding]:
        rank = self.rank
        need = max(float(self.cfg.min_free), (next_size or 0) * self.cfg.disk_margin)
        if need <= 0:
            return []
        if free < need:
            sev = Severity.CRITICAL if next_size and free < next_size else Severity.WARNING
            if self.severity is not None and sev <= self.severity:
                return []
            self.severity = sev
            size = (
                f"the next checkpoint needs about {human_size(next_size)}" if next_size else "below min_free"
            )
            return [
                Finding(
                    kind="disk_low",
                    severity=sev,
                    rank=rank,
                    message=f"checkpoint filesystem has {human_size(free)} free; {size} "
                    f"(x{self.cfg.disk_margin:g} margin = {human_size(need)}). The next save will "
                    f"{'fail' if sev is Severity.CRITICAL else 'likely fail'}: free space, lower "
                    "save_total_limit, or move checkpoints off this filesystem.",
                    path=path,
                    time=now,
                    evidence={"free_bytes": free, "next_checkpoint_bytes": next_size, "need_bytes": need},
                )
            ]
        if self.severity is not None and free >= need * 1.05:
            sev, self.severity = self.severity, None
            return [
                Finding(
                    kind="disk_low",
                    severity=sev,
                    rank=rank,
                    message=f"checkpoint filesystem has {human_size(free)} free again",
                    path=path,
                    time=now,
                    resolved=True,
                )
            ]
        return []


@register
class CheckpointStaleDetector(Detector):
    """No new good checkpoint for much longer than the run's own save cadence."""

    kinds = ("checkpoint_stale",)
    accepts = (CheckpointScan,)
    section = "checkpoints"

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> CheckpointStaleDetector | None:
        return cls(cfg.checkpoints, ctx.rank) if cfg.checkpoints.dir else None

    def __init__(self, cfg: CheckpointConfig, rank: int | None = None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.episode = Episode()

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, CheckpointScan):
            return []
        return self.check(record.wall, record.last_good, record.save_times, record.started, path=record.root)

    def check(
        self,
        now: float,
        last_good: Entry | None,
        save_times: Sequence[float],
        started: float,
        *,
        path: str,
    ) -> list[Finding]:
        rank = self.rank
        limit = stale_limit(self.cfg, save_times)
        if limit is None:
            return []
        # A checkpoint from before the agent started (a restarted job) is not this run's fault.
        ref = max(started, last_good.saved_at) if last_good is not None else started
        age = now - ref
        if age > limit:
            if not self.episode.open(last_good.step if last_good else None):
                return []
            since = f"{describe(last_good, now)}" if last_good else "none since the agent started"
            return [
                _finding(
                    "checkpoint_stale",
                    Severity.WARNING,
                    rank,
                    f"no new good checkpoint for {duration(age)} (limit {duration(limit)}, from the save "
                    f"cadence); last good: {since}. A crash now loses everything since. Check that saves "
                    "still run and succeed (disk, permissions, a hung save).",
                    last_good,
                    path=path,
                    now=now,
                    evidence={"age_s": age, "max_age_s": limit},
                    subject=path,
                )
            ]
        if self.episode.close():
            return [
                _finding(
                    "checkpoint_stale",
                    Severity.WARNING,
                    rank,
                    f"new good checkpoint: {describe(last_good, now)}",
                    last_good,
                    path=path,
                    now=now,
                    resolved=True,
                    subject=path,
                )
            ]
        return []
