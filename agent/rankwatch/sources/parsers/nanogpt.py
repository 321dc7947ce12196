"""nanoGPT's ``train.py``: ``iter N: loss L, time Tms, mfu M%`` and eval lines
``step N: train loss A, val loss B``.
"""

from __future__ import annotations

import re
from typing import ClassVar

from rankwatch.records import Record

from ._common import eval_record, ratio, seconds, step_record, strip_ansi, to_float, to_int
from .base import LogLine
from .registry import register_parser

_NUM = r"[-+]?(?:\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+|nan|NaN|inf|-inf|Infinity)"
# A fork may print the loss's unit after it ("loss 3.1895 BPC": bits per character on enwik8).
_UNIT = r"(?: [A-Za-z]{1,8})?"
_ITER = re.compile(
    rf"^\s*iter (?P<it>\d{{1,18}}): loss (?P<loss>{_NUM}){_UNIT}, time (?P<t>{_NUM})\s?(?P<u>ms|s)(?:/step)?"
    rf"(?:, lr (?P<lr>{_NUM}))?(?:, mfu (?P<mfu>{_NUM})%)?"
)
_EVAL = re.compile(
    rf"^\s*step (?P<it>\d{{1,18}}): train loss (?P<train>{_NUM}){_UNIT}, val loss (?P<val>{_NUM})"
)


@register_parser
class NanoGPTParser:
    name: ClassVar[str] = "nanogpt"
    hints: ClassVar[tuple[str, ...]] = ("oss",)  # a line sniff() accepts holds one
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 40  # sniffed after smaller orders (registry.py)

    def sniff(self, text: str) -> bool:
        if "loss" not in text:
            return False
        text = strip_ansi(text)
        return _ITER.match(text) is not None or _EVAL.match(text) is not None

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if "loss" not in text:
            return []
        text = strip_ansi(text)
        m = _ITER.match(text)
        if m is not None:
            lr = m.group("lr")
            mfu = m.group("mfu")
            return [
                step_record(
                    line,
                    step=to_int(m.group("it")),
                    loss=to_float(m.group("loss")),
                    step_time_s=seconds(to_float(m.group("t")), m.group("u")),
                    learning_rate=to_float(lr) if lr else None,
                    mfu=ratio(to_float(mfu), True) if mfu else None,
                )
            ]
        e = _EVAL.match(text)
        if e is not None:
            train = to_float(e.group("train"))
            metrics = {"train_loss": train} if train is not None else {}
            return [
                eval_record(
                    line, eval_loss=to_float(e.group("val")), step=to_int(e.group("it")), metrics=metrics
                )
            ]
        return []
