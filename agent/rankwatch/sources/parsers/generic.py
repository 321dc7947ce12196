"""Formats no framework owns: JSON lines, ``key=value`` / ``key: value`` text, and a
user-supplied regex with named groups.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, ClassVar

from rankwatch.records import Record

from ._common import MetricBag, canonical, eval_record, strip_ansi, to_float, to_int
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


# ---------------------------------------------------------------- key=value text

_NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)\b"
_WORD = r"[A-Za-z_][A-Za-z0-9_./()%-]{0,40}"
_PAIR = re.compile(
    rf"(?<![\w./-])(?P<k>{_WORD}(?: [A-Za-z_][A-Za-z_]{{0,20}})?)\s{{0,4}}(?:[:=]\s{{0,8}}\[?|\s{{1,8}})"
    rf"(?P<v>{_NUMBER})(?P<u>ms|s|%|GiB|GB|MiB|MB|it/s|s/it)?"
    rf"(?:\s{{0,4}}/\s{{0,4}}(?P<tot>\d{{1,18}}))?(?=[\s,;:|)\]}}]|$)",
    re.IGNORECASE,
)


def _kv_gate(text: str) -> bool:
    return "oss" in text or "OSS" in text


# OpenMMLab (mmengine, mmcv): "Epoch(train) [1][240/735]  lr: 1.98e-04 ... loss: 2.51  grad_norm: nan",
# "Iter(train) [  200/10000]  ...", older "Epoch [1][100/62598]\tlr: ...". An epoch-based run's
# global iteration is (epoch - 1) x iterations per epoch + the iteration in the epoch.
_MM = re.compile(
    r"\b(?:(?P<e>Epoch)(?:\(train\))?\s?\[(?P<ep>\d{1,9})\]\[\s*(?P<i>\d{1,12})/(?P<n>\d{1,12})\]"
    r"|Iter\(train\)\s?\[\s*(?P<it>\d{1,15})/(?P<tot>\d{1,15})\])"
)


def _mm_step(text: str, bag: MetricBag) -> None:
    if "Epoch" not in text and "Iter(" not in text:
        return
    m = _MM.search(text)
    if m is None:
        return
    if m.group("e"):
        per_epoch = int(m.group("n"))
        bag.fields.setdefault("step", float((int(m.group("ep")) - 1) * per_epoch + int(m.group("i"))))
    else:
        bag.fields.setdefault("step", float(m.group("it")))
        bag.fields.setdefault("total_steps", float(m.group("tot")))


class KvParser:
    """``step=10 loss=2.45 lr=6.67e-05``, ``Step 10: loss=2.45, lr=6.67e-05``,
    ``Epoch 1 Step 10 | loss: 2.45 | lr: 1e-4``, ``step 10/100 | loss 2.4 | dt 120ms``."""

    name: ClassVar[str] = "kv"
    hints: ClassVar[tuple[str, ...]] = ("oss", "OSS")  # a line sniff() accepts holds one
    generic: ClassVar[bool] = True  # claims lines a specific format prints too: may be overtaken

    def sniff(self, text: str) -> bool:
        if not _kv_gate(text):
            return False
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
    def _bag(text: str) -> MetricBag:
        bag = MetricBag()
        _mm_step(text, bag)
        for m in _PAIR.finditer(text):
            key = m.group("k")
            field = canonical(key)
            if field is None and " " in key:
                key = key.rsplit(" ", 1)[1]
                field = canonical(key)
            if field is None:
                continue
            unit = m.group("u") or ""
            if field == "step" and unit:
                continue
            bag.put(key, to_float(m.group("v")), unit)
            if field == "step" and m.group("tot"):
                bag.put("total_steps", to_float(m.group("tot")))
        return bag

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if not _kv_gate(text):
            return []
        bag = self._bag(strip_ansi(text))
        if not ({"loss", "eval_loss", "grad_norm"} & bag.fields.keys()):
            return []
        return _records(bag, line)


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
