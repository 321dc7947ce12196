"""Per-rank rolling windows: the only mutable state detectors look at.

Windows are bounded deques so a week-long run costs the same memory as an hour-long
one. Detectors read from here and keep only their own episode bookkeeping.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter

from rankwatch.records import ErrorRecord, EvalRecord, OverflowRecord, Record, StepRecord, median

HISTORY = 4096
# Upper bounds (seconds) of the printed step-time histogram: from 50 ms micro-steps to
# the minutes a pipeline-parallel giant takes.
STEP_TIME_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
# StepRecord fields whose recent finite values detectors ask for on every step: kept apart
# as they arrive, so a window is a slice and not a walk over the records. A value is taken
# when its record is added: a parser that later amends a record it already handed out
# (DeepSpeed's late fields) amends the record, not these windows.
TRACKED = ("loss", "grad_norm", "learning_rate", "step_time_s")  # in _add_step's order


def finite(x: float | None) -> bool:
    return x is not None and x - x == 0  # false for NaN and infinities; cheaper than isfinite


@dataclass
class RankState:
    rank: int | None
    path: str | None = None
    steps: deque[StepRecord] = field(default_factory=lambda: deque(maxlen=HISTORY))
    evals: deque[EvalRecord] = field(default_factory=lambda: deque(maxlen=512))
    overflows: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))  # step of each overflow
    errors: deque[ErrorRecord] = field(default_factory=lambda: deque(maxlen=256))
    step_count: int = 0
    last_step: int | None = None
    total_steps: int | None = None
    first_time: float | None = None
    last_time: float | None = None
    last_progress_time: float | None = None
    fp16_evidence: bool = False
    # Every printed step time since start (cumulative, for a Prometheus histogram).
    step_time_counts: list[int] = field(default_factory=lambda: [0] * (len(STEP_TIME_BUCKETS) + 1))
    step_time_sum: float = 0.0
    max_loss_scale: float | None = None
    last_loss_scale: float | None = None
    overflow_lines: int = 0  # the rank prints one line per overflow (DeepSpeed, Megatron fp16)
    # Per TRACKED field: its finite values, and the numbers (step_count) of the records that
    # lacked one (few, in a healthy run), so a window never reaches past the last HISTORY
    # records, as ``steps`` does not.
    finite_values: dict[str, deque[float]] = field(
        default_factory=lambda: {attr: deque(maxlen=HISTORY) for attr in TRACKED}
    )
    finite_missing: dict[str, deque[int]] = field(
        default_factory=lambda: {attr: deque(maxlen=HISTORY) for attr in TRACKED}
    )
    _kept: tuple[tuple[deque[float], deque[int]], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._kept = tuple((self.finite_values[a], self.finite_missing[a]) for a in TRACKED)

    def position(self, rec: StepRecord | None = None) -> int:
        """Step number where the log gives one, else the count of logged steps."""
        if rec is not None and rec.step is not None:
            return rec.step
        if self.last_step is not None:
            return self.last_step
        return self.step_count

    def restarted(self) -> None:
        """A new process of the rank (a launcher's restart, a requeue): its step is unknown
        until it logs one (it may start again from step 1, or from a checkpoint's), and the
        errors its predecessor printed, judged with that one's end, are not its own."""
        self.last_step = None
        self.errors.clear()

    def add(self, record: Record) -> None:
        if isinstance(record, StepRecord):
            self._add_step(record)
        elif isinstance(record, EvalRecord):
            if record.step is None:
                record.step = self.last_step
            self.evals.append(record)
        elif isinstance(record, OverflowRecord):
            self.fp16_evidence = True
            self.overflow_lines += 1
            if record.new_scale is not None and record.new_scale == record.new_scale:
                self.last_loss_scale = record.new_scale
            self.overflows.append(record.step if record.step is not None else self.position())
        elif isinstance(record, ErrorRecord):
            self.errors.append(record)
        t = record.time
        if t is not None:
            if self.first_time is None:
                self.first_time = t
            self.last_time = t

    def _add_step(self, record: StepRecord) -> None:
        """Every step of a run passes here: the TRACKED fields are written out one by one."""
        step = record.step
        last = self.last_step
        if step is None:
            step = record.step = (last + 1) if last is not None else self.step_count + 1
            record.step_inferred = True
        self.steps.append(record)
        n = self.step_count = self.step_count + 1
        (lk, lm), (gk, gm), (rk, rm), (tk, tm) = self._kept
        v = record.loss
        if v is not None and v - v == 0:  # false for NaN and infinities
            lk.append(v)
        else:
            lm.append(n)
        v = record.grad_norm
        if v is not None and v - v == 0:
            gk.append(v)
        else:
            gm.append(n)
        v = record.learning_rate
        if v is not None and v - v == 0:
            rk.append(v)
        else:
            rm.append(n)
        t = record.step_time_s
        if t is not None and t - t == 0:
            tk.append(t)
            if t >= 0:
                self.step_time_counts[bisect_left(STEP_TIME_BUCKETS, t)] += 1
                self.step_time_sum += t
        else:
            tm.append(n)
        if last is None or step > last:
            self.last_step = step
            if record.time is not None:
                self.last_progress_time = record.time
        if record.total_steps is not None:
            self.total_steps = record.total_steps
        ls = record.loss_scale
        if ls is not None and ls == ls:
            self.last_loss_scale = ls
            # bf16 runs print a constant scale of 1.0; only a dynamic scale means fp16.
            peak = self.max_loss_scale
            if peak is None or ls > peak:
                self.max_loss_scale = ls
            if ls != 1.0:
                self.fp16_evidence = True
        if record.skipped_iters and not self.overflow_lines:  # else each was counted from its line
            self.overflows.extend([step] * min(record.skipped_iters, 1000))

    def recent(self, attr: str, n: int) -> list[float]:
        """Last ``n`` finite values of a StepRecord field, oldest first (of the last
        ``HISTORY`` the rank printed)."""
        kept = self.finite_values.get(attr)
        if kept is not None:
            k = min(n, self._in_window(attr)) if self.finite_missing[attr] else n
            if k >= len(kept):
                return list(kept)
            out = list(islice(reversed(kept), k))
            out.reverse()
            return out
        vals = [v for v in map(attrgetter(attr), islice(reversed(self.steps), n)) if v is not None]
        if len(vals) == n and all(v - v == 0 for v in vals):
            vals.reverse()
            return vals
        out = []
        for rec in reversed(self.steps):
            v = getattr(rec, attr)
            if finite(v):
                out.append(v)
                if len(out) >= n:
                    break
        out.reverse()
        return out

    def ends(self, attr: str, n: int) -> tuple[float, float] | None:
        """(oldest, newest) of ``recent(attr, n)`` of a ``TRACKED`` field, without building
        the list; None when fewer than two values."""
        kept = self.finite_values[attr]
        k = min(n, self._in_window(attr), len(kept)) if self.finite_missing[attr] else min(n, len(kept))
        if k < 2:
            return None
        return kept[-k], kept[-1]

    def prior_sum(self, attr: str, n: int) -> float | None:
        """``sum(recent(attr, n + 1)[:-1])`` of a TRACKED field, added in the same order, without
        building the window; None when fewer than ``n + 1`` values."""
        kept = self.finite_values[attr]
        have = min(self._in_window(attr), len(kept)) if self.finite_missing[attr] else len(kept)
        if have <= n:
            return None
        vals = list(islice(reversed(kept), 1, n + 1))
        vals.reverse()
        return sum(vals)

    def _in_window(self, attr: str) -> int:
        """How many of a TRACKED field's newest finite values came with the last HISTORY records."""
        missing = self.finite_missing[attr]
        gone = self.step_count - HISTORY  # records up to this number have left ``steps``
        while missing and missing[0] <= gone:
            missing.popleft()
        return min(self.step_count, HISTORY) - len(missing)

    def recent_records(self, n: int) -> list[StepRecord]:
        k = min(n, len(self.steps))
        return [self.steps[i] for i in range(len(self.steps) - k, len(self.steps))]


RATE_WINDOW = 50  # step lines behind the step rate (and so the ETA)
DURATION_WINDOW = 20  # printed step times behind the median step duration


def step_rate(state: RankState, window: int = RATE_WINDOW) -> float | None:
    """Steps per second from the timestamps of the recent step lines, after any restart."""
    n = 0
    last_step = first_step = 0
    last_time = first_time = 0.0
    for rec in reversed(state.steps):  # per scrape and rank: no list, no len()
        step, t = rec.step, rec.time
        if t is None or step is None:
            continue
        if n and step >= first_step:
            break  # the run restarted (e.g. from a checkpoint): only the current stretch counts
        if not n:
            last_step, last_time = step, t
        first_step, first_time = step, t
        n += 1
        if n >= window:
            break
    if n < 2:
        return None
    dstep, dt = last_step - first_step, last_time - first_time
    return dstep / dt if dstep > 0 and dt > 0 else None


def step_duration(state: RankState, rate: float | None) -> float | None:
    """Median of the recent printed step times; else derived from the step rate."""
    printed = state.recent("step_time_s", DURATION_WINDOW)
    if printed:
        return median(printed)
    return 1.0 / rate if rate else None


def eta(state: RankState, rate: float | None = None, duration: float | None = None) -> float | None:
    """Seconds until the last planned step at the recent pace; None where unknown. Without
    ``rate`` and ``duration`` they are measured here."""
    if state.total_steps is None or state.last_step is None or not state.steps:
        return None
    if state.steps[-1].step_inferred:
        return None  # a count of logged lines is not comparable to the planned total
    remaining = max(0, state.total_steps - state.last_step)
    if remaining == 0:
        return 0.0
    if rate is None and duration is None:
        rate = step_rate(state)
        duration = step_duration(state, rate)
    if not rate and duration:
        rate = 1.0 / duration
    return remaining / rate if rate else None
