"""Cheap integrity checks: does each file hold what its own header promises?

Nothing here loads a tensor or unpickles anything. safetensors and torch's zip format
both describe their contents up front or at the end, so a truncated, zeroed or
half-written file contradicts its own header. Pickles are only tokenised
(``pickletools.genops``), which is how a Lightning checkpoint without
``optimizer_states`` or a step number inside ``last.ckpt`` is found without running code.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import pickletools
import re
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from rankwatch.checkpoints import layouts as L
from rankwatch.records import EvalRecord, Severity, StepRecord

_CHUNK = 1 << 20
_MAX_ST_HEADER = 100 << 20  # the safetensors library refuses larger headers
_MAX_PICKLE_SCAN = 32 << 20
_MAX_JSON = 256 << 20
_ZIP_LOCAL = b"PK\x03\x04"
_LEGACY_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)[:-1]
_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "C64": 8,
}
_STRING_OPS = {"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8", "SHORT_BINSTRING", "BINSTRING"}
_INT_OPS = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"}
_MEMO_OPS = {"BINPUT", "LONG_BINPUT", "MEMOIZE", "PUT"}
_STEP_KEYS = ("global_step", "iteration", "iter_num", "global_steps")
_TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
_MUST_NOT_BE_EMPTY = (".safetensors", ".json", ".distcp", ".metadata", *_TORCH_SUFFIXES)
_OPTIMIZER_FILE = re.compile(r"(^|/)optimizer[^/]*(/|$)|optim_states\.pt$|(^|/)distrib_optim\.pt$")
_WEIGHTS_FILE = re.compile(
    r"(^|/)(model[^/]*\.safetensors|pytorch_model[^/]*|adapter_model\.[^/]+|[^/]*model_states\.pt"
    r"|model_optim_rng\.pt|[^/]*\.distcp)$"
)


@dataclass(slots=True)
class Problem:
    file: str
    check: str
    message: str
    severity: Severity = Severity.CRITICAL

    def __str__(self) -> str:
        return f"{self.file}: {self.message}" if self.file else self.message


@dataclass(slots=True)
class FileCheck:
    problems: list[Problem] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)  # strings in a torch pickle (dict keys among them)
    ints: dict[str, int] = field(default_factory=dict)  # key -> int value that followed it
    parsed: Any = None  # the JSON document, for .json files
    torch: bool = False


@dataclass(slots=True)
class Verdict:
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    resumable: bool | None = None
    weights_only: bool = False
    content_step: int | None = None
    bad: tuple[int, str] | None = None  # first poisoned step seen in the checkpoint's own history
    history: list[StepRecord | EvalRecord] = field(default_factory=list)  # HF log_history
    hashes: dict[str, str] | None = None

    @property
    def ok(self) -> bool:
        return not any(p.severity >= Severity.CRITICAL for p in self.problems)

    @property
    def first_problem(self) -> Problem | None:
        crit = [p for p in self.problems if p.severity >= Severity.CRITICAL]
        pick = crit or self.problems
        return pick[0] if pick else None


def check_safetensors(path: Path, rel: str, size: int) -> list[Problem]:
    def bad(msg: str, check: str = "safetensors") -> list[Problem]:
        return [Problem(rel, check, msg)]

    if size < 8:
        return bad(f"truncated: {size} bytes, shorter than the 8-byte header length", "truncated")
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > size - 8:
            return bad(f"header length {n} runs past the end of the {size}-byte file (truncated or damaged)")
        if n > _MAX_ST_HEADER:
            return bad(f"header length {n} is implausible (damaged first bytes)")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return bad(f"header is not valid JSON ({str(e)[:80]})")
    if not isinstance(header, dict):
        return bad("header is not a JSON object")
    buffer = size - 8 - n
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            shape = [int(x) for x in info["shape"]]
            dtype = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            return bad(f"tensor {name!r} has no valid dtype/shape/data_offsets")
        if not 0 <= begin <= end:
            return bad(f"tensor {name!r} has offsets [{begin}, {end}]")
        width = _DTYPE_BYTES.get(dtype)
        if width is not None and math.prod(shape) * width != end - begin:
            return bad(
                f"tensor {name!r}: {dtype}{shape} needs {math.prod(shape) * width} bytes, has {end - begin}"
            )
        spans.append((begin, end, name))
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            return bad(f"tensor {name!r} starts at {begin}, expected {pos} (gap or overlap)")
        pos = end
    if pos > buffer:
        short = pos - buffer
        return bad(f"truncated: the header needs {pos} data bytes, the file holds {buffer} ({short} missing)")
    if pos < buffer:
        return bad(f"{buffer - pos} bytes after the last tensor: the header does not describe the file")
    return []


def pickle_summary(data: bytes | BinaryIO) -> tuple[set[str], dict[str, int]]:
    """Strings and ``key -> int`` pairs of a pickle, read as opcodes, never executed."""
    keys: set[str] = set()
    ints: dict[str, int] = {}
    prev: str | None = None
    for op, arg, _pos in pickletools.genops(data):
        name = op.name
        if name in _STRING_OPS:
            prev = arg if isinstance(arg, str) else arg.decode("latin-1") if isinstance(arg, bytes) else None
            if prev is not None and len(keys) < 8192:
                keys.add(prev)
        elif name in _MEMO_OPS:
            continue
        elif name in _INT_OPS and prev is not None and isinstance(arg, int) and not isinstance(arg, bool):
            ints.setdefault(prev, arg)
            prev = None
        else:
            prev = None
    return keys, ints


def check_torch(path: Path, rel: str, size: int, *, deep: bool = False) -> FileCheck:
    out = FileCheck()
    with open(path, "rb") as fh:
        head = fh.read(16)
        if head.startswith(_ZIP_LOCAL):
            out.torch = True
            _check_zip(fh, rel, size, out, deep)
        elif head.startswith(_LEGACY_MAGIC):
            out.torch = True
            _check_legacy(fh, rel, size, out)
        elif head.startswith(b"\x80\x02\x8a"):
            out.torch = True
            out.problems.append(Problem(rel, "truncated", "legacy torch pickle cut inside its magic number"))
        elif head[:8] == b"\0" * 8:
            out.torch = True
            out.problems.append(Problem(rel, "zeroed", "starts with zero bytes: never written or zeroed"))
        elif not path.name.endswith(".bin"):
            out.problems.append(
                Problem(rel, "format", "neither a torch zip archive nor a legacy torch pickle")
            )
    return out


_STORAGE_BYTES = {
    "DoubleStorage": 8,
    "FloatStorage": 4,
    "HalfStorage": 2,
    "BFloat16Storage": 2,
    "LongStorage": 8,
    "IntStorage": 4,
    "ShortStorage": 2,
    "CharStorage": 1,
    "ByteStorage": 1,
    "BoolStorage": 1,
    "ComplexFloatStorage": 8,
    "ComplexDoubleStorage": 16,
}


Token = tuple[str, Any] | None


def pickle_tokens(fh: BinaryIO | bytes) -> Iterator[Token]:
    """A pickle's strings (``s``), globals (``g``) and ints (``i``) in order, never executed.

    Memo references are followed because the pickler writes a repeated value once and
    refers back to it; any other opcode yields None, so neighbours in the stream are
    neighbours in the pickled container.
    """
    memo: dict[int, Token] = {}
    last: Token = None
    for op, arg, _pos in pickletools.genops(fh):
        name = op.name
        if name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[int(arg or 0)] = last
            continue
        if name == "MEMOIZE":
            memo[len(memo)] = last
            continue
        if name in _STRING_OPS:
            last = ("s", arg)
        elif name == "GLOBAL":
            last = ("g", arg)
        elif name in _INT_OPS:
            last = ("i", arg)
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            last = memo.get(int(arg or 0))
        else:
            last = None
        yield last


def legacy_storages(fh: BinaryIO) -> dict[str, int] | None:
    """Bytes each storage takes after the pickles, from ``('storage', type, key, loc, numel)`` ids.

    None when a storage type is unknown.
    """
    seq = list(pickle_tokens(fh))
    out: dict[str, int] = {}
    for i in range(len(seq) - 4):
        head, typ, key, _loc, numel = seq[i : i + 5]
        if head != ("s", "storage") or typ is None or typ[0] != "g" or key is None or key[0] != "s":
            continue
        width = _STORAGE_BYTES.get(str(typ[1]).rsplit(" ", 1)[-1])
        if width is None or numel is None or numel[0] != "i":
            return None
        out[str(key[1])] = 8 + int(numel[1]) * width
    return out


def _check_legacy(fh: BinaryIO, rel: str, size: int, out: FileCheck) -> None:
    """Pre-1.6 ``torch.save``: magic, protocol, sys info, the object, its storage keys, raw storages."""
    fh.seek(0)
    try:
        for _ in range(3):
            for _op in pickletools.genops(fh):
                pass
        start = fh.tell()
        out.keys, out.ints = pickle_summary(fh)
        fh.seek(start)
        storages = legacy_storages(fh)
        for _op in pickletools.genops(fh):  # the storage keys
            pass
        data_start = fh.tell()
    except (ValueError, EOFError, struct.error) as e:
        out.problems.append(Problem(rel, "pickle", f"legacy torch pickle does not parse ({str(e)[:80]})"))
        return
    if storages is not None:
        need = sum(storages.values())
        have = size - data_start
        if have < need:
            out.problems.append(
                Problem(rel, "truncated", f"truncated: its storages need {need} bytes, the file holds {have}")
            )
            return
    fh.seek(0)
    total = 0
    while chunk := fh.read(_CHUNK):
        total += len(chunk)
    if total != size:
        out.problems.append(Problem(rel, "read", f"read {total} of {size} bytes"))


def _check_zip(fh: Any, rel: str, size: int, out: FileCheck, deep: bool) -> None:
    try:
        zf = zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        out.problems.append(
            Problem(rel, "truncated", f"zip directory unreadable, truncated or damaged ({e})")
        )
        return
    with zf:
        infos = zf.infolist()
        cd_start = int(getattr(zf, "start_dir", size))
        for info in infos:
            fh.seek(info.header_offset)
            local = fh.read(30)
            if len(local) < 30 or not local.startswith(_ZIP_LOCAL):
                out.problems.append(Problem(rel, "zip", f"member {info.filename!r}: local header damaged"))
                return
            n, extra = struct.unpack("<HH", local[26:30])
            end = info.header_offset + 30 + n + extra + info.compress_size
            if end > cd_start:
                out.problems.append(
                    Problem(rel, "truncated", f"member {info.filename!r} runs past the zip directory")
                )
                return
        pkl = next((i for i in infos if i.filename == "data.pkl" or i.filename.endswith("/data.pkl")), None)
        if pkl is None:
            out.problems.append(Problem(rel, "format", "zip without data.pkl: not a torch.save archive"))
            return
        if pkl.file_size <= _MAX_PICKLE_SCAN:
            try:
                out.keys, out.ints = pickle_summary(zf.read(pkl))
            except (zipfile.BadZipFile, ValueError, EOFError, struct.error) as e:
                out.problems.append(Problem(rel, "pickle", f"data.pkl does not parse ({str(e)[:80]})"))
                return
        if deep:
            try:
                bad = zf.testzip()
            except (zipfile.BadZipFile, OSError, EOFError) as e:
                out.problems.append(Problem(rel, "crc", f"member data unreadable ({e})"))
                return
            if bad is not None:
                out.problems.append(Problem(rel, "crc", f"member {bad!r} fails its CRC-32"))


def check_json(path: Path, rel: str, size: int) -> FileCheck:
    out = FileCheck()
    if size > _MAX_JSON:
        return out
    try:
        with open(path, encoding="utf-8") as fh:
            out.parsed = json.load(fh)
    except (UnicodeDecodeError, ValueError) as e:
        out.problems.append(Problem(rel, "json", f"not valid JSON ({str(e)[:80]})"))
    return out


def check_file(path: Path, rel: str, st: L.FileStat, *, deep: bool = False) -> FileCheck:
    name = path.name
    if st.size < 0:
        return FileCheck([Problem(rel, "missing", "broken symlink: its target does not exist")])
    if st.size == 0 and (
        name.endswith(_MUST_NOT_BE_EMPTY) or name in (L.MEGATRON_TRACKER, L.DEEPSPEED_LATEST)
    ):
        return FileCheck([Problem(rel, "zero_bytes", "zero bytes")])
    if name.endswith(".safetensors"):
        return FileCheck(check_safetensors(path, rel, st.size))
    if name.endswith(_TORCH_SUFFIXES):
        return check_torch(path, rel, st.size, deep=deep)
    if name.endswith(".json"):
        return check_json(path, rel, st.size)
    return FileCheck()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def hash_files(cand: L.Candidate) -> dict[str, str]:
    return {rel: sha256(cand.file_path(rel)) for rel, st in cand.files.items() if st.size >= 0}


def _pickle_step(checks: dict[str, FileCheck]) -> int | None:
    for key in _STEP_KEYS:
        for c in checks.values():
            v = c.ints.get(key)
            if v is not None and v >= 0:
                return v
    return None


def verify_candidate(cand: L.Candidate, *, deep: bool = False) -> Verdict:
    """Every cheap check for one complete-looking checkpoint. Raises OSError if files vanish."""
    v = Verdict()
    checks: dict[str, FileCheck] = {}
    if not cand.files:
        v.problems.append(Problem("", "empty", "no files"))
        return v
    for rel, st in cand.files.items():
        c = check_file(cand.file_path(rel), rel, st, deep=deep)
        checks[rel] = c
        v.problems.extend(c.problems)
    names = set(cand.files)
    _check_indexes(cand, checks, v)
    _check_dcp_folders(cand, names, v, deep)
    layout = cand.layout
    if layout in (L.HF, L.HF_MODEL):
        _check_hf(cand, names, checks, v)
    elif layout == L.LIGHTNING:
        c = next(iter(checks.values()))
        if c.keys and "state_dict" not in c.keys:
            v.problems.append(Problem(cand.path.name, "format", "no state_dict: not a Lightning checkpoint"))
        if c.keys and "optimizer_states" not in c.keys:
            v.weights_only, v.resumable = True, False
        elif c.keys:
            v.resumable = True
    elif layout == L.MEGATRON:
        _check_megatron(names, checks, v)
    elif layout == L.DEEPSPEED:
        _check_deepspeed("", names, v)
    elif layout in (L.PLAIN, L.CUSTOM):
        keys = set().union(*(c.keys for c in checks.values()))
        if keys & {"optimizer", "optimizer_state_dict", "optimizer_states", "optim"}:
            v.resumable = True
    v.content_step = v.content_step if v.content_step is not None else _pickle_step(checks)
    named = cand.step
    if (
        named is not None
        and v.content_step not in (None, named)
        and layout in (L.HF, L.MEGATRON, L.LIGHTNING)
    ):
        v.problems.append(_step_mismatch(layout, named, v.content_step))
    if deep and v.ok:
        v.hashes = hash_files(cand)
    return v


def _step_mismatch(layout: str, named: int, inside: int | None) -> Problem:
    """The Trainer names ``checkpoint-N`` after the very ``global_step`` it writes beside it, so a
    mismatch means the folder holds another save's state (copied, renamed, overwritten):
    ``resume_from_checkpoint=True`` picks it by name, then restores step, LR schedule and data
    position from the wrong save, so it fails HF verification. Other names are looser (Lightning's
    filename template is the user's; converted Megatron checkpoints get renamed): a warning."""
    if layout == L.HF:
        return Problem(
            L.TRAINER_STATE,
            "step_mismatch",
            f"global_step is {inside} but the folder is named for step {named}: the state belongs to "
            "another save, and a resume would restore the wrong step and LR schedule",
        )
    return Problem(
        "", "step_mismatch", f"named for step {named} but its state says step {inside}", Severity.WARNING
    )


def _check_indexes(cand: L.Candidate, checks: dict[str, FileCheck], v: Verdict) -> None:
    """Sharded weights: every shard the index names must be there."""
    for rel, c in checks.items():
        if not rel.endswith(".index.json") or not isinstance(c.parsed, dict):
            continue
        weight_map = c.parsed.get("weight_map")
        if not isinstance(weight_map, dict):
            continue
        folder = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
        missing = sorted({str(f) for f in weight_map.values()} - {k[len(folder) :] for k in cand.files})
        if missing:
            v.problems.append(
                Problem(rel, "missing", f"names shard(s) not on disk: {', '.join(missing[:3])}")
            )


def _nested_deepspeed(names: set[str]) -> set[str]:
    return {n.split("/", 1)[0] for n in names if "/" in n and n.endswith("_model_states.pt")}


def _check_hf(cand: L.Candidate, names: set[str], checks: dict[str, FileCheck], v: Verdict) -> None:
    state = checks.get(L.TRAINER_STATE)
    if state is not None and isinstance(state.parsed, dict):
        gs = state.parsed.get("global_step")
        if isinstance(gs, int):
            v.content_step = gs
        v.history = L.records_from_state(state.parsed)
        v.bad = L.first_bad_step(v.history)
    elif cand.layout == L.HF and state is not None and not state.problems:
        v.problems.append(Problem(L.TRAINER_STATE, "json", "not a JSON object"))
    if not any(_WEIGHTS_FILE.search(n) or n.endswith(".safetensors") for n in names):
        v.problems.append(Problem("", "missing", "no model weights (*.safetensors, pytorch_model*.bin)"))
    if cand.layout == L.HF_MODEL:
        return
    for sub in sorted(_nested_deepspeed(names)):
        _check_deepspeed(sub + "/", names, v)
    if "latest" in names:
        tag = L.read_pointer(cand.path / "latest") or ""
        if tag and not any(n.startswith(tag + "/") for n in names):
            v.problems.append(Problem("latest", "pointer", f"names {tag!r}, which is not in the checkpoint"))
    has_optimizer = any(_OPTIMIZER_FILE.search(n) for n in names)
    if not has_optimizer:
        v.weights_only, v.resumable = True, False
        return
    v.resumable = True
    if not _nested_deepspeed(names):
        if "scheduler.pt" not in names:
            v.notes.append("no scheduler.pt: the LR schedule restarts on resume")
        if not any(n.startswith("rng_state") for n in names):
            v.notes.append("no rng_state*.pth: data order and dropout differ on resume")


def _check_dcp_folders(cand: L.Candidate, names: set[str], v: Verdict, deep: bool) -> None:
    """torch.distributed.checkpoint: every folder of ``.distcp`` shards needs its ``.metadata``,
    and every shard the items its ``.metadata`` records."""
    folders: dict[str, set[str]] = {}
    for n in names:
        folder, _, leaf = n.rpartition("/")
        folders.setdefault(folder, set()).add(leaf)
    if cand.layout == L.DCP:
        folders.setdefault("", set())
    for folder, leaves in sorted(folders.items()):
        shards = any(n.endswith(".distcp") for n in leaves)
        meta = ".metadata" in leaves or any(re.match(r"__\d+\.metadata$", n) for n in leaves)
        where = f"{folder}/" if folder else ""
        if shards and not meta:
            v.problems.append(Problem(where + ".metadata", "missing", "missing: DCP cannot load the shards"))
        elif meta and not shards:
            v.problems.append(Problem(where, "missing", "a .metadata but no .distcp shard files"))
        elif cand.layout == L.DCP and not folder and not shards:
            v.problems.append(Problem("", "missing", "no .metadata and no .distcp shard files"))
        if meta:
            _check_dcp_data(cand, folder, leaves, v, deep)


@dataclass(slots=True, frozen=True)
class DcpItem:
    """One ``_StorageInfo`` of a DCP ``.metadata``: where a saved item lies in its data file."""

    relative_path: str
    offset: int
    length: int
    transformed: bool  # stored through an extension (compression...): not a plain torch.save archive


_DCP_KEYS = ("relative_path", "offset", "length")
_DCP_LEAF = re.compile(r"[^/\\\x00-\x1f\x7f]{1,255}\Z")


def dcp_items(data: BinaryIO | bytes) -> list[DcpItem]:
    """The storage items a DCP ``.metadata`` records, read as pickle opcodes, never executed.

    torch's FileSystemWriter pickles each ``_StorageInfo`` as the state dict
    ``{relative_path, offset, length[, transform_descriptors]}`` (filesystem.py), so the
    items are runs of six tokens: key, str, key, int, key, int.
    """
    out: list[DcpItem] = []
    window: list[Token] = []
    for tok in pickle_tokens(data):
        window.append(tok)
        if len(window) < 7:
            continue
        item = _dcp_item(window)
        if item is not None:
            out.append(item)
        del window[0]
    while window:
        item = _dcp_item(window)
        if item is not None:
            out.append(item)
        del window[0]
    return out


def _dcp_item(w: list[Token]) -> DcpItem | None:
    if (
        len(w) < 6
        or w[0] != ("s", _DCP_KEYS[0])
        or w[2] != ("s", _DCP_KEYS[1])
        or w[4] != ("s", _DCP_KEYS[2])
    ):
        return None
    path, off, length = w[1], w[3], w[5]
    if path is None or path[0] != "s" or off is None or off[0] != "i" or length is None or length[0] != "i":
        return None
    transformed = len(w) > 6 and w[6] == ("s", "transform_descriptors")
    return DcpItem(str(path[1]), int(off[1]), int(length[1]), transformed)


class _Slice:
    """A read-only window ``[offset, offset + length)`` of an open file, for ``zipfile``."""

    def __init__(self, fh: BinaryIO, offset: int, length: int) -> None:
        self._fh, self._base, self._len, self._pos = fh, offset, length, 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self._pos, self._len)[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        left = max(0, self._len - self._pos)
        n = left if n is None or n < 0 else min(n, left)
        self._fh.seek(self._base + self._pos)
        data = self._fh.read(n)
        self._pos += len(data)
        return data


def _check_dcp_data(cand: L.Candidate, folder: str, leaves: set[str], v: Verdict, deep: bool) -> None:
    """Each ``.distcp`` must hold every item its ``.metadata`` places in it.

    ``dcp.load`` reads each item at the offset and length the metadata records, so a
    data file shorter than its last item's end cannot load (torch fails with "failed
    finding central directory"). ``deep`` also opens each item's torch.save archive
    and checks its CRCs. Paths named by the metadata are only looked up among the
    files the scan found, never opened from the metadata's text.
    """
    prefix = f"{folder}/" if folder else ""
    items: list[DcpItem] = []
    for leaf in sorted(leaves):
        if not (leaf == ".metadata" or re.match(r"__\d+\.metadata$", leaf)):
            continue
        st = cand.files.get(prefix + leaf)
        if st is None or not 0 < st.size <= _MAX_PICKLE_SCAN:
            continue
        try:
            with open(cand.file_path(prefix + leaf), "rb") as fh:
                items.extend(dcp_items(fh))
        except (ValueError, EOFError, struct.error) as e:
            v.problems.append(Problem(prefix + leaf, "pickle", f"does not parse ({str(e)[:80]})"))
            return
    by_file: dict[str, list[DcpItem]] = {}
    for it in items:
        by_file.setdefault(it.relative_path, []).append(it)
    for name, its in sorted(by_file.items()):
        if not _DCP_LEAF.match(name):
            continue  # not a file of this folder: a path or control text is not looked up or shown
        rel = prefix + name
        st = cand.files.get(rel)
        if st is None:
            v.problems.append(Problem(rel, "missing", "missing: the .metadata places saved items in it"))
            continue
        need = max(it.offset + it.length for it in its)
        if st.size < need:
            v.problems.append(
                Problem(
                    rel,
                    "truncated",
                    f"truncated: the .metadata places items up to byte {need}, the file holds {st.size}",
                )
            )
            continue
        if deep:
            _check_dcp_items(cand.file_path(rel), rel, its, v)


def _check_dcp_items(path: Path, rel: str, items: list[DcpItem], v: Verdict) -> None:
    with open(path, "rb") as fh:
        for it in sorted(items, key=lambda i: i.offset):
            if it.transformed:
                continue
            fh.seek(it.offset)
            if fh.read(4) != _ZIP_LOCAL:
                continue  # raw bytes or safetensors: no archive of its own to check
            out = FileCheck()
            _check_zip(_Slice(fh, it.offset, it.length), f"{rel} @{it.offset}", it.length, out, True)
            if out.problems:
                v.problems.append(out.problems[0])
                return


def _check_megatron(names: set[str], checks: dict[str, FileCheck], v: Verdict) -> None:
    legacy = [n for n in names if n.endswith("model_optim_rng.pt")]
    if any(n.endswith(".distcp") for n in names):
        return
    if not legacy:
        v.problems.append(Problem("", "missing", "no mp_rank_*/model_optim_rng.pt and no .distcp shards"))
        return
    if any(n.endswith("distrib_optim.pt") for n in names):
        v.resumable = True
        return
    parsed = [checks[n] for n in legacy if checks[n].keys]
    if parsed:
        if all("optimizer" in c.keys for c in parsed):
            v.resumable = True
        else:
            v.weights_only, v.resumable = True, False


def _check_deepspeed(prefix: str, names: set[str], v: Verdict) -> None:
    inside = [n for n in names if n.startswith(prefix)]
    if not any(n.endswith("model_states.pt") for n in inside):
        v.problems.append(Problem(prefix, "missing", "no *_model_states.pt"))
    if any(n.endswith("optim_states.pt") for n in inside):
        v.resumable = True
