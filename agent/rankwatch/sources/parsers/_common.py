"""Number parsing, key aliases and small pieces every format parser shares.

Everything here must be cheap and must never raise on garbage: parsers see arbitrary
log text, and a parser that throws loses the rest of the stream.
"""

from __future__ import annotations

import math
import re

from rankwatch.records import ErrorRecord, EvalRecord, OverflowRecord, Severity, StepRecord

from .base import LogLine

GIB = float(1 << 30)
MIB = float(1 << 20)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")
_NUM_JUNK = str.maketrans("", "", ",'\"_ ")
_MAX_DIGITS = 18


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def to_float(raw: str | None) -> float | None:
    """A float from log text; ``nan``/``inf`` stay non-finite because detectors need them."""
    if raw is None:
        return None
    s = raw.strip()
    if not s or len(s) > 400:
        return None
    if s[0] in "'\"" or "," in s or "_" in s:
        s = s.translate(_NUM_JUNK)
    try:
        return float(s)
    except ValueError:
        # Lightning's tqdm bar prints a NaN loss as ``nan.0`` (and infinities as ``inf.0``).
        if s.endswith(".0") and s[:-2].lstrip("+-").lower() in ("nan", "inf"):
            return float(s[:-2])
        # PaddleOCR and PaddleDetection format their stats as ``'{}: {:x<6f}'`` (ppocr/utils/
        # stats.py): a NaN is ``nanxxx``, an infinity ``infxxx`` / ``-infxx``.
        if s.endswith("x") and s.rstrip("x").lstrip("+-").lower() in ("nan", "inf"):
            return float(s.rstrip("x"))
        return None


def to_int(raw: str | float | None) -> int | None:
    """An integer that fits in 18 digits; huge, fractional or non-finite values give None."""
    if raw is None:
        return None
    if isinstance(raw, float):
        if not math.isfinite(raw) or abs(raw) >= 10**_MAX_DIGITS or raw != int(raw):
            return None
        return int(raw)
    if raw.isdigit() and len(raw) <= _MAX_DIGITS:
        try:
            return int(raw)
        except ValueError:  # digits int() refuses, e.g. superscripts
            return None
    f = to_float(raw)
    return to_int(f) if f is not None else None


def ratio(value: float | None, percent: bool) -> float | None:
    """MFU as a 0..1 ratio; a negative value is a framework's 'not measured yet' sentinel."""
    if value is None:
        return None
    if value < 0:
        return None
    return value / 100.0 if percent else value


def memory_bytes(value: float | None, unit: str) -> float | None:
    if value is None:
        return None
    u = unit.lower()
    if u in ("gib", "gb", "g"):
        return value * GIB
    if u in ("mib", "mb", "m"):
        return value * MIB
    if u in ("kib", "kb", "k"):
        return value * 1024.0
    return value


def seconds(value: float | None, unit: str) -> float | None:
    if value is None:
        return None
    u = unit.lower()
    if u == "ms":
        return value / 1000.0
    if u in ("us", "µs"):
        return value / 1e6
    if u in ("min", "m"):
        return value * 60.0
    return value


def step_record(line: LogLine, **fields: object) -> StepRecord:
    return StepRecord(rank=line.rank, line=line.lineno, time=line.time, **fields)  # type: ignore[arg-type]


def eval_record(line: LogLine, **fields: object) -> EvalRecord:
    return EvalRecord(rank=line.rank, line=line.lineno, time=line.time, **fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------- metric names

# Canonical StepRecord field (or "eval_loss"/"step"/...) for a normalised key.
ALIASES: dict[str, str] = {}


def _alias(field: str, *names: str) -> None:
    for n in names:
        ALIASES[n] = field


_alias("step", "step", "steps", "global_step", "globalstep", "iter", "iters", "iteration", "it", "_step")
_alias("step", "trainer/global_step", "train/global_step", "optimizer_step", "update", "updates")
_alias("step", "num_updates", "n_updates", "nupdates", "iterations", "acc_iter", "batch", "batch_idx")
# Ray Tune's result counter (one result per training iteration of the trainable); the RL
# loggers' environment-step counters (OpenAI baselines' "TimestepsSoFar", SB3's "total_timesteps").
_alias("step", "training_iteration", "timestepssofar", "total_timesteps")
# Counters a trainer names as the steps done so far: LLaMA-Factory's trainer_log.jsonl
# ("current_steps" beside "total_steps"), RL loggers' "steps_done" / "timesteps" / "total timesteps".
_alias("step", "current_steps", "current_step", "cur_step", "steps_done", "timesteps", "total timesteps")
_alias("total_steps", "total_steps", "max_steps", "train_iters", "num_steps", "total_iters")
_alias("loss", "loss", "train_loss", "lm_loss", "lm loss", "train loss", "training_loss", "train/loss")
_alias("loss", "train_loss_step", "loss_step", "training loss", "train/lm_loss", "avg_loss")
# A total written beside its parts (detectron2's total_loss beside loss_cls, loss_box_reg ...;
# DLLogger's average_loss beside step_loss; LitGPT's "loss train"): the total is the loss.
_alias("loss", "total_loss", "loss_total", "overall_loss", "average_loss", "step_loss", "loss train")
_alias("loss", "train_step_loss", "train/total_loss", "total loss", "cross_entropy", "xent")
_alias("grad_norm", "grad_norm", "gradient_norm", "grad norm", "grad_norm_total", "train/grad_norm")
_alias("grad_norm", "norm", "total_norm", "gnorm", "grad-norm", "gradnorm")
# RLlib's learner_stats (the policies' stats_fn): "grad_gnorm", "cur_lr".
_alias("grad_norm", "grad_gnorm")
_alias("learning_rate", "cur_lr")
_alias("learning_rate", "lr", "learning_rate", "learning rate", "train/learning_rate", "train/lr", "lr-adamw")
_alias("learning_rate", "base_lr", "lr_0")
_alias("loss_scale", "loss_scale", "loss scale", "loss_scaler", "grad_scale", "loss-scale")
_alias("tokens_per_s", "tokens_per_sec", "tokens_per_second", "tok/s", "tok/sec", "tokens/s", "tokens/sec")
_alias("tokens_per_s", "tps", "wps", "throughput(tps)", "tokens_per_s", "tgs", "train/tokens_per_second")
_alias("samples_per_s", "samples_per_sec", "samples_per_second", "samples/s", "samples/sec", "sps")
_alias("samples_per_s", "samples_per_s", "train/samples_per_second")
_alias("step_time_s", "step_time", "iter_time", "time_per_step", "step_time_s", "iter_time_s", "dt")
_alias("step_time_s", "batch_time", "iteration_time", "elapsed_time_per_iteration", "train/step_time")
_alias("step_time_unit", "iter time", "step time", "iter_time_unit")
_alias("step_time_ms", "step_time_ms", "iter_time_ms", "time_ms", "dt_ms", "batch_time_ms")
_alias("tflops", "tflops", "tflop/s", "tflops_per_gpu", "throughput_tflops")
_alias("mfu", "mfu", "train/mfu")
_alias("mfu_pct", "mfu(%)", "mfu_pct", "mfu_percent")
_alias("memory_gib", "memory_gib", "mem_gib", "memory_gb", "mem_gb", "memory(gib)")
_alias("max_memory_gib", "max_memory_gib", "max_mem_gib", "max_memory_gb", "peak_memory_gb", "max_mem_gb")
_alias("max_memory_gib", "max_memory_allocated_gb", "peak_mem_gb")
# Bare names carry no unit (a "time" is as often a timestamp); they count only with a
# unit written after the number.
_alias("memory_unit", "memory", "mem", "gpu_mem", "gpu_memory")
_alias("max_memory_unit", "max_memory", "peak_memory", "max_mem", "peak_mem")
_alias("time_unit", "time", "elapsed")
_alias("epoch", "epoch", "epochs", "ep")
_alias("eval_loss", "eval_loss", "val_loss", "valid_loss", "validation_loss", "eval/loss", "val/loss")
_alias("eval_loss", "val loss", "eval loss", "valid loss", "validation loss", "val_loss_epoch")
_alias("eval_loss", "val_loss valid", "valid/loss", "validation/loss", "test_loss")
_alias("skipped_iters", "skipped_iters", "skipped")
_alias("nan_iters", "nan_iters")


def canonical(key: str) -> str | None:
    k = key.strip().lower()
    hit = ALIASES.get(k)
    if hit is not None:
        return hit
    k2 = k.replace("-", "_")
    return ALIASES.get(k2)


_STEP_FIELDS = (
    "loss",
    "grad_norm",
    "learning_rate",
    "loss_scale",
    "step_time_s",
    "tokens_per_s",
    "samples_per_s",
    "tflops",
    "mfu",
)


class MetricBag:
    """Collects canonical fields from key/value pairs in whatever units they came."""

    __slots__ = ("counted", "eval_metrics", "fields", "objective")

    def __init__(self) -> None:
        self.fields: dict[str, float] = {}
        self.eval_metrics: dict[str, float] = {}
        # A finite objective was read that is no loss to judge (an RL policy's): the line is a
        # record at its step all the same.
        self.objective = False
        # (epoch, iteration, the iteration's total) when the step was composed from an epoch and
        # an iteration taken to count within it; the stream may learn it counts the run instead.
        self.counted: tuple[float, float, float] | None = None

    def put(self, key: str, value: float | None, unit: str = "") -> bool:
        """Record ``key``; True when it was recognised."""
        if value is None:
            return False
        field = canonical(key)
        if field is None:
            k = key.strip().lower()
            if k.startswith(("eval_", "eval/", "val_", "val/", "valid_", "validation_")):
                self.eval_metrics[key.strip()] = value
            return False
        unit = unit.strip()
        if field == "step_time_ms":
            field, value = "step_time_s", value / 1000.0
        elif field == "step_time_s" and unit:
            value = seconds(value, unit)
        elif field == "mfu_pct":
            field, value = "mfu", ratio(value, True)
        elif field == "mfu":
            value = ratio(value, unit == "%" or value > 1.0)
        elif field in ("memory_gib", "max_memory_gib"):
            value = memory_bytes(value, unit or "gib")
            field = "memory_bytes" if field == "memory_gib" else "max_memory_bytes"
        elif field in ("memory_unit", "max_memory_unit"):
            if unit.lower() not in ("gib", "gb", "mib", "mb"):
                return False
            value = memory_bytes(value, unit)
            field = "memory_bytes" if field == "memory_unit" else "max_memory_bytes"
        elif field == "time_unit" or field == "step_time_unit":
            if unit not in ("ms", "s"):
                return False
            field, value = "step_time_s", seconds(value, unit)
        if value is None:
            return False
        if field == "loss" and "total" in key.lower():
            self.fields[field] = value  # the total over any part or average seen before it
        else:
            self.fields.setdefault(field, value)
        return True

    def step_record(self, line: LogLine, *, need_step: bool = True) -> StepRecord | None:
        f = self.fields
        if not self.objective and not any(k in f for k in _STEP_FIELDS):
            return None
        step = to_int(f.get("step"))
        if need_step and step is None and "epoch" not in f:
            return None
        return step_record(
            line,
            step=step,
            total_steps=to_int(f.get("total_steps")),
            loss=f.get("loss"),
            grad_norm=f.get("grad_norm"),
            learning_rate=f.get("learning_rate"),
            loss_scale=f.get("loss_scale"),
            tokens_per_s=f.get("tokens_per_s"),
            samples_per_s=f.get("samples_per_s"),
            step_time_s=f.get("step_time_s"),
            tflops=f.get("tflops"),
            mfu=f.get("mfu"),
            memory_bytes=f.get("memory_bytes"),
            max_memory_bytes=f.get("max_memory_bytes"),
            epoch=f.get("epoch"),
            skipped_iters=to_int(f.get("skipped_iters")),
            nan_iters=to_int(f.get("nan_iters")),
        )

    def eval_record(self, line: LogLine) -> EvalRecord | None:
        if "eval_loss" not in self.fields:
            return None
        metrics = dict(self.eval_metrics)
        if "loss" in self.fields:
            metrics["train_loss"] = self.fields["loss"]
        return eval_record(
            line, eval_loss=self.fields["eval_loss"], step=to_int(self.fields.get("step")), metrics=metrics
        )


# ---------------------------------------------------------------- tqdm bars

# ``  5%|▌         | 50/1000 [00:25<08:00,  1.98it/s]`` and ``45it [00:12,  3.61it/s]``.
TQDM_BAR = re.compile(
    r"\r?(?P<pct>[ ]{0,2}\d{1,3})%\|[^|\r\n]{0,400}\|\s{0,4}(?P<n>\d{1,18})/(?P<total>\d{1,18}|\?)"
    r"\s{0,4}\[(?P<info>[^\]\r\n]{0,300})\]"
)
TQDM_NOTOTAL = re.compile(r"(?P<n>\d{1,18})it\s\[(?P<info>[^\]\r\n]{0,300})\]")
_RATE = re.compile(r"(?P<v>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s?(?P<u>it/s|s/it)")


def rate_to_step_time(info: str) -> float | None:
    """Seconds per iteration from the ``[elapsed<remaining, rate]`` part of a bar."""
    m = _RATE.search(info)
    if m is None:
        return None
    v = to_float(m.group("v"))
    if v is None:
        return None
    if m.group("u") == "s/it":
        return v
    return 1.0 / v if v > 0 else None


# ---------------------------------------------------------------- fp16 loss scaler

_OVF_GRAD = re.compile(r"Grad overflow on iteration:?\s*(\d{1,18})")
_OVF_REDUCE = re.compile(r"Reducing dynamic loss scale from\s+([-\w.+]+)\s+to\s+([-\w.+]+)")
_OVF_ATTEMPT = re.compile(r"Attempted loss scale:\s*([-\w.+]+?),?\s+reducing to\s+([-\w.+]+)")
_OVF_HYST = re.compile(r"Attempted loss scale:\s*([-\w.+]+?),?\s+but hysteresis")
_OVF_SKIP = re.compile(r"OVERFLOW!.{0,40}Skipping step|Overflow detected\.\s*Skipping step")
_OVF_APEX = re.compile(r"Gradient overflow\.\s+Skipping step,.{0,40}reducing loss scale to\s+([-\w.+]+)")
# fairseq: "| WARNING: overflow detected, setting loss scale to: 0.25" (0.6), "NOTE: overflow
# detected, setting loss scale to: 1024.0" and "NOTE: gradient overflow detected, ignoring
# gradient, setting loss scale to: 4.0" (fairseq/trainer.py).
_OVF_FAIRSEQ = re.compile(r"overflow detected,.{0,60}?setting loss scale to:?\s+([-\w.+]+)")


def _at_floor(line: LogLine, scale: float) -> ErrorRecord:
    """DeepSpeed's fused/unfused optimizer ``_update_scale`` prints "Reducing dynamic loss scale
    from A to B" on every overflow, B = max(A / scale_factor, min_loss_scale), with no hysteresis:
    B == A says the scale already sat at its floor and the step overflowed anyway. DeepSpeed's
    DynamicLossScaler raises on this very event ("Current loss scale already at minimum",
    raise_error_at_min_scale=True by default). Real cases: DeepSpeedExamples#307 ("from 1 to 1",
    then act_loss nan); HF#14531's stage-2 "Attempted loss scale: 1, reducing to 1" on every step
    is the same state, but that form is printed during hysteresis too, so only this one counts."""
    shown = f"{scale:g}"
    return ErrorRecord(
        kind="loss_scale_collapse",
        summary=f"fp16 loss scale at its floor ({shown}) and the step still overflowed: no scale is small "
        "enough, the gradients are inf/NaN",
        evidence=[line.text],
        severity=Severity.WARNING,
        details={"loss_scale": scale},
        rank=line.rank,
        line=line.lineno,
        time=line.time,
    )


def _scale(raw: str) -> float | None:
    return to_float(raw.rstrip("."))


def _same_event(
    told: tuple[float, float | None, int | None, int | None, float | None],
    old: float,
    new: float | None,
    step: int | None,
    line: LogLine,
) -> bool:
    """Another rank's copy of the reduction ``told``: same scales and rank, no other step."""
    t_old, t_new, t_step, t_rank, _ = told
    if (t_old, t_new, t_rank) != (old, new, line.rank):
        return False
    return t_step is None or step is None or t_step == step


class OverflowTracker:
    """Turns DeepSpeed/apex/fairseq loss-scaler messages into one OverflowRecord per event.

    DeepSpeed reports a single overflow up to three times ("Grad overflow on iteration",
    "Reducing dynamic loss scale", "Attempted loss scale"); counting each would triple the
    overflow rate a detector sees. An "Attempted"/"OVERFLOW!" line that repeats the scales
    of a "Reducing" line just before it is the same event; back-to-back "Attempted" lines
    (one per skipped step at the minimum scale) are all real.

    Every rank's scaler prints its own copy, unprefixed when the launcher does not tag lines
    (DeepSpeed-Chat's 8-rank logs: "Reducing dynamic loss scale from 16.0 to 8.0" eight times
    within a few milliseconds, the run's own counter saying skipped=17): one rank's scaler
    cannot reduce from A to B twice without growing back to A in between, so a reduction
    equal to the last one told, at no other step and with no growth seen since, is a copy.
    """

    __slots__ = ("_last", "_pending_step", "_told")

    def __init__(self) -> None:
        self._pending_step: int | None = None
        self._last: tuple[float | None, float | None, int] | None = None
        # The last reduction told: old and new scale, step, rank, time.
        self._told: tuple[float, float | None, int | None, int | None, float | None] | None = None

    @staticmethod
    def maybe(text: str) -> bool:
        return "verflow" in text or "oss scale" in text or "OVERFLOW" in text

    def grown(self) -> None:
        """The scaler grew: the next reduction equal to the last one is a new event."""
        self._told = None

    def feed(self, line: LogLine, text: str) -> list[OverflowRecord | ErrorRecord] | None:
        """Records for an overflow line, or None when the line is not about overflows."""
        m = _OVF_GRAD.search(text)
        if m is not None:
            self._pending_step = to_int(m.group(1))
            return []
        m = _OVF_REDUCE.search(text)
        if m is not None:
            old, new = _scale(m.group(1)), _scale(m.group(2))
            out = self._emit(line, old, new, dedup=False)
            if old is not None and old == new:
                out.append(_at_floor(line, old))
            return out
        m = _OVF_ATTEMPT.search(text)
        if m is not None:
            return self._emit(line, _scale(m.group(1)), _scale(m.group(2)), dedup=True)
        m = _OVF_HYST.search(text)
        if m is not None:
            old = _scale(m.group(1))
            return self._emit(line, old, old, dedup=True)
        m = _OVF_APEX.search(text) or _OVF_FAIRSEQ.search(text)
        if m is not None:
            return self._emit(line, None, _scale(m.group(1)), dedup=False)
        if _OVF_SKIP.search(text) is not None:
            return self._emit(line, None, None, dedup=True)
        return None

    def _emit(
        self, line: LogLine, old: float | None, new: float | None, *, dedup: bool
    ) -> list[OverflowRecord | ErrorRecord]:
        last = self._last
        self._last = None
        near = dedup and last is not None and line.lineno - last[2] <= 3
        if near and last is not None and ((last[0], last[1]) == (old, new) or (old is None and new is None)):
            return []
        if not dedup:
            self._last = (old, new, line.lineno)
        step, self._pending_step = self._pending_step, None
        if old is not None and old != new:  # a reduction (at the floor every overflow is new)
            told = self._told
            if told is not None and _same_event(told, old, new, step, line):
                return []
            self._told = (old, new, step, line.rank, line.time)
        return [
            OverflowRecord(
                new_scale=new, old_scale=old, step=step, rank=line.rank, line=line.lineno, time=line.time
            )
        ]
