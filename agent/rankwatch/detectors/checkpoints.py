"""The "can't resume" family: corrupt, incomplete, stale checkpoints and a filling disk.

Pure: the checkpoint watcher (``checkpoints/``) finds facts about the folder and hands
them on as events: what it found wrong with a save or a pointer, what cleared, and each
scan (free space, the newest good save, the save cadence). These rules word them as
findings, so they are tested without a filesystem. Messages say which checkpoint to resume
from, since that is the question the reader has at 3 AM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rankwatch.detectors.base import Detector, DetectorContext, Episode
from rankwatch.detectors.registry import register
from rankwatch.events import (
    CheckpointCleared,
    CheckpointCorrupt,
    CheckpointEvent,
    CheckpointGroup,
    CheckpointIncomplete,
    CheckpointPointerBroken,
    CheckpointScan,
    CheckpointSmall,
    CheckpointWeightsOnly,
    Event,
    SavedCheckpoint,
    describe,
    duration,
    human_size,
    last_good_line,
)
from rankwatch.records import Finding, Severity
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.config.schema import CheckpointConfig, Config


KINDS = (
    "checkpoint_corrupt",
    "checkpoint_suspect",
    "checkpoint_incomplete",
    "checkpoint_weights_only",
    "checkpoint_stale",
    "disk_low",
)
_RESUME_HINT = {
    "hf": "Trainer(resume_from_checkpoint=True) picks the highest checkpoint-N: delete or move it away",
    "megatron": "resume follows latest_checkpointed_iteration.txt: point it at the last good iteration",
    "deepspeed": "resume follows the 'latest' file: point it at the last good tag",
    "lightning": "pass ckpt_path= explicitly to the last good file",
}
_CLEARED = {
    "corrupt": "no corrupt checkpoint or broken pointer is left in the way of a resume",
    "suspect": "the suspiciously small checkpoint is no longer the newest",
    "incomplete": "the interrupted save is no longer the newest",
    "weights_only": "the newest checkpoint holds optimizer state again",
}
_FIRST_SEVERITY: dict[CheckpointGroup, Severity] = {
    "corrupt": Severity.CRITICAL,
    "suspect": Severity.WARNING,
    "incomplete": Severity.WARNING,
    "weights_only": Severity.INFO,
}


def _finding(
    kind: str,
    severity: Severity,
    rank: int | None,
    message: str,
    entry: SavedCheckpoint | None = None,
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


def _corrupt(e: CheckpointCorrupt, rank: int | None) -> Finding:
    c, now = e.checkpoint, e.wall
    if e.file is not None:
        return _finding(
            "checkpoint_corrupt",
            Severity.CRITICAL,
            rank,
            f"checkpoint {c.name}: {e.file} changed on disk after it was verified (sha256 differs, size "
            f"and time unchanged): silent corruption. {last_good_line(e.last_good, now)}.",
            c,
            now=now,
            evidence={"check": "sha256", "file": e.file},
        )
    hint = _RESUME_HINT.get(c.layout, "resume explicitly from the last good one")
    return _finding(
        "checkpoint_corrupt",
        Severity.CRITICAL,
        rank,
        f"checkpoint {c.name} is corrupt: {e.problem}. Do not resume from it ({hint}); "
        f"{last_good_line(e.last_good, now)}. Usual causes: disk full or quota hit during the save, "
        "the job killed mid-save, a flaky network filesystem.",
        c,
        now=now,
        evidence={
            "check": e.check,
            "problem": e.problem,
            "last_good": e.last_good.name if e.last_good else None,
        },
    )


def _incomplete(e: CheckpointIncomplete, rank: int | None) -> Finding:
    c = e.checkpoint
    what = f"no {e.marker}" if e.marker else "it never finished"
    hint = _RESUME_HINT.get(c.layout, "resume explicitly from the last good one")
    return _finding(
        "checkpoint_incomplete",
        Severity.WARNING,
        rank,
        f"checkpoint {c.name} is incomplete: {what} {duration(e.quiet_s)} after its last write. The save "
        f"was interrupted (crash, kill, full disk); do not resume from it ({hint}); "
        f"{last_good_line(e.last_good, e.wall)}.",
        c,
        now=e.wall,
        evidence={"marker": e.marker, "quiet_s": e.quiet_s},
    )


def _small(e: CheckpointSmall, rank: int | None) -> Finding:
    c, prev = e.checkpoint, e.previous
    ratio = c.size / prev.size if prev.size else 0.0
    return _finding(
        "checkpoint_suspect",
        Severity.WARNING,
        rank,
        f"checkpoint {c.name} is suspiciously small: {human_size(c.size)}, {ratio:.0%} of "
        f"{prev.name} ({human_size(prev.size)}). A shard or tensor may be missing; check it before relying "
        "on it.",
        c,
        now=e.wall,
        evidence={
            "check": "size",
            "size_bytes": c.size,
            "previous_bytes": prev.size,
            "previous": prev.name,
        },
    )


def _weights_only(e: CheckpointWeightsOnly, rank: int | None) -> Finding:
    was = " (the previous checkpoint had optimizer state)" if e.regressed else ""
    return _finding(
        "checkpoint_weights_only",
        Severity.WARNING if e.regressed else Severity.INFO,
        rank,
        f"checkpoint {e.checkpoint.name} holds weights only, no optimizer state{was}: resume will restart "
        "Adam's moments and the LR schedule (HF save_only_model, Lightning save_weights_only, "
        "Megatron --no-save-optim).",
        e.checkpoint,
        now=e.wall,
    )


def _pointer(e: CheckpointPointerBroken, rank: int | None) -> Finding:
    return Finding(
        kind="checkpoint_corrupt",
        severity=Severity.CRITICAL,
        rank=rank,
        message=f"{e.file} points at {e.value!r} but {e.target} does not exist: resume will fail. "
        "Point it at the last good checkpoint.",
        step=e.step,
        path=e.root,
        time=e.wall,
        evidence={"check": "pointer", "file": e.file, "value": e.value},
    )


@register
class CheckpointProblemDetector(Detector):
    """What the watcher found wrong with a save or a "latest" pointer, and its all-clear.

    Alerts are keyed by (kind, rank): one resolve closes the alert whatever fired it, so the
    watcher says a group cleared only when its last cause did; this rule resolves it at the
    worst severity it fired with.
    """

    kinds = ("checkpoint_corrupt", "checkpoint_suspect", "checkpoint_incomplete", "checkpoint_weights_only")
    accepts = (
        CheckpointCorrupt,
        CheckpointIncomplete,
        CheckpointSmall,
        CheckpointWeightsOnly,
        CheckpointPointerBroken,
        CheckpointCleared,
    )
    section = "checkpoints"

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> CheckpointProblemDetector | None:
        return cls(ctx.rank) if cfg.checkpoints.dir else None

    def __init__(self, rank: int | None = None) -> None:
        self.rank = rank
        self.firing: dict[CheckpointGroup, Severity] = {}

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, self.accepts):
            return []
        return [self.judge(record)]

    def judge(self, e: CheckpointEvent) -> Finding:
        if isinstance(e, CheckpointCleared):
            sev = self.firing.pop(e.group, _FIRST_SEVERITY[e.group])
            good = e.last_good
            return _finding(
                f"checkpoint_{e.group}",
                sev,
                self.rank,
                f"{_CLEARED[e.group]} ({', '.join(e.causes)}); {last_good_line(good, e.wall)}",
                good,
                path=str(good.path) if good is not None else e.root,
                now=e.wall,
                evidence={"cleared": list(e.causes)},
                resolved=True,
            )
        if isinstance(e, CheckpointCorrupt):
            f = _corrupt(e, self.rank)
        elif isinstance(e, CheckpointIncomplete):
            f = _incomplete(e, self.rank)
        elif isinstance(e, CheckpointSmall):
            f = _small(e, self.rank)
        elif isinstance(e, CheckpointWeightsOnly):
            f = _weights_only(e, self.rank)
        else:
            f = _pointer(e, self.rank)
        self.firing[e.group] = max(f.severity, self.firing.get(e.group, f.severity))
        return f


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
        last_good: SavedCheckpoint | None,
        save_times: Sequence[float],
        started: float,
        *,
        path: str,
    ) -> list[Finding]:
        rank = self.rank
        limit = self.cfg.stale_limit(save_times)
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
