"""Will the run outlive its allocation with nothing saved?

A Slurm job killed at its time limit loses everything since the last checkpoint. That is
only news when the run will not finish in time *and* no checkpoint is due before the
end: a run that saves every 30 minutes loses at most 30 minutes, which the user chose.
Pure: the agent passes wall-clock times in (the job end is a wall-clock deadline).
"""

from __future__ import annotations

from rankwatch.detectors.base import Episode
from rankwatch.records import Finding, Severity

KIND = "eta_past_job_end"
SUSTAIN = 3  # checks in a row; one slow stretch must not warn


def _dur(seconds: float) -> str:
    s = max(0, int(seconds))
    h, rem = divmod(s, 3600)
    m = rem // 60
    return f"{h}h{m:02d}m" if h else f"{m}m"


class DeadlineDetector:
    def __init__(self, rank: int | None, *, margin: float = 300.0) -> None:
        self.rank = rank
        self.margin = margin
        self.episode = Episode()
        self.hits = 0

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
