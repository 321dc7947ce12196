"""Hugging Face Transformers ``Trainer`` console output.

The Trainer prints ``str(logs)`` dicts with no step number, while tqdm draws the
progress bar on stderr. Both often land in one file, buffered differently, so a dict
can be glued to bar text, cut in two by it, or split over two lines. The dict is read
with a key/value regex (never ``literal_eval``) and the bar is cut out and remembered.

The step of a dict is the Trainer's global step, found in this order:

- The bar redrawn right after the dict. The Trainer prints through ``tqdm.write``, which
  clears the bar (a run of spaces between two ``\r``), prints the dict and redraws the
  bar at once, showing the step just logged. The bar drawn *before* the dict does not
  tell it: tqdm redraws at most every ``mininterval`` (0.1 s), so on fast steps it lags
  by up to ``logging_steps`` steps, which once multiplied the inferred interval.
- The dict's own ``epoch`` (global step / steps per epoch), once steps per epoch were
  learnt from dicts whose step the bar gave, to the precision the epoch was printed with
  (``f"{v:.4g}"`` since Transformers 5).
- The previous step plus ``logging_steps`` (learnt from two steps the bar gave).
- Otherwise the step is not known: the record carries none and the state counts it,
  which findings say. A step never exceeds the bar's total and never goes backwards.

Where the dicts and the bar reach the log through two pipes (torchrun ``--tee``, whose
stdout and stderr readers each write whole lines; a block-buffered stdout beside an
unbuffered stderr), a dict is no longer beside its redraw: tqdm's clearing is followed at
once by the redraw, and the dict lands lines before or after it. Each clearing-and-redraw
still marks one ``tqdm.write`` in order, so once one comes with no dict between, dicts and
such redraws are paired first to first (every dict the Trainer prints — a step's, an
evaluation's, the summary — is one write). On a real ``--tee`` log the bar drawn next to a
dict lagged it by up to 7 steps, and the steps learnt from it ran past the bar's total.

A Trainer that printed no loss dict at all (``logging_strategy="no"``) still drew its
bar: at the end of the stream, once a Trainer dict (its summary, an evaluation) showed
the log is the Trainer's, the steps the bar showed become the step records.
"""

from __future__ import annotations

import math
import re
from collections import deque
from typing import ClassVar

from rankwatch.records import Record, StepRecord

from ._bars import BarClock
from ._common import (
    TQDM_BAR,
    OverflowTracker,
    eval_record,
    step_record,
    strip_ansi,
    to_float,
    to_int,
)
from .base import LogLine
from .registry import register_parser

_KV = re.compile(r"'(?P<k>[A-Za-z_][^'\\\n]{0,100})'\s*:\s*(?P<v>[^,{}]{1,400})")
_SPACES = re.compile(r"\s{2,}|\r")
_SNIFF_LOSS = re.compile(r"'(?:loss|eval_loss|train_loss|train_runtime)'\s*:")
_SNIFF_MORE = re.compile(r"'(?:epoch|learning_rate|grad_norm|eval_runtime|train_samples_per_second)'\s*:")
_TOTAL = re.compile(r"Total optimization steps\s*=\s*([\d,]{1,24})")
_TRAIN_KEYS = ("loss", "grad_norm", "learning_rate")
# A logger's prefix before a dict ("[INFO|2024-12-08 01:09:59] llamafactory.train.callbacks:157 >> ").
_LOGGED = re.compile(r"\b(?:INFO|info)\b[^{]{0,160}(?:>>|\s-|:)\s*$")


def _dict_values(flat: str) -> dict[str, float]:
    vals: dict[str, float] = {}
    for m in _KV.finditer(flat):
        v = _value(m.group("v"))
        if v is not None:
            vals.setdefault(m.group("k"), v)
    return vals


def _same_dict(a: dict[str, float], b: dict[str, float]) -> bool:
    """Two prints of one dict: the same epoch, and every value both hold equal to the precision
    of the rounder one (a relative 1e-3, or 1e-4 absolute for a loss printed as 0.0000)."""
    shared = a.keys() & b.keys()
    if "epoch" not in shared or not shared & {"loss", "learning_rate"}:
        return False
    for k in shared:
        x, y = a[k], b[k]
        if x != x and y != y:
            continue
        if not abs(x - y) <= max(1e-3 * max(abs(x), abs(y)), 1e-4 if k == "loss" else 0.0):
            return False
    return True


_MAX_PENDING = 4096
_MAX_QUEUE = 64  # dicts (or redraws) one pipe may run ahead of the other before they are let go
_PENDING_LINES = 4
_MAX_BAR_ONLY = 1 << 16  # bar positions kept while no dict came
# A launcher's per-line header (torchrun's "[default0]:", "[trainer0|0]:") then a dict, right
# behind a bar on one line.
_HEADER_THEN_DICT = re.compile(r"\s{0,8}\[[A-Za-z_][\w.-]{0,63}?\d{1,7}(?:\|\d{1,7})?\]:\s{0,8}\{'")
_EPOCH_RAW = re.compile(r"'epoch'\s*:\s*(?P<q>'?)(?P<v>[-+0-9.eE]{1,40})")


def epoch_precision(quoted: bool, raw: str) -> float:
    """Half a unit of the last digit an epoch was printed with: Transformers 5 prints
    ``f"{v:.4g}"`` (quoted, 4 significant digits), older versions the float's repr or
    ``round(epoch, 2)``."""
    v = to_float(raw)
    if v is None or not math.isfinite(v):
        return 0.5  # no epoch to place: any step agrees with it
    if quoted:
        if v == 0:
            return 5e-5
        return 0.5 * 10.0 ** (math.floor(math.log10(abs(v))) - 3)
    mant, _, power = raw.lower().partition("e")
    decimals = len(mant.partition(".")[2])
    exp = int(power) if power.lstrip("+-").isdigit() else 0
    try:
        return 0.5 * 10.0 ** (exp - decimals)
    except OverflowError:  # "0e400": a zero printed with an absurd exponent
        return 0.5


def _value(raw: str) -> float | None:
    v = raw.strip()
    if "(" in v:  # np.float64(1.5), tensor(1.5
        v = v[v.index("(") + 1 :].rstrip(")")
    return to_float(v)


@register_parser
class HFParser:
    name: ClassVar[str] = "hf"
    hints: ClassVar[tuple[str, ...]] = ("{",)  # a line sniff() accepts holds one
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 90  # sniffed after smaller orders (registry.py)

    def __init__(self) -> None:
        self._overflow = OverflowTracker()
        # Undescribed "it" bars by total: the training bar and the evaluation bar differ
        # only in total; the first one drawn is normally the training bar.
        self._bars: dict[int, BarClock] = {}
        self._recent_total: int | None = None
        self._bar_total: int | None = None
        self._total_steps: int | None = None
        self._last_step: int | None = None
        self._pending: str | None = None
        self._pending_line: LogLine | None = None
        self._pending_age = 0
        self._pending_synced = False
        # The previous segment was tqdm clearing its bars before a write.
        self._after_clear = False
        self._bar_line = -1  # line number of the training bar's latest drawing
        # A dict printed by tqdm.write, waiting for the redraw that names its step.
        self._held: tuple[StepRecord, float, bool] | None = None  # (record, epoch precision, synced)
        self._echo: tuple[LogLine, int, dict[str, float]] | None = None  # a logged dict, its offset
        self._out: list[Record] = []
        self._bar_seen_n: int | None = None  # the training bar's n when the last dict came
        # Steps the bar gave: the last one, the interval between two, steps per epoch.
        self._exact_last: int | None = None
        self._interval: int | None = None
        self._spe_lo = 0.0
        self._spe_hi = math.inf
        self._train_dicts = 0
        self._trainer_seen = False  # a Trainer dict (summary, evaluation) was read
        self._bar_only: list[tuple[int, float | None, int]] = []  # (n, step time, line) before any dict
        # Two pipes (module docstring): the redraws that followed a clearing with no dict
        # between, and the dicts waiting for theirs (None: an evaluation's or the summary's).
        self._clear_seen = False  # the previous segment was tqdm's clearing (a run of spaces)
        self._split = False
        self._redraws: deque[int] = deque(maxlen=_MAX_QUEUE)
        self._queue: deque[tuple[StepRecord, float] | None] = deque()
        self._written = 0  # dicts printed before the pipes were seen apart: their redraws pass

    def pipes_apart(self) -> None:
        """The dicts and the bar are known to come through two pipes from the start (the live
        agent reads a worker's stdout and stderr files apart and relays the bar's segments):
        every dict waits for its redraw, none is placed by a bar read beside it."""
        if not self._split:
            self._split = True
            self._exact_last = self._interval = None

    def sniff(self, text: str) -> bool:
        if "{'" not in text:
            return False
        return _SNIFF_LOSS.search(text) is not None and _SNIFF_MORE.search(text) is not None

    def progress(self) -> tuple[int, int | None] | None:
        """The training bar's latest ``(step, total)``; None before a bar was seen."""
        n = self._bar_n
        if n is None:
            return None
        return n, self._bar_total

    @property
    def _train_bar(self) -> BarClock | None:
        return self._bars.get(self._bar_total) if self._bar_total is not None else None

    @property
    def _bar_n(self) -> int | None:
        bar = self._train_bar
        return bar.n if bar is not None else None

    @property
    def _bar_step_time(self) -> float | None:
        bar = self._train_bar
        return bar.step_time if bar is not None else None

    def finish(self) -> list[Record]:
        """End of stream: a dict still waiting for its cut-off end or its step is emitted,
        and, where the Trainer printed no loss dict at all, the steps its bar showed."""
        if self._echo is not None:
            self._settle_echo("")
        out = self._out + self._flush()
        self._out = []
        out.extend(self._release_held())
        out.extend(self._release_queue())
        if not self._train_dicts and self._trainer_seen and self._bar_only:
            total = self._bar_total
            out.extend(
                StepRecord(step=n, total_steps=total, step_time_s=st, line=ln)
                for n, st, ln in self._bar_only
                if total is None or n <= total
            )
        self._bar_only = []
        return out

    def release(self) -> list[Record]:
        """The stream went quiet: a dict waiting for the bar's redraw gets its best step."""
        if self._echo is not None:
            self._settle_echo("")
        out, self._out = self._out, []
        return out + self._release_held() + self._release_queue()

    def parse(self, line: LogLine) -> list[Record]:
        if self._echo is None and "{'" not in line.text:
            return self._parse(line)
        if self._echo is not None:
            self._settle_echo(line.text)
        if self._pending is None and "{'" in line.text and self._defer_echo(line, line.text):
            out, self._out = self._out, []
            return out
        out = self._parse(line)
        if self._out:
            out = self._out + out
            self._out = []
        return out

    def _parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if self._pending is None and "'" not in text and "|" not in text:
            if not text or text.isspace():
                self._after_clear = True
                if text:
                    self._clear_seen = True
                return []
            self._after_clear = False
            self._clear_seen = False
            if OverflowTracker.maybe(text):
                return list(self._overflow.feed(line, strip_ansi(text)) or ())
            if "optimization steps" in text:
                m = _TOTAL.search(text)
                if m is not None:
                    self._total_steps = to_int(m.group(1))
            return []
        out = self._parse_slow(line, strip_ansi(text))
        if self._out:
            out = self._out + out
            self._out = []
        return out

    # -- a dict told twice ---------------------------------------------------------------------
    # LLaMA-Factory's LogCallback logs each Trainer dict, rounded, through its logger
    # ("[INFO|...] llamafactory.train.callbacks:157 >> {'loss': 0.0000, 'learning_rate': 4.9985e-05,
    # 'epoch': 0.03}") just before the Trainer's ProgressCallback/PrinterCallback prints the dict
    # itself. A dict a logger wrote waits one line: when the next line is the same dict, only the
    # Trainer's (more precise, and with the grad norm) counts.

    def _defer_echo(self, line: LogLine, text: str) -> bool:
        i = text.find("{'")
        if text.find("{'", i + 1) >= 0 or text.find("}", i) < 0 or _LOGGED.search(text, 0, i) is None:
            return False
        vals = _dict_values(text[i:])
        if not any(k in vals for k in _TRAIN_KEYS) or any(k.startswith("eval_") for k in vals):
            return False
        self._echo = (line, i, vals)
        return True

    def _settle_echo(self, text: str) -> None:
        """The line after a logged dict decides whether it was an echo of the Trainer's."""
        echo, self._echo = self._echo, None
        assert echo is not None
        line, i, vals = echo
        j = text.find("{'")
        same = j >= 0 and text.find("}", j) >= 0 and _same_dict(vals, _dict_values(text[j:]))
        keep = LogLine(line.text[:i], line.lineno, line.rank, line.time) if same else line
        self._out.extend(self._parse_slow(keep, strip_ansi(keep.text)))

    def _parse_slow(self, line: LogLine, text: str) -> list[Record]:
        # tqdm.write's dict starts a segment after the clearing, on the line where the bar
        # was last drawn (the clearing itself is lost when it came before the format was known).
        synced = self._after_clear or line.lineno == self._bar_line
        self._after_clear = False
        if "%|" in text:
            text = self._cut_bars(text, line.lineno, self._clear_seen)
            synced = False  # glued to a bar in one segment: not written by tqdm.write
            if self._pending is None and "'" not in text:  # a bare bar redraw
                if OverflowTracker.maybe(text):
                    return list(self._overflow.feed(line, text) or ())
                return []
        out: list[Record] = []
        if self._pending is not None:
            text = self._continue_pending(line, text, out)
        rest: list[str] = []
        pos = 0
        while True:
            i = text.find("{'", pos)
            if i < 0:
                rest.append(text[pos:])
                break
            rest.append(text[pos:i])
            # Only a dict at the start of its segment can follow tqdm's clearing.
            first = synced and not text[:i].strip()
            j = text.find("}", i)
            if j < 0:
                self._pending = text[i : i + _MAX_PENDING]
                self._pending_line = line
                self._pending_age = 0
                self._pending_synced = first
                break
            out.extend(self._dict(line, text[i : j + 1], first))
            pos = j + 1
            synced = False
        leftover = "".join(rest)
        if OverflowTracker.maybe(leftover):
            out.extend(self._overflow.feed(line, leftover) or ())
        return out

    def _cut_bars(self, text: str, lineno: int, cleared: bool) -> str:
        self._clear_seen = False
        pieces: list[str] = []
        pos = 0
        for m in TQDM_BAR.finditer(text):
            # Only a bar that opens the segment right after the clearing is tqdm.write's redraw.
            redraw = cleared and pos == 0 and not text[: m.start()].strip()
            self._on_bar(text[pos : m.start()], m, lineno, redraw)
            pieces.append(text[pos : m.start()])
            pos = m.end()
        if not pieces:
            return text
        if _HEADER_THEN_DICT.match(text, pos):
            # torchrun's --tee tails a worker's stdout and stderr files each on its own and
            # writes a partial line as it is (torch/distributed/elastic/multiprocessing/
            # tail_log.py): a dict glued behind the bar under a header of its own came through
            # the other pipe, and the bar it follows is not its redraw (it lags by up to a
            # logging interval).
            self.pipes_apart()
        pieces.append(text[pos:])
        return "".join(pieces)

    def _on_bar(self, before: str, m: re.Match[str], lineno: int, redraw: bool = False) -> None:
        if before.rstrip().endswith(":"):
            return  # a described bar ("Map:", "Loading checkpoint shards:"), not training
        info = m.group("info")
        if "it/s" not in info and "s/it" not in info:
            return
        total = to_int(m.group("total")) if m.group("total") != "?" else None
        n = to_int(m.group("n"))
        if total is None or n is None:
            return
        bar = self._bars.get(total)
        if bar is not None and 0 < n < bar.n:
            return  # a stale redraw
        if bar is None:
            if len(self._bars) >= 8:
                oldest = next(t for t in self._bars if t != self._bar_total)
                del self._bars[oldest]
            bar = self._bars[total] = BarClock()
        if total != self._bar_total:
            self._pause_training()  # another bar (evaluation) runs: training waits
        bar.update(n, info)
        self._recent_total = total
        if self._bar_total is None:
            self._bar_total = total
        if total == self._bar_total:
            self._bar_line = lineno
            only = self._bar_only
            if (
                not self._train_dicts
                and n > 0
                and (not only or n > only[-1][0])
                and len(only) < _MAX_BAR_ONLY
            ):
                only.append((n, bar.step_time, lineno))
        held = self._held
        if held is not None and total == self._bar_total:
            self._held = None
            self._place(held[0], held[1], exact=n, learn_spe=held[2])
            self._out.append(held[0])
            if not held[2] and not redraw:
                self._written += 1  # an update, not this dict's redraw: that may come yet
        elif redraw and total == self._bar_total and n > 0:
            self._on_redraw(n)

    def _on_redraw(self, n: int) -> None:
        """A redraw right after a clearing, with no dict between: the dict went down the
        other pipe. The first such redraw shows the pipes apart; the dicts printed before it
        had their redraws already (or will: those pass unpaired)."""
        if not self._split:
            self._split = True
            self._exact_last = self._interval = None  # learnt from bars that were not theirs
        if self._written > 0:
            self._written -= 1
            return
        if self._queue:
            item = self._queue.popleft()
            if item is not None:
                self._place(item[0], item[1], exact=n, learn_spe=True)
                self._out.append(item[0])
            return
        self._redraws.append(n)

    def _wrote(self, synced: bool) -> None:
        """A dict that is no step (an evaluation's, the summary) was a write with a redraw too."""
        if self._split:
            self._out.extend(self._paired(None, math.inf))
        elif not synced:
            self._written += 1

    def _paired(self, rec: StepRecord | None, eps: float) -> list[Record]:
        """Two pipes: ``rec`` (None: a non-training dict) takes the first redraw not yet
        taken, or waits for it behind the dicts already waiting."""
        if not self._queue and self._redraws:
            n = self._redraws.popleft()
            if rec is None:
                return []
            self._place(rec, eps, exact=n, learn_spe=True)
            return [rec]
        self._queue.append(None if rec is None else (rec, eps))
        if len(self._queue) > _MAX_QUEUE:
            return self._release_queue(1)
        return []

    def _release_queue(self, count: int | None = None) -> list[Record]:
        """Waiting dicts placed without their redraw (the stream went quiet or ended, or one
        pipe ran far ahead): by the epoch or the interval, as a dict no bar names."""
        out: list[Record] = []
        while self._queue and (count is None or count > 0):
            item = self._queue.popleft()
            if count is not None:
                count -= 1
            if item is not None:
                self._place(item[0], item[1], exact=None)
                out.append(item[0])
        return out

    def _pause_training(self) -> None:
        train = self._train_bar
        if train is not None:
            train.pause()

    def _continue_pending(self, line: LogLine, text: str, out: list[Record]) -> str:
        pending = self._pending or ""
        open_i = text.find("{'")
        close_i = text.find("}")
        if close_i >= 0 and (open_i < 0 or close_i < open_i):
            start = self._pending_line or line
            self._pending = None
            out.extend(self._dict(start, pending + text[: close_i + 1], self._pending_synced))
            return text[close_i + 1 :]
        if open_i >= 0:
            out.extend(self._flush())
            return text
        if "'" in text and len(pending) + len(text) <= _MAX_PENDING:
            self._pending = pending + text
        self._pending_age += 1
        if self._pending_age > _PENDING_LINES:
            out.extend(self._flush())
        return ""

    def _flush(self) -> list[Record]:
        """Emit what a dict that never got its end still tells (a cut line beats no line)."""
        pending, start = self._pending, self._pending_line
        self._pending = None
        if pending is None or start is None:
            return []
        # The last value may be cut mid-number ("4e-05" -> "4"): keep only finished pairs.
        return self._dict(start, pending[: pending.rfind(",") + 1], False)

    def _release_held(self) -> list[Record]:
        held, self._held = self._held, None
        if held is None:
            return []
        if not held[2]:
            self._written += 1  # placed before any redraw named it: its redraw may come yet
        self._place(held[0], held[1], exact=None)
        return [held[0]]

    def _dict(self, line: LogLine, text: str, synced: bool) -> list[Record]:
        flat = _SPACES.sub("", text)
        vals = _dict_values(flat)
        if not vals or "train_runtime" in vals or "train_samples_per_second" in vals:
            self._trainer_seen = self._trainer_seen or bool(vals)
            if vals:
                self._wrote(synced)
            return self._release_held()  # the end-of-training summary is not a step
        if any(k.startswith("eval_") for k in vals):
            self._trainer_seen = True
            self._wrote(synced)
            out = self._release_held()
            self._pause_training()
            metrics = {k: v for k, v in vals.items() if k.startswith("eval_") and k != "eval_loss"}
            eps = self._epoch_eps(flat)
            step = self._eval_step(vals.get("epoch"), eps)
            out.append(eval_record(line, eval_loss=vals.get("eval_loss"), step=step, metrics=metrics))
            return out
        if not any(k in vals for k in _TRAIN_KEYS):
            return []
        self._train_dicts += 1
        self._bar_only = []
        out = self._release_held()
        recent = self._recent_total
        if recent is not None and (self._bar_total is None or recent > self._bar_total):
            # An evaluate() before train() drew the first bar; training has more steps
            # than evaluation has batches far more often than not.
            self._bar_total = recent
        rec = step_record(
            line,
            total_steps=self._bar_total or self._total_steps,
            loss=vals.get("loss"),
            grad_norm=vals.get("grad_norm"),
            learning_rate=vals.get("learning_rate"),
            epoch=vals.get("epoch"),
            step_time_s=self._bar_step_time,
        )
        eps = self._epoch_eps(flat)
        own = vals.get("global_step", vals.get("step"))
        if own is not None and own - own == 0 and own == int(own) and own >= 0:
            # A dict that carries its own step (PaddleNLP's Trainer logs 'global_step'): no
            # bar or epoch needs to tell it.
            rec.step, rec.step_inferred = int(own), False
            self._learn(int(own), rec.epoch, eps)
            self._last_step, self._bar_seen_n = int(own), self._bar_n
            out.append(rec)
            return out
        if self._split:
            out.extend(self._paired(rec, eps))
            return out
        if synced and self._bar_total is not None:
            self._held = (rec, eps, True)  # the redraw that follows names the step
            return out
        # No tqdm.write seen (a glued line, the line that revealed the format, a hand-made
        # log): the latest bar if it moved, else the next one.
        n = self._bar_n
        fresh = n if n is not None and n != self._bar_seen_n and self._fits(n) else None
        if fresh is None and self._bar_total is not None:
            self._held = (rec, eps, False)
            return out
        self._place(rec, eps, exact=fresh)
        out.append(rec)
        return out

    @staticmethod
    def _epoch_eps(flat: str) -> float:
        m = _EPOCH_RAW.search(flat)
        return epoch_precision(bool(m.group("q")), m.group("v")) if m is not None else math.inf

    def _from_epoch(self, epoch: float | None, eps: float) -> tuple[float, float] | None:
        """(step, uncertainty) from the epoch and the steps per epoch learnt so far."""
        lo, hi = self._spe_lo, self._spe_hi
        if epoch is None or epoch - epoch != 0 or epoch <= 0 or hi == math.inf or not math.isfinite(eps):
            return None
        spe = (lo + hi) / 2
        return epoch * spe, epoch * (hi - lo) / 2 + eps * hi

    def _learn(self, step: int, epoch: float | None, eps: float) -> None:
        if self._exact_last is not None and step > self._exact_last:
            self._interval = step - self._exact_last
        self._exact_last = step
        if epoch is None or epoch - epoch != 0 or not math.isfinite(eps) or epoch - eps <= 0:
            return
        lo, hi = step / (epoch + eps), step / (epoch - eps)
        if lo > self._spe_hi or hi < self._spe_lo:
            self._spe_lo, self._spe_hi = lo, hi  # another run in this stream
        else:
            self._spe_lo, self._spe_hi = max(lo, self._spe_lo), min(hi, self._spe_hi)

    def _fits(self, k: int) -> bool:
        last, total = self._last_step, self._bar_total
        return k > 0 and (last is None or k > last) and (total is None or k <= total)

    def _place(self, rec: StepRecord, eps: float, *, exact: int | None, learn_spe: bool = False) -> None:
        """Give ``rec`` its global step (or none), see the module docstring."""
        self._bar_seen_n = self._bar_n
        est = self._from_epoch(rec.epoch, eps)
        step: int | None = None
        inferred = True
        if exact is not None and self._fits(exact) and (est is None or abs(exact - est[0]) <= est[1] + 0.5):
            step, inferred = exact, False
            self._learn(exact, rec.epoch, eps if learn_spe else math.inf)
        elif est is not None and est[1] < 0.5 and self._fits(round(est[0])):
            step, inferred = round(est[0]), False
        else:
            last, every = self._last_step, self._interval
            if last is not None and every is not None and self._fits(last + every):
                guess = last + every
                if est is None or abs(guess - est[0]) <= est[1] + 0.5:
                    step = guess
        rec.step, rec.step_inferred = step, inferred
        if step is not None:
            self._last_step = step

    def _eval_step(self, epoch: float | None, eps: float) -> int | None:
        est = self._from_epoch(epoch, eps)
        if est is not None and est[1] < 0.5:
            return round(est[0])
        n = self._bar_n
        if n is not None and (self._last_step is None or n > self._last_step):
            return n
        return self._last_step
