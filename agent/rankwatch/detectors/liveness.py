"""The hang family: no progress while the process lives.

Pure: the agent passes monotonic ``now`` in, so a wall-clock jump (NTP, suspend) can
neither fake nor hide a stall. A rank that prints step lines is judged from them, with a
timeout that adapts to its own logging interval. Many ranks print no step lines at all
(Hugging Face and Lightning log on rank 0 only): those are judged from what they do show,
log growth, CPU time and checkpoint writes, since a rank blocked in a collective on a
CPU/gloo backend sits idle.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rankwatch.detectors.base import Detector, DetectorContext, Episode, finding
from rankwatch.detectors.gpu import gpu_activity
from rankwatch.detectors.registry import register
from rankwatch.events import (
    CheckpointStatus,
    Event,
    GpuRound,
    GpuSample,
    LogActivity,
    ProcessSample,
    ProcessStart,
    Progress,
)
from rankwatch.records import Finding, Severity, median
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.config.schema import Config, StallConfig

INTERVALS = 100
SAMPLES = 10
# Lines read in one chunk share an arrival time; a block-buffered log delivers dozens at
# once. Arrivals closer than this are one burst, so bursts, not lines, set the interval.
BURST_S = 0.1
CPU_ACTIVE_RATIO = 0.01  # of one core, over the sample window
GPU_TRAINING_S = 60.0  # GPU busy this long without a break: the rank is training
GPU_ACTIVITY_ROUNDS = 3  # GPU sampling rounds judged together for what the GPUs do

# What to do next, by what the stalled process was doing.
_CLASS_FIX = {
    "busy": "Usual fix: read this rank's stack (`rankwatch dumps show`): a DataLoader worker deadlock "
    "(confirm with num_workers=0) or a loop that never ends.",
    "idle": "Usual fix: `rankwatch dumps diff` names the rank whose stack differs; the others wait for it "
    "in the collective, and its log holds the real error.",
    "partly busy": "Usual fix: compare the ranks' stacks with `rankwatch dumps diff`.",
    "disk-wait": "Usual fix: check the filesystem or driver (`dmesg`, the NFS/Lustre servers), not the "
    "training code.",
    "stopped": "Usual fix: resume the process (`kill -CONT`) or find what stopped it.",
}

_CLASS_TEXT = {
    "busy": "busy on CPU ({cpu}): a spin or a data-loader deadlock",
    "idle": "idle on CPU ({cpu}): blocked in a collective or I/O",
    "partly busy": "partly busy on CPU ({cpu})",
    "disk-wait": "stuck in uninterruptible I/O (state D, {cpu} CPU): filesystem (NFS/Lustre) or driver",
    "stopped": "STOPPED by a signal (SIGSTOP/SIGTSTP: a debugger, `kill -STOP` or Ctrl-Z); "
    "resume it with `kill -CONT {pid}`",
}


def p99(xs: deque[float] | list[float]) -> float:
    """Nearest-rank 99th percentile: with fewer than 100 values, the largest."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def _secs(x: float) -> str:
    return f"{x:.0f}s" if x >= 10 else f"{x:.1f}s"


@dataclass(frozen=True)
class Liveness:
    """What the stall rule knows of a rank now, as the faces show it: seconds since its last
    step (a stepping rank) or last sign of life, the timeout it is judged by (None when it
    cannot be told), and whether a stall is open."""

    since: float
    timeout: float | None
    stalled: bool
    stepping: bool


@register
class StallDetector(Detector):
    kinds = ("stall",)
    accepts = (Progress, LogActivity, CheckpointStatus, GpuRound, ProcessSample, ProcessStart)
    section = "stall"

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> StallDetector:
        return cls(cfg.stall, started=ctx.started)

    def __init__(self, cfg: StallConfig, *, started: float) -> None:
        self._reset(cfg, started)
        self.pid: int | None = None
        self.gpu_rounds: deque[tuple[GpuSample, ...]] = deque(maxlen=GPU_ACTIVITY_ROUNDS)
        self.checkpoint_primed = False  # what the first scan found was saved before the agent came
        self.checkpoint_saved: float | None = None

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        e = record
        if isinstance(e, ProcessSample):
            return self.on_sample(state, e, e.time)
        if isinstance(e, Progress):
            return self.on_step(e.now, e.step)
        if isinstance(e, LogActivity):
            self.on_activity(e.now, "log")
        elif isinstance(e, GpuRound):
            self.gpu_rounds.append(e.samples)
            self.on_gpu(e.now, gpu_activity([s for batch in self.gpu_rounds for s in batch]))
        elif isinstance(e, CheckpointStatus):
            self._checkpoint(e)
        elif isinstance(e, ProcessStart):
            ended: list[Finding] = []
            if self.pid is not None and e.pid != self.pid:
                # The rank restarted (torchrun, a requeue): it loads its model again, so it gets
                # the startup grace, not the old step interval's timeout. A stall of the old
                # process ended with it: resolved, or its alert would stay firing for good
                # (the s39 tester's k18: gloo's timeout ended the hang, torchrun restarted).
                if self.episode.close():
                    waited = _secs(e.now - self.quiet_from)
                    msg = f"the rank restarted (new process, pid {e.pid}) after {waited} without progress"
                    ended.append(self._resolved(msg, state.last_step))
                self._reset(self.cfg, e.now)
            self.pid = e.pid
            return ended
        return []

    def _checkpoint(self, e: CheckpointStatus) -> None:
        """A save in progress, or one just finished, is progress: the timeout waits for it."""
        if not self.checkpoint_primed:
            self.checkpoint_primed, self.checkpoint_saved = e.scans > 0, e.last_saved
        elif e.writing:
            # The last byte written is the sign of life, not the save being open: a save whose
            # writer hangs stops counting once its files stop changing.
            wrote = e.now - e.write_age if e.write_age is not None else e.now
            if self.last_checkpoint is None or wrote > self.last_checkpoint:
                self.on_activity(wrote, "checkpoint_writing")  # a finished save is seen next time
        elif e.last_saved is not None and e.last_saved != self.checkpoint_saved:
            self.checkpoint_saved = e.last_saved
            self.on_activity(e.now, "checkpoint")

    def _reset(self, cfg: StallConfig, started: float) -> None:
        self.cfg = cfg
        self.started = started
        self.now = started
        self.episode = Episode()
        self.intervals: deque[float] = deque(maxlen=INTERVALS)
        self.samples: deque[ProcessSample] = deque(maxlen=SAMPLES)
        self.last_step: int | None = None
        self.steps_seen = 0
        self.state_has_steps = False
        self.last_progress = started  # last step line (stepping ranks)
        self.last_burst: float | None = None
        self.last_signal = started  # last log growth / CPU progress / checkpoint (silent ranks)
        self.signal_what = ""
        self.last_checkpoint: float | None = None  # a save seen in progress (the allowance runs)
        self.save_done = -math.inf  # a save seen finished
        self.checkpoints_seen = False
        self.gpu_activity: str | None = None
        self.gpu_computed = False  # sustained GPU compute seen: startup (model load, compile) is over
        self._busy_since: float | None = None
        self.stalled_at = 0.0
        self.quiet_from = started
        self.rank: int | None = None
        self.path: str | None = None
        self._cpu_window: deque[tuple[float, float]] = deque(maxlen=SAMPLES + 1)
        self._cpu_total = 0.0
        self._cpu_prev: float | None = None

    @property
    def active(self) -> bool:
        return self.episode.active

    def liveness(self, state: RankState | None, now: float) -> Liveness:
        """The reading at ``now`` (the clock the rule judges by): since > timeout is a stall."""
        stepping = self.steps_seen > 0 or (state is not None and state.step_count > 0)
        since = max(0.0, now - (self.last_progress if stepping else self.last_signal))
        try:
            timeout: float | None = float(self.timeout())
        except Exception:
            timeout = None
        return Liveness(since, timeout, bool(self.active), stepping)

    def _stepping(self, state: RankState | None = None) -> bool:
        if state is not None and state.step_count > 0:
            self.state_has_steps = True
        return self.steps_seen > 0 or self.state_has_steps

    def _checkpoint_extra(self) -> float:
        """The allowance holds while the save writes: once its files have not changed for a
        whole base timeout, the writer is as stuck as a rank with no step line."""
        a = float(self.cfg.checkpoint_allowance)
        lc = self.last_checkpoint
        if lc is None or not 0 <= self.now - lc <= a:
            return 0.0
        return a if self.now - lc <= self._base_timeout()[0] else 0.0

    def _base_timeout(self) -> tuple[float, str]:
        floor, grace = float(self.cfg.floor), float(self.cfg.startup_grace)
        if not self.intervals:
            t = max(floor, grace)
            return t, f"{_secs(t)} startup grace, no step interval measured yet"
        q = p99(self.intervals)
        t = max(floor, self.cfg.factor * q)
        why = f"{_secs(t)} = max({_secs(floor)} floor, {self.cfg.factor:g} x p99 step interval {_secs(q)})"
        ceiling = float(self.cfg.ceiling)
        if 0 < ceiling < t:
            t = max(floor, ceiling)
            cap = f"the {_secs(ceiling)} ceiling"
            if t != ceiling:
                cap = f"the {_secs(floor)} floor (above the ceiling)"
            why = (
                f"{_secs(t)}: {cap}, under PyTorch's NCCL watchdog; "
                f"{self.cfg.factor:g} x p99 step interval {_secs(q)} would be longer"
            )
        return t, why

    def timeout(self) -> float:
        """The effective timeout now, in seconds (for metrics and messages)."""
        if not self._stepping():
            if not self.gpu_computed and self.now - self.started < float(self.cfg.startup_grace):
                return float(self.cfg.startup_grace)
            return float(self.cfg.silent_rank_timeout)
        return self._base_timeout()[0] + self._checkpoint_extra()

    # -- events -----------------------------------------------------------------------

    def on_step(self, now: float, step: int | None) -> list[Finding]:
        self.now = max(self.now, now)
        if step is not None and self.last_step is not None and step == self.last_step:
            return []
        restarted = step is not None and self.last_step is not None and step < self.last_step
        if self.last_burst is not None and not restarted and now - self.last_burst >= BURST_S:
            self.intervals.append(now - self.last_burst)
        if self.last_burst is None or restarted or now - self.last_burst >= BURST_S:
            self.last_burst = now
        self.last_progress = now
        self.last_signal = max(self.last_signal, now)
        self.steps_seen += 1
        if step is not None:
            self.last_step = step
        if not self.episode.close():
            return []
        where = f"at step {step}" if step is not None else "(a new step line)"
        return [self._resolved(f"progress resumed {where} after {_secs(now - self.quiet_from)}", step)]

    def on_activity(self, now: float, what: str) -> None:
        """``log`` (the log grew), ``checkpoint`` (one was written), ``checkpoint_writing``."""
        self.now = max(self.now, now)
        if what == "checkpoint_writing":
            self.last_checkpoint = now
            self.checkpoints_seen = True
            self._signal(now, "checkpoint write")
        elif what == "checkpoint":
            # A finished save is progress, and the allowance for writing it ends with it: a
            # hang right after a save must still be caught before the NCCL watchdog.
            self.last_checkpoint = None
            self.save_done = now
            self.checkpoints_seen = True
            self._signal(now, "checkpoint write")
        elif what == "log":
            self._signal(now, "log growth")

    def on_gpu(self, now: float, activity: str) -> None:
        """What the rank's GPUs do (``detectors.gpu.gpu_activity``); real compute is a sign of life.

        A GPU "spinning in a collective" is not: NCCL kernels poll at full utilisation for a
        peer that never comes, which is exactly what a hang looks like.
        """
        self.now = max(self.now, now)
        self.gpu_activity = activity
        if activity == "busy":
            self._signal(now, "GPU compute")
            if self._busy_since is None:
                self._busy_since = now
            # Training computes for minutes on end; a warm-up or compile blip does not end the grace.
            if now - self._busy_since >= GPU_TRAINING_S:
                self.gpu_computed = True
        else:
            self._busy_since = None

    def _signal(self, now: float, what: str) -> None:
        if now >= self.last_signal:
            self.last_signal, self.signal_what = now, what

    def _cpu_progress(self, sample: ProcessSample) -> bool:
        """More than ~1% of a core over the last few samples; one short burst is not enough."""
        c = sample.cpu_time_s
        if self._cpu_prev is not None:
            self._cpu_total += max(0.0, c - self._cpu_prev)  # exited children make it drop
        self._cpu_prev = c
        self._cpu_window.append((sample.time, self._cpu_total))
        t0, c0 = self._cpu_window[0]
        span = sample.time - t0
        return span > 0 and (self._cpu_total - c0) > CPU_ACTIVE_RATIO * span

    def on_sample(self, state: RankState, sample: ProcessSample, now: float) -> list[Finding]:
        self.now = max(self.now, now)
        if not self.cfg.enabled:
            return []
        if not sample.alive:
            if self.episode.close():
                waited = _secs(now - self.quiet_from)
                msg = f"process exited after {waited} without progress (its exit is reported separately)"
                return [self._resolved(msg, state.last_step)]
            return []
        self.samples.append(sample)
        if self._cpu_progress(sample) and sample.state != "stopped":
            self._signal(now, "CPU time")
        if self._stepping(state):
            since = now - max(self.last_progress, self.save_done)
            limit = self.timeout()
            stalled = since > limit
        else:
            since = now - self.last_signal
            limit = float(self.cfg.silent_rank_timeout)
            past_grace = self.gpu_computed or now - self.started >= float(self.cfg.startup_grace)
            stalled = past_grace and since > limit
            if self.episode.active and self.last_signal > self.stalled_at:
                self.episode.close()
                msg = f"signs of life again ({self.signal_what}) after {_secs(now - self.quiet_from)}"
                return [self._resolved(msg, state.last_step)]
        if not stalled or not self.episode.open(self._step(state)):
            return []
        self.stalled_at = now
        self.quiet_from = now - since
        self.rank, self.path = state.rank, state.path
        return [self._fire(state, sample, since)]

    # -- findings -----------------------------------------------------------------------

    def _classify(self) -> tuple[str, float]:
        alive = [s for s in self.samples if s.alive]
        cpu = median(s.cpu_percent for s in alive) if alive else 0.0
        if not alive:
            return "unknown", cpu
        if alive[-1].state == "stopped":
            return "stopped", cpu
        d = sum(s.state == "disk-wait" for s in alive)
        if alive[-1].state == "disk-wait" or 2 * d > len(alive):
            return "disk-wait", cpu
        if cpu >= self.cfg.busy_cpu_percent:
            return "busy", cpu
        if cpu <= self.cfg.idle_cpu_percent:
            return "idle", cpu
        return "partly busy", cpu

    def _step(self, state: RankState) -> int | None:
        """The rank's step: its own step lines', else the last one its progress events carried (a
        launcher's workers without ``--tee``: the run's unprefixed step lines keep their clock)."""
        return state.last_step if state.last_step is not None else self.last_step

    def _fire(self, state: RankState, sample: ProcessSample, since: float) -> Finding:
        cls, cpu = self._classify()
        text = _CLASS_TEXT.get(cls, "state unknown").format(cpu=f"{cpu:.1f}%", pid=sample.pid)
        if self._stepping(state):
            signals = ["step lines"]
            t, why = self._base_timeout()
            extra = self._checkpoint_extra()
            if extra:
                why += f" + {_secs(extra)} checkpoint allowance"
            timeout = t + extra
            after = " since its checkpoint save finished" if self.save_done > self.last_progress else ""
            head = f"no progress for {_secs(since)}{after} (timeout {why})"
        else:
            signals = ["log growth", "CPU time"] + (["checkpoint writes"] if self.checkpoints_seen else [])
            if self.gpu_activity not in (None, "unknown"):
                signals.append("GPU activity")
            timeout = float(self.cfg.silent_rank_timeout)
            after = (
                "after its GPU had computed"
                if self.gpu_computed
                else f"after the {_secs(float(self.cfg.startup_grace))} startup grace"
            )
            head = (
                f"no sign of life for {_secs(since)} (timeout {_secs(timeout)} for a rank that prints no "
                f"step lines, {after})"
            )
        step = self._step(state)
        if state.last_step is not None:
            last = f"last step {step}"
        elif step is not None:
            last = f"last step {step} (of the step lines it follows, none of them its own)"
        else:
            last = "no step line seen yet"
        alive = "process stopped" if cls == "stopped" else "process alive"
        if self.gpu_activity not in (None, "unknown"):
            text += f"; GPU {self.gpu_activity}"
        fix = _CLASS_FIX.get(cls, "Usual fix: compare the ranks' stacks with `rankwatch dumps diff`.")
        # What became of the stacks is said by whoever takes them, once they know.
        msg = f"{head}; {last}; {alive}, {text}. Judged from: {', '.join(signals)}. {fix}"
        evidence = {
            "seconds_since_progress": since,
            "timeout": timeout,
            "last_step": step,
            "signals": signals,
            "classification": cls,
            "cpu_percent": cpu,
            "state": sample.state,
        }
        if self.gpu_activity is not None:
            evidence["gpu_activity"] = self.gpu_activity
        return finding("stall", Severity.CRITICAL, state, msg, step=step, evidence=evidence)

    def _resolved(self, msg: str, step: int | None) -> Finding:
        """Carries the rank of the stall it ends, so the alert router can pair the two."""
        return Finding(
            kind="stall",
            severity=Severity.CRITICAL,
            rank=self.rank,
            message=msg,
            step=step,
            path=self.path,
            resolved=True,
        )
