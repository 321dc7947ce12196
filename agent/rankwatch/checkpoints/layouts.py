"""Which files form one checkpoint, which framework wrote it, and whether it says it is done.

Frameworks lay checkpoints out differently and announce completion differently: Hugging
Face writes ``trainer_state.json`` last, torch.distributed.checkpoint renames
``.metadata`` into place last, Megatron-LM and DeepSpeed move a pointer file
(``latest_checkpointed_iteration.txt``, ``latest``) after every rank finished. Lightning
and plain ``torch.save`` files have no marker, so only "stopped changing" tells.
Everything here is a read-only directory walk; nothing opens a tensor.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwatch.records import EvalRecord, StepRecord, median

HF = "hf"
HF_MODEL = "hf_model"
LIGHTNING = "lightning"
DCP = "dcp"
MEGATRON = "megatron"
DEEPSPEED = "deepspeed"
PLAIN = "plain"
CUSTOM = "custom"

TRAINER_STATE = "trainer_state.json"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
DEEPSPEED_LATEST = "latest"

_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
_HF_STAGING = re.compile(r"^tmp-checkpoint-(\d+)$")
_MEGATRON_DIR = re.compile(r"^iter_(\d+)$")
_DEEPSPEED_DIR = re.compile(r"^global_step(\d+)$")
_STEP_DIR = re.compile(r"(?:step|iter|iteration|ckpt|checkpoint|epoch)[-_=]?(\d+)$", re.IGNORECASE)
_LIGHTNING_STEP = re.compile(r"step=(\d+)")
_PLAIN_STEP = re.compile(r"(?:step|iter|iteration|it)[-_=]?(\d+)|[-_](\d+)$", re.IGNORECASE)
_TRAILING_INT = re.compile(r"(\d+)(?!.*\d)")
_SHARD = re.compile(r"-\d{5}-of-\d{5}")
_RANK_METADATA = re.compile(r"^__\d+\.metadata$")

WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")
# Parts of a checkpoint, never a checkpoint of their own when found loose.
_COMPONENTS = re.compile(
    r"^(?:optimizer|scheduler|scaler|training_args|rng_state(?:_\d+)?|distrib_optim|common)\.(?:pt|pth|bin)$"
)
_MAX_POINTER_BYTES = 256


@dataclass(frozen=True, slots=True)
class FileStat:
    size: int  # -1: a dangling symlink
    mtime: float  # wall-clock seconds


@dataclass(slots=True)
class Candidate:
    """One checkpoint as it is on disk now: a folder, or a single file."""

    name: str  # relative to the watched root, '/'-separated; '.' for the root itself
    path: Path
    layout: str
    step: int | None
    is_dir: bool
    files: dict[str, FileStat] = field(default_factory=dict)  # relative to ``path`` (or its file name)
    marker: bool | None = None  # None: the layout has no completion marker
    marker_name: str | None = None
    staging: bool = False

    @property
    def size(self) -> int:
        return sum(max(0, s.size) for s in self.files.values())

    @property
    def saved_at(self) -> float:
        return max((s.mtime for s in self.files.values()), default=0.0)

    def signature(self) -> frozenset[tuple[str, int, float]]:
        return frozenset((k, v.size, v.mtime) for k, v in self.files.items())

    def file_path(self, rel: str) -> Path:
        return self.path / rel if self.is_dir else self.path


@dataclass(slots=True)
class Pointer:
    """A framework's "latest" pointer file, which resume follows blindly."""

    file: str  # relative to the root
    kind: str  # MEGATRON or DEEPSPEED
    value: str
    target: str  # relative to the root
    exists: bool
    step: int | None
    mtime: float


@dataclass(slots=True)
class ScanResult:
    root: Path
    exists: bool
    candidates: list[Candidate] = field(default_factory=list)
    pointers: list[Pointer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _int(text: str | None) -> int | None:
    return int(text) if text else None


def _trailing_int(name: str) -> int | None:
    m = _TRAILING_INT.search(name)
    return int(m.group(1)) if m else None


def _is_weight(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES) and not _COMPONENTS.match(name)


def classify_dir(name: str, names: set[str]) -> tuple[str, int | None, bool] | None:
    """(layout, step from the name, is a staging folder) for a folder, None if it is none."""
    for pattern, layout, staging in (
        (_HF_STAGING, HF, True),
        (_HF_DIR, HF, False),
        (_MEGATRON_DIR, MEGATRON, False),
        (_DEEPSPEED_DIR, DEEPSPEED, False),
    ):
        m = pattern.match(name)
        if m:
            return layout, int(m.group(1)), staging
    if ".metadata" in names or any(n.endswith(".distcp") or _RANK_METADATA.match(n) for n in names):
        return DCP, _trailing_int(name), False
    if any(n.endswith(("_model_states.pt", "optim_states.pt")) for n in names):
        return DEEPSPEED, _trailing_int(name), False
    if TRAINER_STATE in names:
        return HF, _trailing_int(name), False
    weights = any(
        n.endswith(".safetensors") or n.startswith("pytorch_model") or n.endswith(".safetensors.index.json")
        for n in names
    )
    if "config.json" in names and weights:
        return HF_MODEL, None, False
    m = _STEP_DIR.search(name)
    if m and any(_is_weight(n) and not n.endswith(".ckpt") for n in names):
        return PLAIN, int(m.group(1)), False
    return None


def classify_file(name: str) -> tuple[str, int | None] | None:
    if name.endswith(".ckpt"):
        m = _LIGHTNING_STEP.search(name)
        return LIGHTNING, int(m.group(1)) if m else None
    if not _is_weight(name) or (name.endswith(".bin") and not name.startswith("pytorch_model")):
        return None
    stem = _SHARD.sub("", name.rsplit(".", 1)[0])
    m = _PLAIN_STEP.search(stem)
    return PLAIN, (int(m.group(1) or m.group(2)) if m else None)


def _listdir(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def _stat(path: Path | str) -> FileStat | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        try:
            return FileStat(-1, os.lstat(path).st_mtime)  # dangling link
        except OSError:
            return None
    except OSError:
        return None
    return FileStat(st.st_size, st.st_mtime)


def _files_under(path: Path) -> dict[str, FileStat]:
    out: dict[str, FileStat] = {}
    for top, dirs, files in os.walk(path):
        dirs.sort()
        rel_top = os.path.relpath(top, path)
        for f in sorted(files):
            rel = f if rel_top == "." else f"{rel_top.replace(os.sep, '/')}/{f}"
            st = _stat(os.path.join(top, f))
            if st is not None:
                out[rel] = st
    return out


def read_pointer(path: Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_POINTER_BYTES)
    except OSError:
        return None
    return data.decode("utf-8", "replace").strip()


def _pointers(folder: Path, rel: str, names: set[str]) -> list[Pointer]:
    out: list[Pointer] = []
    prefix = f"{rel}/" if rel else ""
    if MEGATRON_TRACKER in names:
        value = read_pointer(folder / MEGATRON_TRACKER) or ""
        step = int(value) if value.isdigit() else None
        target = f"iter_{step:07d}" if step is not None else value
        st = _stat(folder / MEGATRON_TRACKER)
        out.append(
            Pointer(
                prefix + MEGATRON_TRACKER,
                MEGATRON,
                value,
                prefix + target,
                bool(target) and (folder / target).is_dir(),
                step,
                st.mtime if st else 0.0,
            )
        )
    if DEEPSPEED_LATEST in names and (folder / DEEPSPEED_LATEST).is_file():
        value = read_pointer(folder / DEEPSPEED_LATEST) or ""
        st = _stat(folder / DEEPSPEED_LATEST)
        ok = bool(value) and "/" not in value and (folder / value).is_dir()
        out.append(
            Pointer(
                prefix + DEEPSPEED_LATEST,
                DEEPSPEED,
                value,
                prefix + value,
                ok,
                _trailing_int(value),
                st.mtime if st else 0.0,
            )
        )
    return out


def _marker(cand: Candidate, names: set[str], pointers: list[Pointer] | None) -> None:
    """Set the completion marker; ``pointers`` None means the parent was not looked at."""
    if cand.layout == HF:
        cand.marker_name = TRAINER_STATE
        cand.marker = TRAINER_STATE in names and not cand.staging
    elif cand.layout == DCP:
        cand.marker_name = ".metadata"
        cand.marker = ".metadata" in names or any(_RANK_METADATA.match(n) for n in names)
    elif cand.layout in (MEGATRON, DEEPSPEED) and pointers is not None:
        kind = cand.layout
        ptr = next((p for p in pointers if p.kind == kind), None)
        cand.marker_name = MEGATRON_TRACKER if kind == MEGATRON else DEEPSPEED_LATEST
        if ptr is None:
            cand.marker = False if kind == MEGATRON else None  # DeepSpeed may run with save_latest=False
        elif kind == MEGATRON and ptr.value == "release":
            cand.marker = True
        else:
            if ptr.value == cand.path.name:
                cand.marker = True
            elif ptr.step is not None and cand.step is not None:
                cand.marker = ptr.step >= cand.step
            else:
                cand.marker = ptr.mtime >= cand.saved_at


def _step(name: str, default: int | None, step_re: re.Pattern[str] | None) -> int | None:
    if step_re is not None:
        m = step_re.search(name)
        if m:
            try:
                return int(m.group(1) if m.groups() else m.group(0))
            except ValueError:
                pass
    return default


class _Walker:
    def __init__(self, root: Path, glob: str | None, step_re: re.Pattern[str] | None, max_depth: int):
        self.root = root
        self.glob = glob
        self.step_re = step_re
        self.max_depth = max_depth
        self.result = ScanResult(root=root, exists=True)

    def _globbed(self, rel: str) -> bool:
        return self.glob is not None and fnmatch.fnmatch(rel, self.glob)

    def dir_candidate(
        self,
        path: Path,
        rel: str,
        cls: tuple[str, int | None, bool],
        names: set[str],
        ptrs: list[Pointer] | None,
    ) -> Candidate:
        layout, step, staging = cls
        files = _files_under(path)
        if layout == HF_MODEL:
            files = {k: v for k, v in files.items() if "/" not in k}
        cand = Candidate(
            name=rel or ".",
            path=path,
            layout=layout,
            step=_step(path.name, step, self.step_re),
            is_dir=True,
            files=files,
            staging=staging,
        )
        _marker(cand, names, ptrs)
        return cand

    def walk(self, folder: Path, rel: str, depth: int) -> None:
        entries = _listdir(folder)
        names = {e.name for e in entries}
        ptrs = _pointers(folder, rel, names)
        self.result.pointers.extend(ptrs)
        own = classify_dir(folder.name, names)
        model_here = own is not None and own[0] == HF_MODEL
        if own is not None and model_here:
            self.result.candidates.append(self.dir_candidate(folder, rel, own, names, ptrs))
        for e in entries:
            child_rel = f"{rel}/{e.name}" if rel else e.name
            if e.is_dir(follow_symlinks=False):
                if e.name.startswith("."):
                    continue
                child = Path(e.path)
                child_names = {c.name for c in _listdir(child)}
                cls = classify_dir(e.name, child_names)
                if cls is None and self._globbed(child_rel):
                    cls = (CUSTOM, _trailing_int(e.name), False)
                if cls is not None and cls[0] != HF_MODEL:
                    self.result.candidates.append(
                        self.dir_candidate(child, child_rel, cls, child_names, ptrs)
                    )
                elif cls is not None or depth + 1 < self.max_depth:
                    self.walk(child, child_rel, depth + 1)
            elif not model_here:
                self.file(Path(e.path), child_rel, e)

    def file(self, path: Path, rel: str, entry: os.DirEntry[str]) -> None:
        cls = classify_file(path.name)
        if cls is None and self._globbed(rel) and not path.name.startswith("."):
            cls = (CUSTOM, _trailing_int(path.name))
        if cls is None:
            return
        st = _stat(path)
        if st is None:
            return
        if entry.is_symlink() and st.size >= 0:
            return  # e.g. Lightning's last.ckpt linking to the newest checkpoint: judged as its target
        self.result.candidates.append(
            Candidate(
                name=rel,
                path=path,
                layout=cls[0],
                step=_step(path.name, cls[1], self.step_re),
                is_dir=False,
                files={path.name: st},
            )
        )


def scan(
    root: Path | str, *, glob: str | None = None, step_regex: str | None = None, max_depth: int = 3
) -> ScanResult:
    """Every checkpoint under ``root`` (or ``root`` itself when it is one) as it is now."""
    root = Path(root)
    step_re = re.compile(step_regex) if step_regex else None
    walker = _Walker(root, glob, step_re, max(1, max_depth))
    if root.is_file():
        cls = classify_file(root.name) or (CUSTOM, _trailing_int(root.name))
        st = _stat(root)
        if st is not None:
            walker.result.candidates.append(
                Candidate(".", root, cls[0], _step(root.name, cls[1], step_re), False, {root.name: st})
            )
        return walker.result
    if not root.is_dir():
        return ScanResult(root=root, exists=False)
    names = {e.name for e in _listdir(root)}
    own = classify_dir(root.name, names)
    if own is not None and own[0] != HF_MODEL:
        parent = root.parent
        parent_names = {e.name for e in _listdir(parent)}
        ptrs = _pointers(parent, "..", parent_names) or None
        walker.result.candidates.append(walker.dir_candidate(root, "", own, names, ptrs))
        return walker.result
    walker.walk(root, "", 0)
    return walker.result


# --- Hugging Face trainer_state.json -------------------------------------------------


def load_trainer_state(path: Path | str) -> dict[str, Any]:
    """The parsed file; Python's json reads the NaN/Infinity that the Trainer writes."""
    with open(path, encoding="utf-8") as fh:
        state = json.load(fh)
    if not isinstance(state, dict):
        raise ValueError("trainer_state.json is not a JSON object")
    return state


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _step_of(entry: dict[str, Any]) -> int | None:
    s = entry.get("step")
    return int(s) if isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) else None


def records_from_state(state: dict[str, Any]) -> list[StepRecord | EvalRecord]:
    out: list[StepRecord | EvalRecord] = []
    total = state.get("max_steps")
    total = int(total) if isinstance(total, int) and total > 0 else None
    history = state.get("log_history")
    for entry in history if isinstance(history, list) else []:
        if not isinstance(entry, dict):
            continue
        step = _step_of(entry)
        if "loss" in entry:
            out.append(
                StepRecord(
                    step=step,
                    total_steps=total,
                    loss=_num(entry.get("loss")),
                    grad_norm=_num(entry.get("grad_norm")),
                    learning_rate=_num(entry.get("learning_rate")),
                    epoch=_num(entry.get("epoch")),
                )
            )
        if "eval_loss" in entry:
            metrics = {
                k: float(v)
                for k, v in entry.items()
                if k.startswith("eval_") and k != "eval_loss" and _num(v) is not None
            }
            out.append(EvalRecord(eval_loss=_num(entry.get("eval_loss")), step=step, metrics=metrics))
    return out


def records_from_trainer_state(path: Path | str) -> list[StepRecord | EvalRecord]:
    """Step and eval records with the exact step numbers the Trainer kept in log_history."""
    return records_from_state(load_trainer_state(path))


def first_bad_step(records: list[StepRecord | EvalRecord]) -> tuple[int, str] | None:
    """The first logged step whose numbers show the run was already poisoned.

    A NaN loss or grad norm, two infinite grad norms in a row (one is an fp16 overflow the
    scaler skips), or a loss of exactly 0 from a normal level: ``logging_nan_inf_filter``
    drops NaN losses from the logged mean.
    """
    losses: list[float] = []
    inf_at: int | None = None
    for r in records:
        if r.step is None:
            continue
        if isinstance(r, EvalRecord):
            if r.eval_loss is not None and not math.isfinite(r.eval_loss):
                return r.step, f"eval_loss {r.eval_loss}"
            continue
        if r.loss is not None and not math.isfinite(r.loss):
            return r.step, f"loss {r.loss}"
        g = r.grad_norm
        if g is not None and math.isnan(g):
            return r.step, "grad_norm nan"
        if g is not None and math.isinf(g):
            if inf_at is not None:
                return inf_at, "grad_norm inf"
            inf_at = r.step
        else:
            inf_at = None
        if r.loss == 0 and len(losses) >= 3 and median(losses[-20:]) > 0.05:
            return r.step, "loss 0 (NaN losses filtered out of the logged mean)"
        if r.loss is not None:
            losses.append(r.loss)
    return None
