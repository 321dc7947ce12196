"""torchtitan's ``MetricsProcessor`` lines (colour codes around every field):
``step: 10  loss:  9.1234  grad_norm:  1.2  memory: 12.34GiB(15.20%)  tps: 5,123
tflops: 123.45  mfu: 12.34%`` and ``validate step: 10  loss: 8.9  memory: ...  tps: ...``.
Older releases print ``wps`` instead of ``tps`` and no grad_norm/tflops.

Every rank logs the same line; without a launcher prefix they all land on one stream (one
parser), where a step told again is the same step told by another rank: it counts once.
"""

from __future__ import annotations

import re
from typing import ClassVar

from rankwatch.records import Record

from ._common import eval_record, memory_bytes, ratio, step_record, strip_ansi, to_float, to_int
from .base import LogLine
from .registry import register_parser

_HEAD = re.compile(r"(?P<val>validate )?step:\s{0,8}(?P<step>\d{1,18})\s+loss:")
_FIELD = re.compile(
    r"(?P<k>[a-z_]{2,20}):\s{0,12}(?P<v>[-+]?[\d,]*\.?\d+(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf)"
    r"(?P<u>GiB|%)?(?:\((?P<pct>[\d.]+)%\))?",
    re.IGNORECASE,
)
_SNIFF = ("memory:", "tps:", "wps:", "mfu:", "tflops:", "grad_norm:")


@register_parser
class TorchTitanParser:
    name: ClassVar[str] = "torchtitan"
    hints: ClassVar[tuple[str, ...]] = ("step",)  # a line sniff() accepts holds one
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 30  # sniffed after smaller orders (registry.py)

    def __init__(self) -> None:
        self._last: tuple[bool, int | None] | None = None  # (validate?, step) of the last line

    def sniff(self, text: str) -> bool:
        if "step:" not in text or "loss:" not in text:
            return False
        text = strip_ansi(text)
        m = _HEAD.search(text)
        return m is not None and any(k in text[m.end() :] for k in _SNIFF)

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if "step:" not in text:
            return []
        text = strip_ansi(text)
        m = _HEAD.search(text)
        if m is None:
            return []
        f: dict[str, float] = {}
        units: dict[str, str] = {}
        for fm in _FIELD.finditer(text, m.end() - len("loss:")):
            key = fm.group("k").lower()
            val = to_float(fm.group("v"))
            if val is None or key in f:
                continue
            f[key] = val
            units[key] = fm.group("u") or ""
        step = to_int(m.group("step"))
        told = (bool(m.group("val")), step)
        if told == self._last:
            return []  # the same step printed by another rank
        self._last = told
        mem = f.get("memory")
        max_mem = memory_bytes(mem, "gib") if mem is not None else None
        tps = f.get("tps", f.get("wps"))
        if m.group("val"):
            if "loss" not in f:
                return []
            metrics = {"tps": tps} if tps is not None else {}
            return [eval_record(line, eval_loss=f["loss"], step=step, metrics=metrics)]
        mfu = f.get("mfu")
        return [
            step_record(
                line,
                step=step,
                loss=f.get("loss"),
                grad_norm=f.get("grad_norm"),
                max_memory_bytes=max_mem,
                tokens_per_s=tps,
                tflops=f.get("tflops"),
                mfu=ratio(mfu, units.get("mfu") == "%" or (mfu is not None and mfu > 1)),
                learning_rate=f.get("lr"),
            )
        ]
