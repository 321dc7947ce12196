"""Megatron-LM (and Megatron-DeepSpeed, GPT-NeoX) ``training_log`` lines.

The field set changes between versions and forks, so the line is read as ``key: value``
cells split on ``|`` instead of one fixed regex.
"""

from __future__ import annotations

import re
from typing import ClassVar

from rankwatch.records import Record, StepRecord

from ._common import OverflowTracker, eval_record, strip_ansi, to_float, to_int
from .base import LogLine

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


class MegatronParser:
    name: ClassVar[str] = "megatron"

    def __init__(self) -> None:
        self._overflow = OverflowTracker()
        self._last_iter: int | None = None

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
        if "iteration" not in text and "validation loss" not in text:
            return []
        text = strip_ansi(text)
        m = _ITER.search(text)
        if m is not None:
            return self._train(line, text, m)
        v = _VALID.search(text)
        if v is not None:
            return self._valid(line, text, v)
        return []

    def _train(self, line: LogLine, text: str, m: re.Match[str]) -> list[Record]:
        # The hot path of `analyze` on Megatron logs: one pass over the cells, float() first
        # (it takes the surrounding blanks), the forgiving to_float only when that fails.
        it = to_int(m.group(1))
        total = to_int(m.group(2)) if m.group(2) != "infinity" else None
        f: dict[str, float] = {}
        other_loss: float | None = None
        fields = _FIELDS
        for cell in text[m.end() :].split("|"):
            key, sep, raw = cell.rpartition(":")
            if not sep:
                key, _, raw = cell.strip().rpartition(" ")  # old releases: "learning rate 1.0E-04"
                if not key:
                    continue
            key = key.strip().lower()
            field = fields.get(key)
            if field is None:
                if other_loss is None and key.endswith("loss"):
                    other_loss = _number(raw)
                continue
            if field in f:
                continue
            val = _number(raw)
            if val is not None:
                f[field] = val
        if other_loss is not None and "loss" not in f:
            f["loss"] = other_loss
        step_ms = f.get("step_time_ms")
        self._last_iter = it
        skipped = f.get("skipped_iters")
        nans = f.get("nan_iters")
        return [
            StepRecord(
                step=it,
                total_steps=total,
                loss=f.get("loss"),
                grad_norm=f.get("grad_norm"),
                learning_rate=f.get("learning_rate"),
                loss_scale=f.get("loss_scale"),
                tokens_per_s=f.get("tokens_per_s"),
                samples_per_s=f.get("samples_per_s"),
                step_time_s=step_ms / 1000.0 if step_ms is not None else None,
                tflops=f.get("tflops"),
                skipped_iters=to_int(skipped) if skipped is not None else None,
                nan_iters=to_int(nans) if nans is not None else None,
                rank=line.rank,
                line=line.lineno,
                time=line.time,
            )
        ]

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
