"""Hugging Face Transformers ``Trainer`` console output.

The Trainer prints ``str(logs)`` dicts with no step number, while tqdm draws the
progress bar on stderr. Both often land in one file, buffered differently, so a dict
can be glued to bar text, cut in two by it, or split over two lines. The dict is read
with a key/value regex (never ``literal_eval``), the bar is cut out and remembered,
and the step comes from the training bar when one was seen, else from counting dicts.
"""

from __future__ import annotations

import re
from typing import ClassVar

from rankwatch.records import Record

from ._bars import BarClock
from ._common import (
    TQDM_BAR,
    OverflowTracker,
    eval_record,
    step_record,
    strip_ansi,
    to_float,
    to_int,
)
from .base import LogLine

_KV = re.compile(r"'(?P<k>[A-Za-z_][^'\\\n]{0,100})'\s*:\s*(?P<v>[^,{}]{1,400})")
_SPACES = re.compile(r"\s{2,}|\r")
_SNIFF_LOSS = re.compile(r"'(?:loss|eval_loss|train_loss|train_runtime)'\s*:")
_SNIFF_MORE = re.compile(r"'(?:epoch|learning_rate|grad_norm|eval_runtime|train_samples_per_second)'\s*:")
_TOTAL = re.compile(r"Total optimization steps\s*=\s*([\d,]{1,24})")
_TRAIN_KEYS = ("loss", "grad_norm", "learning_rate")
_MAX_PENDING = 4096
_PENDING_LINES = 4


def _value(raw: str) -> float | None:
    v = raw.strip()
    if "(" in v:  # np.float64(1.5), tensor(1.5
        v = v[v.index("(") + 1 :].rstrip(")")
    return to_float(v)


class HFParser:
    name: ClassVar[str] = "hf"

    def __init__(self) -> None:
        self._overflow = OverflowTracker()
        # Undescribed "it" bars by total: the training bar and the evaluation bar differ
        # only in total; the first one drawn is normally the training bar.
        self._bars: dict[int, BarClock] = {}
        self._recent_total: int | None = None
        self._bar_total: int | None = None
        self._total_steps: int | None = None
        self._last_step: int | None = None
        self._interval = 1
        self._pending: str | None = None
        self._pending_line: LogLine | None = None
        self._pending_age = 0

    def sniff(self, text: str) -> bool:
        if "{'" not in text:
            return False
        return _SNIFF_LOSS.search(text) is not None and _SNIFF_MORE.search(text) is not None

    def progress(self) -> tuple[int, int | None] | None:
        """The training bar's latest ``(step, total)``; None before a bar was seen."""
        n = self._bar_n
        if n is None:
            return None
        return n, self._bar_total

    @property
    def _train_bar(self) -> BarClock | None:
        return self._bars.get(self._bar_total) if self._bar_total is not None else None

    @property
    def _bar_n(self) -> int | None:
        bar = self._train_bar
        return bar.n if bar is not None else None

    @property
    def _bar_step_time(self) -> float | None:
        bar = self._train_bar
        return bar.step_time if bar is not None else None

    def finish(self) -> list[Record]:
        """End of stream: a dict still waiting for its cut-off end is emitted as it is."""
        return self._flush()

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if self._pending is None and "'" not in text and "|" not in text:
            if OverflowTracker.maybe(text):
                return list(self._overflow.feed(line, strip_ansi(text)) or ())
            if "optimization steps" in text:
                m = _TOTAL.search(text)
                if m is not None:
                    self._total_steps = to_int(m.group(1))
            return []
        return self._parse_slow(line, strip_ansi(text))

    def _parse_slow(self, line: LogLine, text: str) -> list[Record]:
        if "%|" in text:
            text = self._cut_bars(text)
            if self._pending is None and "'" not in text:  # a bare bar redraw
                if OverflowTracker.maybe(text):
                    return list(self._overflow.feed(line, text) or ())
                return []
        out: list[Record] = []
        if self._pending is not None:
            text = self._continue_pending(line, text, out)
        rest: list[str] = []
        pos = 0
        while True:
            i = text.find("{'", pos)
            if i < 0:
                rest.append(text[pos:])
                break
            rest.append(text[pos:i])
            j = text.find("}", i)
            if j < 0:
                self._pending = text[i : i + _MAX_PENDING]
                self._pending_line = line
                self._pending_age = 0
                break
            out.extend(self._dict(line, text[i : j + 1]))
            pos = j + 1
        leftover = "".join(rest)
        if OverflowTracker.maybe(leftover):
            out.extend(self._overflow.feed(line, leftover) or ())
        return out

    def _cut_bars(self, text: str) -> str:
        pieces: list[str] = []
        pos = 0
        for m in TQDM_BAR.finditer(text):
            self._on_bar(text[pos : m.start()], m)
            pieces.append(text[pos : m.start()])
            pos = m.end()
        if not pieces:
            return text
        pieces.append(text[pos:])
        return "".join(pieces)

    def _on_bar(self, before: str, m: re.Match[str]) -> None:
        if before.rstrip().endswith(":"):
            return  # a described bar ("Map:", "Loading checkpoint shards:"), not training
        info = m.group("info")
        if "it/s" not in info and "s/it" not in info:
            return
        total = to_int(m.group("total")) if m.group("total") != "?" else None
        n = to_int(m.group("n"))
        if total is None or n is None:
            return
        bar = self._bars.get(total)
        if bar is not None and 0 < n < bar.n:
            return  # a stale redraw
        if bar is None:
            if len(self._bars) >= 8:
                oldest = next(t for t in self._bars if t != self._bar_total)
                del self._bars[oldest]
            bar = self._bars[total] = BarClock()
        if total != self._bar_total:
            self._pause_training()  # another bar (evaluation) runs: training waits
        bar.update(n, info)
        self._recent_total = total
        if self._bar_total is None:
            self._bar_total = total

    def _pause_training(self) -> None:
        train = self._train_bar
        if train is not None:
            train.pause()

    def _continue_pending(self, line: LogLine, text: str, out: list[Record]) -> str:
        pending = self._pending or ""
        open_i = text.find("{'")
        close_i = text.find("}")
        if close_i >= 0 and (open_i < 0 or close_i < open_i):
            start = self._pending_line or line
            self._pending = None
            out.extend(self._dict(start, pending + text[: close_i + 1]))
            return text[close_i + 1 :]
        if open_i >= 0:
            out.extend(self._flush())
            return text
        if "'" in text and len(pending) + len(text) <= _MAX_PENDING:
            self._pending = pending + text
        self._pending_age += 1
        if self._pending_age > _PENDING_LINES:
            out.extend(self._flush())
        return ""

    def _flush(self) -> list[Record]:
        """Emit what a dict that never got its end still tells (a cut line beats no line)."""
        pending, start = self._pending, self._pending_line
        self._pending = None
        if pending is None or start is None:
            return []
        # The last value may be cut mid-number ("4e-05" -> "4"): keep only finished pairs.
        return self._dict(start, pending[: pending.rfind(",") + 1])

    def _dict(self, line: LogLine, text: str) -> list[Record]:
        vals: dict[str, float] = {}
        for m in _KV.finditer(_SPACES.sub("", text)):
            v = _value(m.group("v"))
            if v is not None:
                vals.setdefault(m.group("k"), v)
        if not vals or "train_runtime" in vals or "train_samples_per_second" in vals:
            return []  # the end-of-training summary is not a step
        if any(k.startswith("eval_") for k in vals):
            self._pause_training()
            metrics = {k: v for k, v in vals.items() if k.startswith("eval_") and k != "eval_loss"}
            return [
                eval_record(line, eval_loss=vals.get("eval_loss"), step=self._eval_step(), metrics=metrics)
            ]
        if not any(k in vals for k in _TRAIN_KEYS):
            return []
        recent = self._recent_total
        if recent is not None and (self._bar_total is None or recent > self._bar_total):
            # An evaluate() before train() drew the first bar; training has more steps
            # than evaluation has batches far more often than not.
            self._bar_total = recent
        step, inferred = self._next_step()
        return [
            step_record(
                line,
                step=step,
                step_inferred=inferred,
                total_steps=self._bar_total or self._total_steps,
                loss=vals.get("loss"),
                grad_norm=vals.get("grad_norm"),
                learning_rate=vals.get("learning_rate"),
                epoch=vals.get("epoch"),
                step_time_s=self._bar_step_time,
            )
        ]

    def _next_step(self) -> tuple[int, bool]:
        last, bar = self._last_step, self._bar_n
        if bar is not None and (last is None or bar > last):
            if last is not None:
                self._interval = bar - last
            self._last_step = bar
            return bar, False
        step = (last or 0) + self._interval
        self._last_step = step
        return step, True

    def _eval_step(self) -> int | None:
        if self._bar_n is not None and (self._last_step is None or self._bar_n > self._last_step):
            return self._bar_n
        return self._last_step
