"""When nothing in a log was read: which lines looked like records, why none was taken, and a
drafted ``logs.format: regex`` pattern for the commonest of them.

A line "looks like a record" when it names a number with a metric word (a known alias such as
``lr`` or ``grad_norm``, or any name with ``loss`` in it). It was not taken because it names no
step (nor epoch and iteration), or no metric the detectors use, or the format sniffed first
claimed the stream. The draft turns the commonest such line into a regex: its words literal,
its numbers groups, each named by the word before it where that word means something
(``(?P<loss>...)``, ``(?P<step>...)``), the first integer the step when no word names one.
The draft is checked against the line it came from before it is offered.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from rankwatch.sources.decorations import strip
from rankwatch.sources.parsers import RegexParser, make_parser
from rankwatch.sources.parsers._common import canonical, strip_ansi
from rankwatch.sources.parsers.base import LogLine

__all__ = ["Diagnosis", "NearMiss", "diagnose_lines", "draft_pattern"]

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
_VALUE = r"[-+]?[\d.]+(?:[eE][-+]?\d+)?|nan|inf"  # a drafted group: short enough to read
_TOKEN = re.compile(
    r"(?P<stamp>\d+(?:[-:/]\d+)+(?:[.,]\d+)?)"  # dates, clocks and i/n counts: matched, never a group
    rf"|(?P<num>{_NUM})|(?P<word>[A-Za-z_][\w./%-]*)|(?P<space>\s+)|(?P<other>.)",
    re.IGNORECASE,
)
# Words that name a step in a drafted pattern (canonical() knows more; these count batches).
_STEP_WORDS = frozenset({"batch", "b", "idx", "iter", "it", "iteration", "step", "update", "i"})
_PAIR = re.compile(
    rf"(?P<k>[A-Za-z_][\w./-]{{0,40}})['\"]?\s{{0,3}}[:=]?\s{{0,3}}['\"]?(?P<v>{_NUM})\b", re.IGNORECASE
)
_GROUP_OF = {
    "step": "step",
    "total_steps": "total_steps",
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "loss_scale": "loss_scale",
    "tokens_per_s": "tokens_per_s",
    "samples_per_s": "samples_per_s",
    "eval_loss": "eval_loss",
    "epoch": "epoch",
}
MAX_EXAMPLES = 5
MAX_LINES = 200_000  # a diagnosis reads at most this many lines


@dataclass
class NearMiss:
    lineno: int
    text: str
    why: str


@dataclass
class Diagnosis:
    lines: int = 0
    candidates: int = 0
    examples: list[NearMiss] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    pattern: str | None = None

    def render(self) -> str:
        if not self.candidates:
            return (
                f"none of its {self.lines} lines names a number with a metric word (loss, lr, grad_norm, ...)"
            )
        out = [f"{self.candidates} of its {self.lines} lines looked like records but were not taken:"]
        out += [f"  {why}: {n} lines" for why, n in self.reasons.most_common(4)]
        out += [f"  line {m.lineno}: {_printable(m.text[:160])}" for m in self.examples]
        if self.pattern:
            out.append(
                f"a drafted pattern for them (logs.format: regex, logs.regex):\n  {_printable(self.pattern)}"
            )
        return "\n".join(out)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    """Log text on a terminal: no control characters (escape sequences) of the job's."""
    return _CONTROL.sub("?", text)


def _metric_words(text: str) -> tuple[list[str], bool]:
    """(the metric names with a number, whether one of them names a step or epoch)."""
    names: list[str] = []
    step = False
    for m in _PAIR.finditer(text):
        key = m.group("k")
        field_ = canonical(key)
        if field_ in ("step", "epoch"):
            step = True
        elif field_ is not None or "loss" in key.lower():
            names.append(key)
    return names, step


def _why(text: str, names: list[str], step: bool) -> str:
    if not step:
        return "no step, iteration or epoch on the line"
    known = [n for n in names if canonical(n) in ("loss", "grad_norm", "eval_loss")]
    if not known:
        return "no metric the detectors use (loss, grad_norm, eval loss) by a known name"
    return "a format sniffed earlier in the file claimed the stream"


def diagnose_lines(lines: Iterable[str]) -> Diagnosis:
    """Look at a log that yielded nothing: its near-miss lines and a drafted pattern."""
    d = Diagnosis()
    shapes: Counter[str] = Counter()
    first_of: dict[str, str] = {}
    for lineno, raw in enumerate(lines, 1):
        if lineno > MAX_LINES:
            break
        d.lines = lineno
        text = strip_ansi(strip(raw.rstrip("\n"))[0]).strip()
        if not text or len(text) > 2000 or not any(c.isdigit() for c in text):
            continue
        names, step = _metric_words(text)
        if not names:
            continue
        d.candidates += 1
        why = _why(text, names, step)
        d.reasons[why] += 1
        if len(d.examples) < MAX_EXAMPLES:
            d.examples.append(NearMiss(lineno, text, why))
        shape = _TOKEN.sub(lambda m: "9" if m.group("num") or m.group("stamp") else m.group(0), text)
        shapes[shape] += 1
        first_of.setdefault(shape, text)
    if shapes:
        shape, _ = shapes.most_common(1)[0]
        d.pattern = draft_pattern(first_of[shape])
    return d


def draft_pattern(text: str) -> str | None:
    """A regex for lines shaped like ``text`` whose named groups fill a record, or None."""
    parts: list[str] = []
    used: set[str] = set()
    last_word = ""
    first_int: int | None = None
    for m in _TOKEN.finditer(text):
        if m.group("space"):
            parts.append(r"\s+")
        elif m.group("stamp"):
            parts.append(r"[\d:/.,-]+")
            last_word = ""
        elif m.group("word"):
            w = m.group("word")
            if w.lower() in ("nan", "inf"):
                parts.append(rf"(?:{_VALUE})")
                continue
            last_word = w
            parts.append(re.escape(w))
        elif m.group("num"):
            num = m.group("num")
            word = last_word.lower()
            group = _GROUP_OF.get(canonical(word) or "") if word else None
            if group is None and word in _STEP_WORDS and num.isdigit():
                group = "step"
            if group is None and "loss" in word and "loss" not in used:
                group = "loss"
            if group is not None and group not in used:
                used.add(group)
                parts.append(r"(?P<step>\d+)" if group == "step" else rf"(?P<{group}>{_VALUE})")
            else:
                if first_int is None and num.isdigit() and word:
                    first_int = len(parts)
                parts.append(rf"(?:{_VALUE})")
            last_word = ""
        else:
            parts.append(re.escape(m.group(0)))
    if "step" not in used and "epoch" not in used and first_int is not None:
        parts[first_int] = r"(?P<step>\d+)"
        used.add("step")
    if not used & {"loss", "grad_norm", "eval_loss"}:
        return None
    pattern = "".join(parts)
    try:
        parser = make_parser("regex", regex=pattern)
    except ValueError:
        return None
    assert isinstance(parser, RegexParser)
    return pattern if parser.parse(LogLine(text, 1)) else None
