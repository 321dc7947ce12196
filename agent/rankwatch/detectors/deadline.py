"""Will the run outlive its allocation with nothing saved?

A Slurm job killed at its time limit loses everything since the last checkpoint. That is
only news when the run will not finish in time *and* no checkpoint is due before the
end: a run that saves every 30 minutes loses at most 30 minutes, which the user chose.
Pure: the agent passes wall-clock times in (the job end is a wall-clock deadline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankwatch.detectors.base import Detector, DetectorContext, Episode
from rankwatch.detectors.registry import register
from rankwatch.events import CheckpointStatus, Event, Tick
from rankwatch.records import Finding, Severity
from rankwatch.state import RankState, eta

if TYPE_CHECKING:
    from rankwatch.config.schema import Config

KIND = "eta_past_job_end"
SUSTAIN = 3  # checks in a row; one slow stretch must not warn


def _dur(seconds: float) -> str:
    s = max(0, int(seconds))
    h, rem = divmod(s, 3600)
    m = rem // 60
    return f"{h}h{m:02d}m" if h else f"{m}m"


@register
class DeadlineDetector(Detector):
    """Judged on every ``Tick`` from the rank's state (its ETA) and the checkpoint cadence
    (``CheckpointStatus``); built only where the job's end is known."""

    kinds = (KIND,)
    accepts = (Tick, CheckpointStatus)
    section = "run"  # run.job_end, else the scheduler's (ctx.job_end)

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> DeadlineDetector | None:
        if ctx.job_end is None:
            return None
        return cls(ctx.rank, job_end=ctx.job_end, checkpoints_watched=bool(cfg.checkpoints.dir))

    def __init__(
        self,
        rank: int | None,
        *,
        margin: float = 300.0,
        job_end: float | None = None,
        checkpoints_watched: bool = False,
    ) -> None:
        self.rank = rank
        self.margin = margin
        self.episode = Episode()
        self.hits = 0
        self.job_end = job_end
        self.checkpoints_watched = checkpoints_watched
        self.next_checkpoint: float | None = None

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if isinstance(record, CheckpointStatus):
            self.next_checkpoint = record.next_due
            return []
        if not isinstance(record, Tick):
            return []
        return self.check(
            now=record.wall,
            job_end=self.job_end,
            eta=eta(state),
            step=state.last_step,
            next_checkpoint=self.next_checkpoint,
            checkpoints_watched=self.checkpoints_watched,
        )

    def check(
        self,
        *,
        now: float,
        job_end: float | None,
        eta: float | None,
        step: int | None,
        next_checkpoint: float | None,
        checkpoints_watched: bool,
    ) -> list[Finding]:
        """``next_checkpoint``: when the next save is due from the run's cadence (None: unknown)."""
        if job_end is None or eta is None:
            return []
        left = job_end - now
        late = now + eta > job_end
        saved_in_time = next_checkpoint is not None and next_checkpoint <= job_end - self.margin
        bad = late and left > 0 and not saved_in_time
        if not bad:
            self.hits = 0
            if self.episode.close():
                return [self._finding(step, "the run now finishes, or saves, before the job ends", True)]
            return []
        self.hits += 1
        if self.hits < SUSTAIN or not self.episode.open(step):
            return []
        if not checkpoints_watched:
            ckpt = "no checkpoint directory is watched, so no save is known to be due before then"
        elif next_checkpoint is None:
            ckpt = "no checkpoint has been seen yet"
        else:
            ckpt = f"the next checkpoint is due in {_dur(next_checkpoint - now)}, after the job ends"
        msg = (
            f"at the current step rate the run needs {_dur(eta)} more, but the job ends in {_dur(left)}; "
            f"{ckpt}. The work since the last checkpoint will be lost at the time limit. Usual fix: save "
            "a checkpoint now, or have the job signalled before its end (sbatch --signal=B:USR1@300) and "
            "save on the signal; then requeue."
        )
        return [self._finding(step, msg, False, eta=eta, left=left, next_checkpoint=next_checkpoint)]

    def _finding(self, step: int | None, message: str, resolved: bool, **evidence: float | None) -> Finding:
        return Finding(
            kind=KIND,
            severity=Severity.WARNING,
            rank=self.rank,
            message=message,
            step=step,
            evidence={k: (round(v, 1) if v is not None else None) for k, v in evidence.items()},
            resolved=resolved,
        )
