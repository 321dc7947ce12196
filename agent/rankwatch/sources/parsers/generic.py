"""Formats no framework owns: JSON lines, ``key=value`` / ``key: value`` text, and a
user-supplied regex with named groups.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, ClassVar

from rankwatch.records import Record, StepRecord

from ._common import MetricBag, OverflowTracker, canonical, eval_record, strip_ansi, to_float, to_int
from ._progress import bare_count, loss_columns, progress, table_header, table_row
from .base import LogLine
from .deepspeed import DeepSpeedParser
from .hf import HFParser
from .lightning import LightningParser
from .llmc import LlmcParser
from .megatron import MegatronParser
from .nanogpt import NanoGPTParser
from .olmo import OlmoParser
from .torchtitan import TorchTitanParser

_SPECIFIC = (
    MegatronParser(),
    DeepSpeedParser(),
    TorchTitanParser(),
    NanoGPTParser(),
    LlmcParser(),
    OlmoParser(),
    LightningParser(),
    HFParser(),
)


def _specific(text: str) -> bool:
    """Lines a framework parser claims must not be sniffed as a generic format."""
    return any(p.sniff(text) for p in _SPECIFIC)


def _records(bag: MetricBag, line: LogLine) -> list[Record]:
    out: list[Record] = []
    rec = bag.step_record(line)
    if rec is not None:
        out.append(rec)
    ev = bag.eval_record(line)
    if ev is not None:
        if rec is not None:
            ev.metrics.pop("train_loss", None)
        out.append(ev)
    return out


# ---------------------------------------------------------------- JSON lines


def _flatten(obj: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth < 2:
            out.update(_flatten(v, f"{key}/", depth + 1))
        else:
            out[key] = v
    return out


def _json_number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:
            return math.copysign(math.inf, v)
    if isinstance(v, str):
        return to_float(v)
    if isinstance(v, list) and len(v) == 1:
        return _json_number(v[0])
    return None


def _json_key(key: str) -> str:
    """``train/loss`` -> ``loss``; eval prefixes kept so ``eval/loss`` stays an eval value."""
    if canonical(key) is not None:
        return key
    tail = key.rsplit("/", 1)[-1]
    head = key[: -len(tail)].lower()
    if head.startswith(("eval", "val", "valid", "validation")) and canonical(f"val_{tail}") is not None:
        return f"val_{tail}"
    if canonical(tail) is not None and not head.startswith(("eval", "val", "test")):
        return tail
    return key


class JsonParser:
    name: ClassVar[str] = "json"
    hints: ClassVar[tuple[str, ...]] = ("{",)  # a line sniff() accepts holds one
    generic: ClassVar[bool] = True  # claims lines a specific format prints too: may be overtaken

    def sniff(self, text: str) -> bool:
        obj = self._load(text)
        if obj is None or _specific(text):
            return False
        fields = {canonical(_json_key(k)) for k in obj}
        return bool(fields & {"loss", "eval_loss"}) and bool(fields & {"step", "epoch", "learning_rate"})

    @staticmethod
    def _load(text: str) -> dict[str, Any] | None:
        if "{" not in text:
            return None
        s = strip_ansi(text).strip()
        if not (s.startswith("{") and s.endswith("}")) or '"' not in s:
            return None
        try:
            obj = json.loads(s)
        except (ValueError, RecursionError):
            return None
        return _flatten(obj) if isinstance(obj, dict) else None

    def parse(self, line: LogLine) -> list[Record]:
        obj = self._load(line.text)
        if obj is None:
            return []
        bag = MetricBag()
        for k, v in obj.items():
            if isinstance(k, str):
                key = _json_key(k)
                unit = "%" if "%" in key else ""
                bag.put(key, _json_number(v), unit)
        return _records(bag, line)


# ---------------------------------------------------------------- key=value text (the general reader)

_NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)\b"
_WORD = r"[A-Za-z_][A-Za-z0-9_./()%-]{0,40}"
# ``k: v``, ``k=v``, ``k v``, ``k : v``, ``| k v |``, ``'k': 'v'``, ``k: [v]``, a unit after the
# number with or without a space (``iter time: 40.78 ms``), ``k: i/n``.
_PAIR = re.compile(
    rf"(?<![\w./-])['\"]?(?P<k>{_WORD}(?: [A-Za-z_][A-Za-z_]{{0,20}})?)['\"]?"
    rf"\s{{0,4}}(?:[:=]\s{{0,8}}[\['\"]?|\s{{1,8}})"
    rf"(?P<v>{_NUMBER})['\"]?(?: ?(?P<u>ms|s|%|GiB|GB|MiB|MB|it/s|s/it)(?![A-Za-z]))?"
    rf"(?:\s{{0,4}}/\s{{0,4}}(?P<tot>\d{{1,18}}))?(?=[\s,;:|)\]}}'\"]|$)",
    re.IGNORECASE,
)
# A word that names the step outright beats one that counts micro-batches (LitGPT prints
# "iter 62 step 62": iter counts batches, step counts optimizer steps).
_STEP_WORDS = frozenset(
    {"step", "steps", "global_step", "globalstep", "optimizer_step", "trainer/global_step"}
)


def _kv_gate(text: str) -> bool:
    return "oss" in text or "OSS" in text


def _is_part(key: str) -> bool:
    """A named part of the training loss (``loss_cls``, ``box_loss``, ``s0.loss_bbox``)."""
    k = key.lower()
    return "loss" in k and not k.startswith(("val", "eval", "test", "valid")) and "scale" not in k


class KvParser:
    """The general reader: any line that pairs a step (or an epoch and an iteration) with named
    numbers, whatever its punctuation. ``step=10 loss=2.45 lr=6.67e-05``, ``Step 10: loss=2.45``,
    ``Epoch 1 Step 10 | loss: 2.45 | lr: 1e-4``, ``iter: 19  total_loss: 1.36``,
    ``Epoch(train)  [1][ 500/2931]  loss: nan``, ``Train: 0 [1550/2502 (62%)]  Loss: 6.9``,
    ``1|25|Loss: 1.26``, and column tables under a header line (ultralytics).

    Metric names are matched by meaning (``_common.ALIASES``): a total loss is preferred over
    its parts, and when only parts are written (YOLO's box/cls/dfl) their sum is the loss.
    """

    name: ClassVar[str] = "kv"
    hints: ClassVar[tuple[str, ...]] = ("oss", "OSS", "Epoch")  # a line sniff() accepts holds one
    generic: ClassVar[bool] = True  # claims lines a specific format prints too: may be overtaken

    def __init__(self) -> None:
        self._cols: list[str] | None = None
        self._loss_cols: list[int] = []
        self._last: tuple[int | None, float | None] | None = None
        self._overflow = OverflowTracker()

    def sniff(self, text: str) -> bool:
        if "Epoch" in text and table_header(strip_ansi(text)) is not None:
            return not _specific(text)
        if not _kv_gate(text) or JsonParser._load(text) is not None:
            return False  # a JSON object is the JSON reader's
        bag = self._bag(strip_ansi(text))
        f = bag.fields
        if not ({"loss", "eval_loss"} & f.keys()):
            return False
        # A counter named "epoch" is a step counter when it is a whole number ("epoch: 3442
        # loss: 0.21"); a fraction (HF's 'epoch': 0.53) is not.
        epoch = f.get("epoch")
        whole = epoch is not None and math.isfinite(epoch) and epoch == int(epoch)
        if "step" not in f and not whole:
            return False
        return not _specific(text)

    @staticmethod
    def _bag(text: str, *, bare: bool = False) -> MetricBag:
        bag = MetricBag()
        f = bag.fields
        step_word = False
        parts: list[float] = []
        for m in _PAIR.finditer(text):
            key = m.group("k")
            field = canonical(key)
            if field is None and " " in key:
                key = key.rsplit(" ", 1)[1]
                field = canonical(key)
            if field is None:
                if _is_part(key):
                    v = to_float(m.group("v"))
                    if v is not None:
                        parts.append(v)
                continue
            unit = m.group("u") or ""
            if field == "step":
                if unit:
                    continue
                v = to_float(m.group("v"))
                if v is None:
                    continue
                named = key.strip().lower() in _STEP_WORDS
                if "step" not in f or (named and not step_word):
                    f["step"] = v
                    step_word = step_word or named
                    if m.group("tot"):
                        f["total_steps"] = float(m.group("tot"))
                continue
            bag.put(key, to_float(m.group("v")), unit)
        if "step" not in f:
            prog = progress(text)
            if prog is not None:
                f["step"] = prog[0]
                if prog[1] is not None:
                    f.setdefault("total_steps", prog[1])
                if prog[2] is not None:
                    f.setdefault("epoch", prog[2])
            elif bare and "epoch" not in f:
                count = bare_count(text)
                if count is not None:
                    f["step"], f["total_steps"] = count
        if "loss" not in f and parts:
            f["loss"] = math.fsum(parts) if all(map(math.isfinite, parts)) else math.nan
        return bag

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if not _kv_gate(text):
            if self._cols is not None or "Epoch" in text:
                return self._table(line, strip_ansi(text))
            return []
        text = strip_ansi(text)
        if "Epoch" in text and table_header(text) is not None:
            return self._table(line, text)
        if OverflowTracker.maybe(text):
            ovf = self._overflow.feed(line, text)
            if ovf is not None:
                return list(ovf)
        bag = self._bag(text, bare=True)
        if not ({"loss", "eval_loss", "grad_norm"} & bag.fields.keys()):
            return []
        out = _records(bag, line)
        if out and isinstance(out[0], StepRecord):
            # A progress bar redrawn with the same step and values (torchtune's tqdm) is one record.
            key = (out[0].step, out[0].loss)
            if key == self._last and key[0] is not None:
                out.pop(0)
            else:
                self._last = key
        return out

    def _table(self, line: LogLine, text: str) -> list[Record]:
        header = table_header(text) if "poch" in text else None
        if header is not None:
            self._cols, self._loss_cols = header, loss_columns(header)
            return []
        cols = self._cols
        if cols is None or not self._loss_cols:
            return []
        if "\r" in text:
            text = text.rstrip("\r")
            text = text[text.rfind("\r") + 1 :]
        row = table_row(text, len(cols))
        if row is None:
            return []
        epoch, epochs, cells = row
        bag = MetricBag()
        for name, cell in zip(cols[1:], cells[1:], strict=False):
            m = re.match(r"(-?[\d.eE+-]+|nan|inf)([A-Za-z]*)$", cell, re.IGNORECASE)
            if m is not None:
                bag.put(name, to_float(m.group(1)), m.group(2))
        parts = [to_float(cells[i]) for i in self._loss_cols]
        vals = [v for v in parts if v is not None]
        if vals and "loss" not in bag.fields:
            bag.fields["loss"] = math.fsum(vals) if all(map(math.isfinite, vals)) else math.nan
        bag.fields["step"], bag.fields["total_steps"], bag.fields["epoch"] = (
            float(epoch),
            float(epochs),
            float(epoch),
        )
        rec = bag.step_record(line)
        if rec is None:
            return []
        key = (rec.step, rec.loss)
        if self._last is not None and self._last[0] == rec.step:
            return []  # the same epoch's bar redrawn: its first complete drawing stands
        self._last = key
        return [rec]


# ---------------------------------------------------------------- user regex

_GROUPS = {
    "step",
    "total_steps",
    "loss",
    "grad_norm",
    "lr",
    "learning_rate",
    "loss_scale",
    "tokens_per_s",
    "samples_per_s",
    "step_time_s",
    "tflops",
    "mfu",
    "eval_loss",
    "epoch",
}


class RegexParser:
    """A user's regex; each known named group fills the record field of that name."""

    name: ClassVar[str] = "regex"
    hints: ClassVar[tuple[str, ...]] = ()  # never sniffed: only chosen by name
    generic: ClassVar[bool] = False

    def __init__(self, pattern: str) -> None:
        try:
            self._re = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"logs.regex does not compile: {e}") from None
        groups = set(self._re.groupindex)
        if not groups & _GROUPS:
            raise ValueError(
                "logs.regex has none of the known named groups; use e.g. (?P<step>\\d+) and "
                f"(?P<loss>[\\d.eE+-]+|nan). Known groups: {', '.join(sorted(_GROUPS))}"
            )
        self._groups = groups & _GROUPS

    def sniff(self, text: str) -> bool:
        return self._re.search(text) is not None

    def parse(self, line: LogLine) -> list[Record]:
        m = self._re.search(line.text)
        if m is None:
            return []
        g: dict[str, float] = {}
        mfu_pct = False
        for name in self._groups:
            raw = m.group(name)
            if raw is None:
                continue
            if name == "mfu" and raw.rstrip().endswith("%"):
                raw, mfu_pct = raw.rstrip()[:-1], True
            v = to_float(raw)
            if v is not None:
                g["learning_rate" if name == "lr" else name] = v
        bag = MetricBag()
        for name, v in g.items():
            if name == "mfu":
                bag.put("mfu", v, "%" if mfu_pct else "")
            elif name == "step_time_s":
                bag.fields["step_time_s"] = v
            else:
                bag.fields[name] = v
        out: list[Record] = []
        f = bag.fields
        if f.keys() - {"step", "total_steps", "eval_loss", "epoch"}:
            rec = bag.step_record(line, need_step=False)
            if rec is not None:
                out.append(rec)
        if "eval_loss" in f:
            out.append(eval_record(line, eval_loss=f["eval_loss"], step=to_int(f.get("step"))))
        return out
