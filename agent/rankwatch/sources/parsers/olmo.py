"""OLMo's trainer (``olmo.train``) and OLMo-core: one record over several lines.

``[step=12/739328]`` (``[step=12/739328,epoch=0]``, OLMo-core ``[step=12/30000, eta=...]``)
ends the logger's own prefix (``[2024-04-17 09:42:26] INFO [olmo.train:816, rank=0]`` or
``2024-08-06 09:59:26.181 host:0  olmo.train:908  INFO``), and the metrics follow, one per
indented line: ``    train/CrossEntropyLoss=11.25``, ``    optim/total_grad_norm=231.7``,
``    throughput/device/tokens_per_second=45,538``. A record is complete when a line that is
not one of its metrics comes (or the stream ends or goes quiet).
"""

from __future__ import annotations

import re
from typing import ClassVar

from rankwatch.records import Record

from ._common import MIB, eval_record, step_record, strip_ansi, to_float, to_int
from .base import LogLine
from .registry import register_parser

_HEAD = re.compile(r"\[step=(?P<s>\d{1,18})/(?P<n>\d{1,18})(?:,\s?[a-z_]+=[^\]]{0,60})?\]\s*$")
_RANK = re.compile(r"\brank=(\d{1,7})\]")
_METRIC = re.compile(
    r"^\s+(?P<k>[A-Za-z][\w/ ().-]{0,120}?)=(?P<v>[-+]?[\d,]*\.?\d+(?:[eE][-+]?\d+)?|nan|inf|-inf)\s*$"
)

_FIELDS = {
    "train/crossentropyloss": "loss",
    "train/ce loss": "loss",
    "optim/total_grad_norm": "grad_norm",
    "optim/total grad norm": "grad_norm",
    "optim/learning_rate_group0": "learning_rate",
    "optim/lr (group 0)": "learning_rate",
    "throughput/device/tokens_per_second": "tokens_per_s",
    "throughput/device/tps": "tokens_per_s",
    "system/peak gpu memory (mb)": "max_memory_mib",
}


@register_parser
class OlmoParser:
    name: ClassVar[str] = "olmo"
    hints: ClassVar[tuple[str, ...]] = ("step",)  # a line sniff() accepts holds one
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 60  # sniffed after smaller orders (registry.py)

    def __init__(self) -> None:
        self._open: LogLine | None = None  # the header of the record being collected
        self._step: int | None = None
        self._total: int | None = None
        self._rank: int | None = None
        self._fields: dict[str, float] = {}
        self._eval: list[float] = []

    def sniff(self, text: str) -> bool:
        return "[step=" in text and _HEAD.search(strip_ansi(text)) is not None

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if self._open is not None and text[:1] in (" ", "\t"):
            m = _METRIC.match(text)
            if m is not None:
                self._metric(m.group("k").strip().lower(), to_float(m.group("v")))
                return []
        out = self._emit() if self._open is not None else []
        if "[step=" in text:
            text = strip_ansi(text)
            h = _HEAD.search(text)
            if h is not None:
                self._open = line
                self._step = to_int(h.group("s"))
                self._total = to_int(h.group("n"))
                r = _RANK.search(text, 0, h.start())
                self._rank = int(r.group(1)) if r is not None else None
        return out

    def finish(self) -> list[Record]:
        return self._emit() if self._open is not None else []

    def release(self) -> list[Record]:
        return self.finish()

    def _metric(self, key: str, value: float | None) -> None:
        if value is None:
            return
        field = _FIELDS.get(key)
        if field is not None:
            self._fields.setdefault(field, value)
        elif key.startswith("eval/") and key.endswith(("/crossentropyloss", "/ce loss")):
            self._eval.append(value)

    def _emit(self) -> list[Record]:
        head = self._open
        assert head is not None
        self._open = None
        f, self._fields = self._fields, {}
        evals, self._eval = self._eval, []
        line = LogLine(head.text, head.lineno, head.rank if self._rank is None else self._rank, head.time)
        out: list[Record] = []
        if f:
            mem = f.get("max_memory_mib")
            out.append(
                step_record(
                    line,
                    step=self._step,
                    total_steps=self._total,
                    loss=f.get("loss"),
                    grad_norm=f.get("grad_norm"),
                    learning_rate=f.get("learning_rate"),
                    tokens_per_s=f.get("tokens_per_s"),
                    max_memory_bytes=mem * MIB if mem is not None else None,
                )
            )
        if evals:
            out.append(eval_record(line, eval_loss=evals[0], step=self._step))
        return out
