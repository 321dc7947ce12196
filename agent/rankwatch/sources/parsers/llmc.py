"""llm.c (``train_gpt2cu``): its logfile and its console.

The logfile (``-o DIR``, ``DIR/main.log``) holds ``s:N trl:LOSS lr:LR norm:NORM`` per step
(older builds: ``s:N trl:LOSS`` only), ``s:N tel:LOSS`` per validation and ``s:N eval:ACC``
for HellaSwag. The console prints ``step    N/M | loss L (+0.19z)| norm G (+3.74z)| lr LR |
T ms | P% bf16 MFU | K tok/s`` (``train loss`` in older builds, ``-100.0%`` MFU while not
measured, a z-score in parentheses that may read ``+nanz`` before there is a history) and
``val loss L`` after the step it follows.
"""

from __future__ import annotations

import re
from typing import ClassVar

from rankwatch.records import Record

from ._common import eval_record, ratio, step_record, strip_ansi, to_float, to_int
from .base import LogLine
from .registry import register_parser

_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|nan|-?inf)"
_FILE = re.compile(rf"^s:(?P<s>\d{{1,18}}) (?P<k>trl|tel|eval):(?P<v>{_NUM})(?P<rest>.*)$")
_FILE_FIELD = re.compile(rf"\b(lr|norm):({_NUM})")
_Z = r"(?:\s*\([-+]?(?:\d+\.?\d*|nan|inf)z\))?"  # the z-score after a value
_CONSOLE = re.compile(
    rf"^step\s+(?P<s>\d{{1,18}})/(?P<n>\d{{1,18}})\s*[|:]\s*(?:train )?loss (?P<loss>{_NUM}){_Z}\s*\|?"
    rf"(?:\s*norm (?P<norm>{_NUM}){_Z}\s*\|?)?(?:\s*lr (?P<lr>{_NUM})\s*\|?)?"
    rf"\s*\(?(?P<ms>{_NUM}) ms(?:\s*[|,]\s*(?P<mfu>{_NUM})% [^|]{{0,30}}MFU)?"
    rf"(?:\s*[|,]\s*(?P<tok>{_NUM}) tok/s)?"
)
_VAL = re.compile(rf"^val loss (?P<v>{_NUM})\s*$")


@register_parser
class LlmcParser:
    name: ClassVar[str] = "llmc"
    hints: ClassVar[tuple[str, ...]] = ("trl:", "tel:", "step")  # a line sniff() accepts holds one
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 50  # sniffed after smaller orders (registry.py)

    def __init__(self) -> None:
        self._last_step: int | None = None

    def sniff(self, text: str) -> bool:
        text = strip_ansi(text).strip()
        if text.startswith("s:"):
            return _FILE.match(text) is not None
        return text.startswith("step") and _CONSOLE.match(text) is not None

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        c = text[:1]
        if c != "s" and c != "v" and c != "\x1b" and c != " ":
            return []
        text = strip_ansi(text).strip()
        if text.startswith("s:"):
            return self._file(line, text)
        if text.startswith("step"):
            m = _CONSOLE.match(text)
            if m is None:
                return []
            step = to_int(m.group("s"))
            self._last_step = step
            mfu, tok, norm, lr = m.group("mfu"), m.group("tok"), m.group("norm"), m.group("lr")
            ms = to_float(m.group("ms"))
            return [
                step_record(
                    line,
                    step=step,
                    total_steps=to_int(m.group("n")),
                    loss=to_float(m.group("loss")),
                    grad_norm=to_float(norm) if norm else None,
                    learning_rate=to_float(lr) if lr else None,
                    step_time_s=ms / 1000.0 if ms is not None else None,
                    mfu=ratio(to_float(mfu), True) if mfu else None,
                    tokens_per_s=to_float(tok) if tok else None,
                )
            ]
        if text.startswith("val loss"):
            v = _VAL.match(text)
            if v is not None:
                return [eval_record(line, eval_loss=to_float(v.group("v")), step=self._last_step)]
        return []

    def _file(self, line: LogLine, text: str) -> list[Record]:
        m = _FILE.match(text)
        if m is None:
            return []
        step = to_int(m.group("s"))
        kind = m.group("k")
        value = to_float(m.group("v"))
        if kind == "tel":
            return [eval_record(line, eval_loss=value, step=step)]
        if kind == "eval":  # HellaSwag accuracy: not a loss
            return []
        self._last_step = step
        extra = dict(_FILE_FIELD.findall(m.group("rest")))
        return [
            step_record(
                line,
                step=step,
                loss=value,
                learning_rate=to_float(extra.get("lr")),
                grad_norm=to_float(extra.get("norm")),
            )
        ]
