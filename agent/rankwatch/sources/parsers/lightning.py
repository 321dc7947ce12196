"""PyTorch Lightning: the training progress bar (tqdm or rich) and ``CSVLogger`` files.

The bar shows the batches done within the epoch; the global step is derived as
``epoch * batches_per_epoch + batches done``, the trainer's ``global_step`` after that
batch (``CSVLogger`` writes the step at logging time, one less). A bar at ``0/N`` is no
step.
"""

from __future__ import annotations

import re
from typing import ClassVar

from rankwatch.records import Record, StepRecord

from ._common import (
    MetricBag,
    OverflowTracker,
    eval_record,
    rate_to_step_time,
    step_record,
    strip_ansi,
    to_float,
    to_int,
)
from .base import LogLine
from .registry import register_parser

_TQDM = re.compile(
    r"Epoch (?P<epoch>\d{1,9}):\s{0,4}"
    r"(?:\d{1,3}%\|[^|\r\n]{0,400}\|\s{0,4}(?P<n>\d{1,18})/(?P<total>\d{1,18})|(?P<count>\d{1,18})it)"
    r"\s{0,4}\[(?P<info>[^\]\r\n]{0,2000})\]"
)
_RICH = re.compile(
    r"Epoch (?P<epoch>\d{1,9})(?:/(?P<last>-?\d{1,9}))?\s+[━╸╺╾╼─ ]{1,400}"
    r"\s(?P<n>\d{1,18})/(?P<total>\d{1,18}|--)"
    r"\s+\S+\s+•\s+\S+\s+(?P<rate>[\d.]+it/s|[\d.]+s/it)?(?P<info>.{0,2000})"
)
_POSTFIX = re.compile(r"(?P<k>[A-Za-z_][\w/.\-]{0,80})\s{0,2}[=:]\s{0,2}(?P<v>[^,\s\]]{1,400})")
# Rich wraps a bar's metrics that do not fit its width onto the lines under it, indented to
# where they start: "Epoch 0/-2 ━━━ 40/40 0:00:06 • 0:00:00 6.38it/s v_num: 0.000" and then
# "          train_loss: nan" (a CSVLogger's v_num takes the room; the s40 tester's l31).
_RICH_MORE = re.compile(r"\s{8,}(?:[A-Za-z_][\w/.\-]{0,80}: \S{1,400}\s*){1,40}")
_EVAL_KEYS = ("val_loss", "val/loss", "valid_loss", "validation_loss", "val_loss_epoch", "eval_loss")


@register_parser
class LightningParser:
    name: ClassVar[str] = "lightning"
    hints: ClassVar[tuple[str, ...]] = ("Epoch",)  # a line sniff() accepts holds one
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 70  # sniffed after smaller orders (registry.py)

    def __init__(self) -> None:
        self._overflow = OverflowTracker()
        self._last_step: int | None = None
        self._last_epoch: int | None = None
        self._epoch_base = 0
        self._last_n = 0
        self._last_val: str | None = None
        self._postfix: str | None = None
        self._metrics: tuple[dict[str, float], dict[str, float], str | None] = ({}, {}, None)
        self._held: StepRecord | None = None  # the latest step, until its last drawing is known
        # The last Rich bar: (its line number, its line, epoch, n, total, rate, postfix, last epoch).
        self._rich: tuple[int, LogLine, str, str, str | None, str, str, int | None] | None = None

    def sniff(self, text: str) -> bool:
        if "Epoch " not in text:
            return False
        text = strip_ansi(text)
        return _TQDM.search(text) is not None or _RICH.search(text) is not None

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if "Epoch " not in text:
            rich, self._rich = self._rich, None
            if rich is not None and rich[0] + 1 == line.lineno and _RICH_MORE.fullmatch(strip_ansi(text)):
                # The bar's metrics go on here: the same drawing, with all of its postfix.
                _, bar, epoch, n, total, rate, info, last = rich
                info = f"{info} {text.strip()}"
                self._rich = (line.lineno, bar, epoch, n, total, rate, info, last)
                return self._bar(bar, epoch, n, total, rate, info, last)
            if OverflowTracker.maybe(text):
                return list(self._overflow.feed(line, strip_ansi(text)) or ())
            return []
        self._rich = None
        text = strip_ansi(text)
        if "\r" in text:  # an unsplit run of redraws: the last one is current
            text = text.rstrip("\r")
            text = text[text.rfind("\r") + 1 :]
        m = _TQDM.search(text)
        if m is not None:
            n_raw = m.group("n") or m.group("count")
            parts = m.group("info").split(",", 2)
            rate = parts[1] if len(parts) > 1 else ""
            postfix = parts[2] if len(parts) > 2 else ""
            return self._bar(line, m.group("epoch"), n_raw, m.group("total"), rate, postfix, None)
        r = _RICH.search(text)
        if r is not None:
            # "Epoch 0/-2": max_steps without max_epochs (Lightning prints max_epochs - 1, and
            # max_epochs is -1); "5072/--": an iterable without a length.
            last = to_int(r.group("last")) if r.group("last") else None
            if last is not None and last < 0:
                last = None
            rate = r.group("rate") or ""
            total = r.group("total")
            total = None if total == "--" else total
            self._rich = (
                line.lineno,
                line,
                r.group("epoch"),
                r.group("n"),
                total,
                rate,
                r.group("info"),
                last,
            )
            return self._bar(
                line,
                r.group("epoch"),
                r.group("n"),
                total,
                rate,
                r.group("info"),
                last,
            )
        return []

    def _bar(
        self,
        line: LogLine,
        epoch_raw: str,
        n_raw: str,
        total_raw: str | None,
        rate: str,
        postfix: str,
        last_epoch: int | None,
    ) -> list[Record]:
        epoch, n = to_int(epoch_raw), to_int(n_raw)
        if epoch is None or n is None:
            return []
        total = to_int(total_raw) if total_raw else None
        step = self._global_step(epoch, n, total)
        # Redraws repeat the postfix between two logging steps; parse it once.
        if postfix != self._postfix:
            self._postfix = postfix
            self._metrics = self._read_postfix(postfix)
        fields, eval_metrics, raw_val = self._metrics
        out: list[Record] = []
        held = self._held
        # ``n/total`` counts batches done in the epoch: 0 is an epoch about to start (a
        # redraw of the previous total), and a step never comes twice or goes backwards.
        if n > 0 and (self._last_step is None or step > self._last_step):
            if held is not None:
                out.append(held)
            self._last_step = step
            total_steps = total * (last_epoch + 1) if total is not None and last_epoch is not None else None
            self._held = step_record(
                line,
                step=step,
                total_steps=total_steps,
                epoch=float(epoch),
                loss=fields.get("loss"),
                grad_norm=fields.get("grad_norm"),
                learning_rate=fields.get("learning_rate"),
                step_time_s=rate_to_step_time(rate),
            )
        elif held is not None and step == held.step:
            # Lightning draws a step, then sets the postfix the step logged and draws it
            # again: the second drawing holds this step's values.
            for name in ("loss", "grad_norm", "learning_rate"):
                v = fields.get(name)
                if v is not None:
                    setattr(held, name, v)
        if raw_val is not None and raw_val != self._last_val:
            self._last_val = raw_val
            val = to_float(raw_val)
            if val is not None:
                out.extend(self.release())
                out.append(eval_record(line, eval_loss=val, step=step, metrics=dict(eval_metrics)))
        return out

    def release(self) -> list[Record]:
        """The step record waiting for a second drawing of its step (or the next step)."""
        held, self._held = self._held, None
        return [held] if held is not None else []

    def finish(self) -> list[Record]:
        return self.release()

    @staticmethod
    def _read_postfix(postfix: str) -> tuple[dict[str, float], dict[str, float], str | None]:
        bag = MetricBag()
        raw_val: str | None = None
        for key, raw in _POSTFIX.findall(postfix):
            if key == "v_num":
                continue
            if raw_val is None and key in _EVAL_KEYS:
                raw_val = raw
            bag.put(key, to_float(raw))
        return bag.fields, bag.eval_metrics, raw_val

    def _global_step(self, epoch: int, n: int, total: int | None) -> int:
        if total:
            return epoch * total + n
        if self._last_epoch is not None and epoch != self._last_epoch:
            self._epoch_base += self._last_n
        self._last_epoch, self._last_n = epoch, n
        return self._epoch_base + n


@register_parser
class LightningCsvParser:
    """Rows of ``CSVLogger``'s ``metrics.csv``; columns are named by its header line.

    Lightning rewrites the file with a wider header when new metric names appear, so a
    header seen at any point replaces the column list.
    """

    name: ClassVar[str] = "lightning_csv"
    hints: ClassVar[tuple[str, ...]] = ("step",)  # a line sniff() accepts holds one
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 80  # sniffed after smaller orders (registry.py)

    _IDENT = re.compile(r"[A-Za-z_][\w/.\-() ]{0,120}")

    def __init__(self) -> None:
        self._cols: list[str] | None = None
        self._commas = -1

    def sniff(self, text: str) -> bool:
        return self._header(text) is not None

    def _header(self, text: str) -> list[str] | None:
        if "step" not in text or "," not in text:
            return None
        cols = [c.strip().strip('"') for c in text.strip().split(",")]
        if len(cols) < 2 or "step" not in cols:
            return None
        if not all(self._IDENT.fullmatch(c) for c in cols):
            return None
        if not any("loss" in c or c == "epoch" for c in cols):
            return None
        return cols

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if self._cols is None or "step" in text:
            cols = self._header(text)
            if cols is not None:
                self._cols, self._commas = cols, len(cols) - 1
                return []
        if self._cols is None or text.count(",") != self._commas:
            return []
        return self._row(line, text)

    def _row(self, line: LogLine, text: str) -> list[Record]:
        assert self._cols is not None
        bag = MetricBag()
        epoch_loss: float | None = None
        for col, cell in zip(self._cols, text.split(","), strict=False):
            v = to_float(cell) if cell.strip() else None
            taken = bag.put(col, v)
            if not taken and v is not None and col.startswith("train") and col.endswith("loss_epoch"):
                epoch_loss = v
        f = bag.fields
        if "step" not in f:
            return []
        if epoch_loss is not None and "loss" not in f:
            # The epoch-end row (``self.log(..., on_epoch=True)`` writes "train_loss_epoch" at the
            # epoch's last global step): the run reached this step, its loss the epoch's mean.
            f["loss"] = epoch_loss
        step = to_int(f["step"])
        out: list[Record] = []
        if any(k in f for k in ("loss", "grad_norm")):
            rec = bag.step_record(line)
            if rec is not None:
                out.append(rec)
        if "eval_loss" in f or bag.eval_metrics:
            metrics = dict(bag.eval_metrics)
            out.append(eval_record(line, eval_loss=f.get("eval_loss"), step=step, metrics=metrics))
        return out
