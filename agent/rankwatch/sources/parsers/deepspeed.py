"""DeepSpeed engine output: ``log_dist`` step lines, the throughput timer, pipeline
``steps:`` lines and fp16 loss-scaler overflow messages.

DeepSpeed is a runtime under another framework (HF Trainer, Megatron-DeepSpeed,
Lightning), and its lines often come first in the log, so auto-detection picks this
parser for those runs. It therefore hands every line it does not own to the host
framework's parser, locked on the first one that yields a record.
"""

from __future__ import annotations

import re
from typing import ClassVar

from rankwatch.records import Record, StepRecord

from ._common import GIB, OverflowTracker, step_record, strip_ansi, to_float, to_int
from .base import FormatParser, LogLine
from .hf import HFParser
from .lightning import LightningParser
from .megatron import MegatronParser

_STEP = re.compile(r"\bstep=(\d{1,18}), skipped=(\d{1,18}), lr=\[([^\],]{0,80})")
_TIMER = re.compile(
    r"global_step=(\d{1,18}), RunningAvgSamplesPerSec=[^,\s]{0,40}, CurrSamplesPerSec=([^,\s]{1,400})"
    r"(?:, MemAllocated=([^,\s]{1,20})GB, MaxMemAllocated=([^,\s]{1,20})GB)?"
)
_STEPS = re.compile(r"\bsteps?:\s{0,8}(\d{1,18})(?:\s{0,4}/\s{0,4}(\d{1,18}))?\s+loss:\s{0,4}([^\s]{1,400})")
_ITER_TIME = re.compile(r"iter time \(s\):\s{0,4}([^\s]{1,400})")
_SPS = re.compile(r"samples/sec:\s{0,4}([^\s]{1,400})")
_SNIFF_OVF = re.compile(
    r"Attempted loss scale|Reducing dynamic loss scale|Grad overflow on iteration|OVERFLOW!"
)


def _lr(raw: str) -> float | None:
    v = raw.strip()
    if "(" in v:  # np.float64(0.0001)
        v = v[v.index("(") + 1 :].rstrip(")")
    return to_float(v)


class DeepSpeedParser:
    name: ClassVar[str] = "deepspeed"

    def __init__(self) -> None:
        self._overflow = OverflowTracker()
        self._skipped: int | None = None
        self._hosts: list[FormatParser] = [MegatronParser(), HFParser(), LightningParser()]
        self._host: FormatParser | None = None

    @property
    def host(self) -> FormatParser | None:
        """The framework parser this stream turned out to run under, once known."""
        return self._host

    def finish(self) -> list[Record]:
        """End of stream: whatever the host parser still holds back."""
        out: list[Record] = []
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
        if OverflowTracker.maybe(text) and not ("|" in text and "iteration" in text):
            found = self._overflow.feed(line, strip_ansi(text))
            if found is not None:
                return list(found)
        return self._delegate(line)

    def _delegate(self, line: LogLine) -> list[Record]:
        if self._host is not None:
            return self._host.parse(line)
        text = line.text
        if "|" not in text and "'" not in text and "Epoch " not in text and "optimization steps" not in text:
            return []  # none of the hosts could use it
        for host in self._hosts:
            out = host.parse(line)
            if out:
                if any(isinstance(r, StepRecord) for r in out):
                    self._host = host
                return out
        return []

    def _own(self, rec: StepRecord) -> list[Record]:
        # Megatron and Lightning print every step themselves; DeepSpeed's copy would
        # only duplicate the step with fewer fields.
        if isinstance(self._host, (MegatronParser, LightningParser)):
            return []
        return [rec]

    def _step_line(self, line: LogLine, m: re.Match[str]) -> StepRecord:
        skipped = to_int(m.group(2))
        delta = None
        if skipped is not None:
            prev = self._skipped
            delta = skipped if prev is None or skipped < prev else skipped - prev
            self._skipped = skipped
        return step_record(line, step=to_int(m.group(1)), learning_rate=_lr(m.group(3)), skipped_iters=delta)

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
