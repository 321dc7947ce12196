"""DeepSpeed engine output: ``log_dist`` step lines, the throughput timer, pipeline
``steps:`` lines and fp16 loss-scaler overflow messages.

DeepSpeed is a runtime under another framework (HF Trainer, Megatron-DeepSpeed,
Lightning), and its lines often come first in the log, so auto-detection picks this
parser for those runs. It therefore hands every line it does not own to the host
framework's parser, locked on the first one that yields a record. The general reader is the
last host: a trainer no parser here knows (DeepSpeed-Chat's "epoch: 0|step: 3721|...|act_loss:
nan") prints its records in forms it reads.

One step is told up to three times (``log_dist``'s ``step=`` line, the throughput timer's
``global_step=`` line, the pipeline engine's ``steps:`` line), each with different fields.
Counting each would double the step count and the rate of everything per step, so a step
record is held until a line about another step arrives, or ``_MERGE_LINES`` lines pass,
and the lines about the same step are merged into it. A record with a loss is never held
(a NaN must reach the detectors at once); a line about a step already handed out only
adds its fields to that record.
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import ClassVar

from rankwatch.records import Record, StepRecord

from ._common import GIB, OverflowTracker, step_record, strip_ansi, to_float, to_int
from .base import FormatParser, LogLine
from .generic import KvParser
from .hf import HFParser
from .lightning import LightningParser
from .megatron import MegatronParser
from .registry import register_parser

_GROW = re.compile(r"Increasing dynamic loss scale from [0-9.eE+]{1,24} to ([0-9.eE+]{1,24})")
_STEP = re.compile(r"\bstep=(\d{1,18}), skipped=(\d{1,18}), lr=\[([^\],]{0,80})")
_TIMER = re.compile(
    r"global_step=(\d{1,18}), RunningAvgSamplesPerSec=[^,\s]{0,40}, CurrSamplesPerSec=([^,\s]{1,400})"
    r"(?:, MemAllocated=([^,\s]{1,20})GB, MaxMemAllocated=([^,\s]{1,20})GB)?"
)
_STEPS = re.compile(r"\bsteps?:\s{0,8}(\d{1,18})(?:\s{0,4}/\s{0,4}(\d{1,18}))?\s+loss:\s{0,4}([^\s]{1,400})")
_ITER_TIME = re.compile(r"iter time \(s\):\s{0,4}([^\s]{1,400})")
_SPS = re.compile(r"samples/sec:\s{0,4}([^\s]{1,400})")
_MERGE_LINES = 8  # the timer line follows the step= line at once, give or take a warning
_MERGED = tuple(
    f.name for f in fields(StepRecord) if f.name not in ("step", "step_inferred", "rank", "line", "time")
)
_SNIFF_OVF = re.compile(
    r"Attempted loss scale|Reducing dynamic loss scale|Grad overflow on iteration|OVERFLOW!"
)


def _merge(into: StepRecord, rec: StepRecord) -> None:
    for name in _MERGED:
        if getattr(into, name) is None:
            setattr(into, name, getattr(rec, name))


def _lr(raw: str) -> float | None:
    v = raw.strip()
    if "(" in v:  # np.float64(0.0001)
        v = v[v.index("(") + 1 :].rstrip(")")
    return to_float(v)


@register_parser
class DeepSpeedParser:
    name: ClassVar[str] = "deepspeed"
    hints: ClassVar[tuple[str, ...]] = (
        "step",
        "verflow",
        "OVERFLOW",
        "oss",
    )  # a line sniff() accepts holds one
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 20  # sniffed after smaller orders (registry.py)

    def __init__(self) -> None:
        self._overflow = OverflowTracker()
        self._skipped: int | None = None
        self._grown: float | None = None  # a scale the scaler grew to, for the next step line
        self._hosts: list[FormatParser] = [MegatronParser(), HFParser(), LightningParser(), KvParser()]
        self._host: FormatParser | None = None
        self._held: StepRecord | None = None  # a step record that more lines may complete
        self._done: StepRecord | None = None  # the last step record handed out

    @property
    def host(self) -> FormatParser | None:
        """The framework parser this stream turned out to run under, once known."""
        return self._host

    def release(self) -> list[Record]:
        """The stream went quiet: the held step record is as complete as it will get."""
        held, self._held = self._held, None
        if held is None:
            return []
        self._done = held
        return [held]

    def finish(self) -> list[Record]:
        """End of stream: whatever this parser and the host parser still hold back."""
        out: list[Record] = self.release()
        for host in [self._host] if self._host is not None else self._hosts:
            fin = getattr(host, "finish", None)
            if fin is not None:
                out.extend(fin())
        return out

    def sniff(self, text: str) -> bool:
        if "step" in text:
            if "step=" in text and (_STEP.search(text) or _TIMER.search(text)):
                return True
            if "iter time" in text and _STEPS.search(text):
                return True
        return OverflowTracker.maybe(text) and _SNIFF_OVF.search(text) is not None

    def parse(self, line: LogLine) -> list[Record]:
        held = self._held
        if held is not None and held.line is not None and line.lineno - held.line > _MERGE_LINES:
            return [*self.release(), *self._parse(line)]
        return self._parse(line)

    def _parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if "step" in text:
            if "step=" in text:
                text = strip_ansi(text)
                m = _STEP.search(text)
                if m is not None:
                    return self._own(self._step_line(line, m))
                t = _TIMER.search(text)
                if t is not None:
                    return self._own(self._timer_line(line, t))
            elif "iter time" in text:
                text = strip_ansi(text)
                s = _STEPS.search(text)
                if s is not None:
                    return self._own(self._steps_line(line, text, s))
        if "Increasing dynamic loss scale" in text:
            g = _GROW.search(text)
            if g is not None:
                # The scaler grew back after loss_scale_window clean steps (fused_optimizer.py
                # _update_scale); the step lines print no scale, so the next one carries it.
                self._grown = to_float(g.group(1))
                self._overflow.grown()
                return []
        if OverflowTracker.maybe(text) and not ("|" in text and "iteration" in text):
            found = self._overflow.feed(line, strip_ansi(text))
            if found is not None:
                return self._after_held(list(found))
        return self._after_held(self._delegate(line))

    def _after_held(self, recs: list[Record]) -> list[Record]:
        """Records from later lines than the held step's: hand the step out first, in order."""
        if recs and self._held is not None:
            return [*self.release(), *recs]
        return recs

    def _delegate(self, line: LogLine) -> list[Record]:
        if self._host is not None:
            return self._host.parse(line)
        text = line.text
        if (
            "|" not in text
            and "'" not in text
            and "Epoch " not in text
            and "optimization steps" not in text
            and "oss" not in text
        ):
            return []  # none of the hosts could use it
        for host in self._hosts:
            if host.generic and any(h.sniff(text) for h in self._hosts if not h.generic):
                break  # a framework's line (a dict still being held back) is never the general reader's
            out = host.parse(line)
            if out:
                if any(isinstance(r, StepRecord) for r in out):
                    self._host = host
                    # The host prints that step itself (HF's dicts are the step records).
                    self._held = None
                return out
        return []

    def _own(self, rec: StepRecord) -> list[Record]:
        # Megatron, Lightning and the HF Trainer print their steps themselves; DeepSpeed's
        # copy would only add a step with fewer fields (or count one step twice).
        if self._host is not None:
            return []
        held = self._held
        if rec.step is not None and held is not None and held.step == rec.step:
            _merge(held, rec)
            # A loss may be NaN: never hold it back waiting for more fields.
            return self.release() if held.loss is not None else []
        done = self._done
        if rec.step is not None and done is not None and done.step == rec.step:
            _merge(done, rec)  # already handed out: fields that come late are kept, not counted
            return []
        out = self.release()
        if rec.loss is not None:
            self._done = rec
            out.append(rec)
        else:
            self._held = rec
        return out

    def _step_line(self, line: LogLine, m: re.Match[str]) -> StepRecord:
        skipped = to_int(m.group(2))
        delta = None
        if skipped is not None:
            prev = self._skipped
            delta = skipped if prev is None or skipped < prev else skipped - prev
            self._skipped = skipped
        grown, self._grown = self._grown, None
        return step_record(
            line,
            step=to_int(m.group(1)),
            learning_rate=_lr(m.group(3)),
            skipped_iters=delta,
            loss_scale=grown,
        )

    def _timer_line(self, line: LogLine, t: re.Match[str]) -> StepRecord:
        mem, max_mem = to_float(t.group(3)), to_float(t.group(4))
        return step_record(
            line,
            step=to_int(t.group(1)),
            samples_per_s=to_float(t.group(2)),
            memory_bytes=mem * GIB if mem is not None else None,
            max_memory_bytes=max_mem * GIB if max_mem is not None else None,
        )

    def _steps_line(self, line: LogLine, text: str, s: re.Match[str]) -> StepRecord:
        it = _ITER_TIME.search(text, s.end())
        sps = _SPS.search(text, s.end())
        return step_record(
            line,
            step=to_int(s.group(1)),
            total_steps=to_int(s.group(2)) if s.group(2) else None,
            loss=to_float(s.group(3)),
            step_time_s=to_float(it.group(1)) if it is not None else None,
            samples_per_s=to_float(sps.group(1)) if sps is not None else None,
        )
