"""Formats no framework owns: JSON lines, ``key=value`` / ``key: value`` text, and a
user-supplied regex with named groups.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import deque
from typing import Any, ClassVar

from rankwatch.records import Record, StepRecord

from ._common import (
    MetricBag,
    OverflowTracker,
    canonical,
    eval_record,
    step_record,
    strip_ansi,
    to_float,
    to_int,
)
from ._progress import bare_count, loss_columns, progress, table_header, table_row
from .base import FormatParser, LogLine
from .registry import load_all, register_parser


@functools.cache
def _specific_parsers() -> tuple[FormatParser, ...]:
    """Every registered specific format (a new file's included), built once."""
    return tuple(cls() for cls in load_all() if cls.hints and not cls.generic)


def _specific(text: str) -> bool:
    """Lines a framework parser claims must not be sniffed as a generic format."""
    return any(p.sniff(text) for p in _specific_parsers())


def _records(bag: MetricBag, line: LogLine, *, need_step: bool = True) -> list[Record]:
    out: list[Record] = []
    rec = bag.step_record(line, need_step=need_step)
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


# How many recent (step, fields) keys a JSON stream remembers to drop a record written twice
# (logs.json_repeat_window): two writers appending one log interleave their copies. The one real
# case (batch9 llamafactory_trainer_log_doubled_lines_healthy, 200 doubled records) has each copy
# at most 3 lines after the first; a resumed run re-tells old steps too, but only after the
# window has moved on, so a window this short never takes a restart for a copy.
JSON_REPEAT_WINDOW = 4


@register_parser
class JsonParser:
    name: ClassVar[str] = "json"
    hints: ClassVar[tuple[str, ...]] = ("{",)  # a line sniff() accepts holds one
    generic: ClassVar[bool] = True  # claims lines a specific format prints too: may be overtaken
    order: ClassVar[int] = 200  # sniffed after smaller orders (registry.py)

    def __init__(self, repeat_window: int = JSON_REPEAT_WINDOW) -> None:
        self._epoch_steps = True  # a whole epoch with no step key is the step
        self._last_epoch_step: float | None = None
        self._recent: deque[tuple[float, frozenset[str]]] = deque(maxlen=max(1, repeat_window))

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
        # mmcv's log.json tags each record with its phase ({"mode": "val", "iter": 12000,
        # "mIoU": ...}): a val record's numbers are evaluation results, not a training step.
        held_out = str(obj.get("mode", "")).lower() in _HELD_OUT_MODES
        for k, v in obj.items():
            if isinstance(k, str):
                key = _json_key(k)
                if held_out and canonical(key) in _TRAIN_FIELDS:
                    key = f"val_{key.rsplit('/', 1)[-1]}"
                unit = "%" if "%" in key else ""
                bag.put(key, _json_number(v), unit)
        f = bag.fields
        if held_out:
            f.pop("step_time_s", None)
            f.pop("learning_rate", None)
        elif "step" not in f and _whole(f.get("epoch")) and self._epoch_steps:
            # One record per epoch with no step key (MAE/DeiT/BEiT engines' log.txt: {"train_loss":
            # ..., "epoch": 147}): the epoch is the step, as the key=value reader takes it; an
            # epoch told twice in a row is no step counter (position numbers the records then).
            if f["epoch"] == self._last_epoch_step:
                self._epoch_steps = False
            else:
                f["step"] = self._last_epoch_step = f["epoch"]
        # A record with a loss and its LR or grad norm but no counter (fastText's progress JSON)
        # is a training step all the same, numbered by its position.
        stepless = "step" not in f and "loss" in f and bool({"learning_rate", "grad_norm"} & f.keys())
        if "step" in f:
            # A step told again with the same fields among the last ``repeat_window`` records
            # (LLaMA-Factory's trainer_log.jsonl when two processes append to it, their lines
            # interleaved) is one step, not two.
            told = (f["step"], frozenset(f))
            if told in self._recent:
                return []
            self._recent.append(told)
        return _records(bag, line, need_step=not stepless)


_HELD_OUT_MODES = frozenset({"val", "valid", "validation", "test", "eval"})
_TRAIN_FIELDS = frozenset({"loss", "grad_norm"})


def _whole(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v == int(v) and v >= 0


# ---------------------------------------------------------------- key=value text (the general reader)

# The last: PaddleOCR's ``{:x<6f}`` pads a non-finite value with x (``nanxxx``, ``-infxx``).
_NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?\.?(?:nan|inf(?:inity)?)(?:x{1,3})?\b"
_WORD = r"[^\W\d][\w./()%-]{0,40}"
# ``k: v``, ``k=v``, ``k v``, ``k : v``, ``k is v``, ``| k v |``, ``'k': 'v'``, ``k: [v]``, a unit
# after the number with or without a space (``iter time: 40.78 ms``), ``k: i/n``, ``k = nan(...)``,
# ``k [i/n]`` (3DETR's "Epoch [0/1080]; Iter [10/713880]; Loss 36.86").
_PAIR = re.compile(
    rf"(?<![\w./-])['\"]?(?P<k>{_WORD}(?: [^\W\d][\w]{{0,20}})?)['\"]?"
    rf"(?:\s{{0,4}}[:=]\s{{0,8}}[\['\"]?|\s+is\s+|\s{{1,8}}\[\s{{0,4}}(?=\d{{1,12}}\s{{0,4}}/\s{{0,4}}\d{{1,18}}\s{{0,4}}\])|\s{{1,8}})"
    rf"(?P<v>{_NUMBER})['\"]?(?: ?(?P<u>ms|s|%|GiB|GB|MiB|MB|it/s|s/it)(?![A-Za-z]))?"
    rf"(?:\s{{0,4}}/\s{{0,4}}(?P<tot>\d{{1,18}}))?(?=[\s,;:|)\]}}'\"(]|\.(?:\s|$)|$)",
    re.IGNORECASE,
)
# A word that names the step outright beats one that counts micro-batches (LitGPT prints
# "iter 62 step 62": iter counts batches, step counts optimizer steps).
_STEP_WORDS = frozenset(
    {"step", "steps", "global_step", "globalstep", "optimizer_step", "trainer/global_step", "acc_iter",
     "training_iteration"}
)  # fmt: skip
# Full-width punctuation (CJK logs: "训练次数：100, Loss：1.98") read as its ASCII twin.
_FULLWIDTH = str.maketrans({"：": ":", "，": ",", "（": "(", "）": ")", "｜": "|", "＝": "="})
# "333 154 Loss=nan Time=0.040": bare leading counters (epoch, iteration) before the first pair.
_LEADING = re.compile(r"^\s*(?:(?P<a>\d{1,9})\s+)?(?P<b>\d{1,12})\s+(?=[^\W\d][\w./-]*\s*[:=])")
# One key and its value filling a line: rows of a pretty-printed JSON object, a YAML dump, a
# stable-baselines table ("|    loss                 | 20.1        |").
_ROW = re.compile(
    rf"^\s*\|?\s*[\"']?(?P<k>[^\W\d][\w./-]{{0,60}}(?: [^\W\d][\w./-]{{0,30}}){{0,3}})[\"']?"
    rf"\s*(?:[:=|])\s*\[?(?P<v>{_NUMBER})\]?\s*[|,]?\s*$",
    re.IGNORECASE,
)
# "losses/q1_loss 65.3581 193000": a TensorBoard-style (tag, value, step) line (CleanRL prints).
_TRIPLE = re.compile(rf"^\s*(?P<k>[^\W\d][\w./-]{{0,80}})\s+\[?(?P<v>{_NUMBER})\]?\s+(?P<s>\d{{1,15}})\s*$")
# Words after a "Loss" heading that name whose loss a number is ("Loss ... train = nan | dev = nan").
_HEADED = {"train": "loss", "training": "loss", "dev": "eval_loss", "val": "eval_loss", "valid": "eval_loss"}
_HEADED["validation"] = _HEADED["eval"] = _HEADED["test"] = "eval_loss"
# Statistics of an update that are NaN only when the update is (an RL policy's KL, its entropy):
# a NaN there with no loss written is a NaN loss.
_UPDATE_STATS = frozenset({"kl", "approxkl", "approx_kl", "entropy", "policy_entropy"})
_CSV_WORD = re.compile(r"[^\W\d][\w/.:() -]{0,80}")
# The episode statistics RLlib's result of one training iteration holds (rllib/evaluation/
# metrics.py summarize_episodes: episode_reward_max/min/mean, episode_len_mean and
# episodes_this_iter, the first four float("nan") when no episode ended in the iteration), as
# pretty_print dumps them one per line. ``episodes_this_iter`` is written only in a result, never
# in a settings dump: a block naming it is one iteration's record, with no loss to judge.
_RL_EPISODE_STATS = frozenset(
    {"episodes_this_iter", "episode_reward_mean", "episode_reward_min", "episode_reward_max",
     "episode_len_mean"}
)  # fmt: skip
_RL_ITERATION = "episodes_this_iter"


_EVAL_WORD = re.compile(r"\b(?:valid(?:ation)?|val|eval(?:uation)?|test|dev)\b", re.IGNORECASE)


# A YOLOv5/YOLOv7 results.txt row, written with no header (yolov7 train.py: "%g/%g" epoch, gpu
# memory, box obj cls total losses, labels, img_size, then 7 results: 15 cells).
_YOLO_RESULTS = re.compile(r"\s*\d{1,6}/\d{1,6}\s+\d{1,5}(?:\.\d{1,4})?G(?:\s+\S+){13}\s*$")
_YOLO_RESULTS_COLS = ["epoch", "gpu_mem", "box_loss", "obj_loss", "cls_loss", "loss", "labels", "img_size"]
# clu metric_writers.LoggingWriter.write_scalars logs "[step] k=v, k=v" (behind absl/glog's prefix).
_CLU_STEP = re.compile(r"\] \[(\d{1,12})\] (?=[^\W\d][\w./-]{0,60}=)")
# A key written as a tag before its number ("[Loss] nan", "[step]   104").
_TAG_KEY = re.compile(r"\[([^\W\d]\w{0,30})\](?=\s{1,8}[-+]?(?:\d|nan\b|inf\b))", re.IGNORECASE)
# A batch counter standing as a field of its own ("| 1/3 |", "[ 500/2931]"), not an epoch's.
_MID_PASS = re.compile(r"(?:^|[|\[(,])\s*(?P<i>\d{1,9})\s*/\s*(?P<n>\d{1,9})\s*(?=[|\]),]|$)")
# A line made only of words joined to their numbers by "_" (WaveGlow's train.py prints
# "step_78620:\tloss_4191.683593750"): the "_" is the separator, read as ": ".
_JOINED_LINE = re.compile(
    r"^\s*(?:[^\W\d_][^\W\d]{0,30}_[-+]?(?:\d[\d.]*(?:[eE][-+]?\d+)?|nan|inf)[:,;|]?\s*){2,8}$"
)
_JOINED_KEY = re.compile(r"(?<![\w.])([^\W\d_][^\W\d]{0,30})_(?=[-+]?(?:\d|nan|inf))")
# A bare row of a counter and numbers with no header: "76980 nan" (YANMTT's print(ctr, loss)),
# "209,nan,4.16,7.72,24.02" (timm's summary.csv, utils/summary.py update_summary: epoch, then
# train_* and eval_* metrics and lr; the header is written once, so a pasted excerpt or an
# appended resume has none). Alone it could be any numbers, so a stream is read as such rows
# only while its first column keeps rising, from ``_BARE_CONFIRM`` rows of one width on, and
# never once a named metric has been read from it.
_BARE_CONFIRM = 3
_BARE_MAX_CELLS = 32  # a bound on the cells a row may have, as a tab-separated header's
_BESIDE_LOSS = frozenset({"learning_rate", "grad_norm"})
_LOSS_WORD = re.compile(r"\bloss\b", re.IGNORECASE)


def _bare_cells(text: str) -> tuple[float, list[float]] | None:
    """(counter, the numbers after it) of a bare row, cells split by commas or by blanks."""
    s = text.strip()
    if not s[:1].isdigit():
        return None
    cells = s.split(",") if "," in s else s.split()
    if not 2 <= len(cells) <= _BARE_MAX_CELLS:
        return None
    first = cells[0].strip()
    if not first.isdigit() or len(first) > 12:
        return None
    vals: list[float] = []
    for c in cells[1:]:
        v = to_float(c)
        if v is None:
            return None
        vals.append(v)
    return float(first), vals


def _count(v: float) -> bool:
    return math.isfinite(v) and v >= 0 and v == int(v)


def _told(text: str, m: re.Match[str]) -> bool:
    """The pair joins a word to its value with ``:`` or ``=``: a glog prefix's "E0606 09:34" and
    its source line "basic_session_run_hooks.py:760" are no counter."""
    sep = text[m.end("k") : m.start("v")]
    return (":" in sep or "=" in sep) and "." not in m["k"]


def _kv_gate(text: str) -> bool:
    # "xent": OpenNMT-py's cross-entropy ("Step 5350/50000; acc: 51.25; ppl: 8.43; xent: 2.13");
    # " l_": BasicSR's loss prefix ("l_g_pix: 1.48e-03 l_d_real: 1.43e-05").
    return "oss" in text or "OSS" in text or "xent" in text or " l_" in text


def _step_gate(text: str) -> bool:
    """A line that may carry a step alone ("Epoch 0/100, Batch 17/29316", "Iteration 3025")."""
    return ("ter" in text or "tep" in text or "atch" in text or "poch" in text) and any(
        c.isdigit() for c in text
    )


_FIRST_WORD = re.compile(r"[_/ .:-]")
_EVAL_SPLITS = frozenset({"val", "eval", "test", "valid", "dev", "validation", "evaluation"})


# Rates written as "<what>/<step word>" (fairseq's "words/batch 906", "s/checkpoint"): per step,
# not a step.
_PER_WHAT = frozenset(
    {"words", "tokens", "samples", "sentences", "examples", "images", "seqs", "s", "ms", "sec"}
)


def _per_unit(key: str) -> bool:
    head, _, tail = key.strip().lower().rpartition("/")
    return bool(head) and head.rsplit(None, 1)[-1] in _PER_WHAT and bool(tail)


def _is_part(key: str) -> bool:
    """A named part of the training loss (``loss_cls``, ``box_loss``, ``s0.loss_bbox``, BasicSR's
    and MMEditing's ``l_pix``, ``l_g_gan``)."""
    k = key.lower()
    return (
        ("loss" in k or (k.startswith("l_") and len(k) > 2))
        # an eval split's loss ("val_loss", "eval/loss", "validation loss"), by its first word:
        # "value function loss" (RSL-RL) is a training loss
        and _FIRST_WORD.split(k, 1)[0] not in _EVAL_SPLITS
        # settings printed beside the metrics (a config dump): loss_weight, loss_type, loss_scale,
        # OLMo's auxiliary_loss_multiplier
        and not k.endswith(("weight", "weights", "coef", "coeff", "type", "fn", "_w", "multiplier"))
        and "scale" not in k
    )


# A GAN's discriminator loss, by name: BasicSR/MMEditing "l_d_real", mmagic "loss_d_fake",
# DCGAN/WGAN "Loss_D", "d_loss", "lossD". It swings by orders of magnitude on a healthy run (1e-8
# to 1e-2 within 400 iterations in BasicSR#204) and is no part of what the generator minimises.
_DISCRIMINATOR = re.compile(
    r"(?:^|[_/. -])(?:d|disc|dis|discriminator|critic)(?:$|[_/. -])|lossD$", re.IGNORECASE
)


def _flat_key(key: str) -> str:
    """``main/loss`` -> ``loss``, ``train/box_loss`` -> ``box_loss``; eval prefixes kept."""
    return _json_key(key.strip()) if "/" in key else key.strip()


# Words that name a reinforcement-learning objective among a loss's parts: an actor's or policy's
# surrogate (PPO's clipped objective, its sign and size set by the batch's advantages) and a
# critic's or value function's regression onto returns that move as the policy improves. Neither
# is expected to fall, so their sum is judged only for NaN/inf, never for a rise. By the trainers'
# own prints: DeepSpeed-Chat step3 "act_loss", "cri_loss"; RSL-RL "Value function loss",
# "Surrogate loss"; SB3 "policy_gradient_loss", "value_loss"; CleanRL "losses/policy_loss",
# "losses/qf1_loss", "losses/actor_loss"; OpenAI baselines "loss_pol_surr", "loss_vf_loss";
# OpenRLHF "policy_loss", "critic_loss". The healthy DeepSpeed-Chat PPO log (batch3
# dschat_step3_ppo_opt13b) swings act_loss + cri_loss from -1.4 to 3.6 and back.
_RL_WORDS = frozenset(
    {"act", "actor", "cri", "critic", "policy", "pg", "pol", "surr", "surrogate", "value", "vf", "qf", "qf1",
     "qf2", "q1", "q2"}
)  # fmt: skip
_RL_SPLIT = re.compile(r"[_/ .:-]+")


def _rl_objective(key: str) -> bool:
    """A loss part named as an RL actor, critic, policy or value objective."""
    return any(w in _RL_WORDS for w in _RL_SPLIT.split(key.lower()))


def _finish_bag(
    bag: MetricBag,
    parts: list[float],
    stats_nan: bool,
    d_parts: list[float] | None = None,
    rl_parts: list[float] | None = None,
) -> None:
    f = bag.fields
    if "loss" not in f and rl_parts:
        # An RL update's loss: its value is no progress measure, a non-finite one is a NaN loss.
        if all(map(math.isfinite, rl_parts + parts + (d_parts or []))) and not stats_nan:
            bag.objective = True
        else:
            f["loss"] = math.nan
        return
    if "loss" not in f:
        if d_parts and not parts:
            parts = d_parts  # the only losses the line has
        elif d_parts and not all(map(math.isfinite, d_parts)):
            parts = parts + d_parts  # a NaN in the discriminator is the run's NaN too
        if parts:
            f["loss"] = math.fsum(parts) if all(map(math.isfinite, parts)) else math.nan
        elif stats_nan:
            f["loss"] = math.nan


@register_parser
class KvParser:
    """The general reader: any line that pairs a step (or an epoch and an iteration) with named
    numbers, whatever its punctuation. ``step=10 loss=2.45 lr=6.67e-05``, ``Step 10: loss=2.45``,
    ``Epoch 1 Step 10 | loss: 2.45 | lr: 1e-4``, ``iter: 19  total_loss: 1.36``,
    ``Epoch(train)  [1][ 500/2931]  loss: nan``, ``Train: 0 [1550/2502 (62%)]  Loss: 6.9``,
    ``1|25|Loss: 1.26``, ``Total loss is 29.8``, and what spreads a record over lines: column
    tables under a header (ultralytics, results.csv), one key per line (pretty JSON, YAML,
    stable-baselines tables), a step on the line before its metrics, (tag, value, step) lines.

    Metric names are matched by meaning (``_common.ALIASES``): a total loss is preferred over
    its parts, and when only parts are written (YOLO's box/cls/dfl) their sum is the loss.
    """

    name: ClassVar[str] = "kv"
    # A line sniff() accepts holds one of these (an update statistic's row: "| KL | nan |";
    # "G " the GPU memory cell of a headerless YOLO results.txt row; Ray Tune's result counter).
    hints: ClassVar[tuple[str, ...]] = (
        "oss", "OSS", "xent", "Epoch", "epoch", "KL", "kl", "entropy", "G ", "training_iteration", "INFO [",
        "s/it]", "it/s]", "----", "episode", "0 ", "1 ", "2 ", "3 ", "4 ", "5 ", "6 ", "7 ", "8 ", "9 ",
        "0,", "1,", "2,", "3,", "4,", "5,", "6,", "7,", "8,", "9,",
    )  # fmt: skip
    generic: ClassVar[bool] = True  # claims lines a specific format prints too: may be overtaken
    order: ClassVar[int] = 210  # sniffed after smaller orders (registry.py)

    def __init__(self) -> None:
        self._cols: list[str] | None = None
        self._loss_cols: list[int] = []
        self._csv: list[str] | None = None
        self._last: tuple[int | None, float | None] | None = None
        self._overflow = OverflowTracker()
        self._zero_epoch = False
        self._carry: tuple[float, float | None] | None = None  # a step told on a line of its own
        self._block: list[tuple[str, str]] = []  # one-key rows waiting for their block to end
        self._block_line: LogLine | None = None
        self._triple: tuple[int, list[float], list[float], LogLine] | None = None
        self._block_steps = False  # a block of this stream named its step
        self._tsv: list[str] | None = None  # columns of a tab-separated table (after its step column)
        self._epoch_steps = True  # a whole epoch with nothing else counting is the step
        self._last_epoch_step: float | None = None
        self._epoch: float | None = None  # an epoch told on a line of its own ("Epoch 3/15")
        self._epoch_before: float | None = None  # ... on the line before this one
        # Bare "step value" rows not yet confirmed by a rising first column; None once this
        # stream is no log of such rows.
        self._bare: list[tuple[float, list[float], LogLine]] | None = []
        self._bare_step = -1.0  # the last bare row's step once confirmed
        self._bare_width = 0  # numbers after the counter in this stream's bare rows
        self._counted: tuple[float, float] | None = None  # the last (epoch, iteration) pair told
        self._run_wide = False  # that iteration counts the run, not the epoch
        self._bar: StepRecord | None = None  # a tqdm bar's count, until its last drawing is known

    # -- sniffing (stateless) --------------------------------------------------------------------

    def sniff(self, text: str) -> bool:
        if not text.isascii():
            text = text.translate(_FULLWIDTH)
        if text[:1].isdigit() and _bare_cells(text) is not None:
            return True
        if "_" in text and _JOINED_LINE.match(text) is not None:
            text = _JOINED_KEY.sub(r"\1: ", text)
        if "poch" in text and (table_header(strip_ansi(text)) is not None or _csv_header(text) is not None):
            return not _specific(text)
        if _csv_gate(text) and _csv_header(text) is not None:
            return not _specific(text)  # an RL logger's progress.csv (OpenAI baselines, SB3)
        if "G " in text and _YOLO_RESULTS.match(text) is not None:
            return not _specific(text)
        if "INFO [" in text and _vits_list(text) is not None:
            return not _specific(text)
        if "\t" in text and _tsv_header(text) is not None:
            return not _specific(text)
        if "----" in text and _placeholder_row(text) is not None:
            return not _specific(text)
        if "]" in text and _bar_pair(text) is not None:
            return not _specific(text)
        if "training_iteration" in text and text.lstrip().startswith("training_iteration:"):
            return True  # Ray Tune's pretty-printed result names its iteration on a row of its own
        if not _kv_gate(text):
            # A block row naming an update statistic ("| KL        | nan      |", OpenAI baselines).
            row = _ROW.match(text) if "|" in text or ":" in text else None
            if row is None:
                return False
            key = row["k"].strip()
            if _framed(text) and canonical(_flat_key(key)) == "epoch":
                return not _specific(text)  # a logger table's epoch row ("| epoch | 3 |")
            low = key.lower()
            return (low in _UPDATE_STATS or low in _RL_EPISODE_STATS or _is_part(key)) and not _specific(text)
        if JsonParser._load(text) is not None:
            return False  # a JSON object is the JSON reader's
        text = strip_ansi(text)
        if ("overflow detected" in text or "Gradient overflow." in text) and OverflowTracker.maybe(text):
            return not _specific(text)  # fairseq's and apex amp's loss scaler
        trip = _TRIPLE.match(text)
        if trip is not None:
            return _is_part(trip["k"])
        row = _ROW.match(text)
        if row is not None and _is_part(row["k"]):
            # A row of a one-key-per-line block: pretty JSON, a stable-baselines table, RSL-RL's
            # iteration block ("               Value function loss: inf").
            return not _specific(text)
        bag = self._bag(text, bare=True)
        f = bag.fields
        if not ({"loss", "eval_loss"} & f.keys()) and not bag.objective:
            return False
        # A counter named "epoch" is a step counter when it is a whole number ("epoch: 3442
        # loss: 0.21"); a fraction (HF's 'epoch': 0.53) is not.
        epoch = f.get("epoch")
        whole = epoch is not None and math.isfinite(epoch) and epoch == int(epoch)
        if "step" not in f and not whole and not (_BESIDE_LOSS & f.keys() and ("loss" in f or bag.objective)):
            return False
        return not _specific(text)

    # -- one line's pairs ------------------------------------------------------------------------

    @staticmethod
    def _bag(text: str, *, bare: bool = False, zero_epoch: bool = False) -> MetricBag:
        if "]" in text:
            # "[Loss] nan | ... | [step]   104" (loguru-style tags): the tag is the key.
            text = _TAG_KEY.sub(r"\1:", text)
        bag = MetricBag()
        f = bag.fields
        step_word = False
        step_tot: float | None = None
        parts: list[float] = []
        d_parts: list[float] = []  # a GAN discriminator's: not summed into the generator's loss
        rl_parts: list[float] = []  # an RL actor's, critic's, policy's or value function's
        stats_nan = False
        unnamed: float | None = None
        heading = _LOSS_WORD.search(text) if "oss" in text else None
        headed_at = heading.end() if heading is not None else len(text)
        plain_loss_at = -1
        step_unnamed = False
        for m in _PAIR.finditer(text):
            key = whole = m.group("k")
            field = canonical(key)
            if field == "loss" and plain_loss_at < 0 and key.lower() == "loss":
                plain_loss_at = m.start()
            if field is None and " " in key:
                key = key.rsplit(" ", 1)[1]
                field = canonical(key)
            if field is None and "/" in key:
                key = _flat_key(key)
                field = canonical(key)
            low = key.lower()
            if field is None and m.start() >= headed_at and low in _HEADED:
                field = _HEADED[low]
                key = field
            if field is None:
                v = to_float(m.group("v"))
                if v is None:
                    continue
                if _is_part(key) or (whole is not key and _is_part(whole)):
                    # "Train Loss mse: 0.0097, Train Loss ce: 0.0194" (BAGEL)
                    if _DISCRIMINATOR.search(whole):
                        d_parts.append(v)
                    else:
                        (rl_parts if _rl_objective(whole) else parts).append(v)
                elif low in _UPDATE_STATS and not math.isfinite(v):
                    stats_nan = True
                elif (
                    unnamed is None
                    and not parts
                    and "loss" not in f
                    and not m.group("u")
                    and _count(v)
                    and _told(text, m)
                ):
                    unnamed = v  # "训练次数：100, Loss：1.98": an unnamed counter before the loss
                continue
            unit = m.group("u") or ""
            if field == "step":
                if unit or _per_unit(whole):
                    continue
                v = to_float(m.group("v"))
                if v is None:
                    continue
                # "Step [100/600]" beside an epoch counts that epoch's batches, named or not.
                bracketed = "[" in text[m.end("k") : m.start("v")]
                named = key.strip().lower() in _STEP_WORDS and not bracketed
                if "step" not in f or (named and not step_word):
                    f["step"] = v
                    step_word = step_word or named
                    step_tot = float(m.group("tot")) if m.group("tot") else None
                    if m.group("tot") and named:
                        f["total_steps"] = float(m.group("tot"))
                continue
            bag.put(key, to_float(m.group("v")), unit)
        if "step" in f and not step_word and step_tot and "epoch" in f and math.isfinite(f["epoch"]):
            # "epoch: 2/300, iter: 10/47": the iteration counts within the epoch (the stream may
            # learn otherwise at the next epoch: ``KvParser._counter``).
            ep = f["epoch"]
            bag.counted = (ep, f["step"], step_tot)
            f["step"] = (ep if zero_epoch else max(ep - 1, 0)) * step_tot + f["step"]
        clu = _CLU_STEP.search(text) if "step" not in f and "] [" in text else None
        if clu is not None:
            f["step"] = float(clu[1])  # clu's LoggingWriter: "[%d] k=v, k=v" after glog's prefix
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
                lead = _LEADING.match(text) if count is None else None
                if count is not None:
                    f["step"], f["total_steps"] = count
                elif lead is not None:
                    f["step"] = float(lead["b"])
                elif unnamed is not None:
                    f["step"] = unnamed
                    step_unnamed = True
        _finish_bag(bag, parts, stats_nan, d_parts, rl_parts)
        if plain_loss_at > 0 and "eval_loss" not in f and "loss" in f:
            # "VALID SET 0 LOSS:0.178", "| valid on 'valid' subset | loss 9.329": a plain "loss"
            # after a word naming the eval split, on a line that names no training, is the eval loss.
            head = text[:plain_loss_at]
            if _EVAL_WORD.search(head) is not None and "train" not in text.lower():
                f["eval_loss"] = f.pop("loss")
                if step_unnamed:
                    del f["step"]  # "SET 0" counts sets, not steps
                mid = _MID_PASS.search(text)
                if mid is not None and int(mid["i"]) < int(mid["n"]) and math.isfinite(f["eval_loss"]):
                    # "Valid | Epoch 9 | 1/3 | ... | Loss 0.1327": a running loss part-way through
                    # the validation pass, not its result (a NaN there is still told).
                    del f["eval_loss"]
        return bag

    # -- parsing (per stream and rank) -----------------------------------------------------------

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if not text.isascii():
            text = text.translate(_FULLWIDTH)
        if "_" in text and _JOINED_LINE.match(text) is not None:
            text = _JOINED_KEY.sub(r"\1: ", text)
        out: list[Record] = []
        if self._block or self._triple is not None:
            row = _ROW.match(text) if self._block else None
            if row is not None or (self._block and _block_filler(text)):
                if row is not None:
                    self._block.append((row["k"], row["v"]))
                return []
            trip = _TRIPLE.match(text) if self._triple is not None else None
            if trip is not None and int(trip["s"]) == self._triple[0]:  # type: ignore[index]
                self._triple_add(trip, line)
                return []
            out = self._flush_blocks()
        # An epoch told on a line of its own holds for the next line only.
        self._epoch_before, self._epoch = self._epoch, None
        if self._bare is not None and self._csv is None and self._cols is None and self._tsv is None:
            bare = _bare_cells(text) if text[:1].isdigit() or text[:1] == " " else None
            if bare is not None:
                return out + self._bare_row(line, *bare)
        recs = self._line(line, text)
        if self._bare is not None and any(isinstance(r, StepRecord) for r in (*out, *recs)):
            self._bare = None  # a log of named metrics: a bare pair of numbers in it is no record
        return out + recs

    def _bare_row(self, line: LogLine, step: float, values: list[float]) -> list[Record]:
        held = self._bare
        if held is None:
            return []
        confirmed = self._bare_step >= 0
        if len(values) != self._bare_width:
            if self._bare_width and not confirmed:
                self._bare = None  # rows of changing width: no table of bare rows
                return []
            if self._bare_width:
                return []
            self._bare_width = len(values)
        if step <= (self._bare_step if confirmed else held[-1][0] if held else -1.0):
            if not confirmed:
                self._bare = None  # the first column does not count: no log of bare rows
            return []
        held.append((step, values, line))
        if not confirmed and len(held) < _BARE_CONFIRM:
            return []
        out: list[Record] = []
        for st, vals, ln in held:
            if len(vals) == 1:
                bag = MetricBag()
                bag.fields["step"], bag.fields["loss"] = st, vals[0]
                out.extend(_records(bag, ln))
            else:
                # Unnamed cells (timm's losses, accuracies, LR): which is the loss is not told, so
                # only a non-finite one says anything, as in a row with "----" placeholders. The
                # row is still a record at its counter: the run is read.
                nan = not all(map(math.isfinite, vals))
                out.append(step_record(ln, step=int(st), loss=math.nan if nan else None))
        self._bare_step = step
        held.clear()
        return out

    def _line(self, line: LogLine, text: str) -> list[Record]:
        if "\t" in text:
            recs = self._tsv_line(line, text)
            if recs is not None:
                return recs
        if "]" in text and "|" in text:
            pair = _bar_pair(text)
            if pair is not None:
                bag = MetricBag()
                bag.fields["step"], bag.fields["loss"], bag.fields["total_steps"] = pair
                return _records(bag, line)
        if "INFO [" in text:
            vits = _vits_list(text)
            if vits is not None:
                bag = MetricBag()
                bag.fields["step"], bag.fields["learning_rate"] = vits[1], vits[2]
                _finish_bag(bag, vits[0], False)
                return _records(bag, line)
        if "----" in text:
            cells = _placeholder_row(text)
            if cells is not None:
                bag = MetricBag()
                bag.fields["step"] = cells[0]
                if not all(map(math.isfinite, cells[1])):
                    bag.fields["loss"] = math.nan
                return _records(bag, line)
        if not _kv_gate(text):
            if self._cols is None and "G " in text and _YOLO_RESULTS.match(text) is not None:
                self._cols = _YOLO_RESULTS_COLS
                self._loss_cols = loss_columns(_YOLO_RESULTS_COLS)
            if self._cols is not None or self._csv is not None or "poch" in text or _csv_gate(text):
                recs = self._table(line, strip_ansi(text))
                if recs is not None:
                    return recs
            if _step_gate(text):
                self._carry_step(strip_ansi(text))
            row = _ROW.match(text) if ":" in text or "|" in text or "=" in text else None
            if row is not None:
                self._block = [(row["k"], row["v"])]
                self._block_line = line
            return []
        text = strip_ansi(text)
        if "poch" in text or _csv_gate(text):
            recs = self._table(line, text)
            if recs is not None:
                return recs
        if OverflowTracker.maybe(text):
            ovf = self._overflow.feed(line, text)
            if ovf is not None:
                return list(ovf)
        trip = _TRIPLE.match(text)
        if trip is not None:
            self._triple = (int(trip["s"]), [], [], line)
            self._triple_add(trip, line)
            return []
        row = _ROW.match(text)
        if row is not None:
            self._block = [(row["k"], row["v"])]
            self._block_line = line
            return []
        bag = self._bag(text, bare=True, zero_epoch=self._zero_epoch)
        f = bag.fields
        if bag.counted is not None:
            self._counter(f, bag.counted)
        if f.get("epoch") == 0:
            self._zero_epoch = True
        if not ({"loss", "eval_loss", "grad_norm"} & f.keys()) and not bag.objective:
            if "step" in f:
                self._carry = (f["step"], f.get("total_steps"))
            return []
        if "step" not in f and self._carry is not None:
            f["step"] = self._carry[0]
            if self._carry[1] is not None:
                f.setdefault("total_steps", self._carry[1])
        elif self._epoch_before is not None and "epoch" not in f:
            self._in_epoch(f, text, self._epoch_before)
        stepless = (
            "step" not in f
            and "epoch" not in f
            and "loss" in f
            and bool({"learning_rate", "grad_norm"} & f.keys())
        )
        if "step" not in f and _whole(f.get("epoch")) and f.get("total_steps") is None and self._epoch_steps:
            # One record per epoch with nothing else counting ("Epoch 2/100 | Train Loss: 2.75 |
            # Val Loss: 1.14"): the epoch is the step, so a run that starts again at epoch 1 is
            # seen to restart rather than read as one sequence. An epoch told twice in a row
            # ("Epoch 1 complete [10%] Loss: ..." several times per epoch) is no step counter:
            # from then on the records are numbered by position.
            if f["epoch"] == self._last_epoch_step:
                self._epoch_steps = False
            else:
                f["step"] = self._last_epoch_step = f["epoch"]
        out = _records(bag, line, need_step=not stepless)
        if len(out) == 1 and isinstance(out[0], StepRecord) and out[0].step is not None and "%|" in text:
            # A tqdm bar draws each count more than once: ``update(1)`` draws it with the last
            # postfix (the step before's loss), ``set_postfix(loss=...)`` again with its own
            # (the s40 tester's l49: "2/30 ... loss=4.4745" then "2/30 ... loss=14.5567"). One
            # record per count, its last drawing's values, told when the count moves on.
            held, rec = self._bar, out[0]
            self._bar = rec
            if held is None or held.step == rec.step:
                return []
            self._last = (held.step, held.loss)
            return [held]
        if out and isinstance(out[0], StepRecord):
            # A progress bar redrawn with the same step and values (torchtune's tqdm) is one record.
            key = (out[0].step, out[0].loss)
            if key == self._last and key[0] is not None:
                out.pop(0)
            else:
                self._last = key
        return out

    def _carry_step(self, text: str) -> None:
        """A line that tells only the step ("Iteration 3025", "Epoch 0/100, Batch 17/29316"):
        the metrics that follow on their own line belong to it."""
        bag = self._bag(text, zero_epoch=self._zero_epoch)
        f = bag.fields
        if bag.counted is not None:
            self._counter(f, bag.counted)
        if f.get("epoch") == 0:
            self._zero_epoch = True
        if "step" in f:
            self._carry = (f["step"], f.get("total_steps"))
        elif _whole(f.get("epoch")):
            self._epoch = f["epoch"]

    def _counter(self, f: dict[str, float], counted: tuple[float, float, float]) -> None:
        """An "Epoch [e/E] ... Iter [i/N]" pair: the iteration counts within the epoch (the
        PyTorch tutorial's "Epoch [2/10], Step [100/600]" starts again at each epoch) or the whole
        run (3DETR's engine.py prints curr_iter = curr_epoch * len(loader) + batch against
        max_iters = max_epoch * len(loader)). One line cannot tell them apart, and over the first
        epoch both read the same step; an iteration still rising when the epoch moves on counts
        the run, and from then on it is the step."""
        ep, it, tot = counted
        last, self._counted = self._counted, (ep, it)
        if not self._run_wide and last is not None and ep > last[0] and it > last[1]:
            self._run_wide = True
        if self._run_wide:
            f["step"] = it
            f.setdefault("total_steps", tot)

    def _in_epoch(self, f: dict[str, float], text: str, epoch: float) -> None:
        """Metrics on the line right after "Epoch 3/15" (Keras fit): one record of that epoch. A
        finished bar's "423/423" on it counts batches (or samples) within the epoch: the step is
        the count so far over the run, so every epoch's record has a step of its own."""
        f["epoch"] = epoch
        if "step" not in f:
            return
        count = bare_count(text)
        if count is None or (f["step"], f.get("total_steps")) != count:
            return
        done = epoch if self._zero_epoch else epoch - 1
        f["step"] = done * count[1] + count[0]
        f.pop("total_steps", None)

    def _triple_add(self, m: re.Match[str], line: LogLine) -> None:
        assert self._triple is not None
        v = to_float(m["v"])
        if v is not None and _is_part(m["k"]):
            (self._triple[2] if _rl_objective(m["k"]) else self._triple[1]).append(v)

    def _flush_blocks(self) -> list[Record]:
        out: list[Record] = []
        if self._triple is not None:
            step, parts, rl_parts, line = self._triple
            self._triple = None
            if parts or rl_parts:
                bag = MetricBag()
                bag.fields["step"] = float(step)
                _finish_bag(bag, parts, False, None, rl_parts)
                out.extend(_records(bag, line))
        if self._block:
            rows, self._block = self._block, []
            first = self._block_line
            if first is not None and len(rows) >= 2:
                out.extend(self._rows(rows, first))
        return out

    def _rows(self, rows: list[tuple[str, str]], line: LogLine) -> list[Record]:
        bag = MetricBag()
        f = bag.fields
        parts: list[float] = []
        rl_parts: list[float] = []
        stats_nan = told_epoch = rl_result = False
        for raw_key, raw in rows:
            key = _flat_key(raw_key.strip().strip("\"'"))
            v = to_float(raw[1:] if raw[:1] == "." and raw[1:2].isalpha() else raw)  # YAML's .nan
            if v is None:
                continue
            field = canonical(key)
            low = key.lower()
            if field is None:
                if _is_part(key):
                    (rl_parts if _rl_objective(key) else parts).append(v)
                elif low in _UPDATE_STATS and not math.isfinite(v):
                    stats_nan = True
                rl_result = rl_result or low == _RL_ITERATION
                continue
            if field == "step":
                if "step" not in f or low in _STEP_WORDS:
                    f["step"] = v
                continue
            told_epoch = told_epoch or low == "epoch"
            bag.put(key, v)
        _finish_bag(bag, parts, stats_nan, None, rl_parts)
        if "step" not in f and self._carry is not None:
            f["step"] = self._carry[0]
        if not ({"loss", "eval_loss", "grad_norm"} & f.keys()) and not bag.objective:
            if rl_result and not _framed(line.text):
                # RLlib's iteration result cut before (or printed without) its counter: one
                # record, numbered by position when no step was told.
                return [step_record(line, step=to_int(f.get("step")), epoch=f.get("epoch"))]
            return self._counted_table(f, line)
        if "step" not in f and told_epoch and _whole(f.get("epoch")):
            # A block that counts epochs on a row of its own ("Epoch    :  5" over "LOSS     :
            # 24.569025", a Keras callback's prints): the epoch is the step. A settings dump
            # says "epochs: 100", which is no counter.
            f["step"] = f["epoch"]
        if "step" not in f and not self._block_steps:
            return []  # no step: a settings dump ("epochs: 10", "loss_weight: 1.0"), not a record
        # A block cut before its step (the end of a pasted excerpt) follows blocks that had one.
        stepless = "step" not in f
        self._block_steps = self._block_steps or "step" in f
        return _records(bag, line, need_step=not stepless)

    @staticmethod
    def _counted_table(f: dict[str, float], line: LogLine) -> list[Record]:
        """A framed logger table with no loss in it (OpenAI baselines' HER: "| epoch | 3 |",
        success rates, Q values) is still one record at its counter: the run is read, and there
        is no loss to judge."""
        if not _framed(line.text):
            return []
        step = f.get("step")
        if step is None and _whole(f.get("epoch")):
            step = f["epoch"]
        if step is None or not _whole(step):
            return []
        return [step_record(line, step=int(step), epoch=f.get("epoch"))]

    def finish(self) -> list[Record]:
        return self.release()

    def release(self) -> list[Record]:
        bar, self._bar = self._bar, None
        return [*self._flush_blocks(), *([bar] if bar is not None else [])]

    # -- column tables -----------------------------------------------------------------------------

    def _tsv_line(self, line: LogLine, text: str) -> list[Record] | None:
        """A header or a row of a tab-separated table ("Step\tTrain loss\tValid loss" behind a
        logger's prefix, casanovo's history); None when ``text`` is neither."""
        header = _tsv_header(text)
        if header is not None:
            self._tsv = header
            return []
        cols = self._tsv
        if cols is None:
            return None
        cells = [c.strip() for c in text.rstrip("\t\r\n ").split("\t")]
        if len(cells) != len(cols) + 1:
            return None
        step = to_float(cells[0].rsplit(None, 1)[-1]) if cells[0].strip() else None
        vals = [to_float(c) for c in cells[1:]]
        if step is None or not _whole(step) or any(v is None for v in vals):
            return None
        # A row fills the columns logged at its step and writes nan in the others (train and
        # validation losses are logged at different steps): a nan beside a finite loss of the
        # same row is "not logged here", not a NaN loss.
        filled = any(v is not None and math.isfinite(v) for v in vals)
        bag = MetricBag()
        for col, v in zip(cols, vals, strict=True):
            if v is not None and (math.isfinite(v) or not filled):
                bag.put(col, v)
        bag.fields["step"] = step
        return _records(bag, line)

    def _table(self, line: LogLine, text: str) -> list[Record] | None:
        """Records of a header-and-rows table; None when ``text`` is no part of one."""
        if "poch" in text or _csv_gate(text):
            header = table_header(text) if "poch" in text else None
            if header is not None:
                self._cols, self._loss_cols = header, loss_columns(header)
                return []
            csv = _csv_header(text)
            if csv is not None:
                self._csv = csv
                return []
        if self._csv is not None and text.count(",") == len(self._csv) - 1:
            return self._csv_row(line, text)
        cols = self._cols
        if cols is None or not self._loss_cols:
            return None
        if "\r" in text:
            text = text.rstrip("\r")
            text = text[text.rfind("\r") + 1 :]
        row = table_row(text, len(cols))
        if row is None:
            return None
        epoch, epochs, cells = row
        bag = MetricBag()
        for name, cell in zip(cols[1:], cells[1:], strict=False):
            m = re.match(r"(-?[\d.eE+-]+|nan|inf)([A-Za-z]*)$", cell, re.IGNORECASE)
            if m is not None:
                bag.put(name, to_float(m.group(1)), m.group(2))
        parts = [to_float(cells[i]) for i in self._loss_cols]
        _finish_bag(bag, [v for v in parts if v is not None], False)
        f = bag.fields
        f["step"], f["total_steps"], f["epoch"] = float(epoch), float(epochs), float(epoch)
        rec = bag.step_record(line)
        if rec is None:
            return []
        if self._last is not None and self._last[0] == rec.step:
            return []  # the same epoch's bar redrawn: its first complete drawing stands
        self._last = (rec.step, rec.loss)
        return [rec]

    def _csv_row(self, line: LogLine, text: str) -> list[Record]:
        assert self._csv is not None
        bag = MetricBag()
        parts: list[float] = []
        rl_parts: list[float] = []
        for col, cell in zip(self._csv, text.split(","), strict=False):
            v = to_float(cell) if cell.strip() else None
            if v is None:
                continue
            key = _flat_key(col)
            if canonical(key) is None:
                if _is_part(col):
                    (rl_parts if _rl_objective(col) else parts).append(v)
                continue
            bag.put(key, v)
        _finish_bag(bag, parts, False, None, rl_parts)
        f = bag.fields
        if "step" not in f and "epoch" in f:
            f["step"] = f["epoch"]
        if "loss" in f or "eval_loss" in f or bag.objective:
            return _records(bag, line)
        # An RL progress.csv with no loss column (a DQN's per-episode rewards): a record at its
        # step all the same, so the run is read, with no loss to judge.
        step = f.get("step")
        return [step_record(line, step=int(step))] if step is not None and _whole(step) else []


# VITS and its forks (train.py: logger.info([x.item() for x in losses] + [global_step, lr])):
# "ljs_base INFO [2.38, 2.51, 7.85, 17.79, 1.43, 2.25, 843400, 0.000134]".
_VITS = re.compile(r"\bINFO \[([-+\d.eEnaif, ]{5,800})\]\s*$")


# A progress bar followed, on its line, by a bare "step, loss" the training loop printed
# (unsloth_train: "  4%|▎  | 11/312 [02:27<1:00:48, 12.12s/it]10, 2.2398"): taken only when the
# number is the bar's count or the one before it, which says it is the step.
_BAR_PAIR = re.compile(
    rf"\|\s{{0,4}}(\d{{1,12}})/(\d{{1,12}}) \[[^\]\r\n]{{0,120}}\](\d{{1,12}}), ({_NUMBER})\s*$"
)


def _bar_pair(text: str) -> tuple[float, float, float] | None:
    """(step, loss, total) of a bar line ending in a bare step, loss pair, or None."""
    m = _BAR_PAIR.search(text)
    if m is None:
        return None
    n, total, step, loss = int(m[1]), int(m[2]), int(m[3]), to_float(m[4])
    if loss is None or step not in (n, n - 1):
        return None
    return float(step), loss, float(total)


def _vits_list(text: str) -> tuple[list[float], float, float] | None:
    """(losses, global step, lr) of a VITS loss list, or None."""
    m = _VITS.search(text)
    if m is None:
        return None
    vals = [to_float(c) for c in m[1].split(",")]
    if len(vals) < 3 or any(v is None for v in vals):
        return None
    nums = [float(v) for v in vals if v is not None]
    *losses, step, lr = nums
    if not (math.isfinite(step) and step == int(step) and step >= 0 and 0 < lr < 1):
        return None
    return losses, step, lr


_TSV_STEP = frozenset({"step", "steps", "global_step", "epoch", "iteration", "iter"})


# A headerless row of an iteration and its loss terms with "----" where a term was not computed
# at that iteration (Enhancing Photorealism Enhancement: "4 ---- ---- 0.57 ---- nan nan").
_PLACEHOLDER = re.compile(r"-{2,}")
_PLACEHOLDER_CELLS = 8


def _placeholder_row(text: str) -> tuple[float, list[float]] | None:
    """(iteration, the numbers) of a row of bare cells with ``----`` placeholders, or None. The
    cells are unnamed, so only a non-finite one tells anything (a NaN among the loss terms)."""
    cells = text.split()
    if len(cells) <= _PLACEHOLDER_CELLS or not cells[0].isdigit() or len(cells[0]) > 12:
        return None
    nums: list[float] = []
    held = False
    for c in cells[1:]:
        if _PLACEHOLDER.fullmatch(c):
            held = True
            continue
        v = to_float(c)
        if v is None:
            return None
        nums.append(v)
    return (float(cells[0]), nums) if held else None


def _tsv_header(text: str) -> list[str] | None:
    """Columns (after the step column) of a tab-separated header whose first column names the
    step (the last word before the first tab, a logger's prefix may precede it) and which has a
    loss column."""
    cells = [c.strip() for c in text.rstrip("\t\r\n ").split("\t")]
    if len(cells) < 2 or len(cells) > 32 or not cells[0]:
        return None
    first = cells[0].rsplit(None, 1)[-1].lower()
    cols = cells[1:]
    if first not in _TSV_STEP or not all(_CSV_WORD.fullmatch(c) for c in cols):
        return None
    if not any(canonical(c) in ("loss", "eval_loss") for c in cols):
        return None
    return cols


def _framed(text: str) -> bool:
    """A row of a ``| key | value |`` table (the frame of OpenAI baselines' and SB3's logger)."""
    s = text.strip()
    return s[:1] == "|" and s[-1:] == "|" and s.count("|") == 3


def _block_filler(text: str) -> bool:
    """A line inside a one-key-per-line block that carries no pair: a stable-baselines section
    name ("| time/                   |             |"), or an indented YAML line with no number
    (Ray Tune's pretty-printed result: "  info:", "  done: false", "  custom_metrics: {}", a list
    item "        - -0.0306")."""
    s = text.strip()
    if s.startswith("|"):
        return s.endswith("|") and s.count("|") == 3 and not any(c.isdigit() for c in s)
    return text[:1] == " " and (_YAML_KEY.match(s) is not None or s.startswith("- "))


_YAML_KEY = re.compile(r"[\w./'\"-]{1,80}:(?:\s|$)")


def _csv_header(text: str) -> list[str] | None:
    """Column names of a CSV header with an epoch (or environment-step) column and a loss column
    (YOLOv5 results.csv, OpenAI baselines' and SB3's progress.csv)."""
    if text.count(",") < 2:
        return None
    cols = [c.strip().strip('"') for c in text.strip().split(",")]
    low = [c.lower() for c in cols]
    if "step" in low:
        return None  # a step column: Lightning's CSVLogger, its own reader
    counter = any(canonical(_flat_key(c)) == "step" for c in low)
    if "epoch" not in low and not counter:
        return None
    # An RL logger's progress.csv may have no loss column: episodes and their rewards against
    # an environment-step counter (a DQN's "episode,episode_reward,...,steps_done").
    rl = counter and any("episode" in c for c in low) and any("reward" in c for c in low)
    if not (rl or any("loss" in c for c in low)) or not all(_CSV_WORD.fullmatch(c) for c in cols):
        return None
    return cols


def _csv_gate(text: str) -> bool:
    """Cheap test for a line that may be an RL progress.csv header naming its step counter
    ("total timesteps", "TimestepsSoFar", "steps_done")."""
    return "teps" in text and "," in text and ":" not in text and "=" not in text


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


@register_parser
class RegexParser:
    """A user's regex; each known named group fills the record field of that name."""

    name: ClassVar[str] = "regex"
    hints: ClassVar[tuple[str, ...]] = ()  # never sniffed: only chosen by name
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 1000  # sniffed after smaller orders (registry.py)

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
