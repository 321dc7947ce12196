"""Megatron-LM (and Megatron-DeepSpeed, GPT-NeoX) ``training_log`` lines.

The field set changes between versions and forks, so the line is read as ``key: value``
cells split on ``|`` instead of one fixed regex.

A NaN loss is not printed as ``nan``: ``training_log`` prints a loss only when its average
is positive, so a NaN makes the ``lm loss`` cell vanish while ``number of nan iterations``
counts it. A line without the loss its run prints every iteration, or with NaN iterations
counted, is read as a NaN loss, except when the interval's iterations were all skipped (an
fp16 overflow: ``number of skipped iterations`` > 0 and no NaN), which leaves no loss to average.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from operator import itemgetter
from typing import ClassVar

from rankwatch.records import Record, StepRecord

from ._common import OverflowTracker, eval_record, strip_ansi, to_float, to_int
from .base import LogLine
from .registry import register_parser

_ITER = re.compile(r"\biteration\s{0,40}(\d{1,18})\s{0,40}/\s{0,40}(\d{1,18}|infinity)\s{0,40}\|")
_VALID = re.compile(r"validation loss at ([^|]{0,200})\|")
_VALID_ITER = re.compile(r"iteration\s+(\d{1,18})")
_SNIFF_KEYS = ("consumed samples", "elapsed time per iteration", "learning rate", "lm loss")

# Known cells; a cell ending in "loss" that is not listed here is a named loss term.
_FIELDS: dict[str, str] = {
    "elapsed time per iteration (ms)": "step_time_ms",
    "throughput per gpu (tflop/s/gpu)": "tflops",
    "tflops": "tflops",
    "tflop/s/gpu": "tflops",
    "learning rate": "learning_rate",
    "lm loss": "loss",
    "loss": "loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "number of skipped iterations": "skipped_iters",
    "number of nan iterations": "nan_iters",
    "samples per second": "samples_per_s",
    "tokens per gpu per second (tgs)": "tokens_per_s",
    "tokens/s/gpu": "tokens_per_s",
    "tokens per second per gpu": "tokens_per_s",
}


def _number(raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return to_float(raw)


def _count(x: float | None) -> int | None:
    if x == 0:  # every healthy line
        return 0
    return to_int(x) if x is not None else None


def _cells(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for cell in text.split("|"):
        cell = cell.strip()
        if not cell:
            continue
        key, sep, val = cell.rpartition(":")
        if not sep:
            # Old releases print "learning rate 1.000E-04" without a colon.
            key, _, val = cell.rpartition(" ")
        if key:
            out.append((key.strip().lower(), val.strip()))
    return out


# The record's values, in the order _Layout.read and _cells hand them over.
_ORDER = (
    "loss",
    "grad_norm",
    "learning_rate",
    "loss_scale",
    "tokens_per_s",
    "samples_per_s",
    "step_time_ms",
    "tflops",
    "skipped_iters",
    "nan_iters",
)


class _Layout:
    """One run's iteration line as a pattern from the counter on: each cell's own text, then
    its value."""

    __slots__ = ("colons", "has_loss", "pick", "rx")

    def __init__(self, rx: re.Pattern[str], order: tuple[int, ...], colons: int, has_loss: bool) -> None:
        self.rx = rx
        self.has_loss = has_loss  # the line holds the run's main loss cell ("lm loss")
        # per _ORDER, the value at that index of (the groups after the counter's two, None)
        self.pick = itemgetter(*order)
        self.colons = colons  # in the cells' own text: one more in a value moves the walk's split

    @classmethod
    def build(cls, keys: list[tuple[str, str | None]]) -> _Layout:
        """``keys``: (the cell's text up to its value, the field it gives or None)."""
        parts: list[str] = [_ITER.pattern]
        fields: list[str] = []
        for prefix, field in keys:
            if field is None:
                parts.append(re.escape(prefix) + r"[^|]*\|")
            else:
                fields.append(field)
                parts.append(re.escape(prefix) + r"([^|]*)\|")
        at = {f: i for i, f in enumerate(fields)}
        has_loss = "loss" in at
        if "loss" not in at and "other_loss" in at:
            at["loss"] = at["other_loss"]
        order = tuple(at.get(f, len(fields)) for f in _ORDER)
        return cls(re.compile("".join(parts) + r"\s*\Z"), order, sum(p.count(":") for p, _ in keys), has_loss)

    def read(self, text: str, at: int) -> tuple[str, str, tuple[float | None, ...]] | None:
        """The counter's two texts and the values in ``_ORDER`` of the line whose counter is at
        ``at``, or None when the line differs from the layout in any way (a colon in a value
        too: the walk splits a cell at its last colon)."""
        m = self.rx.match(text, at)
        if m is None or text.count(":", at) != self.colons:
            return None
        it, total, *cells = m.groups()
        try:
            vals: list[float | None] = list(map(float, cells))
        except ValueError:  # "nan" is a float; anything else goes the general way
            return None
        vals.append(None)
        return it, total, self.pick(vals)


@register_parser
class MegatronParser:
    name: ClassVar[str] = "megatron"
    hints: ClassVar[tuple[str, ...]] = ("oss",)  # a line sniff() accepts holds one
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 10  # sniffed after smaller orders (registry.py)

    def __init__(self) -> None:
        self._overflow = OverflowTracker()
        self._last_iter: int | None = None
        self._layout: _Layout | None = None
        self._had_loss = False  # an earlier iteration line held the main loss cell
        self._main_loss = False  # the line being read holds it

    def sniff(self, text: str) -> bool:
        if "|" not in text:
            return False
        text = strip_ansi(text)
        if _ITER.search(text) is not None:
            return any(k in text for k in _SNIFF_KEYS)
        return "validation loss at" in text and " value:" in text

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if "|" not in text:
            if OverflowTracker.maybe(text):
                return list(self._overflow.feed(line, strip_ansi(text)) or ())
            return []
        at = text.find("iteration")
        layout = self._layout
        if layout is not None and at >= 0:
            # The hot path of `analyze` on Megatron logs. A run prints the same cells in the
            # same order every iteration, so the first line's layout becomes one compiled
            # pattern and the next lines cost one match and a float() per wanted cell; any
            # other line takes the general walk over its cells.
            got = layout.read(text, at)
            if got is not None:
                self._main_loss = layout.has_loss
                return [self._record(line, *got)]
        if at < 0 and "validation loss" not in text:
            return []
        if "\x1b" in text:
            text = strip_ansi(text)
            at = text.find("iteration")
        m = _ITER.search(text, at) if at >= 0 else None
        if m is not None:
            it, total = m.groups()
            return [self._record(line, it, total, self._cells(text, m.end()))]
        v = _VALID.search(text)
        if v is not None:
            return self._valid(line, text, v)
        return []

    def _record(
        self, line: LogLine, it_text: str, total_text: str, vals: Sequence[float | None]
    ) -> StepRecord:
        it = int(it_text)  # at most 18 digits: the pattern says so
        self._last_iter = it
        loss, grad_norm, lr, scale, tokens, samples, step_ms, tflops, skipped, nans = vals
        if self._main_loss:
            self._had_loss = True
            if nans:
                loss = math.nan
        elif nans or (self._had_loss and not skipped):
            loss = math.nan  # the loss cell left out: its average was NaN
        return StepRecord(
            step=it,
            total_steps=int(total_text) if total_text != "infinity" else None,
            loss=loss,
            grad_norm=grad_norm,
            learning_rate=lr,
            loss_scale=scale,
            tokens_per_s=tokens,
            samples_per_s=samples,
            step_time_s=step_ms / 1000.0 if step_ms is not None else None,
            tflops=tflops,
            skipped_iters=_count(skipped),
            nan_iters=_count(nans),
            rank=line.rank,
            line=line.lineno,
            time=line.time,
        )

    def _cells(self, text: str, start: int) -> list[float | None]:
        """Every cell after the iteration counter, float() first (it takes the surrounding
        blanks), the forgiving to_float only when that fails."""
        f: dict[str, float] = {}
        other_loss: float | None = None
        fields = _FIELDS
        keys: list[tuple[str, str | None]] = []  # (the cell's text up to its value, field)
        tagged: set[str] = set()
        for cell in text[start:].split("|"):
            key, sep, raw = cell.rpartition(":")
            if not sep:
                keys.append(("", None))
                key, _, raw = cell.strip().rpartition(" ")  # old releases: "learning rate 1.0E-04"
                if not key:
                    continue
            else:
                keys.append((key + ":", None))
            key = key.strip().lower()
            field = fields.get(key)
            if field is None:
                if other_loss is None and key.endswith("loss"):
                    other_loss = _number(raw)
                    if not any(fd == "other_loss" for _, fd in keys):
                        keys[-1] = (keys[-1][0], "other_loss")
                continue
            if field not in tagged:  # the layout reads a field's first cell, as this walk does
                tagged.add(field)
                keys[-1] = (keys[-1][0], field)
            if field in f:
                continue
            val = _number(raw)
            if val is not None:
                f[field] = val
        self._main_loss = "loss" in f
        if other_loss is not None and "loss" not in f:
            f["loss"] = other_loss
        if self._layout is None and keys and keys[-1] == ("", None) and all(k for k, _ in keys[:-1]):
            # The cells after the last "|" are blank: a layout the next lines can be matched to.
            self._layout = _Layout.build(keys[:-1])
        return [f.get(k) for k in _ORDER]

    def _valid(self, line: LogLine, text: str, v: re.Match[str]) -> list[Record]:
        where = v.group(1)
        if "test" in where:
            return []
        im = _VALID_ITER.search(where)
        step = to_int(im.group(1)) if im is not None else self._last_iter
        eval_loss: float | None = None
        first_value: float | None = None
        metrics: dict[str, float] = {}
        for key, raw in _cells(text[v.end() :]):
            val = to_float(raw)
            if val is None:
                continue
            if key == "lm loss value":
                eval_loss = val
                continue
            if key.endswith(" value") and first_value is None:
                first_value = val
            metrics[key] = val
        if eval_loss is None:
            eval_loss = first_value
        if eval_loss is None:
            return []
        return [eval_record(line, eval_loss=eval_loss, step=step, metrics=metrics)]
